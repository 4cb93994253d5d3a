//! Finding arrays and their shard files in a directory tree, for the offline commands.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::zarr::{ArrayMetadata, ChunkKeyEncoding, METADATA_FILE, MetadataError, Node};

use super::CliError;

/// A file below an array directory whose relative path is a chunk key of the array.
#[derive(Debug)]
pub struct KeyFile {
    pub coords: Vec<u64>,
    pub path: PathBuf,
}

/// The node described by `dir/zarr.json`: `Ok(None)` when there is no such file.
pub fn read_node(dir: &Path) -> Result<Option<Result<Node, MetadataError>>, CliError> {
    let path = dir.join(METADATA_FILE);
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(Node::parse(&bytes))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CliError::io(&path, e)),
    }
}

/// The array a shard file belongs to: the nearest ancestor directory with an array
/// `zarr.json`, and the file's key relative to it.
pub fn array_of_file(file: &Path) -> Result<(PathBuf, ArrayMetadata, String), CliError> {
    let file = fs::canonicalize(file).map_err(|e| CliError::io(file, e))?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        match read_node(d)? {
            Some(Ok(Node::Array(meta))) => {
                let key = relative_key(d, &file)
                    .ok_or_else(|| CliError::Usage(format!("{} has no key", file.display())))?;
                return Ok((d.to_path_buf(), meta, key));
            }
            Some(Ok(Node::Group(_))) => break,
            Some(Err(e)) => {
                return Err(CliError::Usage(format!(
                    "{}: {e}",
                    d.join(METADATA_FILE).display()
                )));
            }
            None => dir = d.parent(),
        }
    }
    Err(CliError::Usage(format!(
        "{}: no array zarr.json in any parent directory",
        file.display()
    )))
}

fn relative_key(dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(dir).ok()?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

/// Every regular file below `array_dir` whose relative path is a key of the encoding, sorted
/// by coordinates; other files are returned separately.
pub fn key_files(
    array_dir: &Path,
    encoding: ChunkKeyEncoding,
    ndim: usize,
) -> Result<(Vec<KeyFile>, Vec<PathBuf>), CliError> {
    let mut keys = Vec::new();
    let mut others = Vec::new();
    let mut stack = vec![array_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| CliError::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CliError::io(&dir, e))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(|e| CliError::io(&path, e))?;
            if ft.is_dir() {
                // A nested node (sub-array or group) is not part of this array.
                if !path.join(METADATA_FILE).exists() {
                    stack.push(path);
                }
                continue;
            }
            if dir == array_dir && entry.file_name() == METADATA_FILE {
                continue;
            }
            let key = relative_key(array_dir, &path);
            match key.and_then(|k| encoding.decode(&k, ndim).ok()) {
                Some(coords) => keys.push(KeyFile { coords, path }),
                None => others.push(path),
            }
        }
    }
    keys.sort_by(|a, b| a.coords.cmp(&b.coords));
    others.sort();
    Ok((keys, others))
}

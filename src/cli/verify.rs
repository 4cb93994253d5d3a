//! `shardfs verify`: is every metadata document and every shard of a hierarchy sound?

use std::fs::{self, File};
use std::path::Path;

use super::scan::{key_files, read_node};
use super::{CliError, Verdict};
use crate::grid;
use crate::shard::{ChunkRange, read_index};
use crate::zarr::layout::{fixed_chunk_bytes, regular_chunk_shape};
use crate::zarr::transparent;
use crate::zarr::unsharded_view;
use crate::zarr::validate::reader_faults;
use crate::zarr::{
    ArrayMetadata, ChunkKeyEncoding, GroupMetadata, KeyError, METADATA_FILE, Node, ShardLayout,
};

struct Checker {
    problems: usize,
}

impl Checker {
    fn problem(&mut self, path: &Path, fault: impl std::fmt::Display) {
        println!("{}: {fault}", path.display());
        self.problems += 1;
    }
}

pub fn run(path: &Path) -> Result<Verdict, CliError> {
    let meta = path.metadata().map_err(|e| CliError::io(path, e))?;
    if !meta.is_dir() {
        return Err(CliError::Usage(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    let mut checker = Checker { problems: 0 };
    checker.walk(path)?;
    Ok(if checker.problems == 0 {
        Verdict::Sound
    } else {
        Verdict::Problems
    })
}

impl Checker {
    fn walk(&mut self, dir: &Path) -> Result<(), CliError> {
        match read_node(dir)? {
            Some(Ok(Node::Array(array))) => {
                self.document(&dir.join(METADATA_FILE), "", &array);
                return self.array(dir, &array);
            }
            Some(Ok(Node::Group(group))) => self.group(dir, &group),
            Some(Err(e)) => self.problem(&dir.join(METADATA_FILE), e),
            None => {}
        }
        let mut subdirs = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| CliError::io(dir, e))? {
            let entry = entry.map_err(|e| CliError::io(dir, e))?;
            let ft = entry
                .file_type()
                .map_err(|e| CliError::io(&entry.path(), e))?;
            if ft.is_dir() {
                subdirs.push(entry.path());
            }
        }
        subdirs.sort();
        for sub in subdirs {
            self.walk(&sub)?;
        }
        Ok(())
    }

    fn group(&mut self, dir: &Path, group: &GroupMetadata) {
        let Some(entries) = group.consolidated_entries() else {
            return;
        };
        let doc = dir.join(METADATA_FILE);
        for (child, entry) in entries {
            match Node::from_value(entry.clone()) {
                Err(e) => self.problem(&doc, format!("consolidated entry {child:?}: {e}")),
                Ok(Node::Array(a)) => {
                    self.document(&doc, &format!("consolidated entry {child:?}: "), &a);
                    if let Err(e) = ShardLayout::of(&a)
                        && e.is_invalid_metadata()
                    {
                        self.problem(&doc, format!("consolidated entry {child:?}: {e}"));
                    }
                }
                Ok(Node::Group(_)) => {}
            }
        }
    }

    /// What readers refuse in an array's document (`zarr::validate`), each a problem.
    fn document(&mut self, doc: &Path, prefix: &str, array: &ArrayMetadata) {
        for fault in reader_faults(array) {
            self.problem(doc, format!("{prefix}{fault}"));
        }
    }

    /// An unsharded array has no shards to check, but its grid and keys must make sense.
    fn unsharded(&mut self, dir: &Path, array: &ArrayMetadata) {
        let doc = dir.join(METADATA_FILE);
        if array.chunk_grid.name == "regular"
            && let Err(e) = regular_chunk_shape(array)
        {
            self.problem(&doc, e);
        }
        match ChunkKeyEncoding::from_metadata(&array.chunk_key_encoding) {
            Err(KeyError::UnknownEncoding(name)) => {
                say!(
                    "{}: chunk keys not checked: unknown encoding {name:?}",
                    dir.display()
                );
            }
            Err(e) => self.problem(&doc, e),
            Ok(_) => {}
        }
    }

    fn array(&mut self, dir: &Path, array: &ArrayMetadata) -> Result<(), CliError> {
        let layout = match ShardLayout::of(array) {
            Ok(Some(layout)) => layout,
            Ok(None) => {
                self.unsharded(dir, array);
                return Ok(());
            }
            Err(e) if e.is_invalid_metadata() => {
                self.problem(&dir.join(METADATA_FILE), e);
                return Ok(());
            }
            Err(e) => {
                say!("{}: shards not checked: {e}", dir.display());
                return Ok(());
            }
        };
        let shard_grid = layout.shard_grid_shape();
        let fixed = fixed_chunk_bytes(array);
        let compressed = transparent::of_stored(array);
        // Inner chunks that end with a crc32c: each is checked against it.
        let checksummed = unsharded_view(array)
            .is_ok_and(|v| v.codecs.last().is_some_and(|c| c.name == "crc32c"));
        let (files, _) = key_files(dir, layout.key_encoding, layout.ndim())?;
        for f in files {
            if !grid::inside(&f.coords, &shard_grid) {
                self.problem(
                    &f.path,
                    format!(
                        "shard {:?} lies outside the shard grid {shard_grid:?}",
                        f.coords
                    ),
                );
                continue;
            }
            let file = File::open(&f.path).map_err(|e| CliError::io(&f.path, e))?;
            let len = file.metadata().map_err(|e| CliError::io(&f.path, e))?.len();
            if len == 0 {
                // Left by a crash before its data was synced: zarr-python and the mount take
                // it for a shard holding no chunk, tensorstore refuses it (DATA_LOSS).
                self.problem(
                    &f.path,
                    "empty shard file: tensorstore refuses it; it holds no chunk (remove it)",
                );
                continue;
            }
            match read_index(&file, len, &layout.index) {
                Err(e) => self.problem(&f.path, e),
                Ok(index) => {
                    let shard = Shard {
                        path: &f.path,
                        layout: &layout,
                        coords: &f.coords,
                        index: &index,
                    };
                    if let Some(size) = fixed {
                        self.each_chunk(&shard, |range| chunk_size_fault(range, size));
                    }
                    if let Some(z) = compressed {
                        self.each_chunk(&shard, |range| frame_fault(&file, range, z.max));
                    }
                    if checksummed {
                        self.each_chunk(&shard, |range| checksum_fault(&file, range));
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks every chunk of `shard`: `fault` says what is wrong with the chunk at a range.
    fn each_chunk(&mut self, shard: &Shard, fault: impl Fn(ChunkRange) -> Option<String>) {
        for (pos, range) in shard.index.present() {
            if let Some(fault) = fault(range) {
                let coords = shard.layout.chunk_coords(shard.coords, pos);
                self.problem(shard.path, format!("chunk {coords:?} {fault}"));
            }
        }
    }
}

/// A shard file whose index was read.
struct Shard<'a> {
    path: &'a Path,
    layout: &'a ShardLayout,
    coords: &'a [u64],
    index: &'a crate::shard::ShardIndex,
}

/// Every chunk of a shard whose codecs fix its size must have that size.
fn chunk_size_fault(range: ChunkRange, size: u64) -> Option<String> {
    (range.nbytes != size).then(|| {
        format!(
            "is {} bytes; its codecs (no compression) make every chunk {size} bytes",
            range.nbytes
        )
    })
}

/// Every chunk of an array a mount compresses (`zarr::transparent`) must be a zstd frame
/// that declares its raw size (as the mount writes them).
fn frame_fault(file: &File, range: ChunkRange, raw: u64) -> Option<String> {
    let head = crate::shard::read_chunk_part(file, range, 0, transparent::HEADER_MAX);
    let declared = head.ok().and_then(|h| transparent::content_size(&h));
    (declared != Some(raw)).then(|| {
        let said = declared.map_or("no size".to_string(), |n| format!("{n} bytes"));
        format!(
            "is not a zstd frame of {raw} bytes (its header says {said}); the mount \
             compresses this array's raw chunks"
        )
    })
}

/// Every chunk whose codecs end with `crc32c` must match its checksum (its last four
/// bytes, little-endian, over the bytes before them).
fn checksum_fault(file: &File, range: ChunkRange) -> Option<String> {
    match crate::shard::read_whole_chunk(file, range, crate::limits::MAX_FILE_BYTES) {
        Err(e) => Some(format!("cannot be read: {e}")),
        Ok(b) if b.len() < 4 => Some("is shorter than its checksum".into()),
        Ok(b) => {
            let (data, sum) = b.split_at(b.len() - 4);
            let stored = u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]);
            (crc32c::crc32c(data) != stored).then(|| "does not match its crc32c".into())
        }
    }
}

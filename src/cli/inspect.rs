//! `shardfs inspect`: what a shard index says, chunk by chunk.

use std::fs::File;
use std::path::Path;

use serde::Serialize;

use super::scan::{array_of_file, key_files, read_node};
use super::{CliError, Verdict};
use crate::grid;
use crate::shard::{ShardFileError, read_index_lenient};
use crate::zarr::{ArrayMetadata, Node, ShardLayout};

#[derive(Serialize)]
struct ShardReport {
    path: String,
    index_location: &'static str,
    crc32c_ok: bool,
    chunks: Vec<ChunkReport>,
    #[serde(skip)]
    file_len: u64,
}

#[derive(Serialize)]
struct ChunkReport {
    coords: Vec<u64>,
    offset: u64,
    nbytes: u64,
}

pub fn run(path: &Path, json: bool) -> Result<Verdict, CliError> {
    let meta = path.metadata().map_err(|e| CliError::io(path, e))?;
    let mut reports = Vec::new();
    let mut verdict = Verdict::Sound;
    let mut report = |display: String, file: &Path, layout: &ShardLayout| match inspect_shard(
        display.clone(),
        file,
        layout,
    ) {
        Ok(r) => {
            if !r.crc32c_ok {
                verdict = Verdict::Problems;
            }
            reports.push(r)
        }
        Err(e) => {
            say!("{display}: {e}");
            verdict = Verdict::Problems;
        }
    };
    if meta.is_dir() {
        let array = match read_node(path)? {
            Some(Ok(Node::Array(a))) => a,
            Some(Ok(Node::Group(_))) => {
                return Err(CliError::Usage(format!(
                    "{} is a group, not an array",
                    path.display()
                )));
            }
            Some(Err(e)) => return Err(CliError::Usage(format!("{}: {e}", path.display()))),
            None => {
                return Err(CliError::Usage(format!(
                    "{} has no zarr.json",
                    path.display()
                )));
            }
        };
        let layout = layout_of(path, &array)?;
        let (files, _) = key_files(path, layout.key_encoding, layout.ndim())?;
        for f in files {
            report(f.path.display().to_string(), &f.path, &layout);
        }
        print_reports(&reports, json, true);
    } else {
        let (dir, array, key) = array_of_file(path)?;
        let layout = layout_of(&dir, &array)?;
        if let Err(e) = layout.key_encoding.decode(&key, layout.ndim()) {
            return Err(CliError::Usage(format!(
                "{} is not a shard of the array at {}: {e}",
                path.display(),
                dir.display()
            )));
        }
        report(path.display().to_string(), path, &layout);
        print_reports(&reports, json, false);
    }
    Ok(verdict)
}

fn layout_of(dir: &Path, array: &ArrayMetadata) -> Result<ShardLayout, CliError> {
    match ShardLayout::of(array) {
        Ok(Some(layout)) => Ok(layout),
        Ok(None) => Err(CliError::Usage(format!(
            "the array at {} is not sharded",
            dir.display()
        ))),
        Err(e) => Err(CliError::Usage(format!(
            "the array at {} cannot be inspected: {e}",
            dir.display()
        ))),
    }
}

fn inspect_shard(
    display: String,
    file: &Path,
    layout: &ShardLayout,
) -> Result<ShardReport, ShardFileError> {
    let f = File::open(file)?;
    let file_len = f.metadata()?.len();
    let decoded = read_index_lenient(&f, file_len, &layout.index)?;
    let chunks = decoded
        .index
        .present()
        .map(|(pos, r)| ChunkReport {
            coords: grid::unravel(pos, layout.chunks_per_shard()),
            offset: r.offset,
            nbytes: r.nbytes,
        })
        .collect();
    Ok(ShardReport {
        path: display,
        index_location: layout.index.location.as_str(),
        crc32c_ok: decoded.crc_ok,
        chunks,
        file_len,
    })
}

fn print_reports(reports: &[ShardReport], json: bool, as_list: bool) {
    if json {
        let text = match (as_list, reports.first()) {
            (true, _) => serde_json::to_string_pretty(reports),
            (false, Some(one)) => serde_json::to_string_pretty(one),
            (false, None) => return,
        };
        println!("{}", text.unwrap_or_default());
        return;
    }
    for r in reports {
        println!("{}", r.path);
        for c in &r.chunks {
            println!(
                "  chunk {:?}  offset {}  nbytes {}",
                c.coords, c.offset, c.nbytes
            );
        }
        let stored: u64 = r.chunks.iter().map(|c| c.nbytes).sum();
        println!(
            "  {} chunks present, {} bytes of chunk data in a {}-byte file, index at {}, crc32c {}",
            r.chunks.len(),
            stored,
            r.file_len,
            r.index_location,
            if r.crc32c_ok { "ok" } else { "MISMATCH" }
        );
    }
}

//! Shard files as they are in BACKING: the decoded index of one version of a file, and the
//! chunks it holds. Every read of a stored chunk goes through the descriptor its index was
//! read from, so a rewrite of the shard file (by this mount, another one, or anyone) can
//! never pair one version's index with another version's bytes.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use tracing::warn;

use super::super::error::FsError;
use crate::backing::{Backing, FileVersion, is_absent, mtime_of};
use crate::shard::{
    ChunkRange, IndexError, IndexFormat, ShardFileError, ShardIndex, read_chunk_part, read_index,
};

/// The decoded index of one version of a shard file, or why it could not be decoded. The
/// file itself is not kept open: arrays have more shards than a process has descriptors.
#[derive(Clone, Debug)]
pub(crate) struct StoredIndex {
    pub format: IndexFormat,
    pub version: FileVersion,
    pub mtime: SystemTime,
    pub index: Result<Arc<ShardIndex>, IndexError>,
}

impl StoredIndex {
    /// What keeping it in memory costs, roughly.
    pub fn cost(&self) -> u64 {
        match &self.index {
            Ok(_) => 16 * self.format.n_chunks() as u64,
            Err(_) => 0,
        }
    }
}

/// One version of a shard file, open, with its index.
#[derive(Clone, Debug)]
pub(crate) struct OpenShard {
    pub file: Arc<File>,
    pub stored: StoredIndex,
}

/// A stored chunk: which version of which shard file holds it, where, and that file open.
#[derive(Clone, Debug)]
pub struct StoredChunk {
    pub rel: PathBuf,
    pub version: FileVersion,
    pub range: ChunkRange,
    pub mtime: SystemTime,
    pub file: Arc<File>,
}

impl StoredChunk {
    pub fn read(&self) -> Result<Bytes, FsError> {
        Ok(Bytes::from(read_chunk_part(
            &self.file,
            self.range,
            0,
            self.range.nbytes,
        )?))
    }

    pub fn read_part(&self, offset: u64, size: u64) -> Result<Bytes, FsError> {
        Ok(Bytes::from(read_chunk_part(
            &self.file, self.range, offset, size,
        )?))
    }
}

/// Opens the shard file at `rel` and finds its index: `cached` when it describes the very
/// version opened, else decoded from the open file. `Ok(None)`: no shard file (or
/// something that is not a regular file in its place).
pub(crate) fn open_shard(
    backing: &Backing,
    rel: &Path,
    format: &IndexFormat,
    cached: Option<&StoredIndex>,
) -> Result<Option<OpenShard>, FsError> {
    let file = match backing.open(rel) {
        Ok(f) => f,
        Err(e) if is_absent(&e) || e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    let version = FileVersion::of(&meta);
    if let Some(c) = cached
        && c.version == version
        && c.format == *format
    {
        return Ok(Some(OpenShard {
            file: Arc::new(file),
            stored: c.clone(),
        }));
    }
    let index = match read_index(&file, meta.len(), format) {
        Ok(index) => Ok(Arc::new(index)),
        Err(ShardFileError::Index(e)) => {
            warn!(shard = %backing.path(rel).display(),
                "damaged shard, its chunks read as EIO: {e}");
            Err(e)
        }
        Err(ShardFileError::Io(e)) => return Err(e.into()),
    };
    Ok(Some(OpenShard {
        file: Arc::new(file),
        stored: StoredIndex {
            format: format.clone(),
            version,
            mtime: mtime_of(&meta),
            index,
        },
    }))
}

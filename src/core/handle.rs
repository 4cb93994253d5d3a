//! Open files and directories.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::array::lock;
use super::error::FsError;
use super::inode::FileType;
use crate::shard::ChunkRange;
use bytes::Bytes;

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct ListEntry {
    pub name: OsString,
    pub kind: FileType,
}

impl ListEntry {
    pub fn new(name: &str, kind: FileType) -> ListEntry {
        ListEntry {
            name: name.into(),
            kind,
        }
    }
}

#[derive(Debug)]
pub enum Handle {
    /// A directory listing taken at `opendir`.
    Dir(Arc<Vec<ListEntry>>),
    /// A file of BACKING.
    Backing(File),
    /// A stored chunk: the shard file as it was at open and the chunk's range in it.
    Chunk { file: Arc<File>, range: ChunkRange },
    /// A document served from memory (translated metadata, the control file).
    Bytes(Bytes),
}

/// Reads up to `size` bytes at `offset`, short only at the end of the file.
pub fn read_full_at(file: &File, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; size as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

#[derive(Debug, Default)]
pub struct HandleTable {
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
}

impl HandleTable {
    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.handles).insert(fh, Arc::new(handle));
        fh
    }

    pub fn get(&self, fh: u64) -> Result<Arc<Handle>, FsError> {
        lock(&self.handles).get(&fh).cloned().ok_or(FsError::Stale)
    }

    pub fn remove(&self, fh: u64) {
        lock(&self.handles).remove(&fh);
    }
}

//! Open files and directories.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::inode::{FileType, Ino};
use crate::core::error::FsError;
use crate::core::pending::memfile::MemFile;
use crate::core::shards::StoredChunk;
use crate::sync::lock;

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

/// An open file. What it reads and writes is found through its inode at each request
/// (data belongs to the inode: the name may have moved since open); the handle keeps what
/// must stay fixed for its own life.
#[derive(Debug)]
pub struct FileHandle {
    pub ino: Ino,
    pub writable: bool,
    /// A BACKING file opened for this handle.
    pub backing: Option<File>,
    /// Set when the inode's data left that file (moved into memory by a rename into an
    /// array): the descriptor is then no longer the way to it.
    pub backing_stale: std::sync::atomic::AtomicBool,
    /// Opened as a chunk: if the name stops being one because its array is gone (not by
    /// a rename, which clears this), writes must not land on a file at the same path,
    /// which may be a shard.
    pub as_chunk: std::sync::atomic::AtomicBool,
    /// The stored chunk this handle reads (its shard's version pinned): one open reads one
    /// version, which stays readable when the chunk is deleted while open.
    pub stored: Mutex<Option<StoredChunk>>,
    /// How often the inode's content had been changed through the mount when `stored` was
    /// pinned: a change since (through any handle) is read at once, as on any file.
    pub pinned_at: AtomicU64,
    /// A document served from memory, fixed at open.
    pub bytes: Option<Bytes>,
    /// The in-memory file this handle wrote to since its last FLUSH: it counts as one of
    /// that file's unflushed writers until then.
    pub dirty: Mutex<Option<Arc<MemFile>>>,
    /// The BACKING file that the file held in memory went to while this handle was open
    /// (written out: idle, or over the memory limit). Reads and writes go on through it,
    /// never by its path: someone who may write the directory could have put another
    /// user's file there.
    pub went_to: std::sync::OnceLock<File>,
    /// The array a chunk was opened to be written in (its writer's permission checked on
    /// that directory): writes through the handle go to no other.
    pub array: std::sync::OnceLock<Arc<crate::core::array::ArrayState>>,
    /// Its reads and writes go from the kernel to `backing` directly (`passthrough.rs`):
    /// that file's device and inode; `None` when they go through the daemon.
    pub passthrough: Mutex<Option<(u64, u64)>>,
}

impl FileHandle {
    pub fn new(ino: Ino, writable: bool) -> FileHandle {
        FileHandle {
            ino,
            writable,
            backing: None,
            backing_stale: std::sync::atomic::AtomicBool::new(false),
            as_chunk: std::sync::atomic::AtomicBool::new(false),
            stored: Mutex::new(None),
            pinned_at: AtomicU64::new(0),
            went_to: std::sync::OnceLock::new(),
            array: std::sync::OnceLock::new(),
            passthrough: Mutex::new(None),
            bytes: None,
            dirty: Mutex::new(None),
        }
    }

    /// The BACKING file this handle writes and reads, while it still holds the data.
    pub fn backing_file(&self) -> Option<&File> {
        self.backing
            .as_ref()
            .filter(|_| !self.backing_stale.load(Ordering::Relaxed))
    }

    /// The BACKING file this handle reads and writes: its own, or the one its file went to.
    pub fn file(&self) -> Option<&File> {
        self.backing_file().or_else(|| self.went_to.get())
    }

    /// Records a write into `file`: the first one since the last FLUSH makes this handle
    /// one of its unflushed writers.
    pub fn mark_dirty(&self, file: &Arc<MemFile>) {
        let mut dirty = lock(&self.dirty);
        match dirty.as_ref() {
            Some(f) if Arc::ptr_eq(f, file) => {}
            other => {
                if let Some(previous) = other {
                    previous.with(|s| s.unflushed = s.unflushed.saturating_sub(1));
                }
                // A new writer: an earlier writer's fsync does not cover what it writes.
                file.with(|s| {
                    s.unflushed += 1;
                    s.fsynced = false;
                });
                *dirty = Some(file.clone());
            }
        }
    }

    /// The FLUSH: this handle stops counting as an unflushed writer. Returns the file it
    /// had written to, if any.
    pub fn take_dirty(&self) -> Option<Arc<MemFile>> {
        let file = lock(&self.dirty).take()?;
        file.with(|s| {
            s.unflushed = s.unflushed.saturating_sub(1);
            s.touched = Some(std::time::Instant::now());
        });
        Some(file)
    }
}

#[derive(Debug)]
pub struct DirHandle {
    pub ino: Ino,
    pub listing: std::sync::OnceLock<Arc<Vec<ListEntry>>>,
}

#[derive(Debug)]
pub enum Handle {
    /// An open directory: its listing is taken at the first `readdir` and served from that
    /// snapshot (an open for fsync alone, as tensorstore does, costs no listing).
    Dir(DirHandle),
    File(Box<FileHandle>),
}

/// How an inode is open (`HandleTable::opens_of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opens {
    Closed,
    /// Through the daemon only.
    Daemon,
    /// Some handle passes through to this BACKING file (device, inode).
    Through((u64, u64)),
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
        lock(&self.handles)
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    pub fn file(&self, fh: u64) -> Result<Arc<Handle>, FsError> {
        let h = self.get(fh)?;
        match h.as_ref() {
            Handle::File(_) => Ok(h),
            Handle::Dir(_) => Err(FsError::IsDir),
        }
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        lock(&self.handles).remove(&fh)
    }

    /// A BACKING file open on `ino` by some handle (the way to a file that lost its name).
    /// The file held in memory at `ino` went to BACKING as `file`: the handles open on it
    /// go on through that descriptor.
    pub fn went_to(&self, ino: Ino, file: &File) {
        for h in lock(&self.handles).values() {
            if let Handle::File(f) = h.as_ref()
                && f.ino == ino
                && let Ok(dup) = file.try_clone()
            {
                let _ = f.went_to.set(dup);
            }
        }
    }

    pub fn backing_file_of(&self, ino: Ino) -> Option<File> {
        lock(&self.handles).values().find_map(|h| match h.as_ref() {
            Handle::File(f) if f.ino == ino => f.backing_file()?.try_clone().ok(),
            _ => None,
        })
    }

    /// Whether a handle is open on `ino` without a BACKING descriptor of its own.
    pub fn any_without_backing(&self, ino: Ino) -> bool {
        lock(&self.handles).values().any(
            |h| matches!(h.as_ref(), Handle::File(f) if f.ino == ino && f.backing_file().is_none()),
        )
    }

    /// `ino` was a chunk and moved elsewhere by a rename: its handles follow it.
    pub fn chunk_moved(&self, ino: Ino) {
        for h in lock(&self.handles).values() {
            if let Handle::File(f) = h.as_ref()
                && f.ino == ino
            {
                f.as_chunk.store(false, Ordering::Relaxed);
            }
        }
    }

    /// The data of `ino` left its BACKING file: handles stop using their descriptors.
    pub fn backing_moved(&self, ino: Ino) {
        for h in lock(&self.handles).values() {
            if let Handle::File(f) = h.as_ref()
                && f.ino == ino
            {
                f.backing_stale.store(true, Ordering::Relaxed);
            }
        }
    }

    /// How `ino` is open now: through passthrough (to that BACKING file), through the
    /// daemon, or not at all. One look at the table.
    pub fn opens_of(&self, ino: Ino) -> Opens {
        let mut opens = Opens::Closed;
        for h in lock(&self.handles).values() {
            if let Handle::File(f) = h.as_ref()
                && f.ino == ino
            {
                match *lock(&f.passthrough) {
                    Some(source) => return Opens::Through(source),
                    None => opens = Opens::Daemon,
                }
            }
        }
        opens
    }

    /// The BACKING files (device, inode) handles are open through passthrough to.
    pub fn passthrough_sources(&self) -> Vec<(u64, u64)> {
        lock(&self.handles)
            .values()
            .filter_map(|h| match h.as_ref() {
                Handle::File(f) => *lock(&f.passthrough),
                _ => None,
            })
            .collect()
    }

    /// Whether any file handle is open on `ino`.
    pub fn is_open(&self, ino: Ino) -> bool {
        lock(&self.handles)
            .values()
            .any(|h| matches!(h.as_ref(), Handle::File(f) if f.ino == ino))
    }
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

//! Whole objects in a store, the way shards and metadata are kept: read at a position from
//! one pinned version, written whole with a precondition, listed one level at a time.
//!
//! Two implementations answer to [`Store`]: `posix` (a BACKING directory: pinned versions
//! are open descriptors, conditional writes are made under the key lock) and `object` (an
//! object store through the `object_store` crate: pinned versions are ETags, conditional
//! writes are `If-Match` / `If-None-Match`). Nothing above this module knows which one it
//! talks to.

pub mod mirror;
pub mod object;
pub mod posix;
pub mod tree;

use std::fmt::Debug;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use thiserror::Error;

use crate::shard::ReadAt;

/// One version of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    /// Changes with every write of the object: an ETag, or a file's inode, size and mtime.
    pub tag: String,
    pub mtime: SystemTime,
}

/// What must hold for a write to go ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Write whatever is there.
    None,
    /// Only if there is no object yet (`If-None-Match: *`).
    Absent,
    /// Only if the object is still the version with this tag (`If-Match`).
    Matches(String),
}

impl Precondition {
    /// Whether it holds for the object whose current version has tag `current` (`None`:
    /// no object).
    pub fn holds(&self, current: Option<&str>) -> bool {
        match (self, current) {
            (Precondition::None, _) | (Precondition::Absent, None) => true,
            (Precondition::Matches(tag), Some(now)) => tag == now,
            _ => false,
        }
    }
}

#[derive(Debug, Error)]
pub enum StoreError {
    /// Someone else wrote (or removed) the object since its version was read.
    #[error("{0} changed since it was read")]
    Conflict(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> io::Error {
        match e {
            StoreError::Io(e) => e,
            StoreError::Conflict(what) => io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{what} changed since it was read"),
            ),
        }
    }
}

/// One version of an object, pinned: reads never mix two versions. A read after the object
/// was replaced fails (ESTALE) rather than return bytes of another version.
pub trait Blob: ReadAt + Send + Sync + Debug {
    fn info(&self) -> &ObjectInfo;
    /// The open file this version is, where it is one (a directory's): ranges of it are
    /// then copied inside the kernel.
    fn file(&self) -> Option<&std::fs::File> {
        None
    }
    /// Whether this version is still as it was pinned: a file written in place (grown,
    /// shrunk, rewritten) since it was opened is not, and what was read of it may mix two
    /// versions. An object store's version never changes.
    fn still_as_pinned(&self) -> io::Result<bool> {
        Ok(true)
    }
}

/// A part of an object being written: bytes in memory, or a range of a pinned version of
/// an object (a directory copies a range of a file inside the kernel, never through
/// memory; other stores read it first).
#[derive(Clone, Debug)]
pub enum Piece {
    Bytes(Bytes),
    Range {
        from: Arc<dyn Blob>,
        offset: u64,
        len: u64,
    },
}

impl Piece {
    pub fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Range { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The piece in memory.
    pub fn to_bytes(&self) -> io::Result<Bytes> {
        match self {
            Piece::Bytes(b) => Ok(b.clone()),
            Piece::Range { from, offset, len } => {
                let mut buf = vec![0u8; *len as usize];
                from.read_exact_at(&mut buf, *offset)?;
                if !from.still_as_pinned()? {
                    return Err(io::Error::other(
                        "a file it is made from changed while it was read (written in place meanwhile); run again",
                    ));
                }
                Ok(Bytes::from(buf))
            }
        }
    }
}

/// One level of a listing: the names of the directories (common prefixes) and of the
/// objects directly below, sorted. Names only: a directory of files would need a stat per
/// file for more, and nothing that walks shards needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub dirs: Vec<String>,
    pub objects: Vec<String>,
    /// What a directory holds that is neither (a link, a special file, a name that is not
    /// UTF-8), named as the store would describe it; lock files are not listed at all.
    pub unlisted: Vec<String>,
}

/// What a write must see done once it is durable and before anyone else may write its key:
/// the retirement of the journal records it makes obsolete. A writer that came next and
/// wrote no stamps (tensorstore beside a mount) could otherwise be undone after a power cut
/// by their replay. A store of directories runs it under the key lock, after syncing the
/// new file and its directories; an object store, whose write is durable once answered
/// and which has no key locks (writers there are ordered by the stamps), after the write.
pub type OnDurable<'a> = Option<&'a mut dyn FnMut()>;

/// Keys are paths relative to the store's root, `/`-separated; an object store takes only
/// UTF-8 keys (EINVAL otherwise).
pub trait Store: Send + Sync + Debug {
    /// Pins the current version of `key`, fetching its last `tail` bytes with it (the index
    /// of a shard that has it at the end: one request on an object store). `Ok(None)`: no
    /// such object.
    fn open(&self, key: &Path, tail: u64) -> Result<Option<Arc<dyn Blob>>, StoreError>;
    /// The whole object, when it is at most `limit` bytes (EFBIG otherwise).
    fn get(&self, key: &Path, limit: u64) -> Result<Option<(Bytes, ObjectInfo)>, StoreError>;
    /// Writes `parts` (in order) as the object `key`, atomically: readers see the old
    /// version or the new one, never a mix.
    fn put(
        &self,
        key: &Path,
        parts: &[Bytes],
        when: Precondition,
    ) -> Result<ObjectInfo, StoreError>;
    /// `put` of whatever is there, durable when it returns: a file's content and name
    /// synced; an object store's write is durable once acknowledged. For steps that must
    /// never be undone by a crash (a conversion in place).
    fn put_durably(&self, key: &Path, parts: &[Bytes]) -> Result<ObjectInfo, StoreError> {
        self.put(key, parts, Precondition::None)
    }

    /// `put` of `pieces` (or, `durably`, `put_durably`): a directory copies the ranges of
    /// files inside the kernel; other stores read them into memory first.
    fn put_pieces(
        &self,
        key: &Path,
        pieces: &[Piece],
        durably: bool,
    ) -> Result<ObjectInfo, StoreError> {
        let parts = pieces
            .iter()
            .map(Piece::to_bytes)
            .collect::<io::Result<Vec<_>>>()?;
        match durably {
            true => self.put_durably(key, &parts),
            false => self.put(key, &parts, Precondition::None),
        }
    }

    /// Holds `key` exclusively until the guard returned drops, against anyone holding it
    /// the same way (a directory: the key lock of `backing::lock`, waited for). `None`
    /// where the store has no such lock (object stores).
    fn hold(&self, _key: &Path) -> Result<Option<Box<dyn std::any::Any>>, StoreError> {
        Ok(None)
    }

    /// Removes `key`'s lock file if a writer killed mid-write left it (nobody holds it).
    fn clear_stale_lock(&self, _key: &Path) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes everything written so far durable (a directory: its file system synced; an
    /// object store's writes are durable once acknowledged).
    fn sync_all(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Removes what writers killed mid-write left below `dir` (a directory's stale key
    /// locks: see `backing::lock`). Only while nobody else writes there.
    fn clear_leftovers(&self, _dir: &Path) -> Result<(), StoreError> {
        Ok(())
    }

    /// Removes `key` if `when` holds. `Ok(false)`: it was not there.
    fn delete(&self, key: &Path, when: Precondition) -> Result<bool, StoreError>;
    /// `put` of a key below the directory `within` (its array), which a store of
    /// directories never makes: one moved away meanwhile fails the write (ENOENT) instead
    /// of being made again at its old path. Stores without directories ignore it.
    /// With `on_durable`, the write is made durable (content and name) and `on_durable`
    /// runs before anyone else may write the key (see `OnDurable`).
    fn put_within(
        &self,
        _within: crate::backing::lock::Within,
        key: &Path,
        parts: &[Bytes],
        when: Precondition,
        on_durable: OnDurable,
    ) -> Result<ObjectInfo, StoreError> {
        let info = self.put(key, parts, when)?;
        if let Some(then) = on_durable {
            then();
        }
        Ok(info)
    }
    /// `delete`, for a key below `within` (as `put_within`).
    fn delete_within(
        &self,
        _within: crate::backing::lock::Within,
        key: &Path,
        when: Precondition,
        on_durable: OnDurable,
    ) -> Result<bool, StoreError> {
        let removed = self.delete(key, when)?;
        if let Some(then) = on_durable {
            then();
        }
        Ok(removed)
    }
    /// The directories and objects directly below `dir` ("" for the top).
    fn list(&self, dir: &Path) -> Result<Listing, StoreError>;
    /// `key` as a user would name it, for messages.
    fn describe(&self, key: &Path) -> String;
    /// Whether the store was found to have lost what it held while mounted (an object
    /// store whose bucket was gone): documents found missing then are to be published
    /// again, not taken as removed by someone.
    fn lost(&self) -> bool {
        false
    }
    /// What it lost was published again: from now on an absence is an absence.
    fn recovered(&self) {}
    /// Makes sure, now, that the store is there (its bucket): an absence found just before
    /// is then what another writer did, not the store's loss.
    fn confirm_there(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The requests made so far, by kind, where each costs a round trip.
    fn requests(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        None
    }
}

/// Requests made to a store, by kind: what a benchmark reports and a test counts.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub get: std::sync::atomic::AtomicU64,
    pub head: std::sync::atomic::AtomicU64,
    pub put: std::sync::atomic::AtomicU64,
    pub delete: std::sync::atomic::AtomicU64,
    pub list: std::sync::atomic::AtomicU64,
}

impl RequestCounts {
    pub fn snapshot(&self) -> [(&'static str, u64); 5] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            ("get", self.get.load(Relaxed)),
            ("head", self.head.load(Relaxed)),
            ("put", self.put.load(Relaxed)),
            ("delete", self.delete.load(Relaxed)),
            ("list", self.list.load(Relaxed)),
        ]
    }
}

/// Joins a directory key and a name with `/` ("" is the top).
pub fn join_key(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }
}

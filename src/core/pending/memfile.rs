//! Files held in memory: chunk files waiting for their shard, and temporary files inside
//! arrays. Content is kept as the `Bytes` segments the kernel delivered, never joined.

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use crate::sync::lock;

/// The largest `zarr.json` held in memory and parsed: metadata, not data.
pub const MAX_METADATA_BYTES: u64 = 64 << 20;

/// Zeros for holes (sparse writes, truncation upwards), shared rather than allocated.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Sparse file content: non-overlapping `(offset, bytes)` extents in offset order, and a
/// length that may run past the last extent (the rest reads as zeros).
#[derive(Clone, Debug, Default)]
pub struct FileData {
    extents: Vec<(u64, Bytes)>,
    len: u64,
}

impl FileData {
    pub fn from_bytes(b: Bytes) -> FileData {
        let len = b.len() as u64;
        FileData {
            extents: if b.is_empty() { vec![] } else { vec![(0, b)] },
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `data` at `offset`. Appends (the common case) push one extent; overwrites cut
    /// the extents they cover, sharing the untouched parts.
    pub fn write(&mut self, offset: u64, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        let append = self
            .extents
            .last()
            .is_none_or(|(o, b)| o + b.len() as u64 <= offset);
        if !append {
            let mut kept = Vec::with_capacity(self.extents.len() + 2);
            for (o, b) in self.extents.drain(..) {
                let e = o + b.len() as u64;
                if e <= offset || o >= end {
                    kept.push((o, b));
                    continue;
                }
                if o < offset {
                    kept.push((o, b.slice(..(offset - o) as usize)));
                }
                if e > end {
                    kept.push((end, b.slice((end - o) as usize..)));
                }
            }
            kept.push((offset, data));
            kept.sort_by_key(|(o, _)| *o);
            self.extents = kept;
        } else {
            self.extents.push((offset, data));
        }
        self.len = self.len.max(end);
    }

    /// What the content is made of (where each extent lies and which bytes it is): equal
    /// before and after a change that changed nothing (a truncation to its own length).
    fn shape(&self) -> (u64, Vec<(u64, usize, usize)>) {
        let extents = self.extents.iter();
        (
            self.len,
            extents
                .map(|(o, b)| (*o, b.as_ptr() as usize, b.len()))
                .collect(),
        )
    }

    pub fn truncate(&mut self, len: u64) {
        self.extents.retain_mut(|(o, b)| {
            if *o >= len {
                return false;
            }
            if *o + b.len() as u64 > len {
                *b = b.slice(..(len - *o) as usize);
            }
            true
        });
        self.len = len;
    }

    /// The whole content as segments from offset 0, holes filled with shared zeros.
    pub fn segments(&self) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(self.extents.len() + 1);
        let mut at = 0u64;
        let zeros = |n: u64, out: &mut Vec<Bytes>| {
            let mut left = n;
            while left > 0 {
                let take = left.min(ZEROS.len() as u64) as usize;
                out.push(Bytes::from_static(&ZEROS[..take]));
                left -= take as u64;
            }
        };
        for (o, b) in &self.extents {
            zeros(o - at, &mut out);
            out.push(b.clone());
            at = o + b.len() as u64;
        }
        zeros(self.len - at, &mut out);
        out
    }

    /// Copies `size` bytes at `offset` (fewer at the end).
    pub fn read(&self, offset: u64, size: u64) -> Vec<u8> {
        let end = offset.saturating_add(size).min(self.len);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for (o, b) in &self.extents {
            let (s, e) = (*o, o + b.len() as u64);
            if e <= offset || s >= end {
                continue;
            }
            let from = s.max(offset);
            let to = e.min(end);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&b[(from - s) as usize..(to - s) as usize]);
        }
        out
    }
}

/// A file in memory: its content, when it last changed, and how many write handles have
/// written to it without a FLUSH since. Shared by whoever refers to it (the inode, a shard's
/// pending position, a temporary name), so that renames move it without copying.
#[derive(Debug)]
pub struct MemFile {
    /// Unique for the mount's life: what a journal record's content is known by.
    id: u64,
    state: Mutex<MemState>,
    /// The BACKING file it was written out as, open: handles on it go on through this
    /// (`FileHandle::went_to`), never its path.
    written: std::sync::OnceLock<std::fs::File>,
}

/// The next `MemFile::id`.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(Clone, Debug)]
pub struct MemState {
    pub data: FileData,
    pub mtime: SystemTime,
    /// Write handles with unflushed writes: the content is final only at zero.
    pub unflushed: u32,
    /// Bumped at every change, so that a shard write can tell whether what it wrote is
    /// still the latest content.
    pub version: u64,
    pub mode: u32,
    /// Whose file it is, when it is to become a file of BACKING (not a chunk): its maker's
    /// user and group (`maker`).
    pub owner: Option<(u32, u32)>,
    /// Writing it to BACKING failed once already (said in the log).
    pub persist_failed: bool,
    /// Written into its shard and dropped from the pending set: a change now would be
    /// lost, so changes are refused and the writer starts again from the shard.
    pub retired: bool,
    /// The last write or close: what "idle" counts from.
    pub touched: Option<Instant>,
    /// A writer asked for its content to be durable (fsync), before its name was: an fsync
    /// of the directory it is renamed into must then include it, even while still open.
    pub fsynced: bool,
    /// When the content last changed (ns since the epoch): the time its shard stamps at
    /// its position (`shard::stamps`). Unlike `mtime`, no setattr moves it.
    pub changed: u64,
    /// The chunk key it was renamed from, whose removal is journaled with its content
    /// (`ShardRegistry::journal_moves`): a crash must not find it under both names.
    pub moved_from: Option<(std::sync::Arc<crate::core::array::ArrayState>, Vec<u64>)>,
    /// The directory it was made in (the nearest one BACKING had, and its device and
    /// inode), for when it is written there: a directory put at that path since is not
    /// where it was made, and may be another user's.
    pub made_in: Option<(std::path::PathBuf, u64, u64)>,
}

/// How far the clock content times are taken on (the object store's, when this process
/// mounts one) runs ahead of this machine's, in ns (`set_clock_offset`).
static CLOCK_OFFSET_NS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// From now on, content times are this machine's clock plus `ns`: nodes of one object store
/// order their writes of a chunk by the store's clock, whatever their own clocks say.
pub fn set_clock_offset(ns: i64) {
    CLOCK_OFFSET_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// The wall-clock time, in ns since the epoch, as content times (`shard::stamps`) take it:
/// on the store's clock (`set_clock_offset`), and never earlier than one this process gave
/// before, so that a clock stepped back never orders this mount's later write of a chunk
/// before its earlier one.
pub fn now_ns() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let here = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let wall = here
        .saturating_add(CLOCK_OFFSET_NS.load(Ordering::Relaxed))
        .max(0) as u64;
    let prev = LAST.fetch_max(wall, Ordering::Relaxed);
    if wall > prev {
        return wall;
    }
    // (Steps of 1 ns past the last one given: distinct and increasing.)
    LAST.fetch_add(1, Ordering::Relaxed) + 1
}

impl MemFile {
    pub fn new(data: FileData, mode: u32) -> MemFile {
        MemFile {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            written: std::sync::OnceLock::new(),
            state: Mutex::new(MemState {
                data,
                mtime: SystemTime::now(),
                unflushed: 0,
                version: 0,
                retired: false,
                touched: Some(Instant::now()),
                fsynced: false,
                changed: now_ns(),
                moved_from: None,
                mode,
                owner: None,
                persist_failed: false,
                made_in: None,
            }),
        }
    }

    /// The file, given to `owner` (its user, group and mode) for when it goes to BACKING.
    pub fn owned_by(self, owner: crate::backing::FileOwner) -> MemFile {
        self.set_owner(owner);
        self
    }

    /// Gives the file to `owner` (its user, group and mode) for when it goes to BACKING.
    pub fn set_owner(&self, owner: crate::backing::FileOwner) {
        self.with(|s| {
            s.owner = Some((owner.uid, owner.gid));
            s.mode = owner.mode;
        });
    }

    /// Whose file it is in BACKING, with the mode it has now (a chmod while held counts):
    /// `None` for a chunk, or a file whose owner is its directory's.
    pub fn maker(&self) -> Option<crate::backing::FileOwner> {
        self.with(|s| {
            s.owner.map(|(uid, gid)| crate::backing::FileOwner {
                uid,
                gid,
                mode: s.mode & 0o7777,
            })
        })
    }

    /// It was written out to BACKING as `file`.
    pub fn set_written(&self, file: std::fs::File) {
        let _ = self.written.set(file);
    }

    /// The BACKING file it was written out as, if it was.
    pub fn written(&self) -> Option<&std::fs::File> {
        self.written.get()
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn snapshot(&self) -> MemState {
        lock(&self.state).clone()
    }

    pub fn len(&self) -> u64 {
        lock(&self.state).data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `f` to the content, stamping a new version and mtime. Returns the change in
    /// length, or `None` when the file was retired (its content went into a shard and it
    /// is no longer where writes should go).
    pub fn change(&self, f: impl FnOnce(&mut FileData)) -> Option<i64> {
        let mut s = lock(&self.state);
        if s.retired {
            return None;
        }
        let before = s.data.len() as i64;
        let shape = s.data.shape();
        f(&mut s.data);
        s.touched = Some(Instant::now());
        s.version += 1;
        s.mtime = SystemTime::now();
        // Its content's time moves only with its content (`shard::stamps`).
        if s.data.shape() != shape {
            s.changed = now_ns();
        }
        Some(s.data.len() as i64 - before)
    }

    /// Retires the file if its content is still at `version`: checked and done under the
    /// file's own lock, so that no change can slip in between.
    pub fn retire_at(&self, version: u64) -> bool {
        let mut s = lock(&self.state);
        if s.version == version {
            s.retired = true;
        }
        s.retired
    }

    /// Takes back a retirement that no longer holds: the file was retired by the write of
    /// a shard it has since left (renamed to another chunk or name while that write was
    /// in flight), so its content is in no shard where it is now.
    pub fn unretire(&self) {
        lock(&self.state).retired = false;
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut MemState) -> R) -> R {
        f(&mut lock(&self.state))
    }

    /// `size` bytes of the content from `offset`, read under the lock (no snapshot: that
    /// would copy the journal bookkeeping on every read).
    pub fn read(&self, offset: u64, size: u64) -> Vec<u8> {
        lock(&self.state).data.read(offset, size)
    }

    /// The current content as segments and its version, for a journal record.
    pub fn content(&self) -> (u64, Vec<bytes::Bytes>) {
        let s = lock(&self.state);
        (s.version, s.data.segments())
    }

    /// When it was last written or closed.
    pub fn touched(&self) -> Option<Instant> {
        lock(&self.state).touched
    }

    pub fn settled(&self) -> bool {
        lock(&self.state).unflushed == 0
    }

    /// Closed, or fsynced by its writer: content its writer stands by, which an fsync of
    /// its directory makes durable.
    pub fn durable_on_request(&self) -> bool {
        let s = lock(&self.state);
        s.unflushed == 0 || s.fsynced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(d: &FileData) -> Vec<u8> {
        d.segments()
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect()
    }

    #[test]
    fn appends_keep_the_segments_as_delivered() {
        let mut d = FileData::default();
        let a = Bytes::from_static(b"hello ");
        let b = Bytes::from_static(b"world");
        d.write(0, a.clone());
        d.write(6, b.clone());
        let segs = d.segments();
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].as_ptr(), a.as_ptr());
        assert_eq!(segs[1].as_ptr(), b.as_ptr());
        assert_eq!(content(&d), b"hello world");
    }

    #[test]
    fn overwrites_holes_and_truncation() {
        let mut d = FileData::default();
        d.write(0, Bytes::from_static(b"aaaaaaaaaa"));
        d.write(3, Bytes::from_static(b"XY"));
        assert_eq!(content(&d), b"aaaXYaaaaa");
        d.write(12, Bytes::from_static(b"z"));
        assert_eq!(content(&d), b"aaaXYaaaaa\0\0z");
        assert_eq!(d.read(4, 3), b"Yaa");
        assert_eq!(d.read(9, 100), b"a\0\0z");
        d.truncate(4);
        assert_eq!(content(&d), b"aaaX");
        d.truncate(6);
        assert_eq!(content(&d), b"aaaX\0\0");
        d.write(0, Bytes::from_static(b"0123456789"));
        assert_eq!(content(&d), b"0123456789");
        assert_eq!(d.segments().len(), 1);
    }

    #[test]
    fn large_holes_are_shared_zero_segments() {
        let mut d = FileData::default();
        d.truncate(200_000);
        let segs = d.segments();
        assert_eq!(segs.iter().map(Bytes::len).sum::<usize>(), 200_000);
        assert!(segs.iter().all(|s| s.iter().all(|&b| b == 0)));
    }
}

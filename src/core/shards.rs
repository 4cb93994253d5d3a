//! Shards as the mount knows them: the decoded index of each shard file (cached until the
//! file changes), and the chunks written through the mount that wait for their shard.
//!
//! A shard is written when every position of it inside the array has been written and
//! closed, or deleted, in this round: then all its chunks go out in one vectored write, to a
//! temporary file renamed over the shard. Partial writes (merged over the shard file) come
//! from fsync, idleness, memory pressure and unmount.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use tracing::{debug, warn};

use super::array::{ArrayState, KeyEntry, lock};
use super::error::FsError;
use super::memfile::{FileData, MemFile};
use super::stats::Stats;
use crate::backing::{Backing, FileVersion, mtime_of};
use crate::errno::ToErrno;
use crate::grid;
use crate::shard::{
    ChunkRange, IndexError, IndexFormat, ShardBuilder, ShardFileError, ShardIndex, read_chunk_part,
    read_index,
};
use crate::zarr::KeyNode;

type SlotKey = (PathBuf, Vec<u64>);

#[derive(Debug, Default)]
pub struct ShardRegistry {
    slots: Mutex<BTreeMap<SlotKey, Arc<ShardSlot>>>,
    pub stats: Stats,
    /// Bytes held by pending chunks and temporary files.
    pending_bytes: AtomicI64,
}

#[derive(Debug, Default)]
struct ShardSlot {
    state: Mutex<ShardState>,
    /// Held for the whole of a shard write: one shard, one writer at a time.
    writing: Mutex<()>,
}

#[derive(Debug, Default)]
struct ShardState {
    stored: Option<StoredIndex>,
    /// Chunks written through the mount and not yet in the shard file.
    pending: BTreeMap<usize, Arc<MemFile>>,
    /// Positions deleted through the mount that the shard file still holds.
    deleted: BTreeSet<usize>,
    /// Positions written (and closed) or deleted in this round.
    done: BTreeSet<usize>,
    last_change: Option<Instant>,
    failure: Option<Failure>,
}

/// Why the last write of a shard failed; reported to writers until a write succeeds.
#[derive(Clone, Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
    pub at: Instant,
}

/// The decoded index of one version of a shard file, or why it could not be decoded. The
/// file itself is not kept open: arrays have more shards than a process has descriptors.
#[derive(Clone, Debug)]
struct StoredIndex {
    format: IndexFormat,
    version: FileVersion,
    mtime: SystemTime,
    index: Result<Arc<ShardIndex>, IndexError>,
}

/// A stored chunk: which version of which shard file holds it, and where.
#[derive(Clone, Debug)]
pub struct StoredChunk {
    pub rel: PathBuf,
    pub version: FileVersion,
    pub range: ChunkRange,
    pub mtime: SystemTime,
}

impl StoredChunk {
    /// Opens the shard file, checking that it is still the version the index came from.
    pub fn open(&self, backing: &Backing) -> Result<File, FsError> {
        let file = backing.open(&self.rel)?;
        if FileVersion::of(&file.metadata()?) != self.version {
            return Err(FsError::Changed);
        }
        Ok(file)
    }

    pub fn read(&self, backing: &Backing) -> Result<Bytes, FsError> {
        let file = self.open(backing)?;
        Ok(Bytes::from(read_chunk_part(
            &file,
            self.range,
            0,
            self.range.nbytes,
        )?))
    }
}

/// Where the bytes of one inner chunk are, if anywhere.
#[derive(Clone, Debug)]
pub enum ChunkData {
    Absent,
    Stored(StoredChunk),
    /// Written through the mount, waiting for its shard.
    Pending(Arc<MemFile>),
    /// Its shard's index is damaged: the chunk is listed, but reading it fails with EIO.
    Damaged {
        path: PathBuf,
        reason: IndexError,
        mtime: SystemTime,
    },
}

/// What a shard write includes. Every shard write is durable: file synced, then renamed,
/// then its directory synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every position is accounted for: no merge expected.
    Complete,
    /// Whatever is pending and settled (idle, memory pressure).
    Settled,
    /// Everything pending, also chunks still open for writing (fsync, unmount).
    Everything,
    /// Everything pending, and nothing of the file now at the shard's path, which is not
    /// a shard (a chunk file written before its array's metadata, already read in).
    Replace,
}

/// One pending shard, for the flusher and for stats.
#[derive(Clone, Debug)]
pub struct PendingShard {
    pub array: PathBuf,
    pub shard: Vec<u64>,
    pub bytes: u64,
    pub chunks: usize,
    pub last_change: Option<Instant>,
    pub failure: Option<Failure>,
    pub all_settled: bool,
}

impl ShardRegistry {
    fn slot(&self, array: &ArrayState, shard: &[u64]) -> Arc<ShardSlot> {
        let mut slots = lock(&self.slots);
        slots
            .entry((array.rel.clone(), shard.to_vec()))
            .or_default()
            .clone()
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Accounts for `delta` bytes more (or fewer) held in memory.
    pub fn charge(&self, delta: i64) {
        self.pending_bytes.fetch_add(delta, Ordering::Relaxed);
    }

    /// The shard file's index as it is now, re-read when the file changed. `Ok(None)`: no
    /// shard file.
    fn stored(
        &self,
        backing: &Backing,
        array: &ArrayState,
        shard: &[u64],
        st: &mut ShardState,
    ) -> Result<Option<StoredIndex>, FsError> {
        let rel = array.shard_rel(shard);
        let Some(meta) = backing.stat(&rel)? else {
            st.stored = None;
            return Ok(None);
        };
        let fresh = st
            .stored
            .as_ref()
            .is_some_and(|s| s.version == FileVersion::of(&meta) && s.format == array.layout.index);
        if !fresh {
            st.stored = Some(load_index(backing, &rel, &array.layout.index)?);
        }
        Ok(st.stored.clone())
    }

    /// Where the chunk at grid coordinates `coords` is.
    pub fn chunk(
        &self,
        backing: &Backing,
        array: &ArrayState,
        coords: &[u64],
    ) -> Result<ChunkData, FsError> {
        if !array.chunk_inside(coords) {
            return Ok(ChunkData::Absent);
        }
        let loc = array.layout.locate(coords);
        let slot = self.slot(array, &loc.shard);
        let mut st = lock(&slot.state);
        if let Some(m) = st.pending.get(&loc.pos) {
            return Ok(ChunkData::Pending(m.clone()));
        }
        if st.deleted.contains(&loc.pos) {
            return Ok(ChunkData::Absent);
        }
        Ok(match self.stored(backing, array, &loc.shard, &mut st)? {
            None => ChunkData::Absent,
            Some(StoredIndex {
                index: Err(reason),
                mtime,
                ..
            }) => ChunkData::Damaged {
                path: backing.path(&array.shard_rel(&loc.shard)),
                reason,
                mtime,
            },
            Some(StoredIndex {
                index: Ok(index),
                version,
                mtime,
                ..
            }) => match index.get(loc.pos) {
                None => ChunkData::Absent,
                Some(range) => ChunkData::Stored(StoredChunk {
                    rel: array.shard_rel(&loc.shard),
                    version,
                    range,
                    mtime,
                }),
            },
        })
    }

    /// Calls `f` with every chunk below `node` that exists (stored, not deleted, or
    /// pending), shard by shard, until `f` breaks. A damaged shard contributes every
    /// position of it inside the array, so that its chunks show up (and fail to read)
    /// rather than vanish.
    fn for_each_chunk_below(
        &self,
        backing: &Backing,
        array: &ArrayState,
        node: &KeyNode,
        mut f: impl FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<(), FsError> {
        let prefix = node.prefix();
        let cps = array.layout.chunks_per_shard().to_vec();
        let shard_prefix: Vec<u64> = prefix.iter().zip(&cps).map(|(c, n)| c / n).collect();
        let mut shards: BTreeSet<Vec<u64>> = BTreeSet::new();
        array.walk_shard_files(backing, &shard_prefix, &mut |s| {
            shards.insert(s);
            ControlFlow::Continue(())
        })?;
        let candidates: Vec<(Vec<u64>, Arc<ShardSlot>)> = lock(&self.slots)
            .range((array.rel.clone(), vec![])..)
            .take_while(|((rel, _), _)| *rel == array.rel)
            .filter(|((_, shard), _)| shard.starts_with(&shard_prefix))
            .map(|((_, shard), slot)| (shard.clone(), slot.clone()))
            .collect();
        for (shard, slot) in candidates {
            if !lock(&slot.state).pending.is_empty() {
                shards.insert(shard);
            }
        }
        for shard in shards {
            let slot = self.slot(array, &shard);
            let positions: BTreeSet<usize> = {
                let mut st = lock(&slot.state);
                let mut positions: BTreeSet<usize> = match self
                    .stored(backing, array, &shard, &mut st)?
                    .map(|s| s.index)
                {
                    None => BTreeSet::new(),
                    Some(Ok(index)) => index.present().map(|(p, _)| p).collect(),
                    Some(Err(_)) => (0..grid::count(&cps)).collect(),
                };
                positions.retain(|p| !st.deleted.contains(p));
                positions.extend(st.pending.keys().copied());
                positions
            };
            for pos in positions {
                let coords = array.layout.chunk_coords(&shard, pos);
                if coords.starts_with(prefix) && array.chunk_inside(&coords) && f(coords).is_break()
                {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    pub fn has_chunks_below(
        &self,
        backing: &Backing,
        array: &ArrayState,
        node: &KeyNode,
    ) -> Result<bool, FsError> {
        let mut found = false;
        self.for_each_chunk_below(backing, array, node, |_| {
            found = true;
            ControlFlow::Break(())
        })?;
        Ok(found)
    }

    /// The entries of `node` that hold chunks, sorted by coordinates.
    pub fn list(
        &self,
        backing: &Backing,
        array: &ArrayState,
        node: &KeyNode,
    ) -> Result<Vec<KeyEntry>, FsError> {
        let encoding = array.layout.key_encoding;
        let mut children: BTreeSet<(Vec<u64>, KeyEntry)> = BTreeSet::new();
        self.for_each_chunk_below(backing, array, node, |coords| {
            let (name, child) = encoding.child_towards(node, &coords);
            let order = child.prefix().to_vec();
            children.insert((order, KeyEntry { name, node: child }));
            ControlFlow::Continue(())
        })?;
        Ok(children.into_iter().map(|(_, entry)| entry).collect())
    }

    /// The pending chunk at `coords`, made if needed: empty when `truncate`, else starting
    /// from the stored chunk's bytes (a write into the middle of a stored chunk).
    pub fn open_for_write(
        &self,
        backing: &Backing,
        array: &ArrayState,
        coords: &[u64],
        truncate: bool,
    ) -> Result<Arc<MemFile>, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(array, &loc.shard);
        let mut st = lock(&slot.state);
        if let Some(m) = st.pending.get(&loc.pos).cloned() {
            if truncate {
                let delta = m.change(|d| d.truncate(0)).unwrap_or(0);
                self.charge(delta);
                // Emptied for a new writer: not done until that writer closes it.
                st.done.remove(&loc.pos);
            }
            return Ok(m);
        }
        let base = if truncate || st.deleted.contains(&loc.pos) {
            FileData::default()
        } else {
            let rel = array.shard_rel(&loc.shard);
            match self.stored(backing, array, &loc.shard, &mut st)? {
                Some(StoredIndex {
                    index: Ok(index),
                    version,
                    mtime,
                    ..
                }) => match index.get(loc.pos) {
                    Some(range) => FileData::from_bytes(
                        StoredChunk {
                            rel,
                            version,
                            range,
                            mtime,
                        }
                        .read(backing)?,
                    ),
                    None => FileData::default(),
                },
                Some(StoredIndex {
                    index: Err(reason), ..
                }) => {
                    return Err(FsError::DamagedShard {
                        path: backing.path(&array.shard_rel(&loc.shard)),
                        reason,
                    });
                }
                None => FileData::default(),
            }
        };
        let m = Arc::new(MemFile::new(base, 0o644));
        self.charge(m.len() as i64);
        st.deleted.remove(&loc.pos);
        st.pending.insert(loc.pos, m.clone());
        st.last_change = Some(Instant::now());
        Ok(m)
    }

    /// Makes `file` the content of the chunk at `coords` (a rename onto its key), marking
    /// the position done when the file is already closed. Returns the content it replaced.
    pub fn put(
        &self,
        array: &ArrayState,
        coords: &[u64],
        file: Arc<MemFile>,
    ) -> Option<Arc<MemFile>> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(array, &loc.shard);
        let mut st = lock(&slot.state);
        st.deleted.remove(&loc.pos);
        if file.settled() {
            st.done.insert(loc.pos);
        }
        st.last_change = Some(Instant::now());
        let old = st.pending.insert(loc.pos, file);
        if let Some(o) = &old {
            self.charge(-(o.len() as i64));
        }
        old
    }

    /// Deletes the chunk at `coords`. Returns whether there was one.
    pub fn delete(
        &self,
        backing: &Backing,
        array: &ArrayState,
        coords: &[u64],
    ) -> Result<bool, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(array, &loc.shard);
        let mut st = lock(&slot.state);
        let had_pending = st.pending.remove(&loc.pos).inspect(|m| {
            self.charge(-(m.len() as i64));
        });
        let stored = match self
            .stored(backing, array, &loc.shard, &mut st)?
            .map(|s| s.index)
        {
            Some(Ok(index)) => index.get(loc.pos).is_some(),
            // A damaged shard: the chunk may be there; deleting it is always allowed.
            Some(Err(_)) => true,
            None => false,
        };
        let existed = had_pending.is_some() || (stored && !st.deleted.contains(&loc.pos));
        // Recorded even when only pending: a shard write in flight may carry the chunk into
        // the file, and the deletion must then win.
        if stored || had_pending.is_some() {
            st.deleted.insert(loc.pos);
        }
        if existed {
            st.done.insert(loc.pos);
            st.last_change = Some(Instant::now());
        }
        Ok(existed)
    }

    /// Marks the chunk at `coords` written and closed.
    pub fn settle(&self, array: &ArrayState, coords: &[u64]) {
        let loc = array.layout.locate(coords);
        let slot = self.slot(array, &loc.shard);
        let mut st = lock(&slot.state);
        if st.pending.get(&loc.pos).is_some_and(|m| m.settled()) {
            st.done.insert(loc.pos);
        }
    }

    /// Whether the shard should be written now: every position inside the array is done
    /// and every pending chunk closed, or nothing at all is left in it.
    pub fn ready(&self, backing: &Backing, array: &ArrayState, shard: &[u64]) -> bool {
        let slot = self.slot(array, shard);
        let mut st = lock(&slot.state);
        if st.pending.is_empty() && st.deleted.is_empty() {
            return false;
        }
        let inside = array.layout.positions_inside(shard);
        if st.done.len() >= inside && st.pending.values().all(|m| m.settled()) {
            return true;
        }
        // Everything the file holds was deleted and nothing is pending: it can go now. Only
        // then is the shard file looked at (a FLUSH of every chunk comes through here).
        if !st.pending.is_empty() {
            return false;
        }
        let Ok(Some(StoredIndex {
            index: Ok(index), ..
        })) = self.stored(backing, array, shard, &mut st)
        else {
            return false;
        };
        index.present().all(|(p, _)| st.deleted.contains(&p))
    }

    /// The failure of the last write of the shard holding `coords`, if any.
    pub fn failure(&self, array: &ArrayState, shard: &[u64]) -> Option<Failure> {
        lock(&self.slot(array, shard).state).failure.clone()
    }

    /// Writes the shard: its pending chunks (per `mode`) and the chunks of the existing
    /// shard file that stay, as one new file; or removes the file when nothing is left.
    /// On failure the pending chunks stay pending and the failure is recorded.
    pub fn write_shard(
        &self,
        backing: &Backing,
        array: &ArrayState,
        shard: &[u64],
        mode: WriteMode,
    ) -> Result<(), FsError> {
        let slot = self.slot(array, shard);
        let _writer = lock(&slot.writing);
        let rel = array.shard_rel(shard);
        let format = array.layout.index.clone();

        // What goes into the new file, taken under the lock; the I/O happens outside it.
        let (chosen, deleted, done, stored) = {
            let mut st = lock(&slot.state);
            let chosen: Vec<(usize, Arc<MemFile>, u64, Vec<Bytes>)> = st
                .pending
                .iter()
                .filter(|(_, m)| {
                    matches!(mode, WriteMode::Everything | WriteMode::Replace) || m.settled()
                })
                .map(|(pos, m)| {
                    let snap = m.snapshot();
                    (*pos, m.clone(), snap.version, snap.data.segments())
                })
                .collect();
            let deleted = st.deleted.clone();
            if chosen.is_empty() && deleted.is_empty() {
                return Ok(());
            }
            let done = st.done.clone();
            let stored = match mode {
                WriteMode::Replace => None,
                _ => self.stored(backing, array, shard, &mut st)?,
            };
            (chosen, deleted, done, stored)
        };
        let result =
            self.assemble_and_write(backing, &rel, &format, &chosen, &deleted, stored, mode);

        let mut st = lock(&slot.state);
        match result {
            Ok(written) => {
                for (pos, m, version, _) in &chosen {
                    // Retired under the file's own lock only if unchanged since the
                    // snapshot; a writer that comes later finds it retired and starts again
                    // from the shard just written.
                    let current = st.pending.get(pos).is_some_and(|cur| Arc::ptr_eq(cur, m));
                    if current && m.retire_at(*version) {
                        st.pending.remove(pos);
                        self.charge(-(m.len() as i64));
                    }
                }
                for pos in &deleted {
                    st.deleted.remove(pos);
                }
                st.stored = written;
                if mode == WriteMode::Complete {
                    // The round is over for what was done when it was taken; positions done
                    // while the write was in flight belong to the next round.
                    st.done.retain(|p| !done.contains(p));
                }
                st.failure = None;
                Ok(())
            }
            Err(e) => {
                Stats::add(&self.stats.write_errors, 1);
                warn!(shard = %backing.path(&rel).display(), "shard write failed, data kept in memory: {e}");
                st.failure = Some(Failure {
                    errno: e.to_errno(),
                    message: e.to_string(),
                    at: Instant::now(),
                });
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble_and_write(
        &self,
        backing: &Backing,
        rel: &std::path::Path,
        format: &IndexFormat,
        chosen: &[(usize, Arc<MemFile>, u64, Vec<Bytes>)],
        deleted: &BTreeSet<usize>,
        stored: Option<StoredIndex>,
        mode: WriteMode,
    ) -> Result<Option<StoredIndex>, FsError> {
        let mut builder = ShardBuilder::new(format.clone());
        let replaced: BTreeSet<usize> = chosen.iter().map(|(p, ..)| *p).collect();
        if let Some(StoredIndex { index, version, .. }) = stored {
            let index = index.map_err(|reason| FsError::DamagedShard {
                path: backing.path(rel),
                reason,
            });
            // Chunks of the old file that stay are read back: a merge. A damaged old file
            // can only be replaced when nothing of it is kept.
            let kept: Vec<(usize, ChunkRange)> = match &index {
                Ok(index) => index
                    .present()
                    .filter(|(p, _)| !replaced.contains(p) && !deleted.contains(p))
                    .collect(),
                Err(_) => vec![],
            };
            if let Err(e) = &index
                && (0..format.n_chunks()).any(|p| !replaced.contains(&p) && !deleted.contains(&p))
            {
                return Err(FsError::Invalid(format!("cannot merge into {e}")));
            }
            if !kept.is_empty() {
                Stats::add(&self.stats.merges, 1);
                let file = backing.open(rel)?;
                if FileVersion::of(&file.metadata()?) != version {
                    return Err(FsError::Changed);
                }
                for (pos, range) in kept {
                    let bytes = read_chunk_part(&file, range, 0, range.nbytes)?;
                    builder.set(pos, vec![Bytes::from(bytes)]);
                }
            }
        }
        for (pos, _, _, segments) in chosen {
            builder.set(*pos, segments.clone());
        }
        let Some(encoded) = builder.build() else {
            if backing.remove_file(rel)? {
                Stats::add(&self.stats.shards_deleted, 1);
                debug!(shard = %rel.display(), "shard removed: no chunk left");
            }
            if let Some(dir) = rel.parent() {
                backing.prune_empty_dirs(dir, dir.ancestors().last().unwrap_or(dir));
            }
            return Ok(None);
        };
        // Always with the directory synced: an fsync of the directory that comes after a
        // write at completion finds nothing pending and must find it durable.
        let meta = backing.write_atomic(rel, encoded.buffers(), true)?;
        Stats::add(&self.stats.shards_written, 1);
        Stats::add(&self.stats.bytes_written, encoded.len());
        if mode != WriteMode::Complete {
            Stats::add(&self.stats.partial_writes, 1);
        }
        debug!(shard = %rel.display(), bytes = encoded.len(), ?mode, "shard written");
        Ok(Some(StoredIndex {
            format: format.clone(),
            version: FileVersion::of(&meta),
            mtime: mtime_of(&meta),
            index: Ok(Arc::new(encoded.index().clone())),
        }))
    }

    /// Every shard with something pending, for the flusher and for stats.
    pub fn pending(&self) -> Vec<PendingShard> {
        let slots: Vec<(SlotKey, Arc<ShardSlot>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|((array, shard), slot)| {
                let st = lock(&slot.state);
                if st.pending.is_empty() && st.deleted.is_empty() {
                    return None;
                }
                Some(PendingShard {
                    array,
                    shard,
                    bytes: st.pending.values().map(|m| m.len()).sum(),
                    chunks: st.pending.len(),
                    last_change: st.last_change,
                    failure: st.failure.clone(),
                    all_settled: st.pending.values().all(|m| m.settled()),
                })
            })
            .collect()
    }

    /// Drops the cached state of the array at `rel` (its directory is gone).
    pub fn forget_array(&self, rel: &std::path::Path) {
        let mut slots = lock(&self.slots);
        for ((r, _), slot) in slots.iter() {
            if r.starts_with(rel) {
                let held: u64 = lock(&slot.state).pending.values().map(|m| m.len()).sum();
                self.charge(-(held as i64));
            }
        }
        slots.retain(|(r, _), _| !r.starts_with(rel));
    }
}

fn load_index(
    backing: &Backing,
    rel: &std::path::Path,
    format: &IndexFormat,
) -> Result<StoredIndex, FsError> {
    let file = backing.open(rel)?;
    let meta = file.metadata()?;
    let index = match read_index(&file, meta.len(), format) {
        Ok(index) => Ok(Arc::new(index)),
        Err(ShardFileError::Index(e)) => {
            warn!(shard = %backing.path(rel).display(), "damaged shard, its chunks read as EIO: {e}");
            Err(e)
        }
        Err(ShardFileError::Io(e)) => return Err(e.into()),
    };
    Ok(StoredIndex {
        format: format.clone(),
        version: FileVersion::of(&meta),
        mtime: mtime_of(&meta),
        index,
    })
}

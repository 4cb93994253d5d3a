//! Shards as the mount knows them: the decoded index of each shard file (cached, within a
//! bounded budget, until the file changes), and the chunks written through the mount that
//! wait for their shard.
//!
//! A shard is written when every position of it inside the array has been written and
//! closed, or deleted, in this round: then all its chunks go out in one vectored write, to a
//! temporary file renamed over the shard. Partial writes (merged over the shard file) come
//! from fsync, idleness, memory pressure and unmount. `write.rs` does the writing;
//! `stored.rs` reads shard files; `ledger.rs` keeps which journal records hold which state of
//! each position, and `records.rs` what a record says besides its bytes.

mod body;
mod codec;
mod ledger;
mod list;
mod records;
mod stored;
mod whereabouts;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use write::PANIC_IN_SHARD_WRITE;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use tracing::warn;

use crate::backing::Backing;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{FileData, MemFile};
use crate::core::stats::Stats;
use crate::shard::IndexError;
use crate::sync::lock;
#[cfg(test)]
pub(crate) use body::PAUSE_BEFORE_APPEND;
pub(crate) use body::PendingChunk;
pub(crate) use ledger::Held;
use ledger::Ledger;
pub(crate) use records::HeldHere;
pub use stored::StoredChunk;
use stored::{OpenShard, StoredIndex, open_shard};
pub use write::{WriteMode, panic_text};

type SlotKey = (PathBuf, Vec<u64>);

/// How long a version of a shard in an object store, once seen, is trusted without a look.
const SEEN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a shard file's index, once confirmed, answers for its chunks' attributes
/// without another look: a listing of a key directory asks for every chunk of each of its
/// shards within milliseconds, and each look (open, fstat, close) cost more than the rest
/// of the answer (find: 44 us per chunk, two thirds of it in those calls). Changes made
/// outside the mount show in attributes this much later, within the attribute TTL the
/// kernel allows itself; reads always look.
const SHOWN_FOR: std::time::Duration = std::time::Duration::from_millis(250);

/// The default budget of the index cache, in bytes (`--index-cache-bytes`).
pub const DEFAULT_INDEX_CACHE: u64 = 256 << 20;
/// What a slot costs besides its index: the map entry, its key and its state.
const SLOT_COST: u64 = 256;

#[derive(Debug)]
pub struct ShardRegistry {
    slots: Mutex<BTreeMap<SlotKey, Arc<ShardSlot>>>,
    stats: Stats,
    /// Bytes held by pending chunks and temporary files.
    pending_bytes: AtomicI64,
    /// What the slots and their cached indexes cost, against `cache_limit`.
    cache_bytes: AtomicU64,
    cache_limit: u64,
    /// A clock for "least recently used".
    clock: AtomicU64,
    /// Where fsynced chunks are made durable, when the mount keeps a journal.
    journal: std::sync::OnceLock<Arc<crate::journal::Journal>>,
    /// Shard files written (or removed) but not yet made durable, with the journal records
    /// that wait on them.
    unsynced: Mutex<BTreeMap<SlotKey, Unsynced>>,

    /// Where shards are read and written: BACKING itself, or an object store.
    store: Arc<dyn crate::store::Store>,
    /// `store` is BACKING itself: shards are files beside the journal, so a body can be
    /// renamed into place and a file synced.
    store_is_backing: bool,
    /// Where arrays moved by another mount went.
    sightings: whereabouts::Sightings,
    /// In an object store: which arrays' documents were last seen to still place their
    /// chunks (`whereabouts::Documents`).
    documents: whereabouts::Documents,
    /// Refused shard writes (a merge into a damaged shard) are logged when booked.
    refusals: Arc<crate::core::refusal::RefusalLog>,
    /// Compressed chunks being read, decompressed once for all their readers.
    decoded: stored::DecodedChunks,
}

#[derive(Debug)]
struct Unsynced {
    rel: PathBuf,
    records: Vec<crate::journal::RecordRef>,
    since: Instant,
}

#[derive(Debug)]
struct ShardSlot {
    /// The array, and so the layout, its chunks were written under: they are written into
    /// shards of that layout, whatever `zarr.json` says by then.
    array: Arc<ArrayState>,
    shard: Vec<u64>,
    state: Mutex<ShardState>,
    /// Held for the whole of a shard write: one shard, one writer at a time.
    writing: Mutex<()>,
    /// Held while the shard's body is begun (`body.rs`), so that it has one.
    body_init: Mutex<()>,
    last_used: AtomicU64,
    /// Chunk contents taken for journal records that are not booked in the ledger yet
    /// (`body::Unbooked`): a shard write waits for them before it chooses what it writes,
    /// so that every record it makes obsolete is retired under its key lock.
    unbooked: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
pub(crate) struct ShardState {
    stored: Option<StoredIndex>,
    /// Chunks written through the mount and not yet in the shard file.
    pending: BTreeMap<usize, Arc<MemFile>>,
    /// Positions deleted through the mount that the shard file still holds.
    deleted: BTreeSet<usize>,
    /// When each deleted position was (ns since the epoch): its stamp in the shard.
    removed_at: BTreeMap<usize, u64>,
    /// Positions written (and closed) or deleted in this round.
    done: BTreeSet<usize>,
    /// The journal records of its positions, and the rule that retires them.
    ledger: Ledger,
    last_change: Option<Instant>,
    failure: Option<Failure>,
    /// The file fsynced chunks of this (new) shard are journaled into, and which versions
    /// of which chunks it holds (`body.rs`).
    body: Option<Arc<crate::journal::body::Body>>,
    in_body: BTreeMap<usize, body::InBody>,
    /// In an object store: the version last seen (none: no shard) and when (`open_stored`).
    seen: Option<(Option<Arc<dyn crate::store::Blob>>, Instant)>,
    /// In BACKING: when `stored` was last confirmed against the shard file (`chunk_shown`
    /// trusts it for `SHOWN_FOR`).
    checked: Option<Instant>,
}

impl ShardState {
    /// Nothing of it needs to stay: no data waits in it. (What a round has done so far
    /// only saves a partial write later; a failure is retried by whoever writes again.)
    pub(crate) fn clean(&self) -> bool {
        self.pending.is_empty() && self.deleted.is_empty()
    }

    /// Its last write failed, and what it was to write still waits.
    pub(crate) fn failed(&self) -> bool {
        self.failure.is_some() && !self.clean()
    }

    /// Whether a deletion here would come back after a crash: the shard file (as last
    /// seen) holds the chunk, or the journal holds a content of it and no removal after.
    pub(crate) fn deletion_to_write(&self) -> bool {
        self.deleted.iter().any(|p| {
            self.ledger.needs_removal(*p)
                || match &self.stored {
                    Some(s) => s.index.as_ref().map_or(true, |i| i.get(*p).is_some()),
                    None => false,
                }
        })
    }
}

/// Why the last write of a shard failed; reported to writers until a write succeeds.
#[derive(Clone, Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
    pub at: Instant,
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
        /// The shard, as its store names it.
        shard: String,
        reason: IndexError,
        mtime: SystemTime,
    },
}

/// What a chunk's attributes show (`ShardRegistry::chunk_shown`).
#[derive(Debug)]
pub enum Shown {
    Absent,
    Stored {
        size: u64,
        mtime: SystemTime,
    },
    Pending(Arc<MemFile>),
    /// Its shard's index is damaged: listed, shown empty, reading it fails with EIO.
    Damaged {
        mtime: SystemTime,
    },
}

/// One pending shard, for the flusher and for stats.
#[derive(Clone, Debug)]
pub struct PendingShard {
    /// The array its chunks were written under.
    pub array: Arc<ArrayState>,
    pub shard: Vec<u64>,
    pub bytes: u64,
    pub chunks: usize,
    /// The last change: a write, a close, a rename or a deletion.
    pub last_change: Option<Instant>,
    /// Whether journal records wait on this shard's write.
    pub journaled: bool,
    pub failure: Option<Failure>,
    pub all_settled: bool,
}

impl ShardRegistry {
    /// Shards kept in `store`; `store_is_backing` when that is BACKING's own directory.
    pub fn new(
        cache_limit: u64,
        store: Arc<dyn crate::store::Store>,
        store_is_backing: bool,
        refusals: &Arc<crate::core::refusal::RefusalLog>,
    ) -> ShardRegistry {
        ShardRegistry {
            store,
            store_is_backing,
            sightings: Default::default(),
            documents: Default::default(),
            refusals: refusals.clone(),
            slots: Mutex::default(),
            stats: Stats::default(),
            pending_bytes: AtomicI64::new(0),
            cache_bytes: AtomicU64::new(0),
            cache_limit,
            clock: AtomicU64::new(0),
            journal: std::sync::OnceLock::new(),
            unsynced: Mutex::default(),
            decoded: Default::default(),
        }
    }

    /// The slot of `shard` of `array`. A slot left by an earlier layout of the array (its
    /// `zarr.json` was rewritten outside the mount) is written out under that layout first;
    /// when that fails, the chunks stay and the caller gets EBUSY.
    fn slot(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        shard: &[u64],
    ) -> Result<Arc<ShardSlot>, FsError> {
        for _ in 0..64 {
            let old = {
                let mut slots = lock(&self.slots);
                let key = (array.rel.clone(), shard.to_vec());
                match slots.get(&key) {
                    // The same array, chunks placed the same way (an array another mount
                    // made anew at the path is another one: its slot is written, which
                    // drops what the old one held, `whereabouts`).
                    Some(s)
                        if s.array.layout.same_placement(&array.layout)
                            && s.array.same_directory(array) =>
                    {
                        s.last_used.store(self.tick(), Ordering::Relaxed);
                        return Ok(s.clone());
                    }
                    // Not replaced while it holds data, or while another request holds
                    // it (it may be about to add some).
                    Some(s) if !lock(&s.state).clean() || Arc::strong_count(s) > 1 => s.clone(),
                    _ => {
                        let fresh = Arc::new(ShardSlot {
                            array: array.clone(),
                            shard: shard.to_vec(),
                            state: Mutex::default(),
                            writing: Mutex::default(),
                            body_init: Mutex::default(),
                            last_used: AtomicU64::new(self.tick()),
                            unbooked: Arc::default(),
                        });
                        let gone = slots.insert(key, fresh.clone()).and_then(|gone| {
                            let mut st = lock(&gone.state);
                            self.uncache(&mut st);
                            st.body.take()
                        });
                        self.cache_bytes.fetch_add(SLOT_COST, Ordering::Relaxed);
                        drop(slots);
                        self.drop_body(gone);
                        self.evict_if_over();
                        return Ok(fresh);
                    }
                }
            };
            self.write_slot(backing, &old, WriteMode::Everything)?;
            drop(old);
            std::thread::yield_now();
        }
        Err(FsError::refused(
            &array.rel.join(crate::zarr::METADATA_FILE),
            crate::core::refusal::Rule::LayoutChangeWhilePending,
            "chunks of the array's earlier layout are still pending and keep being written",
        ))
    }

    /// Makes fsync go through `journal` from now on.
    pub fn set_journal(&self, journal: Arc<crate::journal::Journal>) {
        let _ = self.journal.set(journal);
    }

    pub fn journal(&self) -> Option<&Arc<crate::journal::Journal>> {
        self.journal.get()
    }

    /// Retires journal records (their content is durable in a shard, or dropped on
    /// purpose).
    pub(crate) fn retire(&self, records: Vec<crate::journal::RecordRef>) {
        if let Some(j) = self.journal() {
            j.retire(&records);
        }
    }

    /// Records and syncs the retirement of `records` now (`Journal::retire_durably`).
    /// Returns whether it is durable (no journal: nothing to retire).
    pub(crate) fn retire_durably(&self, records: &[crate::journal::RecordRef]) -> bool {
        self.journal().is_none_or(|j| j.retire_durably(records))
    }

    /// A shard of `array` was written (or removed) without being made durable; `records`
    /// wait on it.
    fn note_unsynced(
        &self,
        array: &ArrayState,
        shard: &[u64],
        records: Vec<crate::journal::RecordRef>,
    ) {
        let mut unsynced = lock(&self.unsynced);
        let entry = unsynced
            .entry((array.rel.clone(), shard.to_vec()))
            .or_insert_with(|| Unsynced {
                rel: array.shard_rel(shard),
                records: Vec::new(),
                since: Instant::now(),
            });
        entry.records.extend(records);
    }

    /// Makes durable (file and directory synced) the shards written earlier that `pick`
    /// names by array, shard and time written, and retires the records that waited on
    /// them. A shard that fails stays to be made durable later.
    pub fn make_durable(
        &self,
        backing: &Backing,
        pick: impl Fn(&Path, &[u64], Instant) -> bool,
    ) -> Result<(), FsError> {
        let picked: Vec<(SlotKey, Unsynced)> = {
            let mut unsynced = lock(&self.unsynced);
            let keys: Vec<SlotKey> = unsynced
                .iter()
                .filter(|((a, s), u)| pick(a, s, u.since))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| unsynced.remove(&k).map(|u| (k, u)))
                .collect()
        };
        let mut first_error = None;
        let mut retiring = Vec::new();
        for (key, u) in picked {
            // A failed sync is never retried into a success (`Journal::synced`): once one
            // failed, nothing retires, and the records wait for a new mount's replay.
            let synced = backing.sync_file_and_dir(&u.rel).map(|_| ());
            let synced = match self.journal() {
                Some(j) => j.synced(synced, "a shard").and_then(|()| j.trusted()),
                None => synced,
            };
            match synced {
                Ok(()) => retiring.extend(u.records),
                Err(e) => {
                    first_error.get_or_insert(FsError::from(e));
                    let mut unsynced = lock(&self.unsynced);
                    let back = unsynced.entry(key).or_insert(Unsynced {
                        rel: u.rel,
                        records: Vec::new(),
                        since: u.since,
                    });
                    back.records.extend(u.records);
                }
            }
        }
        // Durably (one sync for all): what this retires may be superseded by anyone now.
        self.retire_durably(&retiring);
        self.retire(retiring);
        first_error.map_or(Ok(()), Err)
    }

    /// Makes every shard written so far durable, each file and its directory synced (not
    /// one `syncfs`: what it covers depends on the file system, and a layer in between, as
    /// FUSE is, never hears of it), and retires every record that waited on them.
    pub fn make_all_durable(&self, backing: &Backing) -> Result<(), FsError> {
        self.make_durable(backing, |_, _, _| true)?;
        // The retirements too: "durable" means no replay can bring older content back.
        self.sync_journal()
    }

    /// Makes the journal's appends durable, retirements included; fails while one cannot
    /// be recorded.
    fn sync_journal(&self) -> Result<(), FsError> {
        match self.journal() {
            Some(j) => j.sync_all().map_err(|e| {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                FsError::Failed(format!("journal retirements not recorded: {e}"), errno)
            }),
            None => Ok(()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The mount's counters (shards written, merges, errors, panics), kept here where
    /// most of them are counted.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Accounts for `delta` bytes more (or fewer) held in memory.
    pub fn charge(&self, delta: i64) {
        self.pending_bytes.fetch_add(delta, Ordering::Relaxed);
    }

    /// Replaces the cached index of a slot, keeping the cache's account.
    fn set_stored(&self, st: &mut ShardState, new: Option<StoredIndex>) {
        // A version this mount wrote (or found) is looked at again before it is trusted
        // (uncaching forgets the version seen).
        self.uncache_index(st);
        if let Some(s) = &new {
            self.cache_bytes.fetch_add(s.cost(), Ordering::Relaxed);
        }
        st.stored = new;
    }

    fn uncache_index(&self, st: &mut ShardState) {
        st.seen = None;
        st.checked = None;
        if let Some(old) = st.stored.take() {
            self.uncount(old.cost());
        }
    }

    /// A slot leaves the map: its index and its own cost leave the account (once: the
    /// index is taken out, so a thread still holding the slot cannot subtract it again).
    fn uncache(&self, st: &mut ShardState) {
        self.uncache_index(st);
        self.uncount(SLOT_COST);
    }

    fn uncount(&self, n: u64) {
        let _ = self
            .cache_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(n))
            });
    }

    /// Over the budget, drops the least recently used slots that hold nothing but a cached
    /// index (and that nobody is using right now), down to three quarters of it.
    pub(crate) fn evict_if_over(&self) {
        if self.cache_bytes.load(Ordering::Relaxed) <= self.cache_limit {
            return;
        }
        let mut slots = lock(&self.slots);
        let mut idle: Vec<(u64, SlotKey)> = slots
            .iter()
            .filter(|(_, s)| Arc::strong_count(s) == 1)
            .filter(|(_, s)| s.state.try_lock().is_ok_and(|st| st.clean()))
            .map(|(k, s)| (s.last_used.load(Ordering::Relaxed), k.clone()))
            .collect();
        idle.sort_unstable();
        let target = self.cache_limit / 4 * 3;
        let mut bodies = Vec::new();
        for (_, key) in idle {
            if self.cache_bytes.load(Ordering::Relaxed) <= target {
                break;
            }
            if let Some(slot) = slots.remove(&key) {
                let mut st = lock(&slot.state);
                self.uncache(&mut st);
                bodies.push(st.body.take());
            }
        }
        drop(slots);
        for body in bodies {
            self.drop_body(body);
        }
    }

    /// The version of the shard holding `coords` is to be looked at again, not trusted.
    pub fn forget_seen(&self, array: &ArrayState, coords: &[u64]) {
        let shard = array.layout.locate(coords).shard;
        let slot = lock(&self.slots).get(&(array.rel.clone(), shard)).cloned();
        if let Some(slot) = slot {
            lock(&slot.state).seen = None;
        }
    }

    /// A shard as a user would name it: its path, or its object store URL.
    pub fn describe(&self, rel: &Path) -> String {
        self.store.describe(rel)
    }

    /// The store's requests so far, when it counts them (an object store).
    pub fn store_requests(&self) -> Option<BTreeMap<String, u64>> {
        self.store.requests()
    }

    /// The cache's size now: slots and the bytes they cost.
    pub fn cache_usage(&self) -> (u64, u64) {
        (
            lock(&self.slots).len() as u64,
            self.cache_bytes.load(Ordering::Relaxed),
        )
    }

    /// The shard as it is now, pinned, with its index (cached when unchanged).
    /// `Ok(None)`: no shard.
    ///
    /// In an object store, where every look is a request, the version seen is trusted for
    /// `SEEN_FOR` (the staleness the attribute TTL already allows for changes made outside
    /// the mount), and when the store cannot be reached the version last seen answers,
    /// so that writes into memory go on while it is away (reading a chunk's bytes still
    /// needs the store, and fails with EIO).
    fn open_stored(
        &self,
        slot: &ShardSlot,
        shard: &[u64],
        st: &mut ShardState,
    ) -> Result<Option<OpenShard>, FsError> {
        self.open_stored_trusting(slot, shard, st, true)
    }

    /// `open_stored`, looking at the store again whatever was seen (a change decided from
    /// what the shard holds: a chunk opened to be changed in place, a removal), unless
    /// the store cannot be reached.
    fn open_stored_now(
        &self,
        slot: &ShardSlot,
        shard: &[u64],
        st: &mut ShardState,
    ) -> Result<Option<OpenShard>, FsError> {
        self.open_stored_trusting(slot, shard, st, false)
    }

    fn open_stored_trusting(
        &self,
        slot: &ShardSlot,
        shard: &[u64],
        st: &mut ShardState,
        trust: bool,
    ) -> Result<Option<OpenShard>, FsError> {
        let array = &slot.array;
        let rel = array.shard_rel(shard);
        if let Some((seen, at)) = &st.seen
            && trust
            && at.elapsed() < SEEN_FOR
        {
            return Ok(self.as_seen(seen, st));
        }
        let opened = match open_shard(&*self.store, &rel, &array.layout.index, st.stored.as_ref()) {
            // (Not when the store lost everything: what was seen is gone.)
            Err(FsError::Io(e)) if st.seen.is_some() && !self.store.lost() => {
                warn!(shard = %rel.display(), "the store cannot be reached, the shard as last seen answers: {e}");
                let seen = st.seen.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
                return Ok(self.as_seen(&seen, st));
            }
            other => other?,
        };
        let current = opened.as_ref().map(|o| o.stored.clone());
        let same = match (&current, &st.stored) {
            (Some(a), Some(b)) => a.version == b.version,
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.set_stored(st, current);
        }
        if self.store_is_backing {
            st.checked = Some(Instant::now());
        } else {
            st.seen = Some((opened.as_ref().map(|o| o.file.clone()), Instant::now()));
        }
        Ok(opened)
    }

    fn as_seen(
        &self,
        seen: &Option<Arc<dyn crate::store::Blob>>,
        st: &ShardState,
    ) -> Option<OpenShard> {
        match (seen, &st.stored) {
            (Some(file), Some(stored)) => Some(OpenShard {
                file: file.clone(),
                stored: stored.clone(),
            }),
            _ => None,
        }
    }

    /// Where the chunk at grid coordinates `coords` is.
    pub fn chunk(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<ChunkData, FsError> {
        if !array.chunk_inside(coords) {
            return Ok(ChunkData::Absent);
        }
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        if let Some(m) = st.pending.get(&loc.pos) {
            return Ok(ChunkData::Pending(m.clone()));
        }
        if st.deleted.contains(&loc.pos) {
            return Ok(ChunkData::Absent);
        }
        let Some(open) = self.open_stored(&slot, &loc.shard, &mut st)? else {
            return Ok(ChunkData::Absent);
        };
        let rel = array.shard_rel(&loc.shard);
        Ok(match open.stored.index {
            Err(reason) => ChunkData::Damaged {
                shard: self.describe(&rel),
                reason,
                mtime: open.stored.mtime,
            },
            Ok(ref index) => match index.get(loc.pos) {
                None => ChunkData::Absent,
                Some(range) => ChunkData::Stored(StoredChunk {
                    decoded: match array.zstd {
                        Some(_) => self.decoded.cell(&rel, open.file.as_ref(), range),
                        None => Arc::default(),
                    },
                    range,
                    mtime: open.stored.mtime,
                    file: open.file,
                    pos: loc.pos,
                    shard: Arc::new(open.stored.clone()),
                    zstd: array.zstd.map(|z| z.max),
                    rel,
                }),
            },
        })
    }

    /// What the attributes of the chunk at `coords` show (a lookup's, a listing's): as
    /// `chunk` says, but from the index as confirmed within `SHOWN_FOR` when there is one,
    /// without opening the shard file. A compressed chunk's size is in its frame: asked
    /// of `chunk`.
    pub fn chunk_shown(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<Shown, FsError> {
        if array.zstd.is_some() || !self.store_is_backing {
            return Ok(match self.chunk(backing, array, coords)? {
                ChunkData::Absent => Shown::Absent,
                ChunkData::Stored(c) => Shown::Stored {
                    size: c.size()?,
                    mtime: c.mtime,
                },
                ChunkData::Pending(m) => Shown::Pending(m),
                ChunkData::Damaged { mtime, .. } => Shown::Damaged { mtime },
            });
        }
        if !array.chunk_inside(coords) {
            return Ok(Shown::Absent);
        }
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        if let Some(m) = st.pending.get(&loc.pos) {
            return Ok(Shown::Pending(m.clone()));
        }
        if st.deleted.contains(&loc.pos) {
            return Ok(Shown::Absent);
        }
        self.look_unless_shown(&slot, &loc.shard, &mut st)?;
        Ok(match &st.stored {
            None => Shown::Absent,
            Some(s) => match &s.index {
                Err(_) => Shown::Damaged { mtime: s.mtime },
                Ok(index) => match index.get(loc.pos) {
                    None => Shown::Absent,
                    Some(range) => Shown::Stored {
                        size: range.nbytes,
                        mtime: s.mtime,
                    },
                },
            },
        })
    }

    /// Makes `st.stored` the shard file as it is, unless it was confirmed within
    /// `SHOWN_FOR` (in an object store, as `open_stored` trusts what it saw).
    fn look_unless_shown(
        &self,
        slot: &ShardSlot,
        shard: &[u64],
        st: &mut ShardState,
    ) -> Result<(), FsError> {
        if st.checked.is_none_or(|at| at.elapsed() >= SHOWN_FOR) {
            self.open_stored(slot, shard, st)?;
        }
        Ok(())
    }

    /// The pending chunk at `coords`, made if needed: empty when `truncate`, else starting
    /// from the stored chunk's bytes (a write into the middle of a stored chunk).
    pub fn open_for_write(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        truncate: bool,
    ) -> Result<Arc<MemFile>, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        if let Some(m) = st.pending.get(&loc.pos).cloned() {
            // A file this slot's own write retired has left `pending`; one still here was
            // retired by the write of the shard it was renamed from.
            m.unretire();
            if truncate {
                let delta = m.change(|d| d.truncate(0)).unwrap_or(0);
                // A new writer's content: an earlier writer's fsync does not cover it (and
                // the new version is in no record).
                m.with(|s| s.fsynced = false);
                self.charge(delta);
                // Emptied for a new writer: not done until that writer closes it.
                st.done.remove(&loc.pos);
            }
            return Ok(m);
        }
        let (base, since) = if truncate || st.deleted.contains(&loc.pos) {
            (FileData::default(), None)
        } else {
            self.stored_content(&slot, array, coords, &mut st)?
        };
        let m = Arc::new(MemFile::new(base, 0o644));
        if let Some(t) = since {
            m.with(|s| s.changed = t);
        }
        self.charge(m.len() as i64);
        st.deleted.remove(&loc.pos);
        st.removed_at.remove(&loc.pos);
        st.pending.insert(loc.pos, m.clone());
        st.last_change = Some(Instant::now());
        Ok(m)
    }

    /// The stored content of the chunk at `coords` (empty if none), with the time its shard
    /// gives it (0: not known), to be opened unchanged; anything else is a new content of
    /// the chunk, from now (`None`).
    fn stored_content(
        &self,
        slot: &ShardSlot,
        array: &ArrayState,
        coords: &[u64],
        st: &mut ShardState,
    ) -> Result<(FileData, Option<u64>), FsError> {
        let loc = array.layout.locate(coords);
        let Some(open) = self.open_stored_now(slot, &loc.shard, st)? else {
            return Ok((FileData::default(), None));
        };
        let index = match &open.stored.index {
            Ok(index) => index,
            Err(reason) => {
                return Err(FsError::damaged_shard(
                    &array.chunk_rel(coords),
                    &self.describe(&array.shard_rel(&loc.shard)),
                    reason,
                ));
            }
        };
        let Some(range) = index.get(loc.pos) else {
            return Ok((FileData::default(), None));
        };
        let stamps = self.stamps_of(&open);
        let since = stamps.and_then(|s| s.get(loc.pos).copied()).unwrap_or(0);
        let bytes =
            crate::shard::read_whole_chunk(&open.file, range, crate::limits::MAX_FILE_BYTES)?;
        let bytes = match array.zstd {
            Some(z) => stored::decode(&bytes, &array.shard_rel(&loc.shard), z.max)?,
            None => Bytes::from(bytes),
        };
        Ok((FileData::from_bytes(bytes), Some(since)))
    }

    /// Makes `file` the content of the chunk at `coords` (a rename onto its key), marking
    /// the position done when the file is already closed. Returns the content it replaced.
    pub fn put(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        file: Arc<MemFile>,
    ) -> Result<Option<Arc<MemFile>>, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        st.deleted.remove(&loc.pos);
        st.removed_at.remove(&loc.pos);
        // Its content is this key's from now on (`shard::stamps`).
        file.with(|s| s.changed = crate::core::pending::memfile::now_ns());
        if file.settled() {
            st.done.insert(loc.pos);
        }
        st.last_change = Some(Instant::now());
        // The records of what it replaces stay in the ledger: the next write of the
        // position retires them.
        let old = st.pending.insert(loc.pos, file);
        if let Some(o) = &old {
            self.charge(-(o.len() as i64));
        }
        Ok(old)
    }

    /// Deletes the chunk at `coords` (an unlink). Returns whether there was one.
    pub fn delete(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<bool, FsError> {
        self.delete_as(backing, array, coords, true)
    }

    /// Takes the chunk at `coords` away from its key: renamed elsewhere, its content now
    /// held by another name. `journal_removal` only when that name holds it durably: a
    /// crash must find it at one name or the other, never at neither (without, an fsync of
    /// the directory writes the removal into the shard).
    pub fn move_away(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        journal_removal: bool,
    ) -> Result<bool, FsError> {
        self.delete_as(backing, array, coords, journal_removal)
    }

    /// Whether the journal holds a content of the chunk at `coords` that it has not seen
    /// removed: moving it away needs its content durable at the new name first.
    pub fn journal_holds(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<bool, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        Ok(lock(&slot.state).ledger.needs_removal(loc.pos))
    }

    fn delete_as(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        journal_removal: bool,
    ) -> Result<bool, FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        let had_pending = st.pending.remove(&loc.pos).inspect(|m| {
            self.charge(-(m.len() as i64));
        });
        let stored = match self.open_stored_now(&slot, &loc.shard, &mut st)? {
            Some(OpenShard { stored, .. }) => match stored.index {
                Ok(index) => index.get(loc.pos).is_some(),
                // A damaged shard: the chunk may be there; deleting it is always allowed.
                Err(_) => true,
            },
            None => false,
        };
        let existed = had_pending.is_some() || (stored && !st.deleted.contains(&loc.pos));
        // Recorded even when only pending: a shard write in flight may carry the chunk into
        // the file, and the deletion must then win.
        if stored || had_pending.is_some() {
            st.deleted.insert(loc.pos);
            st.removed_at
                .insert(loc.pos, crate::core::pending::memfile::now_ns());
        }
        if existed {
            st.done.insert(loc.pos);
            st.last_change = Some(Instant::now());
        }
        // A content of it in the journal must not come back: its removal is journaled
        // too, durable with the next sync (before any later fsync returns).
        let removal = (journal_removal && st.ledger.needs_removal(loc.pos)).then(|| self.stamp());
        drop(st);
        if let Some(stamp) = removal {
            self.journal_removal(backing, &slot, coords, stamp);
        }
        Ok(existed)
    }

    /// Marks the chunk at `coords` written and closed.
    pub fn settle(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<(), FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        if st.pending.get(&loc.pos).is_some_and(|m| m.settled()) {
            st.done.insert(loc.pos);
        }
        Ok(())
    }

    /// Whether the shard should be written now: every position inside the array is done
    /// and every pending chunk closed, or nothing at all is left in it.
    pub fn ready(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        shard: &[u64],
    ) -> Result<bool, FsError> {
        let slot = self.slot(backing, array, shard)?;
        let mut st = lock(&slot.state);
        if st.pending.is_empty() && st.deleted.is_empty() {
            return Ok(false);
        }
        let inside = array.layout.positions_inside(shard);
        if st.done.len() >= inside && st.pending.values().all(|m| m.settled()) {
            return Ok(true);
        }
        // Everything the file holds was deleted and nothing is pending: it can go now. Only
        // then is the shard file looked at (a FLUSH of every chunk comes through here).
        if !st.pending.is_empty() {
            return Ok(false);
        }
        let Ok(Some(OpenShard { stored, .. })) = self.open_stored(&slot, shard, &mut st) else {
            return Ok(false);
        };
        Ok(match stored.index {
            Ok(index) => index.present().all(|(p, _)| st.deleted.contains(&p)),
            Err(_) => false,
        })
    }

    /// The failure of the last write of the shard, if any.
    pub fn failure(&self, array: &ArrayState, shard: &[u64]) -> Option<Failure> {
        let slots = lock(&self.slots);
        let slot = slots.get(&(array.rel.clone(), shard.to_vec()))?;
        lock(&slot.state).failure.clone()
    }

    /// Writes the shard of `array` (per `mode`).
    pub fn write_shard(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        shard: &[u64],
        mode: WriteMode,
    ) -> Result<(), FsError> {
        let slot = self.slot(backing, array, shard)?;
        self.write_slot(backing, &slot, mode)
    }

    /// Writes a pending shard as listed by `pending()`, under the layout it was written in.
    pub fn write_pending(
        &self,
        backing: &Backing,
        p: &PendingShard,
        mode: WriteMode,
    ) -> Result<(), FsError> {
        let slot = lock(&self.slots)
            .get(&(p.array.rel.clone(), p.shard.clone()))
            .cloned();
        match slot {
            Some(slot) => self.write_slot(backing, &slot, mode),
            None => Ok(()),
        }
    }

    /// The slots of `array` whose shards lie below `shard_prefix`: shards sort by
    /// coordinates, so they are one run of the map.
    fn slots_below(&self, array: &Path, shard_prefix: &[u64]) -> Vec<Arc<ShardSlot>> {
        lock(&self.slots)
            .range((array.to_path_buf(), shard_prefix.to_vec())..)
            .take_while(|((rel, shard), _)| rel == array && shard.starts_with(shard_prefix))
            .map(|(_, slot)| slot.clone())
            .collect()
    }

    /// The pending chunks of `array` in shards below `shard_prefix` that an fsync of their
    /// directory makes durable: closed or fsynced by their writer, and not in the journal
    /// at their current content yet. With their coordinates.
    pub fn files_to_journal(&self, array: &Path, shard_prefix: &[u64]) -> Vec<PendingChunk> {
        let mut out = Vec::new();
        for slot in self.slots_below(array, shard_prefix) {
            let st = lock(&slot.state);
            for (pos, m) in &st.pending {
                let (version, durable) = m.with(|s| (s.version, s.unflushed == 0 || s.fsynced));
                if !durable || st.ledger.holds(*pos, Held::of(m, version)) {
                    continue;
                }
                let coords = slot.array.layout.chunk_coords(&slot.shard, *pos);
                out.push((slot.array.clone(), coords, m.clone()));
            }
        }
        out
    }

    /// Writes, whole (`WriteMode::Everything`), the shards of `array` below `shard_prefix`
    /// whose state `which` picks. Every one is tried; the first error is returned.
    pub(crate) fn write_below(
        &self,
        backing: &Backing,
        array: &Path,
        shard_prefix: &[u64],
        which: impl Fn(&ShardState) -> bool,
    ) -> Result<(), FsError> {
        let mut first_error = None;
        for slot in self.slots_below(array, shard_prefix) {
            if !which(&lock(&slot.state)) {
                continue;
            }
            if let Err(e) = self.write_slot(backing, &slot, WriteMode::Everything) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Every shard with something pending, for the flusher and for stats.
    pub fn pending(&self) -> Vec<PendingShard> {
        let slots: Vec<(SlotKey, Arc<ShardSlot>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|((_, shard), slot)| {
                let st = lock(&slot.state);
                if st.pending.is_empty() && st.deleted.is_empty() {
                    return None;
                }
                let touched = st.pending.values().filter_map(|m| m.touched()).max();
                Some(PendingShard {
                    array: slot.array.clone(),
                    shard,
                    bytes: st.pending.values().map(|m| m.len()).sum(),
                    chunks: st.pending.len(),
                    last_change: st.last_change.max(touched),
                    journaled: !st.ledger.is_empty(),
                    failure: st.failure.clone(),
                    all_settled: st.pending.values().all(|m| m.settled()),
                })
            })
            .collect()
    }

    /// Drops the cached state of the arrays at and below `rel` (their directory is gone or
    /// moved). Slots that still hold something are kept: their data is written under the
    /// layout it belongs to, never dropped.
    pub fn forget_array(&self, rel: &Path) {
        let mut bodies = Vec::new();
        let mut slots = lock(&self.slots);
        slots.retain(|(r, _), slot| {
            let mut st = lock(&slot.state);
            let keep = !r.starts_with(rel) || !st.clean() || Arc::strong_count(slot) > 1;
            if !keep {
                self.uncache(&mut st);
                bodies.push(st.body.take());
            }
            keep
        });
        drop(slots);
        for body in bodies {
            self.drop_body(body);
        }
    }

    /// Drops what an import put into the array at `rel` (it was undone: the chunks are
    /// back in their files). What the journal holds a record of is kept, to be written
    /// under the layout it belongs to: it came from an earlier array at that path.
    pub fn discard_array(&self, rel: &Path) {
        let mut bodies = Vec::new();
        let mut slots = lock(&self.slots);
        slots.retain(|(r, _), slot| {
            if r != rel {
                return true;
            }
            let mut st = lock(&slot.state);
            let ShardState {
                pending,
                deleted,
                ledger,
                ..
            } = &mut *st;
            pending.retain(|pos, m| {
                let keep = ledger.has_records(*pos);
                if !keep {
                    self.charge(-(m.len() as i64));
                }
                keep
            });
            deleted.retain(|pos| ledger.has_records(*pos));
            if !st.clean() {
                return true;
            }
            st.in_body.clear();
            bodies.push(st.body.take());
            self.uncache(&mut st);
            false
        });
        drop(slots);
        // With no slot locked: a shard write holds its body's lock while it takes its
        // slot's.
        for body in bodies {
            self.drop_body(body);
        }
    }

    /// The next stamp of the journal's sequence (`ledger`): taken under the slot's lock.
    pub(super) fn stamp(&self) -> u64 {
        self.journal().map_or(0, |j| j.reserve_ids(1))
    }
}

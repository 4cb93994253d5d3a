//! The write-ahead journal that makes fsync cost one record instead of one shard write.
//!
//! An fsync of a pending chunk (or of a directory holding pending chunks) appends the chunk
//! as a record to this mount's journal and waits for one `fdatasync`, shared by every fsync
//! waiting at that moment (group commit). The chunk stays pending; its shard is still
//! written once, when complete (or idle, or under pressure, or at unmount). A record is
//! retired when its shard write is durable; a segment file with no live record left is
//! deleted.
//!
//! Journals live in BACKING, in `.shardfs/journal/`: one per mount instance, named by a
//! random id, made of numbered segment files, with a lock file the mount holds (an OFD
//! lock) for its whole life. A mount starting up takes over every journal whose lock it
//! can take (its mount died, on this machine or another) and replays its records. The
//! journal sits behind `Backing`, like everything else written to BACKING.

pub mod body;
pub mod record;
mod trust;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use bytes::Bytes;
use serde::Serialize;
use tracing::{error, info, warn};

use crate::backing::{Backing, OpenMode, is_absent};
use crate::sync::lock;

/// Where journals live, relative to BACKING's root.
pub const JOURNAL_DIR: &str = ".shardfs/journal";
/// An array and its layout, as a layout record names them: (path, instance, meta).
type LayoutKey = (PathBuf, String, Vec<u8>);

/// A fresh lock file older than this, and not locked, is a dead mount's that never began.
const UNBORN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// How often a live mount looks for journals of mounts that died.
const ADOPTION_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// A segment is closed and a new one begun past this size.
const SEGMENT_BYTES: u64 = 64 << 20;
/// The largest shard body a replay reads (a shard's chunks, fsynced before the shard was
/// written).
const MAX_BODY_BYTES: u64 = 16 << 30;

/// A record in a segment, to be retired when its chunk is durable in its shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordRef {
    segment: PathBuf,
    id: u64,
}

impl RecordRef {
    /// The id of the journal the record is in.
    pub fn journal(&self) -> String {
        journal_id(&self.segment).unwrap_or_default()
    }
}

#[cfg(test)]
impl RecordRef {
    pub(crate) fn for_tests(id: u64) -> RecordRef {
        RecordRef {
            segment: PathBuf::from("test.000000.seg"),
            id,
        }
    }
}

/// One chunk to be made durable: where it goes and its bytes, or its removal.
pub struct Entry<'a> {
    /// The array directory, relative to BACKING.
    pub array: &'a Path,
    /// Which array was at that path (`ArrayState::instance`).
    pub instance: &'a str,
    /// The array's sharded `zarr.json` as stored: the layout the chunk belongs to.
    pub meta: &'a [u8],
    pub coords: &'a [u64],
    /// What the shard held at the chunk's position when the content was taken.
    pub was: record::Was,
    /// The chunk's bytes; `None`: the chunk was removed.
    pub data: Option<&'a [Bytes]>,
    /// From `reserve_ids`, taken when the content (or the removal) was, under the lock
    /// that orders the chunk's changes.
    pub id: u64,
}

impl Entry<'_> {
    /// What its record says besides its bytes: the prior state, and the time now, on the
    /// clock every content time is taken on (`memfile::now_ns`: the store's, on an object
    /// store), as replay compares it with those.
    pub fn stamp(&self) -> record::Stamp {
        let at = crate::core::pending::memfile::now_ns();
        record::Stamp { was: self.was, at }
    }
}

/// A chunk read back from a dead mount's journal.
#[derive(Debug)]
pub struct Replayed {
    pub array: PathBuf,
    /// Which array was at that path when the record was written (`None`: not recorded).
    pub instance: Option<String>,
    pub meta: Vec<u8>,
    pub coords: Vec<u64>,
    /// What the shard held at the chunk's position then.
    pub was: record::Was,
    /// When it was written (wall clock, ns since the epoch; 0: not known).
    pub at: u64,
    /// The chunk's bytes; `None`: a removal.
    pub data: Option<Bytes>,
    pub record: RecordRef,
}

/// Counters for `shardfs stats`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct JournalReport {
    pub journal_bytes: u64,
    pub live_records: u64,
    pub group_commits: u64,
    pub journaled_chunks: u64,
    pub replayed_records: u64,
}

#[derive(Debug)]
struct Segment {
    live: u64,
    bytes: u64,
}

#[derive(Debug)]
struct Current {
    path: PathBuf,
    file: File,
    bytes: u64,
    number: u64,
    /// Layouts written to this segment: (array, instance, meta) -> id.
    layouts: BTreeMap<LayoutKey, u32>,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Appends so far, and how many of them are durable.
    written: u64,
    synced: u64,
    syncing: bool,
}

#[derive(Debug)]
pub struct Journal {
    backing: Backing,
    id: String,
    current: Mutex<Current>,
    /// Every segment with live records (this mount's and adopted ones).
    segments: Mutex<BTreeMap<PathBuf, Segment>>,
    /// Every body with live records, or still taking them (`body.rs`).
    bodies: Mutex<BTreeMap<PathBuf, body::BodyEntry>>,
    next_body: AtomicU64,
    /// The next record id: ids grow through the whole journal (segments and bodies).
    next_id: AtomicU64,
    sync: Mutex<SyncState>,
    synced_cv: Condvar,
    /// Ids whose retirement could not be recorded (a full disk). Tried again before every
    /// sync, and until then every sync fails: a replay could bring their records back over
    /// newer content, so nothing may be acknowledged as durable.
    unrecorded: Mutex<Vec<u64>>,
    /// Ids whose retirement is recorded and synced already (`retire_durably`): their
    /// retirement, in memory, records nothing more.
    recorded: Mutex<std::collections::BTreeSet<u64>>,
    /// The first sync that failed, if one did. From then on no sync is trusted: after a
    /// failed writeback Linux reports the error once, and a later sync of the same file may
    /// succeed without the data ever reaching the disk (PostgreSQL's "fsyncgate"). Every
    /// fsync fails, and nothing is retired, until a new mount replays the journal.
    poisoned: Mutex<Option<String>>,
    /// When dead mounts' journals were last looked for by a live mount.
    last_adoption: Mutex<Option<std::time::Instant>>,
    /// Journals of others found in the directory (`trust`), said once each.
    refused: Mutex<std::collections::BTreeSet<String>>,
    /// The OFD lock that tells other mounts this journal is alive.
    _alive: File,
    group_commits: AtomicU64,
    journaled_chunks: AtomicU64,
    replayed_records: AtomicU64,
}

/// Journals not replayed that the log names, one line each; more are said once in all.
const REFUSALS_NAMED: usize = 64;

impl Journal {
    /// Begins this mount's journal.
    pub fn open(backing: &Backing) -> io::Result<Journal> {
        let dir = Path::new(JOURNAL_DIR);
        trust::check_root(backing)?;
        trust::ensure_dir(backing, dir.parent().unwrap_or(dir))?;
        trust::ensure_dir(backing, dir)?;
        // A journal directory just made is durable only once BACKING's root is synced.
        backing.sync_dir_chain(dir)?;
        let id = new_id();
        // Locked before it has the name other mounts look for: a mount starting up beside
        // this one must never find the lock free and take this journal for a dead one.
        let fresh = dir.join(format!("{id}.lock.new"));
        let alive = backing.open_file(&fresh, create(0o600))?;
        if !crate::backing::lock::try_lock(&alive)? {
            return Err(io::Error::other(
                "a fresh journal lock is held by someone else",
            ));
        }
        backing.rename(&fresh, &dir.join(format!("{id}.lock")))?;
        let first = Self::new_segment(backing, &id, 0)?;
        Ok(Journal {
            backing: backing.clone(),
            id,
            current: Mutex::new(first),
            segments: Mutex::new(BTreeMap::new()),
            bodies: Mutex::new(BTreeMap::new()),
            next_body: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            sync: Mutex::default(),
            synced_cv: Condvar::new(),
            recorded: Mutex::default(),
            unrecorded: Mutex::default(),
            poisoned: Mutex::default(),
            last_adoption: Mutex::default(),
            refused: Mutex::default(),
            _alive: alive,
            group_commits: AtomicU64::new(0),
            journaled_chunks: AtomicU64::new(0),
            replayed_records: AtomicU64::new(0),
        })
    }

    fn new_segment(backing: &Backing, id: &str, number: u64) -> io::Result<Current> {
        let path = Path::new(JOURNAL_DIR).join(format!("{id}.{number:06}.seg"));
        let file = backing.open_file(&path, create(0o600))?;
        // The segment's name must be durable before a record in it is relied on.
        backing.sync_dir(Path::new(JOURNAL_DIR))?;
        Ok(Current {
            path,
            file,
            bytes: 0,
            number,
            layouts: BTreeMap::new(),
        })
    }

    /// Appends `entries` and makes them durable (one fdatasync for everyone waiting at
    /// that moment). Returns one record per entry, to retire when the chunk is durable in
    /// its shard.
    pub fn append(&self, entries: &[Entry]) -> io::Result<Vec<RecordRef>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let (refs, seq) = self.write_records(entries)?;
        self.sync_to(seq)?;
        self.journaled_chunks
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        Ok(refs)
    }

    /// Appends `entries` without waiting for a sync: they are durable with the next one
    /// (every fsync ends with one). For removals, which must be durable no later than
    /// whatever a later fsync acknowledges.
    pub fn append_unsynced(&self, entries: &[Entry]) -> io::Result<Vec<RecordRef>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.write_records(entries)?.0)
    }

    fn write_records(&self, entries: &[Entry]) -> io::Result<(Vec<RecordRef>, u64)> {
        let mut cur = lock(&self.current);
        if cur.bytes > SEGMENT_BYTES {
            self.rotate(&mut cur)?;
        }
        let mut buffers: Vec<Bytes> = Vec::new();
        // Layouts new to this segment are booked only once their records are written: a
        // failed append must not leave chunks of a later one behind a layout never written.
        let mut new_layouts: BTreeMap<LayoutKey, u32> = BTreeMap::new();
        for e in entries {
            let key = (
                e.array.to_path_buf(),
                e.instance.to_string(),
                e.meta.to_vec(),
            );
            let layout = match cur.layouts.get(&key).or(new_layouts.get(&key)) {
                Some(id) => *id,
                None => {
                    let id = (cur.layouts.len() + new_layouts.len()) as u32;
                    let text = e.array.to_string_lossy();
                    let layout = record::encode_layout(id, &text, e.instance, e.meta);
                    buffers.push(Bytes::from(layout));
                    new_layouts.insert(key, id);
                    id
                }
            };
            let stamp = e.stamp();
            match e.data {
                Some(data) => {
                    buffers.extend(record::encode_chunk(layout, e.id, e.coords, stamp, data))
                }
                None => buffers.push(Bytes::from(record::encode_gone(
                    layout, e.id, e.coords, stamp,
                ))),
            }
        }
        let seq = self.append_current(&mut cur, &buffers, entries.len() as u64)?;
        cur.layouts.extend(new_layouts);
        let refs = entries
            .iter()
            .map(|e| RecordRef {
                segment: cur.path.clone(),
                id: e.id,
            })
            .collect();
        Ok((refs, seq))
    }

    /// Reserves `n` record ids and returns the first. Ids grow through the whole journal,
    /// bodies included, and replay applies records in id order. They are also the stamps
    /// of the durability rule (`core::shards::ledger`): an id taken, under the slot's lock,
    /// when a chunk's content is taken orders it after whatever it replaced.
    pub fn reserve_ids(&self, n: u64) -> u64 {
        // Not under `current`, which appends hold: stamps are taken under slot locks.
        self.next_id.fetch_add(n, Ordering::Relaxed)
    }

    /// Closes the current segment (durably: its records may not have been synced yet) and
    /// begins the next one.
    fn rotate(&self, cur: &mut Current) -> io::Result<()> {
        self.synced(cur.file.sync_data(), "a journal segment")?;
        let next = Self::new_segment(&self.backing, &self.id, cur.number + 1)?;
        let old = std::mem::replace(cur, next);
        lock(&self.segments).entry(old.path).or_insert(Segment {
            live: 0,
            bytes: old.bytes,
        });
        Ok(())
    }

    /// Fails once a sync has failed (`poisoned`).
    pub fn trusted(&self) -> io::Result<()> {
        match &*lock(&self.poisoned) {
            None => Ok(()),
            Some(first) => Err(io::Error::other(format!(
                "a sync failed earlier ({first}): nothing is taken for durable until the \
                 journal is replayed by a new mount"
            ))),
        }
    }

    /// Passes on the outcome of a sync of `what`, remembering a failure for good.
    pub fn synced(&self, result: io::Result<()>, what: &str) -> io::Result<()> {
        if let Err(e) = &result {
            let mut p = lock(&self.poisoned);
            if p.is_none() {
                warn!(
                    "sync of {what} failed: from now on every fsync fails until a new mount replays the journal: {e}"
                );
                *p = Some(format!("{what}: {e}"));
            }
        }
        result
    }

    /// Waits until append number `seq` is durable, syncing for everyone if nobody is.
    fn sync_to(&self, seq: u64) -> io::Result<()> {
        self.trusted()?;
        let mut sync = lock(&self.sync);
        loop {
            if sync.synced >= seq {
                return Ok(());
            }
            if !sync.syncing {
                break;
            }
            sync = self.synced_cv.wait(sync).unwrap_or_else(|e| e.into_inner());
        }
        sync.syncing = true;
        let target = sync.written;
        drop(sync);
        let file = lock(&self.current).file.try_clone();
        let result = self.synced(file.and_then(|f| f.sync_data()), "a journal segment");
        let mut sync = lock(&self.sync);
        sync.syncing = false;
        if result.is_ok() {
            sync.synced = sync.synced.max(target);
            self.group_commits.fetch_add(1, Ordering::Relaxed);
        }
        self.synced_cv.notify_all();
        result
    }

    /// The records' chunks are durable in their shards: they are no longer needed. For
    /// this journal's own records a retirement record is appended (made durable with the
    /// next sync, before any fsync returns), so that a replay never brings back content
    /// that a later write replaced. Segments go oldest first, once no record in them is
    /// live: a retirement never outlives the records it names.
    pub fn retire(&self, refs: &[RecordRef]) {
        if refs.is_empty() {
            return;
        }
        // Bodies' records get retirement records too: a body that stays (its shard was
        // written another way while some of its records are still live) must not bring
        // the retired ones back at replay (`own_ids`).
        let own = self.own_ids(refs);
        let own: Vec<u64> = {
            let mut recorded = lock(&self.recorded);
            own.into_iter().filter(|id| !recorded.remove(id)).collect()
        };
        // Retired in memory either way (their segments may go, which is safe); but until
        // the retirement is recorded, every sync fails (`record_retirements`).
        if let Err(e) = self.record_retirements(own) {
            warn!("journal retirement not recorded (fsync and flush fail until it is): {e}");
        }
        let (in_bodies, refs): (Vec<&RecordRef>, Vec<&RecordRef>) =
            refs.iter().partition(|r| body::is_body(&r.segment));
        if let Err(e) = self.retire_body_records(&in_bodies) {
            warn!("journal body not removed (it is tried again later): {e}");
        }
        {
            let mut segs = lock(&self.segments);
            for r in &refs {
                if let Some(seg) = segs.get_mut(&r.segment) {
                    seg.live = seg.live.saturating_sub(1);
                }
            }
        }
        self.retire_empty();
    }

    /// The ids of `refs` whose retirement this journal records: its own records, in
    /// segments or in bodies still in the journal. A body already gone (it became its shard,
    /// or was removed) needs none.
    fn own_ids(&self, refs: &[RecordRef]) -> Vec<u64> {
        let bodies = lock(&self.bodies);
        refs.iter()
            .filter(|r| journal_id(&r.segment).as_deref() == Some(self.id.as_str()))
            .filter(|r| !body::is_body(&r.segment) || bodies.contains_key(&r.segment))
            .map(|r| r.id)
            .collect()
    }

    /// Records the retirement of `refs` and syncs it, before returning: for a shard write
    /// that makes them obsolete, while it still holds the shard's key lock. Anyone who
    /// writes the shard next (tensorstore, which puts no stamps in shards, so replay could
    /// not tell its write from an older one) writes after the retirement is durable, and a
    /// power cut can never bring the records back over that write. The records stay live
    /// in memory until `retire`, which then records nothing more for them. Returns whether
    /// the retirement is durable.
    pub fn retire_durably(&self, refs: &[RecordRef]) -> bool {
        let ids = self.own_ids(refs);
        if ids.is_empty() {
            return true;
        }
        let done = self
            .record_retirements(ids.clone())
            .and_then(|()| self.sync_all());
        match done {
            Ok(()) => {
                lock(&self.recorded).extend(ids);
                true
            }
            Err(e) => {
                warn!(
                    "journal retirement not made durable before the shard's lock was let go: {e}"
                );
                false
            }
        }
    }

    /// Whether everything appended so far is synced (tests: a retirement must be durable
    /// before anyone may supersede what it retires).
    #[cfg(test)]
    pub fn all_synced(&self) -> bool {
        let sync = lock(&self.sync);
        sync.synced >= sync.written && lock(&self.unrecorded).is_empty()
    }

    /// Removes the segments that hold nothing live, oldest first.
    fn retire_empty(&self) {
        let current = lock(&self.current).path.clone();
        // A body with retired records holds its journal's segments back: they hold the
        // retirements.
        let held: std::collections::BTreeSet<String> = lock(&self.bodies)
            .iter()
            .filter(|(_, b)| b.retired_some)
            .filter_map(|(p, _)| journal_id(p))
            .collect();
        let gone = {
            let mut segs = lock(&self.segments);
            let gone = removable(&segs, &current, &held);
            for path in &gone {
                segs.remove(path);
            }
            gone
        };
        for path in gone {
            self.remove_segment(&path);
        }
    }

    /// Appends bytes to the current segment without waiting for a sync.
    fn append_raw(&self, bytes: Vec<u8>) -> io::Result<()> {
        let mut cur = lock(&self.current);
        self.append_current(&mut cur, &[Bytes::from(bytes)], 0)
            .map(|_| ())
    }

    /// Appends `buffers` to the current segment and books them: `live` more live records,
    /// one more append for the next sync to cover. Returns that append's number.
    fn append_current(&self, cur: &mut Current, buffers: &[Bytes], live: u64) -> io::Result<u64> {
        cur.bytes = append_at(&cur.file, buffers, cur.bytes)?;
        {
            let mut segs = lock(&self.segments);
            let seg = segs
                .entry(cur.path.clone())
                .or_insert(Segment { live: 0, bytes: 0 });
            seg.live += live;
            seg.bytes = cur.bytes;
        }
        let mut sync = lock(&self.sync);
        sync.written += 1;
        Ok(sync.written)
    }

    /// Appends a retirement record for `ids` and for those not recorded before.
    fn record_retirements(&self, ids: Vec<u64>) -> io::Result<()> {
        let mut unrecorded = lock(&self.unrecorded);
        unrecorded.extend(ids);
        if unrecorded.is_empty() {
            return Ok(());
        }
        self.append_raw(record::encode_retire(&unrecorded))?;
        unrecorded.clear();
        Ok(())
    }

    /// Makes everything appended so far durable (retirements included). Free when
    /// nothing is waiting. Fails while a retirement cannot be recorded.
    pub fn sync_all(&self) -> io::Result<()> {
        self.record_retirements(Vec::new())?;
        let seq = lock(&self.sync).written;
        self.sync_to(seq)
    }

    fn remove_segment(&self, path: &Path) {
        if let Err(e) = self.backing.remove_file(path) {
            warn!(segment = %path.display(), "journal segment not removed: {e}");
        }
        self.forget_dead_lock(path);
    }

    /// A dead mount's journal whose last file went (segment or body): its lock file goes
    /// too.
    fn forget_dead_lock(&self, path: &Path) {
        if let Some(id) = journal_id(path)
            && id != self.id
            && !self.has_segments_of(&id)
        {
            let _ = self
                .backing
                .remove_file(&Path::new(JOURNAL_DIR).join(format!("{id}.lock")));
        }
    }

    fn has_segments_of(&self, id: &str) -> bool {
        let of = |p: &PathBuf| journal_id(p).as_deref() == Some(id);
        lock(&self.segments).keys().any(of) || lock(&self.bodies).keys().any(of)
    }

    /// At a clean end: when no record is live, this journal's files go (which needs no
    /// space: a retirement that a full disk kept from being recorded is moot then). Fails
    /// when a file stays that a replay would read.
    pub fn close(&self) -> io::Result<()> {
        if lock(&self.segments).values().any(|s| s.live > 0)
            || lock(&self.bodies).values().any(|b| b.live > 0)
        {
            return Err(io::Error::other("journal records are still live"));
        }
        // Bodies begun for chunks that never got into them, and every segment.
        let mut files: Vec<PathBuf> = std::mem::take(&mut *lock(&self.bodies))
            .into_keys()
            .collect();
        files.extend(std::mem::take(&mut *lock(&self.segments)).into_keys());
        files.push(lock(&self.current).path.clone());
        for path in &files {
            self.backing.remove_file(path)?;
        }
        // Durably gone: after a power cut, records whose retirement a full disk kept from
        // being recorded must not come back.
        self.backing.sync_dir(Path::new(JOURNAL_DIR))?;
        lock(&self.unrecorded).clear();
        let _ = self
            .backing
            .remove_file(&Path::new(JOURNAL_DIR).join(format!("{}.lock", self.id)));
        Ok(())
    }

    /// Bytes held by segments with live records, and by bodies.
    pub fn bytes(&self) -> u64 {
        self.report().journal_bytes
    }

    pub fn report(&self) -> JournalReport {
        let (body_bytes, body_live) = {
            let bodies = lock(&self.bodies);
            (
                bodies.values().map(|b| b.bytes).sum::<u64>(),
                bodies.values().map(|b| b.live).sum::<u64>(),
            )
        };
        let segs = lock(&self.segments);
        JournalReport {
            journal_bytes: segs.values().map(|s| s.bytes).sum::<u64>() + body_bytes,
            live_records: segs.values().map(|s| s.live).sum::<u64>() + body_live,
            group_commits: self.group_commits.load(Ordering::Relaxed),
            journaled_chunks: self.journaled_chunks.load(Ordering::Relaxed),
            replayed_records: self.replayed_records.load(Ordering::Relaxed),
        }
    }

    /// Takes over the journals of mounts that are gone (their lock can be taken) and
    /// returns their chunks, in the order written. Their segments stay until every chunk
    /// is durable in its shard (retire), so a crash during replay loses nothing: the next
    /// mount replays them again, which writes the same shards.
    pub fn adopt_dead(&self) -> io::Result<Vec<Replayed>> {
        let dir = Path::new(JOURNAL_DIR);
        self.remove_unborn()?;
        let mut ids: Vec<String> = self
            .file_names()?
            .into_iter()
            .filter_map(|n| n.strip_suffix(".lock").map(str::to_string))
            .filter(|id| *id != self.id)
            .collect();
        ids.sort();
        let mut out = Vec::new();
        for id in ids {
            let lock_rel = dir.join(format!("{id}.lock"));
            let file = match self.backing.open_file(&lock_rel, rw()) {
                Ok(f) => f,
                Err(e) if is_absent(&e) => continue,
                // Not a file a mount made (a FIFO, a directory, a link): not a journal.
                Err(e) => {
                    self.refuse(
                        &id,
                        trust::refused(&self.backing.path(&lock_rel), &e.to_string()),
                    );
                    continue;
                }
            };
            if let Some(why) = trust::untrusted(&file.metadata()?) {
                self.refuse(&id, trust::refused(&self.backing.path(&lock_rel), &why));
                continue;
            }
            // Alive elsewhere: not ours to take. The lock is kept (leaked) while we hold
            // its records, so that no third mount takes them too.
            if !crate::backing::lock::try_lock(&file)? {
                continue;
            }
            let before = out.len();
            // A journal that cannot be read whole is not replayed in part: it stays for a
            // later look (a live mount looks every second), and the others go on.
            if let Err(e) = self.read_journal(&id, &mut out) {
                out.truncate(before);
                self.refuse(&id, e);
                continue;
            }
            info!(journal = %id, records = out.len() - before, "journal of a mount that is gone taken over");
            if !self.has_segments_of(&id) {
                let _ = self.backing.remove_file(&lock_rel);
            }
            std::mem::forget(file);
        }
        self.replayed_records
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.retire_empty();
        // Bodies with nothing live in them (begun, never appended to) go now.
        self.retire_body_records(&[])?;
        Ok(out)
    }

    /// A journal not to be believed (`trust`): never replayed, left where it is, and said
    /// once (adoption looks again every second).
    fn refuse(&self, id: &str, why: io::Error) {
        let mut refused = lock(&self.refused);
        if refused.len() > REFUSALS_NAMED {
            return;
        }
        if refused.len() == REFUSALS_NAMED {
            refused.insert(String::new());
            error!("more journals not replayed: not named any more");
        } else if refused.insert(id.to_string()) {
            error!(journal = %id, "journal not replayed, left in place: {why}");
        }
    }

    /// Whether a live mount should look for dead mounts' journals now (once a second).
    pub fn adoption_due(&self) -> bool {
        let mut last = lock(&self.last_adoption);
        let now = std::time::Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < ADOPTION_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Removes the fresh lock files (`<id>.lock.new`) of mounts that died before their
    /// journal got its name: such a journal never held a record (its segments come after).
    fn remove_unborn(&self) -> io::Result<()> {
        let dir = Path::new(JOURNAL_DIR);
        for name in self.file_names()? {
            if !name.ends_with(".lock.new") {
                continue;
            }
            let rel = dir.join(&name);
            let file = match self.backing.open_file(&rel, rw()) {
                Ok(f) => f,
                // Not a file a mount made: left alone.
                Err(_) => continue,
            };
            // A mount starting up right now holds it locked, or is about to: only one left
            // for a while (a mount names its journal within milliseconds) and unlocked goes.
            let age = file
                .metadata()?
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            if age > UNBORN_AFTER && crate::backing::lock::try_lock(&file)? {
                let _ = self.backing.remove_file(&rel);
            }
        }
        Ok(())
    }

    /// The names in the journal directory (journals' files are all UTF-8 named).
    fn file_names(&self) -> io::Result<Vec<String>> {
        Ok(self
            .backing
            .list(Path::new(JOURNAL_DIR))?
            .into_iter()
            .filter_map(|e| e.name.into_string().ok())
            .collect())
    }

    fn read_journal(&self, id: &str, out: &mut Vec<Replayed>) -> io::Result<()> {
        let first = out.len();
        self.read_files(id, out)?;
        // Segments and bodies interleave in time: ids tell the order written.
        out[first..].sort_by_key(|r| r.record.id);
        Ok(())
    }

    fn read_files(&self, id: &str, out: &mut Vec<Replayed>) -> io::Result<()> {
        let dir = Path::new(JOURNAL_DIR);
        let mut names: Vec<String> = self
            .file_names()?
            .into_iter()
            .filter(|n| n.starts_with(&format!("{id}.")))
            .filter(|n| n.ends_with(".seg") || n.ends_with(".body"))
            .collect();
        names.sort();
        let mut files = Vec::new();
        let mut retired = std::collections::BTreeSet::new();
        for name in names {
            let path = dir.join(&name);
            // Its size is untrusted (anyone who can write BACKING can plant a sparse 1 TiB
            // file): nothing larger than this mount could have written is read.
            let limit = match body::is_body(&path) {
                true => MAX_BODY_BYTES,
                false => SEGMENT_BYTES + crate::limits::MAX_FILE_BYTES + (1 << 20),
            };
            let bytes = match trust::read_trusted(&self.backing, &path, limit) {
                Ok(b) => Bytes::from(b),
                Err(e) if is_absent(&e) => Bytes::new(),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("journal file {} refused: {e}", path.display()),
                    ));
                }
            };
            let decoded = record::decode_file(&bytes);
            for r in &decoded.records {
                if let record::Record::Retire { ids } = r {
                    retired.extend(ids.iter().copied());
                }
            }
            say_damage(&path, &decoded, bytes.len());
            files.push((path, decoded.intact_end as u64, decoded.records));
        }
        for (path, bytes, records) in files {
            let (live, retired_some) = replayed_from(&path, records, &retired, out);
            if body::is_body(&path) {
                let entry = body::BodyEntry {
                    live,
                    bytes,
                    finished: true,
                    retired_some,
                };
                lock(&self.bodies).insert(path, entry);
            } else {
                // Kept in order even with nothing live: its retirements may name records
                // of an earlier segment. Segments go oldest first (see `retire`).
                lock(&self.segments).insert(path, Segment { live, bytes });
            }
        }
        Ok(())
    }
}

/// Says what of a journal file could not be read: a torn tail (a crash tears only the last
/// write, whose fsync never returned: nothing acknowledged is in it), and damage in the
/// middle (the media, or someone writing into the file), past which intact records are
/// replayed. A damaged record is lost: a chunk or removal there is not replayed; a damaged
/// retirement may let the records it retired, all of them earlier, replay over later
/// content (the replay rule still refuses where the chunk changed since they were taken).
fn say_damage(path: &Path, decoded: &record::Decoded, len: usize) {
    for d in &decoded.damaged {
        error!(file = %path.display(), from = d.start, to = d.end,
            record = d.kind,
            "journal damaged in the middle: these bytes hold no intact record and are not \
             replayed; the intact records after them are");
    }
    if decoded.intact_end < len {
        warn!(file = %path.display(), dropped = len - decoded.intact_end,
            "torn end of a journal file dropped (its fsync never returned)");
    }
}

/// A record's change of a chunk: its layout, id, coordinates, what it replaced and when,
/// and the new content (`None`: removed).
type ChunkChange = (u32, u64, Vec<u64>, (record::Was, u64), Option<Bytes>);

/// The change of a chunk a record makes; `None` for records of other kinds (each named, so
/// that a new kind must be decided on here).
fn chunk_change(r: record::Record) -> Option<ChunkChange> {
    match r {
        record::Record::Chunk {
            layout,
            id,
            coords,
            was,
            at,
            data,
        } => Some((layout, id, coords, (was, at), Some(data))),
        record::Record::Gone {
            layout,
            id,
            coords,
            was,
            at,
        } => Some((layout, id, coords, (was, at), None)),
        record::Record::Layout { .. } | record::Record::Retire { .. } => None,
    }
}

/// Puts the chunk records of the file at `path` that are not `retired` into `out`, with
/// the layouts they name. Returns how many, and whether some were retired.
fn replayed_from(
    path: &Path,
    records: Vec<record::Record>,
    retired: &std::collections::BTreeSet<u64>,
    out: &mut Vec<Replayed>,
) -> (u64, bool) {
    type Named = (PathBuf, Option<String>, Vec<u8>);
    let mut layouts: BTreeMap<u32, Named> = BTreeMap::new();
    let (mut live, mut retired_some) = (0, false);
    for r in records {
        let (layout, id, coords, (was, at), data) = match r {
            record::Record::Layout {
                id,
                array,
                instance,
                meta,
            } => {
                layouts.insert(id, (PathBuf::from(array), instance, meta));
                continue;
            }
            r => match chunk_change(r) {
                Some(change) => change,
                None => continue,
            },
        };
        let Some((array, instance, meta)) = layouts.get(&layout) else {
            continue;
        };
        // Retired: durable in its shard, and maybe replaced since.
        if retired.contains(&id) {
            retired_some = true;
            continue;
        }
        live += 1;
        out.push(Replayed {
            array: array.clone(),
            instance: instance.clone(),
            meta: meta.clone(),
            coords,
            was,
            at,
            data,
            record: RecordRef {
                segment: path.to_path_buf(),
                id,
            },
        });
    }
    (live, retired_some)
}

/// The segments that can go: per journal, from the oldest, those with no live record (the
/// current one stays).
fn removable(
    segs: &BTreeMap<PathBuf, Segment>,
    current: &Path,
    held: &std::collections::BTreeSet<String>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut blocked = held.clone();
    for (path, seg) in segs {
        let id = journal_id(path).unwrap_or_default();
        if blocked.contains(&id) {
            continue;
        }
        if seg.live == 0 && path != current {
            out.push(path.clone());
        } else {
            blocked.insert(id);
        }
    }
    out
}

/// The journal id a segment path belongs to.
fn journal_id(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    Some(name.split('.').next()?.to_string())
}

fn create(mode: u32) -> OpenMode {
    OpenMode {
        read: true,
        write: true,
        create_new: Some(mode),
        ..OpenMode::default()
    }
}

fn rw() -> OpenMode {
    OpenMode {
        read: true,
        write: true,
        ..OpenMode::default()
    }
}

/// A fresh id: this machine's name, the process and the time, so that two mounts (here or
/// elsewhere) never share one.
fn new_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{host}-{}-{nanos:x}", std::process::id())
}

/// Writes `buffers` at `start`, looping over short writes, and returns the new end. A
/// failed append is cut back to `start`, so that nothing follows a torn record (the space
/// may come back).
fn append_at(file: &File, buffers: &[Bytes], start: u64) -> io::Result<u64> {
    let mut at = start;
    for b in buffers {
        if let Err(e) = file.write_all_at(b, at) {
            let _ = file.set_len(start);
            return Err(e);
        }
        at += b.len() as u64;
    }
    Ok(at)
}

#[cfg(test)]
mod tests;

//! Writing a shard: its pending chunks and the chunks of the shard file that stay, as one
//! new file, under the key lock (`crate::backing::lock`), so that other mounts and
//! tensorstore writers sharing BACKING never lose a chunk to a concurrent merge.

use crate::core::refusal::Rule;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tracing::{debug, error, info, warn};

use super::body::InBody;
use super::stored::{OpenShard, StoredIndex, open_shard};
use super::whereabouts::Whereabouts;
use super::{Failure, ShardRegistry, ShardSlot};
use crate::backing::Backing;
use crate::backing::lock::Within;
use crate::core::array::ArrayState;
use crate::core::errno::ToErrno;
use crate::core::error::FsError;
use crate::core::pending::memfile::MemFile;
use crate::core::stats::Stats;
use crate::journal::Journal;
use crate::journal::RecordRef;
use crate::journal::body::Finishing;
use crate::shard::{ChunkRange, IndexFormat, IndexLocation, ShardBuilder, ShardIndex};
use crate::store::{ObjectInfo, OnDurable, Precondition, StoreError};
use crate::sync::lock;

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

/// A pending chunk as taken for one write: its position, the file, the version of its
/// content taken, and that content.
type Chosen = (usize, Arc<MemFile>, u64, Vec<Bytes>);

/// What a shard write takes from its slot, under the slot's lock.
struct Taken {
    /// When it was taken (`ledger`): the records before it are obsolete once it is durable.
    stamp: u64,
    chosen: Vec<Chosen>,
    deleted: BTreeSet<usize>,
    /// When each chosen content and each removal came (`shard::stamps`).
    times: BTreeMap<usize, u64>,
    /// Positions done when taken: a complete write ends their round.
    done: BTreeSet<usize>,
    cached: Option<StoredIndex>,
    /// The journal records the write makes obsolete (`Ledger::before`): their retirement
    /// is made durable before the shard's key is let go (`OnDurable`).
    obsolete: Vec<RecordRef>,
}

/// What goes into the new file (every pending chunk with `take_all`, else the settled
/// ones), taken under the slot's lock; the I/O happens outside it. `None`: nothing to do.
fn choose(reg: &ShardRegistry, slot: &ShardSlot, take_all: bool) -> Option<Taken> {
    let st = lock(&slot.state);
    let chosen: Vec<Chosen> = st
        .pending
        .iter()
        .filter(|(_, m)| take_all || m.settled())
        .map(|(pos, m)| {
            let (version, segments) = m.content();
            (*pos, m.clone(), version, segments)
        })
        .collect();
    if chosen.is_empty() && st.deleted.is_empty() {
        return None;
    }
    let times = chosen
        .iter()
        .map(|(pos, m, ..)| (*pos, m.with(|s| s.changed)))
        .chain(
            st.deleted
                .iter()
                .map(|p| (*p, st.removed_at.get(p).copied().unwrap_or(0))),
        )
        .collect();
    let stamp = reg.stamp();
    let positions = chosen.iter().map(|c| c.0).chain(st.deleted.iter().copied());
    Some(Taken {
        stamp,
        obsolete: st.ledger.before(positions.collect::<BTreeSet<_>>(), stamp),
        times,
        chosen,
        deleted: st.deleted.clone(),
        done: st.done.clone(),
        cached: st.stored.clone(),
    })
}

/// The chosen chunks as `array` stores them (`codec`): compressed when the mount
/// compresses it. A body holds its chunks compressed already (`body::take`).
fn stored_form<'a>(
    array: &ArrayState,
    chosen: &'a [Chosen],
) -> Result<std::borrow::Cow<'a, [Chosen]>, FsError> {
    if array.zstd.is_none() {
        return Ok(std::borrow::Cow::Borrowed(chosen));
    }
    let contents: Vec<&[Bytes]> = chosen.iter().map(|c| c.3.as_slice()).collect();
    let encoded = super::codec::encode(array.zstd, &contents)?;
    let chosen = chosen
        .iter()
        .zip(encoded)
        .map(|((pos, m, version, _), e)| (*pos, m.clone(), *version, e))
        .collect();
    Ok(std::borrow::Cow::Owned(chosen))
}

/// What one shard write found and did.
struct Written {
    stored: Option<StoredIndex>,
    /// Made from the shard's body (which is consumed).
    from_body: bool,
    /// Durable already, directories included.
    durable: bool,
}

impl ShardRegistry {
    /// Writes the slot's shard: its pending chunks (per `mode`) and the chunks of the
    /// existing shard file that stay, as one new file; or removes the file when nothing is
    /// left. On failure, a panic included, the pending chunks stay pending and the failure
    /// is recorded.
    pub(super) fn write_slot(
        &self,
        backing: &Backing,
        slot: &ShardSlot,
        mode: WriteMode,
    ) -> Result<(), FsError> {
        let _writer = lock(&slot.writing);
        self.wait_for_bookings(slot)?;
        let journal = self.journal().cloned();
        // The shard's body is taken first (no more appends), before the chunks are chosen:
        // whatever an fsync put into it is then pending at the version chosen or later.
        let body = lock(&slot.state).body.clone();
        let finishing = match (&body, &journal) {
            (Some(b), Some(j)) => Some(j.finish_body(b)),
            _ => None,
        };
        let in_body = match finishing {
            Some(_) => {
                let mut st = lock(&slot.state);
                st.body = None;
                std::mem::take(&mut st.in_body)
            }
            None => Default::default(),
        };
        // A body is consumed whole: a write that uses it takes every pending chunk, open or
        // not, since any of them may have fsynced content in it.
        let take_all =
            matches!(mode, WriteMode::Everything | WriteMode::Replace) || finishing.is_some();
        let Some(taken) = choose(self, slot, take_all) else {
            if let (Some(j), Some(f)) = (&journal, &finishing) {
                j.body_abandoned(f);
            }
            return Ok(());
        };
        let (array, result) =
            self.write_where(backing, slot, &taken, mode, journal, finishing, &in_body);
        self.after_write(slot, &array, &taken, mode, result)
    }

    /// Writes what was taken where the slot's array is now (`whereabouts`): at its path,
    /// where it moved to, or nowhere (removed: the chunks go with it; unreachable: they
    /// stay pending).
    #[allow(clippy::too_many_arguments)]
    fn write_where(
        &self,
        backing: &Backing,
        slot: &ShardSlot,
        taken: &Taken,
        mode: WriteMode,
        journal: Option<Arc<Journal>>,
        finishing: Option<Finishing>,
        in_body: &BTreeMap<usize, InBody>,
    ) -> (Arc<ArrayState>, Result<Written, FsError>) {
        match self.whereabouts(backing, &slot.array) {
            Whereabouts::At(array) => {
                let result = self.write_at(
                    backing, slot, &array, taken, mode, journal, finishing, in_body,
                );
                (array, result)
            }
            Whereabouts::Lost(why) => {
                abandon_body(journal.as_deref(), finishing.as_ref());
                let lost = Err(FsError::Io(std::io::Error::other(why)));
                (slot.array.clone(), lost)
            }
            // Nothing to write: what was taken leaves as if written, and its records retire
            // (a replay would drop them, their array being gone).
            Whereabouts::Gone => {
                abandon_body(journal.as_deref(), finishing.as_ref());
                let gone = Written {
                    stored: None,
                    from_body: false,
                    durable: true,
                };
                (slot.array.clone(), Ok(gone))
            }
        }
    }

    /// Writes what was taken into the shard of `array` (the slot's, or where it moved),
    /// its chunks as that array stores them.
    #[allow(clippy::too_many_arguments)]
    fn write_at(
        &self,
        backing: &Backing,
        slot: &ShardSlot,
        array: &Arc<ArrayState>,
        taken: &Taken,
        mode: WriteMode,
        journal: Option<Arc<Journal>>,
        finishing: Option<Finishing>,
        in_body: &BTreeMap<usize, InBody>,
    ) -> Result<Written, FsError> {
        let chosen = match stored_form(array, &taken.chosen) {
            Ok(chosen) => chosen,
            Err(e) => {
                abandon_body(journal.as_deref(), finishing.as_ref());
                return Err(e);
            }
        };
        let moved = !Arc::ptr_eq(array, &slot.array);
        let job = ShardJob {
            backing,
            moved,
            within: Within {
                rel: &array.rel,
                dir: array.dir_id,
                instance: &array.instance,
            },
            rel: &array.shard_rel(&slot.shard),
            format: &array.layout.index,
            chosen: &chosen,
            deleted: &taken.deleted,
            times: &taken.times,
            cached: taken.cached.as_ref().filter(|_| !moved),
            mode,
            obsolete: &taken.obsolete,
        };
        let result = self.run_job(&job, journal.as_deref(), finishing, in_body);
        // The slot's cached index is of the shard at its own path.
        result.map(|w| Written {
            stored: w.stored.filter(|_| !moved),
            ..w
        })
    }

    /// Runs `job`, from the shard's body if it has one (`finishing`), and settles the body.
    fn run_job(
        &self,
        job: &ShardJob,
        journal: Option<&Journal>,
        mut finishing: Option<Finishing>,
        in_body: &BTreeMap<usize, InBody>,
    ) -> Result<Written, FsError> {
        let result = self.contained(job.backing, job.rel, || match finishing.as_mut() {
            Some(f) => match job.run_body(self, f, in_body)? {
                Some(written) => Ok(written),
                None => job.run(self),
            },
            None => job.run(self),
        });
        if let (Some(j), Some(f)) = (journal, &finishing) {
            match &result {
                // Out of the books only once durable: until the journal's directory is
                // synced, the body may come back after a crash, and its records still need
                // their retirements.
                Ok(w) if w.from_body && w.durable => j.body_consumed(f),
                _ => j.body_abandoned(f),
            }
        }
        result
    }

    /// Runs a shard write; a panic in it becomes an error (the chunks stay pending).
    fn contained(
        &self,
        backing: &Backing,
        rel: &Path,
        write: impl FnOnce() -> Result<Written, FsError>,
    ) -> Result<Written, FsError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(write)).unwrap_or_else(|panic| {
            Stats::add(&self.stats.panics, 1);
            error!(shard = %backing.path(rel).display(),
                "internal error while writing the shard; its chunks stay pending: {}",
                panic_text(&panic));
            Err(FsError::Io(std::io::Error::other("internal error")))
        })
    }

    /// Books a shard write's outcome: what it wrote leaves the pending set (its records to
    /// retire once durable), or the failure is recorded for the writers to hear of.
    fn after_write(
        &self,
        slot: &ShardSlot,
        array: &ArrayState,
        taken: &Taken,
        mode: WriteMode,
        result: Result<Written, FsError>,
    ) -> Result<(), FsError> {
        match result {
            Ok(written) => {
                let now = written.durable;
                let records = self.settle_written(slot, taken, mode, written);
                // The records of what it holds retire once the shard is durable: a shard
                // made from its body usually is already.
                if now {
                    self.retire(records);
                } else {
                    self.note_unsynced(array, &slot.shard, records);
                }
                // The new index counts against the cache (checked with no slot locked).
                self.evict_if_over();
                Ok(())
            }
            Err(e) => {
                Stats::add(&self.stats.write_errors, 1);
                let rel = array.shard_rel(&slot.shard);
                match &e {
                    FsError::Refused(r) => self.refusals.note(r),
                    _ => warn!(shard = %self.describe(&rel),
                        "shard write failed, data kept in memory: {e}"),
                }
                lock(&slot.state).failure = Some(Failure {
                    errno: e.to_errno(),
                    message: e.to_string(),
                    at: Instant::now(),
                });
                Err(e)
            }
        }
    }

    /// After a shard write: the chunks written (unless changed since) leave the pending
    /// set, and the cached index is the new one. Returns the journal records that the
    /// shard's durability retires.
    fn settle_written(
        &self,
        slot: &ShardSlot,
        taken: &Taken,
        mode: WriteMode,
        written: Written,
    ) -> Vec<RecordRef> {
        let mut st = lock(&slot.state);
        let mut durable = Vec::new();
        for (pos, m, version, _) in &taken.chosen {
            // Retired under the file's own lock only if unchanged since the snapshot; a
            // writer that comes later finds it retired and starts again from the shard just
            // written.
            let current = st.pending.get(pos).is_some_and(|cur| Arc::ptr_eq(cur, m));
            if current && m.retire_at(*version) {
                st.pending.remove(pos);
                self.charge(-(m.len() as i64));
            }
        }
        for pos in &taken.deleted {
            st.deleted.remove(pos);
            st.removed_at.remove(pos);
        }
        let covered = taken
            .chosen
            .iter()
            .map(|c| c.0)
            .chain(taken.deleted.iter().copied());
        for pos in covered.collect::<BTreeSet<usize>>() {
            let settled = !st.pending.contains_key(&pos) && !st.deleted.contains(&pos);
            durable.extend(st.ledger.covered(pos, taken.stamp, settled));
        }
        self.set_stored(&mut st, written.stored);
        if mode == WriteMode::Complete {
            // The round is over for what was done when it was taken; positions done while
            // the write was in flight belong to the next round.
            st.done.retain(|p| !taken.done.contains(p));
        }
        st.failure = None;
        durable
    }
}

/// One shard write: what to write, and against what.
#[derive(Clone, Copy)]
struct ShardJob<'a> {
    backing: &'a Backing,
    /// The array's directory is not where the chunks were written (another mount moved
    /// it): a position the shard there got later (its stamp) keeps what it has.
    moved: bool,
    /// The array's directory, which the write never makes, and the directory the shard
    /// must land in (`Store::put_within`).
    within: Within<'a>,
    rel: &'a Path,
    format: &'a IndexFormat,
    chosen: &'a [Chosen],
    deleted: &'a BTreeSet<usize>,
    times: &'a BTreeMap<usize, u64>,
    cached: Option<&'a StoredIndex>,
    mode: WriteMode,
    obsolete: &'a [RecordRef],
}

/// A shard job with its own lists (`ShardJob::without_later`).
struct OwnedJob<'a> {
    job: ShardJob<'a>,
    chosen: Vec<Chosen>,
    deleted: BTreeSet<usize>,
    times: BTreeMap<usize, u64>,
}

impl OwnedJob<'_> {
    fn build_and_put(
        &self,
        reg: &ShardRegistry,
        current: Option<OpenShard>,
    ) -> Result<Written, FsError> {
        let job = ShardJob {
            chosen: &self.chosen,
            deleted: &self.deleted,
            times: &self.times,
            ..self.job
        };
        job.build_and_put(reg, current)
    }
}

impl ShardJob<'_> {
    /// Reads the shard as it is now, builds the new one from the chunks that stay and the
    /// chosen ones, and puts it in place (or removes it) on the condition that it is still
    /// the version read; another writer's version in between means reading and merging
    /// again. In a directory the condition is checked under the key lock that every
    /// writer of the lock protocol takes; an object store checks it itself.
    fn run(&self, reg: &ShardRegistry) -> Result<Written, FsError> {
        let mut conflicts = 0;
        loop {
            match self
                .attempt(reg)
                .map_err(|e| stale_is_conflict(e, reg, self.rel))
            {
                Err(FsError::Conflict(what)) if conflicts < MAX_CONFLICTS => {
                    conflicts += 1;
                    Stats::add(&reg.stats.write_conflicts, 1);
                    debug!(shard = %what, conflicts, "shard changed meanwhile: merging again");
                }
                other => return other,
            }
        }
    }

    fn attempt(&self, reg: &ShardRegistry) -> Result<Written, FsError> {
        #[cfg(test)]
        if PANIC_IN_SHARD_WRITE.get() {
            panic!("injected panic half-way through a shard write");
        }
        let store = &*reg.store;
        let current = match self.mode {
            WriteMode::Replace => None,
            _ => open_shard(store, self.rel, self.format, self.cached)?,
        };
        // Between nodes of an object store (and into a moved array) nothing orders two
        // writers of one chunk but when they wrote it: a position the shard got later than
        // what is taken here keeps what it has. (A write whose answer was lost, merged
        // again once another node wrote over it, so never undoes that node's chunk.)
        let ordered_by_time = self.moved || !reg.store_is_backing;
        let later = match (&current, ordered_by_time) {
            (Some(open), true) => reg.stamps_of(open),
            _ => None,
        };
        match later {
            Some(stamps) => self.without_later(&stamps).build_and_put(reg, current),
            None => self.build_and_put(reg, current),
        }
    }

    /// The chunks (and removals) taken, less those whose position the shard got later
    /// (another writer, since the move of the array or on another node).
    fn without_later(&self, stamps: &[u64]) -> OwnedJob<'_> {
        let later = |p: &usize| {
            let ours = self.times.get(p).copied().unwrap_or(u64::MAX);
            stamps.get(*p).is_some_and(|&theirs| theirs > ours)
        };
        let superseded: Vec<usize> = self
            .chosen
            .iter()
            .map(|c| c.0)
            .chain(self.deleted.iter().copied())
            .filter(|p| later(p))
            .collect();
        if !superseded.is_empty() {
            info!(shard = %self.rel.display(), ?superseded,
                "not written over: the shard holds a later write of these positions (another \
                 writer's, by the times written with each)");
        }
        OwnedJob {
            job: *self,
            chosen: self
                .chosen
                .iter()
                .filter(|c| !later(&c.0))
                .cloned()
                .collect(),
            deleted: self.deleted.iter().filter(|p| !later(p)).copied().collect(),
            times: self
                .times
                .iter()
                .filter(|(p, _)| !later(p))
                .map(|(p, t)| (*p, *t))
                .collect(),
        }
    }

    /// Builds the new shard from the current one (`current`) and what is taken, and puts
    /// it in place on the condition that the current one is still there.
    fn build_and_put(
        &self,
        reg: &ShardRegistry,
        current: Option<OpenShard>,
    ) -> Result<Written, FsError> {
        let store = &*reg.store;
        let mut builder = ShardBuilder::new(self.format.clone());
        if let Some(open) = &current {
            self.keep_stored(reg, &mut builder, &*open.file, &open.stored)?;
            if let Some(old) = reg.stamps_of(open) {
                builder.stamps_from(&old);
            }
        }
        for (pos, _, _, segments) in self.chosen {
            builder.set(*pos, segments.clone());
        }
        for (pos, ns) in self.times {
            builder.stamp(*pos, *ns);
        }
        if reg.store_is_backing && builder.holds_no_chunk() && others_journal(self.backing) {
            builder.keep_when_empty();
        }
        let when = match (&current, self.mode) {
            (_, WriteMode::Replace) => Precondition::None,
            (Some(open), _) => Precondition::Matches(open.stored.version.to_string()),
            (None, _) => Precondition::Absent,
        };
        // A write that makes journal records obsolete is made durable at once, and their
        // retirement too, before anyone else may write the shard (`OnDurable`).
        let mut retire = || {
            reg.retire_durably(self.obsolete);
        };
        let on_durable: OnDurable = match reg.journal() {
            Some(_) if !self.obsolete.is_empty() => Some(&mut retire),
            _ => None,
        };
        // An object store's answer is durable; a directory wants a sync.
        let durable = on_durable.is_some() || !reg.store_is_backing;
        let Some(encoded) = builder.build() else {
            if store
                .delete_within(self.within, self.rel, when, on_durable)
                .map_err(store_err)?
            {
                Stats::add(&reg.stats.shards_deleted, 1);
                debug!(shard = %self.rel.display(), "shard removed: no chunk left");
            }
            return Ok(Written {
                stored: None,
                from_body: false,
                durable,
            });
        };
        // A sync costs only what was asked for: in a directory, a shard that replaces one
        // is synced before its rename (the old data must never be lost to a torn file); a
        // new one is not. Either is made durable later, when a writer's fsync, the
        // background pass or the unmount asks (`ShardRegistry::make_durable`).
        let info = store
            .put_within(self.within, self.rel, encoded.buffers(), when, on_durable)
            .map_err(store_err)?;
        debug!(shard = %self.rel.display(), bytes = encoded.len(), mode = ?self.mode, "shard written");
        let mut written = self.written(reg, encoded.len(), info, encoded.index().clone());
        written.durable = durable;
        if let (Some(open), Some(new)) = (&current, written.stored.as_mut()) {
            new.kept = StoredIndex::lineage_after(&open.stored, &self.kept_from(&open.stored));
        }
        Ok(written)
    }

    /// The positions of `old` whose chunks this write keeps as they are (`keep_stored`).
    fn kept_from(&self, old: &StoredIndex) -> BTreeSet<usize> {
        let Ok(index) = &old.index else {
            return BTreeSet::new();
        };
        let replaced: BTreeSet<usize> = self.chosen.iter().map(|c| c.0).collect();
        index
            .present()
            .map(|(p, _)| p)
            .filter(|p| !replaced.contains(p) && !self.deleted.contains(p))
            .collect()
    }

    /// Counts a shard written (`bytes` of it by this write) and describes the new version.
    fn written(
        &self,
        reg: &ShardRegistry,
        bytes: u64,
        info: ObjectInfo,
        index: ShardIndex,
    ) -> Written {
        Stats::add(&reg.stats.shards_written, 1);
        Stats::add(&reg.stats.bytes_written, bytes);
        if self.mode != WriteMode::Complete {
            Stats::add(&reg.stats.partial_writes, 1);
        }
        Written {
            stored: Some(StoredIndex {
                format: self.format.clone(),
                version: info.tag.into(),
                mtime: info.mtime,
                index: Ok(Arc::new(index)),
                stamps: Arc::default(),
                kept: Arc::default(),
            }),
            from_body: false,
            // A PUT is durable once answered; a file wants a sync (`make_durable`).
            durable: !reg.store_is_backing,
        }
    }

    /// The shard made from its body: the chunks the body holds at the version chosen are
    /// named where they are, the others appended, then the index; synced, and renamed onto
    /// the key, under the key lock. `Ok(None)`: not possible (a shard file exists by now,
    /// or nothing is left to write), so the shard is written the usual way.
    fn run_body(
        &self,
        reg: &ShardRegistry,
        body: &mut Finishing,
        in_body: &BTreeMap<usize, InBody>,
    ) -> Result<Option<Written>, FsError> {
        // A body becomes the shard by a rename: only where the shard is a file beside it.
        if self.format.location != IndexLocation::End
            || self.chosen.is_empty()
            || !reg.store_is_backing
        {
            return Ok(None);
        }
        let key = self.backing.lock_key_within(self.rel, self.within)?;
        if key.current()?.is_some() {
            return Ok(None);
        }
        let start = body.len();
        let (tail, index) = self.body_tail(start, in_body);
        body.append(&tail)?;
        // Made where the journal is (the daemon's), it becomes a shard: its directory's
        // owner's, as every shard the mount writes (`backing::owner`). Given once it has
        // left the journal, where a body of another user's is never replayed.
        let owner = self
            .backing
            .stat(key.dir_rel())?
            .map(|dir| crate::backing::FileOwner::for_file_in(&dir));
        // The index must never name bytes that a crash could lose; and a failed sync of the
        // body is never retried into a success (`Journal::synced`).
        match reg.journal() {
            Some(j) => j.synced(body.sync(), "a journal body")?,
            None => body.sync()?,
        }
        match key.take_from(self.backing, body.path()) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Ok(None),
            r => r?,
        }
        if let Some(owner) = owner
            && let Err(e) = body.give(owner)
        {
            warn!(shard = %self.rel.display(), "shard written, left the daemon's: {e}");
        }
        let durable = self.body_moved_durably(key.dir_rel());
        // Records of the shard's positions outside the body retire durably under the key
        // lock, as every write's do (`OnDurable`).
        if durable {
            reg.retire_durably(self.obsolete);
        }
        let info = body.info()?;
        Stats::add(&reg.stats.shards_from_bodies, 1);
        debug!(shard = %self.rel.display(), bytes = body.len(), mode = ?self.mode, "shard written from its body");
        Ok(Some(Written {
            from_body: true,
            durable,
            ..self.written(reg, body.len() - start, info, index)
        }))
    }

    /// Syncs both directories of a body that became the shard in `dir`. The shard is in
    /// place, and the body (with every record in it) gone from the journal: from here on
    /// a failure only means that this is not durable yet.
    fn body_moved_durably(&self, dir: &Path) -> bool {
        self.backing
            .sync_dir_chain(dir)
            .and_then(|_| {
                self.backing
                    .sync_dir(Path::new(crate::journal::JOURNAL_DIR))
            })
            .inspect_err(
                |e| warn!(shard = %self.rel.display(), "shard written, not yet durable: {e}"),
            )
            .is_ok()
    }

    /// What completes a body that is `start` bytes long: the chosen chunks it does not hold
    /// at their chosen version, and the index.
    fn body_tail(&self, start: u64, in_body: &BTreeMap<usize, InBody>) -> (Vec<Bytes>, ShardIndex) {
        let mut index = ShardIndex::all_missing(self.format.n_chunks());
        let mut tail = Vec::new();
        let mut at = start;
        for (pos, m, version, segments) in self.chosen {
            match in_body.get(pos) {
                Some(b) if Arc::ptr_eq(&b.file, m) && b.version == *version => {
                    index.set(*pos, Some(b.range));
                }
                _ => {
                    let nbytes: u64 = segments.iter().map(|s| s.len() as u64).sum();
                    index.set(*pos, Some(ChunkRange { offset: at, nbytes }));
                    at += nbytes;
                    tail.extend(segments.iter().filter(|s| !s.is_empty()).cloned());
                }
            }
        }
        let mut stamps = vec![0; self.format.n_chunks()];
        for (pos, ns) in self.times {
            if let Some(s) = stamps.get_mut(*pos) {
                *s = *ns;
            }
        }
        tail.push(Bytes::from(crate::shard::stamps::encode(&stamps)));
        tail.push(Bytes::from(self.format.encode(&index)));
        (tail, index)
    }

    /// Puts the chunks of the current shard file that stay into `builder` (a merge). A
    /// damaged file can only be replaced when nothing of it is kept.
    fn keep_stored(
        &self,
        reg: &ShardRegistry,
        builder: &mut ShardBuilder,
        file: &dyn crate::store::Blob,
        stored: &StoredIndex,
    ) -> Result<(), FsError> {
        let replaced: BTreeSet<usize> = self.chosen.iter().map(|(p, ..)| *p).collect();
        let gone = |p: &usize| replaced.contains(p) || self.deleted.contains(p);
        let index = match &stored.index {
            Ok(index) => index,
            Err(e) => {
                if (0..self.format.n_chunks()).any(|p| !gone(&p)) {
                    return Err(FsError::refused(
                        Path::new(&reg.describe(self.rel)),
                        Rule::MergeIntoDamagedShard,
                        format!("its index is damaged ({e})"),
                    ));
                }
                return Ok(());
            }
        };
        let mut kept: Vec<(usize, ChunkRange)> =
            index.present().filter(|(p, _)| !gone(p)).collect();
        if kept.is_empty() {
            return Ok(());
        }
        self.readable_in_memory(reg, &kept)?;
        // Chunks that lie close together come in one read (one GET on an object store),
        // each kept as a slice of it.
        kept.sort_by_key(|(_, r)| r.offset);
        for run in runs_of(&kept) {
            let start = run[0].1.offset;
            let end = run.iter().map(|(_, r)| r.end()).max().unwrap_or(start);
            let mut buf = Vec::new();
            // An allocation that fails is an error of this write, never an abort.
            buf.try_reserve_exact((end - start) as usize)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
            buf.resize((end - start) as usize, 0);
            file.read_exact_at(&mut buf, start)?;
            let buf = Bytes::from(buf);
            for (pos, r) in run {
                let at = (r.offset - start) as usize;
                builder.set(*pos, vec![buf.slice(at..at + r.nbytes as usize)]);
            }
        }
        Stats::add(&reg.stats.merges, 1);
        Ok(())
    }

    /// Whether the `kept` chunks of the stored shard may be read into memory for a merge.
    /// Sizes from an index are untrusted (`read_whole_chunk`): nothing bigger than a file
    /// may hold is read, nor, in all, more than the machine could hold (a forged index may
    /// declare many chunks of 4 GiB).
    fn readable_in_memory(
        &self,
        reg: &ShardRegistry,
        kept: &[(usize, ChunkRange)],
    ) -> Result<(), FsError> {
        let max = crate::limits::MAX_FILE_BYTES;
        if kept.iter().any(|(_, r)| r.nbytes > max) {
            return Err(std::io::Error::from_raw_os_error(libc::EFBIG).into());
        }
        let total: u64 = kept.iter().map(|(_, r)| r.nbytes).sum();
        if total > merge_limit() {
            return Err(FsError::refused(
                Path::new(&reg.describe(self.rel)),
                Rule::TooBig,
                format!(
                    "a merge would read {} MiB of the shard into memory, more than half of \
                     this machine's",
                    total >> 20
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    /// Makes shard writes on this thread panic once the shard is locked (tests of panic
    /// containment, `core::fs::flush`).
    pub(crate) static PANIC_IN_SHARD_WRITE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A shard's body that will not become the shard (its array is gone or lost).
fn abandon_body(journal: Option<&Journal>, finishing: Option<&Finishing>) {
    if let (Some(j), Some(f)) = (journal, finishing) {
        j.body_abandoned(f);
    }
}

/// Whether another mount's journal (live or dead) is in BACKING: a record in it may be
/// older than a removal made here, so a shard left with no chunk keeps its stamps.
fn others_journal(backing: &Backing) -> bool {
    let dir = Path::new(crate::journal::JOURNAL_DIR);
    let Ok(entries) = backing.list(dir) else {
        return false;
    };
    entries
        .iter()
        .filter(|e| e.name.to_string_lossy().ends_with(".lock"))
        .count()
        > 1
}

/// The most a merge reads into memory: half the machine's memory.
fn merge_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // SAFETY: sysinfo fills the zeroed struct it is given.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        if unsafe { libc::sysinfo(&mut info) } != 0 {
            return 8 << 30;
        }
        (info.totalram as u64).saturating_mul(info.mem_unit as u64) / 2
    })
}

/// The message of a caught panic.
pub fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// How many times a shard write reads and merges again because another writer's version
/// came in between, before it gives up (EBUSY); each retry means that writer made progress.
const MAX_CONFLICTS: u32 = 64;

/// A version replaced while it was being read for a merge (ESTALE: an object store cannot
/// read an old version) is a conflict like one found at the write: read and merge again.
fn stale_is_conflict(e: FsError, reg: &ShardRegistry, rel: &Path) -> FsError {
    match e {
        FsError::Io(io) if io.raw_os_error() == Some(libc::ESTALE) => {
            FsError::Conflict(reg.describe(rel))
        }
        other => other,
    }
}

fn store_err(e: StoreError) -> FsError {
    match e {
        StoreError::Conflict(what) => FsError::Conflict(what),
        StoreError::Io(e) => e.into(),
    }
}

/// Bytes between two kept chunks below which they are read together.
const READ_GAP: u64 = 1 << 20;

/// `kept` (sorted by offset) cut where the gap to the next chunk is `READ_GAP` or more.
fn runs_of(kept: &[(usize, ChunkRange)]) -> Vec<&[(usize, ChunkRange)]> {
    let mut runs = Vec::new();
    let mut from = 0;
    for i in 1..kept.len() {
        if kept[i].1.offset >= kept[i - 1].1.end().saturating_add(READ_GAP) {
            runs.push(&kept[from..i]);
            from = i;
        }
    }
    runs.push(&kept[from..]);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64, nbytes: u64) -> ChunkRange {
        ChunkRange { offset, nbytes }
    }

    #[test]
    fn close_chunks_are_read_together_far_ones_apart() {
        let kept = [
            (0, at(0, 10)),
            (1, at(20, 10)),
            (2, at(30 + READ_GAP, 5)),
            (3, at(35 + READ_GAP, 5)),
        ];
        let runs: Vec<Vec<usize>> = runs_of(&kept)
            .iter()
            .map(|r| r.iter().map(|(p, _)| *p).collect())
            .collect();
        assert_eq!(runs, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(runs_of(&kept[..1]).len(), 1);
    }
}

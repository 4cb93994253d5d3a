//! fsync through the journal (`crate::journal`): a chunk is made durable as one record,
//! not by writing its shard; and, when a mount starts, the records of mounts that died are
//! put back as pending chunks and written into their shards.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{error, info, warn};

use super::ShardFs;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::shards::{HeldHere, PendingChunk, ShardState, WriteMode};
use crate::journal::record::Was;
use crate::journal::{Journal, Replayed};
use crate::sync::lock;
use crate::zarr::{KeyNode, Node, ShardLayout};

impl ShardFs {
    /// Begins a journal in BACKING: from now on fsync appends records instead of writing
    /// shards.
    pub fn with_journal(self) -> std::io::Result<ShardFs> {
        let journal = Journal::open(&self.backing)?;
        self.shards.set_journal(Arc::new(journal));
        Ok(self)
    }

    /// At a clean end (everything written): the journal goes, lock and all.
    pub fn close_journal(&self) -> std::io::Result<()> {
        match self.shards.journal() {
            Some(j) => j.close(),
            None => Ok(()),
        }
    }

    /// Past `--max-journal-bytes`: the shards that journal records wait on are written, so
    /// that the records retire and their segments go.
    pub(crate) fn bound_journal(&self) {
        let Some(j) = self.shards.journal() else {
            return;
        };
        if j.bytes() <= self.config.max_journal {
            return;
        }
        for p in self.shards.pending() {
            if p.journaled {
                let _ = self
                    .shards
                    .write_pending(&self.backing, &p, WriteMode::Everything);
            }
        }
        let _ = self.shards.make_all_durable(&self.backing);
    }

    /// Makes the content of `files` durable: each one not yet in the journal at its
    /// current version becomes a record, all of them synced together.
    pub(crate) fn journal_files(
        &self,
        journal: &Journal,
        files: &[PendingChunk],
    ) -> Result<(), FsError> {
        self.shards.journal_chunks(&self.backing, journal, files)?;
        self.bound_journal();
        Ok(())
    }

    /// fsync of chunk `coords`: its content is made durable (a record, or its shard when
    /// the mount keeps no journal).
    pub(crate) fn fsync_chunk(
        &self,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<(), FsError> {
        let shard = array.layout.locate(coords).shard;
        let this_shard = |a: &Path, s: &[u64], _| a == array.rel && s == shard.as_slice();
        let Some(journal) = self.shards.journal().cloned() else {
            self.shards
                .write_shard(&self.backing, array, &shard, WriteMode::Everything)?;
            return self.shards.make_durable(&self.backing, this_shard);
        };
        if let crate::core::shards::ChunkData::Pending(file) =
            self.shards.chunk(&self.backing, array, coords)?
        {
            self.journal_files(&journal, &[(array.clone(), coords.to_vec(), file)])?;
        }
        // Already in its shard: that shard is made durable now, if it is not yet.
        self.shards.make_durable(&self.backing, this_shard)?;
        // Retirements too: a chunk in its shard must not come back older.
        journal.sync_all()?;
        Ok(())
    }

    /// fsync of a key directory (or the array directory): every closed pending chunk below
    /// it is made durable, and so is its name there.
    pub(crate) fn fsync_below(
        &self,
        array: &Arc<ArrayState>,
        node: &KeyNode,
    ) -> Result<(), FsError> {
        let cps = array.layout.chunks_per_shard();
        let prefix: Vec<u64> = node.prefix().iter().zip(cps).map(|(c, n)| c / n).collect();
        let below = |a: &Path, s: &[u64], _| a == array.rel && s.starts_with(&prefix);
        let Some(journal) = self.shards.journal().cloned() else {
            self.write_pending_below(&array.rel, &prefix)?;
            return self.shards.make_durable(&self.backing, below);
        };
        let files: Vec<PendingChunk> = self
            .shards
            .files_to_journal(&array.rel, &prefix)
            .into_iter()
            .filter(|(_, coords, _)| coords.starts_with(node.prefix()))
            .collect();
        self.journal_files(&journal, &files)?;
        // A deletion is not journaled: a shard that still holds a chunk deleted through the
        // mount is written now, so that the name's removal is durable as asked.
        let deletions = self.shards.write_below(
            &self.backing,
            &array.rel,
            &prefix,
            ShardState::deletion_to_write,
        );
        self.shards.make_durable(&self.backing, below)?;
        journal.sync_all()?;
        deletions
    }

    /// Writes, durably, every pending shard of the array at `rel` below `shard_prefix`.
    pub(crate) fn write_pending_below(
        &self,
        rel: &Path,
        shard_prefix: &[u64],
    ) -> Result<(), FsError> {
        self.shards
            .write_below(&self.backing, rel, shard_prefix, |st| !st.clean())
    }

    /// Before the mount goes live: the chunks in the journals of mounts that are gone are
    /// put back as pending chunks, where the replay rule allows (`replay_verdict`), and
    /// written into their shards. Returns how many records were read.
    pub fn replay_journals(&self) -> Result<usize, FsError> {
        let Some(journal) = self.shards.journal().cloned() else {
            return Ok(0);
        };
        let (count, touched, failed) = self.take_over(&journal)?;
        // What cannot be replayed or written now (a damaged shard, a directory someone made
        // at a shard's path) never keeps the mount from starting, for everyone: the records
        // stay live, their chunks pending, tried again like any failed write, and what
        // fails is named (`shardfs stats`, the unmount). Later writes are ordered against
        // them by the replay rule as on a live mount taking a journal over.
        if failed > 0 {
            error!(
                "{failed} journaled chunks could not be replayed yet (see above): \
                    tried again every second"
            );
        }
        if !touched.is_empty() {
            let failed = self.flush_all();
            if !failed.is_empty() {
                error!(
                    "replayed chunks not written yet (they stay pending, retried): {}",
                    failed.join("; ")
                );
            }
            info!(chunks = touched.len(), "journal replayed");
        }
        Ok(count)
    }

    /// While the mount lives (the flusher, at most once a second): the journals of mounts
    /// sharing BACKING that died meanwhile are taken over now, not at the next mount, and
    /// their chunks written into their shards.
    pub(crate) fn adopt_dead_journals(&self) {
        let Some(journal) = self.shards.journal().cloned() else {
            return;
        };
        if !journal.adoption_due() {
            return;
        }
        let _gate = self.gate.shared();
        let touched = match self.take_over(&journal) {
            Ok((_, touched, _)) => touched,
            Err(e) => {
                warn!("journal of a mount that is gone not taken over yet: {e}");
                return;
            }
        };
        for (array, shard) in &touched {
            if let Err(e) =
                self.shards
                    .write_shard(&self.backing, array, shard, WriteMode::Everything)
            {
                warn!(array = %array.rel.display(), ?shard,
                    "replayed chunks not written yet (they stay pending): {e}");
            }
        }
        if !touched.is_empty() {
            let _ = self.shards.make_all_durable(&self.backing);
            info!(
                shards = touched.len(),
                "journal of a mount that is gone replayed"
            );
        }
    }

    /// Takes over the journals of mounts that are gone: each record the replay rule allows
    /// becomes its chunk's pending state, the others retire. A record that fails (a shard
    /// that cannot be read just now) stays live and is tried again at the next look, before
    /// newly found journals. Returns how many records were read, the shards that got
    /// pending state, and how many records failed.
    fn take_over(&self, journal: &Journal) -> Result<(usize, Vec<Touched>, usize), FsError> {
        let mut replayed = std::mem::take(&mut *lock(&self.unreplayed));
        replayed.extend(journal.adopt_dead()?);
        in_time_order(&mut replayed);
        let count = replayed.len();
        // Positions set by this replay: its later records of them (of the same journal, or
        // of another one written later) follow the earlier ones, whatever the shard holds.
        let mut applied: BTreeSet<(PathBuf, Vec<u64>)> = BTreeSet::new();
        let mut touched: BTreeMap<(PathBuf, Vec<u64>), Arc<ArrayState>> = BTreeMap::new();
        let mut failed = Vec::new();
        for r in replayed {
            let key = (r.array.clone(), r.coords.clone());
            let after_applied = applied.contains(&key);
            match self.replay_one(&r, after_applied) {
                Ok(Some(array)) => {
                    let shard = array.layout.locate(&r.coords).shard;
                    touched.insert((array.rel.clone(), shard), array);
                    applied.insert(key);
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(array = %r.array.display(), coords = ?r.coords,
                        "journaled chunk not replayed yet (tried again): {e}");
                    failed.push(r);
                }
            }
        }
        let n_failed = failed.len();
        lock(&self.unreplayed).extend(failed);
        let touched = touched
            .into_iter()
            .map(|((_, shard), array)| (array, shard))
            .collect();
        Ok((count, touched, n_failed))
    }

    /// One record, as the replay rule says. Returns the array it became pending state of.
    fn replay_one(
        &self,
        r: &Replayed,
        after_applied: bool,
    ) -> Result<Option<Arc<ArrayState>>, FsError> {
        let record = r.record.clone();
        match self.replay_verdict(r, after_applied)? {
            Verdict::Apply(array) => {
                self.shards.replay_record(
                    &self.backing,
                    &array,
                    &r.coords,
                    (r.data.clone(), r.at),
                    record,
                )?;
                return Ok(Some(array));
            }
            Verdict::HeldHere(array) => {
                // This mount's newer state retires it once written durably, as it would a
                // record of its own: until then a crash may need it.
                self.shards
                    .book_foreign(&self.backing, &array, &r.coords, record)?;
            }
            Verdict::Superseded(array, why) => {
                // What superseded it may still be only in the page cache (another mount's
                // write, a killed replay's): durable first, then retired.
                info!(array = %r.array.display(), coords = ?r.coords,
                    "journaled chunk not replayed: {why}");
                self.shards
                    .sync_shard_of(&self.backing, &array, &r.coords)?;
                self.shards.retire(vec![record]);
            }
            Verdict::Drop(why) => {
                warn!(array = %r.array.display(), coords = ?r.coords,
                    "journaled chunk not replayed: {why}");
                self.shards.retire(vec![record]);
            }
        }
        Ok(None)
    }

    /// The array record `r` was written for: at its path, or where another mount moved its
    /// directory (found by the directory's instance).
    fn recorded_array(&self, r: &Replayed) -> Result<Option<Arc<ArrayState>>, FsError> {
        let here = self.array_at(&r.array)?;
        let Some(instance) = r.instance.as_deref().filter(|i| !i.is_empty()) else {
            return Ok(here);
        };
        if let Some(a) = &here {
            let now = self.shards.array_instance(&self.backing, &a.rel);
            if now.is_empty() || now == instance {
                return Ok(here);
            }
        }
        match self.shards.find_moved(&self.backing, instance) {
            Some(rel) => Ok(self.array_at(&rel)?.or(here)),
            None => Ok(here),
        }
    }

    /// The replay rule: a record becomes its chunk's pending state only into the array it
    /// was written for (same path, the same array there, chunks placed the same way: as a
    /// live mount keeps pending chunks across a rewrite of `zarr.json` that does not move
    /// them, so does a replay), and only over what the shard held when it was taken: a chunk that another
    /// mount or writer changed since, or that this mount holds a newer state of, stays,
    /// and the record goes once that newer state is durable. `after_applied`: an earlier
    /// record of this chunk in the same journal was applied.
    fn replay_verdict(&self, r: &Replayed, after_applied: bool) -> Result<Verdict, FsError> {
        let Some(array) = self.recorded_array(r)? else {
            return Ok(Verdict::Drop("its array is gone"));
        };
        let recorded = Node::parse(&r.meta).ok().and_then(|n| match n {
            Node::Array(m) => Some(m),
            Node::Group(_) => None,
        });
        let Some(recorded) = recorded else {
            return Ok(Verdict::Drop("its layout record is not an array's"));
        };
        let placed = ShardLayout::of(&recorded)
            .ok()
            .flatten()
            // Inside the grid it was written in: a shape shrunk since keeps it, as a live
            // mount does (the array may grow back).
            .is_some_and(|l| {
                array.layout.same_placement(&l)
                    && crate::grid::inside(&r.coords, &l.chunk_grid_shape())
            });
        if !placed {
            return Ok(Verdict::Drop("its array now lays chunks out elsewhere"));
        }
        // Nor, where the record cannot say which array it was (an object store's), into an
        // array that would read it otherwise (made again by another node with another data
        // type or codecs on the same grid).
        let unnamed = r.instance.as_ref().is_none_or(|i| i.is_empty());
        if unnamed && !crate::zarr::takes_chunks_of(&array.meta, &recorded) {
            return Ok(Verdict::Drop("its array now reads chunks otherwise"));
        }
        let now = self.shards.array_instance(&self.backing, &array.rel);
        if r.instance
            .as_ref()
            .is_some_and(|i| !i.is_empty() && !now.is_empty() && *i != now)
        {
            return Ok(Verdict::Drop("its array was removed and made again since"));
        }
        if after_applied {
            return Ok(Verdict::Apply(array));
        }
        let (stored, stamp, here) = self
            .shards
            .position_state(&self.backing, &array, &r.coords)?;
        match here {
            HeldHere::Nothing => {}
            // A pending content older than the record (another mount's later fsync): the
            // record's content replaces it, as the later write.
            HeldHere::Content(changed) if changed < r.at => {
                return Ok(Verdict::Apply(array));
            }
            _ => return Ok(Verdict::HeldHere(array)),
        }
        Ok(over_shard(r, array, stored, stamp))
    }
}

/// The verdict on record `r` from what the shard holds at its chunk (`stored`, and when it
/// came there if the shard says: `stamp`). With a time, the later of the two stays, even
/// when the chunk went back to the bytes (or the absence) the record went over; without
/// one, the record goes in only over the state it went over.
fn over_shard(r: &Replayed, array: Arc<ArrayState>, stored: Was, stamp: Option<u64>) -> Verdict {
    let holds_it = stored == Was::of(r.data.as_deref());
    match (stamp, r.was) {
        (Some(at), _) if at > r.at && holds_it => {
            Verdict::Superseded(array, "its shard holds it already")
        }
        (Some(at), _) if at > r.at => Verdict::Superseded(array, "the chunk was written since"),
        (Some(_), _) | (None, Was::Unknown) => Verdict::Apply(array),
        (None, was) if was == stored => Verdict::Apply(array),
        (None, _) if holds_it => Verdict::Superseded(array, "its shard holds it already"),
        (None, _) => Verdict::Superseded(
            array,
            "the chunk was written since, by another mount or writer",
        ),
    }
}

/// What the replay rule says of one record.
enum Verdict {
    /// It becomes its chunk's pending state.
    Apply(Arc<ArrayState>),
    /// This mount holds a newer state of the chunk.
    HeldHere(Arc<ArrayState>),
    /// The shard holds a newer state (or this very content).
    Superseded(Arc<ArrayState>, &'static str),
    /// Its array is not there any more as it was.
    Drop(&'static str),
}

/// Orders records of several journals by when they were written, each journal's own
/// records staying in their order (its ids): two mounts that fsynced one chunk and both
/// died leave it as the later fsync wrote it.
fn in_time_order(records: &mut Vec<Replayed>) {
    // Within a journal, the running latest time: its order by id is never changed.
    let mut latest: BTreeMap<String, u64> = BTreeMap::new();
    let mut keyed: Vec<(u64, Replayed)> = std::mem::take(records)
        .into_iter()
        .map(|r| {
            let t = latest.entry(r.record.journal()).or_insert(0);
            *t = (*t).max(r.at);
            (*t, r)
        })
        .collect();
    // Stable: records of equal time keep their order.
    keyed.sort_by_key(|(t, _)| *t);
    *records = keyed.into_iter().map(|(_, r)| r).collect();
}

/// A shard that a replay gave pending state: its array and coordinates.
type Touched = (Arc<ArrayState>, Vec<u64>);

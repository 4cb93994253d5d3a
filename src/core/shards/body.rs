//! fsync through the journal, shard by shard: the chunks of a shard that does not exist
//! yet go into its body (`crate::journal::body`), which its shard write then completes and
//! renames into place, so that their bytes are written once; the others into the shared
//! segments.
//!
//! Each chunk's record id is reserved before its content is taken, and the content only
//! while the file is still the chunk's (under the slot's lock): replay, which applies
//! records in id order, can then never put a replaced content over its replacement.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::records::book;
use super::{Held, ShardRegistry, ShardSlot};
use crate::backing::Backing;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::MemFile;
use crate::journal::body::{Body, BodyChunk};
use crate::journal::record::Was;
use crate::journal::{Entry, Journal, RecordRef};
use crate::shard::{ChunkRange, IndexLocation};
use crate::sync::lock;

/// A pending chunk to make durable: its array, coordinates and file.
pub(crate) type PendingChunk = (Arc<ArrayState>, Vec<u64>, Arc<MemFile>);

/// A version of a pending chunk that is in its shard's body, and where.
#[derive(Clone, Debug)]
pub(super) struct InBody {
    pub file: Arc<MemFile>,
    pub version: u64,
    pub range: ChunkRange,
}

/// How often an append tries again after a shard write took the body it was aimed at.
const BODY_TRIES: usize = 3;

/// A chunk's content taken for a record.
struct Taken {
    coords: Vec<u64>,
    pos: usize,
    file: Arc<MemFile>,
    version: u64,
    data: Vec<Bytes>,
    id: u64,
    /// What the shard held at the position then.
    was: Was,
}

impl ShardRegistry {
    /// Makes the content of `files` durable in the journal: each one still pending and not
    /// yet journaled at its current version becomes a record, in its shard's body when the
    /// shard can have one, else in the shared segments (all of those synced together).
    pub(crate) fn journal_chunks(
        &self,
        backing: &Backing,
        journal: &Journal,
        files: &[PendingChunk],
    ) -> Result<(), FsError> {
        let mut groups: BTreeMap<(std::path::PathBuf, Vec<u64>), Vec<&PendingChunk>> =
            BTreeMap::new();
        for f in files {
            let shard = f.0.layout.locate(&f.1).shard;
            groups.entry((f.0.rel.clone(), shard)).or_default().push(f);
        }
        // Shards with a body first: their appends sync on their own, and must not run while
        // contents taken for the shared segments wait to be booked (`Unbooked`).
        let mut to_share = Vec::new();
        for ((_, shard), group) in groups {
            let slot = self.slot(backing, &group[0].0, &shard)?;
            if !self.journal_shard(backing, journal, &slot, &group)? {
                to_share.push((slot, group));
            }
        }
        let mut shared: Vec<(Arc<ShardSlot>, Vec<Taken>, Unbooked)> = Vec::new();
        for (slot, group) in to_share {
            // What the shard holds, which each record names as the state it goes over, is
            // final and durable while taken: no write of the shard in flight (it could put
            // an older content there), nothing of it unsynced.
            let (mut taken, unbooked) = {
                let _writer = lock(&slot.writing);
                self.durable_base(backing, &slot)?;
                let taken = self.take(journal, &slot, &group);
                let unbooked = Unbooked::new(&slot, taken.len());
                (taken, unbooked)
            };
            stored_form(&slot.array, &mut taken)?;
            shared.push((slot, taken, unbooked));
        }
        #[cfg(test)]
        pause_for_tests();
        self.append_shared(backing, journal, shared)?;
        #[cfg(test)]
        pause_for_tests();
        if self.journal_moves(backing, files)? {
            journal.sync_all()?;
        }
        Ok(())
    }

    /// Chunks renamed here from a key whose shard still holds them (`MemState::moved_from`):
    /// their content durable at the new name now, the old name's removal is journaled too,
    /// and made durable with it. Returns whether any was.
    fn journal_moves(&self, backing: &Backing, files: &[PendingChunk]) -> Result<bool, FsError> {
        let mut any = false;
        for (_, _, file) in files {
            let Some((array, coords)) = file.with(|s| s.moved_from.take()) else {
                continue;
            };
            let loc = array.layout.locate(&coords);
            let slot = self.slot(backing, &array, &loc.shard)?;
            let stamp = {
                let st = lock(&slot.state);
                st.deleted.contains(&loc.pos).then(|| self.stamp())
            };
            if let Some(stamp) = stamp {
                self.journal_removal(backing, &slot, &coords, stamp);
                any = true;
            }
        }
        Ok(any)
    }

    /// Takes the current content of those of `group` that are still their chunk's and
    /// that no record holds yet, each stamped (its record's id) under the slot's lock.
    fn take(&self, journal: &Journal, slot: &ShardSlot, group: &[&PendingChunk]) -> Vec<Taken> {
        let mut st = lock(&slot.state);
        let st = &mut *st;
        group
            .iter()
            .filter_map(|(_, coords, file)| {
                let pos = slot.array.layout.locate(coords).pos;
                let current = st.pending.get(&pos).is_some_and(|m| Arc::ptr_eq(m, file));
                if !current || file.with(|s| s.retired) {
                    return None;
                }
                let (version, data) = file.content();
                if st.ledger.holds(pos, Held::of(file, version)) {
                    return None;
                }
                Some(Taken {
                    coords: coords.clone(),
                    pos,
                    file: file.clone(),
                    version,
                    data,
                    id: journal.reserve_ids(1),
                    was: self.stored_was(slot, pos, st),
                })
            })
            .collect()
    }

    /// Waits (holding the slot's `writing`, so that no content is taken meanwhile) until
    /// every record taken from the slot is booked in its ledger, or given up: a shard write
    /// then sees every record it makes obsolete.
    pub(super) fn wait_for_bookings(&self, slot: &ShardSlot) -> Result<(), FsError> {
        let start = std::time::Instant::now();
        while slot.unbooked.load(Ordering::SeqCst) > 0 {
            if start.elapsed() > BOOKING_WAIT {
                // Not written without them (their retirement would come outside the key
                // lock): the write fails, and is tried again like any failed one.
                return Err(FsError::Io(std::io::Error::other(
                    "journal records of the shard still being written after a minute",
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    /// Appends the chunks of shards without a body to the shared segments, with one sync.
    fn append_shared(
        &self,
        backing: &Backing,
        journal: &Journal,
        shared: Vec<(Arc<ShardSlot>, Vec<Taken>, Unbooked)>,
    ) -> Result<(), FsError> {
        let layouts: Vec<(Vec<u8>, String)> = shared
            .iter()
            .map(|(slot, ..)| self.layout_of(slot))
            .collect();
        let entries: Vec<Entry> = shared
            .iter()
            .zip(&layouts)
            .flat_map(|((slot, taken, _), (meta, instance))| {
                taken.iter().map(move |t| entry(slot, meta, instance, t))
            })
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        let mut records = journal.append(&entries)?.into_iter();
        // Every group is booked (and its count given back) before any removal is journaled:
        // that takes a slot's writing lock, which a shard write waiting for a count holds.
        let mut due = Vec::new();
        for (slot, taken, unbooked) in shared {
            let recs: Vec<RecordRef> = records.by_ref().take(taken.len()).collect();
            let recs = recs.into_iter().map(|r| (r, None));
            let removals = self.attach(&slot, None, &taken, recs);
            drop(unbooked);
            due.push((slot, removals));
        }
        for (slot, removals) in due {
            self.journal_removals(backing, &slot, removals);
        }
        Ok(())
    }

    /// Appends `group` (chunks of the slot's shard) to the shard's body. `false`: the shard
    /// cannot have a body (it exists), or kept losing it to shard writes.
    fn journal_shard(
        &self,
        backing: &Backing,
        journal: &Journal,
        slot: &ShardSlot,
        group: &[&PendingChunk],
    ) -> Result<bool, FsError> {
        if slot.array.layout.index.location != IndexLocation::End {
            return Ok(false);
        }
        for _ in 0..BODY_TRIES {
            // No shard write in flight while the body is chosen and the content taken: one
            // that began before would put a new shard file (an older content in it) under
            // records that say there was none. One that begins after takes this body.
            let (body, mut taken) = {
                let _writer = lock(&slot.writing);
                let Some(body) = self.body_for(journal, slot)? else {
                    return Ok(false);
                };
                (body, self.take(journal, slot, group))
            };
            if taken.is_empty() {
                return Ok(true);
            }
            stored_form(&slot.array, &mut taken)?;
            let entries: Vec<Entry> = taken.iter().map(|t| entry(slot, &[], "", t)).collect();
            if let Some(chunks) = journal.append_body(&body, &entries)? {
                let recs = chunks
                    .into_iter()
                    .map(|BodyChunk { record, range }| (record, Some(range)));
                let removals = self.attach(slot, Some(&body), &taken, recs);
                self.journal_removals(backing, slot, removals);
                return Ok(true);
            }
            // A shard write took the body: once it is over (the next try waits for it),
            // what it wrote is durable and retired; whatever is still pending goes to the
            // next body.
        }
        Ok(false)
    }

    /// The body of the slot's shard, begun if the shard has none and no shard file exists.
    fn body_for(&self, journal: &Journal, slot: &ShardSlot) -> Result<Option<Arc<Body>>, FsError> {
        // A body becomes its shard by a rename beside it: not when shards live elsewhere.
        if !self.store_is_backing {
            return Ok(None);
        }
        let _init = lock(&slot.body_init);
        {
            let mut st = lock(&slot.state);
            // A shard file written meanwhile (its index is known): a merge comes next,
            // which needs the old file anyway.
            if st.stored.is_some() {
                return Ok(None);
            }
            if let Some(b) = &st.body {
                return Ok(Some(b.clone()));
            }
            if self.open_stored(slot, &slot.shard, &mut st)?.is_some() {
                return Ok(None);
            }
        }
        let (meta, instance) = self.layout_of(slot);
        let body = journal.begin_body(&slot.array.rel, &instance, &meta)?;
        lock(&slot.state).body = Some(body.clone());
        Ok(Some(body))
    }

    /// Books each durable record in the ledger of its position (and, for a body, where the
    /// chunk's bytes are, if the file is still its chunk's). Returns the removals to journal
    /// after it (`journal_removals`): positions deleted while their records were written.
    fn attach(
        &self,
        slot: &ShardSlot,
        body: Option<&Arc<Body>>,
        taken: &[Taken],
        records: impl Iterator<Item = (RecordRef, Option<ChunkRange>)>,
    ) -> Vec<(Vec<u64>, u64)> {
        let mut late = Vec::new();
        let mut removals = Vec::new();
        {
            let mut st = lock(&slot.state);
            let attached =
                body.is_some_and(|b| st.body.as_ref().is_some_and(|s| Arc::ptr_eq(s, b)));
            for (t, (record, range)) in taken.iter().zip(records) {
                let current = st
                    .pending
                    .get(&t.pos)
                    .is_some_and(|m| Arc::ptr_eq(m, &t.file));
                if let (true, true, Some(range)) = (current, attached, range) {
                    let at = InBody {
                        file: t.file.clone(),
                        version: t.version,
                        range,
                    };
                    st.in_body.insert(t.pos, at);
                }
                let held = Held::of(&t.file, t.version);
                late.extend(book(&mut st, t.pos, t.id, record, held));
                // Deleted while its record was being written: the removal comes after it.
                if st.deleted.contains(&t.pos) && st.ledger.needs_removal(t.pos) {
                    removals.push((t.coords.clone(), self.stamp()));
                }
            }
        }
        if !late.is_empty() {
            self.note_unsynced(&slot.array, &slot.shard, late);
        }
        removals
    }

    /// Journals the removals `attach` found due.
    fn journal_removals(&self, backing: &Backing, slot: &ShardSlot, due: Vec<(Vec<u64>, u64)>) {
        for (coords, stamp) in due {
            self.journal_removal(backing, slot, &coords, stamp);
        }
    }

    /// The slot's shard is no longer wanted as a body (its slot is dropped).
    pub(super) fn drop_body(&self, body: Option<Arc<Body>>) {
        if let (Some(body), Some(journal)) = (body, self.journal()) {
            let finishing = journal.finish_body(&body);
            journal.body_abandoned(&finishing);
        }
    }
}

/// The contents taken as the array stores them (`codec`): a record holds a chunk as its
/// shard will, so a body becomes the shard as it is; a replay decompresses it again.
fn stored_form(array: &ArrayState, taken: &mut [Taken]) -> Result<(), FsError> {
    if array.zstd.is_none() {
        return Ok(());
    }
    let contents: Vec<&[Bytes]> = taken.iter().map(|t| t.data.as_slice()).collect();
    let encoded = super::codec::encode(array.zstd, &contents)?;
    for (t, e) in taken.iter_mut().zip(encoded) {
        t.data = e;
    }
    Ok(())
}

/// A journal entry for chunk `t` of the slot's array (`meta`: its layout, as stored).
fn entry<'a>(slot: &'a ShardSlot, meta: &'a [u8], instance: &'a str, t: &'a Taken) -> Entry<'a> {
    Entry {
        array: &slot.array.rel,
        instance,
        meta,
        coords: &t.coords,
        was: t.was,
        data: Some(&t.data),
        id: t.id,
    }
}

/// The longest a shard write waits for records being written to be booked (a journal
/// append and one sync; a minute means a disk that hangs).
const BOOKING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Contents taken from a slot for records not yet booked: counted in the slot while this
/// lives (`ShardRegistry::wait_for_bookings`), whatever becomes of the append.
pub(super) struct Unbooked {
    count: Arc<std::sync::atomic::AtomicU64>,
    n: u64,
}

impl Unbooked {
    pub(super) fn new(slot: &ShardSlot, n: usize) -> Unbooked {
        slot.unbooked.fetch_add(n as u64, Ordering::SeqCst);
        Unbooked {
            count: slot.unbooked.clone(),
            n: n as u64,
        }
    }
}

impl Drop for Unbooked {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::SeqCst);
    }
}

/// Where a test asked this thread to stop (`PAUSE_BEFORE_APPEND`): arrived, then let go.
#[cfg(test)]
fn pause_for_tests() {
    PAUSE_BEFORE_APPEND.with_borrow(|pause| {
        if let Some(barrier) = pause {
            barrier.wait();
            barrier.wait();
        }
    });
}

#[cfg(test)]
thread_local! {
    /// Makes `journal_chunks` on this thread stop between taking contents and appending
    /// them, and again once they are booked: each time it waits on the barrier twice
    /// (arrived, then let go). Tests of shard writes racing an fsync.
    pub(crate) static PAUSE_BEFORE_APPEND: std::cell::RefCell<Option<Arc<std::sync::Barrier>>> =
        const { std::cell::RefCell::new(None) };
}

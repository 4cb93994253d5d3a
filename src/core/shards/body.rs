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

use bytes::Bytes;

use super::super::array::{ArrayState, lock};
use super::super::error::FsError;
use super::super::memfile::MemFile;
use super::{ShardRegistry, ShardSlot};
use crate::backing::Backing;
use crate::journal::body::{Body, BodyChunk};
use crate::journal::{Entry, Journal, RecordRef};
use crate::shard::{ChunkRange, IndexLocation};
use crate::zarr::Node;

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
        for f in files.iter().filter(|f| f.2.needs_journal()) {
            let shard = f.0.layout.locate(&f.1).shard;
            groups.entry((f.0.rel.clone(), shard)).or_default().push(f);
        }
        let mut shared: Vec<(Arc<ShardSlot>, Vec<Taken>)> = Vec::new();
        for ((_, shard), group) in groups {
            let slot = self.slot(backing, &group[0].0, &shard)?;
            if !self.journal_shard(journal, &slot, &group)? {
                let taken = self.take(journal, &slot, &group);
                shared.push((slot, taken));
            }
        }
        self.append_shared(journal, shared)
    }

    /// Takes the current content of those of `group` that are still their chunk's and
    /// need a record, each with an id reserved first.
    fn take(&self, journal: &Journal, slot: &ShardSlot, group: &[&PendingChunk]) -> Vec<Taken> {
        let first = journal.reserve_ids(group.len() as u64);
        let st = lock(&slot.state);
        group
            .iter()
            .zip(first..)
            .filter_map(|((_, coords, file), id)| {
                let pos = slot.array.layout.locate(coords).pos;
                let current = st.pending.get(&pos).is_some_and(|m| Arc::ptr_eq(m, file));
                if !current || !file.needs_journal() {
                    return None;
                }
                let (version, data) = file.content();
                Some(Taken {
                    coords: coords.clone(),
                    pos,
                    file: file.clone(),
                    version,
                    data,
                    id,
                })
            })
            .collect()
    }

    /// Appends the chunks of shards without a body to the shared segments, with one sync.
    fn append_shared(
        &self,
        journal: &Journal,
        shared: Vec<(Arc<ShardSlot>, Vec<Taken>)>,
    ) -> Result<(), FsError> {
        let metas: Vec<Vec<u8>> = shared
            .iter()
            .map(|(slot, _)| Node::Array(slot.array.meta.clone()).to_json_bytes())
            .collect();
        let entries: Vec<Entry> = shared
            .iter()
            .zip(&metas)
            .flat_map(|((slot, taken), meta)| taken.iter().map(move |t| entry(slot, meta, t)))
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        let mut records = journal.append(&entries)?.into_iter();
        for (slot, taken) in &shared {
            let recs: Vec<RecordRef> = records.by_ref().take(taken.len()).collect();
            self.attach(slot, None, taken, recs.into_iter().map(|r| (r, None)));
        }
        Ok(())
    }

    /// Appends `group` (chunks of the slot's shard) to the shard's body. `false`: the shard
    /// cannot have a body (it exists), or kept losing it to shard writes.
    fn journal_shard(
        &self,
        journal: &Journal,
        slot: &ShardSlot,
        group: &[&PendingChunk],
    ) -> Result<bool, FsError> {
        if slot.array.layout.index.location != IndexLocation::End {
            return Ok(false);
        }
        for _ in 0..BODY_TRIES {
            let Some(body) = self.body_for(journal, slot)? else {
                return Ok(false);
            };
            let taken = self.take(journal, slot, group);
            if taken.is_empty() {
                return Ok(true);
            }
            let entries: Vec<Entry> = taken.iter().map(|t| entry(slot, &[], t)).collect();
            if let Some(chunks) = journal.append_body(&body, &entries)? {
                let recs = chunks
                    .into_iter()
                    .map(|BodyChunk { record, range }| (record, Some(range)));
                self.attach(slot, Some(&body), &taken, recs);
                return Ok(true);
            }
            // A shard write took the body: once it is over, what it wrote is durable and
            // retired; whatever is still pending goes to the next body.
            drop(lock(&slot.writing));
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
        let meta = Node::Array(slot.array.meta.clone()).to_json_bytes();
        let body = journal.begin_body(&slot.array.rel, &meta)?;
        lock(&slot.state).body = Some(body.clone());
        Ok(Some(body))
    }

    /// Gives each durable record to what it holds: the file, if still its chunk's (and,
    /// for a body, the body's map of where it is); the chunk's superseded records, if the
    /// file was replaced meanwhile; or, if the file went into a shard write meanwhile, that
    /// shard's durability, which it then waits for like the records the write retired.
    fn attach(
        &self,
        slot: &ShardSlot,
        body: Option<&Arc<Body>>,
        taken: &[Taken],
        records: impl Iterator<Item = (RecordRef, Option<ChunkRange>)>,
    ) {
        let mut late = Vec::new();
        {
            let mut st = lock(&slot.state);
            let attached =
                body.is_some_and(|b| st.body.as_ref().is_some_and(|s| Arc::ptr_eq(s, b)));
            for (t, (record, range)) in taken.iter().zip(records) {
                let current = st
                    .pending
                    .get(&t.pos)
                    .is_some_and(|m| Arc::ptr_eq(m, &t.file));
                if !current {
                    if t.file.with(|s| s.retired) {
                        late.push(record);
                    } else {
                        st.superseded.entry(t.pos).or_default().push(record);
                    }
                    continue;
                }
                if let (true, Some(range)) = (attached, range) {
                    let at = InBody {
                        file: t.file.clone(),
                        version: t.version,
                        range,
                    };
                    st.in_body.insert(t.pos, at);
                }
                late.extend(t.file.add_records(t.version, vec![record]));
            }
        }
        if !late.is_empty() {
            self.note_unsynced(&slot.array, &slot.shard, late);
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

/// A journal entry for chunk `t` of the slot's array (`meta`: its layout, as stored).
fn entry<'a>(slot: &'a ShardSlot, meta: &'a [u8], t: &'a Taken) -> Entry<'a> {
    Entry {
        array: &slot.array.rel,
        meta,
        coords: &t.coords,
        data: &t.data,
        id: t.id,
    }
}

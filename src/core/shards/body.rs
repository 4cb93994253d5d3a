//! fsync into shard bodies (`crate::journal::body`): the chunks of a shard that does not
//! exist yet are journaled into a file of their own, which its shard write then completes
//! and renames into place, so that their bytes are written once.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::super::array::{ArrayState, lock};
use super::super::error::FsError;
use super::super::memfile::MemFile;
use super::{ShardRegistry, ShardSlot};
use crate::backing::Backing;
use crate::journal::body::Body;
use crate::journal::{Entry, Journal};
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

impl ShardRegistry {
    /// Journals into shard bodies those of `files` whose shard can have one (a new shard,
    /// index at the end). Returns the others, for the shared journal.
    pub(crate) fn journal_into_bodies(
        &self,
        backing: &Backing,
        journal: &Journal,
        files: Vec<PendingChunk>,
    ) -> Result<Vec<PendingChunk>, FsError> {
        let mut groups: BTreeMap<Vec<u64>, Vec<PendingChunk>> = BTreeMap::new();
        let mut rest = Vec::new();
        for f in files {
            if f.0.layout.index.location == IndexLocation::End && f.2.needs_journal() {
                let shard = f.0.layout.locate(&f.1).shard;
                groups.entry(shard).or_default().push(f);
            } else {
                rest.push(f);
            }
        }
        for (shard, group) in groups {
            let array = group[0].0.clone();
            let slot = self.slot(backing, &array, &shard)?;
            if !self.journal_shard(backing, journal, &slot, &group)? {
                rest.extend(group);
            }
        }
        Ok(rest)
    }

    /// Appends `group` (chunks of the slot's shard) to the shard's body. `false`: the shard
    /// cannot have a body (it exists), or kept losing it to shard writes.
    fn journal_shard(
        &self,
        backing: &Backing,
        journal: &Journal,
        slot: &ShardSlot,
        group: &[PendingChunk],
    ) -> Result<bool, FsError> {
        for _ in 0..BODY_TRIES {
            let Some(body) = self.body_for(backing, journal, slot)? else {
                return Ok(false);
            };
            if self.append_to_body(journal, slot, &body, group)? {
                return Ok(true);
            }
            // A shard write took the body: once it is over, what it wrote is durable and
            // retired; whatever is still pending goes to the next body.
            drop(lock(&slot.writing));
        }
        Ok(false)
    }

    /// The body of the slot's shard, begun if the shard has none and no shard file exists.
    fn body_for(
        &self,
        backing: &Backing,
        journal: &Journal,
        slot: &ShardSlot,
    ) -> Result<Option<Arc<Body>>, FsError> {
        let _init = lock(&slot.body_init);
        {
            let mut st = lock(&slot.state);
            if let Some(b) = &st.body {
                return Ok(Some(b.clone()));
            }
            if self
                .open_stored(backing, slot, &slot.shard, &mut st)?
                .is_some()
            {
                return Ok(None);
            }
        }
        let meta = Node::Array(slot.array.meta.clone()).to_json_bytes();
        let body = journal.begin_body(&slot.array.rel, &meta)?;
        lock(&slot.state).body = Some(body.clone());
        Ok(Some(body))
    }

    /// Appends the current content of the files of `group` that need it, durably.
    /// `false`: the body was taken by a shard write first, and nothing was appended.
    fn append_to_body(
        &self,
        journal: &Journal,
        slot: &ShardSlot,
        body: &Arc<Body>,
        group: &[PendingChunk],
    ) -> Result<bool, FsError> {
        let taken: Vec<(&PendingChunk, u64, Vec<Bytes>)> = group
            .iter()
            .filter(|(_, _, file)| file.needs_journal())
            .map(|chunk| {
                let (version, segments) = chunk.2.content();
                (chunk, version, segments)
            })
            .collect();
        if taken.is_empty() {
            return Ok(true);
        }
        let entries: Vec<Entry> = taken
            .iter()
            .map(|((array, coords, _), _, data)| Entry {
                array: &array.rel,
                meta: &[],
                coords,
                data,
            })
            .collect();
        let Some(chunks) = journal.append_body(body, &entries)? else {
            return Ok(false);
        };
        let mut late = Vec::new();
        {
            let mut st = lock(&slot.state);
            let attached = st.body.as_ref().is_some_and(|b| Arc::ptr_eq(b, body));
            for (((_, coords, file), version, _), chunk) in taken.iter().zip(chunks) {
                let pos = slot.array.layout.locate(coords).pos;
                let current = st.pending.get(&pos).is_some_and(|m| Arc::ptr_eq(m, file));
                if attached && current {
                    let at = InBody {
                        file: file.clone(),
                        version: *version,
                        range: chunk.range,
                    };
                    st.in_body.insert(pos, at);
                }
                late.extend(file.add_records(*version, vec![chunk.record]));
            }
        }
        // Retired meanwhile (its shard written): its record is not needed.
        self.retire(late);
        Ok(true)
    }

    /// The slot's shard is no longer wanted as a body (its array's state is dropped).
    pub(super) fn drop_body(&self, body: Option<Arc<Body>>) {
        if let (Some(body), Some(journal)) = (body, self.journal()) {
            let finishing = journal.finish_body(&body);
            journal.body_abandoned(&finishing);
        }
    }
}

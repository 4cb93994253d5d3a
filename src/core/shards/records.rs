//! What a journal record says of its chunk besides its bytes, and the records that do not
//! come from an fsync: which array it belongs to (`array_instance`), what the shard held
//! at its position when it was taken (`Was`), removals, and records read back from a dead
//! mount's journal. Each is booked in its position's ledger (`ledger.rs`) by `book`.

use std::sync::Arc;

use bytes::Bytes;

use super::{Held, ShardRegistry, ShardSlot, ShardState};
use crate::backing::Backing;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{FileData, MemFile};
use crate::journal::record::Was;
use crate::journal::{Entry, RecordRef};
use crate::sync::lock;
use crate::zarr::Node;

impl ShardRegistry {
    /// Journals the removal of the chunk at `coords` (its position's state as of `stamp`),
    /// without waiting for a sync: the next one, which every fsync ends with, makes it
    /// durable. When it cannot be appended, the position keeps needing its removal, which
    /// an fsync of its directory then writes into the shard instead.
    pub(super) fn journal_removal(
        &self,
        backing: &Backing,
        slot: &ShardSlot,
        coords: &[u64],
        stamp: u64,
    ) {
        let Some(journal) = self.journal() else {
            return;
        };
        let (meta, instance) = self.layout_of(slot);
        let pos = slot.array.layout.locate(coords).pos;
        // As for content records (`journal_chunks`): the state named is final and durable.
        // Counted until booked, as content records are (`body::Unbooked`).
        let (was, _unbooked) = {
            let _writer = lock(&slot.writing);
            if let Err(e) = self.durable_base(backing, slot) {
                tracing::warn!(array = %slot.array.rel.display(), ?coords,
                    "removal not journaled (an fsync of its directory writes it): {e}");
                return;
            }
            let was = self.stored_was(slot, pos, &mut lock(&slot.state));
            (was, super::body::Unbooked::new(slot, 1))
        };
        let entry = Entry {
            array: &slot.array.rel,
            instance: &instance,
            meta: &meta,
            coords,
            was,
            data: None,
            id: stamp,
        };
        let record = match journal.append_unsynced(std::slice::from_ref(&entry)) {
            Ok(mut r) => r.remove(0),
            Err(e) => {
                tracing::warn!(array = %slot.array.rel.display(), ?coords,
                    "removal not journaled (an fsync of its directory writes it): {e}");
                return;
            }
        };
        let late = book(&mut lock(&slot.state), pos, stamp, record, Held::Removal);
        if let Some(late) = late {
            self.note_unsynced(&slot.array, &slot.shard, vec![late]);
        }
    }

    /// A record read back from a dead mount's journal becomes the chunk's pending state
    /// (its content, or its removal), booked in the ledger like a record of this mount's.
    pub(crate) fn replay_record(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        (data, at): (Option<Bytes>, u64),
        record: RecordRef,
    ) -> Result<(), FsError> {
        let held = match data {
            Some(bytes) => {
                let bytes = match array.zstd {
                    Some(z) => super::stored::decode(&bytes, &array.rel, z.max)?,
                    None => bytes,
                };
                let file = Arc::new(MemFile::new(FileData::from_bytes(bytes), 0o644));
                self.charge(file.len() as i64);
                let held = Held::of(&file, 0);
                self.put(backing, array, coords, file.clone())?;
                // Its shard stamps it with the record's time, not the replay's.
                file.with(|s| s.changed = at);
                held
            }
            None => {
                // The replayed record is the removal's record: a new one in this mount's
                // journal would carry a later time and, replayed beside the dead journal
                // after another crash, undo that journal's later content of the chunk.
                self.move_away(backing, array, coords, false)?;
                self.stamp_removal(backing, array, coords, at)?;
                Held::Removal
            }
        };
        self.book_at(backing, array, coords, record, held)
    }

    /// A removal pending at `coords` came at `at` (a replayed record's time).
    fn stamp_removal(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        at: u64,
    ) -> Result<(), FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        if st.deleted.contains(&loc.pos) {
            st.removed_at.insert(loc.pos, at);
        }
        Ok(())
    }

    /// Books a record of another journal at `coords`, stamped now (`book`).
    fn book_at(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        record: RecordRef,
        held: Held,
    ) -> Result<(), FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let late = {
            let mut st = lock(&slot.state);
            let stamp = self.stamp();
            book(&mut st, loc.pos, stamp, record, held)
        };
        if let Some(late) = late {
            self.note_unsynced(array, &loc.shard, vec![late]);
        }
        Ok(())
    }

    /// What the journal names the slot's array by: its layout (the sharded `zarr.json`) and
    /// which directory held it (`ArrayState::instance`; the one at its path now may be an
    /// array another mount made anew).
    pub(super) fn layout_of(&self, slot: &ShardSlot) -> (Vec<u8>, String) {
        let meta = Node::Array(slot.array.meta.clone()).to_json_bytes();
        let instance = if self.store_is_backing {
            slot.array.instance.clone()
        } else {
            String::new()
        };
        (meta, instance)
    }

    /// Which array is at `rel` now (`Backing::dir_instance`). Empty (not known) when
    /// BACKING is an object store's mirror (made anew at every mount).
    pub(crate) fn array_instance(&self, backing: &Backing, rel: &std::path::Path) -> String {
        if !self.store_is_backing {
            return String::new();
        }
        backing.dir_instance(rel)
    }

    /// A dead mount's record of a chunk this mount holds a newer state of: booked in the
    /// chunk's ledger, so that the write of that state retires it once durable.
    pub(crate) fn book_foreign(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
        record: RecordRef,
    ) -> Result<(), FsError> {
        // No file of this mount holds its content.
        let held = Held::Content {
            file: 0,
            version: 0,
        };
        self.book_at(backing, array, coords, record, held)
    }

    /// The shard holding `coords`, file and directory, synced: what a replay found there
    /// is durable before the record it supersedes goes.
    pub(crate) fn sync_shard_of(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<(), FsError> {
        if self.store_is_backing {
            let shard = array.layout.locate(coords).shard;
            backing.sync_file_and_dir(&array.shard_rel(&shard))?;
        }
        Ok(())
    }

    /// For a replay: what the shard file holds at `coords` now, and whether this mount holds
    /// a state of its own there (pending content, or a deletion not yet written).
    pub(crate) fn position_state(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<(Was, Option<u64>, HeldHere), FsError> {
        let loc = array.layout.locate(coords);
        let slot = self.slot(backing, array, &loc.shard)?;
        let mut st = lock(&slot.state);
        let here = match st.pending.get(&loc.pos) {
            Some(m) => HeldHere::Content(m.with(|s| s.changed)),
            None if st.deleted.contains(&loc.pos) => HeldHere::Removal,
            None => HeldHere::Nothing,
        };
        let was = self.stored_was(&slot, loc.pos, &mut st);
        Ok((was, self.stored_stamp(&slot, loc.pos, &mut st), here))
    }

    /// When the shard file's state at `pos` came (`shard::stamps`), if it says so.
    fn stored_stamp(&self, slot: &ShardSlot, pos: usize, st: &mut ShardState) -> Option<u64> {
        let open = self.open_stored(slot, &slot.shard, st).ok()??;
        self.stamps_of(&open)?.get(pos).copied().filter(|s| *s != 0)
    }

    /// The stamps of a stored shard (`OpenShard::stamps`). On an object store they come
    /// with the index at the end (`open_shard`), at no request of their own.
    pub(super) fn stamps_of(&self, open: &super::OpenShard) -> Option<Arc<Vec<u64>>> {
        open.stamps()
    }

    /// Makes the slot's shard durable if this mount wrote (or removed) it without syncing:
    /// a record names what the shard holds as the state it goes over (`Was`), and after a
    /// power cut that state must still be there, not an older one.
    pub(super) fn durable_base(&self, backing: &Backing, slot: &ShardSlot) -> Result<(), FsError> {
        let key = (slot.array.rel.clone(), slot.shard.clone());
        if !lock(&self.unsynced).contains_key(&key) {
            return Ok(());
        }
        self.make_durable(backing, |a, s, _| a == key.0 && s == key.1.as_slice())
    }

    /// What the shard file holds at `pos` now, for a record taken now.
    pub(super) fn stored_was(&self, slot: &ShardSlot, pos: usize, st: &mut ShardState) -> Was {
        let open = match self.open_stored(slot, &slot.shard, st) {
            Ok(Some(open)) => open,
            Ok(None) => return Was::Absent,
            Err(_) => return Was::Unknown,
        };
        let Ok(index) = &open.stored.index else {
            return Was::Unknown;
        };
        match index.get(pos) {
            None => Was::Absent,
            Some(range) => {
                let max = crate::limits::MAX_FILE_BYTES;
                match crate::shard::read_whole_chunk(&*open.file, range, max) {
                    Ok(bytes) => Was::of(Some(&bytes)),
                    Err(_) => Was::Unknown,
                }
            }
        }
    }
}

/// What this mount holds of a chunk a replay meets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HeldHere {
    Nothing,
    /// Pending content, last changed then (ns since the epoch).
    Content(u64),
    /// A deletion not yet written.
    Removal,
}

/// Books a durable record of position `pos` (stamped `stamp`) in the slot's ledger. While the
/// position still has a state waiting to be written (pending or deleted), that state's write
/// comes later than the record and retires it. Otherwise a write has already taken a later
/// state (or this very content): the record is returned, to wait for that shard's
/// durability like the records the write retired.
pub(super) fn book(
    st: &mut ShardState,
    pos: usize,
    stamp: u64,
    record: RecordRef,
    held: Held,
) -> Option<RecordRef> {
    if st.pending.contains_key(&pos) || st.deleted.contains(&pos) {
        st.ledger.add(pos, stamp, record, held);
        None
    } else {
        Some(record)
    }
}

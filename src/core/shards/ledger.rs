//! The durability ledger of one shard: which journal records hold which state of each of
//! its positions, and the one rule that says when a record may go.
//!
//! **The rule.** Every change of a position that durability depends on is stamped, under
//! the slot's lock, with the next number of the journal's sequence: a content taken for a
//! record, a removal, and the pending state a shard write takes. A record holds its
//! position's state as of its stamp, and replay applies records in stamp order, so no
//! record is applied over a state that came after it. A record is retired (it will never
//! be replayed) only once a state of its position at least as new is durable in the shard:
//! when a shard write stamped after it is durable, or a write that left nothing newer
//! pending at the position (its latest state is then in the shard). Records live only
//! while their position has a state waiting to be written (pending or deleted); one that
//! arrives when nothing waits there any more waits for the shard's durability instead
//! (`book` in `body.rs`). Renames, unlinks, truncations and layout changes retire nothing
//! themselves: they change the pending state, which a later shard write takes.
//!
//! The ledger belongs to its shard's slot and is only touched under the slot's lock: the
//! records follow the position, never the file (a file renamed onto another key needs a
//! record there; its old records name the old key).

use std::collections::BTreeMap;

use crate::journal::RecordRef;

/// What a record holds of its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The content of the in-memory file `file` (its `MemFile::id`) at `version`.
    Content { file: u64, version: u64 },
    /// The position's removal.
    Removal,
}

impl Held {
    /// What a journal record of `file`'s content at `version` holds.
    pub(crate) fn of(file: &crate::core::pending::memfile::MemFile, version: u64) -> Held {
        Held::Content {
            file: file.id(),
            version,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    stamp: u64,
    record: RecordRef,
    held: Held,
}

/// The live journal records of one shard's positions, oldest stamp first.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    by_pos: BTreeMap<usize, Vec<Entry>>,
}

impl Ledger {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_pos.is_empty()
    }

    /// Whether some record of `pos` is live.
    pub(crate) fn has_records(&self, pos: usize) -> bool {
        self.by_pos.contains_key(&pos)
    }

    /// Whether the newest record of `pos` holds `held` already (nothing more to journal).
    pub(crate) fn holds(&self, pos: usize, held: Held) -> bool {
        self.newest(pos).is_some_and(|e| e.held == held)
    }

    /// Whether `pos` has a live record of a content and no removal after it: its removal
    /// must be journaled (or written) before a replay could bring that content back.
    pub(crate) fn needs_removal(&self, pos: usize) -> bool {
        self.newest(pos)
            .is_some_and(|e| matches!(e.held, Held::Content { .. }))
    }

    fn newest(&self, pos: usize) -> Option<&Entry> {
        self.by_pos
            .get(&pos)
            .and_then(|v| v.iter().max_by_key(|e| e.stamp))
    }

    pub(crate) fn add(&mut self, pos: usize, stamp: u64, record: RecordRef, held: Held) {
        self.by_pos.entry(pos).or_default().push(Entry {
            stamp,
            record,
            held,
        });
    }

    /// The records at `positions` that a shard write stamped `stamp` makes obsolete
    /// whatever comes after it (those stamped before it), left in the ledger (`covered`
    /// takes them out once the write is settled).
    pub(crate) fn before(
        &self,
        positions: impl IntoIterator<Item = usize>,
        stamp: u64,
    ) -> Vec<RecordRef> {
        positions
            .into_iter()
            .filter_map(|pos| self.by_pos.get(&pos))
            .flatten()
            .filter(|e| e.stamp < stamp)
            .map(|e| e.record.clone())
            .collect()
    }

    /// A shard write stamped `stamp` took position `pos`; `settled`: nothing newer is
    /// pending there since. Takes out the records that write makes obsolete, to be retired
    /// once it is durable: every one when settled (the position's latest state is in the
    /// shard), else those stamped before it.
    pub(crate) fn covered(&mut self, pos: usize, stamp: u64, settled: bool) -> Vec<RecordRef> {
        let Some(entries) = self.by_pos.get_mut(&pos) else {
            return Vec::new();
        };
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(entries)
            .into_iter()
            .partition(|e| settled || e.stamp < stamp);
        if kept.is_empty() {
            self.by_pos.remove(&pos);
        } else {
            *entries = kept;
        }
        gone.into_iter().map(|e| e.record).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> RecordRef {
        RecordRef::for_tests(id)
    }

    #[test]
    fn a_write_retires_what_came_before_it_and_everything_once_settled() {
        let mut l = Ledger::default();
        let f1 = Held::Content {
            file: 1,
            version: 3,
        };
        let f2 = Held::Content {
            file: 1,
            version: 4,
        };
        l.add(0, 10, rec(10), f1);
        l.add(0, 12, rec(12), f2);
        assert!(l.holds(0, f2) && !l.holds(0, f1));
        // Newer content than the write took is still pending: only the older record goes.
        assert_eq!(l.covered(0, 11, false), vec![rec(10)]);
        assert!(l.holds(0, f2));
        l.add(0, 13, rec(13), Held::Removal);
        // Nothing pending after it: the shard holds the latest state, every record goes.
        assert_eq!(l.covered(0, 11, true), vec![rec(12), rec(13)]);
        assert!(l.is_empty());
    }

    #[test]
    fn a_removal_after_a_content_is_what_a_position_needs() {
        let mut l = Ledger::default();
        let f = Held::Content {
            file: 7,
            version: 0,
        };
        assert!(!l.needs_removal(2));
        l.add(2, 5, rec(5), f);
        assert!(l.needs_removal(2));
        l.add(2, 6, rec(6), Held::Removal);
        assert!(!l.needs_removal(2) && l.has_records(2));
    }
}

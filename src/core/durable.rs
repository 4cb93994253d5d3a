//! fsync through the journal (`crate::journal`): a chunk is made durable as one record,
//! not by writing its shard; and, when a mount starts, the records of mounts that died are
//! put back as pending chunks and written into their shards.

use std::path::Path;
use std::sync::Arc;

use tracing::{info, warn};

use super::ShardFs;
use super::array::ArrayState;
use super::error::FsError;
use super::shards::{PendingChunk, ShardState, WriteMode};
use crate::journal::Journal;
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
        if let super::shards::ChunkData::Pending(file) =
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
    /// put back as pending chunks (under their array's current layout, when it still places
    /// them where they were written) and written into their shards. Returns how many.
    pub fn replay_journals(&self) -> Result<usize, FsError> {
        let Some(journal) = self.shards.journal().cloned() else {
            return Ok(0);
        };
        let replayed = journal.adopt_dead()?;
        let count = replayed.len();
        for r in replayed {
            let recorded = Node::parse(&r.meta).ok().and_then(|n| match n {
                Node::Array(m) => ShardLayout::of(&m).ok().flatten(),
                Node::Group(_) => None,
            });
            let array = self.array_at(&r.array)?;
            let placed = match (&array, &recorded) {
                (Some(a), Some(l)) => a.layout.same_placement(l) && a.chunk_inside(&r.coords),
                _ => false,
            };
            let Some(array) = array.filter(|_| placed) else {
                warn!(array = %r.array.display(), coords = ?r.coords,
                    "journaled chunk dropped: its array is gone or now lays chunks out elsewhere");
                self.shards.retire(vec![r.record]);
                continue;
            };
            self.shards
                .replay_record(&self.backing, &array, &r.coords, r.data, r.record)?;
        }
        if count > 0 {
            // Live only once every replayed chunk is in its shard: a journal taken over is
            // never left half applied behind a mount that takes new writes.
            let failed = self.flush_all();
            if !failed.is_empty() {
                return Err(FsError::Failed(
                    format!("journal replay could not write: {}", failed.join("; ")),
                    libc::EIO,
                ));
            }
            info!(chunks = count, "journal replayed");
        }
        Ok(count)
    }
}

//! Writing what is pending without waiting for shards to complete: after a quiet period,
//! under memory pressure, and at unmount. Temporary files that are never renamed go to
//! BACKING as they are.

use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tracing::{info, warn};

use super::ShardFs;
use super::error::FsError;
use super::inode::NodeKind;
use super::memfile::MemFile;
use super::shards::{PendingShard, WriteMode};
use super::stats::{Stats, StatsReport};
use crate::zarr::METADATA_FILE;

impl ShardFs {
    /// One pass of the background flusher: shards idle for `idle_flush` are written as they
    /// are (failed ones are retried at that pace), idle temporary files go to BACKING, and
    /// memory is relieved.
    pub fn tick(&self) {
        let idle = self.config.idle_flush;
        let now = Instant::now();
        for p in self.shards.pending() {
            let quiet = p.last_change.is_none_or(|t| now.duration_since(t) >= idle);
            let retry_due = p
                .failure
                .as_ref()
                .is_none_or(|f| now.duration_since(f.at) >= idle);
            if quiet && retry_due && p.all_settled {
                let _ = self.write_pending(&p, WriteMode::Settled);
            }
        }
        for (rel, file) in self.temps.all_files() {
            let s = file.snapshot();
            let age = SystemTime::now()
                .duration_since(s.mtime)
                .unwrap_or_default();
            if s.unflushed == 0
                && age >= idle
                && rel.file_name() != Some(METADATA_FILE.as_ref())
                && let Err(e) = self.persist_temp(&rel, &file)
            {
                warn!(file = %rel.display(), "temporary file kept in memory: {e}");
            }
        }
        self.relieve_memory();
    }

    fn write_pending(&self, p: &PendingShard, mode: WriteMode) -> Result<(), FsError> {
        self.shards.write_pending(&self.backing, p, mode)
    }

    /// Above the pending-memory limit, writes the biggest pending shards (their closed
    /// chunks) until below it. Called by writers, who so wait for the room they need.
    pub(crate) fn relieve_memory(&self) {
        if self.shards.pending_bytes() <= self.config.max_pending {
            return;
        }
        let mut pending = self.shards.pending();
        pending.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        for p in pending {
            if self.shards.pending_bytes() <= self.config.max_pending / 4 * 3 {
                break;
            }
            if p.failure.is_none() {
                let _ = self.write_pending(&p, WriteMode::Settled);
            }
        }
    }

    /// Writes a temporary file that was never renamed to BACKING, as it is, at its path.
    pub(crate) fn persist_temp(&self, rel: &Path, file: &Arc<MemFile>) -> Result<(), FsError> {
        let lock_name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(crate::backing::lock::LOCK_SUFFIX));
        if lock_name {
            // A tensorstore lock file whose writer never renamed it (it gave up or died):
            // tensorstore ignores such files, and in BACKING the name is a shard's lock.
            if self.temps.file(rel).is_some_and(|f| Arc::ptr_eq(&f, file)) {
                self.temps.remove_file(rel);
                self.shards.charge(-(file.len() as i64));
            }
            info!(file = %rel.display(), "abandoned lock file dropped");
            return Ok(());
        }
        let segments = file.snapshot().data.segments();
        self.backing.write_atomic(rel, &segments, false)?;
        if self.temps.file(rel).is_some_and(|f| Arc::ptr_eq(&f, file)) {
            self.temps.remove_file(rel);
            self.shards.charge(-(file.len() as i64));
        }
        self.inodes.rekind_file(file, NodeKind::File);
        Stats::add(&self.shards.stats.temp_files_persisted, 1);
        info!(file = %rel.display(), "temporary file never renamed: written to BACKING as it is");
        Ok(())
    }

    /// Writes everything pending, durably: every shard, every temporary file (and any
    /// `zarr.json` still being written). Returns what could not be written.
    pub fn flush_all(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (rel, file) in self.temps.all_files() {
            let result = if rel.file_name() == Some(METADATA_FILE.as_ref()) {
                let data = file.snapshot().data;
                let dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
                self.commit_metadata(&dir, &data.read(0, data.len()))
                    .map(|()| {
                        self.temps.remove_file(&rel);
                        self.shards.charge(-(file.len() as i64));
                    })
            } else {
                self.persist_temp(&rel, &file)
            };
            if let Err(e) = result {
                failed.push(format!("{}: {e}", self.backing.path(&rel).display()));
            }
        }
        for p in self.shards.pending() {
            if let Err(e) = self.write_pending(&p, WriteMode::Everything) {
                let shard = self.backing.path(&p.array.shard_rel(&p.shard));
                failed.push(format!("{}: {e}", shard.display()));
            }
        }
        *super::array::lock(&self.shards.stats.not_written) = failed.clone();
        failed
    }

    pub fn stats(&self) -> StatsReport {
        let pending = self.shards.pending();
        let mut report = self.shards.stats.report();
        report.pending_shards = pending.len() as u64;
        report.pending_chunks = pending.iter().map(|p| p.chunks as u64).sum();
        report.pending_bytes = self.shards.pending_bytes();
        report.temp_files = self.temps.count() as u64;
        report.failed = pending
            .iter()
            .filter_map(|p| {
                let f = p.failure.as_ref()?;
                let shard = self.backing.path(&p.array.shard_rel(&p.shard));
                Some(format!("{}: {}", shard.display(), f.message))
            })
            .collect();
        for f in super::array::lock(&self.shards.stats.not_written).iter() {
            if !report.failed.contains(f) {
                report.failed.push(f.clone());
            }
        }
        report.failed.truncate(100);
        report
    }
}

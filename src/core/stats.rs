//! Counters of what the mount wrote, for `shardfs stats`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub struct Stats {
    /// Shard files written (each one vectored write of a whole shard).
    pub shards_written: AtomicU64,
    /// Of those, written while some of the shard was still missing (idle, fsync, memory,
    /// unmount).
    pub partial_writes: AtomicU64,
    /// Writes that had to read chunks back from the existing shard file.
    pub merges: AtomicU64,
    /// Shard writes that found another writer's version in place and merged again.
    pub write_conflicts: AtomicU64,
    /// Of the shards written, those made from their journal body (their fsynced chunks
    /// were not written again).
    pub shards_from_bodies: AtomicU64,
    /// Shard files removed because no chunk was left in them.
    pub shards_deleted: AtomicU64,
    pub bytes_written: AtomicU64,
    pub write_errors: AtomicU64,
    /// Temporary files that were never renamed, written to BACKING as they are.
    pub temp_files_persisted: AtomicU64,
    /// Internal errors (panics) caught and turned into EIO or a retry.
    pub panics: AtomicU64,
    /// What the last flush of everything could not write, each with its error.
    pub not_written: std::sync::Mutex<Vec<String>>,
}

/// A moment's reading of the counters plus the pending state.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct StatsReport {
    pub pending_shards: u64,
    pub pending_chunks: u64,
    pub pending_bytes: u64,
    pub temp_files: u64,
    pub shards_written: u64,
    pub partial_writes: u64,
    pub merges: u64,
    #[serde(default)]
    pub write_conflicts: u64,
    #[serde(default)]
    pub shards_from_bodies: u64,
    pub shards_deleted: u64,
    pub bytes_written: u64,
    pub write_errors: u64,
    pub temp_files_persisted: u64,
    #[serde(default)]
    pub panics: u64,
    /// Log lines dropped because the log could not keep up (`logging`).
    #[serde(default)]
    pub log_lines_dropped: u64,
    /// Requests refused for breaking one of the mount's rules (each logged with its fix).
    #[serde(default)]
    pub refusals: u64,
    /// Shards the index cache knows now, and the bytes they cost.
    #[serde(default)]
    pub index_cache_entries: u64,
    #[serde(default)]
    pub index_cache_bytes: u64,
    /// The fsync journal, when the mount keeps one.
    #[serde(flatten, default)]
    pub journal: crate::journal::JournalReport,
    /// Shards whose last write failed, and whatever else the last flush could not write,
    /// each with its error.
    pub failed: Vec<String>,
    /// An object store's requests so far, by kind (get, head, put, delete, list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_requests: Option<std::collections::BTreeMap<String, u64>>,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn report(&self) -> StatsReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsReport {
            shards_written: get(&self.shards_written),
            partial_writes: get(&self.partial_writes),
            merges: get(&self.merges),
            write_conflicts: get(&self.write_conflicts),
            shards_from_bodies: get(&self.shards_from_bodies),
            shards_deleted: get(&self.shards_deleted),
            bytes_written: get(&self.bytes_written),
            write_errors: get(&self.write_errors),
            temp_files_persisted: get(&self.temp_files_persisted),
            panics: get(&self.panics),
            log_lines_dropped: crate::logging::dropped(),
            ..StatsReport::default()
        }
    }
}

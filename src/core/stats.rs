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
    /// The kernel's requests, by kind.
    pub requests: Requests,
}

/// The kinds of request the kernel sends a mount (FUSE opcodes), as `shardfs stats` names
/// them. The core keeps the tally; the FUSE adapter says what arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mkdir,
    Mknod,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Symlink,
    Open,
    Create,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Xattr,
    Other,
}

impl Request {
    const ALL: [Request; 27] = [
        Request::Lookup,
        Request::Forget,
        Request::Getattr,
        Request::Setattr,
        Request::Readlink,
        Request::Mkdir,
        Request::Mknod,
        Request::Unlink,
        Request::Rmdir,
        Request::Rename,
        Request::Link,
        Request::Symlink,
        Request::Open,
        Request::Create,
        Request::Read,
        Request::Write,
        Request::Flush,
        Request::Release,
        Request::Fsync,
        Request::Opendir,
        Request::Readdir,
        Request::Readdirplus,
        Request::Releasedir,
        Request::Fsyncdir,
        Request::Statfs,
        Request::Xattr,
        Request::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Request::Lookup => "lookup",
            Request::Forget => "forget",
            Request::Getattr => "getattr",
            Request::Setattr => "setattr",
            Request::Readlink => "readlink",
            Request::Mkdir => "mkdir",
            Request::Mknod => "mknod",
            Request::Unlink => "unlink",
            Request::Rmdir => "rmdir",
            Request::Rename => "rename",
            Request::Link => "link",
            Request::Symlink => "symlink",
            Request::Open => "open",
            Request::Create => "create",
            Request::Read => "read",
            Request::Write => "write",
            Request::Flush => "flush",
            Request::Release => "release",
            Request::Fsync => "fsync",
            Request::Opendir => "opendir",
            Request::Readdir => "readdir",
            Request::Readdirplus => "readdirplus",
            Request::Releasedir => "releasedir",
            Request::Fsyncdir => "fsyncdir",
            Request::Statfs => "statfs",
            Request::Xattr => "xattr",
            Request::Other => "other",
        }
    }
}

/// Requests by kind: how many, and the time the daemon spent on them (from arrival to
/// reply). Relaxed atomics: a request costs two additions, never a lock.
#[derive(Debug, Default)]
pub struct Requests {
    count: [AtomicU64; Request::ALL.len()],
    nanos: [AtomicU64; Request::ALL.len()],
}

/// One request being answered; its time is added when it is dropped (after the reply).
pub struct Answering<'a> {
    tally: &'a Requests,
    kind: Request,
    since: std::time::Instant,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let i = self.kind as usize;
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.tally.count[i].fetch_add(1, Ordering::Relaxed);
        self.tally.nanos[i].fetch_add(nanos, Ordering::Relaxed);
    }
}

impl Requests {
    /// Counts a request of `kind` from now until the guard is dropped.
    pub fn answering(&self, kind: Request) -> Answering<'_> {
        Answering {
            tally: self,
            kind,
            since: std::time::Instant::now(),
        }
    }

    /// The kinds seen so far (none for kinds never sent).
    pub fn report(&self) -> std::collections::BTreeMap<String, RequestCount> {
        Request::ALL
            .iter()
            .filter_map(|&k| {
                let count = self.count[k as usize].load(Ordering::Relaxed);
                let nanos = self.nanos[k as usize].load(Ordering::Relaxed);
                (count > 0).then(|| {
                    let seconds = nanos as f64 / 1e9;
                    (k.name().to_string(), RequestCount { count, seconds })
                })
            })
            .collect()
    }
}

/// Requests of one kind: how many, and the seconds spent answering them in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RequestCount {
    pub count: u64,
    pub seconds: f64,
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
    /// The kernel's requests to the mount so far, by kind (FUSE opcode), with the time the
    /// daemon spent answering them. Reading the stats adds a few (lookup, open, read).
    #[serde(default)]
    pub fuse_requests: std::collections::BTreeMap<String, RequestCount>,
    /// Whether plain files pass through the kernel to BACKING: "on", or "off: why".
    #[serde(default)]
    pub passthrough: String,
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
            fuse_requests: self.requests.report(),
            ..StatsReport::default()
        }
    }
}

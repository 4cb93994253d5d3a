//! Writing what is pending without waiting for shards to complete: after a quiet period,
//! under memory pressure, and at unmount. Temporary files that are never renamed go to
//! BACKING as they are.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::ShardFs;
use crate::core::error::FsError;
use crate::core::pending::memfile::MemFile;
use crate::core::shards::{PendingShard, WriteMode};
use crate::core::stats::{Stats, StatsReport};
use crate::core::view::inode::NodeKind;
use crate::zarr::METADATA_FILE;

fn internal_error() -> FsError {
    FsError::Io(std::io::Error::other("internal error"))
}

/// How soon a shard whose write failed is tried again to relieve memory.
const RETRY_UNDER_PRESSURE: Duration = Duration::from_millis(500);

impl ShardFs {
    /// Runs `f`, containing a panic: it is logged and counted, and `None` returned, so that
    /// a background loop goes on (a dead flusher would end idle writes, retries and memory
    /// relief for the rest of the mount's life).
    pub fn contain<T>(&self, what: &str, f: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(panic) => {
                Stats::add(&self.shards.stats().panics, 1);
                tracing::error!(
                    "internal error in {what}, contained: {}",
                    crate::core::shards::panic_text(&panic)
                );
                None
            }
        }
    }

    /// One pass of the background flusher: shards idle for `idle_flush` are written as they
    /// are (failed ones are retried at that pace), idle temporary files go to BACKING, and
    /// memory is relieved.
    pub fn tick(&self) {
        #[cfg(test)]
        if tests::PANIC_IN_TICK.get() {
            panic!("injected panic in the flusher");
        }
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
            let (unflushed, touched) = file.with(|s| (s.unflushed, s.touched));
            // Idle from its last write or close (its mtime is the client's to set).
            let quiet = touched.is_none_or(|t| now.duration_since(t) >= idle);
            if unflushed > 0 || !quiet {
                continue;
            }
            // A closed document still held: its commit failed at its close (a chunk file
            // open through passthrough, a full disk) and is tried again.
            let attempt = if rel.file_name() == Some(METADATA_FILE.as_ref()) {
                (!file.is_empty()).then(|| self.flush_temp(&rel, &file))
            } else {
                Some(self.persist_temp_if_there(&rel, &file, false))
            };
            if let Some(Err(e)) = attempt {
                // Tried again at the idle pace, and said once: fifty such files once
                // made thousands of lines in seconds.
                let first = file.with(|s| {
                    s.touched = Some(now);
                    !std::mem::replace(&mut s.persist_failed, true)
                });
                if first {
                    warn!(file = %rel.display(), "temporary file kept in memory, tried again: {e}");
                }
            }
        }
        let _ = self.relieve_memory();
        self.shards.evict_if_over();
        // Shards written a while ago are made durable in the background, so that their
        // journal records retire.
        let _ = self.shards.make_durable(&self.backing, |_, _, since| {
            now.duration_since(since) >= idle
        });
        self.bound_journal();
        self.adopt_dead_journals();
    }

    fn write_pending(&self, p: &PendingShard, mode: WriteMode) -> Result<(), FsError> {
        self.shards.write_pending(&self.backing, p, mode)
    }

    /// Makes room before a write when pending memory is over the limit: the biggest
    /// shards go first, closed chunks before open ones (an open chunk written early is read
    /// back when its writer goes on). The writer waits meanwhile. When nothing can be
    /// written because the backing store fails, the writer gets that error (ENOSPC, EIO)
    /// instead of memory growing without bound. Memory held only by temporary files is
    /// left to them (they leave it when renamed onto chunks or written out when idle).
    pub(crate) fn relieve_memory(&self) -> Result<(), FsError> {
        let limit = self.config.max_pending;
        let mut last_error = None;
        while self.shards.pending_bytes() > limit {
            let before = self.shards.pending_bytes();
            for mode in [WriteMode::Settled, WriteMode::Everything] {
                if let Err(e) = self.write_biggest(mode) {
                    last_error = Some(e);
                }
                if self.shards.pending_bytes() <= limit / 4 * 3 {
                    return Ok(());
                }
            }
            if self.shards.pending_bytes() <= limit / 4 * 3 {
                return Ok(());
            }
            // What is left may be temporary files: closed ones go to BACKING as they are
            // (a later rename onto a chunk reads them back).
            if let Err(e) = self.write_out_temps(limit / 4 * 3) {
                last_error = Some(e);
            }
            if self.shards.pending_bytes() >= before {
                break;
            }
        }
        match last_error {
            Some(e) if self.shards.pending_bytes() > limit => {
                warn!(
                    "over --max-pending-memory and the backing store fails; the write is refused: {e}"
                );
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Writes temporary files (not `zarr.json`) to BACKING, closed ones first, biggest
    /// first, until pending memory is at `target`. One still open goes too: its writer
    /// goes on writing into the BACKING file (a rename onto a chunk reads it back), so one
    /// big file being written cannot hold the daemon past the limit. Lock files stay (tiny,
    /// and their writer's protocol needs them held). Returns the last error.
    fn write_out_temps(&self, target: u64) -> Result<(), FsError> {
        let mut temps: Vec<(std::path::PathBuf, Arc<MemFile>)> = self
            .temps
            .all_files()
            .into_iter()
            // (An object store takes no change in place: an open file stays in memory.)
            .filter(|(rel, f)| {
                rel.file_name() != Some(METADATA_FILE.as_ref())
                    && (f.settled() || (!is_lock_name(rel) && self.tree.changes_in_place()))
            })
            .collect();
        temps.sort_by_key(|(_, f)| (!f.settled(), std::cmp::Reverse(f.len())));
        let mut result = Ok(());
        for (rel, file) in temps {
            if self.shards.pending_bytes() <= target {
                break;
            }
            if let Err(e) = self.persist_temp_if_there(&rel, &file, false) {
                result = Err(e);
            }
        }
        result
    }

    /// Writes the biggest pending shards (per `mode`) until below three quarters of the
    /// limit. Shards that failed a moment ago are left for a while. Returns the last error.
    fn write_biggest(&self, mode: WriteMode) -> Result<(), FsError> {
        let mut pending = self.shards.pending();
        pending.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        let mut result = Ok(());
        for p in pending {
            if self.shards.pending_bytes() <= self.config.max_pending / 4 * 3 {
                break;
            }
            let recent_failure = p
                .failure
                .as_ref()
                .is_some_and(|f| f.at.elapsed() < RETRY_UNDER_PRESSURE);
            if let Some(f) = p.failure.clone().filter(|_| recent_failure) {
                result = Err(FsError::Failed(f.message, f.errno));
                continue;
            }
            if let Err(e) = self.write_pending(&p, mode) {
                result = Err(e);
            }
        }
        result
    }

    /// Takes the name `rel` from `file` (if it still has it), and its bytes from the
    /// pending-memory account.
    pub(crate) fn drop_temp_if(&self, rel: &Path, file: &Arc<MemFile>) {
        if self.temps.remove_if(rel, file) {
            self.shards.charge(-(file.len() as i64));
        }
    }

    /// `persist_temp`, with no rename or unlink of the file in between: under the gate,
    /// and only if the name still holds this very file.
    pub(crate) fn persist_temp_if_there(
        &self,
        rel: &Path,
        file: &Arc<MemFile>,
        durable: bool,
    ) -> Result<(), FsError> {
        let _gate = self.gate.exclusive();
        if !self.temps.file(rel).is_some_and(|f| Arc::ptr_eq(&f, file)) {
            return Ok(());
        }
        self.persist_temp(rel, file, durable)
    }

    /// Writes a temporary file that was never renamed to BACKING, as it is, at its path
    /// (`durable`: synced, with its name).
    pub(crate) fn persist_temp(
        &self,
        rel: &Path,
        file: &Arc<MemFile>,
        durable: bool,
    ) -> Result<(), FsError> {
        if is_lock_name(rel) {
            // A tensorstore lock file whose writer never renamed it (it gave up or died):
            // tensorstore ignores such files, and in BACKING the name is a shard's lock.
            self.drop_temp_if(rel, file);
            info!(file = %rel.display(), "abandoned lock file dropped");
            return Ok(());
        }
        self.still_where_made(file)?;
        let segments = file.snapshot().data.segments();
        let made = Some(file.with(|s| s.changed));
        let written = match self
            .tree
            .write_whole(rel, &segments, durable, file.maker(), made)
            .map_err(FsError::from)
        {
            Err(e) if e.lost_to_another_node() => {
                self.forsake_lost(rel, file);
                return Err(e);
            }
            other => other?,
        };
        self.drop_temp_if(rel, file);
        for ino in self.inodes.rekind_file(file, NodeKind::File) {
            self.handles.went_to(ino, &written);
        }
        // (A rename that wrote it out gives it to the renamed inode's handles.)
        file.set_written(written);
        Stats::add(&self.shards.stats().temp_files_persisted, 1);
        info!(file = %rel.display(), "temporary file never renamed: written to BACKING as it is");
        Ok(())
    }

    /// Writes everything pending, durably: every shard, every temporary file (and any
    /// `zarr.json` still being written). Returns what could not be written.
    pub fn flush_all(&self) -> Vec<String> {
        self.flush_below_path(Path::new(""))
    }

    /// `flush_all`, for what lies below `below` only (files held in memory, shards of
    /// arrays there); everything written is made durable.
    pub fn flush_below_path(&self, below: &Path) -> Vec<String> {
        let mut failed = Vec::new();
        for (rel, file) in self.temps.all_files() {
            if !rel.starts_with(below) {
                continue;
            }
            let result = self.contain("writing a file at unmount", || self.flush_temp(&rel, &file));
            let result = result.unwrap_or_else(|| Err(internal_error()));
            if let Err(e) = result {
                self.note_refusal(&e);
                failed.push(format!("{}: {e}", self.backing.path(&rel).display()));
            }
        }
        for p in self.shards.pending() {
            if !p.array.rel.starts_with(below) && !below.starts_with(&p.array.rel) {
                continue;
            }
            if let Err(e) = self.write_pending(&p, WriteMode::Everything) {
                self.note_refusal(&e);
                let shard = self.shards.describe(&p.array.shard_rel(&p.shard));
                failed.push(format!("{shard}: {e}"));
            }
        }
        // Everything written is made durable at once (one syncfs), and the journal's
        // records of it retire.
        if let Err(e) = self.shards.make_all_durable(&self.backing) {
            failed.push(format!(
                "{}: not made durable: {e}",
                self.backing.root().display()
            ));
        }
        *crate::sync::lock(&self.shards.stats().not_written) = failed.clone();
        failed
    }

    /// Writes one file held in memory: a `zarr.json` is committed, anything else goes to
    /// BACKING as it is.
    fn flush_temp(&self, rel: &Path, file: &Arc<MemFile>) -> Result<(), FsError> {
        if rel.file_name() != Some(METADATA_FILE.as_ref()) {
            return self.persist_temp_if_there(rel, file, false);
        }
        let _gate = self.gate.exclusive();
        self.still_where_made(file)?;
        let data = file.snapshot().data;
        let dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        match self.commit_metadata(
            &dir,
            &data.read(0, data.len()),
            Some(file.with(|s| s.changed)),
        ) {
            // Truncated and never written (its writer still had it open): the document
            // stays as it was.
            Err(FsError::Refused(r)) if data.is_empty() => {
                info!(file = %rel.display(), "an emptied zarr.json left as it was: {r}");
            }
            Err(e) if e.lost_to_another_node() => {
                self.forsake_lost(rel, file);
                return Err(e);
            }
            other => other?,
        }
        self.drop_temp_if(rel, file);
        Ok(())
    }

    /// A file held in memory whose publication lost to another node's newer version: it
    /// is dropped, never tried again over that version, and its name shows the version
    /// the mount took from the store.
    pub(crate) fn forsake_lost(&self, rel: &Path, file: &Arc<MemFile>) {
        warn!(file = %rel.display(), "another node changed it first: this mount's version dropped");
        self.drop_temp_if(rel, file);
        let kind = self.resolve_path(rel).unwrap_or(NodeKind::File);
        self.inodes.rekind_file(file, kind);
    }

    /// The tally of the kernel's requests, which the FUSE adapter counts into.
    pub fn requests(&self) -> &crate::core::stats::Requests {
        &self.shards.stats().requests
    }

    pub fn stats(&self) -> StatsReport {
        let pending = self.shards.pending();
        let mut report = self.shards.stats().report();
        report.pending_shards = pending.len() as u64;
        report.pending_chunks = pending.iter().map(|p| p.chunks as u64).sum();
        report.pending_bytes = self.shards.pending_bytes();
        report.temp_files = self.temps.count() as u64;
        (report.index_cache_entries, report.index_cache_bytes) = self.shards.cache_usage();
        if let Some(j) = self.shards.journal() {
            report.journal = j.report();
        }
        report.failed = pending
            .iter()
            .filter_map(|p| {
                let f = p.failure.as_ref()?;
                let shard = self.shards.describe(&p.array.shard_rel(&p.shard));
                Some(format!("{shard}: {}", f.message))
            })
            .collect();
        for f in crate::sync::lock(&self.shards.stats().not_written).iter() {
            if !report.failed.contains(f) {
                report.failed.push(f.clone());
            }
        }
        report.failed.truncate(100);
        report.store_requests = self.shards.store_requests();
        report.refusals = self.refusals.count();
        report.passthrough = self.passthrough.describe();
        report
    }
}

/// Whether `rel` is named like a lock file (tensorstore's `KEY.__lock`): in BACKING that
/// name is a shard's lock, so such a file is never written out there.
pub(crate) fn is_lock_name(rel: &Path) -> bool {
    rel.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(crate::backing::lock::LOCK_SUFFIX))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;
    use std::ffi::OsStr;

    use super::*;
    use crate::backing::Backing;
    use crate::backing::lock::Durability;
    use crate::core::fs::namespace::Caller;
    use crate::core::shards::PANIC_IN_SHARD_WRITE;
    use crate::core::{DaemonInfo, ROOT};

    thread_local! {
        /// Makes `tick` on this thread panic (tests of panic containment).
        pub(crate) static PANIC_IN_TICK: Cell<bool> = const { Cell::new(false) };
    }

    const ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"uint8",
        "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},
        "chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
        "fill_value":0,"codecs":[{"name":"bytes"}]}"#;

    /// A core over a fresh BACKING holding array `a` (two chunks per shard) with chunk 0
    /// pending and closed.
    fn core_with_pending_chunk() -> (tempfile::TempDir, ShardFs) {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::core::WriteConfig {
            policy: crate::zarr::ShardPolicy::Explicit("2".parse().unwrap()),
            ..Default::default()
        };
        let backing = Backing::new(dir.path().to_path_buf()).unwrap();
        let fs = ShardFs::with_config(backing, DaemonInfo::default(), config);
        let a = fs
            .mkdir(ROOT, OsStr::new("a"), 0o755, Caller::daemon())
            .unwrap()
            .ino;
        let (_, meta) = fs
            .create(
                a,
                OsStr::new("zarr.json"),
                0o644,
                libc::O_WRONLY,
                Caller::daemon(),
            )
            .unwrap();
        fs.write(meta.fh, 0, ARRAY.as_bytes()).unwrap();
        fs.release(meta.fh).unwrap();
        let c = fs
            .mkdir(a, OsStr::new("c"), 0o755, Caller::daemon())
            .unwrap()
            .ino;
        let (_, chunk) = fs
            .create(c, OsStr::new("0"), 0o644, libc::O_WRONLY, Caller::daemon())
            .unwrap();
        fs.write(chunk.fh, 0, b"xy").unwrap();
        fs.release(chunk.fh).unwrap();
        (dir, fs)
    }

    /// A core with a journal over BACKING `dir` (two chunks per shard, shards written as
    /// soon as they are idle), holding array `a` whose shard holds chunk 1, and chunk 0
    /// written, fsynced (a record in the journal's segments: the shard exists) and closed.
    fn journaled_core_with_fsynced_chunk(dir: &Path) -> ShardFs {
        let config = crate::core::WriteConfig {
            policy: crate::zarr::ShardPolicy::Explicit("2".parse().unwrap()),
            idle_flush: std::time::Duration::ZERO,
            ..Default::default()
        };
        let backing = Backing::new(dir.to_path_buf()).unwrap();
        let fs = ShardFs::with_config(backing, DaemonInfo::default(), config)
            .with_journal()
            .unwrap();
        let caller = Caller::daemon();
        let a = fs.mkdir(ROOT, OsStr::new("a"), 0o755, caller).unwrap().ino;
        let doc = OsStr::new("zarr.json");
        let (_, meta) = fs.create(a, doc, 0o644, libc::O_WRONLY, caller).unwrap();
        fs.write(meta.fh, 0, ARRAY.as_bytes()).unwrap();
        fs.release(meta.fh).unwrap();
        let c = fs.mkdir(a, OsStr::new("c"), 0o755, caller).unwrap().ino;
        let (_, chunk) = fs
            .create(c, OsStr::new("1"), 0o644, libc::O_WRONLY, caller)
            .unwrap();
        fs.write(chunk.fh, 0, b"ab").unwrap();
        fs.release(chunk.fh).unwrap();
        assert!(fs.flush_all().is_empty());
        let (attr, chunk) = fs
            .create(c, OsStr::new("0"), 0o644, libc::O_WRONLY, caller)
            .unwrap();
        fs.write(chunk.fh, 0, b"xy").unwrap();
        fs.fsync(attr.ino, Some(chunk.fh)).unwrap();
        fs.release(chunk.fh).unwrap();
        fs
    }

    /// A shard write that begins while an fsync's record is being appended waits until the
    /// record is booked, and so retires it durably under the key lock too (it was retired
    /// later, outside the lock, by the fsync itself): tensorstore, writing the chunk back to
    /// what it was in between, would be undone by a replay after a power cut.
    #[test]
    fn a_shard_write_racing_an_fsync_retires_its_record_durably() {
        use crate::core::shards::PAUSE_BEFORE_APPEND;
        let dir = tempfile::tempdir().unwrap();
        let fs = std::sync::Arc::new(journaled_core_with_fsynced_chunk(dir.path()));
        // Chunk 0 again, fsynced by another thread that stops before its append.
        let a = fs.lookup(ROOT, OsStr::new("a")).unwrap().ino;
        let c = fs.lookup(a, OsStr::new("c")).unwrap().ino;
        let (attr, chunk) = fs
            .create(c, OsStr::new("0"), 0o644, libc::O_WRONLY, Caller::daemon())
            .unwrap();
        fs.write(chunk.fh, 0, b"zz").unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let fsync = {
            let (fs, barrier) = (fs.clone(), barrier.clone());
            std::thread::spawn(move || {
                PAUSE_BEFORE_APPEND.set(Some(barrier));
                fs.fsync(attr.ino, Some(chunk.fh)).unwrap();
            })
        };
        barrier.wait();
        let write = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for p in fs.shards.pending() {
                    fs.write_pending(&p, crate::core::shards::WriteMode::Everything)
                        .unwrap();
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        barrier.wait();
        // The record is booked; the fsync has not yet made anything else durable.
        barrier.wait();
        write.join().unwrap();
        // The shard write is over and its key free: tensorstore may write it now. Nothing
        // that write made obsolete may be live in the journal, nor anything unsynced.
        let journal = fs.shards.journal().unwrap().clone();
        assert_eq!(
            journal.report().live_records,
            0,
            "a record live behind the shard write"
        );
        assert!(journal.all_synced());
        barrier.wait();
        fsync.join().unwrap();
        fs.release(chunk.fh).unwrap();
        supersede_and_cut_the_power(dir.path(), fs);
    }

    /// tensorstore takes the lock of `a`'s shard the moment the mount lets go of it, and
    /// writes chunk 0 back to its earlier state (absent; no stamps); the power goes (with
    /// everything synced, asserted, the files are what a cut leaves); the next mount
    /// replays, and must leave tensorstore's shard as it is.
    fn supersede_and_cut_the_power(dir: &Path, fs: std::sync::Arc<ShardFs>) {
        let native = Backing::new(dir.to_path_buf()).unwrap();
        let tensorstore = native.lock_key(Path::new("a/c/0")).unwrap();
        let journal = fs.shards.journal().unwrap().clone();
        assert!(journal.all_synced(), "the retirement waits for a sync");
        let mut index = Vec::new();
        for (offset, nbytes) in [(u64::MAX, u64::MAX), (0, 2)] {
            index.extend_from_slice(&offset.to_le_bytes());
            index.extend_from_slice(&nbytes.to_le_bytes());
        }
        let crc = crc32c::crc32c(&index).to_le_bytes();
        let shard = [b"ab".as_slice(), &index, &crc].concat();
        tensorstore
            .replace(&[bytes::Bytes::from(shard.clone())], Durability::Now)
            .unwrap();
        drop(tensorstore);
        drop(fs);
        drop(journal);
        let next = ShardFs::with_config(
            Backing::new(dir.to_path_buf()).unwrap(),
            DaemonInfo::default(),
            crate::core::WriteConfig::default(),
        )
        .with_journal()
        .unwrap();
        next.replay_journals().unwrap();
        assert_eq!(
            std::fs::read(dir.join("a/c/0")).unwrap(),
            shard,
            "a retired record came back over tensorstore's write"
        );
    }

    /// A shard write that retires a journal record makes the retirement durable before it
    /// lets go of the shard's key lock: tensorstore, which takes that lock next and puts no
    /// stamps in its shards, removes the chunk, and a power cut then must not bring the
    /// record back over its removal at the next mount's replay.
    #[test]
    fn a_retirement_is_durable_before_anyone_may_supersede_the_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let fs = journaled_core_with_fsynced_chunk(dir.path());
        // The idle flusher's shard write, alone (the pass would go on to sync what it
        // wrote, and retire the record then).
        for p in fs.shards.pending() {
            fs.write_pending(&p, crate::core::shards::WriteMode::Settled)
                .unwrap();
        }
        assert!(dir.path().join("a/c/0").is_file(), "the shard is written");
        supersede_and_cut_the_power(dir.path(), std::sync::Arc::new(fs));
    }

    #[test]
    fn a_panic_in_a_shard_write_leaves_its_chunks_pending() {
        let (dir, fs) = core_with_pending_chunk();
        assert_eq!(fs.stats().pending_chunks, 1);
        PANIC_IN_SHARD_WRITE.set(true);
        let failed = fs.flush_all();
        PANIC_IN_SHARD_WRITE.set(false);
        assert_eq!(failed.len(), 1, "{failed:?}");
        let s = fs.stats();
        assert_eq!((s.panics, s.pending_chunks, s.shards_written), (1, 1, 0));
        assert!(!dir.path().join("a/c/0").exists());
        // The next write takes the chunk as it was: nothing was lost or left half done.
        assert!(fs.flush_all().is_empty());
        assert_eq!(fs.stats().pending_chunks, 0);
        assert!(dir.path().join("a/c/0").exists());
        assert!(!dir.path().join("a/c/0.__lock").exists());
    }

    #[test]
    fn a_panicking_flusher_pass_is_contained_and_counted() {
        let (_dir, fs) = core_with_pending_chunk();
        PANIC_IN_TICK.set(true);
        assert!(fs.contain("the background flusher", || fs.tick()).is_none());
        PANIC_IN_TICK.set(false);
        assert_eq!(fs.stats().panics, 1);
        // The next pass works, and so does everything else.
        assert!(fs.contain("the background flusher", || fs.tick()).is_some());
        assert!(fs.flush_all().is_empty());
    }
}

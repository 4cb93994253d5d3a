//! Writing a shard: its pending chunks and the chunks of the shard file that stay, as one
//! new file, under the key lock (`crate::backing::lock`), so that other mounts and
//! tensorstore writers sharing BACKING never lose a chunk to a concurrent merge.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tracing::{debug, error, warn};

use super::super::array::lock;
use super::super::error::FsError;
use super::super::memfile::MemFile;
use super::super::stats::Stats;
use super::stored::{StoredIndex, open_shard};
use super::{Failure, ShardRegistry, ShardSlot};
use crate::backing::Backing;
use crate::backing::lock::Durability;
use crate::errno::ToErrno;
use crate::shard::{IndexFormat, ShardBuilder, read_chunk_part};

/// What a shard write includes. Every shard write is durable: file synced, then renamed,
/// then its directory synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every position is accounted for: no merge expected.
    Complete,
    /// Whatever is pending and settled (idle, memory pressure).
    Settled,
    /// Everything pending, also chunks still open for writing (fsync, unmount).
    Everything,
    /// Everything pending, and nothing of the file now at the shard's path, which is not
    /// a shard (a chunk file written before its array's metadata, already read in).
    Replace,
}

/// A pending chunk as taken for one write: its position, the file, the version of its
/// content taken, and that content.
type Chosen = (usize, Arc<MemFile>, u64, Vec<Bytes>);

/// What one shard write found and did.
struct Written {
    stored: Option<StoredIndex>,
}

impl ShardRegistry {
    /// Writes the slot's shard: its pending chunks (per `mode`) and the chunks of the
    /// existing shard file that stay, as one new file; or removes the file when nothing is
    /// left. On failure, a panic included, the pending chunks stay pending and the failure
    /// is recorded.
    pub(super) fn write_slot(
        &self,
        backing: &Backing,
        slot: &ShardSlot,
        mode: WriteMode,
    ) -> Result<(), FsError> {
        let _writer = lock(&slot.writing);
        let array = &slot.array;
        let rel = array.shard_rel(&slot.shard);
        // What goes into the new file, taken under the lock; the I/O happens outside it.
        let (chosen, deleted, done, cached) = {
            let st = lock(&slot.state);
            let chosen: Vec<Chosen> = st
                .pending
                .iter()
                .filter(|(_, m)| {
                    matches!(mode, WriteMode::Everything | WriteMode::Replace) || m.settled()
                })
                .map(|(pos, m)| {
                    let snap = m.snapshot();
                    (*pos, m.clone(), snap.version, snap.data.segments())
                })
                .collect();
            if chosen.is_empty() && st.deleted.is_empty() {
                return Ok(());
            }
            (
                chosen,
                st.deleted.clone(),
                st.done.clone(),
                st.stored.clone(),
            )
        };
        let format = array.layout.index.clone();
        let job = ShardJob {
            backing,
            rel: &rel,
            format: &format,
            chosen: &chosen,
            deleted: &deleted,
            cached: cached.as_ref(),
            mode,
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(self)))
            .unwrap_or_else(|panic| {
                Stats::add(&self.stats.panics, 1);
                error!(shard = %backing.path(&rel).display(),
                    "internal error while writing the shard; its chunks stay pending: {}",
                    panic_text(&panic));
                Err(FsError::Io(std::io::Error::other("internal error")))
            });
        let mut st = lock(&slot.state);
        match result {
            Ok(written) => {
                let mut durable = Vec::new();
                for (pos, m, version, _) in &chosen {
                    // Retired under the file's own lock only if unchanged since the
                    // snapshot; a writer that comes later finds it retired and starts again
                    // from the shard just written.
                    let current = st.pending.get(pos).is_some_and(|cur| Arc::ptr_eq(cur, m));
                    if current && m.retire_at(*version) {
                        st.pending.remove(pos);
                        self.charge(-(m.len() as i64));
                        durable.extend(m.take_records());
                    }
                    // What this content replaced is in the shard no more.
                    durable.extend(st.superseded.remove(pos).unwrap_or_default());
                }
                for pos in &deleted {
                    durable.extend(st.superseded.remove(pos).unwrap_or_default());
                }
                for pos in &deleted {
                    st.deleted.remove(pos);
                }
                self.set_stored(&mut st, written.stored);
                if mode == WriteMode::Complete {
                    // The round is over for what was done when it was taken; positions done
                    // while the write was in flight belong to the next round.
                    st.done.retain(|p| !done.contains(p));
                }
                st.failure = None;
                drop(st);
                // The records of what it holds retire once the shard is durable.
                self.note_unsynced(array, &slot.shard, durable);
                // The new index counts against the cache (checked with no slot locked).
                self.evict_if_over();
                Ok(())
            }
            Err(e) => {
                Stats::add(&self.stats.write_errors, 1);
                warn!(shard = %backing.path(&rel).display(), "shard write failed, data kept in memory: {e}");
                st.failure = Some(Failure {
                    errno: e.to_errno(),
                    message: e.to_string(),
                    at: Instant::now(),
                });
                Err(e)
            }
        }
    }
}

/// One shard write: what to write, and against what.
struct ShardJob<'a> {
    backing: &'a Backing,
    rel: &'a Path,
    format: &'a IndexFormat,
    chosen: &'a [Chosen],
    deleted: &'a BTreeSet<usize>,
    cached: Option<&'a StoredIndex>,
    mode: WriteMode,
}

impl ShardJob<'_> {
    /// Under the key lock: reads the shard file as it is now, builds the new one from the
    /// chunks that stay and the chosen ones, and puts it in place (or removes the file).
    fn run(&self, reg: &ShardRegistry) -> Result<Written, FsError> {
        let key = self.backing.lock_key(self.rel)?;
        #[cfg(test)]
        if super::super::flush::tests::PANIC_IN_SHARD_WRITE.get() {
            panic!("injected panic half-way through a shard write");
        }
        let current = match self.mode {
            WriteMode::Replace => None,
            _ => open_shard(self.backing, self.rel, self.format, self.cached)?,
        };
        let mut builder = ShardBuilder::new(self.format.clone());
        if let Some(open) = &current {
            self.keep_stored(reg, &mut builder, &open.file, &open.stored)?;
        }
        for (pos, _, _, segments) in self.chosen {
            builder.set(*pos, segments.clone());
        }
        let Some(encoded) = builder.build() else {
            let dir = key.dir_rel().to_path_buf();
            if key.remove()? {
                Stats::add(&reg.stats.shards_deleted, 1);
                debug!(shard = %self.rel.display(), "shard removed: no chunk left");
            }
            self.backing
                .prune_empty_dirs(&dir, dir.ancestors().last().unwrap_or(&dir));
            return Ok(Written { stored: None });
        };
        // A sync costs only what was asked for: a shard that replaces one is synced before
        // its rename (the old data must never be lost to a torn file); a new one is not.
        // Either is made durable later, when a writer's fsync, the background pass or the
        // unmount asks (`ShardRegistry::make_durable`).
        let durability = match current {
            Some(_) => Durability::DataBeforeRename,
            None => Durability::Later,
        };
        let meta = key.replace(encoded.buffers(), durability)?;
        Stats::add(&reg.stats.shards_written, 1);
        Stats::add(&reg.stats.bytes_written, encoded.len());
        if self.mode != WriteMode::Complete {
            Stats::add(&reg.stats.partial_writes, 1);
        }
        debug!(shard = %self.rel.display(), bytes = encoded.len(), mode = ?self.mode, "shard written");
        Ok(Written {
            stored: Some(StoredIndex {
                format: self.format.clone(),
                version: crate::backing::FileVersion::of(&meta),
                mtime: crate::backing::mtime_of(&meta),
                index: Ok(Arc::new(encoded.index().clone())),
            }),
        })
    }

    /// Puts the chunks of the current shard file that stay into `builder` (a merge). A
    /// damaged file can only be replaced when nothing of it is kept.
    fn keep_stored(
        &self,
        reg: &ShardRegistry,
        builder: &mut ShardBuilder,
        file: &std::fs::File,
        stored: &StoredIndex,
    ) -> Result<(), FsError> {
        let replaced: BTreeSet<usize> = self.chosen.iter().map(|(p, ..)| *p).collect();
        let gone = |p: &usize| replaced.contains(p) || self.deleted.contains(p);
        let index = match &stored.index {
            Ok(index) => index,
            Err(e) => {
                if (0..self.format.n_chunks()).any(|p| !gone(&p)) {
                    return Err(FsError::Invalid(format!(
                        "{}: cannot merge into a damaged shard ({e})",
                        self.backing.path(self.rel).display()
                    )));
                }
                return Ok(());
            }
        };
        let mut merged = false;
        for (pos, range) in index.present().filter(|(p, _)| !gone(p)) {
            let bytes = read_chunk_part(file, range, 0, range.nbytes)?;
            builder.set(pos, vec![Bytes::from(bytes)]);
            merged = true;
        }
        if merged {
            Stats::add(&reg.stats.merges, 1);
        }
        Ok(())
    }
}

/// The message of a caught panic.
pub fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

//! Shard bodies: the journal records of one new shard, in a file of their own that becomes
//! the shard.
//!
//! A fsynced chunk must be written twice with a shared journal: once as a record, once in
//! its shard. For a shard that does not exist yet, its records go instead into a body file
//! in the journal directory (`<id>.bNNNNNN.body`: a layout record, then chunk records, the
//! same format as a segment). The shard's index can point straight at the chunk bytes
//! inside those records (a shard may hold bytes no index entry names), so completing the
//! shard appends only what was never fsynced and the index, syncs, and renames the body
//! onto the shard's key. The chunks are written once.
//!
//! Until then a body is replayed like a segment. Its records are never retired one by one:
//! a body is either renamed into its shard (everything it holds is in there, or superseded
//! by what is), or removed, durably, once none of its records is live (its shard was
//! written another way).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tracing::warn;

use super::{Entry, JOURNAL_DIR, Journal, RecordRef, append_at, create, record};
use crate::shard::ChunkRange;
use crate::sync::lock;

/// The body file of one pending shard.
#[derive(Debug)]
pub struct Body {
    /// Relative to BACKING.
    path: PathBuf,
    file: Mutex<BodyFile>,
}

#[derive(Debug)]
pub struct BodyFile {
    file: Arc<File>,
    len: u64,
    /// Taken by a shard write: nothing more is appended.
    finished: bool,
}

/// Where a body's bookkeeping stands, for retirement and stats.
#[derive(Debug, Default)]
pub(super) struct BodyEntry {
    pub(super) live: u64,
    pub(super) bytes: u64,
    /// No longer appended to (its shard was written, or tried): it goes once nothing in it
    /// is live.
    pub(super) finished: bool,
    /// Some of its records are retired: the segments holding those retirements stay while
    /// it does.
    pub(super) retired_some: bool,
}

/// A chunk appended to a body: its record, and where its bytes are in the file.
#[derive(Clone, Debug)]
pub struct BodyChunk {
    pub record: RecordRef,
    pub range: ChunkRange,
}

/// A body being turned into its shard. Holding it keeps appenders out for good.
pub struct Finishing<'a> {
    body: &'a Body,
    file: MutexGuard<'a, BodyFile>,
}

/// Whether `path` names a body (rather than a segment).
pub(super) fn is_body(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "body")
}

impl Journal {
    /// Begins the body of a new shard of the array at `array` (which array: `instance`),
    /// whose sharded `zarr.json` is `meta`. Its name is durable when this returns.
    pub fn begin_body(&self, array: &Path, instance: &str, meta: &[u8]) -> io::Result<Arc<Body>> {
        let n = self.next_body.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(JOURNAL_DIR).join(format!("{}.b{n:06}.body", self.id));
        // Readable like any shard: it becomes one.
        let file = self.backing.open_file(&path, create(0o644))?;
        let head = record::encode_layout(0, &array.to_string_lossy(), instance, meta);
        let written = file
            .write_all_at(&head, 0)
            .and_then(|_| self.backing.sync_dir(Path::new(JOURNAL_DIR)));
        if let Err(e) = written {
            let _ = self.backing.remove_file(&path);
            return Err(e);
        }
        let len = head.len() as u64;
        lock(&self.bodies).insert(
            path.clone(),
            BodyEntry {
                bytes: len,
                ..BodyEntry::default()
            },
        );
        Ok(Arc::new(Body {
            path,
            file: Mutex::new(BodyFile {
                file: Arc::new(file),
                len,
                finished: false,
            }),
        }))
    }

    /// Appends `entries` to `body` and makes them durable. `Ok(None)`: the body was taken
    /// by a shard write meanwhile, and nothing was appended.
    pub fn append_body(
        &self,
        body: &Body,
        entries: &[Entry],
    ) -> io::Result<Option<Vec<BodyChunk>>> {
        self.trusted()?;
        let (file, chunks) = {
            let mut b = lock(&body.file);
            if b.finished {
                return Ok(None);
            }
            let mut buffers: Vec<Bytes> = Vec::new();
            let mut chunks = Vec::with_capacity(entries.len());
            let mut at = b.len;
            for e in entries {
                let id = e.id;
                // A body holds chunks only; removals go to the shared segments.
                let data = e.data.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "a removal for a body")
                })?;
                let bufs = record::encode_chunk(0, id, e.coords, e.stamp(), data);
                let head = bufs[0].len() as u64;
                let nbytes: u64 = data.iter().map(|d| d.len() as u64).sum();
                chunks.push(BodyChunk {
                    record: RecordRef {
                        segment: body.path.clone(),
                        id,
                    },
                    range: ChunkRange {
                        offset: at + head,
                        nbytes,
                    },
                });
                at += head + nbytes;
                buffers.extend(bufs);
            }
            b.len = append_at(&b.file, &buffers, b.len)?;
            debug_assert_eq!(b.len, at);
            // Counted while the body is still held: a shard write that takes it next must
            // not find it empty and remove it.
            if let Some(entry) = lock(&self.bodies).get_mut(&body.path) {
                entry.live += chunks.len() as u64;
                entry.bytes = at;
            }
            (b.file.clone(), chunks)
        };
        if let Err(e) = self.synced(file.sync_data(), "a journal body") {
            // Never acknowledged: these records hold nobody up.
            if let Some(entry) = lock(&self.bodies).get_mut(&body.path) {
                entry.live = entry.live.saturating_sub(chunks.len() as u64);
            }
            return Err(e);
        }
        self.group_commits.fetch_add(1, Ordering::Relaxed);
        self.journaled_chunks
            .fetch_add(chunks.len() as u64, Ordering::Relaxed);
        Ok(Some(chunks))
    }

    /// Takes `body` for a shard write: from now on nothing is appended to it.
    pub fn finish_body<'a>(&self, body: &'a Body) -> Finishing<'a> {
        let mut file = lock(&body.file);
        file.finished = true;
        Finishing { body, file }
    }

    /// The body became its shard (renamed onto the shard's key, durably): it is gone from
    /// the journal, and with it every record it held.
    pub fn body_consumed(&self, body: &Finishing) {
        lock(&self.bodies).remove(&body.body.path);
    }

    /// The body's shard was written another way (or the write failed): the body goes once
    /// none of its records is live.
    pub fn body_abandoned(&self, body: &Finishing) {
        let gone = match lock(&self.bodies).get_mut(&body.body.path) {
            Some(entry) => {
                entry.finished = true;
                entry.live == 0
            }
            None => false,
        };
        if gone && let Err(e) = self.remove_bodies(std::slice::from_ref(&body.body.path)) {
            warn!(body = %body.body.path.display(), "journal body not removed: {e}");
        }
    }

    /// Retires records of bodies: a finished body with nothing live left is removed, and
    /// the removal is durable before this returns (a body that came back after a crash
    /// could otherwise replay content older than what its shard now holds).
    pub(super) fn retire_body_records(&self, refs: &[&RecordRef]) -> io::Result<()> {
        let gone: Vec<PathBuf> = {
            let mut bodies = lock(&self.bodies);
            for r in refs {
                if let Some(entry) = bodies.get_mut(&r.segment) {
                    entry.live = entry.live.saturating_sub(1);
                    entry.retired_some = true;
                }
            }
            bodies
                .iter()
                .filter(|(_, e)| e.live == 0 && e.finished)
                .map(|(p, _)| p.clone())
                .collect()
        };
        self.remove_bodies(&gone)
    }

    /// Removes finished bodies with nothing live, durably; they leave the books only once
    /// gone (a failure leaves them there, to be tried again at the next retirement).
    fn remove_bodies(&self, paths: &[PathBuf]) -> io::Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        for p in paths {
            self.backing.remove_file(p)?;
        }
        self.backing.sync_dir(Path::new(JOURNAL_DIR))?;
        {
            let mut bodies = lock(&self.bodies);
            for p in paths {
                bodies.remove(p);
            }
        }
        for p in paths {
            self.forget_dead_lock(p);
        }
        // Segments their retirements held back may go now.
        self.retire_empty();
        Ok(())
    }
}

impl Finishing<'_> {
    /// The body's path, relative to BACKING.
    pub fn path(&self) -> &Path {
        &self.body.path
    }

    pub fn len(&self) -> u64 {
        self.file.len
    }

    pub fn is_empty(&self) -> bool {
        self.file.len == 0
    }

    /// Appends `buffers` at the end (no sync). The file then ends there, whatever a
    /// failed append left past its end before: its index must be its last bytes.
    pub fn append(&mut self, buffers: &[Bytes]) -> io::Result<()> {
        self.file.len = append_at(&self.file.file, buffers, self.file.len)?;
        if self.file.file.metadata()?.len() != self.file.len {
            self.file.file.set_len(self.file.len)?;
        }
        Ok(())
    }

    /// Gives the file to `owner`, on its descriptor (it is about to become a shard).
    pub fn give(&self, owner: crate::backing::FileOwner) -> io::Result<()> {
        crate::backing::owner::give(&self.file.file, owner)
    }

    pub fn sync(&self) -> io::Result<()> {
        self.file.file.sync_data()
    }

    /// Its version, as the BACKING store names versions (it became a shard).
    pub fn info(&self) -> io::Result<crate::store::ObjectInfo> {
        crate::store::posix::file_info(&self.file.file)
    }
}

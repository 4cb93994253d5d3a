//! The tree of an object-store mount outside its shards: directories, `zarr.json` documents
//! and other small objects, mirrored into a local directory (the mount's cache) when the
//! mount starts. The core then works on that directory as on any BACKING, with its shards
//! read and written in the store; what the core changes there (a metadata document, a file
//! it holds in memory and writes out) is published to the store as it happens.
//!
//! The cache is the store's: it is emptied and filled again at every mount (the store is
//! the truth, other mounts may have changed it), except for `.shardfs`, where the fsync
//! journal of this node lives. A directory is only ever emptied when it is empty or bears
//! the mark of a cache of the very same store.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tracing::{info, warn};

use super::{Precondition, Store, StoreError};
use crate::backing::{Backing, join_rel};

/// Where the cache marks whose it is.
const MARK: &str = ".shardfs/cache-of";

/// The largest object mirrored (a metadata document, a small file beside the arrays);
/// anything larger stays in the store only.
const MAX_MIRRORED: u64 = 64 << 20;

/// What a mirroring found.
#[derive(Debug, Default)]
pub struct Mirrored {
    pub dirs: u64,
    pub documents: u64,
    pub arrays: u64,
    pub skipped: Vec<String>,
    /// The version (tag) of each object mirrored.
    pub tags: HashMap<PathBuf, String>,
}

/// The store an object-store mount publishes its tree to (metadata documents, files
/// written out), with the version of each object this mount last saw or wrote. A write
/// replaces only that version (`If-Match`), or creates (`If-None-Match`) when this mount
/// knows of none; a removal removes only that version. So a node that saw an old document
/// never overwrites, nor removes, another node's newer one: its write fails (EIO, the
/// reason logged; not ESTALE, which the kernel retries for a rename or an unlink, and the
/// retry would go over the version taken) and its tree takes the store's version
/// (`refresh`), which the next look at it shows.
#[derive(Debug)]
pub struct Published {
    store: Arc<dyn Store>,
    tags: Mutex<HashMap<PathBuf, String>>,
    /// When each object's version was last compared with the store's (`revalidate`).
    checked: Mutex<HashMap<PathBuf, std::time::Instant>>,
    /// When a comparison last went unanswered.
    unanswered: Mutex<Option<std::time::Instant>>,
    /// When the mount took the store's version of an object in place of its own (ns since
    /// the epoch): content made before that was made from what another node replaced, and
    /// is never published over it (`put`).
    taken_at: Mutex<HashMap<PathBuf, u64>>,
}

/// How long a store that left a comparison unanswered is not asked again.
const UNANSWERED_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// How long an object of the tree, once compared with the store, is believed.
const CHECKED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The error of a write that lost to another node's.
fn stale(store: &dyn Store, rel: &Path) -> StoreError {
    StoreError::Io(io::Error::new(
        io::ErrorKind::StaleNetworkFileHandle,
        format!(
            "{} was changed by another node since this mount read it: read it again",
            store.describe(rel)
        ),
    ))
}

impl Published {
    pub fn new(store: Arc<dyn Store>, tags: HashMap<PathBuf, String>) -> Published {
        Published {
            store,
            tags: Mutex::new(tags),
            checked: Mutex::default(),
            unanswered: Mutex::default(),
            taken_at: Mutex::default(),
        }
    }

    /// Takes the store's version of `rel` into `local` when another node changed or
    /// removed it since this mount last saw it: a look (a HEAD) at most once a second, only
    /// at objects this mount knows (a document of its tree). Returns whether it took one.
    /// An absence counts only when the store is seen to be there now and not to have lost
    /// everything (then the tree is published again instead); a store that does not answer
    /// is not asked again for half a minute, the tree staying as seen.
    pub fn revalidate(&self, local: &Backing, rel: &Path) -> bool {
        let Some(known) = lock(&self.tags).get(rel).cloned() else {
            return false;
        };
        {
            let mut checked = lock(&self.checked);
            let quiet = lock(&self.unanswered).is_some_and(|at| at.elapsed() < UNANSWERED_FOR);
            if quiet
                || checked
                    .get(rel)
                    .is_some_and(|at| at.elapsed() < CHECKED_FOR)
            {
                return false;
            }
            checked.insert(rel.to_path_buf(), std::time::Instant::now());
        }
        let changed = match self.store.open(rel, 0) {
            Ok(Some(now)) => now.info().tag != known,
            Ok(None) => !self.store.lost() && self.store.confirm_there().is_ok(),
            Err(e) => {
                warn!(object = %self.store.describe(rel), "not compared with the store (asked again in {} s): {e}", UNANSWERED_FOR.as_secs());
                *lock(&self.unanswered) = Some(std::time::Instant::now());
                false
            }
        };
        if changed {
            info!(object = %self.store.describe(rel), "changed by another node: taken");
            self.refresh(local, rel);
        }
        changed
    }

    fn known(&self, rel: &Path) -> Precondition {
        match lock(&self.tags).get(rel) {
            Some(tag) => Precondition::Matches(tag.clone()),
            None => Precondition::Absent,
        }
    }

    /// Writes `rel` on the condition that the store still has the version this mount
    /// knows (none: that it has none). A conflict takes the store's version into `local`
    /// and fails. `made`: when the content was made (ns since the epoch), if known: content
    /// older than the mount's taking of another node's version (a temporary file written
    /// before, renamed again after a refusal; a document written in place while another
    /// look took the new version) is refused too.
    pub fn put(
        &self,
        local: &Backing,
        rel: &Path,
        parts: &[Bytes],
        made: Option<u64>,
    ) -> Result<(), StoreError> {
        let taken = lock(&self.taken_at).get(rel).copied();
        if let (Some(made), Some(taken)) = (made, taken)
            && made < taken
        {
            return Err(stale(&*self.store, rel));
        }
        match self.store.put(rel, parts, self.known(rel)) {
            Ok(info) => {
                lock(&self.tags).insert(rel.to_path_buf(), info.tag);
                Ok(())
            }
            // A write that landed but whose answer was lost is retried by the client and
            // then finds its own version: that is not another node's.
            Err(StoreError::Conflict(_)) if self.holds(rel, parts) => Ok(()),
            Err(StoreError::Conflict(_)) => {
                self.refresh(local, rel);
                Err(stale(&*self.store, rel))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the store holds `parts` at `rel` now (its tag then known).
    fn holds(&self, rel: &Path, parts: &[Bytes]) -> bool {
        let Ok(Some((bytes, info))) = self.store.get(rel, MAX_MIRRORED) else {
            return false;
        };
        let mine = parts.iter().map(|p| p.len()).sum::<usize>() == bytes.len()
            && parts
                .iter()
                .scan(0, |at, p| {
                    let same = bytes[*at..*at + p.len()] == p[..];
                    *at += p.len();
                    Some(same)
                })
                .all(|same| same);
        if mine {
            lock(&self.tags).insert(rel.to_path_buf(), info.tag);
        }
        mine
    }

    /// Removes `rel` if the store still has the version this mount knows. Returns whether
    /// there was one; a conflict takes the store's version into `local` and fails.
    pub fn delete(&self, local: &Backing, rel: &Path) -> Result<bool, StoreError> {
        let when = self.known(rel);
        let when = match when {
            // Known to no one here: whatever is there (nothing, as far as this mount knows).
            Precondition::Absent => Precondition::None,
            known => known,
        };
        match self.store.delete(rel, when) {
            Ok(was) => {
                lock(&self.tags).remove(rel);
                Ok(was)
            }
            Err(StoreError::Conflict(_)) => {
                self.refresh(local, rel);
                Err(stale(&*self.store, rel))
            }
            Err(e) => Err(e),
        }
    }

    /// Takes the store's version of `rel` (or its absence) into `local` and its tag.
    fn refresh(&self, local: &Backing, rel: &Path) {
        // On the clock the files' times are taken on (`memfile::now_ns`), as `put` compares.
        let now = crate::core::pending::memfile::now_ns();
        lock(&self.taken_at).insert(rel.to_path_buf(), now);
        let got = match self.store.get(rel, MAX_MIRRORED) {
            Ok(got) => got,
            Err(e) => {
                warn!(object = %self.store.describe(rel), "not read again: {e}");
                return;
            }
        };
        let mut tags = lock(&self.tags);
        let done = match got {
            Some((bytes, info)) => {
                tags.insert(rel.to_path_buf(), info.tag);
                local.write_atomic(rel, &[bytes], false, None).map(|_| ())
            }
            None => {
                tags.remove(rel);
                local.remove_file(rel).map(|_| ())
            }
        };
        if let Err(e) = done {
            warn!(object = %self.store.describe(rel), "the store's version not taken: {e}");
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes `cache` (made if missing) the local tree of the store at `url`: emptied (but for
/// the journal) and filled from the store. The returned file holds the cache for this
/// mount (an OFD lock): a second mount of the same cache is refused while it is open.
pub fn prepare(store: &dyn Store, url: &str, cache: &Path) -> io::Result<(Mirrored, File)> {
    // (Modes given: the daemon runs with umask 0.)
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o755)
        .create(cache)?;
    claim(url, cache)?;
    let held = File::options()
        .read(true)
        .write(true)
        .open(cache.join(MARK))?;
    if !crate::backing::lock::try_lock(&held)? {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} is the cache of a mount that is running",
                cache.display()
            ),
        ));
    }
    empty_but_journal(cache)?;
    let local = Backing::new(cache.to_path_buf())?;
    let mut found = Mirrored::default();
    pull_dir(store, &local, Path::new(""), &mut found).map_err(io::Error::from)?;
    info!(url, cache = %cache.display(), dirs = found.dirs, documents = found.documents,
        arrays = found.arrays, "object store mirrored");
    Ok((found, held))
}

/// Refuses a directory that holds something other than a cache of `url`; marks it.
fn claim(url: &str, cache: &Path) -> io::Result<()> {
    let mark = cache.join(MARK);
    match std::fs::read_to_string(&mark) {
        Ok(owner) if owner.trim() == url => return Ok(()),
        Ok(owner) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} is the cache of {}, not of {url}: give another --cache-dir",
                    cache.display(),
                    owner.trim()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if std::fs::read_dir(cache)?.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is not empty and not a shardfs cache: give an empty or new --cache-dir",
                cache.display()
            ),
        ));
    }
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o755)
        .create(mark.parent().unwrap_or(cache))?;
    let mut f = std::os::unix::fs::OpenOptionsExt::mode(
        File::options().write(true).create(true).truncate(true),
        0o644,
    )
    .open(&mark)?;
    std::io::Write::write_all(&mut f, format!("{url}\n").as_bytes())
}

fn empty_but_journal(cache: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(cache)? {
        let entry = entry?;
        if entry.file_name() == ".shardfs" {
            continue;
        }
        let path: PathBuf = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Whether `e` says that a key cannot be a file or directory of the tree: a name longer
/// than a file system takes, or an object named like a directory (`x` beside `x/y`).
fn unshowable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENAMETOOLONG | libc::ENOTDIR | libc::EISDIR | libc::EEXIST)
    )
}

/// Skips `key`, which the tree cannot show (`unshowable`), saying why.
fn skip(found: &mut Mirrored, key: &Path, e: &io::Error) {
    found.skipped.push(key.display().to_string());
    warn!(key = %key.display(), "not shown: {e}");
}

fn pull_dir(
    store: &dyn Store,
    local: &Backing,
    dir: &Path,
    found: &mut Mirrored,
) -> Result<(), StoreError> {
    let listing = store.list(dir)?;
    if let Err(e) = local.create_dir_all(dir) {
        if unshowable(&e) {
            skip(found, dir, &e);
            return Ok(());
        }
        return Err(e.into());
    }
    found.dirs += 1;
    // The document first: below an array everything else is its key tree (shards, which
    // stay in the store), whatever the key encoding makes of their names.
    let mut is_array = false;
    if listing.objects.iter().any(|n| n == "zarr.json") {
        let key = join_rel(dir, "zarr.json".as_ref());
        if let Some(got) = store.get(&key, MAX_MIRRORED).transpose() {
            let bytes = keep_file(local, &key, got, found)?;
            found.documents += 1;
            is_array = bytes.is_some_and(|b| is_array_document(&b));
        }
    }
    if !is_array {
        let others: Vec<PathBuf> = listing
            .objects
            .iter()
            .filter(|n| n.as_str() != "zarr.json")
            .filter(|n| !(dir.as_os_str().is_empty() && n.starts_with(".shardfs")))
            .map(|n| join_rel(dir, n.as_ref()))
            .collect();
        pull_files(store, local, &others, found)?;
    }
    if is_array {
        // Below an array is its key tree: shards, read from the store as they are needed.
        found.arrays += 1;
        return Ok(());
    }
    for name in &listing.dirs {
        if dir.as_os_str().is_empty() && name == ".shardfs" {
            continue;
        }
        pull_dir(store, local, &join_rel(dir, name.as_ref()), found)?;
    }
    Ok(())
}

/// Objects fetched at once while the tree is mirrored: thousands of small files beside the
/// arrays (logs, thumbnails) must not cost a round trip each, one after the other.
const PARALLEL_GETS: usize = 32;
/// Objects fetched before they are written into the mirror (what is held in memory).
const GETS_PER_BATCH: usize = 256;

/// Copies the store's files `keys` into the mirror, `PARALLEL_GETS` at a time, each
/// written as it arrives (at most that many files held in memory).
fn pull_files(
    store: &dyn Store,
    local: &Backing,
    keys: &[PathBuf],
    found: &mut Mirrored,
) -> Result<(), StoreError> {
    for batch in keys.chunks(GETS_PER_BATCH) {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let kept: Mutex<Vec<Option<Fetched>>> =
            Mutex::new((0..batch.len()).map(|_| None).collect());
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL_GETS.min(batch.len()) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(key) = batch.get(i) else { break };
                        let one = store.get(key, MAX_MIRRORED).map(|got| {
                            got.map(|got| write_file(local, key, got).map(|(_, kept)| kept))
                        });
                        lock(&kept)[i] = Some(one.and_then(|o| o.transpose()));
                    }
                });
            }
        });
        let kept = kept.into_inner().unwrap_or_else(|e| e.into_inner());
        for (key, one) in batch.iter().zip(kept) {
            match one {
                // Removed since it was listed.
                None | Some(Ok(None)) => {}
                Some(Ok(Some(kept))) => note_kept(found, key, kept),
                Some(Err(e)) => {
                    if !too_large(found, key, &e) {
                        return Err(e);
                    }
                }
            }
        }
    }
    Ok(())
}

/// What became of a file fetched for the mirror: its tag, or why the tree cannot show it.
enum Kept {
    Tag(String),
    Skipped(io::Error),
}

/// Fetched once: `Ok(None)` removed since listed.
type Fetched = Result<Option<Kept>, StoreError>;

/// Writes a fetched file into the mirror.
fn write_file(
    local: &Backing,
    key: &Path,
    (bytes, info): (Bytes, crate::store::ObjectInfo),
) -> Result<(Bytes, Kept), StoreError> {
    match local.write_atomic(key, std::slice::from_ref(&bytes), false, None) {
        Ok(_) => Ok((bytes, Kept::Tag(info.tag))),
        Err(e) if unshowable(&e) => Ok((bytes, Kept::Skipped(e))),
        Err(e) => Err(e.into()),
    }
}

fn note_kept(found: &mut Mirrored, key: &Path, kept: Kept) {
    match kept {
        Kept::Tag(tag) => {
            found.tags.insert(key.to_path_buf(), tag);
        }
        Kept::Skipped(e) => skip(found, key, &e),
    }
}

/// Whether `e` says the object is larger than the mirror holds (noted, skipped).
fn too_large(found: &mut Mirrored, key: &Path, e: &StoreError) -> bool {
    let large = matches!(e, StoreError::Io(e) if e.raw_os_error() == Some(libc::EFBIG));
    if large {
        found.skipped.push(key.display().to_string());
        warn!(key = %key.display(), "larger than {MAX_MIRRORED} bytes: not shown");
    }
    large
}

/// Writes the store's file `key`, as fetched, into the mirror; returns its bytes (also when
/// the mirror cannot hold its name, skipped), or `None` when too large.
fn keep_file(
    local: &Backing,
    key: &Path,
    got: Result<(Bytes, crate::store::ObjectInfo), StoreError>,
    found: &mut Mirrored,
) -> Result<Option<Bytes>, StoreError> {
    match got.and_then(|got| write_file(local, key, got)) {
        Ok((bytes, kept)) => {
            note_kept(found, key, kept);
            Ok(Some(bytes))
        }
        Err(e) if too_large(found, key, &e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_array_document(bytes: &Bytes) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| {
            v.get("node_type")
                .and_then(|t| t.as_str())
                .map(str::to_string)
        })
        .is_some_and(|t| t == "array")
}

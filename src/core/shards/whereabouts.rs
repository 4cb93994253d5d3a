//! Where the array of a shard's pending chunks is now. Another mount sharing BACKING may
//! remove an array and make it again at the same path, or move its directory, while this
//! mount still holds chunks of it. As with a file on any POSIX file system, what was written
//! into a removed array is gone with it (it must never show up in the array made anew), and
//! what was written into a moved one goes where the array went (never to the old path,
//! where no array is). An array is its directory: held by a descriptor
//! (`ArrayState::dir`), the kernel says where it is now. A dead mount's records name it
//! by inode and birth time (`ArrayState::instance`); replay looks for that directory
//! (`find_moved`).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ShardRegistry;
use crate::backing::{Backing, DirNow, EntryKind};
use crate::core::array::ArrayState;
use crate::core::pending::memfile::MAX_METADATA_BYTES;
use crate::sync::lock;
use crate::zarr::{METADATA_FILE, Node};

/// How many directories a search for a moved array looks at before it gives up.
const SEARCH_LIMIT: usize = 100_000;
/// How long "not found" is believed: a replay asks once per record.
const NOT_FOUND_FOR: Duration = Duration::from_secs(2);
/// Sightings kept at most (each is a directory's instance and path).
const SIGHTINGS_KEPT: usize = 1024;

/// Where directories were last found, by instance: many shard writes (or replayed
/// records) of one moved array search once.
#[derive(Debug, Default)]
pub(crate) struct Sightings(Mutex<HashMap<String, (Option<PathBuf>, Instant)>>);

impl Sightings {
    fn find(&self, backing: &Backing, instance: &str) -> Option<PathBuf> {
        let seen = lock(&self.0).get(instance).cloned();
        match seen {
            Some((Some(rel), _)) if backing.dir_instance(&rel) == instance => return Some(rel),
            Some((None, at)) if at.elapsed() < NOT_FOUND_FOR => return None,
            _ => {}
        }
        let found = find_dir(backing, instance);
        let mut map = lock(&self.0);
        if map.len() >= SIGHTINGS_KEPT {
            map.clear();
        }
        map.insert(instance.to_string(), (found.clone(), Instant::now()));
        found
    }
}

pub(super) enum Whereabouts {
    /// The array is here (where it was, or where it was moved to).
    At(Arc<ArrayState>),
    /// The array was removed (and perhaps another made at its path).
    Gone,
    /// The array is somewhere that cannot be named (out of BACKING, under a mount made over
    /// its path), or its store cannot say where: its chunks stay pending, the write fails
    /// (saying why), and it is tried again.
    Lost(String),
}

/// "Lost" of a directory this mount cannot reach.
fn unreachable() -> Whereabouts {
    Whereabouts::Lost(
        "its array's directory is where this mount cannot reach it (moved out of BACKING, or \
         a mount made over its path)"
            .into(),
    )
}

impl ShardRegistry {
    /// Where `array` is now: looked at before each shard write (an `fstat` and a
    /// `readlink`). Without a held directory (no descriptor to spare) the array is taken
    /// to be where it was if no other directory is there. In an object store, where an
    /// array is its metadata document, by that document (`Documents`).
    pub(super) fn whereabouts(&self, backing: &Backing, array: &Arc<ArrayState>) -> Whereabouts {
        if !self.store_is_backing {
            return self.documents.whereabouts(&*self.store, backing, array);
        }
        let Some(held) = array.dir.as_ref() else {
            // Not held (past `MOST_HELD`): another directory at its path, by inode and birth
            // time, means the array is not there; where it is cannot be told, so its chunks
            // wait (a replay of their records follows it, or drops them).
            let now = backing.dir_instance(&array.rel);
            return match array.instance.is_empty() || now == array.instance {
                true => Whereabouts::At(array.clone()),
                false => unreachable(),
            };
        };
        match held.now(backing) {
            DirNow::At(rel) if rel == array.rel => Whereabouts::At(array.clone()),
            DirNow::At(rel) => {
                tracing::info!(array = %array.rel.display(), now = %rel.display(),
                    "array moved by another mount: its chunks go where it went");
                Whereabouts::At(Arc::new(array.moved_to(rel)))
            }
            DirNow::Gone => {
                tracing::warn!(array = %array.rel.display(),
                    "array removed by another mount: the chunks written into it here go \
                     with it");
                Whereabouts::Gone
            }
            // (Its name at the old path, when that still leads to it.)
            DirNow::Unknown if held.is_at(backing, &array.rel) => Whereabouts::At(array.clone()),
            DirNow::Unknown => unreachable(),
        }
    }
}

impl ShardRegistry {
    /// The directory of BACKING whose instance (`Backing::dir_instance`) is `instance`:
    /// where an array went that another mount moved.
    pub(crate) fn find_moved(&self, backing: &Backing, instance: &str) -> Option<PathBuf> {
        if !self.store_is_backing || instance.is_empty() {
            return None;
        }
        self.sightings.find(backing, instance)
    }
}

/// The directory of BACKING whose instance is `instance`, breadth first. An array's own
/// key tree is never entered (arrays hold no arrays), nor shardfs's own directory.
fn find_dir(backing: &Backing, instance: &str) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let root_dev = backing.stat_on_root_fs(Path::new("")).ok().flatten()?.dev();
    let mut queue = VecDeque::from([PathBuf::new()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > SEARCH_LIMIT {
            tracing::warn!("moved array not searched for beyond {SEARCH_LIMIT} directories");
            return None;
        }
        // Never into another file system mounted inside BACKING: a FUSE mount there (this
        // very mount, or another) would have the search wait on itself.
        let Ok(Some(meta)) = backing.stat_on_root_fs(&dir) else {
            continue;
        };
        if meta.dev() != root_dev {
            continue;
        }
        if !dir.as_os_str().is_empty() && crate::backing::instance_of(&meta) == instance {
            return Some(dir);
        }
        if holds_array(backing, &dir) {
            continue;
        }
        let Ok(entries) = backing.list(&dir) else {
            continue;
        };
        for e in entries {
            let top_own = dir.as_os_str().is_empty() && e.name == ".shardfs";
            if e.kind == EntryKind::Dir && !top_own {
                queue.push_back(dir.join(&e.name));
            }
        }
    }
    None
}

fn holds_array(backing: &Backing, dir: &Path) -> bool {
    let doc = backing.read_at_most(&dir.join(METADATA_FILE), MAX_METADATA_BYTES);
    matches!(doc, Ok(Some(bytes)) if matches!(Node::parse(&bytes), Ok(Node::Array(_))))
}

/// How long an object-store array's document, once checked, is believed.
const DOCUMENT_CHECKED_FOR: Duration = Duration::from_secs(1);

/// In an object store an array has no directory to hold: another node may remove it, or
/// make another array at its path, while this mount still has chunks of it. Its metadata
/// document tells what may be written. Chunks are written while the document there takes
/// them as they are (`places_alike`: a resize or new attributes change nothing for them).
/// A document gone, or one that would read them otherwise, cannot say whether another
/// node removed the array or the store lost it (a bucket deleted and made again between
/// two looks), so the chunks are never dropped on that word: they wait, the write fails
/// naming why, and `shardfs unmount --give-up` gives them up. Only a store known to have
/// lost everything (its bucket seen gone while mounted) gets the tree's documents
/// published again, once, when it is back; from then on an absence is an absence.
#[derive(Debug, Default)]
pub(crate) struct Documents(Mutex<HashMap<PathBuf, Instant>>);

impl Documents {
    fn whereabouts(
        &self,
        store: &dyn crate::store::Store,
        backing: &Backing,
        array: &Arc<ArrayState>,
    ) -> Whereabouts {
        let fresh = lock(&self.0)
            .get(&array.rel)
            .is_some_and(|at| at.elapsed() < DOCUMENT_CHECKED_FOR);
        if fresh {
            return Whereabouts::At(array.clone());
        }
        let key = array.rel.join(METADATA_FILE);
        let verdict = match store.get(&key, MAX_METADATA_BYTES) {
            Ok(Some((bytes, _))) if places_alike(&bytes, array) => Whereabouts::At(array.clone()),
            Ok(Some(_)) => Whereabouts::Lost(format!(
                "{} was made anew by another node with another layout (data type, codecs or \
                 chunking): the chunks written into the old one here wait, never written as \
                 that one's shards (`shardfs unmount --give-up` gives them up)",
                store.describe(&key)
            )),
            Ok(None) if store.lost() => match publish_tree_again(store, backing) {
                Ok(()) => Whereabouts::At(array.clone()),
                Err(e) => {
                    Whereabouts::Lost(format!("its metadata could not be published again: {e}"))
                }
            },
            Ok(None) => match store.confirm_there() {
                Err(e) => Whereabouts::Lost(e.to_string()),
                Ok(()) => Whereabouts::Lost(format!(
                    "{} is gone from the store (another node removed the array?): the chunks \
                     written into it here wait (`shardfs unmount --give-up` gives them up)",
                    store.describe(&key)
                )),
            },
            Err(e) => Whereabouts::Lost(format!("its metadata could not be read: {e}")),
        };
        if matches!(verdict, Whereabouts::At(_)) {
            lock(&self.0).insert(array.rel.clone(), Instant::now());
        }
        verdict
    }
}

/// Whether the document `bytes` takes the chunks written under `array`'s as they are
/// (`zarr::takes_chunks_of`).
fn places_alike(bytes: &[u8], array: &ArrayState) -> bool {
    match Node::parse(bytes) {
        Ok(Node::Array(meta)) => crate::zarr::takes_chunks_of(&meta, &array.meta),
        _ => false,
    }
}

/// Publishes every document of this mount's tree again where the store has none (a store
/// that lost everything gets back the metadata its shards need to be read; a document
/// another node made meanwhile stays), then takes the store as whole again.
fn publish_tree_again(
    store: &dyn crate::store::Store,
    backing: &Backing,
) -> Result<(), crate::store::StoreError> {
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let key = dir.join(METADATA_FILE);
        let document = backing.read_at_most(&key, MAX_METADATA_BYTES)?;
        if let Some(bytes) = &document {
            match store.put(
                &key,
                &[bytes::Bytes::from(bytes.clone())],
                crate::store::Precondition::Absent,
            ) {
                Ok(_) => tracing::warn!(document = %store.describe(&key),
                    "the store had lost it: published again"),
                Err(crate::store::StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // (Below an array is its key tree, which the mount's tree does not hold.)
        if document.is_some_and(|b| matches!(Node::parse(&b), Ok(Node::Array(_)))) {
            continue;
        }
        for entry in backing.list(&dir)? {
            if entry.kind == EntryKind::Dir
                && !(dir.as_os_str().is_empty() && entry.name == ".shardfs")
            {
                dirs.push(dir.join(&entry.name));
            }
        }
    }
    store.recovered();
    Ok(())
}

//! The orchestrator: [`ShardFs`] holds the core's parts and answers the adapter's requests
//! by calling them, in the order each request needs. Its `impl` is split by concern, one
//! file each, and each file says its concern first: `lookup.rs` (names, attributes,
//! reads), `listing.rs` (directories, their listings, READDIRPLUS), `write.rs` (writing,
//! FLUSH, fsync, truncation), `namespace.rs` (create, mkdir, unlink, rmdir, rename, link),
//! `commit.rs` (a `zarr.json` written through the mount), `flush.rs` (idle, memory-pressure
//! and unmount flushing, stats), `durable.rs` (fsync through the journal, replay at
//! start). This file: the state and how it is made.

pub mod commit;
pub mod durable;
pub mod flush;
mod left;
pub mod listing;
pub mod lookup;
pub mod namespace;
pub mod write;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::backing::Backing;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::temp::TempNames;
use crate::core::refusal;
use crate::core::shards;
use crate::core::shards::ShardRegistry;
use crate::core::view::classify::{Classifier, DirClass};
use crate::core::view::handle::HandleTable;
use crate::core::view::inode::{InodeTable, NodeInfo};
use crate::zarr::ShardPolicy;

/// The name of the control file in the mount's root. It is not listed; a BACKING file of
/// the same name is hidden by it.
pub const CONTROL_FILE: &str = ".shardfs-control";
/// shardfs's own directory in BACKING's root (journals): not shown in the mount.
pub const PRIVATE_DIR: &str = ".shardfs";
const CONTROL_SIZE: usize = 64 * 1024;

/// What the control file tells about the daemon.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DaemonInfo {
    pub pid: u32,
    /// Where the daemon writes its verdict when it exits.
    pub status_file: PathBuf,
    /// Where the mount is: refusals name files by their path there.
    #[serde(skip)]
    pub mountpoint: PathBuf,
}

/// How the write side behaves.
#[derive(Clone, Debug)]
pub struct WriteConfig {
    /// The layout of arrays created through the mount.
    pub policy: ShardPolicy,
    /// A shard with pending chunks and no change for this long is written as it is.
    pub idle_flush: Duration,
    /// Above this many bytes held in memory, partial shards are written.
    pub max_pending: u64,
    /// The budget of the index cache, in bytes.
    pub index_cache: u64,
    /// fsync appends to a journal in BACKING instead of writing shards.
    pub journal: bool,
    /// Past this many journal bytes, the shards holding journaled chunks are written (so
    /// that their records retire).
    pub max_journal: u64,
    /// Raw chunks of arrays created through the mount are stored compressed with zstd at
    /// this level (`zarr::transparent`).
    pub compress: Option<i32>,
}

impl Default for WriteConfig {
    fn default() -> Self {
        WriteConfig {
            policy: ShardPolicy::default(),
            idle_flush: Duration::from_secs(5),
            max_pending: 2 << 30,
            index_cache: shards::DEFAULT_INDEX_CACHE,
            journal: false,
            max_journal: 1 << 30,
            compress: None,
        }
    }
}

#[derive(Debug)]
pub struct ShardFs {
    backing: Backing,
    inodes: InodeTable,
    classifier: Classifier,
    handles: HandleTable,
    shards: ShardRegistry,
    temps: TempNames,
    config: WriteConfig,
    daemon: DaemonInfo,
    /// Held (shared) while a file or directory is made in a plain directory, and
    /// exclusively while a directory becomes an array: chunk files written before the
    /// metadata are all moved into shards, none slips in between.
    plain_names: std::sync::RwLock<()>,
    gate: Gate,
    /// Records of dead mounts' journals that could not be applied yet (`durable.rs`).
    unreplayed: std::sync::Mutex<Vec<crate::journal::Replayed>>,
    /// Where what is not a shard is kept: BACKING, or an object store's mirror in it.
    tree: Box<dyn crate::store::tree::Tree>,
    /// Where refused requests are logged, and counted.
    refusals: Arc<refusal::RefusalLog>,
    /// `shardfs unmount --give-up` asked: the final flush is tried once, not retried.
    giving_up: std::sync::atomic::AtomicBool,
    /// Layouts of arrays whose document went while their shards stayed (`left.rs`).
    left: left::LeftLayouts,
    /// Whether plain files pass through the kernel to BACKING (`view/passthrough.rs`).
    passthrough: crate::core::view::passthrough::Passthrough,
}

/// Orders the changes of pending chunks against the few operations during which none may
/// arrive: removing or moving an array's metadata or directory, and changing its layout.
/// Those write what is pending and then change the array, holding the gate exclusively so
/// that no chunk slips in between (it would be dropped, or put where the new layout does
/// not expect it). Everything that adds or changes pending chunks holds it shared, taken
/// once, at the entry point of the request: never nested.
#[derive(Debug, Default)]
struct Gate(std::sync::RwLock<()>);

/// A held gate.
enum GateGuard<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

impl Gate {
    fn shared(&self) -> GateGuard<'_> {
        GateGuard::Shared(self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn exclusive(&self) -> GateGuard<'_> {
        GateGuard::Exclusive(self.0.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Exclusive when a request touches metadata or whole directories, else shared.
    fn for_request(&self, structural: bool) -> GateGuard<'_> {
        if structural {
            self.exclusive()
        } else {
            self.shared()
        }
    }
}

impl ShardFs {
    pub fn new(backing: Backing, daemon: DaemonInfo) -> ShardFs {
        ShardFs::with_config(backing, daemon, WriteConfig::default())
    }

    pub fn with_config(backing: Backing, daemon: DaemonInfo, config: WriteConfig) -> ShardFs {
        let store = Arc::new(backing.clone());
        ShardFs::with_store(backing, store, true, daemon, config)
    }

    /// A core whose shards live in `store` (an object store), while the rest of the tree
    /// (directories, `zarr.json`, the journal) lives in `backing`. `store_is_backing` when
    /// `store` is `backing` itself.
    pub fn with_store(
        backing: Backing,
        store: Arc<dyn crate::store::Store>,
        store_is_backing: bool,
        daemon: DaemonInfo,
        config: WriteConfig,
    ) -> ShardFs {
        let refusals = Arc::new(refusal::RefusalLog::new(daemon.mountpoint.clone()));
        let tree_backing = backing.clone();
        ShardFs {
            shards: ShardRegistry::new(config.index_cache, store, store_is_backing, &refusals),
            refusals,
            backing,
            inodes: InodeTable::new(),
            classifier: Classifier::default(),
            handles: HandleTable::default(),
            temps: TempNames::default(),
            config,
            daemon,
            plain_names: std::sync::RwLock::new(()),
            gate: Gate::default(),
            unreplayed: std::sync::Mutex::default(),
            giving_up: Default::default(),
            left: Default::default(),
            passthrough: Default::default(),
            tree: Box::new(crate::store::tree::Local(tree_backing)),
        }
    }

    /// Publishes what is written to BACKING outside the shards to `store` (BACKING is
    /// then a mirror of it: `store::tree::Mirror`).
    pub fn publishing_to(mut self, store: Arc<crate::store::mirror::Published>) -> ShardFs {
        self.tree = Box::new(crate::store::tree::Mirror {
            local: crate::store::tree::Local(self.backing.clone()),
            published: store,
        });
        self
    }

    /// Refuses, where the tree takes no change in place, the change `what` asked of `rel`
    /// (a link, a special file, a write in place: nothing an object store can hold).
    fn may_change_in_place(&self, rel: &std::path::Path, what: &str) -> Result<(), FsError> {
        match self.tree.changes_in_place() {
            true => Ok(()),
            false => Err(FsError::refused(
                rel,
                refusal::Rule::ObjectStoreInPlaceChange,
                what,
            )),
        }
    }

    /// Whose the file held in memory at `rel` is (`MemFile::maker`), if one is held there.
    fn held_maker(&self, rel: &std::path::Path) -> Option<crate::backing::FileOwner> {
        self.temps.file(rel).and_then(|f| f.maker())
    }

    /// Notes a refusal a request met (logged once: `RefusalLog`).
    pub fn note_refusal(&self, e: &FsError) {
        if let FsError::Refused(r) = e {
            self.refusals.note(r);
        }
    }

    /// Whether `shardfs unmount --give-up` was asked.
    pub fn giving_up(&self) -> bool {
        self.giving_up.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// What directory `rel` is now.
    fn classify(&self, rel: &std::path::Path) -> Result<DirClass, FsError> {
        self.classifier.classify(&self.backing, rel)
    }

    /// A `zarr.json` about to be opened is first compared with the store's where another
    /// node may have changed or removed it (`Tree::revalidate_document`). Clients read an
    /// array's or group's document before its chunks, so the open is where a new one must
    /// be seen; a walk of names costs nothing. Returns whether the mount took another
    /// version.
    fn revalidated(&self, info: &NodeInfo) -> bool {
        !info.detached
            && info.rel.file_name() == Some(std::ffi::OsStr::new(crate::zarr::METADATA_FILE))
            && self.tree.revalidate_document(&info.rel)
    }

    /// The sharded array whose directory is `rel`, if it is one now.
    fn array_at(&self, rel: &std::path::Path) -> Result<Option<Arc<ArrayState>>, FsError> {
        Ok(match self.classify(rel)? {
            DirClass::ShardedArray(a) => Some(a),
            _ => None,
        })
    }
}

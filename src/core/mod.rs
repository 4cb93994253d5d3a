//! The filesystem core: what the mount shows and how requests are answered, with no
//! knowledge of FUSE. The adapter in `crate::fuse` turns kernel requests into calls here.
//!
//! Its parts, each pointing only downwards (a part uses those listed after it):
//! - `fs/`: the orchestrator. [`ShardFs`] holds every other part and answers each request
//!   by calling them; it alone knows the order of steps (gate, write what is pending, change
//!   the tree, move the names). Its `impl` is split by kind of request, a file each.
//! - `view/`: what the mount shows: inodes and the names they stand for, attributes, what a
//!   directory is (`classify`), open handles.
//! - `shards/`: chunks waiting for their shard, shard writing and merging, the index
//!   cache, and the durability ledger (which journal record holds what; `shards/ledger.rs`).
//! - `pending/`: files held in memory (`MemFile`) and the temporary names they live under.
//! - `array.rs`, `group.rs`: the arrays and groups the mount knows (layout, name rules).
//! - `refusal.rs`, `error.rs`, `errno.rs`, `stats.rs`: what every part reports with.
//!
//! Below the core: `crate::store` (shards and the tree, BACKING or an object store),
//! `crate::journal` (records on disk), `crate::backing` (every file operation in BACKING).

pub mod array;
pub mod errno;
pub mod error;
pub mod fs;
pub mod group;
pub mod pending;
pub mod refusal;
pub mod shards;
pub mod stats;
pub mod view;

use std::path::PathBuf;
use std::time::Duration;

use crate::zarr::ShardPolicy;
pub use error::FsError;
pub use fs::ShardFs;
pub use fs::lookup::{Opened, StatFs};
pub use view::attr::Attr;
pub use view::inode::{FileType, Ino, NodeInfo, NodeKind, ROOT};

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
        }
    }
}

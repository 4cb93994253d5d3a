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
#[cfg(test)]
pub(crate) mod testing;
pub mod view;

pub use error::FsError;
pub use fs::lookup::{Opened, StatFs};
pub use fs::{CONTROL_FILE, DaemonInfo, PRIVATE_DIR, ShardFs, WriteConfig};
pub use view::attr::Attr;
pub use view::inode::{FileType, Ino, NodeInfo, NodeKind, ROOT};

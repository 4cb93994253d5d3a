//! Errors of the filesystem core. Each maps to one errno, in `crate::core::errno`.

use std::io;

use thiserror::Error;

use crate::core::refusal::{Refusal, Rule};
use crate::shard::IndexError;

#[derive(Debug, Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not supported here: {0}")]
    Unsupported(&'static str),
    #[error("unknown inode")]
    Stale,
    #[error("unknown file handle")]
    BadHandle,
    #[error("not permitted here: {0}")]
    NotPermitted(&'static str),
    #[error("the file changed while it was being read; try again")]
    Changed,
    /// A conditional write found a version other than the one it read: read and retry.
    #[error("{0} was changed by another writer meanwhile")]
    Conflict(String),
    #[error("shard write failed earlier: {0}")]
    Failed(String, i32),
    /// A request that breaks one of the mount's rules (logged once, with the fix).
    #[error("{0}")]
    Refused(Box<Refusal>),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl FsError {
    /// Refuses a request on `file` (relative to the mount's root) for breaking `rule`.
    pub fn refused(file: &std::path::Path, rule: Rule, detail: impl Into<String>) -> FsError {
        FsError::Refused(Box::new(Refusal::new(file, rule, detail)))
    }

    /// A publication to an object store that lost to another node's newer version
    /// (`store::mirror::Published`): not to be tried again.
    pub fn lost_to_another_node(&self) -> bool {
        matches!(self, FsError::Io(e) if e.kind() == io::ErrorKind::StaleNetworkFileHandle)
    }

    /// Refuses a read of `chunk` whose shard (`shard`, as the store names it) is damaged.
    pub fn damaged_shard(chunk: &std::path::Path, shard: &str, reason: &IndexError) -> FsError {
        FsError::refused(
            chunk,
            Rule::DamagedShard,
            format!("its shard {shard} is damaged: {reason}"),
        )
    }
}

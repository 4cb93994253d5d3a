//! Errors of the filesystem core. Each maps to one errno, in `crate::errno`.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

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
    #[error("cross-device rename: {0}")]
    CrossDevice(&'static str),
    #[error("the file changed while it was being read; try again")]
    Changed,
    #[error("file too large: {0}")]
    TooBig(String),
    #[error("busy: {0}")]
    Busy(String),
    /// A conditional write found a version other than the one it read: read and retry.
    #[error("{0} was changed by another writer meanwhile")]
    Conflict(String),
    #[error("shard write failed earlier: {0}")]
    Failed(String, i32),
    #[error("damaged shard {path}: {reason}")]
    DamagedShard { path: PathBuf, reason: IndexError },
    #[error("{0}")]
    Io(#[from] io::Error),
}

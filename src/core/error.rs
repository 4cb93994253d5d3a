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
    #[error("unknown inode or file handle")]
    Stale,
    #[error("damaged shard {path}: {reason}")]
    DamagedShard { path: PathBuf, reason: IndexError },
    #[error("{0}")]
    Io(#[from] io::Error),
}

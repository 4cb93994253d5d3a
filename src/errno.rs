//! The one place where errors become errno values for the kernel.

use crate::core::FsError;
use crate::core::refusal::Rule;

pub trait ToErrno {
    fn to_errno(&self) -> i32;
}

impl ToErrno for FsError {
    fn to_errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            FsError::Stale => libc::ESTALE,
            FsError::BadHandle => libc::EBADF,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::Changed => libc::ESTALE,
            FsError::Conflict(_) => libc::EBUSY,
            FsError::Failed(_, errno) => *errno,
            FsError::Refused(r) => r.rule.to_errno(),
            // (A write that lost to another node's, `store::mirror::Published`, is EIO,
            // its reason logged: the kernel retries a rename or unlink that fails with
            // ESTALE, and the retry would go over the newer version the mount took.)
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl ToErrno for Rule {
    fn to_errno(&self) -> i32 {
        match self {
            Rule::NotAChunkKey
            | Rule::FileAsKeyDirectory
            | Rule::DirectoryAsFile
            | Rule::InvalidArrayMetadata
            | Rule::ExchangeOfTranslatedNames => libc::EINVAL,
            Rule::TooBig => libc::EFBIG,
            Rule::LayoutChangeWhilePending => libc::EBUSY,
            Rule::DamagedShard | Rule::MergeIntoDamagedShard => libc::EIO,
            Rule::KeyDirectoryMove | Rule::ObjectStoreDirectoryRename => libc::EXDEV,
            Rule::SpecialFileInArray
            | Rule::ShardfsOwnFile
            | Rule::TruncateTranslated
            | Rule::ChunkOwnership => libc::EPERM,
            Rule::ObjectStoreInPlaceChange => libc::EOPNOTSUPP,
        }
    }
}

/// The symbolic name of the errno values refusals use, for log lines.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::EBUSY => "EBUSY",
        libc::EIO => "EIO",
        libc::EXDEV => "EXDEV",
        libc::EPERM => "EPERM",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::IndexError;
    use std::path::Path;

    #[test]
    fn io_errors_keep_their_errno_and_refusals_their_rule() {
        let e = FsError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.to_errno(), libc::ENOSPC);
        let e = FsError::Io(std::io::Error::other("no errno"));
        assert_eq!(e.to_errno(), libc::EIO);
        let reason = IndexError::CrcMismatch {
            stored: 1,
            computed: 2,
        };
        let e = FsError::damaged_shard(Path::new("a/c/0"), "/data/a/c/0", &reason);
        assert_eq!(e.to_errno(), libc::EIO);
        let e = FsError::refused(Path::new("a/c/9"), Rule::TooBig, "big");
        assert_eq!(e.to_errno(), libc::EFBIG);
        assert_eq!(errno_name(e.to_errno()), "EFBIG");
    }
}

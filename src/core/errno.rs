//! The one place where errors become errno values for the kernel: the core's errors
//! (into which every lower part's errors are turned) as the adapter answers them. A
//! refusal's errno is part of its rule (`refusal::Rule::errno`, beside its text and fix).

use crate::core::FsError;

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
            FsError::Refused(r) => r.rule.errno(),
            // (A write that lost to another node's, `store::mirror::Published`, is EIO,
            // its reason logged: the kernel retries a rename or unlink that fails with
            // ESTALE, and the retry would go over the newer version the mount took.)
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::refusal::{Rule, errno_name};
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

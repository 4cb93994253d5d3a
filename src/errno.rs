//! The one place where errors become errno values for the kernel.

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
            FsError::CrossDevice(_) => libc::EXDEV,
            FsError::Changed => libc::ESTALE,
            FsError::TooBig(_) => libc::EFBIG,
            FsError::Busy(_) | FsError::Conflict(_) => libc::EBUSY,
            FsError::Failed(_, errno) => *errno,
            FsError::DamagedShard { .. } => libc::EIO,
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::IndexError;

    #[test]
    fn io_errors_keep_their_errno_and_damage_is_eio() {
        let e = FsError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.to_errno(), libc::ENOSPC);
        let e = FsError::Io(std::io::Error::other("no errno"));
        assert_eq!(e.to_errno(), libc::EIO);
        let e = FsError::DamagedShard {
            path: "x".into(),
            reason: IndexError::CrcMismatch {
                stored: 1,
                computed: 2,
            },
        };
        assert_eq!(e.to_errno(), libc::EIO);
    }
}

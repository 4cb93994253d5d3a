//! A directory of BACKING held by a descriptor, to know where it is now. Another mount (or
//! any process) sharing BACKING may move an array's directory, or remove it and make
//! another at its path, while this mount holds chunks of it. The descriptor follows the
//! directory itself: the kernel says where it is (its path under `/proc/self/fd`) and
//! whether it is gone (no link left), with no search and no guess from a name.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;

use super::Backing;

/// A directory, held (`O_PATH`: nothing is read through it, and it keeps nothing busy).
#[derive(Debug)]
pub struct HeldDir(OwnedFd);

/// Where a held directory is now.
#[derive(Debug, PartialEq, Eq)]
pub enum DirNow {
    /// At this path, relative to BACKING's root.
    At(PathBuf),
    /// Removed, or moved out of BACKING.
    Gone,
}

impl HeldDir {
    /// The directory at `rel` (never through a symbolic link); `None` when it cannot be held
    /// (not there, or out of descriptors).
    pub fn open(backing: &Backing, rel: &Path) -> Option<HeldDir> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        backing.open_beneath(rel, flags, 0).ok().map(HeldDir)
    }

    /// The directory's device and inode: the same for two holds of one directory.
    pub fn id(&self) -> Option<(u64, u64)> {
        rustix::fs::fstat(&self.0)
            .ok()
            .map(|st| (st.st_dev, st.st_ino))
    }

    /// Whether the directory at `rel` now is this one.
    pub fn is_at(&self, backing: &Backing, rel: &Path) -> bool {
        match (rustix::fs::fstat(&self.0), backing.stat(rel)) {
            (Ok(held), Ok(Some(now))) => {
                use std::os::unix::fs::MetadataExt;
                (held.st_dev, held.st_ino) == (now.dev(), now.ino())
            }
            _ => false,
        }
    }

    /// Where it is now.
    pub fn now(&self, backing: &Backing) -> DirNow {
        let linked = rustix::fs::fstat(&self.0).is_ok_and(|st| st.st_nlink > 0);
        let (Some(path), Some(root)) = (fd_path(&self.0), fd_path(&backing.root_fd)) else {
            return DirNow::Gone;
        };
        if !linked || path.to_string_lossy().ends_with(" (deleted)") {
            return DirNow::Gone;
        }
        match path.strip_prefix(&root) {
            Ok(rel) => DirNow::At(rel.to_path_buf()),
            Err(_) => DirNow::Gone,
        }
    }
}

/// The path the kernel has for what `fd` is open on.
fn fd_path(fd: &OwnedFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

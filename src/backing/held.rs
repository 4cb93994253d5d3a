//! A directory of BACKING held by a descriptor, to know where it is now. Another mount (or
//! any process) sharing BACKING may move an array's directory, or remove it and make
//! another at its path, while this mount holds chunks of it. The descriptor follows the
//! directory itself: the kernel says where it is (its path under `/proc/self/fd`) and
//! whether it is gone (no link left), with no search and no guess from a name.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::fs::OFlags;

use super::Backing;

/// A directory, held (`O_PATH`: nothing is read through it, and it keeps nothing busy).
#[derive(Debug)]
pub struct HeldDir(OwnedFd);

/// How many directories are held at most: each costs a descriptor for as long as the mount
/// knows the array (ten thousand arrays once used up every descriptor there was). Past
/// it, arrays are taken to be where they were.
const MOST_HELD: usize = 4096;
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Where a held directory is now.
#[derive(Debug, PartialEq, Eq)]
pub enum DirNow {
    /// At this path, relative to BACKING's root.
    At(PathBuf),
    /// Removed: no name is left to it.
    Gone,
    /// Somewhere the daemon cannot name: out of BACKING, past PATH_MAX, or under a mount
    /// made over its path. Nothing is written for it until it is found again.
    Unknown,
}

impl Backing {
    /// The device and inode of the directory at `rel`, if there is one.
    pub fn dir_id(&self, rel: &Path) -> Option<(u64, u64)> {
        self.dir_facts(rel).map(|(id, _, _)| id)
    }

    /// The device and inode of the directory at `rel`, its instance, and its owner and
    /// mode, from one look at it (two could see two directories).
    pub fn dir_facts(&self, rel: &Path) -> Option<((u64, u64), String, super::FileOwner)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.stat(rel).ok().flatten().filter(|m| m.is_dir())?;
        let instance = super::instance_of(&m);
        Some(((m.dev(), m.ino()), instance, super::FileOwner::of(&m)))
    }
}

/// Which directory is at a path, from one look: its device and inode, its instance
/// (`Backing::dir_instance`), and a descriptor of it, through which its files are read
/// (`file_in`) and which is kept when it may be (`into_held`).
pub struct Identified {
    pub id: (u64, u64),
    pub instance: String,
    fd: OwnedFd,
}

impl Identified {
    /// The regular file `name` in this directory, with its metadata; `None` when there is
    /// none. Bytes read from it are of this directory, whatever its path holds by now.
    pub fn file_in(&self, name: &str) -> Option<(std::fs::File, std::fs::Metadata)> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, rustix::fs::Mode::empty()).ok()?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().ok().filter(|m| m.is_file())?;
        Some((file, meta))
    }

    /// The directory held, unless `MOST_HELD` are already.
    pub fn into_held(self) -> Option<HeldDir> {
        if HELD.fetch_add(1, Ordering::Relaxed) >= MOST_HELD {
            HELD.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(HeldDir(self.fd))
    }
}

impl Backing {
    /// The directory at `rel` (never through a symbolic link), identified from the one
    /// descriptor opened: looks apart could see two directories while someone swaps them.
    /// `Ok(None)` when no directory is there; an error finding it (a link on the way, a
    /// mount crossed) is an error.
    pub fn identify(&self, rel: &Path) -> std::io::Result<Option<Identified>> {
        use std::os::unix::fs::MetadataExt;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        let fd = match self.open_beneath(rel, flags, 0) {
            Ok(fd) => fd,
            Err(e) if super::is_absent(&e) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let meta = std::fs::File::from(rustix::io::dup(&fd)?).metadata()?;
        Ok(Some(Identified {
            id: (meta.dev(), meta.ino()),
            instance: super::instance_of(&meta),
            fd,
        }))
    }
}

impl HeldDir {
    /// The directory at `rel` (never through a symbolic link); `None` when it cannot be held
    /// (not there, out of descriptors, or `MOST_HELD` already).
    pub fn open(backing: &Backing, rel: &Path) -> Option<HeldDir> {
        if HELD.fetch_add(1, Ordering::Relaxed) >= MOST_HELD {
            HELD.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        match backing.open_beneath(rel, flags, 0) {
            Ok(fd) => Some(HeldDir(fd)),
            Err(_) => {
                HELD.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The directory's device and inode: the same for two holds of one directory.
    pub fn id(&self) -> Option<(u64, u64)> {
        rustix::fs::fstat(&self.0)
            .ok()
            .map(|st| (st.st_dev, st.st_ino))
    }

    /// Its owner and mode, if the directory at `rel` now is this one (one look at each).
    pub fn owner_if_at(&self, backing: &Backing, rel: &Path) -> Option<super::FileOwner> {
        use std::os::unix::fs::MetadataExt;
        let held = rustix::fs::fstat(&self.0).ok()?;
        let now = backing.stat(rel).ok().flatten()?;
        ((held.st_dev, held.st_ino) == (now.dev(), now.ino())).then_some(super::FileOwner {
            uid: held.st_uid,
            gid: held.st_gid,
            mode: held.st_mode & 0o7777,
        })
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

    /// Where it is now. Only a directory with no name left is gone; a path the kernel
    /// gives for it counts only if it leads back to it from BACKING's root.
    pub fn now(&self, backing: &Backing) -> DirNow {
        if rustix::fs::fstat(&self.0).is_ok_and(|st| st.st_nlink == 0) {
            return DirNow::Gone;
        }
        let (Some(path), Some(root)) = (fd_path(&self.0), fd_path(&backing.root_fd)) else {
            return DirNow::Unknown;
        };
        match path.strip_prefix(&root) {
            Ok(rel) if self.is_at(backing, rel) => DirNow::At(rel.to_path_buf()),
            _ => DirNow::Unknown,
        }
    }
}

impl Drop for HeldDir {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The path the kernel has for what `fd` is open on.
fn fd_path(fd: &OwnedFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

//! Resolving paths strictly beneath BACKING's root descriptor.
//!
//! Every path the daemon works on comes from the kernel's view of the mount, where symbolic
//! links are shown as links and resolved by the client. So the daemon itself never needs
//! to follow one: a link met on the way is either a directory swapped for a link after the
//! lookup (a race that must not lead outside BACKING) or the last component, which is
//! worked on itself.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec};

/// What a directory entry (or any file) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl EntryKind {
    pub fn is_dir(self) -> bool {
        self == EntryKind::Dir
    }

    pub fn from_std(t: std::fs::FileType) -> EntryKind {
        use std::os::unix::fs::FileTypeExt;
        if t.is_dir() {
            EntryKind::Dir
        } else if t.is_file() {
            EntryKind::File
        } else if t.is_symlink() {
            EntryKind::Symlink
        } else if t.is_fifo() {
            EntryKind::Fifo
        } else if t.is_socket() {
            EntryKind::Socket
        } else if t.is_char_device() {
            EntryKind::CharDevice
        } else if t.is_block_device() {
            EntryKind::BlockDevice
        } else {
            EntryKind::Other
        }
    }

    fn of(t: rustix::fs::FileType) -> Option<EntryKind> {
        use rustix::fs::FileType as T;
        Some(match t {
            T::Directory => EntryKind::Dir,
            T::RegularFile => EntryKind::File,
            T::Symlink => EntryKind::Symlink,
            T::Fifo => EntryKind::Fifo,
            T::Socket => EntryKind::Socket,
            T::CharacterDevice => EntryKind::CharDevice,
            T::BlockDevice => EntryKind::BlockDevice,
            T::Unknown => return None,
        })
    }
}

pub fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Opens `rel` beneath `root`. Absolute paths, `..` and symbolic links anywhere on the way
/// fail (ELOOP, EXDEV); with `O_PATH | O_NOFOLLOW` a link in the last place is opened
/// itself.
pub fn open(root: &OwnedFd, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    open_resolving(root, rel, flags, mode, ResolveFlags::empty())
}

/// `open`, never crossing into another file system mounted beneath the root (EXDEV).
pub fn open_on_root_fs(root: &OwnedFd, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    open_resolving(root, rel, flags, 0, ResolveFlags::NO_XDEV)
}

fn open_resolving(
    root: &OwnedFd,
    rel: &Path,
    flags: OFlags,
    mode: u32,
    extra: ResolveFlags,
) -> io::Result<OwnedFd> {
    let path: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let resolve =
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | extra;
    loop {
        match rustix::fs::openat2(
            root.as_fd(),
            path,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
            resolve,
        ) {
            // The kernel asks for a retry when a rename raced the resolution.
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
            other => return other.map_err(errno),
        }
    }
}

/// The parent directory and last component of `rel`, which must name something inside the
/// root (not the root itself, nor `..`).
pub fn split(rel: &Path) -> io::Result<(&Path, &OsStr)> {
    match rel.components().next_back() {
        Some(Component::Normal(name)) => Ok((rel.parent().unwrap_or(Path::new("")), name)),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// The entries of the open directory `fd` ("." and ".." left out), types filled in with an
/// `lstat` where the file system does not report them.
pub fn list(fd: OwnedFd) -> io::Result<Vec<super::DirEntry>> {
    let dir = rustix::fs::Dir::read_from(&fd)?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsString::from(OsStr::from_bytes(name));
        let kind = match EntryKind::of(entry.file_type()) {
            Some(k) => k,
            None => {
                match rustix::fs::statat(&fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => EntryKind::of(rustix::fs::FileType::from_raw_mode(st.st_mode))
                        .unwrap_or(EntryKind::Other),
                    // Gone since the listing: left out, as a later listing would.
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(errno(e)),
                }
            }
        };
        out.push(super::DirEntry { name, kind });
    }
    Ok(out)
}

/// A time for `utimensat`: `None` leaves it as it is.
pub fn timespec(t: Option<SystemTime>) -> Timespec {
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as _,
            },
            Err(e) => {
                let d = e.duration();
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                }
            }
        },
    }
}

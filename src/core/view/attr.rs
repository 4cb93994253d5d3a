//! File attributes as the core reports them; the FUSE adapter converts them for the kernel.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::inode::{FileType, Ino};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileType,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Content that changes on its own (the control file): the kernel must not cache it.
    pub volatile: bool,
    /// The BACKING file a non-directory is (device, inode): its hard links share an inode.
    pub source: Option<(u64, u64)>,
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(
            secs as u64,
            nsecs.clamp(0, 999_999_999) as u32,
        ))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    t.unwrap_or(UNIX_EPOCH)
}

impl Attr {
    /// The attributes of a backing file, shown as they are.
    pub fn from_backing(ino: Ino, m: &Metadata) -> Attr {
        Attr {
            ino,
            kind: FileType::from_std(m.file_type()),
            size: m.len(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            // A file with several names is several inodes to the kernel here (inodes are
            // names): a change through one name must show through the others at once.
            volatile: !m.is_dir() && m.nlink() > 1,
            source: (!m.is_dir()).then(|| (m.dev(), m.ino())),
        }
    }

    /// A virtual regular file of `size` bytes modified at `mtime`, owned like `owner`.
    pub fn virtual_file(ino: Ino, owner: &Metadata, size: u64, mtime: SystemTime) -> Attr {
        Attr {
            kind: FileType::File,
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            perm: (owner.mode() & 0o666) as u16,
            nlink: 1,
            ..Attr::from_backing(ino, owner)
        }
    }

    /// A virtual directory, owned like `owner` (the array directory).
    pub fn virtual_dir(ino: Ino, owner: &Metadata) -> Attr {
        Attr {
            kind: FileType::Dir,
            nlink: 2,
            ..Attr::from_backing(ino, owner)
        }
    }
}

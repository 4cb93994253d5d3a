//! Attribute changes (chmod, chown, truncate, utimes) of a BACKING file made by path on a
//! caller's behalf. The kernel checked the caller's permission against the attributes it
//! had cached; by the time the daemon, often root, acts, someone who may write the
//! directory could have put another user's file at that path. So the change is made on the
//! inode found there, held by a descriptor, and only after the caller's permission was
//! checked again against that very inode.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{AtFlags, Gid, Mode, OFlags, Timestamps, Uid};

use super::{Backing, beneath};

/// The change asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrChange {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
    /// The times asked are "now" (`touch`), which whoever may write the file may set; any
    /// other time is its owner's to set.
    pub times_now: bool,
}

/// Who asks: a user, their group, and the process (whose other groups count too). The
/// default is root (the daemon itself).
#[derive(Clone, Copy, Debug, Default)]
pub struct Asker {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Backing {
    /// Makes `change` to the file at `rel` itself (a symbolic link's own owner and times,
    /// never its target's), if `asker` may.
    pub fn change_attrs(&self, rel: &Path, asker: Asker, change: &AttrChange) -> io::Result<()> {
        let fd = self.open_beneath(rel, OFlags::PATH | OFlags::NOFOLLOW, 0)?;
        let st = rustix::fs::fstat(&fd)?;
        allowed(&st, asker, change)?;
        let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        // The descriptor pins the inode; its /proc name reaches exactly that inode.
        let pinned = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Some(size) = change.size {
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(&pinned)?
                .set_len(size)?;
        }
        if let Some(mode) = change.mode {
            if is_link {
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            // As the kernel does: a set-group-ID bit asked by someone outside the file's
            // group is dropped (else they could run a program as a group not theirs).
            let mut mode = mode & 0o7777;
            if asker.uid != 0 && !in_group(st.st_gid, asker) {
                mode &= !libc::S_ISGID;
            }
            rustix::fs::chmod(pinned.as_str(), Mode::from_raw_mode(mode))?;
        }
        if change.uid.is_some() || change.gid.is_some() {
            let (u, g) = (change.uid.map(Uid::from_raw), change.gid.map(Gid::from_raw));
            rustix::fs::chownat(&fd, "", u, g, AtFlags::EMPTY_PATH)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let times = Timestamps {
                last_access: beneath::timespec(change.atime),
                last_modification: beneath::timespec(change.mtime),
            };
            rustix::fs::utimensat(&fd, "", &times, AtFlags::EMPTY_PATH)?;
        }
        Ok(())
    }
}

impl Backing {
    /// The bytes (at most `limit`, else EFBIG) and metadata of the regular file at `rel`,
    /// if `asker` may read it: checked on the descriptor read from.
    pub fn read_as(
        &self,
        rel: &Path,
        limit: u64,
        asker: Asker,
    ) -> io::Result<Option<(Vec<u8>, std::fs::Metadata)>> {
        use std::io::Read;
        let mut file = match self.open(rel) {
            Ok(f) => f,
            Err(e) if super::is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        may_open(&meta, asker, true, false)?;
        if meta.len() > limit {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(meta.len() as usize)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        file.by_ref().take(limit).read_to_end(&mut out)?;
        Ok(Some((out, meta)))
    }
}

/// Whether `asker` may make `change` to the inode `st` describes, by the POSIX rules: the
/// mode and times (and a change of group, to one of the asker's) are its owner's; the
/// owner is root's; a truncation needs write permission.
fn allowed(st: &rustix::fs::Stat, asker: Asker, change: &AttrChange) -> io::Result<()> {
    if asker.uid == 0 {
        return Ok(());
    }
    let owner = st.st_uid == asker.uid;
    let denied = |errno| Err(io::Error::from_raw_os_error(errno));
    if change.uid.is_some_and(|u| u != st.st_uid) {
        return denied(libc::EPERM);
    }
    if !owner && (change.mode.is_some() || change.gid.is_some_and(|g| g != st.st_gid)) {
        return denied(libc::EPERM);
    }
    let times = change.atime.is_some() || change.mtime.is_some();
    if times && !owner && !change.times_now {
        return denied(libc::EPERM);
    }
    if (change.size.is_some() || (times && !owner)) && !writable(st, asker) {
        return denied(libc::EACCES);
    }
    Ok(())
}

/// Whether `asker` may write the inode `st` describes.
fn writable(st: &rustix::fs::Stat, asker: Asker) -> bool {
    permits(st.st_mode, st.st_uid, st.st_gid, asker, 0o2)
}

/// Whether the permission bits `want` (4 read, 2 write) of the class `asker` falls in are
/// set, for a file of `mode`, `uid` and `gid`.
fn permits(mode: u32, uid: u32, gid: u32, asker: Asker, want: u32) -> bool {
    let class = if uid == asker.uid {
        (mode >> 6) & 0o7
    } else if in_group(gid, asker) {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    };
    class & want == want
}

/// Whether `asker` may open the file `meta` describes to read and/or write it: checked on
/// the descriptor the daemon opened by path, as the kernel checked a view it had cached
/// (someone who may write the directory could have put another user's file at the name).
pub fn may_open(meta: &std::fs::Metadata, asker: Asker, read: bool, write: bool) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if asker.uid == 0 {
        return Ok(());
    }
    let want = if read { 0o4 } else { 0 } | if write { 0o2 } else { 0 };
    match permits(meta.mode(), meta.uid(), meta.gid(), asker, want) {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EACCES)),
    }
}

/// Whether `asker` may add and remove names in a directory of `owner` (write and search
/// permission), as the kernel would decide on the directory really there.
pub fn may_change_dir(owner: super::FileOwner, asker: Asker) -> io::Result<()> {
    may_use_dir(owner, asker, 0o3)
}

/// Whether `asker` has the permission bits `want` (4 read, 2 write, 1 search) on a
/// directory of `owner`.
pub fn may_use_dir(owner: super::FileOwner, asker: Asker, want: u32) -> io::Result<()> {
    match asker.uid == 0 || permits(owner.mode, owner.uid, owner.gid, asker, want) {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EACCES)),
    }
}

/// Whether `gid` is one of the asker's groups (the request names one; the process tells
/// the others).
fn in_group(gid: u32, asker: Asker) -> bool {
    gid == asker.gid || groups_of(asker).contains(&gid)
}

/// The asker's supplementary groups, as its process has them (none once it is gone).
pub(super) fn groups_of(asker: Asker) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", asker.pid));
    let groups = status.ok().and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
    });
    groups.unwrap_or_default()
}

//! The system's mount table, as `shardfs` commands look at it from outside a mount: which
//! mount is at a path (/proc/self/mountinfo, read as bytes: a mount point's name may be
//! anything another user chose, and one that is not UTF-8 must not hide the others), and a
//! mount point pinned by its parent directory, so that what was checked is what is
//! unmounted (a path a user can change could otherwise be swapped for another mount
//! between the check and the unmount, and root made to unmount that one).

use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// One line of the mount table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount's id (`mnt_id` in fdinfo).
    pub id: u64,
    /// `major:minor` of its filesystem.
    pub device: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: OsString,
    /// The owner the kernel recorded for a FUSE mount (`user_id=`): who mounted it,
    /// which nobody can forge (fusermount3 sets it to the real user).
    pub user_id: Option<u32>,
}

impl MountEntry {
    /// Whether this is a mount of shardfs (its source, `shardfs:BACKING`).
    pub fn is_shardfs(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.as_bytes().starts_with(b"shardfs:")
    }
}

/// `\040`-style escapes of mountinfo (space, tab, newline, backslash), undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(u8::is_ascii_digit));
        match (field[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// One mountinfo line, parsed.
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    let dash = fields.iter().position(|f| *f == b"-")?;
    let options = fields.get(dash + 3).copied().unwrap_or_default();
    let user_id = options
        .split(|&b| b == b',')
        .find_map(|o| o.strip_prefix(b"user_id="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
    Some(MountEntry {
        id: std::str::from_utf8(fields.first()?).ok()?.parse().ok()?,
        device: text(fields.get(2)?),
        mount_point: PathBuf::from(OsString::from_vec(unescape(fields.get(4)?))),
        fstype: text(fields.get(dash + 1)?),
        source: OsString::from_vec(unescape(fields.get(dash + 2)?)),
        user_id,
    })
}

/// The mount table of this process's mount namespace.
pub fn table() -> Vec<MountEntry> {
    let info = fs::read("/proc/self/mountinfo").unwrap_or_default();
    info.split(|&b| b == b'\n').filter_map(parse_line).collect()
}

/// The mount whose mount point is exactly `path` (the top one, if several).
pub fn at(path: &Path) -> Option<MountEntry> {
    table().into_iter().rev().find(|e| e.mount_point == path)
}

/// The mount a descriptor lies in (`mnt_id` of /proc/self/fdinfo).
fn mount_id(fd: &OwnedFd) -> io::Result<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no mnt_id in fdinfo"))
}

fn open_path(path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid C string; the descriptor returned is ours alone.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Whether `e` is what a FUSE mount whose daemon is gone answers: ENOTCONN, or, for a
/// request that was on its way when the connection went (the daemon killed just then),
/// ECONNABORTED.
pub fn is_disconnected(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED))
}

/// A mount point, held by its parent directory (opened once): every later look at it,
/// and its unmount, go through that directory, never again through the path given.
#[derive(Debug)]
pub struct Pinned {
    parent: OwnedFd,
    name: OsString,
    /// The mount found there when pinned.
    pub entry: MountEntry,
}

impl Pinned {
    /// The mount at `path` (absolute, its links resolved: the last component is not
    /// followed), or `None` when no mount is there.
    pub fn find(path: &Path) -> io::Result<Option<Pinned>> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(None); // `/`
        };
        let parent = open_path(parent, libc::O_DIRECTORY)?;
        let Some(id) = mount_at(&parent, name)? else {
            return Ok(None);
        };
        let entry = table().into_iter().find(|e| e.id == id);
        Ok(entry.map(|entry| Pinned {
            parent,
            name: name.to_os_string(),
            entry,
        }))
    }

    /// The path through the pinned directory: `/proc/self/fd/N/NAME`.
    pub fn path(&self) -> PathBuf {
        through(&self.parent, &self.name)
    }

    /// Whether the mount pinned is still the one at its name.
    pub fn still_there(&self) -> bool {
        mount_at(&self.parent, &self.name).ok().flatten() == Some(self.entry.id)
    }

    /// Whether it is a FUSE mount whose daemon is gone. `statfs` always reaches the daemon
    /// (a `stat` may be answered from the kernel's attribute cache), so it tells
    /// (`is_disconnected`).
    pub fn is_dead(&self) -> bool {
        let Ok(root) = open_path(&self.path(), libc::O_NOFOLLOW) else {
            return false;
        };
        // SAFETY: `root` is an open descriptor and `buf` a properly sized out-parameter.
        let failed = unsafe {
            let mut buf: libc::statfs = std::mem::zeroed();
            libc::fstatfs(root.as_raw_fd(), &mut buf) != 0
        };
        failed && is_disconnected(&io::Error::last_os_error())
    }

    /// Unmounts what is at the name (root only: `umount2`), its last component never
    /// followed.
    pub fn umount(&self, flags: i32) -> io::Result<()> {
        let c = CString::new(self.path().as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `c` is a valid C string.
        match unsafe { libc::umount2(c.as_ptr(), flags | libc::UMOUNT_NOFOLLOW) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The name of the mount point, for messages.
    pub fn shown(&self) -> String {
        self.entry.mount_point.display().to_string()
    }
}

/// `NAME` in the directory `dir` holds open: `/proc/self/fd/N/NAME`.
fn through(dir: &OwnedFd, name: &OsStr) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

/// The id of the mount whose root is at `name` in `dir` now, if one is (its root lies in
/// another mount than the directory).
fn mount_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Option<u64>> {
    let below = mount_id(dir)?;
    let root = open_path(&through(dir, name), libc::O_NOFOLLOW)?;
    let id = mount_id(&root)?;
    Ok((id != below).then_some(id))
}

/// Whether `path` is, or lies in, a FUSE mount whose daemon is gone.
pub fn is_dead_at(path: &Path) -> bool {
    match Pinned::find(path) {
        Ok(Some(pinned)) => pinned.is_dead(),
        Ok(None) => false,
        Err(e) => is_disconnected(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountinfo_line_is_read_as_bytes() {
        let line = b"36 35 0:42 / /home/a/m\\040x\xff rw,nosuid - fuse shardfs:/b\\134c \
                     rw,user_id=1002,group_id=1002,default_permissions";
        let e = parse_line(line).unwrap();
        assert_eq!(e.id, 36);
        assert_eq!(e.device, "0:42");
        assert_eq!(e.mount_point.as_os_str().as_bytes(), b"/home/a/m x\xff");
        assert_eq!(e.source, OsStr::from_bytes(b"shardfs:/b\\c"));
        assert_eq!(e.user_id, Some(1002));
        assert!(e.is_shardfs());
        let optional = b"25 1 8:1 / / rw shared:1 master:2 - ext4 /dev/sda1 rw";
        let e = parse_line(optional).unwrap();
        assert_eq!((e.fstype.as_str(), e.user_id), ("ext4", None));
        assert!(!e.is_shardfs());
    }

    fn tmpfs(at: &Path) {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "none"])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {}", at.display());
    }

    /// Review of issue 20: a user who may change a directory on the way to a mount swapped
    /// it (renameat2 RENAME_EXCHANGE) for a link to where root had another mount, between
    /// the check and the unmount, and root's `shardfs unmount` unmounted that one. Pinned
    /// by its directory, the mount checked is the mount unmounted, whatever the path
    /// names meanwhile. (Root only: it mounts tmpfs.)
    #[test]
    fn the_mount_pinned_is_the_mount_unmounted_whatever_the_path_names_since() {
        if rustix::process::geteuid().as_raw() != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let home = d.path().canonicalize().unwrap();
        let (a, victim) = (home.join("a"), home.join("victim"));
        fs::create_dir_all(a.join("m")).unwrap();
        fs::create_dir_all(victim.join("m")).unwrap();
        tmpfs(&a.join("m"));
        tmpfs(&victim.join("m"));
        let pinned = Pinned::find(&a.join("m")).unwrap().unwrap();
        assert_eq!(pinned.entry.fstype, "tmpfs");
        assert!(pinned.still_there());
        // The swap: `a` becomes a link to `victim`, the real `a` moves aside.
        std::os::unix::fs::symlink(&victim, home.join("link")).unwrap();
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &a,
            rustix::fs::CWD,
            home.join("link"),
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .unwrap();
        assert!(at(&victim.join("m")).is_some());
        pinned.umount(0).unwrap();
        assert!(
            at(&victim.join("m")).is_some(),
            "the other mount was unmounted"
        );
        assert!(
            at(&home.join("link").join("m")).is_none(),
            "the pinned one stays"
        );
        let _ = std::process::Command::new("umount")
            .arg(victim.join("m"))
            .status();
    }

    /// A mount point whose name is not UTF-8 hides no other mount (review of issue 20:
    /// the table was read as text, and one such name made every other mount unknown).
    #[test]
    fn a_name_that_is_not_utf8_hides_no_other_mount() {
        if rustix::process::geteuid().as_raw() != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let home = d.path().canonicalize().unwrap();
        let odd = home.join(OsStr::from_bytes(b"\xff"));
        let plain = home.join("plain");
        fs::create_dir_all(&odd).unwrap();
        fs::create_dir_all(&plain).unwrap();
        tmpfs(&odd);
        tmpfs(&plain);
        assert!(at(&plain).is_some());
        assert!(at(&odd).is_some());
        for m in [&odd, &plain] {
            let _ = std::process::Command::new("umount").arg(m).status();
        }
    }

    #[test]
    fn the_root_directory_is_found_mounted() {
        assert!(at(Path::new("/")).is_some());
        assert!(table().iter().any(|e| e.id > 0));
    }
}

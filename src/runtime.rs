//! The daemon's runtime files: its private directory (status files, default logs) and the
//! log file. On a shared machine these are where another local user would attack a root
//! daemon (a directory made first, a symlink or FIFO where the log goes), so the directory
//! must be ours and closed to others, and nothing in it is opened through a link or as
//! anything but a regular file.
//!
//! Where: `$SHARDFS_RUNTIME_DIR` if set; else `/run/shardfs` for root; else
//! `$XDG_RUNTIME_DIR/shardfs`; else `$TMPDIR/shardfs-UID`. Also where a user's cache of
//! object stores goes (`cache_dir`).

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    euid() == 0
}

/// The FUSE tools' set-user-ID helper through which a user other than root mounts and
/// unmounts, found where the FUSE library (`fuser`) that mounts looks for it:
/// `$FUSERMOUNT_PATH` if set (a bare name looked up on `PATH`), else `fusermount3` or the
/// older `fusermount` on `PATH`, else in `/sbin` and `/bin`.
pub fn fusermount() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = |name: &OsStr| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    };
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        let p = PathBuf::from(p);
        return match p.as_os_str().as_bytes().contains(&b'/') {
            true => Some(p).filter(|p| p.is_file()),
            false if p.as_os_str().is_empty() => None,
            false => on_path(p.as_os_str()),
        };
    }
    let names = ["fusermount3", "fusermount"].map(OsStr::new);
    names.iter().find_map(|n| on_path(n)).or_else(|| {
        ["/sbin", "/bin"].iter().find_map(|dir| {
            names
                .iter()
                .map(|n| Path::new(dir).join(n))
                .find(|p| p.is_file())
        })
    })
}

/// A directory named by an environment variable, used only when absolute (as the XDG
/// base directory rules ask: a relative one is ignored).
fn env_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// The temporary directory, absolute whatever `$TMPDIR` says: paths kept in a mount's
/// control file are read from other directories.
fn temp_dir() -> PathBuf {
    let t = std::env::temp_dir();
    std::path::absolute(&t).unwrap_or(t)
}

/// This user's cache directory of shardfs (object stores' local copies), made if missing
/// and checked: `/var/cache/shardfs` for root, else `$XDG_CACHE_HOME/shardfs` or
/// `~/.cache/shardfs`, made mode 0700 (the XDG rules: a user's caches are theirs alone;
/// they hold the user's data). Without a home, `$TMPDIR/shardfs-cache-UID`, a name
/// another user could take first: it must be a private directory of ours
/// (`ensure_private`), never a link or someone else's.
pub fn cache_dir() -> io::Result<PathBuf> {
    let base = if is_root() {
        PathBuf::from("/var/cache")
    } else if let Some(x) = env_dir("XDG_CACHE_HOME") {
        x
    } else if let Some(home) = env_dir("HOME") {
        home.join(".cache")
    } else {
        let guessed = temp_dir().join(format!("shardfs-cache-{}", euid()));
        ensure_private_for(
            &guessed,
            "cache directory",
            "set HOME or XDG_CACHE_HOME, or give --cache-dir",
        )?;
        guessed
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&base)?;
    only_ours_above(&base)?;
    let dir = base.join("shardfs");
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    // Followed if a link (a user may keep caches on scratch space), but it must be ours.
    let m = fs::metadata(&dir)?;
    if !m.is_dir() || m.uid() != euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cache directory {} refused: it is not a directory of uid {}; remove it, or \
                 give --cache-dir",
                dir.display(),
                euid()
            ),
        ));
    }
    if m.mode() & 0o077 != 0 {
        // Ours and made open by an older shardfs or by hand: closed now.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// Whether only this user (and root) may change `dir` and every directory above it: a
/// directory others may write, unless sticky, would let them put another in its place
/// (a cache that is theirs to read, or to fill with a journal to replay).
fn only_ours_above(dir: &Path) -> io::Result<()> {
    match changeable_by_others(dir, &[euid(), 0], true)? {
        None => Ok(()),
        Some((p, _)) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cache directory {} refused: {} may be changed by another user; set \
                 XDG_CACHE_HOME to a directory of your own, or give --cache-dir",
                dir.display(),
                p.display()
            ),
        )),
    }
}

/// The first of `path` (canonical) and the directories above it that a user other than
/// those of `trusted` may change, with whether it is because they may write it (else it
/// is not theirs). Where `sticky_ok`, a sticky directory above `path` is closed enough:
/// nobody may move there what is not theirs.
pub fn changeable_by_others(
    path: &Path,
    trusted: &[u32],
    sticky_ok: bool,
) -> io::Result<Option<(PathBuf, bool)>> {
    let real = fs::canonicalize(path)?;
    for (i, p) in real.ancestors().enumerate() {
        let m = fs::metadata(p)?;
        let sticky = sticky_ok && i > 0 && m.mode() & libc::S_ISVTX != 0;
        let open = m.mode() & 0o022 != 0 && !sticky;
        if open || !trusted.contains(&m.uid()) {
            return Ok(Some((p.to_path_buf(), open)));
        }
    }
    Ok(None)
}

/// The private directory's path (not made yet: `ensure_private`), absolute.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHARDFS_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return std::path::absolute(&d).unwrap_or(d);
    }
    if euid() == 0 {
        return PathBuf::from("/run/shardfs");
    }
    match env_dir("XDG_RUNTIME_DIR") {
        Some(x) => x.join("shardfs"),
        None => temp_dir().join(format!("shardfs-{}", euid())),
    }
}

/// Makes `dir` (mode 0700) or checks the one there: a directory (not a link) owned by us
/// that nobody else can enter. Anything else is refused, never used or tightened: someone
/// else may hold it open already.
pub fn ensure_private(dir: &Path) -> io::Result<()> {
    ensure_private_for(
        dir,
        "runtime directory",
        "set SHARDFS_RUNTIME_DIR to a directory of your own (mode 0700)",
    )
}

/// `ensure_private` for the directory `what`, the refusal saying how else to go on (`fix`).
fn ensure_private_for(dir: &Path, what: &str, fix: &str) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let m = fs::symlink_metadata(dir)?;
    let why = if !m.is_dir() {
        Some("it is not a directory".to_string())
    } else if m.uid() != euid() {
        Some(format!("it belongs to uid {}, not {}", m.uid(), euid()))
    } else if m.mode() & 0o077 != 0 {
        Some(format!("others may use it (mode {:o})", m.mode() & 0o7777))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what} {} refused: {why}; remove it, or {fix}",
                dir.display()
            ),
        )),
    }
}

/// Whether process `pid` is one of this user's.
pub fn is_our_process(pid: u32) -> bool {
    fs::symlink_metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == euid())
}

/// Whether `status_file`, named by a mount's control file, is one a daemon of ours wrote:
/// `<pid>.status` for `pid`, a process of our user, in a directory of ours closed to
/// others. Anything else is not read or removed: a FUSE file system another user mounted
/// under a `shardfs:` name could name any file (and make root remove it).
pub fn is_our_status_file(status_file: &Path, pid: u32) -> bool {
    let ours = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.uid() == euid());
    let named = status_file.file_name() == Some(std::ffi::OsStr::new(&format!("{pid}.status")));
    let private = status_file.parent().is_some_and(|dir| {
        fs::symlink_metadata(dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == euid() && m.mode() & 0o077 == 0)
    });
    named && private && ours(Path::new(&format!("/proc/{pid}")))
}

/// The default log file of the daemon serving `mountpoint`, in the private directory.
pub fn default_log_file(mountpoint: &Path) -> PathBuf {
    let mut name: String = mountpoint
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    // Within NAME_MAX however long the path, and told apart from paths that map alike
    // (`/a/b_c`, `/a_b/c`) by a hash of the path itself.
    let hash = crc32c::crc32c(mountpoint.as_os_str().as_encoded_bytes());
    name.truncate(200);
    dir().join(format!("{name}-{hash:08x}.log"))
}

/// Opens `path` for appending log lines (made 0600 if new): never through a symlink, never
/// blocking on the open (a FIFO would), and only a regular file is accepted.
pub fn open_log(path: &Path) -> io::Result<File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = file.metadata()?;
    let kind = m.file_type();
    // Someone else's file (or a hard link to one) would let them read what the daemon
    // logs, or have it append to what they chose.
    let why = if kind.is_fifo() {
        Some("it is a FIFO".to_string())
    } else if !kind.is_file() {
        Some("it is not a regular file".to_string())
    } else if m.uid() != euid() {
        Some(format!("it belongs to uid {}, not {}", m.uid(), euid()))
    } else if m.nlink() != 1 {
        Some(format!("it has {} names (a hard link)", m.nlink()))
    } else {
        None
    };
    match why {
        None => Ok(file),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("log file {} refused: {why}", path.display()),
        )),
    }
}

/// Writes a file of ours (0600), never through a link.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?
        .write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Issue 18: `shardfs unmount` (as root) read and removed whatever status file a
    /// mount's control file named. Only a `<pid>.status` of a process of ours, in a
    /// private directory of ours, is believed.
    #[test]
    fn only_our_daemons_status_file_is_believed() {
        let dir = std::env::temp_dir().join(format!("shardfs-status-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        ensure_private(&dir).unwrap();
        let me = std::process::id();
        assert!(is_our_status_file(&dir.join(format!("{me}.status")), me));
        assert!(!is_our_status_file(&dir.join("shadow"), me), "another name");
        assert!(
            !is_our_status_file(Path::new("/etc/1.status"), 1),
            "not private"
        );
        if euid() == 0 {
            // A process of another user.
            let mut other = std::process::Command::new("setpriv")
                .args([
                    "--reuid=4321",
                    "--regid=4321",
                    "--clear-groups",
                    "sleep",
                    "5",
                ])
                .spawn()
                .unwrap();
            let pid = other.id();
            // Until setpriv has switched users (under load, more than a moment).
            let proc_dir = PathBuf::from(format!("/proc/{pid}"));
            for _ in 0..500 {
                if fs::symlink_metadata(&proc_dir).is_ok_and(|m| m.uid() == 4321) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(!is_our_status_file(&dir.join(format!("{pid}.status")), pid));
            let _ = other.kill();
            let _ = other.wait();
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            !is_our_status_file(&dir.join(format!("{me}.status")), me),
            "open dir"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_default_log_name_fits_and_tells_paths_apart() {
        let long = Path::new("/").join("d".repeat(250)).join("e".repeat(250));
        let name = default_log_file(&long);
        assert!(name.file_name().unwrap().len() <= 255);
        assert_ne!(
            default_log_file(Path::new("/a/b_c")),
            default_log_file(Path::new("/a_b/c"))
        );
    }

    #[test]
    fn a_directory_others_can_use_is_refused_and_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let ours = d.path().join("ours");
        ensure_private(&ours).unwrap();
        assert_eq!(fs::metadata(&ours).unwrap().mode() & 0o777, 0o700);
        let open = d.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private(&open).unwrap_err();
        assert!(e.to_string().contains("others may use it"), "{e}");
        assert_eq!(
            fs::metadata(&open).unwrap().mode() & 0o777,
            0o777,
            "tightened"
        );
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        assert!(ensure_private(&link).is_err(), "a symlink is not ours");
    }

    #[test]
    fn a_log_is_never_opened_through_a_link_or_as_a_fifo() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let link = d.path().join("link.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(open_log(&link).is_err());
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        let fifo = d.path().join("fifo.log");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        // Someone reads it (else the open alone fails, with ENXIO).
        let _reader = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = open_log(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let ok = d.path().join("ok.log");
        open_log(&ok).unwrap().write_all(b"line\n").unwrap();
        assert_eq!(fs::metadata(&ok).unwrap().mode() & 0o777, 0o600);
        let linked = d.path().join("linked.log");
        fs::hard_link(&ok, &linked).unwrap();
        let e = open_log(&linked).unwrap_err();
        assert!(e.to_string().contains("hard link"), "{e}");
        let theirs = d.path().join("theirs.log");
        fs::write(&theirs, b"").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        assert!(
            open_log(&theirs)
                .unwrap_err()
                .to_string()
                .contains("belongs to uid")
        );
    }
}

//! The backing directory: every file operation on BACKING goes through here, by path relative
//! to its root. Nothing here follows a symbolic link or leaves BACKING: paths are resolved
//! beneath a descriptor of the root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`,
//! and the last component is worked on with the `*at` calls that do not follow it. Shard
//! files are replaced atomically (temporary file + rename), under the shard lock of
//! `lock.rs` when other writers may share BACKING.

mod beneath;
pub mod lock;

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

mod acting;
pub mod held;
pub mod owner;
pub mod pinned;
pub use acting::as_user;
pub use beneath::EntryKind;
use beneath::{errno, split};
pub use held::{DirNow, HeldDir, Identified};
pub use owner::FileOwner;
pub use pinned::{Asker, AttrChange, may_change_dir, may_open, may_use_dir};

/// What identifies one version of a file: a rewrite (new inode by rename, or new size or
/// mtime in place) changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVersion {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

/// The inode generation of `file` (FS_IOC_GETVERSION), where the file system keeps one: it
/// changes when an inode number is reused, which sizes and times alone cannot show within
/// one timestamp tick.
pub fn generation(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut generation: libc::c_long = 0;
    // SAFETY: FS_IOC_GETVERSION writes one long through the pointer, which outlives the call.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::FS_IOC_GETVERSION,
            &mut generation as *mut libc::c_long,
        )
    };
    (rc == 0).then_some(generation as u64)
}

impl FileVersion {
    pub fn of(m: &Metadata) -> FileVersion {
        FileVersion {
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        }
    }
}

pub fn mtime_of(m: &Metadata) -> SystemTime {
    m.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

#[derive(Debug, Clone)]
pub struct Backing {
    /// The root as the user named it (canonical), for messages only.
    root: PathBuf,
    /// Everything is reached beneath this descriptor.
    root_fd: Arc<OwnedFd>,
}

/// One entry of a backing directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: EntryKind,
}

/// How a BACKING file is opened for a client.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub truncate: bool,
    pub append: bool,
    /// Create it; it must not exist yet. The value is the new file's mode.
    pub create_new: Option<u32>,
}

impl Backing {
    pub fn new(root: PathBuf) -> io::Result<Backing> {
        let fd = rustix::fs::open(
            &root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(Backing {
            root,
            root_fd: Arc::new(fd),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The full path, for messages (never opened by that name).
    pub fn path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// Opens `rel` beneath the root without following any symbolic link on the way.
    fn open_beneath(&self, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        beneath::open(&self.root_fd, rel, flags, mode)
    }

    /// The directory `rel` (the root for an empty path), open for `*at` calls and fsync.
    fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)
    }

    /// The directory holding `rel`, and the last component's name.
    fn parent(&self, rel: &Path) -> io::Result<(OwnedFd, OsString)> {
        let (dir, name) = split(rel)?;
        Ok((self.dir(dir)?, name.to_os_string()))
    }

    /// `lstat`: `Ok(None)` when nothing is there.
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Metadata>> {
        match self.open_beneath(rel, OFlags::PATH | OFlags::NOFOLLOW, 0) {
            Ok(fd) => File::from(fd).metadata().map(Some),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Which directory is at `rel` now: its inode and birth time, so that a directory
    /// removed and made again at the same path is another one. Empty (nothing claimed)
    /// when nothing is there or the file system tells no birth time: an inode number alone
    /// proves little (it is reused, and a FUSE file system may number anew at every mount).
    pub fn dir_instance(&self, rel: &Path) -> String {
        match self.stat(rel) {
            Ok(Some(meta)) => instance_of(&meta),
            _ => String::new(),
        }
    }

    /// `stat`, of something on BACKING's own file system only: a file system mounted
    /// beneath its root (a FUSE mount there, which could be this very mount) is not
    /// entered, and gives EXDEV.
    pub fn stat_on_root_fs(&self, rel: &Path) -> io::Result<Option<Metadata>> {
        match beneath::open_on_root_fs(&self.root_fd, rel, OFlags::PATH | OFlags::NOFOLLOW) {
            Ok(fd) => File::from(fd).metadata().map(Some),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens a regular file. Anything else (a FIFO, a device, a symbolic link) is refused
    /// without blocking: a request thread must never wait on a FIFO's other end.
    pub fn open_file(&self, rel: &Path, how: OpenMode) -> io::Result<File> {
        let mut flags = match (how.read, how.write) {
            (_, false) => OFlags::RDONLY,
            (false, true) => OFlags::WRONLY,
            (true, true) => OFlags::RDWR,
        };
        flags |= OFlags::NOFOLLOW | OFlags::NONBLOCK;
        if how.truncate {
            flags |= OFlags::TRUNC;
        }
        if how.append {
            flags |= OFlags::APPEND;
        }
        let mut mode = 0;
        if let Some(m) = how.create_new {
            flags |= OFlags::CREATE | OFlags::EXCL;
            mode = m;
        }
        let file = File::from(self.open_beneath(rel, flags, mode)?);
        // O_NONBLOCK only guarded the open: on the regular file it must be, it changes
        // nothing.
        if !file.metadata()?.is_file() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(file)
    }

    pub fn open(&self, rel: &Path) -> io::Result<File> {
        self.open_file(
            rel,
            OpenMode {
                read: true,
                ..OpenMode::default()
            },
        )
    }

    pub fn read(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        self.read_at_most(rel, u64::MAX)
    }

    /// Reads a whole regular file of at most `limit` bytes; a larger one is EFBIG, before
    /// anything is allocated for it.
    pub fn read_at_most(&self, rel: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
        let mut file = match self.open(rel) {
            Ok(f) => f,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len > limit {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        let mut out = Vec::with_capacity(len as usize);
        file.by_ref().take(limit).read_to_end(&mut out)?;
        Ok(Some(out))
    }

    /// The entries of a directory; an absent directory has none.
    pub fn list(&self, rel: &Path) -> io::Result<Vec<DirEntry>> {
        match self.dir(rel) {
            Ok(fd) => beneath::list(fd),
            Err(e) if is_absent(&e) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let (dir, name) = self.parent(rel)?;
        let target = rustix::fs::readlinkat(&dir, name.as_os_str(), Vec::new())?;
        Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
    }

    /// Makes the directory `rel` and its missing parents.
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        self.create_dir_all_within(rel, Path::new(""))
    }

    /// Makes the directory `rel` and its missing parents below `within`, which is never
    /// made (ENOENT when it is not there): an array directory that another mount moved
    /// away meanwhile is not made again at its old path by a shard written into it.
    pub fn create_dir_all_within(&self, rel: &Path, within: &Path) -> io::Result<()> {
        match self.dir(rel) {
            Ok(_) => return Ok(()),
            Err(e) if !is_absent(&e) => return Err(e),
            Err(_) => {}
        }
        if !rel.starts_with(within) {
            return self.create_dir_all(rel);
        }
        if rel == within {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if let Some(parent) = rel.parent() {
            self.create_dir_all_within(parent, within)?;
        }
        let (parent, name) = self.parent(rel)?;
        // Made mode 0 until it is its parent's owner's, with the parent's mode: nobody else
        // may use it before, and nobody else can make such a directory of the daemon's.
        // (A daemon of an ordinary user could not open it so; it gives nothing away.)
        let root = rustix::process::geteuid().is_root();
        let first = Mode::from_raw_mode(if root { 0 } else { 0o700 });
        // One directory made at a time in this process: another of our threads finding it
        // made (EEXIST) must not put anything in it before it is checked and given away,
        // or the check below would take our own child for someone else's swap.
        static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _making = crate::sync::lock(&MAKING);
        match rustix::fs::mkdirat(&parent, name.as_os_str(), first) {
            Err(e) if e == rustix::io::Errno::EXIST => return Ok(()),
            r => r?,
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        let made = File::from(rustix::fs::openat(
            &parent,
            name.as_os_str(),
            flags,
            Mode::empty(),
        )?);
        let m = made.metadata()?;
        // Someone who may write the parent could have swapped another directory in at the
        // name (RENAME_EXCHANGE): that one is not given away.
        let ours = m.uid() == rustix::process::geteuid().as_raw()
            && m.mode() & 0o7777 == first.as_raw_mode()
            && m.nlink() <= 2;
        if !ours {
            return Err(io::Error::other(format!(
                "{}: another directory was put at the name as it was made",
                rel.display()
            )));
        }
        let parent_meta = File::from(parent).metadata()?;
        owner::give(&made, FileOwner::for_dir_in(&parent_meta))
    }

    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(mode))?;
        Ok(())
    }

    pub fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::unlinkat(&dir, name.as_os_str(), AtFlags::REMOVEDIR)?;
        Ok(())
    }

    /// Removes a file; `Ok(false)` when it was not there.
    pub fn remove_file(&self, rel: &Path) -> io::Result<bool> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if is_absent(&e) => return Ok(false),
            Err(e) => return Err(e),
        };
        match rustix::fs::unlinkat(&dir, name.as_os_str(), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(e) if is_absent(&e.into()) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rename_with(from, to, RenameFlags::empty())
    }

    /// Swaps two names atomically.
    pub fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.rename_with(a, b, RenameFlags::EXCHANGE)
    }

    fn rename_with(&self, from: &Path, to: &Path, flags: RenameFlags) -> io::Result<()> {
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        rustix::fs::renameat_with(&fdir, fname.as_os_str(), &tdir, tname.as_os_str(), flags)?;
        Ok(())
    }

    /// A hard link; a symbolic link at `from` is linked itself, never its target.
    pub fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        rustix::fs::linkat(
            &fdir,
            fname.as_os_str(),
            &tdir,
            tname.as_os_str(),
            AtFlags::empty(),
        )?;
        Ok(())
    }

    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::symlinkat(target, &dir, name.as_os_str())?;
        Ok(())
    }

    /// mknod of a FIFO, socket or device; `mode` holds the file type bits.
    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let ty = rustix::fs::FileType::from_raw_mode(mode);
        let perm = Mode::from_raw_mode(mode & 0o7777);
        rustix::fs::mknodat(&dir, name.as_os_str(), ty, perm, rdev)?;
        Ok(())
    }

    /// Replaces the file at `rel` with `buffers`, atomically: one vectored write (looped
    /// only on short writes) to a temporary file in the same directory, `fdatasync` so that
    /// a crash can never leave a torn file under the final name, then `rename`. With
    /// `durable`, the directory is synced too, making the rename itself durable. Returns
    /// the new file's metadata, and the file (open to read and write).
    pub fn write_atomic(
        &self,
        rel: &Path,
        buffers: &[Bytes],
        durable: bool,
        owner: Option<FileOwner>,
    ) -> io::Result<(Metadata, File)> {
        let (dir_rel, name) = split(rel)?;
        self.create_dir_all(dir_rel)?;
        let owner = match owner {
            Some(o) => o,
            None => self.owner_for(rel)?,
        };
        let (tmp, mut file) = self.create_temp(dir_rel, &name.to_string_lossy())?;
        let result = (|| {
            owner::give(&file, owner)?;
            crate::shard::write_all_vectored(&mut file, buffers)?;
            file.sync_data()?;
            self.rename(&tmp, rel)?;
            if durable {
                self.sync_dir(dir_rel)?;
            }
            file.metadata()
        })();
        match result {
            Ok(meta) => Ok((meta, file)),
            Err(e) => {
                let _ = self.remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// A new temporary file in `dir_rel` for a file `name` to be written there, open to
    /// read and write. Its name is random: a predictable one could be taken first by
    /// anyone who may write the directory, and every write of the file would fail.
    fn create_temp(&self, dir_rel: &Path, name: &str) -> io::Result<(PathBuf, File)> {
        let create = OpenMode {
            read: true,
            write: true,
            create_new: Some(0o600),
            ..OpenMode::default()
        };
        let mut tries = 0;
        loop {
            let tmp = dir_rel.join(temp_name(name, temp_token()));
            match self.open_file(&tmp, create) {
                // Another writer may prune the directory between its making and our create.
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries == 0 => {
                    self.create_dir_all(dir_rel)?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => {}
                other => return other.map(|f| (tmp, f)),
            }
            tries += 1;
        }
    }

    /// Who a file written at `rel` belongs to when nobody says: the owner and mode of the
    /// file it replaces, else what a file made in its directory takes.
    pub fn owner_for(&self, rel: &Path) -> io::Result<FileOwner> {
        if let Some(m) = self.stat(rel)?.filter(Metadata::is_file) {
            return Ok(FileOwner::of(&m));
        }
        let dir = rel.parent().unwrap_or(Path::new(""));
        let m = self
            .stat(dir)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(FileOwner::for_file_in(&m))
    }

    /// Removes the empty directories from `rel` upwards, stopping before `stop` (which is
    /// kept) or at the first directory that is not empty.
    pub fn prune_empty_dirs(&self, rel: &Path, stop: &Path) {
        let mut dir = rel.to_path_buf();
        while dir.starts_with(stop) && dir != stop && !dir.as_os_str().is_empty() {
            if self.remove_dir(&dir).is_err() {
                return;
            }
            if !dir.pop() {
                return;
            }
        }
    }

    pub fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        rustix::fs::fsync(self.dir(rel)?)?;
        Ok(())
    }

    /// fdatasync of the regular file at `rel` and fsync of its directory: the file's
    /// content and name are durable. `Ok(false)` when nothing is there any more.
    pub fn sync_file_and_dir(&self, rel: &Path) -> io::Result<bool> {
        let (dir, _) = split(rel)?;
        match self.open(rel) {
            // Only what a sync itself says is a failed sync (which no later sync may undo).
            Ok(f) => f.sync_data()?,
            // Removed, or its directory moved away or replaced (another mount), or something
            // else than a file at its path now (EINVAL, ENXIO: a directory, a FIFO, a
            // socket): its removal is made durable, in the nearest directory still there
            // (empty ones above it may have gone too).
            Err(e) if is_absent(&e) || is_name_error(&e) || not_a_file(&e) => {
                for d in dir.ancestors() {
                    match self.sync_dir_chain(d) {
                        Err(e) if is_absent(&e) || is_name_error(&e) => continue,
                        r => return r.map(|_| false),
                    }
                }
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        match self.sync_dir_chain(dir) {
            // Its directory moved since the file was found: the move is its mover's to make
            // durable.
            Err(e) if is_absent(&e) || is_name_error(&e) => Ok(true),
            other => other.map(|()| true),
        }
    }

    /// Syncs directory `rel` and every directory above it: a directory made for a new
    /// shard is durable only once its parent is synced too.
    pub fn sync_dir_chain(&self, rel: &Path) -> io::Result<()> {
        for dir in rel.ancestors() {
            self.sync_dir(dir)?;
        }
        Ok(())
    }

    /// `statvfs` of the file system holding BACKING.
    pub fn statvfs(&self) -> io::Result<rustix::fs::StatVfs> {
        Ok(rustix::fs::fstatvfs(self.root_fd.as_fd())?)
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// ENOENT, or ENOTDIR from a path component that is a file: both mean "nothing there".
/// `Backing::dir_instance` of the file `meta` describes.
pub fn instance_of(meta: &Metadata) -> String {
    match meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
    {
        Some(born) => format!("{:x}-{:x}", meta.ino(), born.as_nanos()),
        None => String::new(),
    }
}

/// An error in finding a file by its path (a component replaced by a file or a link, or
/// a mount crossed), as opposed to one of the file itself.
pub fn is_name_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTDIR | libc::ELOOP | libc::EXDEV)
    )
}

/// The error of opening something that is not a regular file as one.
fn not_a_file(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENXIO | libc::EISDIR)
    )
}

pub fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

pub fn join_rel(dir: &Path, name: &OsStr) -> PathBuf {
    if dir.as_os_str().is_empty() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    }
}

/// The temporary name a file `name` is written under before its rename: unique (the pid
/// and a counter), and never longer than a name may be (NAME_MAX, 255 bytes), however long
/// `name` is.
/// 64 random bits for a temporary name (the counter, mixed with the time, if the kernel
/// has none to give).
fn temp_token() -> u64 {
    let mut token = [0u8; 8];
    // SAFETY: `token` is a valid buffer of its length.
    let got = unsafe { libc::getrandom(token.as_mut_ptr().cast(), token.len(), 0) };
    if got == token.len() as isize {
        return u64::from_ne_bytes(token);
    }
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ t
}

fn temp_name(name: &str, n: u64) -> String {
    let suffix = format!(".shardfs-{}-{n:016x}", std::process::id());
    let room = 255 - 1 - suffix.len();
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}{suffix}", &name[..cut])
}

#[cfg(test)]
mod temp_name_tests {
    #[test]
    fn a_temporary_name_always_fits() {
        let long = "é".repeat(127);
        let t = super::temp_name(&long, u64::MAX);
        assert!(t.len() <= 255, "{}", t.len());
        assert!(t.starts_with(".é") && t.ends_with(&format!("-{:x}", u64::MAX)));
        assert_eq!(
            super::temp_name("x", 3),
            format!(".x.shardfs-{}-0000000000000003", std::process::id())
        );
        assert_ne!(super::temp_token(), super::temp_token(), "random names");
    }
}

#[cfg(test)]
mod within_tests {
    use super::*;
    use std::fs;

    /// From the review of the two-mount change (D5): a shard written into an array that
    /// another mount had just moved away made the array's directory again at its old
    /// path. Directories below `within` are made; `within` itself never is.
    #[test]
    fn the_directory_a_key_lives_within_is_never_made() {
        let dir = std::env::temp_dir().join(format!("shardfs-within-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a")).unwrap();
        let b = Backing::new(dir.clone()).unwrap();
        b.create_dir_all_within(Path::new("a/c/1"), Path::new("a"))
            .unwrap();
        assert!(dir.join("a/c/1").is_dir());
        let gone = b.create_dir_all_within(Path::new("moved/c/1"), Path::new("moved"));
        assert_eq!(gone.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(!dir.join("moved").exists());
        let within = lock::Within::path(Path::new("moved"));
        let lock = b.lock_key_within(Path::new("moved/c/0"), within);
        assert!(lock.is_err() && !dir.join("moved").exists());
        let _ = fs::remove_dir_all(&dir);
    }

    /// From the sixth review of the by-path fixes: a key is written only in the very
    /// directory its array was found in: the same inode number (freed, and given to another
    /// user's new directory) with another birth time is another directory.
    #[test]
    fn a_key_is_locked_only_inside_the_directory_it_belongs_to() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/c")).unwrap();
        let b = Backing::new(dir.path().to_path_buf()).unwrap();
        let found = b.identify(Path::new("a")).unwrap().unwrap();
        let within = |instance| lock::Within {
            rel: Path::new("a"),
            dir: Some(found.id),
            instance,
        };
        b.lock_key_within(Path::new("a/c/0"), within(&found.instance))
            .unwrap();
        let reused = b.lock_key_within(Path::new("a/c/0"), within("1-2"));
        assert_eq!(reused.unwrap_err().raw_os_error(), Some(libc::ESTALE));
        let other = lock::Within {
            dir: Some((found.id.0, found.id.1 + 1)),
            ..within("")
        };
        let elsewhere = b.lock_key_within(Path::new("a/c/0"), other);
        assert_eq!(elsewhere.unwrap_err().raw_os_error(), Some(libc::ESTALE));
    }

    /// From the review of `shardfs pack`: threads of one process making nested directories
    /// at once (shards of one array written in parallel) took each other's new
    /// subdirectory for someone else's swap ("another directory was put at the name").
    #[test]
    fn threads_making_the_same_directories_at_once_all_succeed() {
        for round in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let b = Backing::new(dir.path().to_path_buf()).unwrap();
            let start = std::sync::Barrier::new(8);
            std::thread::scope(|scope| {
                for t in 0..8 {
                    let (b, start) = (&b, &start);
                    scope.spawn(move || {
                        let rel = format!("c/{}/{}", t % 2, t);
                        start.wait();
                        b.create_dir_all(Path::new(&rel))
                            .unwrap_or_else(|e| panic!("round {round}, {rel}: {e}"));
                    });
                }
            });
            assert!(dir.path().join("c/1/7").is_dir());
        }
    }
}

//! The shard lock: how writers that share BACKING (other shardfs mounts, on this machine or
//! on others over a shared file system, and tensorstore's own `file` kvstore) replace a
//! file without losing each other's changes.
//!
//! The protocol is tensorstore's: to replace `KEY`, open `KEY.__lock` (created if needed,
//! never truncated by the opener), take an exclusive open-file-description lock on it,
//! check that the file locked is still the one named `KEY.__lock` (a previous holder may
//! have renamed it onto `KEY` or removed it meanwhile: then start again), read `KEY`, write
//! the new content into the lock file itself, sync it, rename it onto `KEY`, and only then
//! close it (which releases the lock). Everyone who read `KEY` under the lock therefore
//! read the latest version, and a read-merge-write never loses a concurrent one.

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

use super::Backing;
use super::beneath::{errno, split};

/// The suffix of lock files, as tensorstore names them.
pub const LOCK_SUFFIX: &str = ".__lock";

/// How long a writer waits for a lock held by someone else before giving up with EBUSY.
/// Holders keep it for one shard write; a longer wait means a holder that hangs.
const LOCK_WAIT: Duration = Duration::from_secs(120);

/// The lock file's name for `name`.
pub fn lock_name(name: &OsStr) -> OsString {
    let mut n = name.to_os_string();
    n.push(LOCK_SUFFIX);
    n
}

/// How much of a replacement is made durable before `replace` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Nothing: the new file may sit in the page cache (nobody asked for more yet).
    Later,
    /// The new content, before it takes the key's name: a crash can never leave a torn
    /// file where a whole one was (needed whenever an existing file is replaced).
    DataBeforeRename,
    /// Content and name both.
    Now,
}

/// The array directory a key lies below: the write never makes it (one moved away
/// meanwhile fails the write instead of being made again at its old path), and when its
/// device and inode are known (`dir`), the key's directory must be in that very
/// directory, whatever is at its path by then (ESTALE otherwise): someone who may rename
/// directories above the array could have put another user's array there.
#[derive(Clone, Copy, Debug)]
pub struct Within<'a> {
    pub rel: &'a Path,
    pub dir: Option<(u64, u64)>,
    /// Its instance (inode and birth time, `Backing::dir_instance`), when known: an inode
    /// number freed and given to another directory is not the same directory.
    pub instance: &'a str,
}

impl<'a> Within<'a> {
    /// Below `rel`, whichever directory is there.
    pub fn path(rel: &'a Path) -> Within<'a> {
        Within {
            rel,
            dir: None,
            instance: "",
        }
    }
}

/// An exclusive lock on one key of BACKING, held until dropped.
#[derive(Debug)]
pub struct KeyLock {
    dir: OwnedFd,
    dir_rel: PathBuf,
    name: OsString,
    lock_name: OsString,
    file: File,
    /// Renamed onto the key: nothing to clean up.
    done: bool,
}

impl Backing {
    /// Takes the lock of `rel` (its directory is made if needed).
    pub fn lock_key(&self, rel: &Path) -> io::Result<KeyLock> {
        self.lock_key_within(rel, Within::path(Path::new("")))
    }

    /// `lock_key`, for a key below `within`, which it never makes
    /// (`Backing::create_dir_all_within`).
    pub fn lock_key_within(&self, rel: &Path, within: Within) -> io::Result<KeyLock> {
        let (dir_rel, name) = split(rel)?;
        self.create_dir_all_within(dir_rel, within.rel)?;
        let dir = self.dir(dir_rel)?;
        if let Some(id) = within.dir {
            let depth = dir_rel
                .strip_prefix(within.rel)
                .map_or(0, |below| below.components().count());
            check_ancestor(&dir, depth, id, within.instance)?;
        }
        let lock_name = lock_name(name);
        let start = Instant::now();
        let mut replaced = 0;
        loop {
            let fd = rustix::fs::openat(
                &dir,
                lock_name.as_os_str(),
                OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o644),
            )
            .map_err(errno)?;
            let file = File::from(fd);
            lock_exclusive(&file, start)?;
            // Still the file that bears the lock's name? Else its holder renamed or removed
            // it while we waited: our lock guards nothing.
            let held = file.metadata()?;
            // The lock file becomes the shard: one with another name too (a hard link to a
            // file someone chose, where the kernel allows linking others' files) would
            // have that file overwritten. Such a name is taken away and made anew.
            if !held.is_file() || std::os::unix::fs::MetadataExt::nlink(&held) != 1 {
                replaced += 1;
                if replaced > 16 {
                    return Err(io::Error::other("a key's lock file keeps being replaced"));
                }
                tracing::warn!(lock = %self.path(&dir_rel.join(&lock_name)).display(),
                    "a key's lock file that is not a plain file of one name: replaced");
                let _ = rustix::fs::unlinkat(&dir, lock_name.as_os_str(), AtFlags::empty());
                continue;
            }
            match rustix::fs::statat(&dir, lock_name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_ino == std::os::unix::fs::MetadataExt::ino(&held) => {
                    return Ok(KeyLock {
                        dir,
                        dir_rel: dir_rel.to_path_buf(),
                        name: name.to_os_string(),
                        lock_name,
                        file,
                        done: false,
                    });
                }
                Ok(_) | Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(errno(e)),
            }
        }
    }
}

/// Whether the directory `depth` levels above `dir` (itself at 0) is `id` (device,
/// inode). The key's directory is open: what is above it now is where the write lands.
fn check_ancestor(dir: &OwnedFd, depth: usize, id: (u64, u64), instance: &str) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut at = rustix::io::dup(dir).map_err(errno)?;
    for _ in 0..depth {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        at = rustix::fs::openat(&at, "..", flags, Mode::empty()).map_err(errno)?;
    }
    let meta = File::from(at).metadata()?;
    let same = (meta.dev(), meta.ino()) == id
        && (instance.is_empty() || super::instance_of(&meta) == instance);
    if !same {
        return Err(io::Error::from_raw_os_error(libc::ESTALE));
    }
    Ok(())
}

impl Backing {
    /// Removes the lock file `name` in the directory `dir_rel` if nobody holds it: one a
    /// writer killed mid-write left. A held one (a writer at work) stays.
    pub fn remove_stale_lock(&self, dir_rel: &Path, name: &OsStr) -> io::Result<()> {
        let dir = self.dir(dir_rel)?;
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let file = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            // Gone, or not ours to remove: left as it is.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::ACCESS | rustix::io::Errno::ROFS) => {
                return Ok(());
            }
            Err(e) => return Err(errno(e)),
        };
        if !try_lock(&file)? {
            return Ok(());
        }
        // Removed while locked, and only if the name is still this file (as `KeyLock`'s
        // drop does): a waiter then finds the name gone and starts again.
        let held = file.metadata()?;
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_ino == std::os::unix::fs::MetadataExt::ino(&held) => {
                let _ = rustix::fs::unlinkat(&dir, name, AtFlags::empty());
            }
            _ => {}
        }
        Ok(())
    }
}

impl KeyLock {
    /// The key's file now, if there is one (a regular file), opened in the locked
    /// directory (never by a path from BACKING's root).
    pub fn current(&self) -> io::Result<Option<File>> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        match rustix::fs::openat(&self.dir, self.name.as_os_str(), flags, Mode::empty()) {
            Ok(fd) => {
                let file = File::from(fd);
                Ok(file.metadata()?.is_file().then_some(file))
            }
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Makes the file `from` (a path below BACKING's root, on its file system) the key, by
    /// a rename into the locked directory.
    pub fn take_from(&self, backing: &Backing, from: &Path) -> io::Result<()> {
        rustix::fs::renameat(&backing.root_fd, from, &self.dir, self.name.as_os_str())
            .map_err(errno)
    }

    /// Makes `buffers` the content of the key: written into the lock file, synced as
    /// `durability` asks, renamed onto the key. Returns the new file's metadata.
    /// Returns the new file's metadata and inode generation (`super::generation`).
    pub fn replace(
        self,
        buffers: &[Bytes],
        durability: Durability,
    ) -> io::Result<(Metadata, Option<u64>)> {
        let len: u64 = buffers.iter().map(|b| b.len() as u64).sum();
        self.replace_with(
            |file| {
                crate::shard::write_all_vectored(file, buffers)?;
                debug_assert_eq!(file.metadata()?.len(), len);
                Ok(())
            },
            durability,
        )
    }

    /// `replace`, the content written by `write` into the (empty) lock file.
    pub fn replace_with(
        mut self,
        write: impl FnOnce(&mut File) -> io::Result<()>,
        durability: Durability,
    ) -> io::Result<(Metadata, Option<u64>)> {
        // What the mount writes on its own belongs to its directory's owner (`owner`).
        let dir = File::from(self.dir.try_clone()?).metadata()?;
        super::owner::give(&self.file, super::FileOwner::for_file_in(&dir))?;
        // A stale, longer lock file left by a writer that died is cut to size.
        self.file.set_len(0)?;
        write(&mut self.file)?;
        if durability != Durability::Later {
            self.file.sync_data()?;
        }
        rustix::fs::renameat_with(
            &self.dir,
            self.lock_name.as_os_str(),
            &self.dir,
            self.name.as_os_str(),
            RenameFlags::empty(),
        )
        .map_err(errno)?;
        self.done = true;
        if durability == Durability::Now {
            rustix::fs::fsync(&self.dir).map_err(errno)?;
        }
        Ok((self.file.metadata()?, super::generation(&self.file)))
    }

    /// Removes the key. Returns whether it was there.
    pub fn remove(self) -> io::Result<bool> {
        match rustix::fs::unlinkat(&self.dir, self.name.as_os_str(), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(errno(e)),
        }
    }

    /// The directory holding the key, relative to BACKING's root.
    pub fn dir_rel(&self) -> &Path {
        &self.dir_rel
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        // Not renamed onto the key: the lock file goes, removed while still locked so that
        // a waiter finds its name gone and starts again.
        if !self.done {
            let _ = rustix::fs::unlinkat(&self.dir, self.lock_name.as_os_str(), AtFlags::empty());
        }
    }
}

/// Takes an exclusive open-file-description lock on the whole file without waiting.
/// Returns whether it was taken (someone else holds it otherwise).
pub fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: a zeroed `flock` is valid; the fields set below describe the whole file.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    // SAFETY: a valid descriptor and a pointer to a properly initialised struct.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// An exclusive open-file-description lock on the whole file (what tensorstore takes),
/// waited for in short steps up to `LOCK_WAIT` from `start`.
/// Set when the mount is giving up (`shardfs unmount --give-up`): a key lock another
/// process holds is not waited for any more, so that nobody (another user holding locks
/// on shards of theirs) keeps the mount from ending.
static NOT_WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, key locks held by others are not waited for (EBUSY at once).
pub fn stop_waiting() {
    NOT_WAITING.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn lock_exclusive(file: &File, start: Instant) -> io::Result<()> {
    let mut step = Duration::from_millis(1);
    loop {
        // SAFETY: a zeroed `flock` is valid; the fields set below describe the whole file.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        // SAFETY: a valid descriptor and a pointer to a properly initialised struct.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) | Some(libc::EINTR) => {}
            _ => return Err(e),
        }
        if start.elapsed() > LOCK_WAIT || NOT_WAITING.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        std::thread::sleep(step);
        step = (step * 2).min(Duration::from_millis(50));
    }
}

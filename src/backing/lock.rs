//! The shard lock: how writers that share BACKING (other shardfs mounts, on this machine or
//! on others over a shared file system, and tensorstore's own `file` kvstore) replace a
//! file without losing each other's changes.
//!
//! The protocol is tensorstore's: to replace `KEY`, open `KEY.__lock` (created if needed,
//! never truncated by the opener), take an exclusive open-file-description lock on it,
//! check that the file locked is still the one named `KEY.__lock` (a previous holder may
//! have renamed it onto `KEY` or removed it meanwhile: then start again), read `KEY`, write
//! the new content, rename it onto `KEY`, and only then close the lock file (which releases
//! the lock). Everyone who read `KEY` under the lock therefore read the latest version, and
//! a read-merge-write never loses a concurrent one.
//!
//! tensorstore writes its new content into the lock file itself and renames that. The
//! mount never does: a lock file is taken over by the next writer *without being
//! truncated*, so content left in one by a writer killed before its rename would end up
//! behind tensorstore's shorter shard, inside the shard it renames onto `KEY` (an old index
//! that still checksums, and readers reading another chunk's bytes without an error). The
//! mount writes into a staged file of its own (`.KEY.shardfs-staged`), renames that onto
//! `KEY` while holding the lock, and removes the lock file, empty, still locked. A staged
//! file left by a killed holder is only ever found by the next holder of the same lock,
//! which removes it.

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustix::fs::{AtFlags, Mode, OFlags};

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

/// Whether taking a key lock waits for its holder.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Yes,
    No,
}

/// An exclusive lock on one key of BACKING, held until dropped.
#[derive(Debug)]
pub struct KeyLock {
    dir: OwnedFd,
    dir_rel: PathBuf,
    name: OsString,
    lock_name: OsString,
    /// Held open (and so locked) until dropped.
    _lock_file: File,
}

impl Backing {
    /// Takes the lock of `rel` (its directory is made if needed).
    pub fn lock_key(&self, rel: &Path) -> io::Result<KeyLock> {
        self.lock_key_within(rel, Within::path(Path::new("")))
    }

    /// `lock_key`, for a key below `within`, which it never makes
    /// (`Backing::create_dir_all_within`).
    pub fn lock_key_within(&self, rel: &Path, within: Within) -> io::Result<KeyLock> {
        let (dir_rel, _) = split(rel)?;
        self.create_dir_all_within(dir_rel, within.rel)?;
        self.lock_existing_key(rel, within, Wait::Yes)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Removes the staged file `name` (`.KEY.shardfs-staged`) in `dir_rel` if nobody holds
    /// its key's lock: a writer killed mid-write left it. A held one (a writer at work)
    /// stays.
    pub fn remove_stale_staged(&self, dir_rel: &Path, name: &OsStr) -> io::Result<()> {
        let Some(key) = name.to_str().and_then(key_of_staged) else {
            return Ok(());
        };
        let rel = super::join_rel(dir_rel, OsStr::new(key));
        match self.lock_existing_key(&rel, Within::path(Path::new("")), Wait::No) {
            Ok(Some(lock)) => {
                let _ = rustix::fs::unlinkat(&lock.dir, name, AtFlags::empty());
                Ok(())
            }
            Ok(None) => Ok(()),
            // Not ours to remove: left as it is.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The key lock of `rel`, whose directory exists; `Ok(None)`: someone else holds it and
    /// `wait` says not to wait.
    fn lock_existing_key(
        &self,
        rel: &Path,
        within: Within,
        wait: Wait,
    ) -> io::Result<Option<KeyLock>> {
        let (dir_rel, name) = split(rel)?;
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
            match wait {
                Wait::Yes => lock_exclusive(&file, start)?,
                Wait::No if try_lock(&file)? => {}
                Wait::No => return Ok(None),
            }
            let held = file.metadata()?;
            let links = std::os::unix::fs::MetadataExt::nlink(&held);
            // Still the file that bears the lock's name? Else its holder renamed (tensorstore)
            // or removed (shardfs) it while we waited: our lock guards nothing.
            let named =
                match rustix::fs::statat(&dir, lock_name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => links > 0 && st.st_ino == std::os::unix::fs::MetadataExt::ino(&held),
                    Err(rustix::io::Errno::NOENT) => false,
                    Err(e) => return Err(errno(e)),
                };
            if !named {
                continue;
            }
            // Locked and named so: one with another name too (a hard link to a file someone
            // chose, where the kernel allows linking others' files) or not a plain file is
            // somebody's file, not a lock. It is taken away (under its lock) and made anew.
            if !held.is_file() || links != 1 {
                replaced += 1;
                if replaced > 16 {
                    return Err(io::Error::other("a key's lock file keeps being replaced"));
                }
                tracing::warn!(lock = %self.path(&dir_rel.join(&lock_name)).display(),
                    "a key's lock file that is not a plain file of one name: replaced");
                let _ = rustix::fs::unlinkat(&dir, lock_name.as_os_str(), AtFlags::empty());
                continue;
            }
            return Ok(Some(KeyLock {
                dir,
                dir_rel: dir_rel.to_path_buf(),
                name: name.to_os_string(),
                lock_name,
                _lock_file: file,
            }));
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
        &self,
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

    /// `replace`, the content written by `write` into a new, empty staged file.
    pub fn replace_with(
        &self,
        write: impl FnOnce(&mut File) -> io::Result<()>,
        durability: Durability,
    ) -> io::Result<(Metadata, Option<u64>)> {
        // What the mount writes on its own belongs to its directory's owner (`owner`).
        let dir = File::from(self.dir.try_clone()?).metadata()?;
        let (staged_name, mut staged) = self.create_staged()?;
        let renamed = (|| {
            super::owner::give(&staged, super::FileOwner::for_file_in(&dir))?;
            write(&mut staged)?;
            if durability != Durability::Later {
                staged.sync_data()?;
            }
            rustix::fs::renameat(&self.dir, &staged_name, &self.dir, self.name.as_os_str())
                .map_err(errno)
        })();
        if let Err(e) = renamed {
            let _ = rustix::fs::unlinkat(&self.dir, &staged_name, AtFlags::empty());
            return Err(e);
        }
        if durability == Durability::Now {
            rustix::fs::fsync(&self.dir).map_err(errno)?;
        }
        Ok((staged.metadata()?, super::generation(&staged)))
    }

    /// A new, empty file to stage the key's next content in, beside it. Its name is fixed,
    /// so that one left by a killed holder is found and removed by the next; a file under
    /// that name while the lock is held is such a leftover (or planted: never written).
    fn create_staged(&self) -> io::Result<(OsString, File)> {
        let staged_name = staged_name(&self.name);
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut tries = 0;
        loop {
            match rustix::fs::openat(&self.dir, &staged_name, flags, Mode::from_raw_mode(0o600)) {
                Ok(fd) => return Ok((staged_name, File::from(fd))),
                Err(rustix::io::Errno::EXIST) if tries < 4 => {
                    tracing::info!(staged = %staged_name.to_string_lossy(),
                        "a staged file left by a writer that stopped: removed");
                    // A directory there (someone made it, through the mount or in BACKING)
                    // goes too when empty; one that is not keeps the name taken.
                    let removed = rustix::fs::unlinkat(&self.dir, &staged_name, AtFlags::empty())
                        .or_else(|_| {
                            rustix::fs::unlinkat(&self.dir, &staged_name, AtFlags::REMOVEDIR)
                        });
                    if removed.is_err() && tries == 3 {
                        // Never blocked for good by what someone put there: a name of its
                        // own this once (a leftover of it is removed by `clear_leftovers`
                        // only if it has the fixed name, so one may stay after a kill).
                        return self.create_staged_elsewhere();
                    }
                }
                Err(e) => return Err(errno(e)),
            }
            tries += 1;
        }
    }

    /// A staged file under a random name (`.KEY.shardfs-staged-<hex>`), for when the fixed
    /// one is taken by something that cannot be removed (a directory holding files).
    fn create_staged_elsewhere(&self) -> io::Result<(OsString, File)> {
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut name = staged_name(&self.name);
        name.push(format!("-{:016x}", super::temp_token()));
        let fd = rustix::fs::openat(&self.dir, &name, flags, Mode::from_raw_mode(0o600))
            .map_err(errno)?;
        Ok((name, File::from(fd)))
    }

    /// Removes the key. Returns whether it was there.
    pub fn remove(&self) -> io::Result<bool> {
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
        // The lock file never holds content: it goes, removed while still locked so that a
        // waiter finds its name gone and starts again.
        let _ = rustix::fs::unlinkat(&self.dir, self.lock_name.as_os_str(), AtFlags::empty());
    }
}

/// The staged file's name for a key `name`: hidden, and never longer than a name may be
/// (NAME_MAX, 255 bytes), however long `name` is.
fn staged_name(name: &OsStr) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    const SUFFIX: &[u8] = STAGED_SUFFIX.as_bytes();
    let bytes = name.as_bytes();
    let mut staged = Vec::with_capacity(255);
    staged.push(b'.');
    if 1 + bytes.len() + SUFFIX.len() <= 255 {
        staged.extend_from_slice(bytes);
    } else {
        // Cut, and told apart from other long names that begin alike by a checksum of the
        // whole name: two keys never share a staged file.
        let sum = format!("-{:08x}", crc32c::crc32c(bytes));
        staged.extend_from_slice(&bytes[..255 - 1 - SUFFIX.len() - sum.len()]);
        staged.extend_from_slice(sum.as_bytes());
    }
    staged.extend_from_slice(SUFFIX);
    OsString::from_vec(staged)
}

/// The suffix of the file a key's next content is staged in (`create_staged`).
pub const STAGED_SUFFIX: &str = ".shardfs-staged";

/// The key whose staged file `name` is (`.KEY.shardfs-staged`), if it is one.
pub fn key_of_staged(name: &str) -> Option<&str> {
    name.strip_prefix('.')?
        .strip_suffix(STAGED_SUFFIX)
        .filter(|key| !key.is_empty())
}

/// An exclusive open-file-description lock request for the whole file, sent as `cmd`
/// (F_OFD_SETLK, F_OFD_GETLK): the call's result and the request as the kernel left it.
fn whole_file_lock(file: &File, cmd: libc::c_int) -> (libc::c_int, libc::flock) {
    // SAFETY: a zeroed `flock` is valid; the fields set below describe the whole file.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    // SAFETY: a valid descriptor and a pointer to a properly initialised struct, which
    // F_OFD_GETLK fills in.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    (rc, fl)
}

/// Takes an exclusive open-file-description lock on the whole file without waiting.
/// Returns whether it was taken (someone else holds it otherwise).
pub fn try_lock(file: &File) -> io::Result<bool> {
    if whole_file_lock(file, libc::F_OFD_SETLK).0 == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether someone holds a lock on `file` that an exclusive lock would wait for (asked
/// without taking one: F_OFD_GETLK).
pub fn held_by_someone(file: &File) -> bool {
    let (rc, fl) = whole_file_lock(file, libc::F_OFD_GETLK);
    rc == 0 && i32::from(fl.l_type) != libc::F_UNLCK
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
        if whole_file_lock(file, libc::F_OFD_SETLK).0 == 0 {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::io::{Seek, SeekFrom, Write};
    use std::path::Path;

    use super::*;

    /// Every file of `dir` with its content.
    fn files_of(dir: &Path) -> BTreeMap<OsString, Vec<u8>> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name(), fs::read(e.path()).unwrap()))
            .collect()
    }

    /// tensorstore's write of `KEY`: its lock file opened without truncation, its content
    /// written from 0, the lock file renamed onto `KEY`.
    fn tensorstore_writes(dir: &Path, content: &[u8]) {
        let lock = dir.join("0.__lock");
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(content).unwrap();
        f.sync_data().unwrap();
        fs::rename(&lock, dir.join("0")).unwrap();
    }

    /// A holder killed after writing a shard and before its rename leaves the directory
    /// as it was at that moment; tensorstore, writing a shorter shard next, must find
    /// nothing of the killed holder's in what becomes `KEY`.
    #[test]
    fn a_holder_killed_before_its_rename_leaves_nothing_tensorstore_takes_over() {
        let root = tempfile::tempdir().unwrap();
        let b = Backing::new(root.path().to_path_buf()).unwrap();
        fs::create_dir_all(root.path().join("a/c")).unwrap();
        fs::write(root.path().join("a/c/0"), b"old shard").unwrap();
        let mut at_the_kill = BTreeMap::new();
        let key = b.lock_key(Path::new("a/c/0")).unwrap();
        key.replace_with(
            |f| {
                f.write_all(&[7u8; 4096])?;
                f.sync_data()?;
                at_the_kill = files_of(&root.path().join("a/c"));
                Ok(())
            },
            Durability::DataBeforeRename,
        )
        .unwrap();
        drop(key);
        assert_eq!(fs::read(root.path().join("a/c/0")).unwrap(), [7u8; 4096]);
        let lock = OsString::from("0.__lock");
        assert_eq!(
            at_the_kill.get(&lock).map(Vec::len),
            Some(0),
            "{:?}",
            at_the_kill.keys()
        );
        let names: Vec<_> = files_of(&root.path().join("a/c")).into_keys().collect();
        assert_eq!(names, ["0"], "nothing left beside the key");

        // The directory as the killed holder left it, then tensorstore's write.
        let after_kill = tempfile::tempdir().unwrap();
        for (name, content) in &at_the_kill {
            fs::write(after_kill.path().join(name), content).unwrap();
        }
        tensorstore_writes(after_kill.path(), b"new shard");
        assert_eq!(fs::read(after_kill.path().join("0")).unwrap(), b"new shard");
    }

    /// The staged file a killed holder left is removed by the next holder, and the lock
    /// file it left (empty) is reused.
    #[test]
    fn the_next_holder_removes_a_staged_file_left_behind() {
        let root = tempfile::tempdir().unwrap();
        let b = Backing::new(root.path().to_path_buf()).unwrap();
        fs::create_dir_all(root.path().join("c")).unwrap();
        let staged = root.path().join(format!("c/.0{STAGED_SUFFIX}"));
        fs::write(&staged, [9u8; 100]).unwrap();
        fs::write(root.path().join("c/0.__lock"), b"").unwrap();
        let key = b.lock_key(Path::new("c/0")).unwrap();
        key.replace(&[Bytes::from_static(b"abc")], Durability::Now)
            .unwrap();
        drop(key);
        assert_eq!(fs::read(root.path().join("c/0")).unwrap(), b"abc");
        let names: Vec<_> = files_of(&root.path().join("c")).into_keys().collect();
        assert_eq!(names, ["0"]);
    }

    /// A waiter that locked the file its holder removed (nlink 0) starts again; it never
    /// takes away the lock file someone took meanwhile, which would let two hold the key.
    #[test]
    fn a_waiter_on_a_removed_lock_file_never_shares_the_key() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let root = tempfile::tempdir().unwrap();
        let b = std::sync::Arc::new(Backing::new(root.path().to_path_buf()).unwrap());
        let first = b.lock_key(Path::new("c/0")).unwrap();
        let waiter_has_it = std::sync::Arc::new(AtomicBool::new(false));
        let waiter = {
            let (b, has_it) = (b.clone(), waiter_has_it.clone());
            std::thread::spawn(move || {
                let lock = b.lock_key(Path::new("c/0")).unwrap();
                has_it.store(true, Ordering::SeqCst);
                drop(lock);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(first);
        // Taken at once by another, before the waiter's next try.
        let second = b.lock_key(Path::new("c/0")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!waiter_has_it.load(Ordering::SeqCst), "two hold one key");
        drop(second);
        waiter.join().unwrap();
        assert!(waiter_has_it.load(Ordering::SeqCst));
    }

    /// A directory someone made at the staged name (empty, or holding a file) never keeps
    /// the key from being written.
    #[test]
    fn a_directory_at_the_staged_name_never_blocks_the_key() {
        let root = tempfile::tempdir().unwrap();
        let b = Backing::new(root.path().to_path_buf()).unwrap();
        let staged = root.path().join(format!("c/.0{STAGED_SUFFIX}"));
        fs::create_dir_all(&staged).unwrap();
        let key = b.lock_key(Path::new("c/0")).unwrap();
        key.replace(&[Bytes::from_static(b"one")], Durability::Now)
            .unwrap();
        drop(key);
        assert!(!staged.exists(), "an empty directory is removed");
        fs::create_dir_all(staged.join("inside")).unwrap();
        let key = b.lock_key(Path::new("c/0")).unwrap();
        key.replace(&[Bytes::from_static(b"two")], Durability::Now)
            .unwrap();
        drop(key);
        assert_eq!(fs::read(root.path().join("c/0")).unwrap(), b"two");
    }

    #[test]
    fn a_staged_name_always_fits() {
        let long = OsString::from("x".repeat(255));
        let staged = staged_name(&long);
        assert_eq!(staged.len(), 255);
        assert!(staged.to_string_lossy().ends_with(STAGED_SUFFIX));
        let other = OsString::from("x".repeat(254) + "y");
        assert_ne!(staged_name(&other), staged, "long keys that begin alike");
        assert_eq!(staged_name(OsStr::new("0")), ".0.shardfs-staged");
    }
}

//! A power cut, for tests: a FUSE layer over a directory (the "disk") that keeps what is
//! written to each file in memory until that file is fsynced, the way a page cache does,
//! and loses it all at `Layer::cut`. What the disk then holds is what a power cut would
//! have left: every fsynced write, and nothing written since. LazyFS (used by Jepsen) does
//! the same for its users; this one is ours, small, and in the test process.
//!
//! Names (create, rename, unlink, mkdir, link) reach the disk at once, but a cut keeps
//! only those whose directory was fsynced since (`names`): a new name never synced is
//! gone, a removal never synced is undone. fsync of a file makes its data durable, not its
//! name (POSIX; ext4 and XFS happen to keep a new file's name too, others need not).
//! syncfs cannot be seen through FUSE (the kernel sends FUSE_SYNCFS to virtiofs only), so
//! whatever relies on it is not durable here: fsync each file and directory.

mod names;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, Session, TimeOrNow, WriteFlags,
};

/// A change to a file not yet on the disk.
#[derive(Clone)]
enum Change {
    Write(u64, Vec<u8>),
    Truncate(u64),
}

#[derive(Default)]
struct State {
    /// Inode numbers (the disk's own, so that they stay what they were across a cut; the
    /// root is 1) and the paths they name, relative to the disk.
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    root_ino: u64,
    handles: HashMap<u64, Arc<File>>,
    next_fh: u64,
    /// Unsynced changes per file, by the disk's (device, inode): a file's changes follow
    /// it through renames and every handle of it sees them.
    unsynced: HashMap<(u64, u64), Vec<Change>>,
}

struct Layer {
    disk: PathBuf,
    state: Mutex<State>,
    /// `true` once the power is cut. Every request holds it for reading while it works,
    /// so that the cut (which takes it for writing) comes between requests.
    off: Arc<RwLock<bool>>,
    names: Arc<Mutex<names::Names>>,
    /// fsync fails with EIO, and nothing reaches the disk (a failing writeback).
    fail_sync: Arc<AtomicBool>,
    /// Writes fail with ENOSPC (a full disk).
    full: Arc<AtomicBool>,
}

/// A mounted layer; `cut` ends it.
pub struct CutFs {
    pub mountpoint: PathBuf,
    disk: PathBuf,
    off: Arc<RwLock<bool>>,
    names: Arc<Mutex<names::Names>>,
    fail_sync: Arc<AtomicBool>,
    full: Arc<AtomicBool>,
    session: Option<fuser::BackgroundSession>,
}

type Res<T> = Result<T, Errno>;

fn errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

const TTL: Duration = Duration::ZERO;

impl CutFs {
    /// Mounts a layer over `disk` at `mountpoint`.
    pub fn mount(disk: &Path, mountpoint: &Path) -> CutFs {
        let off = Arc::new(RwLock::new(false));
        let names = Arc::new(Mutex::new(
            names::Names::snapshot(disk).expect("the disk's names are read"),
        ));
        let mut state = State {
            root_ino: fs::metadata(disk).map(|m| m.ino()).unwrap_or(1),
            next_fh: 1,
            ..State::default()
        };
        state.paths.insert(1, PathBuf::new());
        state.inos.insert(PathBuf::new(), 1);
        let fail_sync = Arc::new(AtomicBool::new(false));
        let full = Arc::new(AtomicBool::new(false));
        let layer = Layer {
            disk: disk.to_path_buf(),
            state: Mutex::new(state),
            off: off.clone(),
            names: names.clone(),
            fail_sync: fail_sync.clone(),
            full: full.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("cutfs".into())];
        config.n_threads = Some(4);
        let session = Session::new(layer, mountpoint, &config)
            .and_then(|s| s.spawn())
            .expect("the power-cut layer mounts");
        CutFs {
            mountpoint: mountpoint.to_path_buf(),
            disk: disk.to_path_buf(),
            off,
            names,
            fail_sync,
            full,
            session: Some(session),
        }
    }

    /// From now on (`true`) every fsync fails with EIO and reaches nothing, as when the
    /// disk fails a writeback; `false` ends that. A later fsync of the same file then
    /// succeeds and writes what it holds, kinder than Linux, which may have dropped it.
    pub fn fail_syncs(&self, on: bool) {
        self.fail_sync.store(on, Ordering::SeqCst);
    }

    /// From now on (`true`) every write fails with ENOSPC, as on a full disk; `false`
    /// frees the space.
    pub fn fill(&self, on: bool) {
        self.full.store(on, Ordering::SeqCst);
    }

    /// The power cut: from now on every request fails with EIO, and whatever was not
    /// fsynced is gone: file data, and names whose directory was not fsynced. The layer
    /// is unmounted.
    pub fn cut(mut self) {
        let mut off = self.off.write().unwrap_or_else(|e| e.into_inner());
        *off = true;
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names
            .restore(&self.disk)
            .expect("the disk is rebuilt from its durable names");
        drop((names, off));
        self.unmount();
    }

    fn unmount(&mut self) {
        super::mount::detach(&self.mountpoint);
        if let Some(s) = self.session.take() {
            // Lazily unmounted already: joining could wait on requests still in flight.
            // Its threads end once the kernel lets the connection go.
            std::mem::forget(s);
        }
    }
}

impl Drop for CutFs {
    fn drop(&mut self) {
        *self.off.write().unwrap_or_else(|e| e.into_inner()) = true;
        self.unmount();
    }
}

impl Layer {
    /// While the power is on, a guard that keeps it on.
    fn on(&self) -> Res<RwLockReadGuard<'_, bool>> {
        let on = self.off.read().unwrap_or_else(|e| e.into_inner());
        match *on {
            true => Err(Errno::from_i32(libc::EIO)),
            false => Ok(on),
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, names::Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The new name `rel` is noted (durable once its directory is fsynced).
    fn named(&self, rel: &Path) -> Res<()> {
        let full = self.full(rel);
        let (dir, name) = (
            full.parent().unwrap_or(&full),
            full.file_name().unwrap_or_default(),
        );
        self.names().set(dir, name).map_err(errno)
    }

    /// A rename of `from` (in the directory of inode `from_dir`) to `to` is noted.
    fn note_rename(&self, from_dir: u64, from: &Path, to: &Path, exchange: bool) -> Res<()> {
        let (from, to) = (self.full(from), self.full(to));
        let split = |p: &Path| -> (PathBuf, std::ffi::OsString) {
            let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (dir, p.file_name().unwrap_or_default().to_owned())
        };
        let ((fd, fname), (td, tname)) = (split(&from), split(&to));
        let to_dir = names::ino(&td).map_err(errno)?;
        self.names()
            .renamed((from_dir, &fd, &fname), (to_dir, &td, &tname), exchange)
            .map_err(errno)
    }

    /// Unlink or rmdir (`how`) of `name` in `parent`, noted (durable once its directory is
    /// fsynced).
    fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        how: fn(&Path) -> std::io::Result<()>,
    ) -> Res<()> {
        let _on = self.on()?;
        let rel = self.child(parent, name)?;
        let dir = self.dir_ino(&rel)?;
        how(&self.full(&rel)).map_err(errno)?;
        self.names().removed(dir, name);
        self.forget_path(&rel);
        Ok(())
    }

    /// The inode of the directory holding `rel`, before a name in it goes.
    fn dir_ino(&self, rel: &Path) -> Res<u64> {
        let full = self.full(rel);
        names::ino(full.parent().unwrap_or(&full)).map_err(errno)
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, ino: INodeNo) -> Res<PathBuf> {
        self.st()
            .paths
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::from_i32(libc::ENOENT))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Res<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.disk.join(rel)
    }

    /// The inode number of what `rel` names on the disk (`disk_ino`), remembered.
    fn ino_of(&self, rel: &Path, disk_ino: u64) -> u64 {
        let mut st = self.st();
        let i = if disk_ino == st.root_ino { 1 } else { disk_ino };
        if let Some(old) = st.inos.insert(rel.to_path_buf(), i)
            && old != i
        {
            st.paths.remove(&old);
        }
        st.paths.insert(i, rel.to_path_buf());
        i
    }

    fn forget_path(&self, rel: &Path) {
        let mut st = self.st();
        if let Some(i) = st.inos.remove(rel) {
            st.paths.remove(&i);
        }
    }

    fn attr(&self, rel: &Path) -> Res<FileAttr> {
        let m = fs::symlink_metadata(self.full(rel)).map_err(errno)?;
        let kind = if m.is_dir() {
            FileType::Directory
        } else if m.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        let size = match self.st().unsynced.get(&(m.dev(), m.ino())) {
            Some(changes) => logical_len(m.len(), changes),
            None => m.len(),
        };
        let t = |s: i64, ns: i64| {
            SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
        };
        Ok(FileAttr {
            ino: INodeNo(self.ino_of(rel, m.ino())),
            size,
            blocks: size.div_ceil(512),
            atime: t(m.atime(), m.atime_nsec()),
            mtime: t(m.mtime(), m.mtime_nsec()),
            ctime: t(m.ctime(), m.ctime_nsec()),
            crtime: t(m.ctime(), m.ctime_nsec()),
            kind,
            perm: (m.mode() & 0o7777) as u16,
            // (Less the attic's link: `names`.)
            nlink: match kind {
                FileType::RegularFile => m.nlink().saturating_sub(1) as u32,
                _ => m.nlink() as u32,
            },
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        })
    }

    fn key(file: &File) -> Res<(u64, u64)> {
        let m = file.metadata().map_err(errno)?;
        Ok((m.dev(), m.ino()))
    }

    fn handle(&self, fh: FileHandle) -> Res<Arc<File>> {
        self.st()
            .handles
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::from_i32(libc::EBADF))
    }

    fn add_handle(&self, file: File) -> u64 {
        let mut st = self.st();
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, Arc::new(file));
        fh
    }

    fn change(&self, file: &File, c: Change) -> Res<()> {
        let key = Self::key(file)?;
        self.st().unsynced.entry(key).or_default().push(c);
        Ok(())
    }

    /// The file's unsynced changes reach the disk, synced.
    fn sync(&self, file: &File) -> Res<()> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(Errno::from_i32(libc::EIO));
        }
        let key = Self::key(file)?;
        let changes = self.st().unsynced.remove(&key).unwrap_or_default();
        for c in &changes {
            match c {
                Change::Write(at, data) => file.write_all_at(data, *at).map_err(errno)?,
                Change::Truncate(len) => file.set_len(*len).map_err(errno)?,
            }
        }
        file.sync_all().map_err(errno)
    }

    fn read_at(&self, file: &File, offset: u64, size: u32) -> Res<Vec<u8>> {
        let disk_len = file.metadata().map_err(errno)?.len();
        let changes = self
            .st()
            .unsynced
            .get(&Self::key(file)?)
            .cloned()
            .unwrap_or_default();
        let end = offset + size as u64;
        let mut buf = vec![0u8; size as usize];
        let from_disk = disk_len.min(end).saturating_sub(offset) as usize;
        if from_disk > 0 {
            file.read_exact_at(&mut buf[..from_disk], offset)
                .map_err(errno)?;
        }
        let mut len = disk_len;
        for c in &changes {
            match c {
                Change::Write(at, data) => {
                    let (s, e) = (*at.max(&offset), (at + data.len() as u64).min(end));
                    if s < e {
                        buf[(s - offset) as usize..(e - offset) as usize]
                            .copy_from_slice(&data[(s - at) as usize..(e - at) as usize]);
                    }
                    len = len.max(at + data.len() as u64);
                }
                Change::Truncate(l) => {
                    if *l < end {
                        let from = (l.saturating_sub(offset) as usize).min(buf.len());
                        buf[from..].fill(0);
                    }
                    len = *l;
                }
            }
        }
        buf.truncate(len.min(end).saturating_sub(offset) as usize);
        Ok(buf)
    }

    fn entry(&self, rel: &Path, reply: ReplyEntry) {
        match self.attr(rel) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn renamed(&self, from: &Path, to: &Path) {
        let mut st = self.st();
        // What `to` named is gone; what `from` named (and below it) now has `to`'s name.
        let gone: Vec<PathBuf> = st
            .inos
            .keys()
            .filter(|p| p.starts_with(to))
            .cloned()
            .collect();
        for p in gone {
            if let Some(i) = st.inos.remove(&p) {
                st.paths.remove(&i);
            }
        }
        let moved: Vec<(PathBuf, u64)> = st
            .inos
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in moved {
            st.inos.remove(&p);
            // (`join` of an empty path would add a trailing slash.)
            let new = match p.strip_prefix(from) {
                Ok(rest) if !rest.as_os_str().is_empty() => to.join(rest),
                _ => to.to_path_buf(),
            };
            st.inos.insert(new.clone(), i);
            st.paths.insert(i, new);
        }
    }
}

/// The length of a file of `disk_len` bytes on the disk after `changes`.
fn logical_len(disk_len: u64, changes: &[Change]) -> u64 {
    changes.iter().fold(disk_len, |len, c| match c {
        Change::Write(at, d) => len.max(at + d.len() as u64),
        Change::Truncate(l) => *l,
    })
}

/// The disk's file is always opened for reading and writing (the tests run as root): a
/// sync through a handle opened for reading writes the file's changes too.
fn open_options(_flags: i32) -> fs::OpenOptions {
    let mut o = fs::OpenOptions::new();
    o.read(true).write(true);
    o
}

fn set_times(full: &Path, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) {
    if atime.is_none() && mtime.is_none() {
        return;
    }
    let when = |t: TimeOrNow| match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    let mut times = fs::FileTimes::new();
    if let Some(t) = atime {
        times = times.set_accessed(when(t));
    }
    if let Some(t) = mtime {
        times = times.set_modified(when(t));
    }
    if let Ok(f) = File::open(full) {
        let _ = f.set_times(times);
    }
}

fn reply_empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.on().and_then(|_| self.child(parent, name)) {
            Ok(rel) => self.entry(&rel, reply),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .on()
            .and_then(|_| self.path(ino))
            .and_then(|p| self.attr(&p))
        {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| -> Res<FileAttr> {
            let _on = self.on()?;
            let rel = self.path(ino)?;
            let full = self.full(&rel);
            if let Some(m) = mode {
                fs::set_permissions(&full, fs::Permissions::from_mode(m & 0o7777))
                    .map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&full, uid, gid).map_err(errno)?;
            }
            if let Some(len) = size {
                let file = match fh {
                    Some(fh) => self.handle(fh)?,
                    None => Arc::new(
                        fs::OpenOptions::new()
                            .write(true)
                            .open(&full)
                            .map_err(errno)?,
                    ),
                };
                self.change(&file, Change::Truncate(len))?;
            }
            set_times(&full, atime, mtime);
            self.attr(&rel)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.on().and_then(|_| self.path(ino)) {
            Ok(rel) => match fs::read_link(self.full(&rel)) {
                Ok(t) => reply.data(t.as_os_str().as_bytes()),
                Err(e) => reply.error(errno(e)),
            },
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = (|| -> Res<PathBuf> {
            let _on = self.on()?;
            let rel = self.child(parent, name)?;
            fs::create_dir(self.full(&rel)).map_err(errno)?;
            let perm = fs::Permissions::from_mode(mode & !umask & 0o7777);
            fs::set_permissions(self.full(&rel), perm).map_err(errno)?;
            self.named(&rel)?;
            Ok(rel)
        })();
        match r {
            Ok(rel) => self.entry(&rel, reply),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, |p| fs::remove_file(p)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, |p| fs::remove_dir(p)));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = (|| -> Res<PathBuf> {
            let _on = self.on()?;
            let rel = self.child(parent, link_name)?;
            std::os::unix::fs::symlink(target, self.full(&rel)).map_err(errno)?;
            self.named(&rel)?;
            Ok(rel)
        })();
        match r {
            Ok(rel) => self.entry(&rel, reply),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| -> Res<()> {
            let _on = self.on()?;
            let (from, to) = (self.child(parent, name)?, self.child(newparent, newname)?);
            let from_dir = self.dir_ino(&from)?;
            let c = |p: &Path| std::ffi::CString::new(self.full(p).as_os_str().as_bytes()).unwrap();
            let (a, b) = (c(&from), c(&to));
            // SAFETY: two valid C strings; renameat2 only reads them.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    flags.bits(),
                )
            };
            if rc != 0 {
                return Err(errno(std::io::Error::last_os_error()));
            }
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            self.note_rename(from_dir, &from, &to, exchange)?;
            if exchange {
                // Both names stay; which inode each names is looked up again.
                self.forget_path(&from);
                self.forget_path(&to);
            } else {
                self.renamed(&from, &to);
            }
            Ok(())
        })();
        reply_empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = (|| -> Res<PathBuf> {
            let _on = self.on()?;
            let (from, to) = (self.path(ino)?, self.child(newparent, newname)?);
            fs::hard_link(self.full(&from), self.full(&to)).map_err(errno)?;
            self.named(&to)?;
            Ok(to)
        })();
        match r {
            Ok(rel) => self.entry(&rel, reply),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| -> Res<u64> {
            let _on = self.on()?;
            let rel = self.path(ino)?;
            let file = open_options(flags.0).open(self.full(&rel)).map_err(errno)?;
            if flags.0 & libc::O_TRUNC != 0 {
                self.change(&file, Change::Truncate(0))?;
            }
            Ok(self.add_handle(file))
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| -> Res<(FileAttr, u64)> {
            let _on = self.on()?;
            let rel = self.child(parent, name)?;
            let mut o = open_options(flags);
            o.mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            let existed = fs::symlink_metadata(self.full(&rel)).is_ok();
            let file = o.open(self.full(&rel)).map_err(errno)?;
            if !existed {
                self.named(&rel)?;
            }
            if flags & libc::O_TRUNC != 0 {
                self.change(&file, Change::Truncate(0))?;
            }
            let fh = self.add_handle(file);
            Ok((self.attr(&rel)?, fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .on()
            .and_then(|_| self.handle(fh))
            .and_then(|f| self.read_at(&f, offset, size))
        {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self
            .on()
            .and_then(|_| match self.full.load(Ordering::SeqCst) {
                true => Err(Errno::from_i32(libc::ENOSPC)),
                false => Ok(()),
            })
            .and_then(|_| self.handle(fh))
            .and_then(|f| self.change(&f, Change::Write(offset, data.to_vec())));
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.on().map(drop));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.st().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = (|| -> Res<()> {
            let _on = self.on()?;
            self.sync(&*self.handle(fh)?)
        })();
        reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.on().and_then(|_| self.path(ino)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| -> Res<Vec<(u64, FileType, std::ffi::OsString)>> {
            let _on = self.on()?;
            let rel = self.path(ino)?;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            let mut names: Vec<_> = fs::read_dir(self.full(&rel))
                .map_err(errno)?
                .filter_map(|e| e.ok())
                .collect();
            names.sort_by_key(|e| e.file_name());
            for e in names {
                let kind = match e.file_type() {
                    Ok(t) if t.is_dir() => FileType::Directory,
                    Ok(t) if t.is_symlink() => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                let child = rel.join(e.file_name());
                let Ok(m) = e.metadata() else {
                    continue;
                };
                out.push((self.ino_of(&child, m.ino()), kind, e.file_name()));
            }
            Ok(out)
        })();
        match r {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = (|| -> Res<()> {
            let _on = self.on()?;
            if self.fail_sync.load(Ordering::SeqCst) {
                return Err(Errno::from_i32(libc::EIO));
            }
            let dir = names::ino(&self.full(&self.path(ino)?)).map_err(errno)?;
            self.names().synced(dir);
            Ok(())
        })();
        reply_empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let path = std::ffi::CString::new(self.disk.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string and a zeroed statvfs for the kernel to fill.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return reply.error(Errno::from_i32(libc::EIO));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }
}

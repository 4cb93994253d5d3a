//! The FUSE adapter: each callback is one call into the core and one reply. Nothing here
//! knows about Zarr or shards. `backing_ids.rs`: the kernel's names of the BACKING files
//! that plain files pass through to.

mod backing_ids;

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::debug;

use crate::backing::AttrChange;
use crate::core::errno::ToErrno;
use crate::core::fs::namespace::{Caller, RenameFlags as CoreRenameFlags};
use crate::core::fs::write::SetAttr;
use crate::core::stats::Request as Kind;
use crate::core::{Attr, FileType, FsError, Opened, ShardFs};

/// How long the kernel may trust names and attributes without asking again. BACKING may be
/// changed by other processes; one second bounds how stale a view can be.
const TTL: Duration = Duration::from_secs(1);

/// Largest request, in both directions.
pub const MAX_IO: u32 = 1 << 20;

pub struct FuseAdapter {
    core: Arc<ShardFs>,
    /// Tells the kernel to drop what it cached of an inode; set once the session exists.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// The largest read or write request asked of the kernel, in bytes.
    max_request: u32,
    /// Whether to ask the kernel for passthrough of plain files (`--no-passthrough`).
    passthrough: bool,
    backing_ids: backing_ids::BackingIds,
}

impl FuseAdapter {
    pub fn new(
        core: Arc<ShardFs>,
        notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
        max_request: u32,
        passthrough: bool,
    ) -> Self {
        FuseAdapter {
            core,
            notifier,
            max_request,
            passthrough,
            backing_ids: Default::default(),
        }
    }

    /// Answers an open: through the kernel to the BACKING file when the core offers it and
    /// the kernel takes it, else through the daemon.
    fn opened(&self, reply: ReplyOpen, ino: u64, o: Opened) {
        let register = |f: &std::fs::File| reply.open_backing(f);
        match self.backing_id(register, ino, &o) {
            Ok(Some(id)) => reply.opened_passthrough(FileHandle(o.fh), passing(&o), &id),
            Ok(None) => reply.opened(FileHandle(o.fh), opened_flags(&o)),
            Err(e) => reply.error(e),
        }
    }

    /// `opened` for a file just made.
    fn created(&self, reply: ReplyCreate, attr: &Attr, o: Opened) {
        let register = |f: &std::fs::File| reply.open_backing(f);
        let (fh, g) = (FileHandle(o.fh), Generation(0));
        match self.backing_id(register, attr.ino, &o) {
            Ok(Some(id)) => {
                let (ttl, attr) = (ttl(attr), file_attr(attr));
                reply.created_passthrough(&ttl, &attr, g, fh, passing(&o), &id)
            }
            Ok(None) => reply.created(&ttl(attr), &file_attr(attr), g, fh, opened_flags(&o)),
            Err(e) => reply.error(e),
        }
    }

    /// The backing id an open the core offers for passthrough goes to (`None`: served by
    /// the daemon, the kernel having refused passthrough).
    fn backing_id(
        &self,
        register: impl FnOnce(&std::fs::File) -> io::Result<fuser::BackingId>,
        ino: u64,
        o: &Opened,
    ) -> Result<Option<Arc<fuser::BackingId>>, Errno> {
        let Some(source) = o.passthrough else {
            return Ok(None);
        };
        let file = || self.core.passthrough_file(o.fh).map_err(io::Error::other);
        match self
            .backing_ids
            .for_open(register, (ino, o.fh), source, file)
        {
            Ok(id) => Ok(Some(id)),
            // Refused for what the mount is (not root, BACKING stacked too deep, no
            // support): every open goes through the daemon from now on.
            Err(backing_ids::Declined::Refused(e)) if refused_for_good(&e) => {
                self.core.passthrough().refused(&e.to_string());
                self.core.passthrough_declined(o.fh);
                Ok(None)
            }
            // A moment's failure (out of descriptors): this open fails, the next tries again.
            Err(backing_ids::Declined::Refused(e)) => {
                let _ = self.core.release(o.fh);
                Err(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))
            }
            // Replaced outside the mount while open through the mount: the kernel takes
            // no other file for the inode meanwhile; a fresh lookup will do.
            Err(backing_ids::Declined::OtherFile) => {
                let _ = self.core.release(o.fh);
                Err(Errno::ESTALE)
            }
        }
    }

    /// Asks the kernel to pass plain files through (FUSE_PASSTHROUGH), unless told not to.
    fn ask_passthrough(&self, config: &mut KernelConfig) {
        if !self.passthrough {
            return self.core.passthrough().start(false, "--no-passthrough");
        }
        // Depth 1: BACKING on a plain file system (not overlayfs), and the mount itself
        // may still be a lower layer of an overlay.
        let agreed = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        let why = "the kernel does not offer it (Linux 6.9 or later)";
        self.core
            .passthrough()
            .start(agreed, if agreed { "" } else { why });
    }

    /// Runs a core call, turning a panic into EIO (logged and counted): a panicking request
    /// must not take a worker thread down with it (fuser does not catch panics), which
    /// would hang the mount.
    fn run<T>(&self, f: impl FnOnce() -> Result<T, FsError>) -> Result<T, FsError> {
        let result = self
            .core
            .contain("a request (it fails with EIO)", f)
            .unwrap_or_else(|| Err(FsError::Io(io::Error::other("internal error"))));
        // Every refusal a request meets reaches the log here (once).
        if let Err(e) = &result {
            self.core.note_refusal(e);
        }
        result
    }

    /// Makes the kernel forget the attributes and pages it holds for `ino`. Sent before the
    /// reply, so that the client sees the change the moment its call returns; the kernel
    /// handles it without the locks a request holds (it touches the inode's attributes and
    /// page cache, not its directory entries).
    fn invalidate(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn entry(reply: ReplyEntry, r: Result<Attr, FsError>) {
    match r {
        Ok(attr) => reply.entry(&ttl(&attr), &file_attr(&attr), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

/// The process that made the request, as BACKING's permission checks know it.
fn asker(req: &Request) -> crate::backing::Asker {
    crate::backing::Asker {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// The process that made the request, as the core knows callers.
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn errno(e: &FsError) -> Errno {
    let errno = e.to_errno();
    // An I/O error tells its caller nothing of its cause (a store's refusal, a damaged
    // file): the log does, at the default level, at most once a second.
    if errno == libc::EIO && eio_may_log() {
        tracing::warn!("a request failed with EIO: {e}");
    } else {
        debug!("request failed: {e}");
    }
    Errno::from_i32(errno)
}

/// Whether an EIO may be logged now (one a second; the others only at debug level).
fn eio_may_log() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    now != last
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

fn file_type(t: FileType) -> fuser::FileType {
    match t {
        FileType::Dir => fuser::FileType::Directory,
        FileType::File => fuser::FileType::RegularFile,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo | FileType::Other => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

fn opened_flags(o: &Opened) -> FopenFlags {
    let mut flags = FopenFlags::empty();
    if o.keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if o.direct_io {
        flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if !o.flush_at_close {
        flags |= FopenFlags::FOPEN_NOFLUSH;
    }
    flags
}

/// Whether the kernel's refusal of a backing file holds for every file of the mount.
fn refused_for_good(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::ELOOP | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOTTY)
    )
}

/// The flags of an open passing through: the kernel takes no page-cache flag with it (the
/// pages are the BACKING file's; FOPEN_KEEP_CACHE made the open fail with EIO).
fn passing(o: &Opened) -> FopenFlags {
    opened_flags(o) & FopenFlags::FOPEN_NOFLUSH
}

fn ttl(a: &Attr) -> Duration {
    if a.volatile { Duration::ZERO } else { TTL }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: MAX_IO,
        flags: 0,
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each is an optimisation the kernel may lack; without it the mount still works.
        for flag in [
            // Always readdirplus: every listed name gets its real inode number (and the
            // kernel its attributes), never a placeholder that a later stat contradicts.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
            // O_TRUNC arrives with OPEN instead of as a separate SETATTR round trip.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            // Page caches are kept across opens; a changed mtime seen on a later getattr
            // drops them, so rewrites from outside the mount show within the TTL.
            InitFlags::FUSE_AUTO_INVAL_DATA,
            // Chunks open for writing bypass the page cache (`direct_writes`); a writer
            // may still map them shared.
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            let _ = config.add_capabilities(flag);
        }
        self.ask_passthrough(config);
        let _ = config.set_max_write(self.max_request);
        let _ = config.set_max_readahead(self.max_request);
        warn_if_capped(self.max_request);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _answering = self.core.requests().answering(Kind::Lookup);
        entry(reply, self.run(|| self.core.lookup(parent.0, name)));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _answering = self.core.requests().answering(Kind::Forget);
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _answering = self.core.requests().answering(Kind::Getattr);
        match self.run(|| self.core.getattr(ino.0)) {
            Ok(attr) => reply.attr(&ttl(&attr), &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _answering = self.core.requests().answering(Kind::Readlink);
        match self.run(|| self.core.readlink(ino.0)) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _answering = self.core.requests().answering(Kind::Opendir);
        match self.run(|| self.core.opendir(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _answering = self.core.requests().answering(Kind::Readdir);
        let entries = match self.run(|| self.core.readdir(fh.0)) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            // Names the kernel has not looked up get a number no inode has; `d_ino` only
            // has to be nonzero.
            let child = self
                .core
                .known_ino(ino.0, &entry.name)
                .unwrap_or(u64::MAX - i as u64);
            if reply.add(
                INodeNo(child),
                i as u64 + 1,
                file_type(entry.kind),
                &entry.name,
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _answering = self.core.requests().answering(Kind::Readdirplus);
        let listed = self.run(|| Ok((self.core.readdir(fh.0)?, self.core.lister(ino.0)?)));
        let (entries, lister) = match listed {
            Ok(listed) => listed,
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            let next = i as u64 + 1;
            if entry.name == "." || entry.name == ".." {
                // Not a lookup: the kernel does not count these.
                let attr = FileAttr {
                    ino: INodeNo(ino.0),
                    ..file_attr(&dummy_dir_attr())
                };
                if reply.add(
                    INodeNo(ino.0),
                    next,
                    &entry.name,
                    &Duration::ZERO,
                    &attr,
                    Generation(0),
                ) {
                    break;
                }
                continue;
            }
            // A name that vanished since opendir is skipped, as a real directory would.
            let Ok(attr) = self.run(|| lister.lookup(&entry.name)) else {
                continue;
            };
            if reply.add(
                INodeNo(attr.ino),
                next,
                &entry.name,
                &TTL,
                &file_attr(&attr),
                Generation(0),
            ) {
                // Not sent: the lookup it counted must be undone.
                self.core.forget(attr.ino, 1);
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Releasedir);
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _answering = self.core.requests().answering(Kind::Open);
        match self.run(|| self.core.open(ino.0, flags.0, asker(req))) {
            Ok(o) => self.opened(reply, ino.0, o),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _answering = self.core.requests().answering(Kind::Create);
        match self.run(|| {
            self.core
                .create(parent.0, name, mode & !umask, flags, caller(req))
        }) {
            Ok((attr, o)) => self.created(reply, &attr, o),
            Err(e) => reply.error(errno(&e)),
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
        let _answering = self.core.requests().answering(Kind::Write);
        let result = self.run(|| {
            if self.core.is_control(fh.0) {
                self.core
                    .control_command(&String::from_utf8_lossy(data))
                    .map(|()| data.len() as u32)
            } else {
                self.core.write(fh.0, offset, data)
            }
        });
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
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
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _answering = self.core.requests().answering(Kind::Setattr);
        let change = AttrChange {
            size,
            mode,
            uid,
            gid,
            times_now: [atime, mtime]
                .iter()
                .flatten()
                .all(|t| matches!(t, TimeOrNow::Now)),
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        let set = SetAttr {
            change,
            fh: fh.map(|f| f.0),
            by: asker(req),
        };
        match self.run(|| self.core.setattr(ino.0, &set)) {
            Ok(attr) => reply.attr(&ttl(&attr), &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _answering = self.core.requests().answering(Kind::Mkdir);
        entry(
            reply,
            self.run(|| self.core.mkdir(parent.0, name, mode & !umask, caller(req))),
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _answering = self.core.requests().answering(Kind::Mknod);
        let mode = mode & !(umask & 0o7777);
        entry(
            reply,
            self.run(|| {
                self.core
                    .mknod(parent.0, name, mode, rdev.into(), caller(req))
            }),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _answering = self.core.requests().answering(Kind::Unlink);
        empty(
            reply,
            self.run(|| self.core.unlink(parent.0, name, caller(req))),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _answering = self.core.requests().answering(Kind::Rmdir);
        empty(
            reply,
            self.run(|| self.core.rmdir(parent.0, name, caller(req))),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Rename);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let flags = CoreRenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        match self.run(|| {
            self.core
                .rename(parent.0, name, newparent.0, newname, flags, caller(req))
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _answering = self.core.requests().answering(Kind::Link);
        let linked = self.run(|| self.core.link(ino.0, newparent.0, newname, caller(req)));
        // The file now has two names, which are two inodes to the kernel: what it cached
        // for the first (a link count of one, its size) must go.
        if linked.is_ok() {
            self.invalidate(ino.0);
        }
        entry(reply, linked);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _answering = self.core.requests().answering(Kind::Symlink);
        entry(
            reply,
            self.run(|| self.core.symlink(parent.0, link_name, target, caller(req))),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Fsync);
        empty(reply, self.run(|| self.core.fsync(ino.0, Some(fh.0))));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Fsyncdir);
        empty(reply, self.run(|| self.core.fsyncdir(ino.0)));
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Other);
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
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
        let _answering = self.core.requests().answering(Kind::Read);
        match self.run(|| self.core.read(fh.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _answering = self.core.requests().answering(Kind::Flush);
        empty(reply, self.run(|| self.core.flush(fh.0)));
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
        let _answering = self.core.requests().answering(Kind::Release);
        self.backing_ids.released(fh.0);
        empty(reply, self.run(|| self.core.release(fh.0)));
    }

    // Unsupported operations, each with the errno callers expect, and no log noise.
    // Extended attributes: ENOSYS makes the kernel stop asking altogether; it would
    // otherwise ask for security.capability before the first write to every file, one
    // round trip per chunk file written.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        let _answering = self.core.requests().answering(Kind::Xattr);
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        let _answering = self.core.requests().answering(Kind::Xattr);
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _answering = self.core.requests().answering(Kind::Other);
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _answering = self.core.requests().answering(Kind::Statfs);
        match self.run(|| self.core.statfs()) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn dummy_dir_attr() -> Attr {
    let now = std::time::SystemTime::now();
    Attr {
        ino: 0,
        kind: FileType::Dir,
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        volatile: false,
        source: None,
    }
}

/// The kernel silently caps requests at `max_pages_limit` pages: say so when that is less
/// than what was asked for, with the fix.
fn warn_if_capped(asked: u32) {
    let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let page = rustix::param::page_size() as u64;
    if let Some(pages) = limit
        && pages * page < u64::from(asked)
    {
        tracing::warn!(
            asked_kib = asked / 1024,
            capped_kib = pages * page / 1024,
            "requests capped by the kernel; as root: echo {} > /proc/sys/fs/fuse/max_pages_limit",
            u64::from(asked).div_ceil(page)
        );
    }
}

//! The FUSE adapter: each callback is one call into the core and one reply. Nothing here
//! knows about Zarr or shards.

use std::ffi::OsStr;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyXattr,
    Request,
};
use tracing::debug;

use crate::core::{Attr, FileType, FsError, ShardFs};
use crate::errno::ToErrno;

/// How long the kernel may trust names and attributes without asking again. BACKING may be
/// changed by other processes; one second bounds how stale a view can be.
const TTL: Duration = Duration::from_secs(1);

/// Largest request, in both directions.
pub const MAX_IO: u32 = 1 << 20;

pub struct FuseAdapter {
    core: Arc<ShardFs>,
}

impl FuseAdapter {
    pub fn new(core: Arc<ShardFs>) -> FuseAdapter {
        FuseAdapter { core }
    }
}

fn errno(e: &FsError) -> Errno {
    debug!("request failed: {e}");
    Errno::from_i32(e.to_errno())
}

fn file_type(t: FileType) -> fuser::FileType {
    match t {
        FileType::Dir => fuser::FileType::Directory,
        FileType::File => fuser::FileType::RegularFile,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Other => fuser::FileType::NamedPipe,
    }
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
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
            // Page caches are kept across opens; a changed mtime seen on a later getattr
            // drops them, so rewrites from outside the mount show within the TTL.
            InitFlags::FUSE_AUTO_INVAL_DATA,
        ] {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.core.lookup(parent.0, name) {
            Ok(attr) => reply.entry(&ttl(&attr), &file_attr(&attr), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(attr) => reply.attr(&ttl(&attr), &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.core.readlink(ino.0) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(ino.0) {
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
        let entries = match self.core.readdir(fh.0, offset) {
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
        let entries = match self.core.readdir(fh.0, offset) {
            Ok(entries) => entries,
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
            let Ok(attr) = self.core.lookup(ino.0, &entry.name) else {
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
        self.core.release(fh.0);
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.open(ino.0) {
            Ok(o) => {
                // Nothing is written through these handles: closing them needs no FLUSH
                // round trip, which would cost as much as the read itself.
                let mut flags = FopenFlags::FOPEN_NOFLUSH;
                if o.keep_cache {
                    flags |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if o.direct_io {
                    flags |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.opened(FileHandle(o.fh), flags)
            }
            Err(e) => reply.error(errno(&e)),
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
        match self.core.read(fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
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
        reply.ok();
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
        self.core.release(fh.0);
        reply.ok();
    }

    // Unsupported operations, each with the errno callers expect, and no log noise.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.size(0);
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
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.core.statfs() {
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
    }
}

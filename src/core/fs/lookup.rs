//! Names, attributes, listings, opening and reading.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use bytes::Bytes;

use super::ShardFs;
use super::{CONTROL_FILE, CONTROL_SIZE};
use crate::backing::{OpenMode, join_rel};
use crate::core::array::ArrayName;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{FileData, MemFile};
use crate::core::shards::{ChunkData, Shown};
use crate::core::view::attr::Attr;
use crate::core::view::classify::DirClass;
use crate::core::view::handle::{FileHandle, Handle, Opens, read_full_at};
use crate::core::view::inode::{Ino, NodeInfo, NodeKind, ROOT};
use crate::sync::lock;
use crate::zarr::{KeyNode, METADATA_FILE};

/// An opened file: its handle, and how the kernel should cache it.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    /// Keep the page cache from earlier opens (our own changes go through it; outside
    /// changes show through a changed mtime).
    pub keep_cache: bool,
    /// Bypass the page cache altogether.
    pub direct_io: bool,
    /// Whether a close must reach the mount at once (FLUSH): only for a chunk (its
    /// close may complete a shard, and a failed shard write is told to that close) and
    /// a `zarr.json` (committed at its close). Elsewhere a flush does nothing (a file
    /// held in memory, a lock file, a file in BACKING), and each costs a round trip:
    /// its RELEASE does what is left, as it does for every handle.
    pub flush_at_close: bool,
    /// Reads and writes pass through the kernel to this BACKING file (its device and
    /// inode, the same for every open of the inode meanwhile): `view/passthrough.rs`.
    pub passthrough: Option<(u64, u64)>,
}

/// Marks `handle` as passing through when `passes` (and it has a BACKING file); returns
/// that file's device and inode.
pub(super) fn passing_through(
    handle: &FileHandle,
    passes: bool,
) -> Result<Option<(u64, u64)>, FsError> {
    let Some(file) = handle.backing.as_ref().filter(|_| passes) else {
        return Ok(None);
    };
    let m = file.metadata()?;
    let source = (m.dev(), m.ino());
    *lock(&handle.passthrough) = Some(source);
    Ok(Some(source))
}

/// Whether writes to a file of `kind` bypass the kernel's page cache (FOPEN_DIRECT_IO):
/// a chunk, or a file held in memory in an array. The mount holds their bytes already
/// (as segments, until the shard is written); the kernel's cached copy of them was a
/// second one (zarr-python, S2: 128 MiB of the mount's page cache left at the end, none
/// with this, and no slower: 1.28 s against 1.68 s median of 3).
pub(crate) fn direct_writes(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::Chunk { .. } | NodeKind::Temp(_))
}

/// Whether closing a handle of `kind` at `rel`, open for writing or not, needs a FLUSH.
pub(crate) fn flush_at_close(kind: &NodeKind, rel: &Path, writable: bool) -> bool {
    writable
        && (matches!(kind, NodeKind::Chunk { .. })
            || rel.file_name() == Some(OsStr::new(METADATA_FILE)))
}

/// Space figures of the backing file system, for `statfs`.
#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

impl ShardFs {
    /// The inode as it is now. Directories and array nodes are re-read against their
    /// `zarr.json`, which may have been written or rewritten since the kernel looked them up.
    pub(crate) fn node(&self, ino: Ino) -> Result<NodeInfo, FsError> {
        let mut info = self.inodes.get(ino).ok_or(FsError::Stale)?;
        if info.detached {
            return Ok(info);
        }
        // A name decided before a directory above it became (or stopped being) an array
        // is decided again, from its parent as it is now. Files in memory stay what they
        // are: their data belongs to the inode.
        let movable = !matches!(info.kind, NodeKind::Temp(_) | NodeKind::Control);
        if info.outdated && movable && ino != ROOT {
            let parent = self.node(info.parent)?;
            let kind = self.resolve(&parent, &info.name)?;
            self.inodes.set_kind(ino, kind.clone());
            info.kind = kind;
        }
        let refreshed = match &info.kind {
            NodeKind::Dir | NodeKind::ArrayDir(_) => match self.classify(&info.rel)? {
                DirClass::ShardedArray(a) => Some(NodeKind::ArrayDir(a)),
                _ => Some(NodeKind::Dir),
            },
            NodeKind::ArrayMeta(a) => self.current(a)?.map(NodeKind::ArrayMeta),
            NodeKind::ChunkDir { array, node } => {
                self.current(array)?.map(|array| NodeKind::ChunkDir {
                    array,
                    node: node.clone(),
                })
            }
            NodeKind::Chunk { array, coords } => {
                self.current(array)?.map(|array| NodeKind::Chunk {
                    array,
                    coords: coords.clone(),
                })
            }
            _ => None,
        };
        if let Some(kind) = refreshed {
            if ino == ROOT {
                self.inodes.set_root_kind(kind.clone());
            }
            info.kind = kind;
        }
        Ok(info)
    }

    /// The array's current state when its `zarr.json` was rewritten, `None` when unchanged.
    fn current(&self, array: &Arc<ArrayState>) -> Result<Option<Arc<ArrayState>>, FsError> {
        match self.classify(&array.rel)? {
            DirClass::ShardedArray(now) if Arc::ptr_eq(&now, array) => Ok(None),
            DirClass::ShardedArray(now) => Ok(Some(now)),
            _ => Err(FsError::NotFound),
        }
    }

    /// What `name` in directory `parent` is.
    pub(crate) fn resolve(&self, parent: &NodeInfo, name: &OsStr) -> Result<NodeKind, FsError> {
        let rel = join_rel(&parent.rel, name);
        if parent.ino == ROOT && name == CONTROL_FILE {
            return Ok(NodeKind::Control);
        }
        if parent.ino == ROOT && name == crate::core::PRIVATE_DIR {
            return Err(FsError::NotFound);
        }
        if parent.detached {
            return Err(FsError::NotFound);
        }
        if let Some(file) = self.temps.file(&rel) {
            return Ok(NodeKind::Temp(file));
        }
        match &parent.kind {
            NodeKind::Dir => self.resolve_backing(&parent.rel, &rel, name, true),
            NodeKind::ArrayDir(array) => self.resolve_in_array(array, &KeyNode::Root, &rel, name),
            NodeKind::ChunkDir { array, node } => self.resolve_in_array(array, node, &rel, name),
            _ => Err(FsError::NotDir),
        }
    }

    fn resolve_in_array(
        &self,
        array: &Arc<ArrayState>,
        parent: &KeyNode,
        rel: &Path,
        name: &OsStr,
    ) -> Result<NodeKind, FsError> {
        let class = name
            .to_str()
            .map_or(ArrayName::Other, |n| array.classify_name(parent, n));
        match class {
            ArrayName::Meta => Ok(NodeKind::ArrayMeta(array.clone())),
            ArrayName::Key(KeyNode::Chunk(coords)) => {
                match self.shards.chunk(&self.backing, array, &coords)? {
                    ChunkData::Absent => Err(FsError::NotFound),
                    _ => Ok(NodeKind::Chunk {
                        array: array.clone(),
                        coords,
                    }),
                }
            }
            ArrayName::Key(node) => {
                if self.key_dir_exists(array, &node, rel)? {
                    Ok(NodeKind::ChunkDir {
                        array: array.clone(),
                        node,
                    })
                } else {
                    Err(FsError::NotFound)
                }
            }
            ArrayName::BadKey | ArrayName::ShardLock => Err(FsError::NotFound),
            // Not part of the key tree: whatever else BACKING holds there, as it is.
            ArrayName::Other => self.resolve_backing(Path::new(""), rel, name, false),
        }
    }

    /// A key-tree directory exists while a chunk lies below it, something in memory does,
    /// or it was made with mkdir.
    pub(crate) fn key_dir_exists(
        &self,
        array: &Arc<ArrayState>,
        node: &KeyNode,
        rel: &Path,
    ) -> Result<bool, FsError> {
        Ok(self.temps.dir(rel)
            || self.temps.any_below(rel)
            || self.shards.has_chunks_below(&self.backing, array, node)?
            || self.has_extras(array, node, rel)?)
    }

    /// Whether BACKING's directory at `rel`, or a key directory below it, holds files that
    /// are not part of the key tree (a temporary file never renamed, written out as it
    /// was): they are shown there. Only asked when no chunk lies below.
    pub(super) fn has_extras(
        &self,
        array: &ArrayState,
        node: &KeyNode,
        rel: &Path,
    ) -> Result<bool, FsError> {
        for e in self.backing.list(rel)? {
            let Some(name) = e.name.to_str() else {
                return Ok(true);
            };
            let extra = match array.classify_name(node, name) {
                ArrayName::Other => true,
                ArrayName::Key(child @ KeyNode::Dir(_)) if e.kind.is_dir() => {
                    self.has_extras(array, &child, &rel.join(name))?
                }
                _ => false,
            };
            if extra {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A name of BACKING shown as it is; with `classify`, directories are checked for Zarr
    /// arrays and `zarr.json` files for translation.
    fn resolve_backing(
        &self,
        parent_rel: &Path,
        rel: &Path,
        name: &OsStr,
        classify: bool,
    ) -> Result<NodeKind, FsError> {
        let meta = self.backing.stat(rel)?.ok_or(FsError::NotFound)?;
        let ft = meta.file_type();
        Ok(if ft.is_dir() {
            match classify.then(|| self.classify(rel)) {
                Some(Ok(DirClass::ShardedArray(a))) => NodeKind::ArrayDir(a),
                Some(Err(e)) => return Err(e),
                _ => NodeKind::Dir,
            }
        } else if ft.is_file() {
            if classify && name == METADATA_FILE {
                match self.classify(parent_rel)? {
                    DirClass::ShardedArray(a) => NodeKind::ArrayMeta(a),
                    DirClass::Group(Some(g)) => NodeKind::GroupMeta(g),
                    _ => NodeKind::File,
                }
            } else {
                NodeKind::File
            }
        } else if ft.is_symlink() {
            NodeKind::Symlink
        } else {
            NodeKind::Other
        })
    }

    pub(crate) fn attr(&self, ino: Ino, rel: &Path, kind: &NodeKind) -> Result<Attr, FsError> {
        match kind {
            NodeKind::Dir
            | NodeKind::File
            | NodeKind::Symlink
            | NodeKind::Other
            | NodeKind::ArrayDir(_) => self.document_attr(ino, rel, None),
            NodeKind::ArrayMeta(array) => {
                self.document_attr(ino, rel, Some(array.view_json.len() as u64))
            }
            NodeKind::GroupMeta(group) => {
                self.document_attr(ino, rel, Some(group.json.len() as u64))
            }
            NodeKind::ChunkDir { array, .. } => {
                Ok(Attr::virtual_dir(ino, &self.owner_of(&array.rel)?))
            }
            NodeKind::Temp(file) => {
                self.held_attr(ino, file, rel.parent().unwrap_or(Path::new("")))
            }
            NodeKind::Control => {
                let root = self.owner_of(Path::new(""))?;
                Ok(Attr {
                    perm: 0o644,
                    volatile: true,
                    ..Attr::virtual_file(ino, &root, CONTROL_SIZE as u64, SystemTime::now())
                })
            }
            NodeKind::Chunk { array, coords } => self.chunk_attr(ino, array, coords),
        }
    }

    /// The attributes of a BACKING file, with `size` instead of its own when it is shown
    /// translated.
    fn document_attr(&self, ino: Ino, rel: &Path, size: Option<u64>) -> Result<Attr, FsError> {
        let m = self.backing.stat(rel)?.ok_or(FsError::NotFound)?;
        let attr = Attr::from_backing(ino, &m);
        Ok(Attr {
            size: size.unwrap_or(attr.size),
            ..attr
        })
    }

    /// The nearest directory that BACKING has (key directories may exist only in view).
    pub(crate) fn owner_of(&self, rel: &Path) -> Result<std::fs::Metadata, FsError> {
        for dir in rel.ancestors() {
            if let Some(m) = self.backing.stat(dir)? {
                return Ok(m);
            }
        }
        Err(FsError::NotFound)
    }

    /// Files in memory are shown as they will be once stored: a file its maker's, with its
    /// mode; a chunk its array's, like the shard it goes into (`backing::owner`).
    fn held_attr(&self, ino: Ino, file: &MemFile, dir: &Path) -> Result<Attr, FsError> {
        let (len, mtime) = file.with(|s| (s.data.len(), s.mtime));
        let attr = Attr::virtual_file(ino, &self.owner_of(dir)?, len, mtime);
        Ok(match file.maker() {
            Some(o) => Attr {
                uid: o.uid,
                gid: o.gid,
                perm: o.mode as u16,
                ..attr
            },
            None => attr,
        })
    }

    fn chunk_attr(
        &self,
        ino: Ino,
        array: &Arc<ArrayState>,
        coords: &[u64],
    ) -> Result<Attr, FsError> {
        let owner = self.owner_of(&array.rel)?;
        self.chunk_attr_owned(ino, array, coords, &owner)
    }

    /// A chunk's attributes, its array's directory being `owner` (BACKING's nearest).
    pub(super) fn chunk_attr_owned(
        &self,
        ino: Ino,
        array: &Arc<ArrayState>,
        coords: &[u64],
        owner: &std::fs::Metadata,
    ) -> Result<Attr, FsError> {
        match self.shards.chunk_shown(&self.backing, array, coords)? {
            Shown::Absent => Err(FsError::NotFound),
            Shown::Stored { size, mtime } => Ok(Attr::virtual_file(ino, owner, size, mtime)),
            Shown::Pending(file) => self.held_attr(ino, &file, &array.rel),
            // Its size is unknown: shown empty; opening it fails with EIO.
            Shown::Damaged { mtime } => Ok(Attr::virtual_file(ino, owner, 0, mtime)),
        }
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let parent = self.node(parent)?;
        let kind = self.resolve(&parent, name)?;
        let rel = join_rel(&parent.rel, name);
        let attr = self.attr(0, &rel, &kind)?;
        if matches!(kind, NodeKind::File) && self.passthrough.on() {
            self.renamed_if_replaced(parent.ino, name, attr.source);
        }
        let ino = self
            .inodes
            .lookup(parent.ino, name, kind, self.link_source(&attr));
        Ok(Attr { ino, ..attr })
    }

    /// A name whose inode passes through to a BACKING file that the name no longer leads
    /// to (replaced outside the mount) gets a new inode: the kernel holds the old one to
    /// that file while it is open, and takes no other file for it meanwhile.
    fn renamed_if_replaced(&self, parent: Ino, name: &OsStr, now: Option<(u64, u64)>) {
        if let Some(ino) = self.inodes.peek(parent, name)
            && let Opens::Through(held) = self.handles.opens_of(ino)
            && Some(held) != now
        {
            self.inodes.detach(parent, name, None);
        }
    }

    /// The BACKING file behind `attr`, for sharing an inode between its hard links. A
    /// mapping whose inode no longer reaches that file (replaced outside the mount, its
    /// number reused) is dropped first.
    pub(crate) fn link_source(&self, attr: &Attr) -> Option<(u64, u64)> {
        let src = attr.source?;
        if let Some(known) = self.inodes.by_source(src) {
            let still = self.inodes.get(known).is_some_and(|info| {
                !info.detached
                    && matches!(self.backing.stat(&info.rel), Ok(Some(m))
                        if (m.dev(), m.ino()) == src)
            });
            if !still {
                self.inodes.drop_source(src);
            }
        }
        Some(src)
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
        let info = self.node(ino)?;
        if info.detached && matches!(info.kind, NodeKind::File) {
            // Unlinked while open: its name is gone, its descriptor is the way to it.
            let file = self.handles.backing_file_of(ino).ok_or(FsError::Stale)?;
            return Ok(Attr::from_backing(ino, &file.metadata()?));
        }
        self.attr(ino, &info.rel, &info.kind)
    }

    pub fn readlink(&self, ino: Ino) -> Result<PathBuf, FsError> {
        let info = self.node(ino)?;
        match info.kind {
            NodeKind::Symlink => Ok(self.backing.read_link(&info.rel)?),
            _ => Err(FsError::Invalid("not a symbolic link".into())),
        }
    }

    /// Opens a file for `by`. `flags` are the open(2) flags (O_TRUNC included).
    pub fn open(&self, ino: Ino, flags: i32, by: crate::backing::Asker) -> Result<Opened, FsError> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let _gate = writable.then(|| self.gate.shared());
        let mut info = self.node(ino)?;
        if self.revalidated(&info) {
            info = self.node(ino)?;
        }
        // A document refused at its close lost its name, but the kernel may still hold the
        // name for its TTL: an open through it (the writer's next try, `cp` of another
        // document) would write into the refused one, never stored. ESTALE makes the
        // kernel look the name up again, and find nothing.
        if info.detached
            && matches!(info.kind, NodeKind::Temp(_))
            && info.name == OsStr::new(METADATA_FILE)
        {
            return Err(FsError::Stale);
        }
        // Serialized with other opens of plain files and with moves of their data (a move
        // checks for handles passing through, then takes the data: none may slip in).
        let plain = matches!(info.kind, NodeKind::File);
        let _deciding = (plain && self.passthrough.on()).then(|| self.passthrough.deciding());
        let passes = self.passes_through(&info, writable)?;
        let mut handle = FileHandle::new(ino, writable);
        let (keep_cache, direct_io) = self.open_node(&info, flags, &mut handle, by)?;
        // A document of an object store may be another node's new one at the next open:
        // read past the kernel's cache (which a retry after a refused write would read).
        let document =
            self.tree.shared_by_nodes() && info.rel.file_name() == Some(OsStr::new(METADATA_FILE));
        let direct_write = writable && direct_writes(&info.kind);
        let passthrough = passing_through(&handle, passes)?;
        Ok(Opened {
            fh: self.handles.insert(Handle::File(Box::new(handle))),
            keep_cache: keep_cache && !document,
            direct_io: direct_io || document || direct_write,
            flush_at_close: flush_at_close(&info.kind, &info.rel, writable),
            passthrough,
        })
    }

    /// Whether this open of `info` passes through the kernel to its BACKING file
    /// (`view/passthrough.rs`): EBUSY when it cannot while the inode is open through it.
    fn passes_through(&self, info: &NodeInfo, writable: bool) -> Result<bool, FsError> {
        let opens = self.handles.opens_of(info.ino);
        let through_now = matches!(opens, Opens::Through(_));
        let plain = matches!(info.kind, NodeKind::File)
            && !info.detached
            && !(writable && info.rel.file_name() == Some(OsStr::new(METADATA_FILE)));
        if through_now {
            // Its name now leads to another file (replaced outside the mount): ESTALE
            // makes the kernel look the name up again, and find the new inode.
            if info.detached {
                return Err(FsError::Stale);
            }
            return if plain && self.passthrough.on() {
                Ok(true)
            } else {
                Err(FsError::Conflict(format!(
                    "{} is open through FUSE passthrough as a plain file; it cannot be opened \
                     as what it is now until those opens close",
                    info.rel.display()
                )))
            };
        }
        Ok(plain
            && self.passthrough.on()
            && self.tree.changes_in_place()
            && crate::core::view::passthrough::name_fits(&info.name)
            && opens == Opens::Closed
            && matches!(self.node(info.parent)?.kind, NodeKind::Dir))
    }

    /// The mount's passthrough state, told by the adapter.
    pub fn passthrough(&self) -> &crate::core::view::passthrough::Passthrough {
        &self.passthrough
    }

    /// A descriptor of the BACKING file handle `fh` passes through to.
    pub fn passthrough_file(&self, fh: u64) -> Result<std::fs::File, FsError> {
        let handle = self.handles.get(fh)?;
        match handle.as_ref() {
            Handle::File(f) => match &f.backing {
                Some(file) => Ok(file.try_clone()?),
                None => Err(FsError::BadHandle),
            },
            _ => Err(FsError::BadHandle),
        }
    }

    /// The kernel did not take handle `fh` for passthrough: the daemon serves it.
    pub fn passthrough_declined(&self, fh: u64) {
        if let Ok(handle) = self.handles.get(fh)
            && let Handle::File(f) = handle.as_ref()
        {
            *lock(&f.passthrough) = None;
        }
    }

    /// Opens the node `info` into `handle`, by its kind. Returns whether the kernel may
    /// keep pages between opens, and whether reads bypass it.
    fn open_node(
        &self,
        info: &NodeInfo,
        flags: i32,
        handle: &mut FileHandle,
        by: crate::backing::Asker,
    ) -> Result<(bool, bool), FsError> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let truncate = writable && flags & libc::O_TRUNC != 0;
        Ok(match &info.kind {
            NodeKind::File
                if writable && info.rel.file_name() == Some(OsStr::new(METADATA_FILE)) =>
            {
                self.open_plain_document(info, truncate, handle, by)?;
                (false, false)
            }
            NodeKind::File => (
                self.open_backing_file(info, flags, truncate, handle, by)?,
                false,
            ),
            NodeKind::ArrayMeta(array) => {
                if writable {
                    self.may_write_document(array, by)?;
                }
                let view = array.view_json.clone();
                (self.open_document(info, view, truncate, handle), false)
            }
            NodeKind::GroupMeta(group) => {
                let view = group.json.clone();
                (self.open_document(info, view, truncate, handle), false)
            }
            NodeKind::Control => {
                handle.bytes = Some(self.control_json());
                (false, true)
            }
            NodeKind::Temp(file) => {
                self.open_temp(file, truncate, handle);
                (true, false)
            }
            NodeKind::Chunk { array, coords } => {
                if writable {
                    // A chunk's mode is its array's (its directory's, really there).
                    self.may_write_array(array, super::namespace::Caller::asking(by))?;
                    let _ = handle.array.set(array.clone());
                    self.inodes.changed_here(info.ino);
                }
                self.open_chunk(array, coords, truncate, handle)?;
                self.chunk_caching(info.ino, handle)
            }
            NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. } => {
                return Err(FsError::IsDir);
            }
            NodeKind::Symlink | NodeKind::Other => {
                return Err(FsError::Unsupported("opening a special file"));
            }
        })
    }

    /// Whether `by` may write `array`'s `zarr.json`: BACKING's file, written by the mount
    /// as root, checked on the file really there (the kernel checked a view it cached).
    fn may_write_document(
        &self,
        array: &ArrayState,
        by: crate::backing::Asker,
    ) -> Result<(), FsError> {
        let doc = self.backing.stat(&array.rel.join(METADATA_FILE))?;
        let doc = doc.ok_or(FsError::NotFound)?;
        Ok(crate::backing::may_open(&doc, by, false, true)?)
    }

    /// A temporary file inside an array, opened (emptied first when `truncate`).
    fn open_temp(&self, file: &Arc<MemFile>, truncate: bool, handle: &mut FileHandle) {
        if truncate {
            let delta = file.change(|d| d.truncate(0)).unwrap_or(0);
            self.charge_temp(file, delta);
        }
        if handle.writable {
            // A writer from open to FLUSH: the content is not final meanwhile.
            handle.mark_dirty(file);
        }
    }

    /// A plain directory's `zarr.json` opened to be written in place: held in memory,
    /// committed at FLUSH, as the file it was (its owner and mode, taken now: by the time
    /// it is written out another file may be at the name).
    fn open_plain_document(
        &self,
        info: &NodeInfo,
        truncate: bool,
        handle: &mut FileHandle,
        by: crate::backing::Asker,
    ) -> Result<(), FsError> {
        let (bytes, meta) = self
            .backing
            .read_as(
                &info.rel,
                crate::core::pending::memfile::MAX_METADATA_BYTES,
                by,
            )?
            .ok_or(FsError::NotFound)?;
        crate::backing::may_open(&meta, by, false, true)?;
        let content = match truncate {
            true => FileData::default(),
            false => FileData::from_bytes(Bytes::from(bytes)),
        };
        let file = self.start_temp(info, content);
        file.set_owner(crate::backing::FileOwner::of(&meta));
        handle.mark_dirty(&file);
        Ok(())
    }

    /// Whether the kernel may keep a chunk's pages at this open, and whether it reads past
    /// them. On an object store, where another node may replace a chunk at any time, no
    /// page cache at all: the kernel keeps one per inode, shared by every open of it, so a
    /// new open that read the new version would serve it to an older open that pinned the
    /// old one. Each read comes here and reads its open's version.
    fn chunk_caching(&self, ino: Ino, handle: &FileHandle) -> (bool, bool) {
        let keep = self.keep_chunk_pages(ino, handle);
        let direct = self.tree.shared_by_nodes();
        (keep && !direct, direct)
    }

    /// Whether the kernel may keep the pages it has of chunk `ino` at this open: only while
    /// they are of the version the open reads (a rewrite elsewhere may keep size and
    /// mtime). Pins that version to the handle.
    fn keep_chunk_pages(&self, ino: Ino, handle: &FileHandle) -> bool {
        let stored = lock(&handle.stored).clone();
        handle
            .pinned_at
            .store(self.inodes.changes_here(ino), Relaxed);
        let version = stored.map_or_else(|| Arc::from("here"), |c| c.version());
        !self.inodes.serve(ino, version)
    }

    /// Opens a BACKING file by descriptor; returns whether the kernel may keep its pages.
    fn open_backing_file(
        &self,
        info: &NodeInfo,
        flags: i32,
        truncate: bool,
        handle: &mut FileHandle,
        by: crate::backing::Asker,
    ) -> Result<bool, FsError> {
        let writable = handle.writable;
        let how = OpenMode {
            read: flags & libc::O_ACCMODE != libc::O_WRONLY,
            write: writable,
            truncate: false,
            append: flags & libc::O_APPEND != 0,
            create_new: None,
        };
        if writable {
            // A file changed in place could not be published whole.
            self.may_change_in_place(&info.rel, "a write in place")?;
        }
        let file = self.backing.open_file(&info.rel, how)?;
        // The kernel checked the caller's permission against attributes it had cached;
        // someone who may write the directory could have put another user's file at the
        // path since. Checked again on what was opened, and truncated only then.
        let meta = file.metadata()?;
        crate::backing::pinned::may_open(&meta, by, how.read, how.write)?;
        if truncate {
            file.set_len(0)?;
        }
        // Several names, several inodes to the kernel: no page cache kept between opens,
        // or a change through another name would not show.
        let keep_cache = file.metadata()?.nlink() <= 1;
        handle.backing = Some(file);
        Ok(keep_cache)
    }

    /// Opens a translated document (an array's or group's `zarr.json`, shown as `view`);
    /// returns whether the kernel may keep its pages.
    fn open_document(
        &self,
        info: &NodeInfo,
        view: Bytes,
        truncate: bool,
        handle: &mut FileHandle,
    ) -> bool {
        if !handle.writable {
            handle.bytes = Some(view);
            return true;
        }
        // Written as the view it shows; committed (translated back) at FLUSH.
        let content = if truncate {
            FileData::default()
        } else {
            FileData::from_bytes(view)
        };
        handle.mark_dirty(&self.start_temp(info, content));
        false
    }

    /// Opens a chunk: for writing, its pending content (made from the stored chunk unless
    /// truncated); for reading, where its bytes are now.
    fn open_chunk(
        &self,
        array: &Arc<ArrayState>,
        coords: &[u64],
        truncate: bool,
        handle: &mut FileHandle,
    ) -> Result<(), FsError> {
        if handle.writable {
            let target = self
                .shards
                .open_for_write(&self.backing, array, coords, truncate)?;
            handle.mark_dirty(&target);
            handle
                .as_chunk
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        match self.shards.chunk(&self.backing, array, coords)? {
            ChunkData::Absent => Err(FsError::NotFound),
            ChunkData::Stored(c) => {
                *lock(&handle.stored) = Some(c);
                Ok(())
            }
            ChunkData::Pending(_) => Ok(()),
            ChunkData::Damaged { shard, reason, .. } => Err(FsError::damaged_shard(
                &array.chunk_rel(coords),
                &shard,
                &reason,
            )),
        }
    }

    /// Makes the file at `info` an in-memory file with `content` (a `zarr.json` opened for
    /// writing).
    fn start_temp(&self, info: &NodeInfo, content: FileData) -> Arc<MemFile> {
        let file = Arc::new(MemFile::new(content, 0o644));
        self.shards.charge(file.len() as i64);
        if let Some(old) = self.hold_file(&info.rel, &file) {
            self.shards.charge(-(old.len() as i64));
        }
        self.inodes.set_kind(info.ino, NodeKind::Temp(file.clone()));
        file
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let handle = self.handles.file(fh)?;
        let Handle::File(h) = handle.as_ref() else {
            return Err(FsError::IsDir);
        };
        let size = size as u64;
        let slice = |b: &Bytes| {
            let start = (offset as usize).min(b.len());
            let end = (start + size as usize).min(b.len());
            b.slice(start..end)
        };
        if let Some(b) = &h.bytes {
            return Ok(slice(b));
        }
        let info = self.node(h.ino)?;
        if let Some(file) = h.file()
            && matches!(info.kind, NodeKind::File)
        {
            return Ok(Bytes::from(read_full_at(file, offset, size)?));
        }
        match &info.kind {
            NodeKind::Temp(file) => Ok(Bytes::from(file.read(offset, size))),
            NodeKind::Chunk { array, coords } => self.read_chunk(h, array, coords, offset, size),
            // Never by its path: whatever is there now may be someone else's file.
            NodeKind::File => Err(FsError::Stale),
            _ => Err(FsError::IsDir),
        }
    }

    /// Reads a chunk through handle `h`. One open reads one version of it: the one it
    /// first read, pinned, so that another writer's new version (another mount's, a native
    /// one's) never mixes into what it already read. A change made through this mount to
    /// this very file is read at once, as on any file system; the pinned version also stays
    /// readable when the chunk is deleted. A version gone from an object store (which keeps
    /// none but the newest) fails as a whole (ESTALE), unless the shard was only rewritten
    /// for other chunks and still holds this one's content.
    fn read_chunk(
        &self,
        h: &crate::core::view::handle::FileHandle,
        array: &Arc<crate::core::array::ArrayState>,
        coords: &[u64],
        offset: u64,
        size: u64,
    ) -> Result<Bytes, FsError> {
        let changes = self.inodes.changes_here(h.ino);
        let pinned = lock(&h.stored).clone();
        if let Some(c) = pinned.filter(|_| h.pinned_at.load(Relaxed) == changes) {
            return match c.read_part(offset, size) {
                Err(FsError::Io(e)) if e.raw_os_error() == Some(libc::ESTALE) => {
                    self.shards.forget_seen(array, coords);
                    match self.shards.chunk(&self.backing, array, coords)? {
                        ChunkData::Stored(now) if c.same_content(&now) => {
                            *lock(&h.stored) = Some(now.clone());
                            now.read_part(offset, size)
                        }
                        _ => Err(FsError::Io(e)),
                    }
                }
                other => other,
            };
        }
        match self.shards.chunk(&self.backing, array, coords)? {
            ChunkData::Pending(file) => Ok(Bytes::from(file.read(offset, size))),
            ChunkData::Stored(c) => {
                *lock(&h.stored) = Some(c.clone());
                h.pinned_at.store(changes, Relaxed);
                c.read_part(offset, size)
            }
            ChunkData::Damaged { shard, reason, .. } => Err(FsError::damaged_shard(
                &array.chunk_rel(coords),
                &shard,
                &reason,
            )),
            ChunkData::Absent => Ok(Bytes::new()),
        }
    }

    pub fn statfs(&self) -> Result<StatFs, FsError> {
        let s = self.backing.statvfs()?;
        Ok(StatFs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }

    /// The control file's content: JSON padded with spaces to `CONTROL_SIZE`, so that its
    /// size never changes while the numbers in it do.
    pub(crate) fn control_json(&self) -> Bytes {
        let doc = serde_json::json!({
            "pid": self.daemon.pid,
            "status_file": self.daemon.status_file,
            "backing": self.backing.root(),
            "stats": self.stats(),
        });
        let mut text = serde_json::to_vec(&doc).unwrap_or_default();
        text.resize(CONTROL_SIZE.max(text.len() + 1), b' ');
        if let Some(last) = text.last_mut() {
            *last = b'\n';
        }
        Bytes::from(text)
    }
}

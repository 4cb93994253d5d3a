//! Changing names: create, mkdir, unlink, rmdir, rename, link, symlink. Inside arrays the
//! names are chunk keys (whose content goes to shards), key directories (which exist while
//! something lies below them) and temporary files (held in memory until renamed onto a key
//! or, if never, written to BACKING as they are).

use crate::core::refusal::Rule;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tracing::warn;

use super::ShardFs;
use super::lookup::Opened;
use crate::backing::{OpenMode, join_rel};
use crate::core::array::ArrayName;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{FileData, MemFile};
use crate::core::shards::ChunkData;
use crate::core::view::attr::Attr;
use crate::core::view::handle::{FileHandle, Handle, Opens};
use crate::core::view::inode::{Ino, NodeInfo, NodeKind};
use crate::zarr::{KeyNode, METADATA_FILE};

/// Where a new name would go.
#[derive(Debug)]
enum Place {
    /// A name of a plain directory: a BACKING file.
    Plain(PathBuf),
    /// `zarr.json` of the directory `dir`: a metadata document.
    Meta(PathBuf),
    /// A chunk key.
    Chunk(Arc<ArrayState>, Vec<u64>),
    /// A key directory.
    KeyDir(Arc<ArrayState>, KeyNode, PathBuf),
    /// A name inside an array that is not a key: held in memory when new, BACKING's when it
    /// exists there.
    Temp(PathBuf),
    Extra(PathBuf),
}

/// A file moved into an array is read into memory: at most the memory limit, or this.
const MOVED_FLOOR: u64 = 64 << 20;

/// One rename, resolved: what the old name is, and where the new one would go.
struct Move<'a> {
    src: NodeKind,
    src_rel: PathBuf,
    dst: Option<NodeKind>,
    dst_rel: PathBuf,
    place: Place,
    from: (Ino, &'a OsStr),
    to: (Ino, &'a OsStr),
    /// Who moves it (a file that becomes a chunk is read as them).
    by: Caller,
}

/// The mode of a file or directory made through the mount: permission bits and the sticky
/// bit as asked, never set-user-ID or set-group-ID (the daemon runs as root; such a bit
/// would hand root's rights to whoever asked for it).
pub(crate) fn new_mode(mode: u32) -> u32 {
    mode & 0o1777
}

/// Who asked: what the kernel says of the request's process. Files and directories made
/// in BACKING belong to it, as they would on a local file system.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Its process (whose other groups count in permission checks).
    pub pid: u32,
}

impl Caller {
    /// The daemon itself: what it makes stays as made.
    pub fn daemon() -> Caller {
        Caller {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            pid: std::process::id(),
        }
    }

    /// The caller `asker` describes.
    pub fn asking(asker: crate::backing::Asker) -> Caller {
        Caller {
            uid: asker.uid,
            gid: asker.gid,
            pid: asker.pid,
        }
    }

    /// As BACKING's permission checks know it.
    pub fn asker(self) -> crate::backing::Asker {
        crate::backing::Asker {
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
        }
    }
}

/// `rename(2)` flags the core understands.
#[derive(Clone, Copy, Debug, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

impl ShardFs {
    fn place(&self, parent: &NodeInfo, name: &OsStr) -> Result<Place, FsError> {
        if parent.ino == crate::core::ROOT && name == crate::core::PRIVATE_DIR {
            return Err(FsError::refused(
                Path::new(crate::core::PRIVATE_DIR),
                Rule::ShardfsOwnFile,
                "shardfs's own directory in BACKING",
            ));
        }
        let rel = join_rel(&parent.rel, name);
        let (array, node) = match &parent.kind {
            NodeKind::Dir if name == METADATA_FILE => return Ok(Place::Meta(parent.rel.clone())),
            // A mirror of an object store takes no file by descriptor: a new file is held in
            // memory, and published when written out (or committed, renamed onto zarr.json).
            NodeKind::Dir if !self.tree.changes_in_place() => return Ok(Place::Temp(rel)),
            NodeKind::Dir => return Ok(Place::Plain(rel)),
            NodeKind::ArrayDir(a) => (a.clone(), KeyNode::Root),
            NodeKind::ChunkDir { array, node } => (array.clone(), node.clone()),
            _ => return Err(FsError::NotDir),
        };
        let Some(text) = name.to_str() else {
            return Ok(Place::Temp(rel));
        };
        Ok(match array.classify_name(&node, text) {
            ArrayName::Meta => Place::Meta(parent.rel.clone()),
            ArrayName::Key(KeyNode::Chunk(c)) => Place::Chunk(array, c),
            ArrayName::Key(n) => Place::KeyDir(array, n, rel),
            ArrayName::BadKey => {
                return Err(FsError::refused(
                    &rel,
                    Rule::NotAChunkKey,
                    format!(
                        "not a chunk key of the array {} (chunk grid {:?})",
                        array.rel.display(),
                        array.layout.chunk_grid_shape()
                    ),
                ));
            }
            ArrayName::Other
                if self.temps.file(&rel).is_none() && self.backing.stat(&rel)?.is_some() =>
            {
                Place::Extra(rel)
            }
            ArrayName::Other | ArrayName::ShardLock => Place::Temp(rel),
        })
    }

    /// Where `name` in `parent` goes. A name made in a plain directory holds
    /// `plain_names` shared, and is placed again once held (the directory may have become
    /// an array meanwhile).
    fn place_held(
        &self,
        parent: Ino,
        name: &OsStr,
    ) -> Result<(NodeInfo, Place, Option<std::sync::RwLockReadGuard<'_, ()>>), FsError> {
        let plain = |p: &Place| matches!(p, Place::Plain(_) | Place::Extra(_));
        let info = self.node(parent)?;
        let place = self.place(&info, name)?;
        if !plain(&place) {
            return Ok((info, place, None));
        }
        let guard = self.plain_names.read().unwrap_or_else(|e| e.into_inner());
        let info = self.node(parent)?;
        let place = self.place(&info, name)?;
        let guard = plain(&place).then_some(guard);
        Ok((info, place, guard))
    }

    /// Whether `name` in `parent` is a directory (moving one moves the arrays in it).
    fn is_dir_name(&self, parent: Ino, name: &OsStr) -> bool {
        self.node(parent)
            .and_then(|p| self.resolve(&p, name))
            .is_ok_and(|k| matches!(k, NodeKind::Dir | NodeKind::ArrayDir(_)))
    }

    fn exists(&self, parent: &NodeInfo, name: &OsStr) -> Result<bool, FsError> {
        match self.resolve(parent, name) {
            Ok(_) => Ok(true),
            Err(FsError::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Registers a new name with the kernel (a create, mkdir or link reply counts as a
    /// lookup) and returns its attributes.
    fn enter(&self, parent: Ino, name: &OsStr, kind: NodeKind) -> Result<Attr, FsError> {
        let info = self.node(parent)?;
        let rel = join_rel(&info.rel, name);
        let attr = self.attr(0, &rel, &kind)?;
        let ino = self
            .inodes
            .lookup(parent, name, kind, self.link_source(&attr));
        Ok(Attr { ino, ..attr })
    }

    pub fn create(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, Opened), FsError> {
        let _gate = self.gate.shared();
        let (p, place, _shared) = self.place_held(parent, name)?;
        if self.exists(&p, name)? {
            if flags & libc::O_EXCL != 0 {
                return Err(FsError::Exists);
            }
            drop(_shared);
            drop(_gate);
            let attr = self.lookup(parent, name)?;
            let opened = self.open(attr.ino, flags, caller.asker())?;
            return Ok((attr, opened));
        }
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (kind, backing_file) = self.new_file(place, mode, caller)?;
        // A writer from creation to FLUSH: the content is not final meanwhile.
        let kind_is_chunk = matches!(kind, NodeKind::Chunk { .. });
        let written = self.write_target(&kind)?;
        let chunk_array = match &kind {
            NodeKind::Chunk { array, .. } => Some(array.clone()),
            _ => None,
        };
        let flush = super::lookup::flush_at_close(&kind, Path::new(name), writable);
        let direct = super::lookup::direct_writes(&kind);
        let through = self.creates_through(&p, name, &kind);
        let attr = self.enter(parent, name, kind)?;
        let mut handle = FileHandle::new(attr.ino, writable);
        handle.backing = backing_file;
        // Writes through it go to the array it was made (and checked) in, and no other.
        if let Some(array) = chunk_array {
            let _ = handle.array.set(array);
        }
        handle
            .as_chunk
            .store(kind_is_chunk, std::sync::atomic::Ordering::Relaxed);
        if let Some(f) = written
            && writable
        {
            handle.mark_dirty(&f);
        }
        let passthrough = super::lookup::passing_through(&handle, through)?;
        let fh = self.handles.insert(Handle::File(Box::new(handle)));
        Ok((
            attr,
            Opened {
                fh,
                keep_cache: true,
                direct_io: writable && direct,
                flush_at_close: flush,
                passthrough,
            },
        ))
    }

    /// Whether a new file `name` of `kind` in `parent` passes through the kernel to its
    /// BACKING file (`view/passthrough.rs`).
    fn creates_through(&self, parent: &NodeInfo, name: &OsStr, kind: &NodeKind) -> bool {
        self.passthrough.on()
            && self.tree.changes_in_place()
            && matches!(kind, NodeKind::File)
            && matches!(parent.kind, NodeKind::Dir)
            && crate::core::view::passthrough::name_fits(name)
    }

    /// Makes the new file `place` names: a BACKING file (returned open), a file held in
    /// memory, or a chunk (made pending by the caller).
    fn new_file(
        &self,
        place: Place,
        mode: u32,
        caller: Caller,
    ) -> Result<(NodeKind, Option<std::fs::File>), FsError> {
        self.may_make_at(&place, caller)?;
        let kind = match place {
            Place::Plain(rel) | Place::Extra(rel) => {
                self.may_change_in_place(&rel, "a file created in place")?;
                let how = OpenMode {
                    read: true,
                    write: true,
                    create_new: Some(new_mode(mode)),
                    ..OpenMode::default()
                };
                // As the caller: theirs from the start, in a directory they may write.
                let file =
                    crate::backing::as_user(caller.asker(), || self.backing.open_file(&rel, how))?;
                return Ok((NodeKind::File, Some(file)));
            }
            Place::Meta(dir) => self.new_temp(&dir.join(METADATA_FILE), mode, caller)?,
            Place::Temp(rel) => self.new_temp(&rel, mode, caller)?,
            // The pending chunk itself is made by the caller, with the writer's mark.
            Place::Chunk(array, coords) => NodeKind::Chunk { array, coords },
            Place::KeyDir(_, _, rel) => {
                return Err(FsError::refused(
                    &rel,
                    Rule::FileAsKeyDirectory,
                    "a file named like a key directory",
                ));
            }
        };
        Ok((kind, None))
    }

    /// A new file held in memory at `rel`, made by `caller`: theirs once in BACKING, with
    /// the group a set-group-ID directory passes down.
    fn new_temp(&self, rel: &Path, mode: u32, caller: Caller) -> Result<NodeKind, FsError> {
        let dir = self.owner_of(rel.parent().unwrap_or(Path::new("")))?;
        let gid = match std::os::unix::fs::MetadataExt::mode(&dir) & libc::S_ISGID {
            0 => caller.gid,
            _ => std::os::unix::fs::MetadataExt::gid(&dir),
        };
        let owner = crate::backing::FileOwner {
            uid: caller.uid,
            gid,
            mode: mode & 0o7777,
        };
        let file = Arc::new(MemFile::new(FileData::default(), mode & 0o7777).owned_by(owner));
        if let Some(old) = self.hold_file(rel, &file) {
            self.shards.charge(-(old.len() as i64));
        }
        Ok(NodeKind::Temp(file))
    }

    pub fn mkdir(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let (p, place, _shared) = self.place_held(parent, name)?;
        if self.exists(&p, name)? {
            return Err(FsError::Exists);
        }
        let kind = match place {
            Place::Plain(rel) => {
                self.as_caller(caller, || self.backing.mkdir(&rel, new_mode(mode)))?;
                NodeKind::Dir
            }
            Place::Meta(dir) if matches!(p.kind, NodeKind::Dir) => {
                let rel = dir.join(METADATA_FILE);
                self.as_caller(caller, || self.backing.mkdir(&rel, new_mode(mode)))?;
                NodeKind::Dir
            }
            Place::KeyDir(array, node, rel) => {
                self.temps.insert_dir(&rel);
                NodeKind::ChunkDir { array, node }
            }
            Place::Temp(rel) | Place::Extra(rel) => {
                if let Some(parent) = rel.parent() {
                    self.backing.create_dir_all(parent)?;
                }
                self.as_caller(caller, || self.backing.mkdir(&rel, new_mode(mode)))?;
                NodeKind::Dir
            }
            _ => {
                return Err(FsError::refused(
                    &join_rel(&p.rel, name),
                    Rule::DirectoryAsFile,
                    "a directory named like a chunk or zarr.json",
                ));
            }
        };
        self.enter(parent, name, kind)
    }

    /// The content of a file as an in-memory file, without touching its source. A BACKING
    /// file is read as `reader`: one that becomes a chunk takes its array's owner and
    /// mode, so whoever could not read it must not move it there.
    fn content_of(
        &self,
        kind: &NodeKind,
        rel: &Path,
        reader: Caller,
    ) -> Result<Arc<MemFile>, FsError> {
        let from_bytes = |b: Bytes| Arc::new(MemFile::new(FileData::from_bytes(b), 0o644));
        match kind {
            NodeKind::Temp(f) => Ok(f.clone()),
            NodeKind::Chunk { array, coords } => {
                match self.shards.chunk(&self.backing, array, coords)? {
                    ChunkData::Pending(f) => Ok(f),
                    ChunkData::Stored(c) => Ok(from_bytes(c.read()?)),
                    ChunkData::Damaged { shard, reason, .. } => {
                        Err(FsError::damaged_shard(rel, &shard, &reason))
                    }
                    ChunkData::Absent => Err(FsError::NotFound),
                }
            }
            // Into memory only what memory may hold (a file renamed into an array).
            // It stays its owner's, with its mode, wherever it goes.
            NodeKind::File => {
                // (A floor, so that a tiny limit still lets documents and ordinary
                // chunks move; it bounds a hostile sparse file all the same.)
                let held = self.config.max_pending.max(MOVED_FLOOR);
                let limit = crate::limits::MAX_FILE_BYTES.min(held);
                let (bytes, meta) = self
                    .backing
                    .read_as(rel, limit, reader.asker())?
                    .ok_or(FsError::NotFound)?;
                let file = MemFile::new(FileData::from_bytes(Bytes::from(bytes)), 0o644);
                let owner = crate::backing::FileOwner::of(&meta);
                Ok(Arc::new(file.owned_by(owner)))
            }
            NodeKind::ArrayMeta(a) => Ok(from_bytes(a.view_json.clone())),
            NodeKind::GroupMeta(g) => Ok(from_bytes(g.json.clone())),
            _ => Err(FsError::IsDir),
        }
    }

    /// Puts `file` at a place: into a shard, a temporary name, BACKING, or committed as
    /// metadata. Returns what the name is then.
    /// `ino`: the inode whose content it is (a rename), whose open handles go on through
    /// the BACKING file when that is where it goes.
    fn put_content(
        &self,
        place: &Place,
        file: Arc<MemFile>,
        ino: Option<Ino>,
    ) -> Result<NodeKind, FsError> {
        match place {
            Place::Chunk(array, coords) => {
                // A file moved or linked in holds no more than a chunk of an array the
                // mount compresses may (as a write into one is refused past that).
                if let Some(z) = array.zstd
                    && file.len() > z.max
                {
                    return Err(FsError::refused(
                        &array.chunk_rel(coords),
                        Rule::TooBig,
                        format!(
                            "{} bytes, past the {} a chunk of this array holds (its mount \
                             compresses it, and a chunk holds no more than its shape times \
                             its data type's size)",
                            file.len(),
                            z.max
                        ),
                    ));
                }
                let len = file.len() as i64;
                self.shards.charge(len);
                if let Err(e) = self.shards.put(&self.backing, array, coords, file) {
                    self.shards.charge(-len);
                    return Err(e);
                }
                Ok(NodeKind::Chunk {
                    array: array.clone(),
                    coords: coords.clone(),
                })
            }
            Place::Temp(rel) => {
                self.shards.charge(file.len() as i64);
                if let Some(old) = self.hold_file(rel, &file) {
                    self.shards.charge(-(old.len() as i64));
                }
                Ok(NodeKind::Temp(file))
            }
            Place::Plain(rel) | Place::Extra(rel) => {
                let segments = file.snapshot().data.segments();
                let made = Some(file.with(|s| s.changed));
                let written = self
                    .tree
                    .write_whole(rel, &segments, false, file.maker(), made)?;
                if let Some(ino) = ino {
                    self.handles.went_to(ino, &written);
                }
                Ok(NodeKind::File)
            }
            Place::Meta(dir) => {
                let data = file.snapshot().data;
                self.commit_metadata(
                    dir,
                    &data.read(0, data.len()),
                    Some(file.with(|s| s.changed)),
                )?;
                // An older copy being written in place is replaced by this document.
                let doc = dir.join(METADATA_FILE);
                if let Some(old) = self.temps.file(&doc)
                    && !Arc::ptr_eq(&old, &file)
                {
                    self.drop_temp_if(&doc, &old);
                }
                self.resolve_path(&doc)
            }
            Place::KeyDir(..) => Err(FsError::IsDir),
        }
    }

    /// Removes a file's name and content at its source (after its content was taken, and
    /// `durable_elsewhere`: made durable at its new name, if the journal held it).
    fn remove_content(
        &self,
        kind: &NodeKind,
        rel: &Path,
        durable_elsewhere: bool,
    ) -> Result<(), FsError> {
        match kind {
            NodeKind::Temp(f) => {
                self.drop_temp_if(rel, f);
                Ok(())
            }
            // Only a rename comes here: the content has another name now.
            NodeKind::Chunk { array, coords } => {
                self.shards
                    .move_away(&self.backing, array, coords, durable_elsewhere)?;
                Ok(())
            }
            _ => {
                self.tree.remove_whole(rel)?;
                Ok(())
            }
        }
    }

    /// Before a name is unlinked or replaced: an open file keeps what it had.
    fn detach_name(&self, parent: Ino, name: &OsStr, kind: &NodeKind, rel: &Path) {
        let orphan = self.orphan_of(parent, name, kind, rel);
        self.inodes.detach(parent, name, orphan);
    }

    /// What the inode of `name` in `parent` is once its name goes: for handles open on
    /// it, its content, taken now (a chunk's or held file's, before it is replaced).
    /// Taken before a change, and the name detached only once the change is made: a
    /// change that fails leaves the kernel the name, which must still lead to the file.
    fn orphan_of(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: &NodeKind,
        rel: &Path,
    ) -> Option<NodeKind> {
        let ino = self.inodes.peek(parent, name)?;
        if self.handles.is_open(ino) {
            match kind {
                NodeKind::Chunk { .. } | NodeKind::Temp(_) => self
                    .content_of(kind, rel, Caller::daemon())
                    .ok()
                    .map(NodeKind::Temp),
                // A BACKING file opened while it was held in memory has no descriptor of
                // its own: the content stays in memory for the handles that had it open.
                NodeKind::File if self.handles.any_without_backing(ino) => self
                    .content_of(kind, rel, Caller::daemon())
                    .ok()
                    .map(NodeKind::Temp),
                _ => None,
            }
        } else {
            None
        }
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr, by: Caller) -> Result<(), FsError> {
        let _gate = self.gate.for_request(name == METADATA_FILE);
        let p = self.node(parent)?;
        let rel = join_rel(&p.rel, name);
        let kind = self.resolve(&p, name)?;
        self.may_change_names(&kind, &rel, by)?;
        match &kind {
            NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. } => {
                return Err(FsError::IsDir);
            }
            NodeKind::Control => {
                return Err(FsError::refused(
                    &rel,
                    Rule::ShardfsOwnFile,
                    "removal of the control file",
                ));
            }
            NodeKind::ArrayMeta(array) => self.unlink_array_document(array, &rel)?,
            NodeKind::Chunk { array, coords } => {
                self.detach_name(parent, name, &kind, &rel);
                return self.unlink_chunk(array, coords);
            }
            NodeKind::Temp(_) => {
                self.detach_name(parent, name, &kind, &rel);
                self.remove_content(&kind, &rel, true)?;
                return Ok(());
            }
            _ => {
                // An open file's content is read before it goes; the name is detached once
                // it is gone (a refused removal leaves the kernel the name).
                let orphan = self.orphan_of(parent, name, &kind, &rel);
                // As the caller: the kernel checks the directory really there.
                let removed = crate::backing::as_user(by.asker(), || self.tree.remove_whole(&rel))?;
                self.inodes.detach(parent, name, orphan);
                if !removed {
                    return Err(FsError::NotFound);
                }
                return Ok(());
            }
        }
        self.detach_name(parent, name, &kind, &rel);
        Ok(())
    }

    /// An array's `zarr.json` removed. The metadata goes last: everything pending is
    /// written, durably, while it is there.
    fn unlink_array_document(&self, array: &ArrayState, rel: &Path) -> Result<(), FsError> {
        self.settle_durably(&array.rel)?;
        self.tree.remove_whole(rel)?;
        self.left.left(&array.rel, &array.meta);
        self.prune_key_dirs(array, &array.rel, &KeyNode::Root);
        self.shards.forget_array(&array.rel);
        self.temps.forget_below(&array.rel);
        self.inodes.bump_generation();
        Ok(())
    }

    /// A chunk removed (its name detached already).
    fn unlink_chunk(&self, array: &Arc<ArrayState>, coords: &[u64]) -> Result<(), FsError> {
        if !self.shards.delete(&self.backing, array, coords)? {
            return Err(FsError::NotFound);
        }
        // The name is gone: a shard that cannot be written now (a full disk) is not this
        // unlink's failure (an error would leave the kernel the name); the removal waits
        // in memory, and the next fsync or flush reports it.
        if let Err(e) = self.complete_if_ready(array, coords, false) {
            warn!(array = %array.rel.display(), "shard write after an unlink failed, kept in memory: {e}");
        }
        Ok(())
    }

    /// Removes a key directory that shows no chunk from BACKING too, so that it does not
    /// come back when the array's `zarr.json` goes (`rm -r` would then find it). Shard
    /// files of deleted chunks still in it are written (removed) first.
    fn remove_key_dir(
        &self,
        array: &ArrayState,
        node: &KeyNode,
        rel: &Path,
    ) -> Result<(), FsError> {
        let gone = |r: std::io::Result<()>| match r {
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => Ok(false),
            Err(e) if crate::backing::is_absent(&e) => Ok(true),
            other => other.map(|()| true),
        };
        if !gone(self.backing.remove_dir(rel))? {
            self.flush_array_at(&array.rel)?;
            // What is left the mount does not show: shards holding no chunk, and hidden key
            // directories of them, at any depth.
            self.prune_key_dirs(array, rel, node);
            gone(self.backing.remove_dir(rel))?;
        }
        Ok(())
    }

    /// A shard file that holds no chunk: an empty one a crash left, or one kept only for
    /// its stamps (`shard::stamps`). The mount never shows it, so it must not keep its
    /// directory from going.
    fn holds_no_chunk(&self, array: &ArrayState, path: &Path) -> bool {
        let Ok(Some(meta)) = self.backing.stat(path) else {
            return false;
        };
        if meta.len() == 0 {
            return true;
        }
        let Ok(file) = self.backing.open(path) else {
            return false;
        };
        crate::shard::read_index(&file, meta.len(), &array.layout.index)
            .is_ok_and(|i| i.present().next().is_none())
    }

    /// Removes the empty directories on key paths below `rel` (bottom up) that the mount does
    /// not show, and empty shard files, once the array's `zarr.json` is gone: a key directory
    /// shows while it holds chunks or was made with mkdir, so a hidden one must not appear
    /// now and keep `rm -r` from removing the directory.
    fn prune_key_dirs(&self, array: &ArrayState, rel: &Path, node: &KeyNode) {
        let Ok(entries) = self.backing.list(rel) else {
            return;
        };
        for e in &entries {
            let Some(name) = e.name.to_str() else {
                continue;
            };
            // A shard file holding no chunk was never shown (`holds_no_chunk`).
            if !e.kind.is_dir() {
                let path = rel.join(name);
                if array.is_key_name(node, name) && self.holds_no_chunk(array, &path) {
                    let _ = self.backing.remove_file(&path);
                }
                continue;
            }
            if let ArrayName::Key(child @ KeyNode::Dir(_)) = array.classify_name(node, name) {
                let path = rel.join(name);
                // One the mount shows (made with mkdir) stays, as on any directory.
                if self.temps.dir(&path) || self.temps.any_below(&path) {
                    continue;
                }
                self.prune_key_dirs(array, &path, &child);
                // Only an empty one goes; anything else fails and stays.
                let _ = self.backing.remove_dir(&path);
            }
        }
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr, by: Caller) -> Result<(), FsError> {
        let p = self.node(parent)?;
        let rel = join_rel(&p.rel, name);
        let kind = match self.resolve(&p, name) {
            Ok(k) => k,
            // A key directory whose last chunk was just removed: still the kernel's to rmdir.
            Err(FsError::NotFound) => match self.place(&p, name)? {
                Place::KeyDir(array, node, _) => NodeKind::ChunkDir { array, node },
                _ => return Err(FsError::NotFound),
            },
            Err(e) => return Err(e),
        };
        self.may_change_names(&kind, &rel, by)?;
        match &kind {
            NodeKind::ChunkDir { array, node } => {
                let extras = self.backing.list(&rel)?.into_iter().any(|e| {
                    e.name
                        .to_str()
                        .is_none_or(|n| array.classify_name(node, n) == ArrayName::Other)
                });
                if extras
                    || self.temps.any_below(&rel)
                    || self.shards.has_chunks_below(&self.backing, array, node)?
                {
                    return Err(FsError::NotEmpty);
                }
                self.temps.remove_dir(&rel);
                self.remove_key_dir(array, node, &rel)?;
            }
            // Its zarr.json is still there.
            NodeKind::ArrayDir(_) => return Err(FsError::NotEmpty),
            NodeKind::Dir => {
                if self.temps.any_below(&rel) {
                    return Err(FsError::NotEmpty);
                }
                self.as_caller(by, || self.backing.remove_dir(&rel))?;
                self.shards.forget_array(&rel);
                self.temps.forget_below(&rel);
            }
            _ => return Err(FsError::NotDir),
        }
        self.inodes.detach(parent, name, None);
        Ok(())
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: RenameFlags,
        by: Caller,
    ) -> Result<(), FsError> {
        let _gate = self.gate.for_request(
            name == METADATA_FILE
                || newname == METADATA_FILE
                || self.is_dir_name(parent, name)
                || (flags.exchange && self.is_dir_name(newparent, newname)),
        );
        let (dp, place, _shared) = self.place_held(newparent, newname)?;
        let sp = self.node(parent)?;
        let dst = match self.resolve(&dp, newname) {
            Ok(k) => Some(k),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let mv = Move {
            src: self.resolve(&sp, name)?,
            src_rel: join_rel(&sp.rel, name),
            dst,
            dst_rel: join_rel(&dp.rel, newname),
            place,
            from: (parent, name),
            to: (newparent, newname),
            by,
        };
        if flags.noreplace && mv.dst.is_some() {
            return Err(FsError::Exists);
        }
        self.may_change_names(&mv.src, &mv.src_rel, by)?;
        self.may_make_at(&mv.place, by)?;
        if mv.src_rel == mv.dst_rel {
            return Ok(());
        }
        if flags.exchange {
            return self.exchange(&mv);
        }
        self.no_failed_shards(&mv.place)?;
        let src_ino = self.inodes.peek(parent, name);
        // Held until the data has moved and the inode is what it is now: no open of a
        // plain file may decide how it goes (through the kernel or not) in between.
        let dir = matches!(mv.src, NodeKind::Dir | NodeKind::ArrayDir(_));
        let plain = !dir
            && (matches!(mv.src, NodeKind::File)
                || matches!(mv.place, Place::Plain(_) | Place::Extra(_)));
        let deciding = (plain && self.passthrough.on()).then(|| self.passthrough.deciding());
        let new_kind = self.move_name(&mv, src_ino)?;
        match src_ino {
            Some(ino) => self.inodes.rename(ino, mv.from, mv.to, new_kind.clone()),
            None => {
                self.inodes.detach(newparent, newname, None);
            }
        }
        drop(deciding);
        self.complete_after_move([&mv.src, &new_kind])
    }

    /// A chunk that left a shard, or arrived closed, may complete it. The names have moved
    /// by now, so a failed shard write (a full disk, a store gone) is not this rename's to
    /// report: an error would leave the kernel with the old names, one of them reaching
    /// the moved file. The chunks stay pending in memory; the writer hears of it at its
    /// next rename into the array (`no_failed_shards`), fsync or flush.
    fn complete_after_move(&self, kinds: [&NodeKind; 2]) -> Result<(), FsError> {
        for kind in kinds {
            if let NodeKind::Chunk { array, coords } = kind
                && let Err(e) = self.complete_if_ready(array, coords, false)
            {
                warn!(array = %array.rel.display(), "shard write after a rename failed, chunks kept in memory: {e}");
            }
        }
        Ok(())
    }

    /// Before a rename or link onto a chunk key: a shard of that array whose write failed is
    /// tried again, and while it still fails the rename is refused with its error, before
    /// any name moves. So a writer that renames (or links) its chunks into place
    /// (zarr-python, tensorstore) hears of a full disk or a store gone at its next chunk.
    fn no_failed_shards(&self, place: &Place) -> Result<(), FsError> {
        let Place::Chunk(array, _) = place else {
            return Ok(());
        };
        self.shards
            .write_below(&self.backing, &array.rel, &[], |st| st.failed())
    }

    /// Moves what `mv.src` names to its new place; returns what the new name is then.
    fn move_name(&self, mv: &Move, src_ino: Option<Ino>) -> Result<NodeKind, FsError> {
        self.check_movable(mv)?;
        match (&mv.src, &mv.place) {
            (
                NodeKind::Dir | NodeKind::ArrayDir(_),
                Place::Plain(to) | Place::Extra(to) | Place::Temp(to),
            ) => self.move_dir(&mv.src_rel, to, mv.by),
            (
                NodeKind::File | NodeKind::Symlink | NodeKind::Other,
                Place::Plain(to) | Place::Extra(to) | Place::Temp(to),
            ) if self.stays_in_backing(mv) => {
                // A BACKING file staying a BACKING file: a plain rename.
                if let Some(dir) = to.parent() {
                    self.backing.create_dir_all(dir)?;
                }
                let orphan = mv
                    .dst
                    .as_ref()
                    .map(|d| self.orphan_of(mv.to.0, mv.to.1, d, &mv.dst_rel));
                self.as_caller(mv.by, || self.backing.rename(&mv.src_rel, to))?;
                if let Some(orphan) = orphan {
                    self.inodes.detach(mv.to.0, mv.to.1, orphan);
                }
                Ok(mv.src.clone())
            }
            // Everything else moves content: into a shard, memory, BACKING or metadata.
            _ => self.move_content(mv, src_ino),
        }
    }

    /// A BACKING file renamed onto a plain name (not over a file held in memory) stays
    /// where it is in BACKING; an object store's mirror publishes it anew instead.
    fn stays_in_backing(&self, mv: &Move) -> bool {
        !matches!(mv.dst, Some(NodeKind::Temp(_))) && self.tree.changes_in_place()
    }

    /// Refuses the renames that break a rule of the mount.
    fn check_movable(&self, mv: &Move) -> Result<(), FsError> {
        let plain_place = matches!(mv.place, Place::Plain(_) | Place::Extra(_) | Place::Temp(_));
        let (rule, detail) = match &mv.src {
            _ if matches!(mv.src, NodeKind::ChunkDir { .. })
                || matches!(mv.place, Place::KeyDir(..)) =>
            {
                (Rule::KeyDirectoryMove, "a rename")
            }
            NodeKind::Dir | NodeKind::ArrayDir(_) if !self.tree.changes_in_place() => {
                // An object store renames nothing: mv copies and removes instead.
                (Rule::ObjectStoreDirectoryRename, "a directory rename")
            }
            NodeKind::Dir | NodeKind::ArrayDir(_) if !plain_place => {
                return Err(FsError::refused(
                    &mv.dst_rel,
                    Rule::DirectoryAsFile,
                    format!("a rename of the directory {} onto it", mv.src_rel.display()),
                ));
            }
            NodeKind::Symlink | NodeKind::Other if !(plain_place && self.stays_in_backing(mv)) => {
                (Rule::SpecialFileInArray, "a rename of a special file")
            }
            NodeKind::Control => (Rule::ShardfsOwnFile, "a rename of the control file"),
            _ => return Ok(()),
        };
        Err(FsError::refused(
            &mv.src_rel,
            rule,
            format!("{detail} to {}", mv.dst_rel.display()),
        ))
    }

    /// A directory (an array's, too) renamed to a plain name: what is pending below it is
    /// written first, and what is known of it forgotten.
    fn move_dir(&self, src_rel: &Path, to: &Path, by: Caller) -> Result<NodeKind, FsError> {
        self.flush_below(src_rel)?;
        self.settle_durably(src_rel)?;
        if let Some(dir) = to.parent() {
            self.backing.create_dir_all(dir)?;
        }
        self.as_caller(by, || self.backing.rename(src_rel, to))?;
        self.left.moved(src_rel, to);
        self.shards.forget_array(src_rel);
        self.temps.forget_below(src_rel);
        self.inodes.bump_generation();
        self.resolve_path(to)
    }

    /// Moves the content of `mv.src` to its new place (a chunk, a held file, BACKING or a
    /// metadata document), the destination first: when that fails (a refused document, a
    /// full disk), the source is untouched.
    fn move_content(&self, mv: &Move, src_ino: Option<Ino>) -> Result<NodeKind, FsError> {
        self.may_move_content(Some((&mv.src, &mv.src_rel)), &mv.place, mv.by)?;
        if let Some(ino) = src_ino {
            self.not_passing_through(ino, &mv.src_rel)?;
        }
        let content = self.content_of(&mv.src, &mv.src_rel, mv.by)?;
        let orphan = mv
            .dst
            .as_ref()
            .map(|d| self.orphan_of(mv.to.0, mv.to.1, d, &mv.dst_rel));
        if let NodeKind::ArrayMeta(array) = &mv.src {
            self.flush_array_at(&array.rel)?;
            self.left.left(&array.rel, &array.meta);
        }
        if let (NodeKind::Chunk { array, coords }, Place::Chunk(..)) = (&mv.src, &mv.place) {
            // (The first key it left: a later one held it only in memory.)
            content.with(|s| {
                s.moved_from
                    .get_or_insert_with(|| (array.clone(), coords.clone()));
            });
        }
        let mut kind = self.put_content(&mv.place, content.clone(), src_ino)?;
        if let Some(orphan) = orphan {
            self.inodes.detach(mv.to.0, mv.to.1, orphan);
        }
        // A chunk whose content the journal holds is made durable at its new name before
        // its old name's removal is journaled: a crash finds it at one of them. If that
        // fails (a full disk), or the file is still being written, the old name's records
        // stay live, and the rename is not durable yet.
        let durable_elsewhere = self.durable_at_new_name(mv, &mut kind, &content)?;
        self.remove_content(&mv.src, &mv.src_rel, durable_elsewhere)?;
        match (&mv.src, src_ino) {
            (NodeKind::File, Some(ino)) => self.handles.backing_moved(ino),
            (NodeKind::Chunk { .. }, Some(ino)) => self.handles.chunk_moved(ino),
            _ => {}
        }
        // Written out to BACKING at its new name: its open handles go on through that file.
        if let (NodeKind::File, Some(ino), Some(written)) = (&kind, src_ino, content.written()) {
            self.handles.went_to(ino, written);
        }
        Ok(kind)
    }

    /// EBUSY while `ino` is open through passthrough (its writes would not follow its data
    /// out of the file), after a short wait for closes already on their way: a RELEASE
    /// comes after close(2) returns, and a rename may overtake it.
    fn not_passing_through(&self, ino: Ino, rel: &Path) -> Result<(), FsError> {
        let through = || match self.handles.opens_of(ino) {
            Opens::Through(source) => Ok::<_, FsError>(Some(source)),
            _ => Ok(None),
        };
        if crate::core::view::passthrough::after_closes_in_flight(through)?.is_none() {
            return Ok(());
        }
        Err(FsError::Conflict(format!(
            "{} is open through FUSE passthrough: close it before moving it into an array or \
             onto a zarr.json (or mount with --no-passthrough)",
            rel.display()
        )))
    }

    /// Before a rename takes content away from its old name: makes it durable at the new
    /// one (`kind`, updated to what the name is then) when the old name held it durably.
    /// Returns whether the old name's removal may be recorded: `false` leaves its records
    /// live (the rename is not durable yet).
    fn durable_at_new_name(
        &self,
        mv: &Move,
        kind: &mut NodeKind,
        content: &Arc<MemFile>,
    ) -> Result<bool, FsError> {
        match &mv.src {
            NodeKind::Chunk { array, coords }
                if self.shards.journal_holds(&self.backing, array, coords)? =>
            {
                // Still being written (open, never fsynced): its half-written content is
                // no state to make durable, so the old name keeps its records for now.
                if !content.durable_on_request() {
                    return Ok(false);
                }
                match self.make_durable_at(kind, &mv.dst_rel, content) {
                    Ok(now) => {
                        *kind = now;
                        Ok(true)
                    }
                    Err(e) => {
                        warn!(file = %mv.dst_rel.display(),
                            "renamed chunk not yet durable at its new name: {e}");
                        Ok(false)
                    }
                }
            }
            // A file of BACKING (a temporary file written out by its fsync, any file renamed
            // into an array) may be durable where it is: its new name holds it durably before
            // it goes, or it stays (and the rename fails).
            NodeKind::File => {
                *kind = self.make_durable_at(kind, &mv.dst_rel, content)?;
                Ok(true)
            }
            _ => Ok(true),
        }
    }

    /// Makes what was written of the arrays at and below `rel` durable, so that no journal
    /// record of them stays live: they name arrays at paths that are about to go (a
    /// `zarr.json` removed, a directory moved), and a replay must never put them into
    /// whatever comes to those paths next. What is pending is written first.
    fn settle_durably(&self, rel: &Path) -> Result<(), FsError> {
        self.flush_array_at(rel)?;
        self.shards
            .make_durable(&self.backing, |a, _, _| a.starts_with(rel))?;
        match self.shards.journal() {
            Some(j) => Ok(j.sync_all()?),
            None => Ok(()),
        }
    }

    /// Makes `file`, now at `rel` as `kind`, durable there: a record for a chunk, a synced
    /// file in BACKING for anything else. Returns what the name is then.
    fn make_durable_at(
        &self,
        kind: &NodeKind,
        rel: &Path,
        file: &Arc<MemFile>,
    ) -> Result<NodeKind, FsError> {
        match kind {
            NodeKind::Chunk { array, coords } => {
                if let Some(j) = self.shards.journal().cloned() {
                    self.journal_files(&j, &[(array.clone(), coords.clone(), file.clone())])?;
                }
            }
            NodeKind::Temp(_) if super::flush::is_lock_name(rel) => {
                return Err(FsError::Failed(
                    "a lock file's name is not written out".into(),
                    libc::EIO,
                ));
            }
            NodeKind::Temp(f) => {
                self.persist_temp(rel, f, true)?;
                return Ok(NodeKind::File);
            }
            NodeKind::File => {
                self.backing.sync_file_and_dir(rel)?;
            }
            _ => {}
        }
        Ok(kind.clone())
    }

    fn exchange(&self, mv: &Move) -> Result<(), FsError> {
        let (src, src_rel, place) = (&mv.src, mv.src_rel.as_path(), &mv.place);
        let plain = |k: &NodeKind| matches!(k, NodeKind::File | NodeKind::Dir | NodeKind::Symlink);
        let Some(dst) = &mv.dst else {
            return Err(FsError::Invalid(
                "exchange with a name that does not exist".into(),
            ));
        };
        let (Place::Plain(dst_rel) | Place::Extra(dst_rel)) = place else {
            return Err(translated_exchange(src_rel));
        };
        if !plain(src) || !plain(dst) {
            return Err(translated_exchange(src_rel));
        }
        // Whole trees swap places: what is pending in either is written first and made
        // durable, so that no record names a path about to change (as for a directory
        // moved), and what is known of them is forgotten (the gate is held exclusively).
        let trees = [src, dst].iter().any(|k| matches!(k, NodeKind::Dir));
        if trees {
            for rel in [src_rel, dst_rel.as_path()] {
                self.flush_below(rel)?;
                self.settle_durably(rel)?;
            }
        }
        self.as_caller(mv.by, || self.backing.exchange(src_rel, dst_rel))?;
        if trees {
            for rel in [src_rel, dst_rel.as_path()] {
                self.shards.forget_array(rel);
                self.temps.forget_below(rel);
            }
        }
        // The kernel swaps its entries: so do the inodes (detached, the kernel's entries
        // would name nothing for a second).
        self.inodes.exchange(mv.from, mv.to);
        self.inodes.bump_generation();
        Ok(())
    }

    /// Writes everything pending below `rel` (before the directory moves).
    fn flush_below(&self, rel: &Path) -> Result<(), FsError> {
        for (path, file) in self.temps.all_files() {
            if path.starts_with(rel) {
                self.persist_temp(&path, &file, false)?;
            }
        }
        let arrays: std::collections::BTreeSet<PathBuf> = self
            .shards
            .pending()
            .into_iter()
            .filter(|p| p.array.rel.starts_with(rel))
            .map(|p| p.array.rel.clone())
            .collect();
        for array in arrays {
            self.flush_array_at(&array)?;
        }
        Ok(())
    }

    pub fn link(
        &self,
        ino: Ino,
        newparent: Ino,
        newname: &OsStr,
        by: Caller,
    ) -> Result<Attr, FsError> {
        if !self.tree.changes_in_place() {
            self.may_change_in_place(&self.node(ino)?.rel, "a hard link")?;
        }
        let _gate = self.gate.for_request(newname == METADATA_FILE);
        let (dp, place, _shared) = self.place_held(newparent, newname)?;
        self.may_make_at(&place, by)?;
        let src = self.node(ino)?;
        // A link of a chunk is a copy of it: read as the caller, in the array really there.
        if let NodeKind::Chunk { array, .. } = &src.kind {
            self.may_use_array(array, by, 0o5)?;
        }
        if self.exists(&dp, newname)? {
            return Err(FsError::Exists);
        }
        self.no_failed_shards(&place)?;
        let kind = match (&src.kind, &place) {
            (
                NodeKind::File | NodeKind::Symlink | NodeKind::Other,
                Place::Plain(to) | Place::Extra(to),
            ) => {
                self.as_caller(by, || self.backing.hard_link(&src.rel, to))?;
                src.kind.clone()
            }
            (NodeKind::Symlink | NodeKind::Other, _) => {
                return Err(FsError::refused(
                    &join_rel(&dp.rel, newname),
                    Rule::SpecialFileInArray,
                    format!("a hard link to the special file {}", src.rel.display()),
                ));
            }
            (NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. }, _) => {
                return Err(FsError::NotPermitted("hard links to directories"));
            }
            // Elsewhere a link is a copy that shares the bytes (no data is copied).
            _ => {
                self.may_move_content(None, &place, by)?;
                let content = self.content_of(&src.kind, &src.rel, by)?;
                let copy = Arc::new(MemFile::new(content.snapshot().data, 0o644));
                self.put_content(&place, copy, None)?
            }
        };
        if let NodeKind::Chunk { array, coords } = &kind
            && let Err(e) = self.complete_if_ready(array, coords, false)
        {
            // The link is made; the shard stays pending and the failure is recorded.
            warn!("shard write after link failed: {e}");
        }
        self.enter(newparent, newname, kind)
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        if !self.tree.changes_in_place() {
            let rel = join_rel(&self.node(parent)?.rel, name);
            self.may_change_in_place(&rel, "a symbolic link")?;
        }
        let (p, place, _shared) = self.place_held(parent, name)?;
        if self.exists(&p, name)? {
            return Err(FsError::Exists);
        }
        match place {
            Place::Plain(rel) | Place::Temp(rel) | Place::Extra(rel) => {
                self.as_caller(caller, || self.backing.symlink(target, &rel))?;
            }
            _ => {
                return Err(FsError::refused(
                    &join_rel(&p.rel, name),
                    Rule::SpecialFileInArray,
                    "a symbolic link named like a chunk or zarr.json",
                ));
            }
        }
        self.enter(parent, name, NodeKind::Symlink)
    }

    /// mknod: FIFOs, sockets and devices (and regular files) in plain directories. Inside
    /// arrays only regular files are held, so special files are refused there.
    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let ty = mode & libc::S_IFMT;
        if ty == libc::S_IFREG || ty == 0 {
            let flags = libc::O_WRONLY | libc::O_EXCL;
            let (attr, opened) = self.create(parent, name, mode & 0o7777, flags, caller)?;
            self.release(opened.fh)?;
            return Ok(attr);
        }
        if !self.tree.changes_in_place() {
            let rel = join_rel(&self.node(parent)?.rel, name);
            self.may_change_in_place(&rel, "a special file")?;
        }
        let (p, place, _shared) = self.place_held(parent, name)?;
        if self.exists(&p, name)? {
            return Err(FsError::Exists);
        }
        match place {
            Place::Plain(rel) | Place::Extra(rel) => {
                let mode = ty | new_mode(mode);
                self.as_caller(caller, || self.backing.mknod(&rel, mode, rdev))?;
            }
            _ => {
                return Err(FsError::refused(
                    &join_rel(&p.rel, name),
                    Rule::SpecialFileInArray,
                    "a device file, FIFO or socket inside an array",
                ));
            }
        }
        self.enter(parent, name, NodeKind::Other)
    }

    /// Whether `by` may remove (or rename away) the name `rel`, whose kind is `kind`, when
    /// the mount does it as root: inside an array, the caller's permission is checked again
    /// on the directory really there (the kernel checked a view it cached, and another
    /// directory may have been put at the path since). Plain names are changed as the
    /// caller (`as_caller`), which the kernel checks itself.
    fn may_change_names(&self, kind: &NodeKind, rel: &Path, by: Caller) -> Result<(), FsError> {
        match kind {
            NodeKind::Chunk { array, .. }
            | NodeKind::ChunkDir { array, .. }
            | NodeKind::ArrayMeta(array) => self.may_write_array(array, by),
            NodeKind::Temp(_) => self.may_change_in(parent_of(rel), by),
            // Changed as the caller (`as_caller`): the kernel checks. One whose content the
            // mount moves instead is checked there (`move_content`).
            _ => Ok(()),
        }
    }

    /// Whether `by` may make a file at `place` (`may_change_names`).
    fn may_make_at(&self, place: &Place, by: Caller) -> Result<(), FsError> {
        match place {
            Place::Chunk(array, _) | Place::KeyDir(array, _, _) => self.may_write_array(array, by),
            Place::Temp(rel) => self.may_change_in(parent_of(rel), by),
            Place::Meta(dir) => self.may_change_in(dir, by),
            // Made as the caller (`as_caller`): the kernel checks. Content the mount writes
            // there instead is checked where it does (`may_move_content`).
            Place::Plain(_) | Place::Extra(_) => Ok(()),
        }
    }

    /// Whether `by` may have the mount, as root, take the BACKING file `src` away and put
    /// content at `place` (a move or copy between an array, memory and BACKING), as the
    /// kernel would decide on the directories really there.
    fn may_move_content(
        &self,
        taken: Option<(&NodeKind, &Path)>,
        place: &Place,
        by: Caller,
    ) -> Result<(), FsError> {
        if let Some((NodeKind::File | NodeKind::Symlink | NodeKind::Other, rel)) = taken {
            self.may_change_in(parent_of(rel), by)?;
        }
        if let Place::Plain(rel) | Place::Extra(rel) = place {
            self.may_change_in(parent_of(rel), by)?;
        }
        Ok(())
    }

    /// Whether `by` may change the names of `array`, on the directory that holds it.
    /// The directory must still be at the array's path (the mount writes its shards by
    /// path): ESTALE otherwise, and the kernel looks the name up again.
    pub(crate) fn may_write_array(&self, array: &ArrayState, by: Caller) -> Result<(), FsError> {
        self.may_use_array(array, by, 0o3)
    }

    /// Whether `by` has the permission bits `want` on `array`'s directory (a chunk's
    /// mode is its array's), which must still be at its path.
    fn may_use_array(&self, array: &ArrayState, by: Caller, want: u32) -> Result<(), FsError> {
        let owner = match &array.dir {
            Some(held) => held
                .owner_if_at(&self.backing, &array.rel)
                .ok_or(FsError::Stale)?,
            // Not held (past the most held): by path, if the directory there is its own.
            None => match self.backing.dir_facts(&array.rel) {
                Some((id, instance, owner))
                    if Some(id) == array.dir_id && instance == array.instance =>
                {
                    owner
                }
                _ => return Err(FsError::Stale),
            },
        };
        crate::backing::may_use_dir(owner, by.asker(), want)?;
        Ok(())
    }

    /// Whether `by` may change the names of the BACKING directory `rel`: of the nearest
    /// directory above it that BACKING has (a key directory not made yet is its array's,
    /// which has its owner and mode).
    fn may_change_in(&self, rel: &Path, by: Caller) -> Result<(), FsError> {
        let mut dir = rel;
        let owner = loop {
            match self.backing.stat(dir)? {
                Some(meta) => break crate::backing::FileOwner::of(&meta),
                None => dir = dir.parent().ok_or(FsError::NotFound)?,
            }
        };
        crate::backing::may_change_dir(owner, by.asker())?;
        Ok(())
    }

    /// Holds `file` in memory at `rel`, noting the directory it is made in (`MemState::
    /// made_in`). Returns the file it replaces there.
    pub(crate) fn hold_file(&self, rel: &Path, file: &Arc<MemFile>) -> Option<Arc<MemFile>> {
        if let Some(made_in) = self.made_in(rel) {
            file.with(|s| s.made_in = Some(made_in));
        }
        self.temps.insert_file(rel, file.clone())
    }

    /// The directory a file held at `rel` counts as made in: its array's (the nearest
    /// directory above holding a `zarr.json`: key directories between come and go with
    /// their shards), else the nearest one BACKING has. With its device and inode.
    fn made_in(&self, rel: &Path) -> Option<(PathBuf, u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let mut nearest = None;
        for dir in rel.ancestors().skip(1) {
            let Ok(Some(m)) = self.backing.stat(dir) else {
                continue;
            };
            let here = (dir.to_path_buf(), m.dev(), m.ino());
            if matches!(self.backing.stat(&dir.join(METADATA_FILE)), Ok(Some(d)) if d.is_file()) {
                return Some(here);
            }
            nearest.get_or_insert(here);
        }
        nearest
    }

    /// Whether the directory `file` was made in is still at its path: a file held in
    /// memory is written there as root, and a directory put there since (renamed in by
    /// whoever may write the one above) is not where its maker could write.
    pub(crate) fn still_where_made(&self, file: &MemFile) -> Result<(), FsError> {
        let Some((dir, dev, ino)) = file.with(|s| s.made_in.clone()) else {
            return Ok(());
        };
        let now = self.backing.stat(&dir)?;
        let same = now.is_some_and(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino()) == (dev, ino)
        });
        if !same {
            warn!(dir = %self.backing.path(&dir).display(),
                "a file held in memory is not written: the directory it was made in was replaced since");
            return Err(FsError::Stale);
        }
        Ok(())
    }

    /// Does `change` in BACKING as `caller` (`backing::as_user`): what it makes is theirs
    /// from the start, so nothing is given away by name afterwards, and the kernel checks
    /// their permission on the directories really there.
    fn as_caller(
        &self,
        caller: Caller,
        make: impl FnOnce() -> io::Result<()>,
    ) -> Result<(), FsError> {
        crate::backing::as_user(caller.asker(), make)?;
        Ok(())
    }

    /// The writes of the control file: `flush` writes everything pending now, durably;
    /// `flush PATH` (relative to the mount's root) what lies below PATH; `give-up` makes
    /// the unmount that follows try the final flush once instead of retrying.
    pub fn control_command(&self, command: &str) -> Result<(), FsError> {
        let command = command.trim();
        if command == "give-up" {
            warn!("unmount asked to give up on what cannot be written");
            self.giving_up
                .store(true, std::sync::atomic::Ordering::SeqCst);
            crate::backing::lock::stop_waiting();
            return Ok(());
        }
        let below = match command.strip_prefix("flush") {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => {
                PathBuf::from(rest.trim().trim_matches('/'))
            }
            _ => {
                return Err(FsError::Invalid(format!(
                    "unknown control command {command:?}"
                )));
            }
        };
        let failed = self.flush_below_path(&below);
        if failed.is_empty() {
            return Ok(());
        }
        for f in &failed {
            warn!("not written: {f}");
        }
        Err(FsError::Failed(failed.join("; "), libc::EIO))
    }

    /// Whether `fh` is open on the control file.
    pub fn is_control(&self, fh: u64) -> bool {
        matches!(self.handles.get(fh).as_deref(), Ok(Handle::File(h))
            if matches!(self.inodes.get(h.ino).map(|i| i.kind), Some(NodeKind::Control)))
    }
}

fn translated_exchange(src_rel: &Path) -> FsError {
    FsError::refused(
        src_rel,
        Rule::ExchangeOfTranslatedNames,
        "RENAME_EXCHANGE with a chunk, a zarr.json, a key directory or a held file",
    )
}

/// The directory holding `rel` (BACKING's root for a name there).
fn parent_of(rel: &Path) -> &Path {
    rel.parent().unwrap_or(Path::new(""))
}

//! The filesystem core: what the mount shows and how requests are answered, with no
//! knowledge of FUSE. The adapter in `crate::fuse` turns kernel requests into calls here.

pub mod array;
pub mod attr;
pub mod classify;
pub mod error;
pub mod group;
pub mod handle;
pub mod inode;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::backing::{Backing, join_rel};
use crate::shard::read_chunk_part;
use crate::zarr::{KeyNode, METADATA_FILE};
use array::{ArrayState, ChunkData};
pub use attr::Attr;
use classify::{Classifier, DirClass};
pub use error::FsError;
use handle::{Handle, HandleTable, ListEntry, read_full_at};
use inode::InodeTable;
pub use inode::{FileType, Ino, NodeInfo, NodeKind, ROOT};

/// An opened file: its handle, and how the kernel should cache it.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    /// Keep the page cache from earlier opens (changes are invalidated explicitly, or seen
    /// through a changed mtime).
    pub keep_cache: bool,
    /// Bypass the page cache altogether.
    pub direct_io: bool,
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

/// The name of the control file in the mount's root. It is not listed; a BACKING file of
/// the same name is hidden by it.
pub const CONTROL_FILE: &str = ".shardfs-control";
const CONTROL_SIZE: usize = 4096;

/// What the control file tells about the daemon.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DaemonInfo {
    pub pid: u32,
    /// Where the daemon writes its verdict when it exits.
    pub status_file: PathBuf,
}

#[derive(Debug)]
pub struct ShardFs {
    backing: Backing,
    inodes: InodeTable,
    classifier: Classifier,
    handles: HandleTable,
    daemon: DaemonInfo,
}

impl ShardFs {
    pub fn new(backing: Backing, daemon: DaemonInfo) -> ShardFs {
        ShardFs {
            backing,
            inodes: InodeTable::new(),
            classifier: Classifier::default(),
            handles: HandleTable::default(),
            daemon,
        }
    }

    /// The control file's content: JSON padded with spaces to `CONTROL_SIZE`, so that its
    /// size never changes while the numbers in it do.
    fn control_json(&self) -> Bytes {
        let doc = serde_json::json!({
            "pid": self.daemon.pid,
            "status_file": self.daemon.status_file,
            "backing": self.backing.root(),
        });
        let mut text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        text.resize(CONTROL_SIZE.max(text.len() + 1), b' ');
        if let Some(last) = text.last_mut() {
            *last = b'\n';
        }
        Bytes::from(text)
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The inode as it is now. Directories and array nodes are re-read against their
    /// `zarr.json`, which may have been written or rewritten since the kernel looked them up.
    fn node(&self, ino: Ino) -> Result<NodeInfo, FsError> {
        let mut info = self.inodes.get(ino).ok_or(FsError::Stale)?;
        let refreshed = match &info.kind {
            NodeKind::Dir | NodeKind::ArrayDir(_) => {
                match self.classifier.classify(&self.backing, &info.rel)? {
                    DirClass::ShardedArray(a) => Some(NodeKind::ArrayDir(a)),
                    _ => Some(NodeKind::Dir),
                }
            }
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
        match self.classifier.classify(&self.backing, &array.rel)? {
            DirClass::ShardedArray(now) if Arc::ptr_eq(&now, array) => Ok(None),
            DirClass::ShardedArray(now) => Ok(Some(now)),
            _ => Err(FsError::NotFound),
        }
    }

    /// What `name` in directory `parent` is.
    fn resolve(&self, parent: &NodeInfo, name: &OsStr) -> Result<NodeKind, FsError> {
        let rel = join_rel(&parent.rel, name);
        if parent.ino == ROOT && name == CONTROL_FILE {
            return Ok(NodeKind::Control);
        }
        match &parent.kind {
            NodeKind::Dir => self.resolve_backing(&parent.rel, &rel, name, true),
            NodeKind::ArrayDir(array) if name == METADATA_FILE => {
                Ok(NodeKind::ArrayMeta(array.clone()))
            }
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
        let child = name.to_str().and_then(|n| {
            array
                .layout
                .key_encoding
                .child(parent, n, array.layout.ndim())
        });
        match child {
            // Not part of the key tree: whatever else BACKING holds there, as it is.
            None => self.resolve_backing(Path::new(""), rel, name, false),
            Some(KeyNode::Chunk(coords)) => match array.chunk(&self.backing, &coords)? {
                ChunkData::Absent => Err(FsError::NotFound),
                ChunkData::Stored { .. } | ChunkData::Damaged { .. } => Ok(NodeKind::Chunk {
                    array: array.clone(),
                    coords,
                }),
            },
            Some(node) if array.has_chunks_below(&self.backing, &node)? => Ok(NodeKind::ChunkDir {
                array: array.clone(),
                node,
            }),
            Some(_) => Err(FsError::NotFound),
        }
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
            match classify.then(|| self.classifier.classify(&self.backing, rel)) {
                Some(Ok(DirClass::ShardedArray(a))) => NodeKind::ArrayDir(a),
                Some(Err(e)) => return Err(e),
                _ => NodeKind::Dir,
            }
        } else if ft.is_file() {
            if classify && name == METADATA_FILE {
                match self.classifier.classify(&self.backing, parent_rel)? {
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

    fn attr(&self, ino: Ino, rel: &Path, kind: &NodeKind) -> Result<Attr, FsError> {
        let backing_attr = |rel: &Path| -> Result<Attr, FsError> {
            let m = self.backing.stat(rel)?.ok_or(FsError::NotFound)?;
            Ok(Attr::from_backing(ino, &m))
        };
        let owner = |array: &ArrayState| -> Result<std::fs::Metadata, FsError> {
            self.backing.stat(&array.rel)?.ok_or(FsError::NotFound)
        };
        match kind {
            NodeKind::Dir
            | NodeKind::File
            | NodeKind::Symlink
            | NodeKind::Other
            | NodeKind::ArrayDir(_) => backing_attr(rel),
            NodeKind::ArrayMeta(array) => {
                let m = self.backing.stat(rel)?.ok_or(FsError::NotFound)?;
                Ok(Attr {
                    size: array.view_json.len() as u64,
                    ..Attr::from_backing(ino, &m)
                })
            }
            NodeKind::GroupMeta(group) => {
                let m = self.backing.stat(rel)?.ok_or(FsError::NotFound)?;
                Ok(Attr {
                    size: group.json.len() as u64,
                    ..Attr::from_backing(ino, &m)
                })
            }
            NodeKind::ChunkDir { array, .. } => Ok(Attr::virtual_dir(ino, &owner(array)?)),
            NodeKind::Control => {
                let root = self.backing.stat(Path::new(""))?.ok_or(FsError::NotFound)?;
                Ok(Attr {
                    perm: 0o644,
                    volatile: true,
                    ..Attr::virtual_file(
                        ino,
                        &root,
                        self.control_json().len() as u64,
                        std::time::SystemTime::now(),
                    )
                })
            }
            NodeKind::Chunk { array, coords } => match array.chunk(&self.backing, coords)? {
                ChunkData::Absent => Err(FsError::NotFound),
                ChunkData::Stored { range, mtime, .. } => {
                    Ok(Attr::virtual_file(ino, &owner(array)?, range.nbytes, mtime))
                }
                // Its size is unknown: shown empty; opening it fails with EIO.
                ChunkData::Damaged { mtime, .. } => {
                    Ok(Attr::virtual_file(ino, &owner(array)?, 0, mtime))
                }
            },
        }
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let parent = self.node(parent)?;
        let kind = self.resolve(&parent, name)?;
        let rel = join_rel(&parent.rel, name);
        let attr = self.attr(0, &rel, &kind)?;
        let ino = self.inodes.lookup(parent.ino, name, kind);
        Ok(Attr { ino, ..attr })
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
        let info = self.node(ino)?;
        self.attr(ino, &info.rel, &info.kind)
    }

    pub fn readlink(&self, ino: Ino) -> Result<PathBuf, FsError> {
        let info = self.node(ino)?;
        match info.kind {
            NodeKind::Symlink => Ok(self.backing.read_link(&info.rel)?),
            _ => Err(FsError::Invalid("not a symbolic link".into())),
        }
    }

    /// Opens a directory: its listing is taken now and served from this snapshot.
    pub fn opendir(&self, ino: Ino) -> Result<u64, FsError> {
        let info = self.node(ino)?;
        let mut entries = vec![
            ListEntry::new(".", FileType::Dir),
            ListEntry::new("..", FileType::Dir),
        ];
        match &info.kind {
            NodeKind::Dir => entries.extend(self.backing_listing(&info.rel, |_| true)?),
            NodeKind::ArrayDir(array) => {
                entries.push(ListEntry::new(METADATA_FILE, FileType::File));
                entries.extend(self.key_listing(array, &KeyNode::Root)?);
                entries.extend(self.backing_listing(&info.rel, |name| {
                    name != METADATA_FILE && !is_key_name(array, &KeyNode::Root, name)
                })?);
            }
            NodeKind::ChunkDir { array, node } => {
                entries.extend(self.key_listing(array, node)?);
                entries.extend(
                    self.backing_listing(&info.rel, |name| !is_key_name(array, node, name))?,
                );
            }
            _ => return Err(FsError::NotDir),
        }
        Ok(self.handles.insert(Handle::Dir(Arc::new(entries))))
    }

    fn key_listing(&self, array: &ArrayState, node: &KeyNode) -> Result<Vec<ListEntry>, FsError> {
        Ok(array
            .list(&self.backing, node)?
            .into_iter()
            .map(|e| {
                let ft = match e.node {
                    KeyNode::Chunk(_) => FileType::File,
                    _ => FileType::Dir,
                };
                ListEntry::new(&e.name, ft)
            })
            .collect())
    }

    fn backing_listing(
        &self,
        rel: &Path,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<ListEntry>, FsError> {
        let mut out: Vec<ListEntry> = self
            .backing
            .list(rel)?
            .into_iter()
            .filter(|e| e.name.to_str().is_none_or(&keep))
            .map(|e| ListEntry {
                name: e.name,
                kind: if e.is_dir {
                    FileType::Dir
                } else {
                    FileType::File
                },
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The snapshot entries of an open directory from `offset` on.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<ListEntry>>, FsError> {
        match self.handles.get(fh)?.as_ref() {
            Handle::Dir(entries) if (offset as usize) <= entries.len() => Ok(entries.clone()),
            Handle::Dir(_) => Ok(Arc::new(Vec::new())),
            _ => Err(FsError::NotDir),
        }
    }

    /// The inode number a name currently has, if the kernel holds it (for `readdir`).
    pub fn known_ino(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.inodes.peek(parent, name)
    }

    /// Forgets an open file or directory.
    pub fn release(&self, fh: u64) {
        self.handles.remove(fh);
    }

    /// Opens a file for reading. Stored chunks are pinned to the shard file as it is now: a
    /// later rewrite replaces the shard by rename, so this handle keeps reading whole data.
    pub fn open(&self, ino: Ino) -> Result<Opened, FsError> {
        let info = self.node(ino)?;
        let handle = match &info.kind {
            NodeKind::File => Handle::Backing(self.backing.open(&info.rel)?),
            NodeKind::ArrayMeta(array) => Handle::Bytes(array.view_json.clone()),
            NodeKind::GroupMeta(group) => Handle::Bytes(group.json.clone()),
            NodeKind::Control => Handle::Bytes(self.control_json()),
            NodeKind::Chunk { array, coords } => match array.chunk(&self.backing, coords)? {
                ChunkData::Absent => return Err(FsError::NotFound),
                ChunkData::Stored { file, range, .. } => Handle::Chunk { file, range },
                ChunkData::Damaged { path, reason, .. } => {
                    return Err(FsError::DamagedShard { path, reason });
                }
            },
            NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. } => {
                return Err(FsError::IsDir);
            }
            NodeKind::Symlink | NodeKind::Other => {
                return Err(FsError::Unsupported("opening a special file"));
            }
        };
        // The control file's numbers change under a fixed size: never cache its pages.
        let volatile = matches!(info.kind, NodeKind::Control);
        Ok(Opened {
            fh: self.handles.insert(handle),
            keep_cache: !volatile,
            direct_io: volatile,
        })
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let handle = self.handles.get(fh)?;
        let size = size as u64;
        match handle.as_ref() {
            Handle::Chunk { file, range } => {
                Ok(Bytes::from(read_chunk_part(file, *range, offset, size)?))
            }
            Handle::Bytes(b) => {
                let start = (offset as usize).min(b.len());
                let end = (start + size as usize).min(b.len());
                Ok(b.slice(start..end))
            }
            Handle::Backing(file) => Ok(Bytes::from(read_full_at(file, offset, size)?)),
            Handle::Dir(_) => Err(FsError::IsDir),
        }
    }

    pub fn statfs(&self) -> Result<StatFs, FsError> {
        let path = std::ffi::CString::new(self.backing.root().as_os_str().as_encoded_bytes())
            .map_err(|_| FsError::Invalid("backing path has a NUL byte".into()))?;
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a valid C string and `s` a properly sized out-parameter.
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
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
}

/// Whether `name` inside `node` belongs to the key tree, where BACKING's own entries (shard
/// files and their directories) are hidden.
fn is_key_name(array: &ArrayState, node: &KeyNode, name: &str) -> bool {
    array
        .layout
        .key_encoding
        .child(node, name, array.layout.ndim())
        .is_some()
}

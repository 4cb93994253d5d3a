//! Directories: opening one, its listing (BACKING's entries, the key tree's from the shard
//! indexes, files held in memory), and READDIRPLUS's lookup of each listed name, answered
//! for chunks from the listing's indexes rather than by a lookup each.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::CONTROL_FILE;
use super::ShardFs;
use crate::core::array::{ArrayName, ArrayState};
use crate::core::error::FsError;
use crate::core::view::attr::Attr;
use crate::core::view::handle::{DirHandle, Handle, ListEntry};
use crate::core::view::inode::{FileType, Ino, NodeInfo, NodeKind, ROOT};
use crate::zarr::{KeyNode, METADATA_FILE};

impl ShardFs {
    /// Opens a directory: its listing is taken now and served from this snapshot.
    pub fn opendir(&self, ino: Ino) -> Result<u64, FsError> {
        let info = self.node(ino)?;
        if !matches!(
            info.kind,
            NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. }
        ) {
            return Err(FsError::NotDir);
        }
        Ok(self.handles.insert(Handle::Dir(DirHandle {
            ino,
            listing: std::sync::OnceLock::new(),
        })))
    }

    /// The listing of directory `ino` as it is now.
    fn listing(&self, ino: Ino) -> Result<Vec<ListEntry>, FsError> {
        let info = self.node(ino)?;
        let mut entries = vec![
            ListEntry::new(".", FileType::Dir),
            ListEntry::new("..", FileType::Dir),
        ];
        let hide_control = |name: &str| {
            !(ino == ROOT && (name == CONTROL_FILE || name == crate::core::PRIVATE_DIR))
        };
        match &info.kind {
            NodeKind::Dir => {
                entries.extend(self.backing_listing(&info.rel, |n| hide_control(n))?);
            }
            NodeKind::ArrayDir(array) => {
                entries.extend(self.key_listing(array, &KeyNode::Root, &info.rel)?);
                entries.extend(self.backing_listing(&info.rel, |name| {
                    hide_control(name)
                        && array.classify_name(&KeyNode::Root, name) == ArrayName::Other
                })?);
                // Last: tools that remove a tree in listing order (shutil.rmtree) then take
                // the chunks out while the directory is still an array.
                entries.push(ListEntry::new(METADATA_FILE, FileType::File));
            }
            NodeKind::ChunkDir { array, node } => {
                entries.extend(self.key_listing(array, node, &info.rel)?);
                entries.extend(self.backing_listing(&info.rel, |name| {
                    array.classify_name(node, name) == ArrayName::Other
                })?);
            }
            _ => return Err(FsError::NotDir),
        }
        // Files held in memory, not shadowing anything already listed.
        for (name, _) in self.temps.files_in(&info.rel) {
            if !entries.iter().any(|e| e.name == name.as_str()) {
                entries.push(ListEntry::new(&name, FileType::File));
            }
        }
        Ok(entries)
    }

    fn key_listing(
        &self,
        array: &Arc<ArrayState>,
        node: &KeyNode,
        rel: &Path,
    ) -> Result<Vec<ListEntry>, FsError> {
        let mut out: Vec<ListEntry> = self
            .shards
            .list(&self.backing, array, node)?
            .into_iter()
            .map(|e| {
                let ft = match e.node {
                    KeyNode::Chunk(_) => FileType::File,
                    _ => FileType::Dir,
                };
                ListEntry::new(&e.name, ft)
            })
            .collect();
        let mut shown: std::collections::HashSet<String> = out
            .iter()
            .filter_map(|e| e.name.to_str().map(str::to_string))
            .collect();
        for name in self.unstored_key_dirs(array, node, rel, &shown)? {
            if matches!(
                array.classify_name(node, &name),
                ArrayName::Key(KeyNode::Dir(_))
            ) && !shown.contains(&name)
            {
                out.push(ListEntry::new(&name, FileType::Dir));
                shown.insert(name);
            }
        }
        Ok(out)
    }

    /// Names below key directory `rel` that may be key directories no shard shows (not in
    /// `shown`): made with mkdir, holding only files in memory, or holding files of
    /// BACKING that are not part of the key tree. Checked by the caller.
    fn unstored_key_dirs(
        &self,
        array: &Arc<ArrayState>,
        node: &KeyNode,
        rel: &Path,
        shown: &std::collections::HashSet<String>,
    ) -> Result<Vec<String>, FsError> {
        let with_extras: Vec<String> = self
            .backing
            .list(rel)?
            .into_iter()
            .filter(|e| e.kind.is_dir())
            .filter_map(|e| e.name.into_string().ok())
            // Entries already shown need no look inside (that look walks their subtree).
            .filter(|name| !shown.contains(name.as_str()))
            .filter(|name| {
                let child = rel.join(name);
                match array.classify_name(node, name) {
                    ArrayName::Key(child_node @ KeyNode::Dir(_)) => {
                        self.has_extras(array, &child_node, &child).unwrap_or(false)
                    }
                    _ => false,
                }
            })
            .collect();
        let held = self.temps.all_files().into_iter().filter_map(|(p, _)| {
            let sub = p.strip_prefix(rel).ok()?;
            let mut parts = sub.components();
            let first = parts.next()?;
            parts.next()?;
            first.as_os_str().to_str().map(str::to_string)
        });
        Ok(self
            .temps
            .dirs_in(rel)
            .into_iter()
            .chain(with_extras)
            .chain(held)
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
                kind: e.kind,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The snapshot entries of an open directory.
    pub fn readdir(&self, fh: u64) -> Result<Arc<Vec<ListEntry>>, FsError> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir(dir) = handle.as_ref() else {
            return Err(FsError::NotDir);
        };
        if let Some(listing) = dir.listing.get() {
            return Ok(listing.clone());
        }
        let listing = Arc::new(self.listing(dir.ino)?);
        Ok(dir.listing.get_or_init(|| listing).clone())
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.remove(fh);
    }

    /// The inode number a name currently has, if the kernel holds it (for `readdir`).
    pub fn known_ino(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.inodes.peek(parent, name)
    }

    /// Looks up the names of a listing of directory `dir` (READDIRPLUS), the directory
    /// resolved once for all of them.
    pub fn lister(&self, dir: Ino) -> Result<Lister<'_>, FsError> {
        Ok(Lister {
            fs: self,
            dir: self.node(dir)?,
            owner: OnceLock::new(),
        })
    }
}

/// READDIRPLUS's lookups in one directory. A chunk's entry is answered from its shard's
/// index, as the listing just read it (`ShardRegistry::chunk_shown`), with its array
/// directory's owner looked at once: a lookup each opened the shard twice and looked at
/// the directory and the array's document (find: 44 us per chunk). Any other name is
/// looked up as the kernel would.
pub struct Lister<'a> {
    fs: &'a ShardFs,
    dir: NodeInfo,
    owner: OnceLock<std::fs::Metadata>,
}

impl Lister<'_> {
    pub fn lookup(&self, name: &OsStr) -> Result<Attr, FsError> {
        let Some((array, coords)) = self.chunk_named(name) else {
            return self.fs.lookup(self.dir.ino, name);
        };
        let owner = match self.owner.get() {
            Some(m) => m,
            None => {
                let m = self.fs.owner_of(&array.rel)?;
                self.owner.get_or_init(|| m)
            }
        };
        let attr = self.fs.chunk_attr_owned(0, &array, &coords, owner)?;
        let kind = NodeKind::Chunk { array, coords };
        let ino = self.fs.inodes.lookup(self.dir.ino, name, kind, None);
        Ok(Attr { ino, ..attr })
    }

    /// The chunk `name` is in this directory, unless a file held in memory has its name.
    fn chunk_named(&self, name: &OsStr) -> Option<(Arc<ArrayState>, Vec<u64>)> {
        let (array, node) = match &self.dir.kind {
            NodeKind::ArrayDir(a) => (a, &KeyNode::Root),
            NodeKind::ChunkDir { array, node } => (array, node),
            _ => return None,
        };
        let ArrayName::Key(KeyNode::Chunk(coords)) = array.classify_name(node, name.to_str()?)
        else {
            return None;
        };
        let rel = crate::backing::join_rel(&self.dir.rel, name);
        if self.dir.detached || self.fs.temps.file(&rel).is_some() {
            return None;
        }
        Some((array.clone(), coords))
    }
}

//! The inode table. An inode is a name in a directory (which can move) plus what it is; its
//! number stays the same while the kernel holds it, because tools compare them (Python's
//! `shutil.rmtree` checks that `lstat` and `fstat` of a directory agree).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::array::ArrayState;
use crate::core::group::GroupView;
use crate::core::pending::memfile::MemFile;
use crate::sync::lock;
use crate::zarr::KeyNode;

pub type Ino = u64;
pub const ROOT: Ino = 1;
/// The parent of inodes whose name is gone (unlinked or renamed over while open).
const DETACHED: Ino = 0;

/// What a file is: the same kinds BACKING lists.
pub use crate::backing::EntryKind as FileType;

/// What a name in the mount is.
#[derive(Clone, Debug)]
pub enum NodeKind {
    /// A directory of BACKING, shown as it is.
    Dir,
    /// A regular file of BACKING, shown as it is.
    File,
    Symlink,
    /// FIFOs, sockets, devices: shown with their attributes, nothing more.
    Other,
    /// The directory of a sharded array shown unsharded.
    ArrayDir(Arc<ArrayState>),
    /// The translated `zarr.json` of a sharded array.
    ArrayMeta(Arc<ArrayState>),
    /// A group `zarr.json` whose consolidated metadata is translated.
    GroupMeta(Arc<GroupView>),
    /// A directory of chunk keys (`c`, `c/4`, ...).
    ChunkDir {
        array: Arc<ArrayState>,
        node: KeyNode,
    },
    /// One inner chunk, as a file.
    Chunk {
        array: Arc<ArrayState>,
        coords: Vec<u64>,
    },
    /// A file held in memory: a temporary file inside an array, a `zarr.json` being
    /// written, or a chunk file unlinked while open.
    Temp(Arc<MemFile>),
    /// The mount's control file in the root (not listed): reading it gives the daemon's
    /// state as JSON; writing `flush` to it writes everything pending.
    Control,
}

impl NodeKind {
    pub fn file_type(&self) -> FileType {
        match self {
            NodeKind::Dir | NodeKind::ArrayDir(_) | NodeKind::ChunkDir { .. } => FileType::Dir,
            NodeKind::File
            | NodeKind::ArrayMeta(_)
            | NodeKind::GroupMeta(_)
            | NodeKind::Chunk { .. }
            | NodeKind::Temp(_)
            | NodeKind::Control => FileType::File,
            NodeKind::Symlink => FileType::Symlink,
            NodeKind::Other => FileType::Other,
        }
    }
}

#[derive(Debug)]
struct Inode {
    /// Its names, the first one the one its path is built from. A BACKING file with
    /// several hard links has several; a file unlinked while open has none (detached).
    names: Vec<(Ino, OsString)>,
    /// The last name it had, kept for messages once it has none.
    last_name: OsString,
    kind: NodeKind,
    lookups: u64,
    /// The table's generation when `kind` was decided.
    generation: u64,
    /// The BACKING file it is (device, inode), for regular files: its hard links are
    /// names of this one inode.
    source: Option<(u64, u64)>,
    /// What the kernel may hold of its content (`InodeTable::serve`).
    content: Content,
}

/// Which version of an inode's content the kernel was last given, and how often it was
/// changed through the mount: the kernel keeps an inode's pages from one open to the next
/// (and open handles pin the version they read) only while no one else changed it.
#[derive(Debug, Default)]
struct Content {
    served: Option<Arc<str>>,
    changes: u64,
}

#[derive(Debug)]
struct Inner {
    nodes: HashMap<Ino, Inode>,
    by_name: HashMap<(Ino, OsString), Ino>,
    by_source: HashMap<(u64, u64), Ino>,
    next: Ino,
}

#[derive(Debug)]
pub struct InodeTable {
    inner: Mutex<Inner>,
    /// Bumped whenever names may have changed what they are without the kernel asking
    /// (a directory became an array, or stopped being one): kinds decided before are
    /// decided again.
    generation: AtomicU64,
}

/// An inode as seen at one moment: where it is and what it is.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub ino: Ino,
    /// Path relative to the mount root (and to the backing root: they coincide).
    pub rel: PathBuf,
    pub kind: NodeKind,
    pub detached: bool,
    pub parent: Ino,
    pub name: OsString,
    /// Whether `kind` was decided before the last generation bump.
    pub outdated: bool,
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl Inner {
    /// Removes the name `(parent, name)` from `ino`; with its last name gone the inode is
    /// detached, and is no longer where its BACKING file is found.
    fn unname(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.names.retain(|(p, n)| !(*p == parent && n == name));
        if node.names.is_empty()
            && let Some(src) = node.source.take()
            && self.by_source.get(&src) == Some(&ino)
        {
            self.by_source.remove(&src);
        }
    }
}

impl InodeTable {
    pub fn new() -> InodeTable {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Inode {
                names: vec![(ROOT, OsString::new())],
                last_name: OsString::new(),
                kind: NodeKind::Dir,
                lookups: 1,
                generation: 0,
                source: None,
                content: Content::default(),
            },
        );
        InodeTable {
            inner: Mutex::new(Inner {
                nodes,
                by_name: HashMap::new(),
                by_source: HashMap::new(),
                next: ROOT + 1,
            }),
            generation: AtomicU64::new(0),
        }
    }

    /// An open of `ino` gives the kernel `version` of its content: whether that differs
    /// from the version the last open gave (its cached pages are then another version's,
    /// to be dropped).
    pub fn serve(&self, ino: Ino, version: Arc<str>) -> bool {
        let mut inner = lock(&self.inner);
        let Some(node) = inner.nodes.get_mut(&ino) else {
            return true;
        };
        let before = node.content.served.replace(version.clone());
        before.is_some_and(|b| b != version)
    }

    /// `ino`'s content was changed through the mount (a write, a truncation).
    pub fn changed_here(&self, ino: Ino) {
        if let Some(node) = lock(&self.inner).nodes.get_mut(&ino) {
            node.content.changes += 1;
        }
    }

    /// How often `ino`'s content was changed through the mount.
    pub fn changes_here(&self, ino: Ino) -> u64 {
        lock(&self.inner)
            .nodes
            .get(&ino)
            .map_or(0, |n| n.content.changes)
    }

    /// The inode as it is now. A nameless (detached) inode has an empty path.
    pub fn get(&self, ino: Ino) -> Option<NodeInfo> {
        let inner = lock(&self.inner);
        let node = inner.nodes.get(&ino)?;
        let (parent, name) = match node.names.first() {
            Some((p, n)) => (*p, n.clone()),
            None => (DETACHED, node.last_name.clone()),
        };
        Some(NodeInfo {
            ino,
            rel: path_of(&inner, ino).unwrap_or_default(),
            kind: node.kind.clone(),
            detached: parent == DETACHED,
            parent,
            name,
            outdated: node.generation != self.generation.load(Ordering::Relaxed),
        })
    }

    /// Records one kernel lookup of `name` in `parent`, which is `kind`. The inode of that
    /// name is reused when it is still the same type of file; a BACKING file already known
    /// by another name (`source`: a hard link) gets that name's inode.
    pub fn lookup(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: NodeKind,
        source: Option<(u64, u64)>,
    ) -> Ino {
        let generation = self.generation.load(Ordering::Relaxed);
        let mut inner = lock(&self.inner);
        let key = (parent, name.to_os_string());
        if let Some(&ino) = inner.by_name.get(&key)
            && let Some(node) = inner.nodes.get_mut(&ino)
            && node.kind.file_type() == kind.file_type()
        {
            node.kind = kind;
            node.lookups += 1;
            node.generation = generation;
            return ino;
        }
        if let Some(src) = source
            && let Some(&ino) = inner.by_source.get(&src)
            && let Some(node) = inner.nodes.get_mut(&ino)
            && node.kind.file_type() == kind.file_type()
            && matches!(kind, NodeKind::File | NodeKind::Symlink | NodeKind::Other)
        {
            node.lookups += 1;
            node.names.push(key.clone());
            inner.by_name.insert(key, ino);
            return ino;
        }
        let ino = inner.next;
        inner.next += 1;
        inner.nodes.insert(
            ino,
            Inode {
                names: vec![key.clone()],
                last_name: name.to_os_string(),
                kind,
                lookups: 1,
                generation,
                source,
                content: Content::default(),
            },
        );
        if let Some(old) = inner.by_name.insert(key, ino) {
            inner.unname(old, parent, name);
        }
        if let Some(src) = source {
            inner.by_source.insert(src, ino);
        }
        ino
    }

    /// Forgets that `source` is known by `ino` (the mapping proved stale: the BACKING file
    /// behind it was replaced outside the mount).
    pub fn drop_source(&self, source: (u64, u64)) {
        lock(&self.inner).by_source.remove(&source);
    }

    /// The inode known for BACKING file `source`, if any.
    pub fn by_source(&self, source: (u64, u64)) -> Option<Ino> {
        lock(&self.inner).by_source.get(&source).copied()
    }

    /// Replaces what `ino` is, keeping its name.
    pub fn set_kind(&self, ino: Ino, kind: NodeKind) {
        let generation = self.generation.load(Ordering::Relaxed);
        if let Some(node) = lock(&self.inner).nodes.get_mut(&ino) {
            node.kind = kind;
            node.generation = generation;
        }
    }

    /// Makes every kind decided so far be decided again when next used.
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Turns every inode that refers to the in-memory `file` into `kind` (the file moved to
    /// BACKING or into a chunk).
    /// Returns the inodes changed.
    pub fn rekind_file(&self, file: &Arc<MemFile>, kind: NodeKind) -> Vec<Ino> {
        let mut changed = Vec::new();
        for (ino, node) in lock(&self.inner).nodes.iter_mut() {
            if matches!(&node.kind, NodeKind::Temp(f) if Arc::ptr_eq(f, file)) {
                node.kind = kind.clone();
                changed.push(*ino);
            }
        }
        changed
    }

    /// The name `name` in `parent` no longer refers to its inode (the file was unlinked or
    /// replaced). An inode left without names lives on until the kernel forgets it; `kind`
    /// is what it is from then on. Returns the inode, if there was one.
    pub fn detach(&self, parent: Ino, name: &OsStr, kind: Option<NodeKind>) -> Option<Ino> {
        let mut inner = lock(&self.inner);
        let ino = inner.by_name.remove(&(parent, name.to_os_string()))?;
        inner.unname(ino, parent, name);
        if let Some(node) = inner.nodes.get_mut(&ino)
            && node.names.is_empty()
            && let Some(kind) = kind
        {
            node.kind = kind;
        }
        Some(ino)
    }

    /// Moves the name `from` of `ino` to `to`, with what it is now, detaching whatever had
    /// that name.
    pub fn rename(&self, ino: Ino, from: (Ino, &OsStr), to: (Ino, &OsStr), kind: NodeKind) {
        let mut inner = lock(&self.inner);
        let key = (to.0, to.1.to_os_string());
        if let Some(old) = inner.by_name.remove(&key)
            && old != ino
        {
            inner.unname(old, to.0, to.1);
        }
        let old_key = (from.0, from.1.to_os_string());
        if inner.by_name.get(&old_key) == Some(&ino) {
            inner.by_name.remove(&old_key);
        }
        let generation = self.generation.load(Ordering::Relaxed);
        let Some(node) = inner.nodes.get_mut(&ino) else {
            return;
        };
        node.names.retain(|n| *n != old_key && *n != key);
        node.names.insert(0, key.clone());
        node.last_name = to.1.to_os_string();
        node.kind = kind;
        node.generation = generation;
        inner.by_name.insert(key, ino);
    }

    /// The names `a` and `b` swap what they name (RENAME_EXCHANGE), as the kernel swaps
    /// its entries: each inode keeps its number under the other's name. Its kind is decided
    /// again after the next generation bump.
    pub fn exchange(&self, a: (Ino, &OsStr), b: (Ino, &OsStr)) {
        let mut inner = lock(&self.inner);
        let (ka, kb) = ((a.0, a.1.to_os_string()), (b.0, b.1.to_os_string()));
        let (ia, ib) = (inner.by_name.remove(&ka), inner.by_name.remove(&kb));
        for (ino, old, new) in [(ia, &ka, &kb), (ib, &kb, &ka)] {
            let Some(ino) = ino else {
                continue;
            };
            if let Some(node) = inner.nodes.get_mut(&ino) {
                node.names.retain(|n| n != old);
                node.names.insert(0, new.clone());
                node.last_name = new.1.clone();
            }
            inner.by_name.insert(new.clone(), ino);
        }
    }

    /// Replaces what the root is (it may itself be an array directory).
    pub fn set_root_kind(&self, kind: NodeKind) {
        if let Some(root) = lock(&self.inner).nodes.get_mut(&ROOT) {
            root.kind = kind;
        }
    }

    /// The kernel dropped `n` lookups of `ino`; at zero the inode is gone (and `true` is
    /// returned).
    pub fn forget(&self, ino: Ino, n: u64) -> bool {
        if ino == ROOT {
            return false;
        }
        let mut inner = lock(&self.inner);
        let Some(node) = inner.nodes.get_mut(&ino) else {
            return false;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return false;
        }
        let Some(node) = inner.nodes.remove(&ino) else {
            return false;
        };
        for key in node.names {
            if inner.by_name.get(&key) == Some(&ino) {
                inner.by_name.remove(&key);
            }
        }
        if let Some(src) = node.source
            && inner.by_source.get(&src) == Some(&ino)
        {
            inner.by_source.remove(&src);
        }
        true
    }

    /// The inode `name` in `parent` has now, without counting a lookup.
    pub fn peek(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        lock(&self.inner)
            .by_name
            .get(&(parent, name.to_os_string()))
            .copied()
    }
}

fn path_of(inner: &Inner, mut ino: Ino) -> Option<PathBuf> {
    let mut names = Vec::new();
    while ino != ROOT {
        let node = inner.nodes.get(&ino)?;
        let (parent, name) = node.names.first()?;
        names.push(name.as_os_str());
        ino = *parent;
    }
    Some(names.iter().rev().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_are_stable_while_held_and_paths_follow_parents() {
        let t = InodeTable::new();
        let a = t.lookup(ROOT, OsStr::new("a"), NodeKind::Dir, None);
        let b = t.lookup(a, OsStr::new("b"), NodeKind::File, None);
        assert_eq!(t.lookup(ROOT, OsStr::new("a"), NodeKind::Dir, None), a);
        assert_eq!(t.get(b).unwrap().rel, PathBuf::from("a/b"));
        assert_eq!(t.get(ROOT).unwrap().rel, PathBuf::new());
        // Two lookups of `a`: one forget leaves it.
        t.forget(a, 1);
        assert!(t.get(a).is_some());
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        // A new lookup after the kernel forgot it may get a new number, never an old one.
        let a2 = t.lookup(ROOT, OsStr::new("a"), NodeKind::Dir, None);
        assert!(a2 > b);
    }

    #[test]
    fn a_name_that_changes_type_gets_a_new_inode() {
        let t = InodeTable::new();
        let x = t.lookup(ROOT, OsStr::new("x"), NodeKind::File, None);
        let y = t.lookup(ROOT, OsStr::new("x"), NodeKind::Dir, None);
        assert_ne!(x, y);
        // The old one lives until forgotten, and forgetting it leaves the new one reachable.
        t.forget(x, 1);
        assert_eq!(t.lookup(ROOT, OsStr::new("x"), NodeKind::Dir, None), y);
    }
}

#[cfg(test)]
mod link_tests {
    use super::*;

    #[test]
    fn hard_links_share_an_inode_until_their_last_name_goes() {
        let t = InodeTable::new();
        let src = Some((1, 42));
        let a = t.lookup(ROOT, OsStr::new("a"), NodeKind::File, src);
        let b = t.lookup(ROOT, OsStr::new("b"), NodeKind::File, src);
        assert_eq!(a, b);
        assert_eq!(t.get(a).unwrap().rel, PathBuf::from("a"));
        // The first name goes: the path follows the other one.
        t.detach(ROOT, OsStr::new("a"), None);
        assert_eq!(t.get(a).unwrap().rel, PathBuf::from("b"));
        assert!(!t.get(a).unwrap().detached);
        t.rename(
            a,
            (ROOT, OsStr::new("b")),
            (ROOT, OsStr::new("c")),
            NodeKind::File,
        );
        assert_eq!(t.get(a).unwrap().rel, PathBuf::from("c"));
        t.detach(ROOT, OsStr::new("c"), None);
        assert!(t.get(a).unwrap().detached);
        // A new file that reuses the BACKING inode number is a new inode.
        let d = t.lookup(ROOT, OsStr::new("d"), NodeKind::File, src);
        assert_ne!(d, a);
    }
}

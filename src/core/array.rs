//! A sharded array as the mount shows it: its metadata, layout and translated `zarr.json`,
//! and where its shard files are. Immutable: a rewritten `zarr.json` makes a new one.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;

use crate::backing::{FileVersion, join_rel};
use crate::core::error::FsError;
use crate::grid;
use crate::store::Store;
use crate::zarr::{ArrayMetadata, KeyNode, METADATA_FILE, Separator, ShardLayout};
use std::io;

#[derive(Clone, Debug)]
pub struct ArrayState {
    /// The array directory, relative to the backing root (the same path in the view).
    pub rel: PathBuf,
    pub meta: ArrayMetadata,
    pub layout: ShardLayout,
    /// How its chunks are stored when the mount compresses them (`zarr::transparent`):
    /// compressed where they enter a journal record or a shard, decompressed where they
    /// leave one, shown as written.
    pub zstd: Option<crate::zarr::transparent::Zstd>,
    /// The unsharded view of `meta` the writer wrote (`zarr::shown_view`), as served for
    /// `zarr.json`.
    pub view_json: Bytes,
    pub meta_version: FileVersion,
    pub meta_mtime: SystemTime,
    /// Which directory held the array when its `zarr.json` was read
    /// (`Backing::dir_instance`), as journal records name it.
    pub instance: String,
    /// That directory itself: another mount may remove it and make another at its path,
    /// or move it, while this one holds chunks of it (`shards::whereabouts`).
    pub dir: Option<std::sync::Arc<crate::backing::HeldDir>>,
    /// That directory's device and inode, known also when it could not be held (past
    /// `held::MOST_HELD`): the directory its shards must land in (`lock::Within`).
    pub dir_id: Option<(u64, u64)>,
}

/// An entry of a directory of the chunk-key tree.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyEntry {
    pub name: String,
    pub node: KeyNode,
}

impl ArrayState {
    /// The same array, found at `rel` (another mount moved its directory there).
    pub fn moved_to(&self, rel: PathBuf) -> ArrayState {
        ArrayState {
            rel,
            ..self.clone()
        }
    }

    /// Whether `other` was read in the same directory as this one (not one made anew at
    /// its path).
    pub fn same_directory(&self, other: &ArrayState) -> bool {
        match (&self.dir, &other.dir, self.dir_id, other.dir_id) {
            // One hold of the directory: no look needed (asked for every chunk a listing
            // shows, under the registry's lock; two fstats each were 10% of a `find`).
            (Some(a), Some(b), _, _) if std::sync::Arc::ptr_eq(a, b) => true,
            (Some(a), Some(b), _, _) => a.id() == b.id(),
            (_, _, Some(a), Some(b)) => a == b,
            _ => self.instance == other.instance,
        }
    }

    /// The shard file's path relative to the backing root.
    pub fn shard_rel(&self, shard: &[u64]) -> PathBuf {
        self.rel.join(self.layout.key_encoding.encode(shard))
    }

    /// A chunk's path relative to the backing root (the same path in the view).
    /// Chunks and shards share the key encoding, so this is `shard_rel` of chunk coordinates.
    pub fn chunk_rel(&self, coords: &[u64]) -> PathBuf {
        self.shard_rel(coords)
    }

    /// Whether `coords` names a chunk inside the array's chunk grid.
    pub fn chunk_inside(&self, coords: &[u64]) -> bool {
        grid::inside(coords, &self.layout.chunk_grid_shape())
    }

    /// Whether `name` inside `node` belongs to the key tree, where BACKING's own entries
    /// (shard files and their directories) are hidden.
    pub fn is_key_name(&self, node: &KeyNode, name: &str) -> bool {
        self.layout
            .key_encoding
            .child(node, name, self.layout.ndim())
            .is_some()
    }

    /// Calls `f` with the coordinates of every shard file below the key-tree directory of
    /// `shard_prefix` in BACKING, until `f` breaks.
    pub fn walk_shard_files(
        &self,
        store: &dyn Store,
        shard_prefix: &[u64],
        f: &mut dyn FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<(), FsError> {
        if self.layout.ndim() == 0 {
            // The only shard of a 0-d array is a file named like a directory prefix.
            let key = self.rel.join(self.layout.key_encoding.encode(&[]));
            if store.open(&key, 0).map_err(io::Error::from)?.is_some() {
                let _ = f(vec![]);
            }
            return Ok(());
        }
        let dir = self.layout.key_encoding.prefix_dir(shard_prefix);
        let dir = join_rel(&self.rel, dir.as_ref());
        let mut filtered = |shard: Vec<u64>| {
            if shard.starts_with(shard_prefix) {
                f(shard)
            } else {
                ControlFlow::Continue(())
            }
        };
        // Shard files lie at most a key's levels below: deeper directories (made by
        // someone else, thousands deep) are not looked into.
        let levels = self.layout.ndim() + 1;
        let _stopped_early = self.walk_dir(store, &dir, levels, &mut filtered)?;
        Ok(())
    }

    /// The shard indices of coordinate `shard_prefix.len()` that have a directory below
    /// the key-tree directory of `shard_prefix` in the store, ascending. Only for a `/`
    /// separated key whose shards lie at least one level further down.
    pub fn shard_coords_below(
        &self,
        store: &dyn Store,
        shard_prefix: &[u64],
    ) -> Result<Vec<u64>, FsError> {
        let encoding = self.layout.key_encoding;
        let dir = join_rel(&self.rel, encoding.prefix_dir(shard_prefix).as_ref());
        let node = KeyNode::Dir(shard_prefix.to_vec());
        let mut out: Vec<u64> = store
            .list(&dir)
            .map_err(io::Error::from)?
            .dirs
            .into_iter()
            .filter_map(
                |name| match encoding.child(&node, &name, self.layout.ndim()) {
                    Some(KeyNode::Dir(coords)) => coords.last().copied(),
                    _ => None,
                },
            )
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// Calls `f` with the shard files below `dir`, looking `levels` directories deep.
    fn walk_dir(
        &self,
        store: &dyn Store,
        dir: &Path,
        levels: usize,
        f: &mut dyn FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, FsError> {
        let ndim = self.layout.ndim();
        let shard_grid = self.layout.shard_grid_shape();
        let listing = store.list(dir).map_err(io::Error::from)?;
        for name in listing.dirs.iter().filter(|_| levels > 0) {
            if self
                .walk_dir(store, &join_rel(dir, name.as_ref()), levels - 1, f)?
                .is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
        }
        for name in &listing.objects {
            let path = join_rel(dir, name.as_ref());
            let Some(key) = path.strip_prefix(&self.rel).ok().and_then(|k| k.to_str()) else {
                continue;
            };
            if let Ok(coords) = self.layout.key_encoding.decode(key, ndim)
                && grid::inside(&coords, &shard_grid)
                && f(coords).is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

/// What a name inside a directory of an array's key tree is.
#[derive(Debug, PartialEq)]
pub(crate) enum ArrayName {
    /// `zarr.json` in the array directory.
    Meta,
    /// A chunk key or key directory inside the grid.
    Key(KeyNode),
    /// Shaped like a key (digits and separators) but not a valid one, or outside the grid.
    BadKey,
    /// The lock file of a shard (`KEY.__lock`, see `crate::backing::lock`) or its staged
    /// next content (`.KEY.shardfs-staged`): BACKING's own is never shown (a lock file's
    /// name may equal a writer's temporary file in the view, which is held in memory
    /// instead).
    ShardLock,
    /// Anything else: a temporary file's name, or an extra file of BACKING.
    Other,
}

impl ArrayState {
    pub(crate) fn classify_name(&self, parent: &KeyNode, name: &str) -> ArrayName {
        if *parent == KeyNode::Root && name == METADATA_FILE {
            return ArrayName::Meta;
        }
        let encoding = self.layout.key_encoding;
        if let Some(node) = encoding.child(parent, name, self.layout.ndim()) {
            let grid = self.layout.chunk_grid_shape();
            let inside = node.prefix().iter().zip(&grid).all(|(c, g)| c < g);
            return if inside {
                ArrayName::Key(node)
            } else {
                ArrayName::BadKey
            };
        }
        let stem = name
            .strip_suffix(crate::backing::lock::LOCK_SUFFIX)
            .or_else(|| crate::backing::lock::key_of_staged(name));
        if let Some(stem) = stem
            && matches!(self.classify_name(parent, stem), ArrayName::Key(_))
        {
            return ArrayName::ShardLock;
        }
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let key_like = match encoding.separator() {
            Separator::Slash => digits(name) || (*parent == KeyNode::Root && name == "c"),
            Separator::Dot => {
                *parent == KeyNode::Root
                    && (name == "c"
                        || name.split('.').all(digits)
                        || name
                            .strip_prefix("c.")
                            .is_some_and(|r| r.split('.').all(digits)))
            }
        };
        if key_like {
            ArrayName::BadKey
        } else {
            ArrayName::Other
        }
    }
}

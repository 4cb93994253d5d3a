//! A sharded array as the mount shows it: which inner chunks exist, where their bytes are,
//! and the cache of decoded shard indexes behind that.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::Bytes;
use tracing::warn;

use super::error::FsError;
use crate::backing::{Backing, FileVersion, join_rel, mtime_of};
use crate::grid;
use crate::shard::{ChunkRange, IndexError, ShardFileError, ShardIndex, read_index};
use crate::zarr::{ArrayMetadata, KeyNode, ShardLayout};

/// One sharded array, for as long as its `zarr.json` is unchanged.
#[derive(Debug)]
pub struct ArrayState {
    /// The array directory, relative to the backing root (the same path in the view).
    pub rel: PathBuf,
    pub meta: ArrayMetadata,
    pub layout: ShardLayout,
    /// The unsharded view of `meta`, as served for `zarr.json`.
    pub view_json: Bytes,
    pub meta_version: FileVersion,
    pub meta_mtime: SystemTime,
    shards: Mutex<HashMap<Vec<u64>, Arc<ShardSlot>>>,
}

/// Everything known about one shard position.
#[derive(Debug, Default)]
pub struct ShardSlot {
    state: Mutex<ShardState>,
}

#[derive(Debug, Default)]
struct ShardState {
    stored: Option<StoredIndex>,
}

/// The decoded index of one version of a shard file, or why it could not be decoded.
#[derive(Debug)]
struct StoredIndex {
    version: FileVersion,
    mtime: SystemTime,
    file: Arc<File>,
    index: Result<Arc<ShardIndex>, IndexError>,
}

/// A shard file as last seen, with its decoded and validated index.
#[derive(Clone, Debug)]
pub struct ShardSnapshot {
    pub file: Arc<File>,
    pub index: Arc<ShardIndex>,
    pub mtime: SystemTime,
}

/// Where the bytes of one inner chunk are, if anywhere.
#[derive(Clone, Debug)]
pub enum ChunkData {
    Absent,
    Stored {
        file: Arc<File>,
        range: ChunkRange,
        mtime: SystemTime,
    },
    /// Its shard's index is damaged: the chunk is listed, but reading it fails with EIO.
    Damaged {
        path: PathBuf,
        reason: IndexError,
        mtime: SystemTime,
    },
}

/// The entries of a directory of the chunk-key tree.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyEntry {
    pub name: String,
    pub node: KeyNode,
}

impl ArrayState {
    pub fn new(
        rel: PathBuf,
        meta: ArrayMetadata,
        layout: ShardLayout,
        view_json: Bytes,
        meta_version: FileVersion,
        meta_mtime: SystemTime,
    ) -> ArrayState {
        ArrayState {
            rel,
            meta,
            layout,
            view_json,
            meta_version,
            meta_mtime,
            shards: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, shard: &[u64]) -> Arc<ShardSlot> {
        let mut shards = lock(&self.shards);
        shards.entry(shard.to_vec()).or_default().clone()
    }

    /// The shard file's path relative to the backing root.
    pub fn shard_rel(&self, shard: &[u64]) -> PathBuf {
        self.rel.join(self.layout.key_encoding.encode(shard))
    }

    /// The current shard file and its index: `Ok(None)` when there is no shard file, an
    /// EIO-mapped error when its index is damaged (logged once per file version).
    pub fn shard(
        &self,
        backing: &Backing,
        shard: &[u64],
    ) -> Result<Option<ShardSnapshot>, FsError> {
        let rel = self.shard_rel(shard);
        let slot = self.slot(shard);
        let mut state = lock(&slot.state);
        let Some(meta) = backing.stat(&rel)? else {
            state.stored = None;
            return Ok(None);
        };
        if state
            .stored
            .as_ref()
            .is_none_or(|s| s.version != FileVersion::of(&meta))
        {
            state.stored = Some(load_index(backing, &rel, &self.layout)?);
        }
        let Some(stored) = state.stored.as_ref() else {
            return Ok(None);
        };
        match &stored.index {
            Ok(index) => Ok(Some(ShardSnapshot {
                file: stored.file.clone(),
                index: index.clone(),
                mtime: stored.mtime,
            })),
            Err(e) => Err(FsError::DamagedShard {
                path: backing.path(&rel),
                reason: e.clone(),
            }),
        }
    }

    /// The stored bytes of the chunk at grid coordinates `coords`.
    pub fn chunk(&self, backing: &Backing, coords: &[u64]) -> Result<ChunkData, FsError> {
        if !grid::inside(coords, &self.layout.chunk_grid_shape()) {
            return Ok(ChunkData::Absent);
        }
        let loc = self.layout.locate(coords);
        let snapshot = match self.shard(backing, &loc.shard) {
            Err(FsError::DamagedShard { path, reason }) => {
                let mtime = backing
                    .stat(&self.shard_rel(&loc.shard))?
                    .map_or(SystemTime::UNIX_EPOCH, |m| mtime_of(&m));
                return Ok(ChunkData::Damaged {
                    path,
                    reason,
                    mtime,
                });
            }
            other => other?,
        };
        Ok(match snapshot {
            None => ChunkData::Absent,
            Some(snap) => match snap.index.get(loc.pos) {
                None => ChunkData::Absent,
                Some(range) => ChunkData::Stored {
                    file: snap.file,
                    range,
                    mtime: snap.mtime,
                },
            },
        })
    }

    /// Calls `f` with the coordinates of every chunk below `node` that exists, shard by
    /// shard, until `f` breaks. A damaged shard contributes every position of it that lies
    /// inside the array, so that its chunks show up (and fail to read) rather than vanish.
    fn for_each_chunk_below(
        &self,
        backing: &Backing,
        node: &KeyNode,
        mut f: impl FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<(), FsError> {
        let prefix = node.prefix();
        let cps = self.layout.chunks_per_shard().to_vec();
        let chunk_grid = self.layout.chunk_grid_shape();
        let shard_prefix: Vec<u64> = prefix.iter().zip(&cps).map(|(c, n)| c / n).collect();
        let mut visit = |shard: Vec<u64>| -> Result<ControlFlow<()>, FsError> {
            let positions: Vec<usize> = match self.shard(backing, &shard) {
                Ok(None) => return Ok(ControlFlow::Continue(())),
                Ok(Some(snap)) => snap.index.present().map(|(pos, _)| pos).collect(),
                Err(FsError::DamagedShard { .. }) => (0..grid::count(&cps)).collect(),
                Err(e) => return Err(e),
            };
            for pos in positions {
                let coords = self.layout.chunk_coords(&shard, pos);
                if coords.starts_with(prefix)
                    && grid::inside(&coords, &chunk_grid)
                    && f(coords).is_break()
                {
                    return Ok(ControlFlow::Break(()));
                }
            }
            Ok(ControlFlow::Continue(()))
        };
        let dir = self.layout.key_encoding.prefix_dir(&shard_prefix);
        let mut result = Ok(());
        let dir = join_rel(&self.rel, dir.as_ref());
        let _stopped_early = self.walk_shard_files(backing, &dir, &mut |shard| {
            if !shard.starts_with(&shard_prefix) {
                return ControlFlow::Continue(());
            }
            match visit(shard) {
                Ok(flow) => flow,
                Err(e) => {
                    result = Err(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        result
    }

    /// Walks the backing tree below `dir` and calls `f` with the coordinates of every file
    /// whose path is a shard key of this array.
    fn walk_shard_files(
        &self,
        backing: &Backing,
        dir: &Path,
        f: &mut dyn FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, FsError> {
        let ndim = self.layout.ndim();
        let shard_grid = self.layout.shard_grid_shape();
        let mut entries = backing.list(dir)?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries {
            let path = join_rel(dir, &entry.name);
            if entry.is_dir {
                if self.walk_shard_files(backing, &path, f)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                continue;
            }
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

    /// Whether any chunk exists below `node`.
    pub fn has_chunks_below(&self, backing: &Backing, node: &KeyNode) -> Result<bool, FsError> {
        let mut found = false;
        self.for_each_chunk_below(backing, node, |_| {
            found = true;
            ControlFlow::Break(())
        })?;
        Ok(found)
    }

    /// The entries of `node` that hold chunks, sorted by coordinates.
    pub fn list(&self, backing: &Backing, node: &KeyNode) -> Result<Vec<KeyEntry>, FsError> {
        let encoding = self.layout.key_encoding;
        let mut children: BTreeSet<(Vec<u64>, KeyEntry)> = BTreeSet::new();
        self.for_each_chunk_below(backing, node, |coords| {
            let (name, child) = encoding.child_towards(node, &coords);
            let order = child.prefix().to_vec();
            children.insert((order, KeyEntry { name, node: child }));
            ControlFlow::Continue(())
        })?;
        Ok(children.into_iter().map(|(_, entry)| entry).collect())
    }
}

fn load_index(backing: &Backing, rel: &Path, layout: &ShardLayout) -> Result<StoredIndex, FsError> {
    let file = backing.open(rel)?;
    let meta = file.metadata()?;
    let index = match read_index(&file, meta.len(), &layout.index) {
        Ok(index) => Ok(Arc::new(index)),
        Err(ShardFileError::Index(e)) => {
            warn!(shard = %backing.path(rel).display(), "damaged shard, its chunks read as EIO: {e}");
            Err(e)
        }
        Err(ShardFileError::Io(e)) => return Err(e.into()),
    };
    Ok(StoredIndex {
        version: FileVersion::of(&meta),
        mtime: mtime_of(&meta),
        file: Arc::new(file),
        index,
    })
}

/// Locks a mutex; a panic in another holder leaves data that is still consistent for our
/// uses (every critical section here replaces values whole), so poisoning is ignored.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

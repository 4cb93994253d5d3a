//! Where an array's chunks are now (each in its own file, or at a position in a shard) and
//! the work of moving them into another layout: a shard built from chunks, or chunk files
//! cut from a shard. The bytes are read as stored; the index of a shard is read again when
//! its chunks are, from the same pinned version as they are, so a shard replaced
//! meanwhile is never read at the old one's offsets.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

use super::ConvertError;
use super::plan::{PackPlan, zstd_added};
use crate::limits::MAX_FILE_BYTES;
use crate::shard::{ShardIndex, read_index};
use crate::store::{Piece, Store};
use crate::zarr::layout::unsharded_view;
use crate::zarr::{ArrayMetadata, ChunkKeyEncoding, LayoutError, ShardLayout};

/// Where a chunk's encoded bytes are now.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChunkAt {
    /// Its own file, by key below the array's directory.
    File(String),
    /// Inside the shard file `key`, at `pos` in its index.
    Shard { key: String, pos: usize },
}

/// One object to write: a shard built from chunks (by position in its index), or chunk
/// files (by key) cut from one shard.
pub enum Unit {
    Shard {
        key: String,
        chunks: Vec<(usize, ChunkAt)>,
    },
    Chunks(Vec<(String, ChunkAt)>),
}

/// Moving an array's chunks from the layout of `from` to that of `to`.
pub struct Conversion {
    /// The layout read: `None` when the chunks are files.
    from: Option<ShardLayout>,
    /// The layout written: `None` when the chunks become files (named by `to_keys`).
    to: Option<PackPlan>,
    to_keys: ChunkKeyEncoding,
    /// Chunks are compressed on the way, at this zstd level.
    pub zstd: Option<i32>,
}

impl Conversion {
    pub fn between(from: &ArrayMetadata, to: &ArrayMetadata) -> Result<Conversion, LayoutError> {
        let from_layout = ShardLayout::of(from)?;
        let to_plan = match ShardLayout::of(to)? {
            Some(_) => Some(PackPlan::of(to.clone())?),
            None => None,
        };
        let plain = |meta: &ArrayMetadata, sharded: bool| match sharded {
            true => unsharded_view(meta).map(|m| m.codecs),
            false => Ok(meta.codecs.clone()),
        };
        let zstd = zstd_added(
            &plain(from, from_layout.is_some())?,
            &plain(to, to_plan.is_some())?,
        );
        Ok(Conversion {
            from: from_layout,
            to: to_plan,
            to_keys: ChunkKeyEncoding::from_metadata(&to.chunk_key_encoding)
                .map_err(LayoutError::KeyEncoding)?,
            zstd,
        })
    }

    /// The index format of the shards written, if any.
    pub fn to_shards(&self) -> Option<&PackPlan> {
        self.to.as_ref()
    }

    /// The chunks at `objects` (the array's chunk files, or its shard files, by key →
    /// grid coordinates) as (chunk coordinates, where): a shard's index is read for it.
    pub fn locate(
        &self,
        store: &dyn Store,
        dir: &Path,
        objects: &BTreeMap<String, Vec<u64>>,
    ) -> Result<Vec<(Vec<u64>, ChunkAt)>, ConvertError> {
        let Some(layout) = &self.from else {
            return Ok(objects
                .iter()
                .map(|(key, coords)| (coords.clone(), ChunkAt::File(key.clone())))
                .collect());
        };
        let mut out = Vec::new();
        for (key, shard) in objects {
            let Some((index, _)) = read_shard(store, &dir.join(key), layout)? else {
                continue; // gone since it was listed
            };
            out.extend(index.present().map(|(pos, _)| {
                let at = ChunkAt::Shard {
                    key: key.clone(),
                    pos,
                };
                (layout.chunk_coords(shard, pos), at)
            }));
        }
        Ok(out)
    }

    /// The objects to write for the chunks `located`: shards, or (to chunk files) one unit
    /// per shard read.
    pub fn units(&self, located: Vec<(Vec<u64>, ChunkAt)>) -> Vec<Unit> {
        if let Some(plan) = &self.to {
            return plan
                .shards_of(located)
                .into_iter()
                .map(|s| Unit::Shard {
                    key: s.key,
                    chunks: s.chunks,
                })
                .collect();
        }
        let mut by_source: BTreeMap<String, Vec<(String, ChunkAt)>> = BTreeMap::new();
        for (coords, at) in located {
            let source = match &at {
                ChunkAt::File(key) | ChunkAt::Shard { key, .. } => key.clone(),
            };
            let key = self.to_keys.encode(&coords);
            by_source.entry(source).or_default().push((key, at));
        }
        by_source.into_values().map(Unit::Chunks).collect()
    }

    /// The chunks at `wanted` (`None`: gone since they were located), each object opened
    /// once: a chunk file whole, a shard's index read (and checked) and its chunks' ranges
    /// taken from that same version. From a directory they stay ranges of open files,
    /// copied inside the kernel when written; other stores' bytes are read, a shard's
    /// wanted span in one request.
    pub fn fetch(
        &self,
        store: &dyn Store,
        dir: &Path,
        wanted: &[&ChunkAt],
    ) -> Result<Vec<Option<Piece>>, ConvertError> {
        let mut by_shard: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for at in wanted {
            if let ChunkAt::Shard { key, pos } = at {
                by_shard.entry(key).or_default().push(*pos);
            }
        }
        let mut shards = BTreeMap::new();
        for (key, positions) in by_shard {
            let layout = self.from.as_ref().ok_or_else(|| not_sharded(store, dir))?;
            shards.insert(key, open_shard(store, &dir.join(key), layout, &positions)?);
        }
        wanted
            .iter()
            .map(|at| match at {
                ChunkAt::File(key) => open_file(store, &dir.join(key)),
                ChunkAt::Shard { key, pos } => Ok(shards
                    .get(key.as_str())
                    .and_then(|shard| shard.as_ref()?.chunk(*pos))),
            })
            .collect()
    }
}

/// A chunk file, whole, from one version of it.
fn open_file(store: &dyn Store, key: &Path) -> Result<Option<Piece>, ConvertError> {
    // The whole object with the open: one request on an object store.
    let blob = store
        .open(key, MAX_FILE_BYTES)
        .map_err(|e| ConvertError::store(store, key, e))?;
    let Some(blob) = blob else { return Ok(None) };
    let len = blob.info().size;
    if len > MAX_FILE_BYTES {
        let e = std::io::Error::from_raw_os_error(libc::EFBIG);
        return Err(ConvertError::store(store, key, e.into()));
    }
    if blob.file().is_none() || len < IN_KERNEL_FROM {
        // Read now, its file closed: a shard of thousands of small chunks keeps no
        // thousands of files open.
        let piece = Piece::Range {
            from: blob,
            offset: 0,
            len,
        };
        let bytes = piece
            .to_bytes()
            .map_err(|e| ConvertError::store(store, key, e.into()))?;
        return Ok(Some(Piece::Bytes(bytes)));
    }
    Ok(Some(Piece::Range {
        from: blob,
        offset: 0,
        len,
    }))
}

/// Chunk files from this size on are copied inside the kernel (kept open until their
/// shard is written); smaller ones cost little to read.
const IN_KERNEL_FROM: u64 = 256 << 10;

/// One version of a shard: its index, and its chunks (ranges of the open file, or of the
/// span read from an object store).
struct OpenedShard {
    index: ShardIndex,
    from: PinnedShard,
    /// Where `from` is no file: the bytes from `start` read in one request.
    span: Option<(u64, Bytes)>,
}

impl OpenedShard {
    fn chunk(&self, pos: usize) -> Option<Piece> {
        let range = self.index.get(pos)?;
        let Some((start, bytes)) = &self.span else {
            return Some(Piece::Range {
                from: self.from.clone(),
                offset: range.offset,
                len: range.nbytes,
            });
        };
        let from = range.offset.checked_sub(*start)? as usize;
        let to = from + range.nbytes as usize;
        (to <= bytes.len()).then(|| Piece::Bytes(bytes.slice(from..to)))
    }
}

/// The shard at `key` (its index checked as any reader checks it), ready to give the
/// chunks at `positions`; `None`: no such shard. A damaged shard is refused.
fn open_shard(
    store: &dyn Store,
    key: &Path,
    layout: &ShardLayout,
    positions: &[usize],
) -> Result<Option<OpenedShard>, ConvertError> {
    let Some((index, from)) = read_shard(store, key, layout)? else {
        return Ok(None);
    };
    if from.file().is_some() {
        return Ok(Some(OpenedShard {
            index,
            from,
            span: None,
        }));
    }
    let ranges: Vec<_> = positions.iter().filter_map(|p| index.get(*p)).collect();
    let start = ranges.iter().map(|r| r.offset).min().unwrap_or(0);
    let end = ranges.iter().map(|r| r.end()).max().unwrap_or(0);
    if end - start > MAX_FILE_BYTES {
        let e = std::io::Error::from_raw_os_error(libc::EFBIG);
        return Err(ConvertError::store(store, key, e.into()));
    }
    let span = Piece::Range {
        from: from.clone(),
        offset: start,
        len: end - start,
    };
    let bytes = span
        .to_bytes()
        .map_err(|e| ConvertError::store(store, key, e.into()))?;
    Ok(Some(OpenedShard {
        index,
        from,
        span: Some((start, bytes)),
    }))
}

/// One version of a shard file, read at positions.
type PinnedShard = std::sync::Arc<dyn crate::store::Blob>;

/// A shard's validated index and the version of it the index was read from. `None`: no
/// such shard.
fn read_shard(
    store: &dyn Store,
    key: &Path,
    layout: &ShardLayout,
) -> Result<Option<(ShardIndex, PinnedShard)>, ConvertError> {
    let blob = store
        .open(key, layout.index.encoded_len())
        .map_err(|e| ConvertError::store(store, key, e))?;
    let Some(blob) = blob else {
        return Ok(None);
    };
    let index = read_index(blob.as_ref(), blob.info().size, &layout.index).map_err(|e| {
        ConvertError::Damaged {
            what: store.describe(key),
            why: e.to_string(),
        }
    })?;
    Ok(Some((index, blob)))
}

fn not_sharded(store: &dyn Store, dir: &Path) -> ConvertError {
    ConvertError::Layout {
        what: store.describe(dir),
        source: LayoutError::NotSharded,
    }
}

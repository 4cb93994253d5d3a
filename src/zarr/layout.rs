//! The layout translation between a sharded array and its unsharded view, and the grid
//! arithmetic that maps an inner chunk to its shard.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use super::key::{ChunkKeyEncoding, KeyError};
use super::metadata::{ArrayMetadata, GroupMetadata, NamedConfig, Node};
use super::policy::{PolicyError, ShardPolicy};
use crate::grid;
use crate::shard::{Endian, IndexCodec, IndexFormat, IndexLocation};

pub const SHARDING_CODEC: &str = "sharding_indexed";

/// The most inner chunks one shard may hold: its index (16 bytes a chunk) is at most 16 MiB.
/// Every write of a shard writes its whole index, so a count the metadata may ask for
/// freely (2^24 made a 2-byte write a 256 MiB shard) is a cost anyone writing a `zarr.json`
/// could impose on the daemon and the disk; an array asking for more is shown as it is.
pub const MAX_CHUNKS_PER_SHARD: u64 = 1 << 20;

/// The `configuration` of a `sharding_indexed` codec.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardingConfig {
    pub chunk_shape: Vec<u64>,
    pub codecs: Vec<NamedConfig>,
    #[serde(default = "standard_index_codecs")]
    pub index_codecs: Vec<NamedConfig>,
    #[serde(default)]
    pub index_location: IndexLocation,
}

fn standard_index_codecs() -> Vec<NamedConfig> {
    vec![
        NamedConfig::new("bytes", Some(json!({"endian": "little"}))),
        NamedConfig::new("crc32c", None),
    ]
}

/// Why an array cannot be shown unsharded, or cannot be stored sharded.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum LayoutError {
    #[error("array is not sharded")]
    NotSharded,
    #[error("array is already sharded")]
    AlreadySharded,
    #[error("codec {0:?} comes before sharding_indexed, so inner chunks are not plain chunks")]
    CodecBeforeSharding(String),
    #[error("codec {0:?} comes after sharding_indexed, so shard files are not plain shards")]
    CodecAfterSharding(String),
    #[error("chunk grid {0:?} is not a regular grid")]
    IrregularGrid(String),
    #[error("array has storage transformers")]
    StorageTransformers,
    #[error("{0}")]
    NotShardable(&'static str),
    #[error("invalid {what}: {reason}")]
    BadConfiguration { what: &'static str, reason: String },
    #[error("{what} has {found} dimensions, the array has {expected}")]
    RankMismatch {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("chunk shape {0:?} has a zero extent")]
    ZeroChunkShape(Vec<u64>),
    #[error("inner chunk shape {inner:?} does not divide shard shape {shard:?}")]
    InnerShapeDoesNotDivide { shard: Vec<u64>, inner: Vec<u64> },
    #[error(
        "inner codecs shard again (nested sharding_indexed); inner chunks are not plain chunks"
    )]
    NestedSharding,
    #[error(
        "{0} inner chunks per shard: its index would be more than the 16 MiB \
         ({MAX_CHUNKS_PER_SHARD} chunks) shardfs writes with every shard"
    )]
    TooManyChunksPerShard(u128),
    #[error("unsupported index codecs {0} (shardfs supports bytes, optionally followed by crc32c)")]
    UnsupportedIndexCodecs(String),
    #[error("{0}")]
    KeyEncoding(#[from] KeyError),
    #[error("{0}")]
    Policy(#[from] PolicyError),
}

impl LayoutError {
    /// True when the metadata itself is broken, as opposed to valid but not expressible as
    /// plain chunk files.
    pub fn is_invalid_metadata(&self) -> bool {
        matches!(
            self,
            LayoutError::BadConfiguration { .. }
                | LayoutError::RankMismatch { .. }
                | LayoutError::ZeroChunkShape(_)
                | LayoutError::InnerShapeDoesNotDivide { .. }
                | LayoutError::TooManyChunksPerShard(_)
                | LayoutError::KeyEncoding(_)
        )
    }
}

/// Where an inner chunk lives: which shard, and which C-order position inside it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkLocation {
    pub shard: Vec<u64>,
    pub pos: usize,
}

/// A sharded array whose shards hold plain inner chunks: everything needed to map chunk
/// keys to shard files and index positions.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardLayout {
    pub array_shape: Vec<u64>,
    pub shard_shape: Vec<u64>,
    pub chunk_shape: Vec<u64>,
    pub index: IndexFormat,
    pub key_encoding: ChunkKeyEncoding,
}

impl ShardLayout {
    /// Whether chunks land at the same places (shard files and index positions) under both
    /// layouts: a resize keeps placement, another chunk shape, chunks per shard, index or
    /// key encoding does not.
    pub fn same_placement(&self, other: &ShardLayout) -> bool {
        self.shard_shape == other.shard_shape
            && self.chunk_shape == other.chunk_shape
            && self.index == other.index
            && self.key_encoding == other.key_encoding
    }
}

/// Whether the array `now` reads the chunks written under `then` as they are: it places
/// them where that one did (`same_placement`), with the same data type and codecs (in the
/// stored, sharded form: its inner chunks' codecs and its index). A resize, attributes or
/// another fill value change nothing for them.
pub fn takes_chunks_of(now: &ArrayMetadata, then: &ArrayMetadata) -> bool {
    let form = |c: &NamedConfig| {
        let config = c.configuration.clone().unwrap_or_default();
        (c.name.clone(), config, c.extra.clone())
    };
    let same_codecs = now.codecs.len() == then.codecs.len()
        && now
            .codecs
            .iter()
            .zip(&then.codecs)
            .all(|(a, b)| form(a) == form(b));
    let placed = match (ShardLayout::of(now), ShardLayout::of(then)) {
        (Ok(Some(a)), Ok(Some(b))) => a.same_placement(&b),
        _ => false,
    };
    now.data_type == then.data_type && same_codecs && placed
}

/// The `chunk_shape` of a regular chunk grid.
pub fn regular_chunk_shape(meta: &ArrayMetadata) -> Result<Vec<u64>, LayoutError> {
    if meta.chunk_grid.name != "regular" {
        return Err(LayoutError::IrregularGrid(meta.chunk_grid.name.clone()));
    }
    #[derive(Deserialize)]
    struct Regular {
        chunk_shape: Vec<u64>,
    }
    let regular: Regular =
        meta.chunk_grid
            .config_as()
            .map_err(|e| LayoutError::BadConfiguration {
                what: "chunk_grid",
                reason: e.to_string(),
            })?;
    check_rank("chunk_grid chunk_shape", meta.ndim(), &regular.chunk_shape)?;
    if regular.chunk_shape.contains(&0) {
        return Err(LayoutError::ZeroChunkShape(regular.chunk_shape));
    }
    Ok(regular.chunk_shape)
}

fn check_rank(what: &'static str, expected: usize, v: &[u64]) -> Result<(), LayoutError> {
    if v.len() != expected {
        return Err(LayoutError::RankMismatch {
            what,
            expected,
            found: v.len(),
        });
    }
    Ok(())
}

fn check_chunk_count(chunks_per_shard: &[u64]) -> Result<(), LayoutError> {
    // Checked: a plain product wraps ([2^63, 2^63, 4] is 0 in u128) and passes the bound.
    let n = chunks_per_shard
        .iter()
        .try_fold(1u128, |acc, &n| acc.checked_mul(n as u128))
        .unwrap_or(u128::MAX);
    if n > MAX_CHUNKS_PER_SHARD as u128 {
        return Err(LayoutError::TooManyChunksPerShard(n));
    }
    Ok(())
}

#[cfg(test)]
mod chunk_count_tests {
    #[test]
    fn a_product_that_overflows_is_too_many() {
        assert!(super::check_chunk_count(&[1 << 63, 1 << 63, 4]).is_err());
        assert!(super::check_chunk_count(&[u64::MAX, u64::MAX]).is_err());
        assert!(super::check_chunk_count(&[4, 4]).is_ok());
    }

    #[test]
    fn an_index_over_16_mib_is_too_many() {
        assert!(super::check_chunk_count(&[1 << 10, 1 << 10]).is_ok());
        let err = super::check_chunk_count(&[1 << 10, 1 << 11]).unwrap_err();
        assert!(err.to_string().contains("16 MiB"), "{err}");
    }
}

fn index_codec(codecs: &[NamedConfig]) -> Result<IndexCodec, LayoutError> {
    let unsupported = || {
        let names: Vec<&str> = codecs.iter().map(|c| c.name.as_str()).collect();
        LayoutError::UnsupportedIndexCodecs(format!("[{}]", names.join(", ")))
    };
    let (bytes, rest) = codecs.split_first().ok_or_else(unsupported)?;
    if bytes.name != "bytes" {
        return Err(unsupported());
    }
    let endian = match bytes.config_value("endian").and_then(Value::as_str) {
        Some("little") => Endian::Little,
        Some("big") => Endian::Big,
        _ => return Err(unsupported()),
    };
    let crc32c = match rest {
        [] => false,
        [c] if c.name == "crc32c" => true,
        _ => return Err(unsupported()),
    };
    Ok(IndexCodec { endian, crc32c })
}

fn sharding_config(meta: &ArrayMetadata) -> Result<Option<ShardingConfig>, LayoutError> {
    let Some(at) = meta.codecs.iter().position(|c| c.name == SHARDING_CODEC) else {
        return Ok(None);
    };
    if at > 0 {
        return Err(LayoutError::CodecBeforeSharding(
            meta.codecs[0].name.clone(),
        ));
    }
    if let Some(after) = meta.codecs.get(1) {
        return Err(LayoutError::CodecAfterSharding(after.name.clone()));
    }
    meta.codecs[0]
        .config_as()
        .map(Some)
        .map_err(|e| LayoutError::BadConfiguration {
            what: "sharding_indexed configuration",
            reason: e.to_string(),
        })
}

impl ShardLayout {
    /// The layout of a sharded array, `None` for an unsharded one, or why the array's
    /// shards cannot be shown as plain chunk files.
    pub fn of(meta: &ArrayMetadata) -> Result<Option<ShardLayout>, LayoutError> {
        let Some(config) = sharding_config(meta)? else {
            return Ok(None);
        };
        if meta.has_storage_transformers() {
            return Err(LayoutError::StorageTransformers);
        }
        let shard_shape = regular_chunk_shape(meta)?;
        check_rank("sharding chunk_shape", meta.ndim(), &config.chunk_shape)?;
        if config.chunk_shape.contains(&0) {
            return Err(LayoutError::ZeroChunkShape(config.chunk_shape));
        }
        if shard_shape
            .iter()
            .zip(&config.chunk_shape)
            .any(|(s, c)| s % c != 0)
        {
            return Err(LayoutError::InnerShapeDoesNotDivide {
                shard: shard_shape,
                inner: config.chunk_shape,
            });
        }
        let chunks_per_shard: Vec<u64> = shard_shape
            .iter()
            .zip(&config.chunk_shape)
            .map(|(s, c)| s / c)
            .collect();
        check_chunk_count(&chunks_per_shard)?;
        if config.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
            return Err(LayoutError::NestedSharding);
        }
        Ok(Some(ShardLayout {
            array_shape: meta.shape.clone(),
            index: IndexFormat {
                chunks_per_shard,
                codec: index_codec(&config.index_codecs)?,
                location: config.index_location,
            },
            shard_shape,
            chunk_shape: config.chunk_shape,
            key_encoding: ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding)?,
        }))
    }

    pub fn ndim(&self) -> usize {
        self.array_shape.len()
    }

    pub fn chunks_per_shard(&self) -> &[u64] {
        &self.index.chunks_per_shard
    }

    /// Extent of the grid of inner chunks.
    pub fn chunk_grid_shape(&self) -> Vec<u64> {
        grid_shape(&self.array_shape, &self.chunk_shape)
    }

    /// Extent of the grid of shards.
    pub fn shard_grid_shape(&self) -> Vec<u64> {
        grid_shape(&self.array_shape, &self.shard_shape)
    }

    pub fn locate(&self, chunk: &[u64]) -> ChunkLocation {
        let cps = self.chunks_per_shard();
        let shard = chunk.iter().zip(cps).map(|(c, n)| c / n).collect();
        let within: Vec<u64> = chunk.iter().zip(cps).map(|(c, n)| c % n).collect();
        ChunkLocation {
            shard,
            pos: grid::ravel(&within, cps),
        }
    }

    /// Grid coordinates of the chunk at `pos` in `shard`.
    pub fn chunk_coords(&self, shard: &[u64], pos: usize) -> Vec<u64> {
        let cps = self.chunks_per_shard();
        grid::unravel(pos, cps)
            .iter()
            .zip(shard.iter().zip(cps))
            .map(|(w, (s, n))| s.saturating_mul(*n).saturating_add(*w))
            .collect()
    }

    /// Number of positions of `shard` that lie inside the array (edge shards have fewer).
    pub fn positions_inside(&self, shard: &[u64]) -> usize {
        let chunk_grid = self.chunk_grid_shape();
        shard
            .iter()
            .zip(self.chunks_per_shard())
            .zip(&chunk_grid)
            .map(|((s, n), g)| g.saturating_sub(s * n).min(*n))
            .product::<u64>() as usize
    }
}

fn grid_shape(shape: &[u64], chunk: &[u64]) -> Vec<u64> {
    shape
        .iter()
        .zip(chunk)
        .map(|(&s, &c)| grid::ceil_div(s, c))
        .collect()
}

/// The encoded size of every inner chunk of the sharded array `meta` when its codecs fix
/// it (no compression: only `transpose`, `bytes`, then `crc32c`), else `None`. A stored
/// chunk of any other size is damage (a whole shard taken for a chunk, a torn copy).
pub fn fixed_chunk_bytes(meta: &ArrayMetadata) -> Option<u64> {
    let config = sharding_config(meta).ok()??;
    let layout = ShardLayout::of(meta).ok()??;
    let elements = layout
        .chunk_shape
        .iter()
        .try_fold(1u64, |a, &b| a.checked_mul(b))?;
    let mut size = elements.checked_mul(meta.item_size()?)?;
    let mut serialized = false;
    for c in &config.codecs {
        match (c.name.as_str(), serialized) {
            ("transpose", false) => {}
            ("bytes", false) => serialized = true,
            ("crc32c", true) => size = size.checked_add(4)?,
            _ => return None,
        }
    }
    serialized.then_some(size)
}

/// The unsharded equivalent of a sharded array: chunk shape = inner chunk shape, codecs =
/// inner codecs, everything else unchanged.
pub fn unsharded_view(meta: &ArrayMetadata) -> Result<ArrayMetadata, LayoutError> {
    let layout = ShardLayout::of(meta)?.ok_or(LayoutError::NotSharded)?;
    let config = sharding_config(meta)?.ok_or(LayoutError::NotSharded)?;
    let mut view = meta.clone();
    set_chunk_shape(&mut view, &layout.chunk_shape);
    view.codecs = config.codecs;
    Ok(view)
}

/// What the mount shows of the stored sharded array `meta`: its unsharded view, less the
/// `zstd` the mount added (`transparent`), so the writer's own document.
pub fn shown_view(meta: &ArrayMetadata) -> Result<ArrayMetadata, LayoutError> {
    unsharded_view(meta).map(super::transparent::shown)
}

/// The sharded form of an unsharded array under `policy`, with the index at the end.
pub fn sharded_from(
    meta: &ArrayMetadata,
    policy: &ShardPolicy,
) -> Result<ArrayMetadata, LayoutError> {
    let chunk_shape = regular_chunk_shape(meta)?;
    let cps = policy.chunks_per_shard(&meta.shape, &chunk_shape, meta.item_size())?;
    sharded_with(meta, &cps, IndexLocation::End)
}

/// The sharded form of an unsharded array with the given chunks per shard: inner codecs =
/// the array's codecs, index codecs `bytes(little)` + `crc32c`.
pub fn sharded_with(
    meta: &ArrayMetadata,
    chunks_per_shard: &[u64],
    index_location: IndexLocation,
) -> Result<ArrayMetadata, LayoutError> {
    if meta.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
        return Err(LayoutError::AlreadySharded);
    }
    if meta.has_storage_transformers() {
        return Err(LayoutError::StorageTransformers);
    }
    if let Some(why) = meta.data_type().ok().and_then(|t| t.not_shardable()) {
        return Err(LayoutError::NotShardable(why));
    }
    // Shard files are named with the array's key encoding: one shardfs cannot read back
    // makes a sharded array it could never show (found by fuzzing).
    ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding).map_err(LayoutError::KeyEncoding)?;
    let chunk_shape = regular_chunk_shape(meta)?;
    check_rank("chunks per shard", meta.ndim(), chunks_per_shard)?;
    check_chunk_count(chunks_per_shard)?;
    let shard_shape: Vec<u64> = chunk_shape
        .iter()
        .zip(chunks_per_shard)
        .map(|(&c, &n)| if n == 0 { None } else { c.checked_mul(n) })
        .collect::<Option<_>>()
        .ok_or_else(|| LayoutError::BadConfiguration {
            what: "chunks per shard",
            reason: format!("{chunks_per_shard:?} gives an empty or oversized shard"),
        })?;
    let config = ShardingConfig {
        chunk_shape,
        codecs: meta.codecs.clone(),
        index_codecs: standard_index_codecs(),
        index_location,
    };
    let mut sharded = meta.clone();
    set_chunk_shape(&mut sharded, &shard_shape);
    let config = serde_json::to_value(config).unwrap_or(Value::Null);
    sharded.codecs = vec![NamedConfig::new(SHARDING_CODEC, Some(config))];
    Ok(sharded)
}

fn set_chunk_shape(meta: &mut ArrayMetadata, shape: &[u64]) {
    meta.chunk_grid
        .configuration
        .get_or_insert_default()
        .insert("chunk_shape".into(), json!(shape));
}

/// Translates the array entries of a group's consolidated metadata one by one with `f`.
/// Entries that are not arrays, or that `f` refuses, are kept as they are; the refusals are
/// returned with the entry's path so that the caller can say why.
pub fn translate_consolidated(
    group: &GroupMetadata,
    mut f: impl FnMut(&str, &ArrayMetadata) -> Result<ArrayMetadata, LayoutError>,
) -> (GroupMetadata, Vec<(String, LayoutError)>) {
    let mut out = group.clone();
    let mut refused = Vec::new();
    if let Some(entries) = out.consolidated_entries_mut() {
        for (path, entry) in entries.iter_mut() {
            let Ok(Node::Array(array)) = Node::from_value(entry.clone()) else {
                continue;
            };
            match f(path, &array) {
                Ok(translated) => *entry = Node::Array(translated).to_value(),
                Err(e) => refused.push((path.clone(), e)),
            }
        }
    }
    (out, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::policy::ChunksPerShard;

    fn array(v: Value) -> ArrayMetadata {
        match Node::from_value(v).unwrap() {
            Node::Array(a) => a,
            Node::Group(_) => panic!("group"),
        }
    }

    fn sharded_doc(codecs_before: Value, codecs_after: Value) -> Value {
        let mut codecs = codecs_before.as_array().unwrap().clone();
        codecs.push(json!({"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 3],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "zstd", "configuration": {"level": 0, "checksum": false}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                             {"name": "crc32c"}],
            "index_location": "start"}}));
        codecs.extend(codecs_after.as_array().unwrap().iter().cloned());
        json!({
            "shape": [10, 7], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": codecs,
            "attributes": {"k": 1}, "dimension_names": ["y", "x"],
            "zarr_format": 3, "node_type": "array", "storage_transformers": []
        })
    }

    #[test]
    fn view_of_a_sharded_array() {
        let meta = array(sharded_doc(json!([]), json!([])));
        let layout = ShardLayout::of(&meta).unwrap().unwrap();
        assert_eq!(layout.chunks_per_shard(), &[2, 2]);
        assert_eq!(layout.index.location, IndexLocation::Start);
        assert_eq!(layout.chunk_grid_shape(), vec![5, 3]);
        assert_eq!(layout.shard_grid_shape(), vec![3, 2]);

        let view = unsharded_view(&meta).unwrap();
        let v = Node::Array(view.clone()).to_value();
        assert_eq!(
            v["chunk_grid"]["configuration"]["chunk_shape"],
            json!([2, 3])
        );
        assert_eq!(v["codecs"][1]["name"], "zstd");
        assert_eq!(v["attributes"], json!({"k": 1}));
        assert_eq!(v["dimension_names"], json!(["y", "x"]));
        assert!(ShardLayout::of(&view).unwrap().is_none());

        // Back again, with the same chunks per shard and index location: the original.
        let again = sharded_with(&view, &[2, 2], IndexLocation::Start).unwrap();
        assert_eq!(
            Node::Array(again).to_value(),
            sharded_doc(json!([]), json!([]))
        );
    }

    #[test]
    fn chunk_location_arithmetic() {
        let layout = ShardLayout::of(&array(sharded_doc(json!([]), json!([]))))
            .unwrap()
            .unwrap();
        let loc = layout.locate(&[3, 1]);
        assert_eq!(
            loc,
            ChunkLocation {
                shard: vec![1, 0],
                pos: 3
            }
        );
        assert_eq!(layout.chunk_coords(&[1, 0], 3), vec![3, 1]);
        // Chunk grid 5x3, 2x2 per shard: interior 4, edges 2 and 1.
        assert_eq!(layout.positions_inside(&[0, 0]), 4);
        assert_eq!(layout.positions_inside(&[0, 1]), 2);
        assert_eq!(layout.positions_inside(&[2, 0]), 2);
        assert_eq!(layout.positions_inside(&[2, 1]), 1);
    }

    #[test]
    fn unshowable_arrays_say_why() {
        let transpose = json!([{"name": "transpose", "configuration": {"order": [1, 0]}}]);
        let before = array(sharded_doc(transpose, json!([])));
        assert_eq!(
            unsharded_view(&before),
            Err(LayoutError::CodecBeforeSharding("transpose".into()))
        );
        let after = array(sharded_doc(json!([]), json!([{"name": "crc32c"}])));
        assert_eq!(
            unsharded_view(&after),
            Err(LayoutError::CodecAfterSharding("crc32c".into()))
        );

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["chunk_grid"] = json!({"name": "rectilinear", "configuration": {}});
        assert_eq!(
            unsharded_view(&array(doc)),
            Err(LayoutError::IrregularGrid("rectilinear".into()))
        );

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["storage_transformers"] = json!([{"name": "x"}]);
        assert_eq!(
            unsharded_view(&array(doc)),
            Err(LayoutError::StorageTransformers)
        );

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["chunk_grid"]["configuration"]["chunk_shape"] = json!([4, 5]);
        let err = unsharded_view(&array(doc)).unwrap_err();
        assert!(matches!(err, LayoutError::InnerShapeDoesNotDivide { .. }));
        assert!(err.is_invalid_metadata());

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["codecs"][0]["configuration"]["index_codecs"] = json!([{"name": "zstd"}]);
        assert_eq!(
            unsharded_view(&array(doc)),
            Err(LayoutError::UnsupportedIndexCodecs("[zstd]".into()))
        );

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["codecs"][0]["configuration"]["chunk_shape"] = json!([2]);
        assert!(matches!(
            unsharded_view(&array(doc)),
            Err(LayoutError::RankMismatch { .. })
        ));

        let view = unsharded_view(&array(sharded_doc(json!([]), json!([])))).unwrap();
        assert_eq!(unsharded_view(&view), Err(LayoutError::NotSharded));

        let mut doc = sharded_doc(json!([]), json!([]));
        doc["codecs"][0]["configuration"]["codecs"] = json!([{"name": "sharding_indexed"}]);
        assert_eq!(
            unsharded_view(&array(doc)),
            Err(LayoutError::NestedSharding)
        );
    }

    #[test]
    fn hostile_chunk_counts_are_refused_not_allocated() {
        for (shard, inner) in [
            (json!([1u64 << 62, 4]), json!([1, 4])),
            (json!([1u64 << 32, 1u64 << 32]), json!([1, 1])),
        ] {
            let mut doc = sharded_doc(json!([]), json!([]));
            doc["chunk_grid"]["configuration"]["chunk_shape"] = shard;
            doc["codecs"][0]["configuration"]["chunk_shape"] = inner;
            let err = ShardLayout::of(&array(doc)).unwrap_err();
            assert!(
                matches!(err, LayoutError::TooManyChunksPerShard(_)),
                "{err}"
            );
            assert!(err.is_invalid_metadata());
        }
        let view = unsharded_view(&array(sharded_doc(json!([]), json!([])))).unwrap();
        assert!(sharded_with(&view, &[0, 1], IndexLocation::End).is_err());
        assert!(sharded_with(&view, &[u64::MAX, 1], IndexLocation::End).is_err());
    }

    #[test]
    fn sharded_from_policy() {
        let view = unsharded_view(&array(sharded_doc(json!([]), json!([])))).unwrap();
        let policy = ShardPolicy::Explicit(ChunksPerShard::PerAxis(vec![5, 1]));
        let sharded = sharded_from(&view, &policy).unwrap();
        let layout = ShardLayout::of(&sharded).unwrap().unwrap();
        assert_eq!(layout.shard_shape, vec![10, 3]);
        assert_eq!(layout.index.location, IndexLocation::End);
        assert_eq!(layout.index.codec, IndexCodec::STANDARD);
        assert_eq!(
            sharded_from(&sharded, &policy),
            Err(LayoutError::AlreadySharded)
        );
        let bad = ShardPolicy::Explicit(ChunksPerShard::PerAxis(vec![5, 1, 1]));
        assert!(matches!(
            sharded_from(&view, &bad),
            Err(LayoutError::Policy(PolicyError::RankMismatch { .. }))
        ));
    }

    #[test]
    fn consolidated_entries_are_translated_one_by_one() {
        let good = sharded_doc(json!([]), json!([]));
        let bad = sharded_doc(json!([]), json!([{"name": "crc32c"}]));
        let group: GroupMetadata = serde_json::from_value(json!({
            "zarr_format": 3, "node_type": "group", "attributes": {"x": 1},
            "consolidated_metadata": {"kind": "inline", "must_understand": false, "metadata": {
                "a": good, "sub": {"zarr_format": 3, "node_type": "group", "attributes": {}},
                "sub/b": bad.clone()}}
        }))
        .unwrap();
        let (view, refused) = translate_consolidated(&group, |_, a| unsharded_view(a));
        let entries = view.consolidated_entries().unwrap();
        assert_eq!(
            entries["a"]["chunk_grid"]["configuration"]["chunk_shape"],
            json!([2, 3])
        );
        assert_eq!(entries["sub/b"], bad);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, "sub/b");
        assert_eq!(view.attributes(), group.attributes());
    }
}

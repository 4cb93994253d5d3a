//! The plan of a conversion, pure (no I/O): what an array becomes (`target_of`: sharded,
//! unsharded, resharded, raw chunks compressed), and for each shard its key and the chunks
//! it takes, by position in its index. Chunks keep their codecs (they become the shard's
//! inner codecs, or the unsharded array's codecs again), so their bytes are copied as they
//! are; only `--compress` changes them, and only where nothing compressed them yet. Shards are named with the array's own key encoding, like its chunks: with the
//! default encoding shard `(i, j)` and chunk `(i, j)` share the key `c/i/j`, which is why
//! an in-place pack must never write a shard over a chunk file it has not taken yet.

use crate::shard::IndexLocation;
use crate::zarr::layout::unsharded_view;
use crate::zarr::{
    ArrayMetadata, ChunkKeyEncoding, LayoutError, NamedConfig, ShardLayout, sharded_with,
};

/// What a conversion makes of the arrays it meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Unsharded arrays become sharded (`shardfs pack`).
    Pack,
    /// Sharded arrays become unsharded, a file per chunk (`shardfs unpack`).
    Unpack,
    /// Sharded arrays get another shard shape (`shardfs reshard`).
    Reshard,
}

/// What the array `meta` becomes under `goal`; `None`: it stays as it is (already in that
/// form, or not concerned). `chunks_per_shard` picks the shards of an unsharded form;
/// `zstd`: raw chunks (no compressor in their codecs) get zstd at that level.
pub fn target_of<E: From<LayoutError>>(
    goal: Goal,
    meta: &ArrayMetadata,
    zstd: Option<i32>,
    chunks_per_shard: impl FnOnce(&ArrayMetadata) -> Result<Vec<u64>, E>,
) -> Result<Option<ArrayMetadata>, E> {
    let sharded = ShardLayout::of(meta)?.is_some();
    let plain = match (goal, sharded) {
        (Goal::Pack, false) => meta.clone(),
        (Goal::Unpack | Goal::Reshard, true) => unsharded_view(meta)?,
        _ => return Ok(None),
    };
    let plain = match zstd {
        Some(level) => compressed(&plain, level).unwrap_or(plain),
        None => plain,
    };
    let target = match goal {
        Goal::Unpack => plain,
        _ => {
            let cps = chunks_per_shard(&plain)?;
            sharded_with(&plain, &cps, IndexLocation::End)?
        }
    };
    Ok((target != *meta).then_some(target))
}

pub use crate::zarr::transparent::compressed;

const ZSTD: &str = "zstd";

/// The zstd level chunks get moving from the codecs `from` to the codecs `to` (both an
/// array's chunks' own, unsharded): `Some` when `to` is `from` and zstd.
pub fn zstd_added(from: &[NamedConfig], to: &[NamedConfig]) -> Option<i32> {
    let (last, rest) = to.split_last()?;
    (last.name == ZSTD && rest == from).then(|| {
        last.config_value("level")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(3) as i32
    })
}

/// What packing one array writes.
#[derive(Debug)]
pub struct PackPlan {
    /// The array's metadata once sharded.
    pub sharded: ArrayMetadata,
    layout: ShardLayout,
    keys: ChunkKeyEncoding,
}

/// One shard: its grid coordinates, its key, and the chunks it takes (`T`: where each is
/// now, its key in an unsharded array by default).
#[derive(Debug, PartialEq, Eq)]
pub struct ShardPlan<T = String> {
    pub shard: Vec<u64>,
    pub key: String,
    /// (position in the shard's index, where the chunk is now), by position: the chunks
    /// that exist.
    pub chunks: Vec<(usize, T)>,
}

/// The plan for packing the unsharded array `meta` with `chunks_per_shard` chunks per
/// shard on each axis, the index at the end (as zarr-python and tensorstore write it).
pub fn plan_pack(meta: &ArrayMetadata, chunks_per_shard: &[u64]) -> Result<PackPlan, LayoutError> {
    PackPlan::of(sharded_with(meta, chunks_per_shard, IndexLocation::End)?)
}

impl PackPlan {
    /// The plan of writing the sharded array `sharded`.
    pub fn of(sharded: ArrayMetadata) -> Result<PackPlan, LayoutError> {
        let layout = ShardLayout::of(&sharded)?.ok_or(LayoutError::NotSharded)?;
        let keys = layout.key_encoding;
        Ok(PackPlan {
            sharded,
            layout,
            keys,
        })
    }

    /// The shards holding the chunks at `chunks` (coordinates and key, each inside the
    /// array), in C order of the shard grid, each with its chunks by position. Only shards
    /// with a chunk are planned: an array of 10^12 mostly missing chunks costs what it
    /// holds, not what its grid spans.
    pub fn shards_of<T: Ord>(
        &self,
        chunks: impl IntoIterator<Item = (Vec<u64>, T)>,
    ) -> Vec<ShardPlan<T>> {
        let mut by_shard: std::collections::BTreeMap<Vec<u64>, Vec<(usize, T)>> =
            Default::default();
        for (coords, key) in chunks {
            let at = self.layout.locate(&coords);
            by_shard.entry(at.shard).or_default().push((at.pos, key));
        }
        by_shard
            .into_iter()
            .map(|(shard, mut chunks)| {
                chunks.sort();
                ShardPlan {
                    key: self.keys.encode(&shard),
                    shard,
                    chunks,
                }
            })
            .collect()
    }

    /// The shards' index format, for the shard builder.
    pub fn index_format(&self) -> &crate::shard::IndexFormat {
        &self.layout.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::Node;

    fn array(shape: &str, chunks: &str, encoding: &str) -> ArrayMetadata {
        let doc = format!(
            r#"{{"zarr_format":3,"node_type":"array","shape":{shape},"data_type":"uint16",
            "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":{chunks}}}}},
            "chunk_key_encoding":{encoding},
            "fill_value":0,"codecs":[{{"name":"bytes","configuration":{{"endian":"little"}}}},
            {{"name":"zstd","configuration":{{"level":3,"checksum":false}}}}]}}"#
        );
        match Node::parse(doc.as_bytes()).unwrap() {
            Node::Array(a) => a,
            Node::Group(_) => unreachable!(),
        }
    }

    /// Every chunk of a 2-D `grid`, keyed as `prefix` + coordinates joined by `sep`, in an
    /// order other than C order.
    fn every_chunk(grid: &[u64], prefix: &str, sep: &str) -> Vec<(Vec<u64>, String)> {
        let mut all = Vec::new();
        for j in (0..grid[1]).rev() {
            for i in 0..grid[0] {
                all.push((vec![i, j], format!("{prefix}{i}{sep}{j}")));
            }
        }
        all
    }

    const DEFAULT: &str = r#"{"name":"default","configuration":{"separator":"/"}}"#;
    const V2_DOT: &str = r#"{"name":"v2","configuration":{"separator":"."}}"#;

    #[test]
    fn each_chunk_goes_to_its_shard_once_and_edge_shards_take_only_what_exists() {
        // A 5x3 array of 2x2 chunks: a 3x2 chunk grid; 2x2 chunks per shard: 2x1 shards.
        let plan = plan_pack(&array("[5,3]", "[2,2]", DEFAULT), &[2, 2]).unwrap();
        let shards = plan.shards_of(every_chunk(&[3, 2], "c/", "/"));
        let keys = |v: &[(usize, &str)]| -> Vec<(usize, String)> {
            v.iter().map(|(p, k)| (*p, k.to_string())).collect()
        };
        assert_eq!(
            shards,
            [
                ShardPlan {
                    shard: vec![0, 0],
                    key: "c/0/0".into(),
                    chunks: keys(&[(0, "c/0/0"), (1, "c/0/1"), (2, "c/1/0"), (3, "c/1/1")]),
                },
                ShardPlan {
                    shard: vec![1, 0],
                    key: "c/1/0".into(),
                    chunks: keys(&[(0, "c/2/0"), (1, "c/2/1")]),
                },
            ]
        );
        let mut all: Vec<String> = shards
            .iter()
            .flat_map(|s| s.chunks.iter().map(|(_, k)| k.clone()))
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 6, "every chunk of the 3x2 grid, once");
    }

    #[test]
    fn only_shards_with_a_chunk_are_planned_however_large_the_grid() {
        let plan = plan_pack(&array("[1000000000000]", "[1]", DEFAULT), &[4]).unwrap();
        let shards = plan.shards_of([(vec![999_999_999_999], "c/999999999999".to_string())]);
        assert_eq!(shards.len(), 1);
        assert_eq!(
            (shards[0].key.as_str(), shards[0].chunks.as_slice()),
            ("c/249999999999", &[(3, "c/999999999999".to_string())][..])
        );
    }

    #[test]
    fn the_sharded_metadata_keeps_the_chunks_codecs_inside_the_shards() {
        let meta = array("[5,3]", "[2,2]", DEFAULT);
        let plan = plan_pack(&meta, &[2, 2]).unwrap();
        let layout = ShardLayout::of(&plan.sharded).unwrap().unwrap();
        assert_eq!(
            (layout.shard_shape.as_slice(), layout.chunk_shape.as_slice()),
            (&[4, 4][..], &[2, 2][..])
        );
        let config = plan.sharded.codecs[0].configuration.as_ref().unwrap();
        assert_eq!(
            config["codecs"],
            serde_json::to_value(&meta.codecs).unwrap(),
            "the inner codecs are the array's: chunk bytes are copied, not re-encoded"
        );
        assert_eq!(plan.index_format().chunks_per_shard, [2, 2]);
    }

    #[test]
    fn the_arrays_key_encoding_names_chunks_and_shards() {
        let plan = plan_pack(&array("[4,4]", "[2,2]", V2_DOT), &[1, 2]).unwrap();
        let shards = plan.shards_of(every_chunk(&[2, 2], "", "."));
        assert_eq!(shards.len(), 2);
        let second = &shards[1];
        assert_eq!(second.key, "1.0");
        assert_eq!(
            second.chunks,
            [(0, "1.0".to_string()), (1, "1.1".to_string())]
        );
    }

    #[test]
    fn a_sharded_array_is_not_packed_again() {
        let plan = plan_pack(&array("[4]", "[2]", DEFAULT), &[2]).unwrap();
        assert!(matches!(
            plan_pack(&plan.sharded, &[2]),
            Err(LayoutError::AlreadySharded)
        ));
    }

    fn raw(encoding: &str) -> ArrayMetadata {
        let mut meta = array("[8,8]", "[2,2]", encoding);
        meta.codecs.truncate(1); // bytes only
        meta
    }

    fn cps(_: &ArrayMetadata) -> Result<Vec<u64>, LayoutError> {
        Ok(vec![2, 2])
    }

    #[test]
    fn each_goal_concerns_only_its_arrays_and_unpack_undoes_pack() {
        let plain = array("[8,8]", "[2,2]", DEFAULT);
        let sharded = target_of(Goal::Pack, &plain, None, cps).unwrap().unwrap();
        assert!(ShardLayout::of(&sharded).unwrap().is_some());
        assert!(
            target_of(Goal::Pack, &sharded, None, cps)
                .unwrap()
                .is_none()
        );
        assert!(
            target_of(Goal::Unpack, &plain, None, cps)
                .unwrap()
                .is_none()
        );
        assert!(
            target_of(Goal::Reshard, &plain, None, cps)
                .unwrap()
                .is_none()
        );
        let back = target_of(Goal::Unpack, &sharded, None, cps)
            .unwrap()
            .unwrap();
        assert_eq!(back, plain, "unpacking gives back the unsharded document");
        // The same shape again is nothing to do; another one is a new sharded document.
        assert!(
            target_of(Goal::Reshard, &sharded, None, cps)
                .unwrap()
                .is_none()
        );
        let other = |_: &ArrayMetadata| Ok::<_, LayoutError>(vec![4, 1]);
        let re = target_of(Goal::Reshard, &sharded, None, other)
            .unwrap()
            .unwrap();
        let layout = ShardLayout::of(&re).unwrap().unwrap();
        assert_eq!(layout.index.chunks_per_shard, [4, 1]);
        assert_eq!(unsharded_view(&re).unwrap(), plain, "the same inner chunks");
    }

    #[test]
    fn zstd_is_added_to_raw_chunks_only() {
        let squeezed = compressed(&raw(DEFAULT), 7).unwrap();
        assert_eq!(zstd_added(&raw(DEFAULT).codecs, &squeezed.codecs), Some(7));
        assert_eq!(zstd_added(&squeezed.codecs, &squeezed.codecs), None);
        // Compressed already (zstd, or anything after `bytes`): left as it is.
        let already = array("[8,8]", "[2,2]", DEFAULT);
        assert!(compressed(&already, 7).is_none());
        let packed = target_of(Goal::Pack, &already, Some(7), cps)
            .unwrap()
            .unwrap();
        assert_eq!(unsharded_view(&packed).unwrap(), already);
        let packed = target_of(Goal::Pack, &raw(V2_DOT), Some(7), cps)
            .unwrap()
            .unwrap();
        assert_eq!(
            unsharded_view(&packed).unwrap(),
            compressed(&raw(V2_DOT), 7).unwrap()
        );
    }
}

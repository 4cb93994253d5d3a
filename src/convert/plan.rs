//! The plan of a pack, pure (no I/O): the sharded metadata of an unsharded array, and for
//! each shard its key and the chunk keys it takes, by position in its index. Chunks keep
//! their codecs (they become the shard's inner codecs), so their bytes are copied as they
//! are. Shards are named with the array's own key encoding, like its chunks: with the
//! default encoding shard `(i, j)` and chunk `(i, j)` share the key `c/i/j`, which is why
//! an in-place pack must never write a shard over a chunk file it has not taken yet.

use crate::grid;
use crate::shard::IndexLocation;
use crate::zarr::{ArrayMetadata, ChunkKeyEncoding, LayoutError, ShardLayout, sharded_with};

/// What packing one array writes.
#[derive(Debug)]
pub struct PackPlan {
    /// The array's metadata once sharded.
    pub sharded: ArrayMetadata,
    layout: ShardLayout,
    keys: ChunkKeyEncoding,
}

/// One shard: its grid coordinates, its key, and the chunks it takes.
#[derive(Debug, PartialEq, Eq)]
pub struct ShardPlan {
    pub shard: Vec<u64>,
    pub key: String,
    /// (position in the shard's index, the chunk's key in the unsharded array), for the
    /// positions inside the array only (an edge shard has fewer).
    pub chunks: Vec<(usize, String)>,
}

/// The plan for packing the unsharded array `meta` with `chunks_per_shard` chunks per
/// shard on each axis, the index at the end (as zarr-python and tensorstore write it).
pub fn plan_pack(meta: &ArrayMetadata, chunks_per_shard: &[u64]) -> Result<PackPlan, LayoutError> {
    let sharded = sharded_with(meta, chunks_per_shard, IndexLocation::End)?;
    let layout = ShardLayout::of(&sharded)?.ok_or(LayoutError::NotSharded)?;
    let keys = layout.key_encoding;
    Ok(PackPlan {
        sharded,
        layout,
        keys,
    })
}

impl PackPlan {
    /// How many shards the array has (each written once, if it holds any chunk).
    pub fn shard_count(&self) -> usize {
        grid::count(&self.layout.shard_grid_shape())
    }

    /// The shard at `index` in C order of the shard grid (`0..shard_count()`).
    pub fn shard(&self, index: usize) -> ShardPlan {
        let shard = grid::unravel(index, &self.layout.shard_grid_shape());
        let chunk_grid = self.layout.chunk_grid_shape();
        let positions = grid::count(self.layout.chunks_per_shard());
        let chunks = (0..positions)
            .filter_map(|pos| {
                let coords = self.layout.chunk_coords(&shard, pos);
                grid::inside(&coords, &chunk_grid).then(|| (pos, self.keys.encode(&coords)))
            })
            .collect();
        ShardPlan {
            key: self.keys.encode(&shard),
            shard,
            chunks,
        }
    }

    /// Every shard, in C order of the shard grid.
    pub fn shards(&self) -> impl Iterator<Item = ShardPlan> + '_ {
        (0..self.shard_count()).map(|i| self.shard(i))
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

    const DEFAULT: &str = r#"{"name":"default","configuration":{"separator":"/"}}"#;
    const V2_DOT: &str = r#"{"name":"v2","configuration":{"separator":"."}}"#;

    #[test]
    fn each_chunk_goes_to_its_shard_once_and_edge_shards_take_only_what_exists() {
        // A 5x3 array of 2x2 chunks: a 3x2 chunk grid; 2x2 chunks per shard: 2x1 shards.
        let plan = plan_pack(&array("[5,3]", "[2,2]", DEFAULT), &[2, 2]).unwrap();
        let shards: Vec<ShardPlan> = plan.shards().collect();
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
        assert_eq!(plan.shard_count(), 2);
        let second = plan.shard(1);
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
}

// The fuzz targets' bodies: everything shardfs parses from untrusted bytes (shard files
// and `zarr.json` in BACKING, names from clients). Each must return, never panic, and keep
// the invariants checked here. Included both by the cargo-fuzz targets (fuzz/fuzz_targets)
// and by the short pass in `tests/hostile_fuzz_short.rs`, so that the two cannot drift apart.

use shardfs::shard::{Endian, IndexCodec, IndexFormat, IndexLocation};
use shardfs::zarr::{
    ChunkKeyEncoding, KeyNode, Node, Separator, ShardLayout, ShardPolicy, sharded_from,
    translate_consolidated, unsharded_view,
};

/// A shard index decoded from arbitrary bytes, under a format chosen by the first bytes.
pub fn shard_index(data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let ndim = (head % 3) as usize + 1;
    if rest.len() < ndim {
        return;
    }
    let (dims, bytes) = rest.split_at(ndim);
    let codec = IndexCodec {
        endian: if head & 0x10 == 0 { Endian::Little } else { Endian::Big },
        crc32c: head & 0x20 == 0,
    };
    let location = if head & 0x40 == 0 {
        IndexLocation::End
    } else {
        IndexLocation::Start
    };
    let format = IndexFormat {
        chunks_per_shard: dims.iter().map(|d| u64::from(*d % 6) + 1).collect(),
        codec,
        location,
    };
    let _ = format.decode_lenient(bytes);
    if let Ok(index) = format.decode(bytes) {
        // Whatever decodes encodes back to the very bytes, and what passes validation
        // against a file length (as every read does) lies inside the file, without overlap.
        for file_len in [0, bytes.len() as u64, 1 << 20, u64::MAX] {
            if format.validate(&index, file_len).is_ok() {
                // Zero-length ranges hold nothing and overlap nothing.
                let mut ranges: Vec<(u64, u64)> = index
                    .present()
                    .filter(|(_, r)| r.nbytes > 0)
                    .map(|(_, r)| (r.offset, r.offset.checked_add(r.nbytes).expect("overflow")))
                    .collect();
                ranges.sort_unstable();
                assert!(ranges.iter().all(|r| r.1 <= file_len), "outside the file");
                assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlap");
            }
        }
        assert_eq!(format.encode(&index), bytes);
    }
}

/// A name from a client, parsed as a chunk key and as a child of the key tree.
pub fn chunk_key(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for enc in [
        ChunkKeyEncoding::Default(Separator::Slash),
        ChunkKeyEncoding::Default(Separator::Dot),
        ChunkKeyEncoding::V2(Separator::Slash),
        ChunkKeyEncoding::V2(Separator::Dot),
    ] {
        for ndim in 0..5 {
            if let Ok(coords) = enc.decode(text, ndim) {
                assert_eq!(coords.len(), ndim);
                assert_eq!(enc.encode(&coords), text, "keys are canonical");
            }
            for part in text.split('/') {
                let _ = enc.child(&KeyNode::Root, part, ndim);
            }
        }
    }
}

/// A `zarr.json` document: parsed, written back, translated both ways.
pub fn metadata(data: &[u8]) {
    let Ok(node) = Node::parse(data) else {
        return;
    };
    let again = Node::parse(&node.to_json_bytes()).expect("what we write, we read");
    assert_eq!(again.to_json_bytes(), node.to_json_bytes(), "round trip");
    match node {
        Node::Array(meta) => {
            if let Ok(Some(layout)) = ShardLayout::of(&meta) {
                let _ = layout.chunk_grid_shape();
                let _ = layout.shard_grid_shape();
            }
            if let Ok(view) = unsharded_view(&meta) {
                let _ = Node::Array(view).to_json_bytes();
            }
            let policy = ShardPolicy::Auto {
                target_bytes: 1 << 20,
            };
            if let Ok(sharded) = sharded_from(&meta, &policy) {
                let back = unsharded_view(&sharded).expect("a sharded form has a view");
                assert_eq!(back.shape, meta.shape);
            }
        }
        Node::Group(group) => {
            let _ = translate_consolidated(&group, |_, a| unsharded_view(a));
        }
    }
}

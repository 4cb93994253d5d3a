//! Shards assembled by shardfs's builder from chunk segments, with the sharded zarr.json from
//! the layout translation, read back by zarr-python and tensorstore.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use bytes::Bytes;
use common::{files_below, run_fixtures, shardfs, stderr, stdout};
use serde_json::Value;
use shardfs::shard::{IndexLocation, ShardBuilder, read_index};
use shardfs::zarr::{
    ArrayMetadata, ChunkKeyEncoding, METADATA_FILE, Node, ShardLayout, ShardPolicy, sharded_from,
    sharded_with,
};

/// How `pack` writes each shard.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    /// In one go from the chunks.
    Fresh,
    /// First a stale shard (wrong bytes at even positions, garbage at every empty position),
    /// then a rebuild over that file which replaces the even positions, keeps the odd ones
    /// and drops the garbage: only a correct merge reads equal.
    OverStale,
}

/// Packs the unsharded array at `src` into a sharded one at `dst`; each chunk is handed to
/// the builder as three segments cut from the chunk file, as the kernel would deliver them.
fn pack(
    src: &Path,
    dst: &Path,
    sharded_meta: impl Fn(&ArrayMetadata) -> ArrayMetadata,
    pass: Pass,
) -> usize {
    let Node::Array(meta) = Node::parse(&fs::read(src.join(METADATA_FILE)).unwrap()).unwrap()
    else {
        panic!("not an array")
    };
    let sharded = sharded_meta(&meta);
    let layout = ShardLayout::of(&sharded).unwrap().unwrap();
    let encoding = ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding).unwrap();
    let mut shards: BTreeMap<Vec<u64>, BTreeMap<usize, Vec<Bytes>>> = BTreeMap::new();
    for key in files_below(src) {
        if key == METADATA_FILE {
            continue;
        }
        let coords = encoding.decode(&key, meta.ndim()).unwrap();
        let data = Bytes::from(fs::read(src.join(&key)).unwrap());
        let third = data.len() / 3;
        let segments = vec![
            data.slice(..third),
            data.slice(third..2 * third),
            data.slice(2 * third..),
        ];
        let loc = layout.locate(&coords);
        shards
            .entry(loc.shard)
            .or_default()
            .insert(loc.pos, segments);
    }
    fs::create_dir_all(dst).unwrap();
    fs::write(
        dst.join(METADATA_FILE),
        Node::Array(sharded).to_json_bytes(),
    )
    .unwrap();
    let n = layout.index.n_chunks();
    let write = |path: &Path, builder: ShardBuilder| {
        let encoded = builder.build().expect("a shard with chunks");
        let mut file = fs::File::create(path).unwrap();
        encoded.write_all_to(&mut file).unwrap();
        assert_eq!(file.metadata().unwrap().len(), encoded.len());
    };
    for (shard, chunks) in &shards {
        let path = dst.join(encoding.encode(shard));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut builder = ShardBuilder::new(layout.index.clone());
        for pos in 0..n {
            match (chunks.get(&pos), pass) {
                (Some(segments), Pass::Fresh) => builder.set(pos, segments.clone()),
                (Some(segments), Pass::OverStale) if pos % 2 == 1 => {
                    builder.set(pos, segments.clone())
                }
                (_, Pass::OverStale) => builder.set(pos, vec![Bytes::from_static(b"stale!")]),
                (None, Pass::Fresh) => {}
            }
        }
        write(&path, builder);
        if pass == Pass::OverStale {
            let old = Bytes::from(fs::read(&path).unwrap());
            let file = fs::File::open(&path).unwrap();
            let index = read_index(&file, old.len() as u64, &layout.index).unwrap();
            let mut builder =
                ShardBuilder::over_existing(layout.index.clone(), &old, &index).unwrap();
            for pos in 0..n {
                match chunks.get(&pos) {
                    Some(segments) if pos % 2 == 0 => builder.set(pos, segments.clone()),
                    Some(_) => {}
                    None => builder.remove(pos),
                }
            }
            write(&path, builder);
        }
    }
    shards.len()
}

/// Chooses the sharded form of an unsharded array.
type Translate = dyn Fn(&ArrayMetadata) -> ArrayMetadata;

fn chunk_bytes(m: &ArrayMetadata) -> u64 {
    let chunk = m.chunk_grid.configuration.as_ref().unwrap()["chunk_shape"].clone();
    let chunk: Vec<u64> = serde_json::from_value(chunk).unwrap();
    chunk.iter().product::<u64>() * m.item_size().unwrap()
}

#[test]
fn shards_built_from_segments_read_equal_in_zarr_python_and_tensorstore() {
    let dir = tempfile::tempdir().unwrap();
    let src_root = dir.path().join("unsharded");
    fs::create_dir_all(&src_root).unwrap();
    run_fixtures(&["unsharded", src_root.to_str().unwrap()]);
    let manifest: Value =
        serde_json::from_slice(&fs::read(src_root.join("manifest.json")).unwrap()).unwrap();

    let mut cases = 0;
    for array in manifest.as_array().unwrap() {
        let name = array["name"].as_str().unwrap();
        let src = Path::new(array["path"].as_str().unwrap());
        let npy = format!("{}.npy", src.display());
        let variants: [(&str, Box<Translate>, Pass); 3] = [
            // Two chunks per shard on every axis, index at the start.
            (
                "start2",
                Box::new(|m| sharded_with(m, &vec![2; m.ndim()], IndexLocation::Start).unwrap()),
                Pass::Fresh,
            ),
            // The same, rebuilt over a stale shard file.
            (
                "rebuilt",
                Box::new(|m| sharded_with(m, &vec![2; m.ndim()], IndexLocation::Start).unwrap()),
                Pass::OverStale,
            ),
            // The auto policy aiming at eight chunks per shard, index at the end (the default).
            (
                "auto",
                Box::new(|m| {
                    let target_bytes = 8 * chunk_bytes(m);
                    sharded_from(m, &ShardPolicy::Auto { target_bytes }).unwrap()
                }),
                Pass::Fresh,
            ),
        ];
        for (variant, f, pass) in variants {
            let dst = dir.path().join(format!("{name}_{variant}"));
            let shards = pack(src, &dst, f, pass);
            assert!(shards > 1, "{name} {variant}: {shards} shards");
            let out = std::process::Command::new(common::python())
                .arg(common::fixtures_script())
                .args(["check-read", dst.to_str().unwrap(), &npy])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} {variant}: {}{}",
                stdout(&out),
                stderr(&out)
            );
            let verify = shardfs(&["verify", dst.to_str().unwrap()]);
            assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
            cases += 1;
        }
    }
    assert_eq!(cases, 12);
}

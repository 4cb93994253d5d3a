//! zarr.json documents written by zarr-python and tensorstore survive a parse/serialise
//! round trip unchanged, and the sharded -> unsharded translation gives exactly what
//! zarr-python writes for the same array unsharded.

mod common;

use std::fs;

use common::run_fixtures;
use serde_json::Value;
use shardfs::shard::IndexLocation;
use shardfs::zarr::{Node, ShardLayout, sharded_with, translate_consolidated, unsharded_view};

fn read_json(path: &str) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

#[test]
fn documents_round_trip_and_translate_to_their_unsharded_twins() {
    let dir = tempfile::tempdir().unwrap();
    run_fixtures(&["metadata", dir.path().to_str().unwrap()]);
    let manifest = read_json(dir.path().join("manifest.json").to_str().unwrap());
    let docs = manifest.as_array().unwrap();
    assert!(docs.len() >= 13);
    let (mut round_trips, mut twins, mut consolidated) = (0, 0, 0);
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap();
        let path = doc["path"].as_str().unwrap();
        let original = read_json(path);
        let node = Node::parse(&fs::read(path).unwrap()).unwrap();
        assert_eq!(node.to_value(), original, "{kind}: {path}");
        let reparsed = Node::parse(&node.to_json_bytes()).unwrap();
        assert_eq!(reparsed, node, "{kind}: {path}");
        round_trips += 1;

        let Some(twin) = doc["unsharded_twin"].as_str() else {
            continue;
        };
        let twin = read_json(twin);
        match &node {
            Node::Array(a) => {
                let view = unsharded_view(a).unwrap();
                assert_eq!(Node::Array(view.clone()).to_value(), twin, "{kind}: {path}");
                // Byte for byte what zarr-python writes, key order and formatting included.
                let twin_bytes = fs::read(doc["unsharded_twin"].as_str().unwrap()).unwrap();
                assert_eq!(
                    String::from_utf8(Node::Array(view.clone()).to_json_bytes()).unwrap(),
                    String::from_utf8(twin_bytes).unwrap(),
                    "{kind}: {path}"
                );
                // And back, with the original's chunks per shard and index location.
                let layout = ShardLayout::of(a).unwrap().unwrap();
                let again =
                    sharded_with(&view, layout.chunks_per_shard(), layout.index.location).unwrap();
                assert_eq!(Node::Array(again).to_value(), original, "{kind}: {path}");
                twins += 1;
            }
            Node::Group(g) => {
                assert!(g.consolidated_entries().unwrap().len() >= 3);
                let (view, refused) = translate_consolidated(g, |_, a| unsharded_view(a));
                assert!(refused.is_empty(), "{refused:?}");
                assert_eq!(Node::Group(view).to_value(), twin, "{kind}: {path}");
                consolidated += 1;
            }
        }
    }
    assert_eq!((twins, consolidated), (5, 1));
    assert_eq!(round_trips, docs.len());
}

#[test]
fn tensorstore_defaults_are_understood() {
    // tensorstore leaves out configuration it considers default: the chunk key encoding's
    // separator and, for "end", the index location.
    let dir = tempfile::tempdir().unwrap();
    run_fixtures(&["metadata", dir.path().to_str().unwrap()]);
    for (name, location) in [
        ("ts_s", IndexLocation::Start),
        ("ts_s_end", IndexLocation::End),
    ] {
        let path = dir.path().join(name).join("zarr.json");
        let raw = read_json(path.to_str().unwrap());
        let Node::Array(a) = Node::parse(&fs::read(&path).unwrap()).unwrap() else {
            panic!("array expected");
        };
        assert!(a.chunk_key_encoding.configuration.is_none());
        let layout = ShardLayout::of(&a).unwrap().unwrap();
        assert_eq!(layout.index.location, location, "{name}");
        if location == IndexLocation::End {
            assert!(
                raw["codecs"][0]["configuration"]
                    .get("index_location")
                    .is_none(),
                "tensorstore wrote the default out: the test no longer covers the default"
            );
        }
        assert_eq!(layout.chunks_per_shard(), &[2, 5]);
        assert_eq!(a.dimension_names(), Some(&serde_json::json!(["row", ""])));
    }
}

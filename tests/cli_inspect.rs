//! `shardfs inspect` and `verify` on shards written natively by zarr-python and tensorstore,
//! compared with an independent numpy reading of every index (tests/py/fixtures.py).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{run_fixtures, shardfs, stderr, stdout};
use serde_json::Value;

struct Native {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    manifest: Vec<Value>,
}

fn native() -> Native {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run_fixtures(&["native", root.to_str().unwrap()]);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    Native {
        _dir: dir,
        root,
        manifest: manifest.as_array().unwrap().clone(),
    }
}

/// Strips the `path` field, which the independent reading does not have.
fn without_path(mut v: Value) -> Value {
    v.as_object_mut().unwrap().remove("path");
    v
}

#[test]
fn inspect_json_matches_an_independent_reading() {
    let fx = native();
    assert_eq!(fx.manifest.len(), 8);
    let mut checked_chunks = 0;
    for array in &fx.manifest {
        let dir = Path::new(array["path"].as_str().unwrap());
        let out = shardfs(&["inspect", "--json", dir.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let listed: Vec<Value> = serde_json::from_str(&stdout(&out)).unwrap();
        let by_key: BTreeMap<String, Value> = listed
            .into_iter()
            .map(|r| {
                let p = r["path"].as_str().unwrap().to_string();
                let key = Path::new(&p).strip_prefix(dir).unwrap().to_string_lossy();
                (key.into_owned(), without_path(r))
            })
            .collect();
        let expected: BTreeMap<String, Value> = array["shards"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(by_key, expected, "array {}", array["name"]);
        for (key, shard) in &expected {
            assert_eq!(shard["crc32c_ok"], Value::Bool(true));
            checked_chunks += shard["chunks"].as_array().unwrap().len();
            // The same through the single-file form.
            let file = dir.join(key);
            let out = shardfs(&["inspect", "--json", file.to_str().unwrap()]);
            assert!(out.status.success(), "{}", stderr(&out));
            let one: Value = serde_json::from_str(&stdout(&out)).unwrap();
            assert_eq!(one["path"].as_str().unwrap(), file.to_str().unwrap());
            assert_eq!(&without_path(one), shard, "{}", file.display());
        }
    }
    assert!(
        checked_chunks > 100,
        "only {checked_chunks} chunks compared"
    );
}

#[test]
fn every_writer_leaves_some_chunks_and_shards_missing() {
    // The fixtures must exercise the missing-chunk marker and absent shard files, or the
    // comparison above proves less than it claims.
    let fx = native();
    for array in &fx.manifest {
        let shards = array["shards"].as_object().unwrap();
        assert!(
            (shards.len() as u64) < array["shard_grid_count"].as_u64().unwrap(),
            "{}: the all-zero last shard should have no file",
            array["name"]
        );
        let origin = shards
            .iter()
            .find(|(key, _)| {
                key.split(['/', '.'])
                    .filter(|p| *p != "c")
                    .all(|p| p == "0")
            })
            .map(|(_, shard)| &shard["chunks"])
            .expect("a shard at the origin");
        assert!(
            !origin.as_array().unwrap().iter().any(|c| c["coords"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x == 0)),
            "{}: the all-zero first chunk should not be stored",
            array["name"]
        );
    }
}

#[test]
fn verify_accepts_native_hierarchies_and_human_inspect_lists_chunks() {
    let fx = native();
    let out = shardfs(&["verify", fx.root.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");

    let array = &fx.manifest[2];
    let dir = array["path"].as_str().unwrap();
    let out = shardfs(&["inspect", dir]);
    assert!(out.status.success());
    let text = stdout(&out);
    let chunk_lines = text
        .lines()
        .filter(|l| l.trim_start().starts_with("chunk "))
        .count();
    let expected: usize = array["shards"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["chunks"].as_array().unwrap().len())
        .sum();
    assert_eq!(chunk_lines, expected);
    assert_eq!(
        text.matches("crc32c ok").count(),
        array["shards"].as_object().unwrap().len()
    );
}

#[test]
fn inspect_usage_errors_exit_2() {
    let fx = native();
    let out = shardfs(&["inspect", fx.root.join("nope").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    // A file with no array above it.
    let out = shardfs(&["inspect", fx.root.join("manifest.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no array zarr.json"),
        "{}",
        stderr(&out)
    );
    let out = shardfs(&["verify", fx.root.join("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

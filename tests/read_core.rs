//! The filesystem core driven directly, as the FUSE adapter would, without a mount:
//! lookups, listings, reads and errnos on natively written shards.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use common::run_fixtures;
use serde_json::Value;
use shardfs::backing::Backing;
use shardfs::core::errno::ToErrno;
use shardfs::core::{DaemonInfo, FileType, FsError, Ino, ROOT, ShardFs};

fn core_over(root: &Path) -> ShardFs {
    ShardFs::new(
        Backing::new(root.to_path_buf()).unwrap(),
        DaemonInfo::default(),
    )
}

/// Looks up a `/`-separated path from the root, as the kernel does, one name at a time.
fn walk(fs: &ShardFs, path: &str) -> Result<Ino, FsError> {
    let mut ino = ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs.lookup(ino, OsStr::new(part))?.ino;
    }
    Ok(ino)
}

fn read_all(fs: &ShardFs, ino: Ino) -> Vec<u8> {
    let opened = fs.open(ino, libc::O_RDONLY, Default::default()).unwrap();
    let mut out = Vec::new();
    loop {
        let part = fs.read(opened.fh, out.len() as u64, 1000).unwrap();
        if part.is_empty() {
            break;
        }
        out.extend_from_slice(&part);
    }
    fs.release(opened.fh).unwrap();
    out
}

fn listing(fs: &ShardFs, ino: Ino) -> Vec<(String, FileType)> {
    let fh = fs.opendir(ino).unwrap();
    let entries = fs.readdir(fh).unwrap();
    fs.releasedir(fh);
    entries
        .iter()
        .map(|e| (e.name.to_string_lossy().into_owned(), e.kind))
        .filter(|(n, _)| n != "." && n != "..")
        .collect()
}

fn native() -> (tempfile::TempDir, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    run_fixtures(&["native", dir.path().to_str().unwrap()]);
    let manifest: Value =
        serde_json::from_slice(&fs::read(dir.path().join("manifest.json")).unwrap()).unwrap();
    (dir, manifest.as_array().unwrap().clone())
}

#[test]
fn chunk_files_hold_exactly_the_bytes_the_index_points_at() {
    let (dir, manifest) = native();
    let fs = core_over(dir.path());
    for array in &manifest {
        let name = array["name"].as_str().unwrap();
        for (key, info) in array["chunk_files"].as_object().unwrap() {
            let ino = walk(&fs, &format!("{name}/{key}")).unwrap();
            let attr = fs.getattr(ino).unwrap();
            assert_eq!(attr.kind, FileType::File);
            assert_eq!(attr.size, info["nbytes"].as_u64().unwrap(), "{name}/{key}");
            // Exactly the bytes at the offset the independent reading found for this key.
            let shard = dir.path().join(name).join(info["shard"].as_str().unwrap());
            let shard_bytes = fs::read(&shard).unwrap();
            let off = info["offset"].as_u64().unwrap() as usize;
            let n = info["nbytes"].as_u64().unwrap() as usize;
            assert_eq!(
                read_all(&fs, ino),
                &shard_bytes[off..off + n],
                "{name}/{key}"
            );
        }
    }
}

#[test]
fn names_outside_the_key_tree_and_grid_are_enoent() {
    let (dir, _) = native();
    let fs = core_over(dir.path());
    for bad in [
        "zp_1d_end_zstd_default/c/0",  // the all-zero chunk, never stored
        "zp_1d_end_zstd_default/c/99", // outside the grid
        "zp_1d_end_zstd_default/c/01", // not canonical
        "zp_1d_end_zstd_default/d",
        "zp_2d_start_raw_v2dot/9.9",
        "nothing",
    ] {
        let err = walk(&fs, bad).unwrap_err();
        assert_eq!(err.to_errno(), libc::ENOENT, "{bad}: {err}");
    }
    // A chunk file is not a directory.
    let err = walk(&fs, "zp_1d_end_zstd_default/c/1/x").unwrap_err();
    assert_eq!(err.to_errno(), libc::ENOTDIR);
}

#[test]
fn listings_follow_the_key_tree() {
    let (dir, manifest) = native();
    let fs = core_over(dir.path());
    // default "/": the array directory holds zarr.json and c; c holds chunk files.
    let arr = walk(&fs, "zp_1d_end_zstd_default").unwrap();
    assert_eq!(
        listing(&fs, arr),
        vec![
            ("c".to_string(), FileType::Dir),
            ("zarr.json".to_string(), FileType::File)
        ]
    );
    let c = walk(&fs, "zp_1d_end_zstd_default/c").unwrap();
    let names: Vec<String> = listing(&fs, c).into_iter().map(|(n, _)| n).collect();
    let mut expected: Vec<u64> = manifest[0]["chunk_files"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.trim_start_matches("c/").parse().unwrap())
        .collect();
    expected.sort();
    assert_eq!(
        names,
        expected.iter().map(u64::to_string).collect::<Vec<_>>()
    );
    // v2 ".": every chunk is a file in the array directory.
    let arr = walk(&fs, "zp_2d_start_raw_v2dot").unwrap();
    let files = listing(&fs, arr);
    assert_eq!(
        files.len(),
        manifest[1]["chunk_files"].as_object().unwrap().len() + 1
    );
    assert!(files.iter().all(|(_, t)| *t == FileType::File));
}

#[test]
fn inodes_are_reused_while_held_and_metadata_is_translated() {
    let (dir, _) = native();
    let fs = core_over(dir.path());
    let a = walk(&fs, "zp_1d_end_zstd_default/c/1").unwrap();
    let b = walk(&fs, "zp_1d_end_zstd_default/c/1").unwrap();
    assert_eq!(a, b);
    let doc = walk(&fs, "zp_1d_end_zstd_default/zarr.json").unwrap();
    let text = read_all(&fs, doc);
    assert_eq!(fs.getattr(doc).unwrap().size, text.len() as u64);
    let v: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        v["chunk_grid"]["configuration"]["chunk_shape"],
        serde_json::json!([4])
    );
    // Reading a directory is EISDIR; an unknown handle is EBADF.
    let c = walk(&fs, "zp_1d_end_zstd_default/c").unwrap();
    assert_eq!(
        fs.open(c, libc::O_RDONLY, Default::default())
            .unwrap_err()
            .to_errno(),
        libc::EISDIR
    );
    assert_eq!(fs.read(9999, 0, 10).unwrap_err().to_errno(), libc::EBADF);
}

#[test]
fn a_damaged_shard_is_eio_for_its_chunks_only() {
    let (dir, manifest) = native();
    let shard = dir.path().join("zp_1d_end_zstd_default/c/1");
    let mut bytes = fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    fs::write(&shard, bytes).unwrap();
    let fs = core_over(dir.path());
    for (key, info) in manifest[0]["chunk_files"].as_object().unwrap() {
        let ino = walk(&fs, &format!("zp_1d_end_zstd_default/{key}")).unwrap();
        let opened = fs.open(ino, libc::O_RDONLY, Default::default());
        if info["shard"] == "c/1" {
            assert_eq!(opened.unwrap_err().to_errno(), libc::EIO, "{key}");
        } else {
            assert!(opened.is_ok(), "{key}");
        }
    }
}

/// The listing of every key directory of `array`, as the set of chunk `keys` (`/`
/// separated, relative to the array) says it must be: each directory lists the next part
/// of the keys below it, a file when that part is the last.
fn assert_key_listings(fs: &ShardFs, array: &str, keys: &std::collections::BTreeSet<String>) {
    use std::collections::{BTreeMap, BTreeSet};
    // (name, is a directory)
    let mut dirs: BTreeMap<String, BTreeSet<(String, bool)>> = BTreeMap::new();
    for key in keys {
        let parts: Vec<&str> = key.split('/').collect();
        for depth in 0..parts.len() {
            let kind = depth + 1 < parts.len();
            let dir = parts[..depth].join("/");
            let entry = (parts[depth].to_string(), kind);
            dirs.entry(dir).or_default().insert(entry);
        }
    }
    for (dir, expected) in &dirs {
        let ino = walk(fs, &format!("{array}/{dir}")).unwrap();
        let got: BTreeSet<(String, bool)> = listing(fs, ino)
            .into_iter()
            .filter(|(n, _)| n != "zarr.json")
            .map(|(n, kind)| (n, kind == FileType::Dir))
            .collect();
        assert_eq!(&got, expected, "listing of {array}/{dir}");
    }
}

#[test]
fn key_listings_find_entries_that_only_later_shards_hold() {
    let (dir, manifest) = native();
    let fs = core_over(dir.path());
    for array in &manifest {
        let name = array["name"].as_str().unwrap();
        let keys: std::collections::BTreeSet<String> = array["chunk_files"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !k.contains('.'))
            .cloned()
            .collect();
        if !keys.is_empty() {
            assert_key_listings(&fs, name, &keys);
        }
    }
    // The 4-d array (chunk grid 3x3x3x2, 2x2x2x1 chunks per shard): take out of its first
    // shard every chunk whose first coordinate is 1. A listing that stopped at the first
    // shard of a group would then miss the `1` that the other shards still hold.
    let name = "zp_4d_start_zstd_v2slash";
    let mut keys: std::collections::BTreeSet<String> = manifest[3]["chunk_files"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let first_shard: Vec<String> = keys
        .iter()
        .filter(|k| {
            let c: Vec<u64> = k.split('/').map(|p| p.parse().unwrap()).collect();
            c[0] == 1 && c[1] < 2 && c[2] < 2 && c[3] == 0
        })
        .cloned()
        .collect();
    assert!(!first_shard.is_empty());
    let unlink = |key: &str| {
        let (parent, leaf) = key.rsplit_once('/').unwrap();
        let p = walk(&fs, &format!("{name}/{parent}")).unwrap();
        fs.unlink(
            p,
            OsStr::new(leaf),
            shardfs::core::fs::namespace::Caller::daemon(),
        )
        .unwrap();
    };
    for key in &first_shard {
        unlink(key);
        keys.remove(key);
    }
    assert!(keys.iter().any(|k| k.starts_with("1/")));
    assert_key_listings(&fs, name, &keys);
    // And with no chunk of first coordinate 1 left anywhere, `1` is gone from the root.
    let rest: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("1/"))
        .cloned()
        .collect();
    for key in &rest {
        unlink(key);
        keys.remove(key);
    }
    assert_key_listings(&fs, name, &keys);
    let root = walk(&fs, name).unwrap();
    assert!(!listing(&fs, root).iter().any(|(n, _)| n == "1"));
}

//! `shardfs verify` on damaged copies of natively written arrays: each fault is reported
//! with the file and the right message, exit status 1, and no panic.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{copy_tree, run_fixtures, shardfs, stderr, stdout};

struct Case {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

/// A fresh copy of two natively written arrays: `end` (zarr-python, 1-d, index at the end,
/// 3 chunks per shard) and `start` (zarr-python, 2-d, index at the start, 4 per shard).
fn fresh() -> Case {
    static NATIVE: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, native) = NATIVE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        run_fixtures(&["native", root.to_str().unwrap()]);
        (dir, root)
    });
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    copy_tree(&native.join("zp_1d_end_zstd_default"), &root.join("end"));
    copy_tree(&native.join("zp_2d_start_raw_v2dot"), &root.join("start"));
    let out = shardfs(&["verify", root.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "undamaged copy: {}",
        stdout(&out)
    );
    Case { _dir: dir, root }
}

const END_N: u64 = 3;
const START_N: u64 = 4;

/// Rewrites one index entry of a shard and fixes the checksum, so that only the range is
/// wrong.
fn set_entry(path: &Path, n: u64, at_end: bool, pos: u64, offset: u64, nbytes: u64) {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = file.metadata().unwrap().len();
    let index_at = if at_end { len - (16 * n + 4) } else { 0 };
    let mut body = vec![0u8; 16 * n as usize];
    file.read_exact_at(&mut body, index_at).unwrap();
    let e = 16 * pos as usize;
    body[e..e + 8].copy_from_slice(&offset.to_le_bytes());
    body[e + 8..e + 16].copy_from_slice(&nbytes.to_le_bytes());
    file.write_all_at(&body, index_at).unwrap();
    file.write_all_at(&crc32c::crc32c(&body).to_le_bytes(), index_at + 16 * n)
        .unwrap();
}

fn set_len(path: &Path, len: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn entry(path: &Path, n: u64, at_end: bool, pos: u64) -> (u64, u64) {
    let data = fs::read(path).unwrap();
    let index_at = if at_end {
        data.len() - (16 * n as usize + 4)
    } else {
        0
    };
    let e = index_at + 16 * pos as usize;
    let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
    (word(e), word(e + 8))
}

fn assert_one_problem(case: &Case, file: &Path, fragment: &str) {
    let out = shardfs(&["verify", case.root.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {text}\nstderr: {}",
        stderr(&out)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one problem expected: {text}");
    assert!(
        lines[0].starts_with(&format!("{}: ", file.display())),
        "names {}: {text}",
        file.display()
    );
    assert!(lines[0].contains(fragment), "{fragment:?} not in {text}");
}

#[test]
fn flipped_crc_byte() {
    let case = fresh();
    let shard = case.root.join("end/c/1");
    let mut data = fs::read(&shard).unwrap();
    let last = data.len() - 1;
    data[last] ^= 0x01;
    fs::write(&shard, data).unwrap();
    assert_one_problem(&case, &shard, "index checksum mismatch");
}

#[test]
fn truncated_shards() {
    let case = fresh();
    // Index at the end: too little left for an index.
    let shard = case.root.join("end/c/0");
    set_len(&shard, 20);
    assert_one_problem(&case, &shard, "shorter than its 52-byte index");

    // Index at the start: the index survives, the chunks it points to do not.
    let case = fresh();
    let shard = case.root.join("start/1.1");
    let len = fs::metadata(&shard).unwrap().len();
    set_len(&shard, len - 3);
    assert_one_problem(&case, &shard, "past the end");
}

#[test]
fn index_range_past_end_of_file() {
    let case = fresh();
    let shard = case.root.join("start/0.1");
    let len = fs::metadata(&shard).unwrap().len();
    let (_, nbytes) = entry(&shard, START_N, false, 0);
    set_entry(&shard, START_N, false, 0, len - 1, nbytes);
    assert_one_problem(&case, &shard, "lies past the end of the");
}

#[test]
fn overlapping_ranges() {
    let case = fresh();
    let shard = case.root.join("end/c/1");
    let (off0, nbytes0) = entry(&shard, END_N, true, 0);
    set_entry(&shard, END_N, true, 1, off0 + 1, nbytes0.max(2) - 1);
    assert_one_problem(&case, &shard, "overlapping byte ranges");
}

#[test]
fn garbage_metadata() {
    let case = fresh();
    let doc = case.root.join("start/zarr.json");
    fs::write(&doc, b"{\"shape\": [10, 7], \"zarr_format\": 3, ").unwrap();
    assert_one_problem(&case, &doc, "not valid JSON");

    let case = fresh();
    let doc = case.root.join("end/zarr.json");
    fs::write(
        &doc,
        br#"{"zarr_format": 3, "node_type": "array", "shape": "wide"}"#,
    )
    .unwrap();
    assert_one_problem(&case, &doc, "invalid array metadata");

    let case = fresh();
    let doc = case.root.join("end/zarr.json");
    let text = fs::read_to_string(&doc).unwrap();
    // An inner chunk shape that does not divide the shard shape.
    let broken = text.replacen(
        "\"chunk_shape\": [\n        12\n      ]",
        "\"chunk_shape\": [\n        13\n      ]",
        1,
    );
    assert_ne!(text, broken, "fixture zarr.json has an unexpected form");
    fs::write(&doc, broken).unwrap();
    assert_one_problem(&case, &doc, "does not divide");
}

#[test]
fn shard_outside_the_grid() {
    let case = fresh();
    let stray = case.root.join("end/c/9");
    fs::copy(case.root.join("end/c/0"), &stray).unwrap();
    assert_one_problem(&case, &stray, "outside the shard grid");
}

#[test]
fn realistic_truncation_of_an_index_at_the_end() {
    // Cutting a few bytes off the end leaves garbage where the index should be: reported
    // as a checksum mismatch, not accepted.
    let case = fresh();
    let shard = case.root.join("end/c/2");
    let len = fs::metadata(&shard).unwrap().len();
    set_len(&shard, len - 3);
    assert_one_problem(&case, &shard, "index checksum mismatch");
}

#[test]
fn half_missing_index_entry() {
    let case = fresh();
    let shard = case.root.join("start/0.0");
    let (_, nbytes) = entry(&shard, START_N, false, 1);
    set_entry(&shard, START_N, false, 1, u64::MAX, nbytes);
    assert_one_problem(&case, &shard, "half missing");
}

#[test]
fn broken_consolidated_entry_and_unsharded_metadata() {
    let case = fresh();
    let group = case.root.join("zarr.json");
    fs::write(
        &group,
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {},
            "consolidated_metadata": {"kind": "inline", "must_understand": false,
              "metadata": {"end": {"zarr_format": 3, "node_type": "array", "shape": 7}}}}"#,
    )
    .unwrap();
    assert_one_problem(&case, &group, "consolidated entry \"end\"");

    let case = fresh();
    let u = case.root.join("unsharded");
    fs::create_dir(&u).unwrap();
    let doc = u.join("zarr.json");
    fs::write(
        &doc,
        br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [0]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes"}]}"#,
    )
    .unwrap();
    assert_one_problem(&case, &doc, "zero extent");
}

#[test]
fn hostile_chunks_per_shard_is_a_problem_not_a_crash() {
    let case = fresh();
    let doc = case.root.join("end/zarr.json");
    let text = fs::read_to_string(&doc).unwrap();
    let hostile = text.replacen(
        "\"chunk_shape\": [\n        12\n      ]",
        "\"chunk_shape\": [\n        4611686018427387904\n      ]",
        1,
    );
    assert_ne!(text, hostile);
    fs::write(&doc, hostile).unwrap();
    assert_one_problem(&case, &doc, "inner chunks per shard");
    let out = shardfs(&[
        "inspect",
        "--json",
        case.root.join("end/c/0").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Whether zarr-python and tensorstore each read the whole array at `array` (one line
/// each: "ok" or the error's type).
fn readers_read(array: &Path) -> (bool, bool) {
    let code = "import sys, zarr, tensorstore as ts\n\
                p = sys.argv[1]\n\
                try:\n    zarr.open_array(p, mode='r')[...]; print('ok')\n\
                except Exception as e: print(type(e).__name__)\n\
                try:\n    ts.open({'driver': 'zarr3', 'kvstore': {'driver': 'file', 'path': p}}).result().read().result(); print('ok')\n\
                except Exception as e: print(type(e).__name__)";
    let out = common::python_run(&["-c", code, array.to_str().unwrap()], "readers");
    let lines: Vec<&str> = out.lines().collect();
    (lines[0] == "ok", lines[1] == "ok")
}

/// What makes a reader refuse an array's document is a problem of `verify` (each refused
/// by zarr-python, shown alongside): an unknown data type, a fill value outside its type,
/// dimension names of the wrong length, a codec no reader knows.
#[test]
fn what_readers_refuse_in_a_document_is_a_problem() {
    let cases: [(&str, serde_json::Value, &str); 4] = [
        ("data_type", serde_json::json!("uint12"), "uint12"),
        ("fill_value", serde_json::json!(70000), "70000"),
        ("dimension_names", serde_json::json!(["x", "y"]), "2 names"),
        ("codecs", serde_json::Value::Null, "\"lz5\""),
    ];
    for (field, value, fragment) in cases {
        let case = fresh();
        let doc = case.root.join("end/zarr.json");
        let mut d: serde_json::Value = serde_json::from_slice(&fs::read(&doc).unwrap()).unwrap();
        match field {
            // The fill value of a uint16 array (the fixture's chunks are compressed: their
            // size says nothing of the type).
            "fill_value" => {
                d["data_type"] = serde_json::json!("uint16");
                d["fill_value"] = value;
            }
            "codecs" => {
                let inner = &mut d["codecs"][0]["configuration"]["codecs"];
                inner
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"name": "lz5"}));
            }
            _ => d[field] = value,
        }
        fs::write(&doc, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        assert_one_problem(&case, &doc, fragment);
        assert!(
            !readers_read(&case.root.join("end")).0,
            "zarr-python reads {field}"
        );
    }
}

/// An empty shard file (a power cut before its data was synced) is a problem: tensorstore
/// refuses the array (DATA_LOSS).
#[test]
fn an_empty_shard_file_is_a_problem() {
    let case = fresh();
    let shard = case.root.join("end/c/1");
    set_len(&shard, 0);
    assert_one_problem(&case, &shard, "empty shard file");
    assert!(
        !readers_read(&case.root.join("end")).1,
        "tensorstore reads it"
    );
}

/// A chunk whose bytes no longer match its inner crc32c is a problem, named by its chunk.
#[test]
fn an_inner_checksum_mismatch_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let array = dir.path().join("a");
    let code = "import sys, zarr, numpy as np\n\
                a = zarr.create_array(sys.argv[1], shape=(8,), chunks=(2,), shards=(4,), \
                dtype='uint8', compressors=[zarr.codecs.Crc32cCodec()], fill_value=0)\n\
                a[:] = np.arange(1, 9, dtype='uint8')";
    common::python_run(&["-c", code, array.to_str().unwrap()], "crc32c array");
    let out = shardfs(&["verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "undamaged: {}", stdout(&out));
    // The second chunk of shard 1 (elements 6 and 7): its data, not its checksum.
    let shard = array.join("c/1");
    let (offset, _) = entry(&shard, 2, true, 1);
    let file = fs::OpenOptions::new().write(true).open(&shard).unwrap();
    file.write_all_at(&[0xEE], offset).unwrap();
    let out = shardfs(&["verify", dir.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("chunk [3] does not match its crc32c"),
        "{text}"
    );
    assert!(!readers_read(&array).0, "zarr-python reads it");
}

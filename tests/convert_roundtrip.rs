//! `shardfs unpack` and `shardfs reshard`, and `--compress zstd`: arrays written by
//! zarr-python and tensorstore (1-D to 4-D, partial edge chunks, missing chunks, the index
//! at the end and at the start, '/' and '.' keys) go through pack → reshard → unpack, into
//! a destination and in place, and read equal in both clients at every step; unpacking
//! gives back the very chunk files that were packed (bytes copied, never re-encoded); a
//! conversion in place killed anywhere is finished by running it again; a damaged shard is
//! refused before anything is written.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::convert::{Tmpfs, cases, contents, killed_anywhere, leftovers, s, source};
use common::{shardfs, stderr, stdout};

/// `out`'s summary begins with `prefix`.
fn says(out: &Output, prefix: &str) {
    assert!(stdout(out).starts_with(prefix), "{}", stdout(out));
}

fn ok(args: &[&str]) -> Output {
    let out = shardfs(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    out
}

/// `compare` of pack_cases.py: every array reads equal in both clients; by array, whether
/// it is sharded in `dst`.
fn sharded_after(src: &Path, dst: &Path) -> Vec<(String, bool)> {
    let report: serde_json::Value =
        serde_json::from_str(&cases(&["compare", s(src), s(dst)])).unwrap();
    let report = report.as_object().unwrap();
    assert_eq!(report.len(), 7, "every array of the source: {report:?}");
    report
        .iter()
        .map(|(name, r)| (name.clone(), r["sharded_after"] == true))
        .collect()
}

fn document(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("zarr.json")).unwrap()).unwrap()
}

/// The arrays the source holds unsharded, whose chunk files unpacking must give back.
const UNSHARDED: [&str; 5] = ["zp/one", "zp/two", "zp/three", "zp/four", "ts/arr"];

/// Each of `UNSHARDED` in `back` holds the same chunk files as in `src`, byte for byte,
/// and the same document (as JSON: its layout may differ).
fn the_same_chunk_files(src: &Path, back: &Path) {
    for name in UNSHARDED {
        let (a, b) = (src.join(name), back.join(name));
        let files = |d: &Path| {
            let mut all = contents(d);
            all.remove(Path::new("zarr.json"));
            all
        };
        let (before, after) = (files(&a), files(&b));
        assert!(!before.is_empty(), "{name}");
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            after.keys().collect::<Vec<_>>(),
            "{name}: the same chunk keys"
        );
        assert!(
            before == after,
            "{name}: the same bytes in every chunk file"
        );
        assert_eq!(document(&a), document(&b), "{name}: the same document");
    }
}

/// The chunks per shard of a sharded array's document.
fn chunks_per_shard(dir: &Path) -> Vec<u64> {
    let doc = document(dir);
    let outer = &doc["chunk_grid"]["configuration"]["chunk_shape"];
    let inner = &doc["codecs"][0]["configuration"]["chunk_shape"];
    let dims = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    dims(outer)
        .iter()
        .zip(dims(inner))
        .map(|(o, i)| o / i)
        .collect()
}

#[test]
fn pack_reshard_unpack_into_a_destination_reads_equal_and_gives_back_the_chunk_files() {
    let (dir, src) = source();
    let before = contents(&src);
    let at = |n: &str| dir.path().join(n);
    ok(&["pack", s(&src), s(&at("packed")), "--chunks-per-shard", "2"]);
    assert!(sharded_after(&src, &at("packed")).iter().all(|(_, sh)| *sh));
    let out = ok(&[
        "reshard",
        s(&at("packed")),
        s(&at("resharded")),
        "--chunks-per-shard",
        "3",
    ]);
    says(&out, "resharded 7 arrays: ");
    assert!(
        sharded_after(&src, &at("resharded"))
            .iter()
            .all(|(_, sh)| *sh)
    );
    assert_eq!(chunks_per_shard(&at("resharded/zp/four")), [3, 3, 3, 3]);
    assert_eq!(chunks_per_shard(&at("resharded/ts/start")), [3, 3, 3]);
    let verify = shardfs(&["verify", s(&at("resharded"))]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    let out = ok(&["unpack", s(&at("resharded")), s(&at("unpacked"))]);
    says(&out, "unpacked 7 arrays: ");
    assert!(
        sharded_after(&src, &at("unpacked"))
            .iter()
            .all(|(_, sh)| !*sh)
    );
    the_same_chunk_files(&src, &at("unpacked"));
    // Straight from the source: the arrays sharded there (index at the end and at the
    // start) are resharded and unpacked; the unsharded ones are copied as they are.
    ok(&[
        "reshard",
        s(&src),
        s(&at("direct")),
        "--chunks-per-shard",
        "4",
    ]);
    let direct = sharded_after(&src, &at("direct"));
    assert_eq!(direct.iter().filter(|(_, sh)| *sh).count(), 2, "{direct:?}");
    assert_eq!(chunks_per_shard(&at("direct/sharded")), [4, 4]);
    assert_eq!(chunks_per_shard(&at("direct/ts/start")), [4, 4, 4]);
    the_same_chunk_files(&src, &at("direct"));
    let start = src.join("ts/start");
    ok(&[
        "reshard",
        s(&start),
        s(&at("one")),
        "--shard-shape",
        "12,8,9",
    ]);
    assert_eq!(chunks_per_shard(&at("one")), [3, 2, 3]);
    ok(&["unpack", s(&src), s(&at("direct_unpacked"))]);
    assert!(
        sharded_after(&src, &at("direct_unpacked"))
            .iter()
            .all(|(_, sh)| !*sh)
    );
    the_same_chunk_files(&src, &at("direct_unpacked"));
    assert_eq!(contents(&src), before, "the source is never changed");
}

#[test]
fn pack_reshard_unpack_in_place_reads_equal_at_each_step_and_leaves_nothing_behind() {
    let (dir, src) = source();
    let work = dir.path().join("work");
    common::copy_tree(&src, &work);
    ok(&["pack", s(&work), "--chunks-per-shard", "2"]);
    assert!(sharded_after(&src, &work).iter().all(|(_, sh)| *sh));
    ok(&["reshard", s(&work), "--chunks-per-shard", "3"]);
    assert!(sharded_after(&src, &work).iter().all(|(_, sh)| *sh));
    assert_eq!(chunks_per_shard(&work.join("zp/two")), [3, 3]);
    let verify = shardfs(&["verify", s(&work)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    // Once more with the same shape: nothing to do.
    let out = ok(&["reshard", s(&work), "--chunks-per-shard", "3"]);
    says(&out, "resharded 0 arrays");
    ok(&["unpack", s(&work)]);
    assert!(sharded_after(&src, &work).iter().all(|(_, sh)| !*sh));
    the_same_chunk_files(&src, &work);
    assert!(leftovers(&work).is_empty(), "{:?}", leftovers(&work));
}

/// The crash harness on a packed copy of the source, with `command` in place.
fn killed_in_place(command: &[&str], trials: &str) {
    let (dir, src) = source();
    let packed = dir.path().join("packed");
    ok(&["pack", s(&src), s(&packed), "--chunks-per-shard", "2"]);
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    killed_anywhere(&packed, &work, command, trials, "11");
}

fn trials() -> String {
    std::env::var("SHARDFS_PACK_TRIALS").unwrap_or_else(|_| "30".into())
}

#[test]
fn an_unpack_in_place_killed_anywhere_reads_equal_and_a_rerun_finishes_it() {
    killed_in_place(&["unpack"], &trials());
}

#[test]
fn a_reshard_in_place_killed_anywhere_reads_equal_and_a_rerun_finishes_it() {
    killed_in_place(&["reshard", "--chunks-per-shard", "3"], &trials());
}

#[test]
fn an_unpack_in_place_on_a_full_disk_fails_clearly_loses_nothing_and_finishes_later() {
    let (dir, src) = source();
    let fs = Tmpfs::mount(&dir.path().join("small"), "16m");
    let root = fs.0.join("data");
    ok(&["pack", s(&src), s(&root), "--chunks-per-shard", "2"]);
    // Chunk files take a page each: far more room than the shards they come from.
    fs.resize(&format!("{}", fs.used() + 16 * 1024));
    let out = shardfs(&["unpack", s(&root)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        stderr(&out)
    );
    cases(&["reads", s(&src), s(&root)]);
    fs.resize("16m");
    ok(&["unpack", s(&root)]);
    assert!(sharded_after(&src, &root).iter().all(|(_, sh)| !*sh));
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

#[test]
fn a_damaged_shard_is_refused_before_anything_is_written() {
    let (dir, src) = source();
    let shard = src.join("sharded/c/1/0");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // the index checksum no longer matches
    std::fs::write(&shard, &bytes).unwrap();
    let before = contents(&src);
    for command in ["unpack", "reshard"] {
        let dst = dir.path().join(command);
        let out = shardfs(&[command, s(&src), s(&dst), "--jobs", "1"]);
        assert_eq!(out.status.code(), Some(1), "{command}: {}", stdout(&out));
        assert!(
            stderr(&out).contains("sharded/c/1/0: a damaged shard"),
            "{command}: {}",
            stderr(&out)
        );
        assert!(
            !dst.exists(),
            "{command}: nothing written, DST not left behind"
        );
        // In place (without the top's consolidated metadata, `sharded` may go alone).
        let out = shardfs(&[command, s(&src.join("sharded"))]);
        assert_ne!(out.status.code(), Some(0), "{command} in place");
        assert_eq!(contents(&src), before, "{command}: nothing changed");
    }
}

#[test]
fn a_dry_run_of_unpack_and_reshard_prints_the_plan_and_writes_nothing() {
    let (dir, src) = source();
    let before = contents(&src);
    let out = ok(&["unpack", s(&src), "--dry-run"]);
    assert!(
        stdout(&out).contains("sharded: 16 chunks into 16 chunk files"),
        "{}",
        stdout(&out)
    );
    let dst = dir.path().join("dst");
    let out = ok(&[
        "reshard",
        s(&src),
        s(&dst),
        "--chunks-per-shard",
        "4",
        "--dry-run",
    ]);
    assert!(
        stdout(&out).contains("sharded: 16 chunks into 1 shards of 4x4 chunks"),
        "{}",
        stdout(&out)
    );
    assert!(!dst.exists());
    assert_eq!(contents(&src), before);
}

/// A raw (uncompressed) float32 array of smooth values (whole numbers: compressible), written
/// by zarr-python.
fn smooth_raw_array(at: &Path) {
    let script = format!(
        r#"
import numpy as np, zarr
x = np.linspace(0, 8 * np.pi, 64 * 48 * 40, dtype="float32").reshape(64, 48, 40)
a = zarr.create_array("{}", shape=x.shape, chunks=(16, 16, 20), dtype="float32",
                      compressors=None, fill_value=0)
a[...] = np.round(np.sin(x) * 100)  # smooth, and few distinct values
print("ok")
"#,
        s(at)
    );
    common::python_stdout(&script, "a smooth raw array");
}

fn inner_codecs(dir: &Path) -> serde_json::Value {
    document(dir)["codecs"][0]["configuration"]["codecs"].clone()
}

fn bytes_below(dir: &Path) -> usize {
    contents(dir).values().map(Vec::len).sum()
}

#[test]
fn compress_zstd_compresses_raw_chunks_only_and_both_clients_read_them() {
    let (dir, src) = source();
    let packed = dir.path().join("packed");
    ok(&[
        "pack",
        s(&src),
        s(&packed),
        "--chunks-per-shard",
        "2",
        "--compress",
        "zstd:5",
    ]);
    assert!(sharded_after(&src, &packed).iter().all(|(_, sh)| *sh));
    let zstd5 =
        serde_json::json!({"name": "zstd", "configuration": {"level": 5, "checksum": false}});
    for name in ["zp/two", "zp/four"] {
        let mut raw = document(&src.join(name))["codecs"].clone();
        raw.as_array_mut().unwrap().push(zstd5.clone());
        assert_eq!(
            inner_codecs(&packed.join(name)),
            raw,
            "{name}: raw, now zstd"
        );
    }
    for name in ["zp/one", "zp/three", "ts/arr"] {
        assert_eq!(
            inner_codecs(&packed.join(name)),
            document(&src.join(name))["codecs"],
            "{name}: compressed already, left as it is"
        );
    }
    let verify = shardfs(&["verify", s(&packed)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    // Smooth float32 data: stored much smaller, read equal; in place too.
    let raw = dir.path().join("raw");
    smooth_raw_array(&raw);
    let squeezed = dir.path().join("squeezed");
    let out = ok(&["pack", s(&raw), s(&squeezed), "--compress", "zstd"]);
    assert!(stdout(&out).contains(" of that)"), "{}", stdout(&out));
    let (before, after) = (bytes_below(&raw), bytes_below(&squeezed));
    assert!(after * 2 < before, "{after} bytes stored for {before}");
    reads_equal(&raw, &squeezed);
    ok(&["pack", s(&raw), "--compress", "zstd:1"]);
    assert!(bytes_below(&raw) * 2 < before, "in place");
    reads_equal(&squeezed, &raw);
    let chunks = dir.path().join("chunks");
    ok(&["unpack", s(&raw), s(&chunks)]);
    assert_eq!(
        document(&chunks)["codecs"][1]["name"],
        "zstd",
        "chunks stay compressed"
    );
    reads_equal(&squeezed, &chunks);
}

/// `b` reads equal to `a` in zarr-python and tensorstore.
fn reads_equal(a: &Path, b: &Path) {
    let script = format!(
        r#"
import numpy as np, tensorstore as ts, zarr
a = zarr.open_array("{a}", mode="r")[...]
assert np.array_equal(a, zarr.open_array("{b}", mode="r")[...])
t = ts.open({{"driver": "zarr3", "kvstore": {{"driver": "file", "path": "{b}"}}}}).result()
assert np.array_equal(a, t.read().result())
print("ok")
"#,
        a = s(a),
        b = s(b)
    );
    common::python_stdout(&script, "reads equal in both clients");
}

/// `shardfs` with a store's environment.
fn with_env(env: Vec<(&'static str, String)>, args: &[&str]) -> Output {
    let out = std::process::Command::new(common::shardfs_bin())
        .args(args)
        .envs(env)
        .output()
        .expect("shardfs runs");
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    out
}

#[test]
fn unpack_and_reshard_read_shards_from_each_object_store_and_write_into_it() {
    use common::stores::{Kind, StoreServer};
    let (dir, src) = source();
    for kind in [Kind::S3, Kind::Gcs, Kind::Azure] {
        let server = StoreServer::start(kind);
        let (packed, unpacked) = (server.url("packed"), server.url("unpacked"));
        let at = |n: &str| -> PathBuf { dir.path().join(format!("{kind:?}-{n}")) };
        with_env(
            server.env(),
            &["pack", s(&src), &packed, "--chunks-per-shard", "2"],
        );
        // Shards read from the store (index, then the chunks' span), written here.
        with_env(
            server.env(),
            &["reshard", &packed, s(&at("re")), "--chunks-per-shard", "3"],
        );
        assert!(sharded_after(&src, &at("re")).iter().all(|(_, sh)| *sh));
        // Chunk files written into the store, packed again from it.
        with_env(server.env(), &["unpack", s(&at("re")), &unpacked]);
        assert!(!server.keys("unpacked/zp/two/c/1/").is_empty(), "{kind:?}");
        with_env(server.env(), &["unpack", &packed, s(&at("back"))]);
        the_same_chunk_files(&src, &at("back"));
        with_env(
            server.env(),
            &[
                "pack",
                &unpacked,
                s(&at("again")),
                "--chunks-per-shard",
                "2",
            ],
        );
        assert!(sharded_after(&src, &at("again")).iter().all(|(_, sh)| *sh));
    }
}

#[test]
fn a_rerun_by_another_command_finishes_the_stopped_one_then_does_its_own() {
    let (dir, src) = source();
    let two = src.join("zp/two");
    for (command, sharded) in [("unpack", false), ("reshard", true)] {
        let work = dir.path().join(command);
        common::copy_tree(&two, &work);
        // A pack in place stopped right after its state file (as the first packs wrote
        // it: chunks per shard, no target document).
        let state = serde_json::json!({"kind": "array", "original": document(&two),
            "chunks_per_shard": [2, 2], "flipped": false});
        std::fs::write(work.join(".shardfs-pack.json"), state.to_string()).unwrap();
        let mut args = vec![command, s(&work)];
        if sharded {
            args.extend(["--chunks-per-shard", "3"]);
        }
        let out = ok(&args);
        assert!(
            stdout(&out).starts_with("finished 1 stopped conversions in place"),
            "{command}: {}",
            stdout(&out)
        );
        let meta = document(&work);
        assert_eq!(
            meta["codecs"][0]["name"] == "sharding_indexed",
            sharded,
            "{command}"
        );
        if sharded {
            assert_eq!(chunks_per_shard(&work), [3, 3]);
        } else {
            let mut files = contents(&work);
            files.remove(Path::new("zarr.json"));
            let mut before = contents(&two);
            before.remove(Path::new("zarr.json"));
            assert!(files == before, "unpacked: the very chunk files");
        }
        cases(&["reads", s(&two), s(&work)]);
        assert!(leftovers(&work).is_empty(), "{:?}", leftovers(&work));
    }
}

#[test]
fn two_runs_at_once_under_consolidated_metadata_leave_no_stale_entry_even_killed() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        r#"
import subprocess, shutil, time, warnings
import numpy as np, zarr
warnings.simplefilter("ignore")
shardfs, top = "{bin}", "{top}"
def make(d):
    g = zarr.open_group(d, mode="w")
    a = g.create_array("a_big", shape=(400, 400), chunks=(10, 10), shards=(40, 40),
                       dtype="uint16", compressors=None)
    a[...] = (np.arange(160000) % 65000 + 1).astype("uint16").reshape(400, 400)
    g.create_array("b_small", shape=(20, 20), chunks=(5, 5), shards=(10, 10),
                   dtype="int32")[...] = np.arange(400, dtype="int32").reshape(20, 20)
    zarr.consolidate_metadata(d)
make(top + "/pristine")
ref = zarr.open_array(top + "/pristine/a_big", mode="r")[...]
reads = 0
for trial in range(4):
    d = f"{{top}}/t{{trial}}"
    shutil.copytree(top + "/pristine", d)
    a = subprocess.Popen([shardfs, "reshard", d, "--chunks-per-shard", "1", "--jobs", "1"],
                         stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    b = subprocess.Popen([shardfs, "reshard", d, "--chunks-per-shard", "4", "--jobs", "1"],
                         stdout=subprocess.DEVNULL)
    assert a.wait() == 0
    # A is done, B may still be at work: killed now, it must not leave the consolidated
    # metadata naming what an array no longer is (a reader trusting it, as zarr-python
    # does by default, would read fill values), nor a document without its state file.
    time.sleep(0.05 * trial)
    b.kill()
    b.wait()
    got = zarr.open_group(d, mode="r")["a_big"][...]
    assert np.array_equal(got, ref), f"trial {{trial}}: a stale consolidated entry"
    reads += 1
print(reads)
"#,
        bin = s(&common::shardfs_bin()),
        top = s(dir.path())
    );
    common::python_stdout(&script, "two reshards at once, the second killed");
}

#[test]
fn large_chunk_files_are_copied_into_shards_exactly() {
    // Chunks of 256 KiB and more are copied inside the kernel (copy_file_range) from their
    // open files; the shard must hold their bytes exactly, into DST and in place.
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw");
    let script = format!(
        r#"
import numpy as np, zarr
a = zarr.create_array("{}", shape=(128, 128, 100), chunks=(64, 64, 64), dtype="uint8",
                      compressors=None, fill_value=0)
a[...] = np.random.default_rng(1).integers(0, 256, size=a.shape, dtype=np.uint8)
print("ok")
"#,
        s(&raw)
    );
    common::python_stdout(&script, "an array of large raw chunks");
    let chunk_bytes = bytes_below(&raw) - std::fs::read(raw.join("zarr.json")).unwrap().len();
    let packed = dir.path().join("packed");
    ok(&["pack", s(&raw), s(&packed), "--chunks-per-shard", "2,2,2"]);
    reads_equal(&raw, &packed);
    let shard = std::fs::read(packed.join("c/0/0/0")).unwrap();
    // Eight chunks of 64^3 (the edge ones too: zarr-python writes whole chunks), an index
    // of 8 entries and its checksum.
    assert_eq!(shard.len(), chunk_bytes + 8 * 16 + 4);
    let first = std::fs::read(raw.join("c/0/0/0")).unwrap();
    assert_eq!(
        &shard[..first.len()],
        &first[..],
        "the first chunk's bytes, exactly"
    );
    let verify = shardfs(&["verify", s(&packed)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    let in_place = dir.path().join("in_place");
    common::copy_tree(&raw, &in_place);
    ok(&["pack", s(&in_place), "--chunks-per-shard", "2,2,2"]);
    assert_eq!(std::fs::read(in_place.join("c/0/0/0")).unwrap(), shard);
    ok(&["unpack", s(&packed), s(&dir.path().join("back"))]);
    assert_eq!(
        std::fs::read(dir.path().join("back/c/0/0/0")).unwrap(),
        first
    );
}

#[test]
fn usage_errors_are_said_before_anything_happens() {
    let (dir, src) = source();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"mine").unwrap();
    for args in [
        vec!["unpack", s(&src), s(&file)],
        vec!["pack", s(&file), s(&dir.path().join("d1"))],
        vec![
            "pack",
            s(&src),
            s(&dir.path().join("d2")),
            "--shard-target-bytes",
            "0",
        ],
        vec!["reshard", s(&src), "--compress", "gzip"],
    ] {
        let out = shardfs(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(stderr(&shardfs(&["unpack", s(&src), s(&file)])).contains("a-file: not a directory"));
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    assert!(!dir.path().join("d1").exists() && !dir.path().join("d2").exists());
}

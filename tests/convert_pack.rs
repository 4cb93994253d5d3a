//! `shardfs pack`: unsharded arrays written by zarr-python and tensorstore (1-D to 4-D,
//! partial edge chunks, missing chunks, '/' and '.' keys, compressed and raw) become
//! sharded arrays that both clients read equal and `shardfs verify` finds sound; the source
//! is never changed; a dry run writes nothing; what cannot be done is refused before
//! anything is written.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::convert::{Tmpfs, cases, contents, killed_anywhere, leftovers, s, source};
use common::{assert_ok, shardfs, stderr, stdout};

#[test]
fn packed_arrays_read_equal_in_both_clients_and_verify_sound() {
    let (dir, src) = source();
    let before = contents(&src);
    let dst = dir.path().join("dst");
    let out = shardfs(&[
        "pack",
        s(&src),
        s(&dst),
        "--chunks-per-shard",
        "2",
        "--jobs",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("packed 5 arrays: "),
        "the summary: {}",
        stdout(&out)
    );
    let report: serde_json::Value =
        serde_json::from_str(&cases(&["compare", s(&src), s(&dst)])).unwrap();
    for (name, r) in report.as_object().unwrap() {
        assert_eq!(r["sharded_after"], true, "{name} is sharded in DST");
    }
    assert_eq!(report.as_object().unwrap().len(), 7);
    let verify = shardfs(&["verify", s(&dst)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert_eq!(contents(&src), before, "the source is never changed");
    // Chunk files became shards: far fewer files, each chunk's bytes in one of them.
    let packed = contents(&dst);
    assert!(
        packed.len() * 2 < before.len(),
        "{} files from {}",
        packed.len(),
        before.len()
    );
    let chunk_bytes: usize = before
        .iter()
        .filter(|(k, _)| k.starts_with("zp/two/c"))
        .map(|(_, v)| v.len())
        .sum();
    let shard_bytes: usize = packed
        .iter()
        .filter(|(k, _)| k.starts_with("zp/two/c"))
        .map(|(_, v)| v.len())
        .sum();
    let shards = packed.keys().filter(|k| k.starts_with("zp/two/c")).count();
    // Raw uint8 chunks copied as they are, plus one index of 4 entries per shard.
    assert_eq!(shard_bytes, chunk_bytes + shards * (4 * 16 + 4));
}

#[test]
fn the_shard_shape_and_the_auto_policy_are_followed() {
    let (dir, src) = source();
    let dst = dir.path().join("dst");
    let one = src.join("zp/one");
    let out = shardfs(&["pack", s(&one), s(&dst), "--shard-shape", "28"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(
        meta["chunk_grid"]["configuration"]["chunk_shape"],
        serde_json::json!([28])
    );
    assert_eq!(
        meta["codecs"][0]["configuration"]["chunk_shape"],
        serde_json::json!([7])
    );
    // 100 elements in shards of 28: 4 shards.
    assert_eq!(contents(&dst.join("c")).len(), 4);
    // The auto policy puts this small array in one shard.
    let auto = dir.path().join("auto");
    let out = shardfs(&["pack", s(&src.join("zp/two")), s(&auto)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(contents(&auto.join("c")).len(), 1);
}

#[test]
fn a_dry_run_prints_the_plan_and_writes_nothing() {
    let (dir, src) = source();
    let dst = dir.path().join("dst");
    let out = shardfs(&[
        "pack",
        s(&src),
        s(&dst),
        "--chunks-per-shard",
        "2",
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("zp/two: 24 chunks into 9 shards of 2x2 chunks"),
        "{text}"
    );
    assert!(text.contains("nothing written"), "{text}");
    assert!(!dst.exists(), "a dry run makes no destination");
}

#[test]
fn what_cannot_be_done_is_refused_before_anything_is_written() {
    let (dir, src) = source();
    // A destination that is not empty: exit 1, left as it was.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("mine"), b"keep").unwrap();
    let out = shardfs(&["pack", s(&src), s(&full)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
    assert_eq!(contents(&full).len(), 1);
    // A shard shape that is no multiple of the chunks: the array named, nothing written.
    let dst = dir.path().join("dst");
    let out = shardfs(&[
        "pack",
        s(&src.join("zp/two")),
        s(&dst),
        "--shard-shape",
        "9,5",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a multiple of the chunk shape [8, 5]"),
        "{}",
        stderr(&out)
    );
    assert!(!dst.exists(), "nothing written, the DST it made removed");
    // Garbage metadata in the source: named, exit 1.
    std::fs::write(src.join("zp/one/zarr.json"), b"{ nope").unwrap();
    let out = shardfs(&["pack", s(&src), s(&dir.path().join("d2"))]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("zp/one/zarr.json: not Zarr v3 metadata"),
        "{}",
        stderr(&out)
    );
    // A destination inside the source (or the source itself, or the other way round): a
    // usage error, nothing written.
    for (a, b) in [
        (src.clone(), src.join("out")),
        (src.join("zp"), src.join("zp/../zp")),
        (src.join("zp/two"), src.clone()),
    ] {
        let out = shardfs(&["pack", s(&a), s(&b)]);
        assert_eq!(out.status.code(), Some(2), "{a:?} {b:?}");
        assert!(stderr(&out).contains("overlap"), "{}", stderr(&out));
    }
    assert!(!src.join("out").exists());
    // What pack cannot copy, or would take for a shard: refused before anything is
    // written, into DST or in place.
    let two = src.join("zp/two");
    let pristine_two = contents(&two);
    // (Without the top group's consolidated metadata, `two` may be packed in place alone.)
    let top = src.join("zarr.json");
    let mut group: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&top).unwrap()).unwrap();
    group["consolidated_metadata"] = serde_json::Value::Null;
    std::fs::write(&top, group.to_string()).unwrap();
    for (what, make) in [
        (
            "a link",
            &(|d: &Path| std::os::unix::fs::symlink("0", d.join("c/4/4")).unwrap())
                as &dyn Fn(&Path),
        ),
        ("outside the grid", &|d: &Path| {
            std::fs::write(d.join("c/9"), b"x").unwrap()
        }),
    ] {
        std::fs::remove_file(two.join("c/4/4")).ok();
        make(&two);
        let dst = dir.path().join("d4");
        let out = shardfs(&["pack", s(&two), s(&dst)]);
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(
            stderr(&out).contains("move it away first"),
            "{what}: {}",
            stderr(&out)
        );
        assert!(
            !dst.exists(),
            "{what}: nothing written, the DST it made removed"
        );
        let out = shardfs(&["pack", s(&two)]);
        assert_eq!(out.status.code(), Some(1), "{what}, in place");
        std::fs::remove_file(two.join("c/9")).ok();
        std::fs::remove_file(two.join("c/4/4")).ok();
    }
    assert_eq!(
        contents(&two).len() + 1,
        pristine_two.len(),
        "in place, nothing changed"
    );
    // In place, a file where a shard is staged for a while (the other key family's name).
    std::fs::write(two.join("0.0"), b"mine").unwrap();
    let out = shardfs(&["pack", s(&two)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("0.0: a pack in place writes a shard there"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(two.join("0.0")).unwrap(), b"mine");
    std::fs::remove_file(two.join("0.0")).unwrap();
    // A pack in place that was stopped is finished before its arrays are packed elsewhere.
    std::fs::write(two.join(".shardfs-pack.json"), b"{}").unwrap();
    let out = shardfs(&["pack", s(&two), s(&dir.path().join("d5"))]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("finish it first"), "{}", stderr(&out));
    // No source: a usage error.
    let out = shardfs(&[
        "pack",
        s(&dir.path().join("nothing")),
        s(&dir.path().join("d3")),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// `shardfs pack` with a store's environment.
fn pack_with(env: Vec<(&'static str, String)>, args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::shardfs_bin())
        .arg("pack")
        .args(args)
        .envs(env)
        .output()
        .expect("shardfs runs")
}

#[test]
fn packing_into_and_out_of_each_object_store() {
    use common::stores::{Kind, StoreServer};
    let (dir, src) = source();
    for kind in [Kind::S3, Kind::Gcs, Kind::Azure] {
        let server = StoreServer::start(kind);
        let url = server.url("packed");
        let out = pack_with(server.env(), &[s(&src), &url, "--chunks-per-shard", "2"]);
        assert_eq!(out.status.code(), Some(0), "{kind:?}: {}", stderr(&out));
        // zp/two: a 5x5 grid of chunks (the first one missing) in 3x3 shards.
        let shards = server.keys("packed/zp/two/c/");
        assert_eq!(shards.len(), 9, "{kind:?}: {shards:?}");
        // Out again (arrays already sharded are copied as they are): equal everywhere.
        let back = dir.path().join(format!("back-{kind:?}"));
        let out = pack_with(server.env(), &[&url, s(&back)]);
        assert_eq!(out.status.code(), Some(0), "{kind:?}: {}", stderr(&out));
        assert!(
            stdout(&out).starts_with("packed 0 arrays"),
            "{}",
            stdout(&out)
        );
        let report = cases(&["compare", s(&src), s(&back)]);
        assert!(
            !report.contains("\"sharded_after\": false"),
            "{kind:?}: {report}"
        );
        let verify = shardfs(&["verify", s(&back)]);
        assert_eq!(
            verify.status.code(),
            Some(0),
            "{kind:?}: {}",
            stdout(&verify)
        );
        // Into a prefix that holds something: refused, exit 1.
        let out = pack_with(server.env(), &[s(&src), &url]);
        assert_eq!(out.status.code(), Some(1), "{kind:?}");
        assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
    }
}

#[test]
fn packing_in_place_gives_what_packing_elsewhere_gives() {
    let (dir, src) = source();
    let pristine = dir.path().join("pristine");
    common::copy_tree(&src, &pristine);
    let elsewhere = dir.path().join("elsewhere");
    let out = shardfs(&["pack", s(&src), s(&elsewhere), "--chunks-per-shard", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = shardfs(&["pack", s(&src), "--chunks-per-shard", "2", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("packed 5 arrays"),
        "{}",
        stdout(&out)
    );
    cases(&["compare", s(&pristine), s(&src)]);
    let verify = shardfs(&["verify", s(&src)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert!(leftovers(&src).is_empty(), "{:?}", leftovers(&src));
    // The same shards, byte for byte, as a pack into another directory writes; the
    // documents the same but for the consolidated metadata's formatting.
    let (here, there) = (contents(&src), contents(&elsewhere));
    let shards = |m: &BTreeMap<PathBuf, Vec<u8>>| -> BTreeMap<PathBuf, Vec<u8>> {
        m.iter()
            .filter(|(k, _)| !k.ends_with("zarr.json"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_eq!(shards(&here), shards(&there));
    // Again: nothing left to do.
    let out = shardfs(&["pack", s(&src)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("packed 0 arrays"),
        "{}",
        stdout(&out)
    );
    assert_eq!(contents(&src), here);
}

#[test]
fn a_pack_in_place_killed_anywhere_reads_equal_and_a_rerun_finishes_it() {
    let (dir, src) = source();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let trials = std::env::var("SHARDFS_PACK_TRIALS").unwrap_or_else(|_| "50".into());
    killed_anywhere(&src, &work, &[], &trials, "7");
}

#[test]
fn a_pack_in_place_on_a_full_disk_fails_clearly_loses_nothing_and_finishes_later() {
    let (dir, src) = source();
    let fs = Tmpfs::mount(&dir.path().join("small"), "16m");
    let root = fs.0.join("data");
    common::copy_tree(&src, &root);
    // Room for two small shards (a page each): every array but the smallest needs more
    // (arrays are packed one after the other, each freeing its chunks' room when done).
    fs.resize(&format!("{}", fs.used() + 8 * 1024));
    let out = shardfs(&["pack", s(&root), "--chunks-per-shard", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        stderr(&out)
    );
    cases(&["reads", s(&src), s(&root)]);
    fs.resize("16m");
    let out = shardfs(&["pack", s(&root), "--chunks-per-shard", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    cases(&["compare", s(&src), s(&root)]);
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

#[test]
fn a_pack_in_place_refuses_what_it_cannot_resume_safely_and_two_runs_do_not_collide() {
    let (dir, src) = source();
    let pristine = dir.path().join("pristine");
    common::copy_tree(&src, &pristine);
    // Part of a hierarchy whose top group consolidates it: the consolidated metadata
    // would go stale, so the whole is to be packed.
    let out = shardfs(&["pack", s(&src.join("zp"))]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("has consolidated metadata"),
        "{}",
        stderr(&out)
    );
    // A state file that does not match the array's document (changed after the stop):
    // refused, nothing changed.
    let two = src.join("zp/two");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(two.join("zarr.json")).unwrap()).unwrap();
    let before = contents(&src);
    for (flipped, mut original) in [(false, doc.clone()), (true, doc.clone())] {
        if !flipped {
            original["attributes"] = serde_json::json!({"changed": "since"});
        }
        let state = serde_json::json!({"kind": "array", "original": original,
            "chunks_per_shard": [2, 2], "flipped": flipped});
        std::fs::write(two.join(".shardfs-pack.json"), state.to_string()).unwrap();
        let out = shardfs(&["pack", s(&src)]);
        assert_eq!(out.status.code(), Some(1), "flipped {flipped}");
        let why = match flipped {
            false => "zp/two/zarr.json: changed while a pack in place",
            true => {
                "zp/two/zarr.json: a conversion in place was stopped here, and its original document was put back after the flip"
            }
        };
        assert!(stderr(&out).contains(why), "{}", stderr(&out));
        std::fs::remove_file(two.join(".shardfs-pack.json")).unwrap();
        assert_eq!(contents(&src), before, "flipped {flipped}: nothing changed");
    }
    // Two runs at once: one waits for the other, array by array.
    for delay in [0, 20, 60] {
        let work = dir.path().join(format!("both{delay}"));
        common::copy_tree(&pristine, &work);
        let args = ["pack", s(&work), "--chunks-per-shard", "2", "--jobs", "1"];
        let first = std::process::Command::new(common::shardfs_bin())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        let other = shardfs(&args);
        let first = first.wait_with_output().unwrap();
        assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
        assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
        cases(&["compare", s(&pristine), s(&work)]);
        assert!(leftovers(&work).is_empty(), "{:?}", leftovers(&work));
    }
    // The same through a link that leads out of the consolidated hierarchy (the array's
    // real place has no consolidated group above it).
    let linked = dir.path().join("linked");
    common::copy_tree(&pristine, &linked);
    let elsewhere = dir.path().join("real-one");
    std::fs::rename(linked.join("zp/one"), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, linked.join("zp/one")).unwrap();
    let out = shardfs(&["pack", s(&linked.join("zp/one"))]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("has consolidated metadata"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn zarr_v2_arrays_become_sharded_v3_arrays_with_their_chunks_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("v2");
    cases(&["write_v2", s(&src)]);
    let before = contents(&src);
    let dst = dir.path().join("v3");
    let out = shardfs(&["pack", s(&src), s(&dst), "--chunks-per-shard", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("packed 4 arrays"),
        "{}",
        stdout(&out)
    );
    assert_eq!(cases(&["compare_v2", s(&src), s(&dst)]).trim(), "ok");
    let verify = shardfs(&["verify", s(&dst)]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert_eq!(contents(&src), before, "the source is never changed");
    // In place is for v3 arrays: refused, nothing changed.
    let out = shardfs(&["pack", s(&src)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not in place"), "{}", stderr(&out));
    assert_eq!(contents(&src), before);
    // A v2 array with a filter cannot keep its bytes: refused with the reason, DST empty.
    let filtered = dir.path().join("filtered");
    cases(&["write_v2", s(&filtered), "filters"]);
    let out = shardfs(&["pack", s(&filtered), s(&dir.path().join("none"))]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("delta/.zarray: this Zarr v2 node cannot become Zarr v3")
            && stderr(&out).contains("filters"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("none").exists(), "nothing written");
}

/// A bind mount, unmounted (lazily) when dropped, passing or not.
struct BindMount(PathBuf);

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A DST reached through a bind mount of a directory inside SRC lies inside SRC, though
/// no path says so: refused as overlapping (compared by device and inode), nothing written.
#[test]
fn a_dst_bind_mounted_from_inside_src_overlaps() {
    let (dir, src) = source();
    let pristine = contents(&src);
    let point = dir.path().join("elsewhere");
    std::fs::create_dir(&point).unwrap();
    let bound = std::process::Command::new("mount")
        .arg("--bind")
        .arg(src.join("zp"))
        .arg(&point)
        .status()
        .unwrap();
    assert!(bound.success(), "mount --bind");
    let _guard = BindMount(point.clone());
    for dst in [point.join("out"), point.clone()] {
        let out = shardfs(&["pack", s(&src), s(&dst)]);
        assert_eq!(out.status.code(), Some(2), "{dst:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("overlap"), "{}", stderr(&out));
    }
    assert_eq!(contents(&src), pristine, "nothing written into SRC");
}

/// A conversion in place of an array that a live mount serves is refused before anything
/// is written (it would change shards under the mount: the mount kept the old layout, and
/// after a kill its fsynced chunk was dropped). Seen in the mount table, and where the table
/// does not show the mount (another machine; here another mount namespace, where it is
/// detached) by the lock its journal holds.
#[test]
fn an_in_place_conversion_under_a_live_mount_is_refused() {
    use std::io::Write;
    let (_dir, backing, _) = common::mount::dirs();
    let limit = std::time::Duration::from_secs(120);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let m = common::mount::Mounted::new(&backing, &args, limit);
    std::fs::create_dir(m.path("a")).unwrap();
    std::fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::create_dir(m.path("a/c")).unwrap();
    for k in 0..4u8 {
        std::fs::write(m.path(&format!("a/c/{k}")), [k + 1; 16]).unwrap();
    }
    assert_ok(&shardfs(&["flush", s(&m.mountpoint)]), "flush");
    // A chunk of the next shard, fsynced: pending in the mount, in its journal.
    let mut f = std::fs::File::create(m.path("a/c/4")).unwrap();
    f.write_all(&[9; 16]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let before = contents(&backing);
    let array = backing.join("a");
    let out = shardfs(&["unpack", s(&array)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("BACKING of the shardfs mount"),
        "{}",
        stderr(&out)
    );
    let hidden = format!(
        "umount -l '{}' && exec '{}' unpack '{}'",
        s(&m.mountpoint),
        common::shardfs_bin().display(),
        s(&array)
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &hidden])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("journal"), "{}", stderr(&out));
    assert_eq!(contents(&backing), before, "nothing written");
    assert_eq!(std::fs::read(m.path("a/c/4")).unwrap(), [9; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// A zarr-python writer updating chunks while `pack` converts their array in place: pack
/// either finishes or stops saying the array was written meanwhile (exit 1), and no write
/// the writer completed is lost either way (33, 9 and 15 were, in three runs, with exit 0).
#[test]
fn writes_during_a_pack_in_place_are_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pack_writers.py");
    let bin = common::shardfs_bin();
    let out = common::python_run(
        &[s(&script), s(&bin), s(dir.path()), "6"],
        "pack_writers.py",
    );
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    eprintln!("pack in place beside a writer: {report}");
    assert_eq!(report["lost"], serde_json::json!([]), "{report}");
    assert!(report["writes"].as_u64().unwrap() > 0, "{report}");
}

/// Arrays of a data type zarr-python 3.1 cannot take sharded (structured: it fails writing
/// them; raw bytes: reading them) are refused by pack with the reason, nothing written
/// (they were packed, and verify passed them).
#[test]
fn data_types_readers_cannot_take_sharded_are_refused() {
    for (dtype, said) in [
        (
            "[('a', '<i4'), ('b', '<f8')]",
            "cannot write structured arrays sharded",
        ),
        ("'V6'", "cannot read raw_bytes arrays sharded"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let code = format!(
            "import sys, zarr, numpy as np\n\
             zarr.create_array(sys.argv[1], shape=(8,), chunks=(2,), dtype=np.dtype({dtype}), \
             compressors=None)[...] = np.zeros(8, dtype=np.dtype({dtype}))"
        );
        common::python_run(&["-c", &code, s(&src.join("a"))], "a structured array");
        let dst = dir.path().join("dst");
        let out = shardfs(&["pack", s(&src), s(&dst)]);
        assert_eq!(out.status.code(), Some(1), "{dtype}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{dtype}: {}", stderr(&out));
        assert!(!dst.exists(), "{dtype}: nothing written");
    }
}

/// Numbers in documents survive a pack exactly: an attribute 2**70 of an array and of its
/// group's consolidated metadata (it became 1.1805916207174113e+21), into DST and in place.
#[test]
fn numbers_in_documents_survive_a_pack_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let code = "import sys, zarr\n\
                g = zarr.open_group(sys.argv[1], mode='w')\n\
                g.attrs['big'] = 2**70\n\
                a = g.create_array('a', shape=(8,), chunks=(2,), dtype='uint8', compressors=None)\n\
                a[:] = 1\n\
                a.attrs['big'] = 2**70\n\
                zarr.consolidate_metadata(sys.argv[1])";
    common::python_run(&["-c", code, s(&src)], "an array with 2**70");
    let dst = dir.path().join("dst");
    assert_ok(&shardfs(&["pack", s(&src), s(&dst)]), "pack into DST");
    assert_ok(&shardfs(&["pack", s(&src)]), "pack in place");
    for root in [&dst, &src] {
        for doc in ["zarr.json", "a/zarr.json"] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            assert!(text.contains("1180591620717411303424"), "{doc}: {text}");
            assert!(!text.contains("e+21"), "{doc}: {text}");
        }
        let a = std::fs::read_to_string(root.join("a/zarr.json")).unwrap();
        assert!(a.contains("sharding_indexed"), "{a}");
    }
}

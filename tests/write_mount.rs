//! The write side: unmodified writers write unsharded arrays through a real mount, and
//! BACKING ends up holding sharded arrays, each shard written in one write.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::assert_ok;
use common::mount::{
    Mounted, chunk, dirs, errno_of, python_ok, python_timeout, run_timeout, shardfs_timeout,
    small_array, stats,
};
use common::{files_below, run_fixtures, stderr, stdout};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(300);
const CLIENT: Duration = Duration::from_secs(180);

fn writers_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/writers.py")
}

fn writer(scenario: &str, root: &Path, out: &Path) -> std::process::Output {
    run_timeout(
        std::process::Command::new(common::python())
            .arg(writers_script())
            .args([scenario, root.to_str().unwrap(), out.to_str().unwrap()]),
        CLIENT,
    )
}

/// After unmount: `verify` clean, every array equal to what the writer meant, read natively
/// by zarr-python and tensorstore, and no temporary file left anywhere in BACKING.
fn check_backing(backing: &Path, out: &Path, names: &[&str]) {
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(
        v.status.code(),
        Some(0),
        "verify: {}{}",
        stdout(&v),
        stderr(&v)
    );
    for name in names {
        let r = python_timeout(
            &[
                "check-read",
                backing.join(name).to_str().unwrap(),
                out.join(format!("{name}.npy")).to_str().unwrap(),
            ],
            CLIENT,
        );
        assert_ok(&r, name);
        // Stored sharded.
        let doc = fs::read_to_string(backing.join(name).join("zarr.json")).unwrap();
        assert!(doc.contains("sharding_indexed"), "{name} is not sharded");
    }
    let leftovers: Vec<String> = files_below(backing)
        .into_iter()
        .filter(|f| f.contains(".partial") || f.contains("__lock") || f.contains(".shardfs-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn zarr_python_writes_come_out_sharded() {
    let (_d, backing, out) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_ok(
        &writer("zarr-python", &m.mountpoint, &out),
        "zarr-python writes",
    );
    let unmounted = m.unmount(&[]);
    assert_ok(&unmounted, "unmount");
    check_backing(
        &backing,
        &out,
        &[
            "whole_empty_False",
            "whole_empty_True",
            "by_chunk",
            "resized",
            "overwritten",
        ],
    );
}

#[test]
fn tensorstore_writes_come_out_sharded() {
    let (_d, backing, out) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_ok(
        &writer("tensorstore", &m.mountpoint, &out),
        "tensorstore writes",
    );
    let s = stats(&m);
    eprintln!("tensorstore stats: {s}");
    assert_ok(&m.unmount(&[]), "unmount");
    check_backing(&backing, &out, &["ts_whole", "ts_by_chunk"]);
}

#[test]
fn consolidated_metadata_written_through_the_mount_describes_the_shards() {
    let (_d, backing, out) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_ok(
        &writer("hierarchy", &m.mountpoint, &out),
        "hierarchy writes",
    );
    // Through the mount, the consolidated view says unsharded; BACKING says sharded.
    let shown = fs::read_to_string(m.path("h/zarr.json")).unwrap();
    assert!(!shown.contains("sharding_indexed"));
    assert_ok(&m.unmount(&[]), "unmount");
    let stored = fs::read_to_string(backing.join("h/zarr.json")).unwrap();
    assert!(stored.contains("consolidated_metadata"));
    assert!(stored.contains("sharding_indexed"));
    assert_ok(
        &writer("check-hierarchy", &backing, &out),
        "native consolidated read",
    );
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

#[test]
fn memory_pressure_writes_partial_shards() {
    let (_d, backing, out) = dirs();
    // A limit below what one chunk per shard adds up to, and no idle flush to speak of.
    let m = Mounted::new(
        &backing,
        &[
            "--chunks-per-shard",
            "2",
            "--max-pending-memory",
            "200",
            "--idle-flush",
            "600",
        ],
        LIMIT,
    );
    assert_ok(&writer("spread", &m.mountpoint, &out), "spread writes");
    let s = stats(&m);
    assert!(s["partial_writes"].as_u64().unwrap() > 0, "{s}");
    assert!(s["pending_bytes"].as_u64().unwrap() <= 200, "{s}");
    assert_ok(&m.unmount(&[]), "unmount");
    check_backing(&backing, &out, &["spread"]);
}

#[test]
fn chunk_by_chunk_writes_each_shard_once() {
    let (_d, backing, out) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_ok(&writer("counted", &m.mountpoint, &out), "counted writes");
    // 64x64 in 16x16 chunks, 2x2 chunks per shard: 4 shards, each complete.
    let s = stats(&m);
    assert_eq!(s["shards_written"], 4, "{s}");
    assert_eq!(s["merges"], 0, "{s}");
    assert_eq!(s["partial_writes"], 0, "{s}");
    assert_eq!(s["pending_shards"], 0, "{s}");
    assert_ok(&m.unmount(&[]), "unmount");
    check_backing(&backing, &out, &["counted"]);
}

#[test]
fn tensorstore_with_its_fsyncs_writes_each_shard_once() {
    // tensorstore fsyncs every chunk file and its directory: those go to the journal, and
    // each shard is still written once, when complete, with no merge.
    let (_d, backing, out) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_ok(
        &writer("ts-counted", &m.mountpoint, &out),
        "tensorstore writes",
    );
    let s = stats(&m);
    // 4 shards of the chunk-by-chunk array, 4 of the whole one (2x2 chunks per shard).
    assert_eq!(s["shards_written"], 8, "{s}");
    assert_eq!(s["merges"], 0, "{s}");
    assert_eq!(s["partial_writes"], 0, "{s}");
    // Chunks fsynced while their shard was incomplete went to the journal (the last one
    // of a shard completes it, and its fsync then finds it written).
    assert!(s["journaled_chunks"].as_u64().unwrap() >= 8, "{s}");
    assert!(s["group_commits"].as_u64().unwrap() >= 1, "{s}");
    // Every shard was new: its fsynced chunks went into its body, which became the shard,
    // so that they were written once.
    assert_eq!(s["shards_from_bodies"], 8, "{s}");
    assert_ok(&m.unmount(&[]), "unmount");
    check_backing(&backing, &out, &["ts_counted", "ts_counted_whole"]);
    // Made in the journal's directory, the shards are still readable by everyone, like
    // every shard file.
    for f in files_below(&backing) {
        let mode = fs::metadata(backing.join(&f)).unwrap().mode();
        assert_eq!(mode & 0o644, 0o644, "{f}: mode {mode:o}");
    }
    // Every record retired once its shard was durable: no journal left.
    let journal: Vec<String> = files_below(&backing)
        .into_iter()
        .filter(|f| f.starts_with(".shardfs/"))
        .collect();
    assert!(journal.is_empty(), "{journal:?}");
}

#[test]
fn cp_and_rsync_into_the_mount() {
    let (d, backing, _) = dirs();
    let src = d.path().join("src");
    fs::create_dir_all(&src).unwrap();
    run_fixtures(&["unsharded", src.to_str().unwrap()]);
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    let cp = run_timeout(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(src.join("u_3d_zstd_defaultdot"))
            .arg(m.path("copied3d")),
        CLIENT,
    );
    assert_ok(&cp, "cp -r");
    let cp = run_timeout(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(src.join("u_1d_zstd_default"))
            .arg(m.path("copied1d")),
        CLIENT,
    );
    assert_ok(&cp, "cp -r");
    for name in ["u_4d_raw_v2slash", "u_2d_raw_v2dot"] {
        let rs = run_timeout(
            std::process::Command::new("rsync")
                .arg("-a")
                .arg(src.join(name))
                .arg(&m.mountpoint),
            CLIENT,
        );
        assert_ok(&rs, "rsync -a");
    }
    assert_ok(&m.unmount(&[]), "unmount");
    for (copy, orig) in [
        ("copied3d", "u_3d_zstd_defaultdot"),
        ("copied1d", "u_1d_zstd_default"),
        ("u_4d_raw_v2slash", "u_4d_raw_v2slash"),
        ("u_2d_raw_v2dot", "u_2d_raw_v2dot"),
    ] {
        fs::copy(
            src.join(format!("{orig}.npy")),
            d.path().join(format!("expected/{copy}.npy")),
        )
        .unwrap();
    }
    check_backing(
        &backing,
        &d.path().join("expected"),
        &["copied3d", "copied1d", "u_4d_raw_v2slash", "u_2d_raw_v2dot"],
    );
}

/// An array made by zarr-python through the mount, for the file-level tests: 4x4 chunks of
/// 16x16 uint8, 2x2 chunks per shard (4 shards), default "/" keys.
#[test]
fn bad_input_is_refused_and_nothing_else_is_disturbed() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    let arr = small_array(&m, "a");
    fs::create_dir_all(arr.join("c/0")).unwrap();
    fs::write(arr.join("c/0/1"), chunk(1)).unwrap();
    // Outside the grid, not canonical, deeper than the rank, a digit name at the root of a
    // "c/..." array: EINVAL.
    assert_eq!(
        errno_of(fs::write(arr.join("c/0/9"), chunk(2))),
        Some(libc::EINVAL)
    );
    assert_eq!(
        errno_of(fs::create_dir(arr.join("c/9"))),
        Some(libc::EINVAL)
    );
    assert_eq!(
        errno_of(fs::create_dir(arr.join("c/01"))),
        Some(libc::EINVAL)
    );
    assert_eq!(
        errno_of(fs::write(arr.join("7"), chunk(2))),
        Some(libc::EINVAL)
    );
    assert_eq!(
        errno_of(fs::create_dir(arr.join("c/0/1/2"))),
        Some(libc::ENOTDIR)
    );
    // Temporary names are not keys: accepted.
    fs::write(arr.join("c/0/1.tmp"), chunk(3)).unwrap();
    fs::remove_file(arr.join("c/0/1.tmp")).unwrap();
    // Sharded metadata written through the mount: stored as written, shown as written.
    let sharded_doc = fs::read_to_string(backing.join("a/zarr.json")).unwrap();
    fs::create_dir(m.path("s")).unwrap();
    let mut f = fs::File::create(m.path("s/zarr.json")).unwrap();
    f.write_all(sharded_doc.as_bytes()).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(backing.join("s/zarr.json")).unwrap(),
        sharded_doc
    );
    assert_eq!(
        fs::read_to_string(m.path("s/zarr.json")).unwrap(),
        sharded_doc
    );
    // Garbage metadata: stored as written, the directory is not an array.
    fs::create_dir(m.path("g")).unwrap();
    fs::write(m.path("g/zarr.json"), b"{not json").unwrap();
    assert_eq!(fs::read(backing.join("g/zarr.json")).unwrap(), b"{not json");
    fs::create_dir(m.path("g/c")).unwrap();
    fs::write(m.path("g/c/0"), b"plain").unwrap();
    assert_eq!(fs::read(backing.join("g/c/0")).unwrap(), b"plain");
    // The array next door is as it was.
    assert_eq!(fs::read(arr.join("c/0/1")).unwrap(), chunk(1));
    let log = m.log_text();
    assert!(log.contains("not a chunk key"), "{log}");
    assert!(log.contains("shown as written"), "{log}");
    assert!(log.contains("not Zarr v3 metadata"), "{log}");
    assert_ok(&m.unmount(&[]), "unmount");
    let v = shardfs_timeout(&["verify", backing.join("a").to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

#[test]
fn every_writer_pattern_works() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    let arr = small_array(&m, "a");
    let c = arr.join("c");
    fs::create_dir_all(c.join("0")).unwrap();
    fs::create_dir_all(c.join("1")).unwrap();

    // Direct O_TRUNC writes (zarrs): the last content wins.
    fs::write(c.join("0/0"), chunk(9)).unwrap();
    fs::write(c.join("0/0"), chunk(10)).unwrap();
    assert_eq!(fs::read(c.join("0/0")).unwrap(), chunk(10));

    // Temp + rename (zarr-python); the temp name replaces the last suffix.
    fs::write(c.join("0/1.3f2a.partial"), chunk(11)).unwrap();
    fs::rename(c.join("0/1.3f2a.partial"), c.join("0/1")).unwrap();
    assert_eq!(fs::read(c.join("0/1")).unwrap(), chunk(11));

    // A file renamed while still open and still being written (tensorstore): the data
    // follows the file.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(c.join("1/0.__lock"))
        .unwrap();
    f.write_all(&chunk(12)[..100]).unwrap();
    fs::rename(c.join("1/0.__lock"), c.join("1/0")).unwrap();
    f.write_all(&chunk(12)[100..]).unwrap();
    drop(f);
    assert_eq!(fs::read(c.join("1/0")).unwrap(), chunk(12));

    // link + unlink (exclusive puts): EEXIST onto an existing chunk.
    fs::write(c.join("1/1.x.partial"), chunk(13)).unwrap();
    assert_eq!(
        errno_of(fs::hard_link(c.join("1/1.x.partial"), c.join("0/0"))),
        Some(libc::EEXIST)
    );
    fs::hard_link(c.join("1/1.x.partial"), c.join("1/1")).unwrap();
    fs::remove_file(c.join("1/1.x.partial")).unwrap();
    assert_eq!(fs::read(c.join("1/1")).unwrap(), chunk(13));

    // O_EXCL: only for a name that is not there.
    let excl = |p: &Path| fs::OpenOptions::new().write(true).create_new(true).open(p);
    assert_eq!(errno_of(excl(&c.join("0/0"))), Some(libc::EEXIST));
    fs::create_dir_all(c.join("2")).unwrap();
    excl(&c.join("2/0")).unwrap().write_all(&chunk(14)).unwrap();

    // truncate and ftruncate, down and up.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(c.join("2/0"))
        .unwrap();
    f.set_len(50).unwrap();
    assert_eq!(fs::metadata(c.join("2/0")).unwrap().len(), 50);
    f.set_len(60).unwrap();
    drop(f);
    let mut expect = chunk(14)[..50].to_vec();
    expect.extend_from_slice(&[0; 10]);
    assert_eq!(fs::read(c.join("2/0")).unwrap(), expect);

    // utimes, and a chmod that takes nothing away from the array's mode, are accepted; a
    // chmod that would close the chunk alone is refused (share_users.rs says more).
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(c.join("2/0"), fs::Permissions::from_mode(0o644)).unwrap();
    let narrowed = fs::set_permissions(c.join("2/0"), fs::Permissions::from_mode(0o600));
    assert_eq!(errno_of(narrowed), Some(libc::EPERM));
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    fs::File::options()
        .write(true)
        .open(c.join("2/0"))
        .unwrap()
        .set_times(fs::FileTimes::new().set_modified(when))
        .unwrap();

    // Read your writes, and a size and mtime that change with the content.
    let before = fs::metadata(c.join("0/1")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(c.join("0/1"))
        .unwrap();
    f.seek(SeekFrom::Start(256)).unwrap();
    f.write_all(b"more").unwrap();
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    drop(f);
    assert_eq!(back.len(), 260);
    let after = fs::metadata(c.join("0/1")).unwrap();
    assert_eq!(after.len(), 260);
    assert_ne!(
        (before.mtime(), before.mtime_nsec()),
        (after.mtime(), after.mtime_nsec())
    );
    // Back to a chunk of its codecs' size: `verify` checks that every chunk has it.
    fs::OpenOptions::new()
        .write(true)
        .open(c.join("0/1"))
        .unwrap()
        .set_len(256)
        .unwrap();

    // Unlink of an open file: the name goes, the open file keeps its content.
    fs::write(c.join("2/1"), chunk(15)).unwrap();
    let mut open = fs::File::open(c.join("2/1")).unwrap();
    fs::remove_file(c.join("2/1")).unwrap();
    assert_eq!(errno_of(fs::metadata(c.join("2/1"))), Some(libc::ENOENT));
    let mut kept = Vec::new();
    open.read_to_end(&mut kept).unwrap();
    assert_eq!(kept, chunk(15));
    drop(open);

    // A temporary file that is never renamed ends up in BACKING, as it is.
    fs::write(c.join("1/.1.AbCdEf"), b"left behind").unwrap();

    // rmdir of a key directory that still holds chunks: ENOTEMPTY; emptied: fine.
    assert_eq!(errno_of(fs::remove_dir(c.join("2"))), Some(libc::ENOTEMPTY));
    fs::remove_file(c.join("2/0")).unwrap();
    fs::remove_dir(c.join("2")).unwrap();

    // Recursive removal of a whole array, as zarr-python's overwrite does it.
    let other = small_array(&m, "b");
    fs::create_dir_all(other.join("c/3")).unwrap();
    fs::write(other.join("c/3/3"), chunk(16)).unwrap();
    python_ok(
        "shutil.rmtree",
        "import sys, shutil; shutil.rmtree(sys.argv[1])",
        &[&other],
    );
    assert!(!other.exists());

    // The same for an array with "." keys (every chunk file in the array directory), and a
    // `touch` of an array's zarr.json that leaves it as it was.
    let dotted = m.path("d");
    let script = [
        "import sys, zarr, shutil",
        "a = zarr.create_array(sys.argv[1], shape=(64, 64), chunks=(16, 16), dtype='uint8',",
        "    compressors=None, fill_value=0, chunk_key_encoding={'name': 'v2', 'separator': '.'})",
        "a[...] = 5",
        "shutil.rmtree(sys.argv[1])",
    ]
    .join("\n");
    python_ok("rmtree of a '.' array", &script, &[&dotted]);
    assert!(!dotted.exists());
    let doc_before = fs::read(arr.join("zarr.json")).unwrap();
    let touch = run_timeout(
        std::process::Command::new("touch").arg(arr.join("zarr.json")),
        CLIENT,
    );
    assert_ok(&touch, "touch zarr.json");
    assert_eq!(fs::read(arr.join("zarr.json")).unwrap(), doc_before);
    assert!(
        !backing.join("d").exists(),
        "removed array left files in BACKING"
    );

    assert_ok(&m.unmount(&[]), "unmount");
    assert!(
        !backing.join("b").exists(),
        "removed array left files in BACKING"
    );
    assert_eq!(
        fs::read(backing.join("a/c/1/.1.AbCdEf")).unwrap(),
        b"left behind"
    );
    // What the shards hold, read natively.
    let check = format!(
        "import zarr, numpy as np\n\
         a = zarr.open_array({:?}, mode='r')\n\
         assert (a[0:16, 0:16] == 10).all()\n\
         assert (a[0:16, 16:32] == 11).all()\n\
         assert (a[16:32, 16:32] == 13).all()\n\
         assert (a[16:32, 0:16] == 12).all()\n\
         assert (a[32:48, :] == 0).all()\n",
        backing.join("a").to_str().unwrap()
    );
    python_ok("native read of the shards", &check, &[]);
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

#[test]
fn idle_and_fsync_write_partial_shards() {
    let (_d, backing, out) = dirs();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "1"],
        LIMIT,
    );
    // zarr-python skips the empty chunks: some shards never complete.
    assert_ok(&writer("sparse", &m.mountpoint, &out), "sparse writes");
    let start = std::time::Instant::now();
    loop {
        let s = stats(&m);
        if s["pending_shards"] == 0 {
            assert!(s["partial_writes"].as_u64().unwrap() > 0, "{s}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still pending: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Still mounted, BACKING already holds the whole array, sharded.
    let r = python_timeout(
        &[
            "check-read",
            backing.join("sparse").to_str().unwrap(),
            out.join("sparse.npy").to_str().unwrap(),
        ],
        CLIENT,
    );
    assert_ok(&r, "native read while mounted");

    // fsync of one chunk makes it durable in the journal, without writing its shard.
    let arr = small_array(&m, "f");
    fs::create_dir_all(arr.join("c/3")).unwrap();
    let before = stats(&m);
    let mut f = fs::File::create(arr.join("c/3/3")).unwrap();
    f.write_all(&chunk(7)).unwrap();
    f.sync_all().unwrap();
    let after = stats(&m);
    assert!(!backing.join("f/c/1/1").exists(), "fsync wrote the shard");
    assert_eq!(after["partial_writes"], before["partial_writes"]);
    assert_eq!(
        after["journaled_chunks"].as_u64().unwrap(),
        before["journaled_chunks"].as_u64().unwrap() + 1
    );
    assert_eq!(after["live_records"].as_u64().unwrap(), 1, "{after}");
    drop(f);
    // The shard is written as usual (here at unmount), and the record then retires.
    assert_ok(&m.unmount(&[]), "unmount");
    let check = format!(
        "import zarr; a = zarr.open_array({:?}, mode='r'); assert (a[48:64, 48:64] == 7).all()",
        backing.join("f").to_str().unwrap()
    );
    python_ok("native read of the fsync'ed chunk", &check, &[]);
    let journal: Vec<String> = files_below(&backing)
        .into_iter()
        .filter(|f| f.starts_with(".shardfs/"))
        .collect();
    assert!(
        journal.is_empty(),
        "journal left after a clean unmount: {journal:?}"
    );
}

#[test]
fn many_writers_at_once() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    let a = small_array(&m, "a");
    let b = small_array(&m, "b");
    let handles: Vec<_> = (0..8u8)
        .map(|t| {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                for k in 0..4u8 {
                    let (i, j) = (t / 2, (t % 2) * 2 + k / 2);
                    let arr = if k % 2 == 0 { &a } else { &b };
                    fs::create_dir_all(arr.join(format!("c/{i}"))).unwrap();
                    let tmp = arr.join(format!("c/{i}/{j}.{t}{k}.partial"));
                    fs::write(&tmp, chunk(10 * i + j + 1)).unwrap();
                    fs::rename(&tmp, arr.join(format!("c/{i}/{j}"))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = stats(&m);
    assert_ok(&m.unmount(&[]), "unmount");
    eprintln!("{s}");
    let check = [
        "import sys, zarr",
        "for name in ('a', 'b'):",
        "    arr = zarr.open_array(sys.argv[1] + '/' + name, mode='r')[...]",
        "    for i in range(4):",
        "        for j in range(4):",
        "            v = arr[i*16:(i+1)*16, j*16:(j+1)*16]",
        "            assert (v == 10 * i + j + 1).all(), (name, i, j)",
    ]
    .join("\n");
    python_ok("native read", &check, &[&backing]);
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

/// A small tmpfs as BACKING, torn down on drop.
#[test]
fn a_full_backing_store_fails_the_writer_and_loses_nothing() {
    let (d, _, out) = dirs();
    let tmp = common::mount::Tmpfs::new(&d.path().join("small"), "3m");
    let backing = tmp.0.clone();
    // Leave about half a MiB free: half of the writer's data.
    fs::write(backing.join("filler"), vec![1u8; 5 * 512 * 1024]).unwrap();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    let w = writer("fill-up", &m.mountpoint, &out);
    assert_ok(&w, "fill-up writer");
    let report: Value = serde_json::from_str(stdout(&w).trim()).unwrap();
    assert_eq!(
        report["enospc"], true,
        "the writer did not see ENOSPC: {report}"
    );
    let s = stats(&m);
    assert!(!s["failed"].as_array().unwrap().is_empty(), "{s}");
    assert!(s["write_errors"].as_u64().unwrap() > 0);
    // Unmount refuses while the data cannot be written, names the shard, and keeps the mount.
    let refused = m.unmount(&[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("stays mounted"),
        "{}",
        stderr(&refused)
    );
    assert!(stderr(&refused).contains("full/c/"), "{}", stderr(&refused));
    assert!(common::mount::is_mounted(&m.mountpoint));
    // Space freed: everything is written.
    fs::remove_file(backing.join("filler")).unwrap();
    assert_ok(&m.unmount(&[]), "unmount after freeing space");
    check_backing(&backing, &out, &["full"]);
    drop(m);
}

#[test]
fn a_killed_daemon_loses_only_what_was_never_synced() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
        LIMIT,
    );
    let arr = small_array(&m, "a");
    fs::create_dir_all(arr.join("c/0")).unwrap();
    fs::create_dir_all(arr.join("c/3")).unwrap();
    fs::write(arr.join("c/0/0"), chunk(1)).unwrap();
    let mut b = fs::File::create(arr.join("c/0/1")).unwrap();
    b.write_all(&chunk(2)).unwrap();
    b.sync_all().unwrap();
    drop(b);
    fs::write(arr.join("c/3/3"), chunk(3)).unwrap();
    // The next mount replays the journal of the dead one: what was fsync'ed goes into its
    // shard before the mount goes live.
    let again = m.crash_and_remount(&["--chunks-per-shard", "2"], LIMIT);
    assert_eq!(stats(&again)["replayed_records"], 1);
    assert_ok(&again.unmount(&[]), "unmount after replay");
    // No torn shard, and the fsync'ed chunk is there. The others were never synced: lost
    // (or, for the one beside it, possibly kept), never torn.
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    let check = [
        "import sys, zarr",
        "a = zarr.open_array(sys.argv[1], mode='r')",
        "assert (a[0:16, 16:32] == 2).all()",
        "assert (a[0:16, 0:16] == 0).all() or (a[0:16, 0:16] == 1).all()",
        "assert (a[48:64, 48:64] == 0).all()",
    ]
    .join("\n");
    python_ok("native read after the kill", &check, &[&backing.join("a")]);
}

#[test]
fn a_chunk_renamed_in_then_its_directory_fsynced_survives_a_kill_before_close() {
    // tensorstore's order: write KEY.__lock, fsync it, rename it onto KEY, fsync the
    // directory, and close only then. Once the directory's fsync returns, the chunk is
    // durable, though its file is still open.
    let (_d, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
        LIMIT,
    );
    let arr = small_array(&m, "a");
    fs::create_dir_all(arr.join("c/1")).unwrap();
    let dir = fs::File::open(arr.join("c/1")).unwrap();
    let tmp = arr.join("c/1/1.__lock");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)
        .unwrap();
    f.write_all(&chunk(5)).unwrap();
    f.sync_all().unwrap();
    fs::rename(&tmp, arr.join("c/1/1")).unwrap();
    dir.sync_all().unwrap();
    assert_eq!(stats(&m)["live_records"], 1);
    m.kill_daemon();
    drop(f);
    drop(dir);
    m.crash();
    // The shard was new: the chunk waits in its body, which the next mount replays.
    let bodies: Vec<String> = files_below(&backing)
        .into_iter()
        .filter(|f| f.starts_with(".shardfs/journal/") && f.ends_with(".body"))
        .collect();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    let again = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    assert_eq!(stats(&again)["replayed_records"], 1);
    assert_ok(&again.unmount(&[]), "unmount after replay");
    let v = shardfs_timeout(&["verify", backing.to_str().unwrap()], CLIENT);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    let check = "import sys, zarr\na = zarr.open_array(sys.argv[1], mode='r')\n\
                 assert (a[16:32, 16:32] == 5).all()\nassert (a[0:16, :] == 0).all()";
    python_ok("native read after the kill", check, &[&backing.join("a")]);
    let left: Vec<String> = files_below(&backing)
        .into_iter()
        .filter(|f| f.starts_with(".shardfs/journal/") && !f.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "journal files left after replay: {left:?}");
}

#[test]
fn an_unlink_then_its_directory_fsynced_survives_a_kill() {
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let m = Mounted::new(&backing, &args, LIMIT);
    let arr = small_array(&m, "a");
    fs::create_dir_all(arr.join("c/0")).unwrap();
    fs::write(arr.join("c/0/0"), chunk(1)).unwrap();
    fs::write(arr.join("c/0/1"), chunk(2)).unwrap();
    assert_ok(&m.unmount(&[]), "unmount");
    // The shard holds both; one is removed, and the removal fsynced (the directory).
    let m = Mounted::new(&backing, &args, LIMIT);
    fs::remove_file(m.path("a/c/0/1")).unwrap();
    fs::File::open(m.path("a/c/0")).unwrap().sync_all().unwrap();
    let again = m.crash_and_remount(&args, LIMIT);
    assert_eq!(fs::read(again.path("a/c/0/0")).unwrap(), chunk(1));
    assert!(
        !again.path("a/c/0/1").exists(),
        "a removal whose fsync returned came back after a crash"
    );
    assert_ok(&again.unmount(&[]), "unmount");
}

/// Chunks written through the mount leave no copy in the kernel's page cache (the mount
/// holds their bytes until their shard is written), and a writer may still map one
/// shared and write through the mapping.
#[test]
fn written_chunks_are_not_cached_twice_and_can_be_mapped() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    let dir = m.path("a");
    fs::create_dir_all(dir.join("c")).unwrap();
    let doc = r#"{"zarr_format":3,"node_type":"array","shape":[4194304],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1048576]}},
"chunk_key_encoding":{"name":"default"},"fill_value":0,"codecs":[{"name":"bytes"}]}"#;
    fs::write(dir.join("zarr.json"), doc).unwrap();
    let mut f = fs::File::create(dir.join("c/0")).unwrap();
    f.write_all(&vec![5u8; 1 << 20]).unwrap();
    // Asked on the writer's own descriptor (another open could drop the pages).
    assert_eq!(cached_pages(&f), 0, "pages of c/0 in the page cache");
    drop(f);
    let code = "import mmap, os, sys\n\
                fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n\
                os.ftruncate(fd, 1 << 20)\n\
                m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED)\n\
                m[:] = bytes([7]) * (1 << 20)\n\
                m.flush(); m.close(); os.close(fd)";
    python_ok("a shared mapping", code, &[&dir.join("c/1")]);
    assert_eq!(fs::read(dir.join("c/1")).unwrap(), vec![7u8; 1 << 20]);
    assert_eq!(fs::read(dir.join("c/0")).unwrap(), vec![5u8; 1 << 20]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Pages of `f` in the kernel's page cache (`cachestat(2)`, Linux 6.5).
fn cached_pages(f: &fs::File) -> u64 {
    use std::os::fd::AsRawFd;
    let range = [0u64, 0]; // offset, length (0: to the end)
    let mut stat = [0u64; 5]; // nr_cache, nr_dirty, nr_writeback, nr_evicted, recently
    let r = unsafe {
        libc::syscall(
            451 as libc::c_long, // SYS_cachestat on x86_64 and aarch64 (the unified table)
            f.as_raw_fd(),
            range.as_ptr(),
            stat.as_mut_ptr(),
            0,
        )
    };
    assert_eq!(r, 0, "cachestat: {}", std::io::Error::last_os_error());
    stat[0]
}

//! Mounts over an object store, every test run against each store shardfs supports:
//! moto's S3 server, fake-gcs-server behind the XML layer (`tests/py/gcs_layer.py`) and
//! Azurite, each started by the test on 127.0.0.1 and stopped with it
//! (`common::stores`). The real clients write through the mount; the bucket is then read
//! natively, as the sharded arrays it must hold.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::mount::{Mounted, run_timeout, stats};
use common::stores::{Kind, StoreServer};
use common::{all_succeed, assert_ok, create_shared, spawn_shared, stderr};

const LIMIT: Duration = Duration::from_secs(400);

fn script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

fn clients(args: &[&str]) -> Output {
    run_timeout(
        Command::new(common::python())
            .arg(script("s3_clients.py"))
            .args(args),
        Duration::from_secs(300),
    )
}

/// A mount of `prefix` in the server's bucket, with its own cache directory (as on a
/// node of its own).
fn mount(server: &StoreServer, prefix: &str, extra: &[&str]) -> (Mounted, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    (mount_with_cache(server, prefix, cache.path(), extra), cache)
}

fn mount_with_cache(server: &StoreServer, prefix: &str, cache: &Path, extra: &[&str]) -> Mounted {
    let mut args = vec!["--cache-dir", cache.to_str().unwrap()];
    args.extend_from_slice(extra);
    let url = server.url(prefix);
    Mounted::with_env(Path::new(&url), &args, &server.env(), LIMIT)
}

/// zarr-python writes array `z` and tensorstore array `t`, chunk by chunk, through `m`.
fn both_clients_write(m: &Mounted) {
    assert_ok(
        &clients(&["write-zarr", m.path("z").to_str().unwrap()]),
        "zarr-python writes",
    );
    assert_ok(
        &clients(&["write-ts", m.path("t").to_str().unwrap()]),
        "tensorstore writes",
    );
}

every_store!(
    both_clients_write_one_put_per_shard,
    two_mounts_write_interleaved_chunks_of_the_same_shards,
    a_store_that_goes_away_loses_nothing,
    a_shard_changed_between_read_and_write_is_merged_again,
    fsynced_chunks_of_a_killed_mount_land_from_its_local_journal,
    an_object_mount_publishes_new_files_and_refuses_what_it_cannot,
    chunk_files_copied_in_before_their_metadata_are_sharded,
    one_open_sees_one_version_and_a_fresh_open_the_newest,
    a_reader_is_never_stale_for_a_rewrite_of_other_chunks,
    a_reader_is_never_stale_for_rewrites_of_a_native_shard,
    a_killed_nodes_journal_never_overwrites_a_newer_write,
    a_stale_zarr_json_never_overwrites_another_nodes_new_array,
    a_bucket_gone_is_an_error_never_absent,
    parallel_unmounts_merge_and_never_fail,
    keys_the_mount_cannot_name_are_skipped_and_the_rest_shown,
    a_removal_never_takes_a_version_written_after_it_looked,
    a_time_from_the_future_never_freezes_a_chunk,
    another_nodes_new_document_is_seen_within_seconds,
    a_journaled_chunk_never_lands_in_an_array_made_again_otherwise,
    a_refused_document_is_not_taken_when_sent_again,
    a_look_while_the_bucket_is_gone_keeps_the_tree,
);

fn both_clients_write_one_put_per_shard(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(&server, "data", &["--chunks-per-shard", "2"]);
    both_clients_write(&m);
    // 128 chunks, each looked up, opened and closed several times: a shard's version, once
    // seen, answers for a second, so reads of the store stay well below one per chunk.
    let requests = &stats(&m)["store_requests"];
    let reads = requests["get"].as_u64().unwrap() + requests["head"].as_u64().unwrap();
    eprintln!("store requests while writing: {requests}");
    assert!(reads < 64, "{requests}");
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    for array in ["z", "t"] {
        let shards = server.keys(&format!("data/{array}/c/"));
        // 128^3 in 32^3 chunks, 2x2x2 chunks per shard: 8 shards, each PUT once.
        assert_eq!(shards.len(), 8, "{array}: {shards:?}");
        for shard in &shards {
            assert_eq!(
                server.puts(shard),
                1,
                "{shard}: {:?}",
                server.proxy.requests()
            );
        }
        let key = format!("data/{array}");
        assert_ok(
            &clients(&["check-zarr", &server.native(), &key]),
            "zarr-python reads natively",
        );
        if kind == Kind::S3 {
            assert_ok(
                &clients(&["check-ts", &server.native(), &key]),
                "tensorstore reads natively",
            );
        }
    }
    // A new mount (a new cache) shows what the bucket holds.
    let (m, _cache) = mount(&server, "data", &[]);
    for array in ["z", "t"] {
        let path = m.path(array);
        assert_ok(
            &clients(&["check-local", path.to_str().unwrap()]),
            "read through a mount",
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

fn two_mounts_write_interleaved_chunks_of_the_same_shards(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "0.2"];
    let (a, _ca) = mount(&server, "shared", &args);
    create_shared(&a.path("a"));
    // The second mount finds the array in the bucket.
    let (b, _cb) = mount(&server, "shared", &args);
    // tensorstore fsyncs every chunk; each mount writes its shards as they idle, over the
    // other mount's versions.
    all_succeed(vec![
        spawn_shared(&["write", a.path("a").to_str().unwrap(), "0", "2"]),
        spawn_shared(&["write", b.path("a").to_str().unwrap(), "1", "2"]),
    ]);
    let conflicts: u64 = [&a, &b]
        .iter()
        .map(|m| stats(m)["write_conflicts"].as_u64().unwrap())
        .sum();
    eprintln!("conflicts met and merged again: {conflicts}");
    assert_ok(&a.unmount(&[]), "unmount a");
    assert_ok(&b.unmount(&[]), "unmount b");
    assert_ok(
        &clients(&["check-shared", &server.native(), "shared/a"]),
        "every chunk landed",
    );
}

fn a_store_that_goes_away_loses_nothing(kind: Kind) {
    let server = StoreServer::start(kind);
    let proxy = &server.proxy;
    let (m, _cache) = mount(
        &server,
        "gone",
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
    );
    let path = m.path("z");
    let path = path.to_str().unwrap();
    assert_ok(&clients(&["create-zarr", path]), "the array made");
    // Half of every shard while the store is there: the shards wait for the rest.
    assert_ok(&clients(&["fill-zarr", path, "even"]), "half written");
    proxy.set_down(true);
    // zarr.json cannot be published: the writer gets EIO, and nothing is half made.
    let refused = clients(&["create-zarr", m.path("y").to_str().unwrap()]);
    assert!(
        !refused.status.success(),
        "a document written to a store that is gone"
    );
    assert!(
        stderr(&refused).contains("Input/output error"),
        "{}",
        stderr(&refused)
    );
    // The other half: the first shard complete at a close is written, which fails; that
    // close, and every later one into a shard that failed, reports EIO to the writer.
    let failed = clients(&["fill-zarr", path, "odd"]);
    assert!(
        !failed.status.success(),
        "a shard written to a store that is gone"
    );
    assert!(
        stderr(&failed).contains("Input/output error"),
        "{}",
        stderr(&failed)
    );
    let held = stats(&m);
    assert!(held["pending_chunks"].as_u64().unwrap() > 32, "{held}");
    assert!(held["write_errors"].as_u64().unwrap() > 0, "{held}");
    // A flush cannot write them: on a terminal it shows its progress while it tries, then
    // fails and names them by their URL.
    let cmd = format!(
        "{} flush {}",
        env!("CARGO_BIN_EXE_shardfs"),
        m.mountpoint.display()
    );
    let flushed = run_timeout(
        Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        Duration::from_secs(180),
    );
    let text = String::from_utf8_lossy(&flushed.stdout);
    assert_eq!(flushed.status.code(), Some(1), "{text}");
    assert!(text.contains(&server.url("gone/z/c/")), "{text}");
    assert!(text.contains("writing: 8 shards"), "{text}");
    // What was written stays, in memory, and unmounting refuses to drop it.
    let refused = m.unmount(&[]);
    assert!(
        !refused.status.success(),
        "unmount wrote to a store that is gone"
    );
    proxy.set_down(false);
    // Back: the writer does again what failed, and everything lands.
    assert_ok(&clients(&["fill-zarr", path, "odd"]), "written again");
    assert_ok(
        &clients(&["check-local", path]),
        "read once the store is back",
    );
    assert_ok(&m.unmount(&[]), "unmount once the store is back");
    drop(m);
    // Nothing reached the store while it was gone; a shard whose chunks the writer wrote
    // again after it was complete is written again (and the first rename once the store
    // is back retries every shard that failed: one more write of the shard it completes).
    let shards: Vec<(String, usize)> = server
        .keys("gone/z/c/")
        .into_iter()
        .map(|k| (server.puts(&k), k))
        .map(|(n, k)| (k, n))
        .collect();
    assert_eq!(shards.len(), 8, "{shards:?}");
    assert!(
        shards.iter().all(|(_, n)| (1..=3).contains(n)),
        "{shards:?}"
    );
    assert!(
        shards.iter().filter(|(_, n)| *n == 3).count() <= 1,
        "{shards:?}"
    );
    assert_ok(
        &clients(&["check-zarr", &server.native(), "gone/z"]),
        "everything landed",
    );
}

fn a_shard_changed_between_read_and_write_is_merged_again(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (m, _cache) = mount(&server, "conf", &args);
    create_shared(&m.path("a"));
    // Chunk 0 through the mount: its shard (the 4x4 chunks at the top left) waits,
    // incomplete.
    python_chunk(&m.path("a"), 0);
    // The mount's PUT of that shard is held back; meanwhile a native writer puts chunk 1
    // into the same shard, so the version the mount read is no longer the one there.
    let (seen, release) = server.proxy.hold_once("PUT", "conf/a/c/0/0");
    let unmount = {
        let mountpoint = m.mountpoint.clone();
        std::thread::spawn(move || {
            common::mount::shardfs_timeout(
                &["unmount", mountpoint.to_str().unwrap()],
                Duration::from_secs(120),
            )
        })
    };
    seen.recv_timeout(Duration::from_secs(60))
        .expect("the mount writes the shard at unmount");
    assert_ok(
        &clients(&["native-chunk", &server.native(), "conf/a", "1"]),
        "native write",
    );
    release.send(()).unwrap();
    assert_ok(&unmount.join().unwrap(), "unmount");
    drop(m);
    // Without its precondition the mount's PUT would have dropped chunk 1.
    let check = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, shared, zarr\n\
         a = zarr.open_array(s3_clients.native_store({:?}), path='conf/a', mode='r')[...]\n\
         assert (a[shared.region(0)] == 1).all(), 'chunk 0 (the mount) lost'\n\
         assert (a[shared.region(1)] == 2).all(), 'chunk 1 (native) lost'\n\
         s3_clients.done()",
        script(""),
        server.native()
    );
    common::mount::python_ok("both chunks in the shard", &check, &[]);
    // The held PUT failed its precondition; the merge that followed is the one that landed.
    let refused = server
        .proxy
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("conf/a/c/0/0"))
        // (Azure answers a create over an existing blob with 409.)
        .filter(|r| matches!(r.status, Some(412 | 409)))
        .count();
    assert!(refused >= 1, "{:?}", server.proxy.requests());
    assert_eq!(server.puts("conf/a/c/0/0"), 1, "the merge, once");
}

/// Writes chunk `k` of shared.py's array at `path` (value k + 1) with plain file I/O.
fn python_chunk(path: &Path, k: u64) {
    let code = "import sys, zarr, numpy as np\n\
                sys.path.insert(0, sys.argv[2]); import shared\n\
                a = zarr.open_array(sys.argv[1], mode='r+')\n\
                k = int(sys.argv[3]); a[shared.region(k)] = k + 1";
    let out = run_timeout(
        Command::new(common::python())
            .args(["-c", code])
            .arg(path)
            .arg(script(""))
            .arg(k.to_string()),
        Duration::from_secs(120),
    );
    assert_ok(&out, "chunk through the mount");
}

fn fsynced_chunks_of_a_killed_mount_land_from_its_local_journal(kind: Kind) {
    let server = StoreServer::start(kind);
    let cache = tempfile::tempdir().unwrap();
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let m = mount_with_cache(&server, "crash", cache.path(), &args);
    create_shared(&m.path("a"));
    // 63 of the 64 chunks of the array's one shard, each fsynced: the shard waits for the
    // last one, its chunks only in memory and in the journal on this node's disk.
    let code = "import os, sys\n\
                for k in range(63):\n\
                \x20   i, j = divmod(k, 8)\n\
                \x20   d = os.path.join(sys.argv[1], 'c', str(i))\n\
                \x20   os.makedirs(d, exist_ok=True)\n\
                \x20   fd = os.open(os.path.join(d, str(j)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n\
                \x20   os.write(fd, bytes([k + 1]) * 64)\n\
                \x20   os.fsync(fd)\n\
                \x20   os.close(fd)";
    common::mount::python_ok("fsynced chunks", code, &[&m.path("a")]);
    assert!(
        server.keys("crash/a/c/").is_empty(),
        "nothing in the store yet"
    );
    m.kill_daemon();
    drop(m);
    // The next mount on this node (same cache, named as the journal's place) replays the
    // journal into the store.
    let mut again_args = vec!["--journal-dir", cache.path().to_str().unwrap()];
    again_args.extend_from_slice(&args);
    let url = server.url("crash");
    let again = Mounted::with_env(Path::new(&url), &again_args, &server.env(), LIMIT);
    assert_ok(&again.unmount(&[]), "unmount");
    drop(again);
    let check = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, shared, zarr\n\
         a = zarr.open_array(s3_clients.native_store({:?}), path='crash/a', mode='r')[...]\n\
         lost = [k for k in range(63) if not (a[shared.region(k)] == k + 1).all()]\n\
         assert not lost, lost\n\
         assert (a[shared.region(63)] == 0).all()\n\
         s3_clients.done()",
        script(""),
        server.native()
    );
    common::mount::python_ok("every fsynced chunk landed", &check, &[]);
}

fn an_object_mount_publishes_new_files_and_refuses_what_it_cannot(kind: Kind) {
    let server = StoreServer::start(kind);
    let cache = tempfile::tempdir().unwrap();
    let m = mount_with_cache(&server, "files", cache.path(), &[]);
    let code = "import os, sys\n\
                open(os.path.join(sys.argv[1], 'notes.txt'), 'w').write('hello')\n\
                os.makedirs(os.path.join(sys.argv[1], 'd'))\n\
                open(os.path.join(sys.argv[1], 'd', 'f'), 'w').write('x')";
    common::mount::python_ok("new files", code, &[&m.mountpoint]);
    // The cache belongs to the running mount: a second mount of it is refused.
    let second = tempfile::tempdir().unwrap();
    let refused = run_timeout(
        Command::new(env!("CARGO_BIN_EXE_shardfs"))
            .args(["mount", &server.url("files")])
            .arg(second.path())
            .arg("--cache-dir")
            .arg(cache.path())
            .envs(server.env()),
        Duration::from_secs(60),
    );
    assert!(!refused.status.success(), "a second mount of one cache");
    assert!(stderr(&refused).contains("running"), "{}", stderr(&refused));
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    // New files were held in memory and published whole.
    assert_eq!(server.keys("files/"), vec!["files/d/f", "files/notes.txt"]);
    let m = mount_with_cache(&server, "files", cache.path(), &[]);
    let code = "import errno, os, sys\n\
                os.chdir(sys.argv[1])\n\
                assert open('notes.txt').read() == 'hello'\n\
                try:\n    open('notes.txt', 'a').write('more'); sys.exit('changed in place')\n\
                except OSError as e:\n    assert e.errno == errno.EOPNOTSUPP, e\n\
                try:\n    os.rename('d', 'e'); sys.exit('a directory renamed')\n\
                except OSError as e:\n    assert e.errno == errno.EXDEV, e\n\
                os.rename('notes.txt', 'moved.txt')\n\
                assert open('moved.txt').read() == 'hello'";
    common::mount::python_ok("refusals and a move", code, &[&m.mountpoint]);
    assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(server.keys("files/"), vec!["files/d/f", "files/moved.txt"]);
}

fn chunk_files_copied_in_before_their_metadata_are_sharded(kind: Kind) {
    let server = StoreServer::start(kind);
    // An unsharded array written natively beside the mount.
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("a");
    create_shared(&src);
    all_succeed(vec![
        spawn_shared(&["write", src.to_str().unwrap(), "0", "1"]),
        spawn_shared(&["write", src.to_str().unwrap(), "1", "1"]),
    ]);
    let (m, _cache) = mount(&server, "imp", &["--chunks-per-shard", "4"]);
    // The chunk files first (held in memory: the directory is no array yet), then zarr.json.
    std::fs::create_dir(m.path("a")).unwrap();
    let cp = Command::new("cp")
        .arg("-r")
        .arg(src.join("c"))
        .arg(m.path("a"))
        .output()
        .unwrap();
    assert_ok(&cp, "cp -r c");
    std::fs::copy(src.join("zarr.json"), m.path("a/zarr.json")).unwrap();
    assert_ok(&m.unmount(&[]), "unmount");
    assert_ok(
        &clients(&["check-shared", &server.native(), "imp/a"]),
        "every chunk, sharded",
    );
    // Only shards (4 of them) below the array: no chunk file reached the store as it was.
    let stored = server.keys("imp/a/c/");
    assert_eq!(stored.len(), 4, "{stored:?}");
}

#[test]
fn a_file_url_is_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let m = Mounted::new(Path::new(&url), &[], LIMIT);
    std::fs::write(m.path("x"), b"y").unwrap();
    assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(std::fs::read(dir.path().join("x")).unwrap(), b"y");
}

// Between nodes: each mount has a cache of its own, as on a machine of its own.

/// `shardfs flush` of the mount `m`, which must succeed.
fn flush(m: &Mounted) {
    assert_ok(
        &common::mount::shardfs_timeout(
            &["flush", m.mountpoint.to_str().unwrap()],
            Duration::from_secs(120),
        ),
        "flush",
    );
}

/// Runs Python `code` with `args`: it prints `ready` once prepared, and goes on once
/// `between` has run; it must succeed.
fn python_between(code: &str, args: &[&Path], between: impl FnOnce()) {
    let mut child = Command::new(common::python())
        .args(["-c", code])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    between();
    if line.trim() == "ready" {
        let _ = std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n");
    }
    let out = child.wait_with_output().unwrap();
    assert_ok(&out, &format!("{args:?} (it said {line:?} before)"));
}

/// `shardfs unmount --give-up` of `m`: it unmounts, naming what it gave up.
fn give_up(m: &Mounted) {
    let out = m.unmount(&["--give-up"]);
    let text = common::stdout(&out) + &stderr(&out);
    assert!(text.contains("giving up on"), "{text}");
    assert!(!common::mount::is_mounted(&m.mountpoint), "{text}");
}

/// Writes `bytes` to `path` and fsyncs it.
fn write_fsynced(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

/// Issue 19, defect 1: node A replaces a 4 MiB chunk (one per shard) while node B reads it.
/// B's open handle returned the old version's first MiB and the new one's rest, and fresh
/// opens kept the old pages for good. One open sees one version or fails (ESTALE) as a
/// whole, also after another open on B read the new version (the kernel's page cache is
/// shared by the opens of an inode); a fresh open after the TTL sees the newest.
fn one_open_sees_one_version_and_a_fresh_open_the_newest(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "1", "--idle-flush", "600"];
    let (a, _ca) = mount(&server, "ver", &args);
    let fill = "import sys, zarr\n\
                a = zarr.open_array(sys.argv[1], mode='r+'); a[:] = int(sys.argv[2])";
    let array = a.path("big");
    let create = "import sys, zarr\n\
                  zarr.create_array(sys.argv[1], shape=(4 << 20,), chunks=(4 << 20,), \
                  dtype='uint8', compressors=None, fill_value=0)";
    common::mount::python_ok("the array made", create, &[&array]);
    common::mount::python_ok("0x11 written", fill, &[&array, Path::new("17")]);
    flush(&a);
    let (b, _cb) = mount(&server, "ver", &args);
    let reader = "import errno, os, sys, time, zarr\n\
        p = sys.argv[1]; chunk = os.path.join(p, 'c', '0'); MiB = 1 << 20\n\
        fd = os.open(chunk, os.O_RDONLY)\n\
        first = os.pread(fd, MiB, 0)\n\
        assert first == b'\\x11' * MiB, 'the first MiB'\n\
        print('ready', flush=True); sys.stdin.readline()\n\
        time.sleep(2.5)\n\
        other = open(chunk, 'rb').read()\n\
        assert other == b'\\x22' * (4 * MiB), f'another open: {other.count(0x11)} bytes of the old version'\n\
        try:\n\
        \x20   whole = first + b''.join(os.pread(fd, MiB, o) for o in range(MiB, 4 * MiB, MiB))\n\
        \x20   assert whole == b'\\x11' * (4 * MiB), f'one open saw two versions: {whole.count(0x11)} bytes of the old one'\n\
        except OSError as e:\n\
        \x20   assert e.errno == errno.ESTALE, e\n\
        \x20   print('ESTALE', file=sys.stderr)\n\
        os.close(fd)\n\
        now = open(chunk, 'rb').read()\n\
        assert now == b'\\x22' * (4 * MiB), f'a fresh open: {now.count(0x11)} bytes of the old version'\n\
        assert (zarr.open_array(p, mode='r')[...] == 0x22).all(), 'zarr-python through the node'";
    let mut child = Command::new(common::python())
        .args(["-c", reader])
        .arg(b.path("big"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready", "the reader on B");
    common::mount::python_ok("0x22 written", fill, &[&array, Path::new("34")]);
    flush(&a);
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ok(&out, "B read one version per open, then the newest");
}

/// The other side of defect 1's fix: a shard this mount rewrites for another chunk still
/// holds the chunk an open handle reads (same stamp), so that handle reads on, never
/// ESTALE, although the version it pinned is gone from the store.
fn a_reader_is_never_stale_for_a_rewrite_of_other_chunks(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(
        &server,
        "own",
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
    );
    let code = "import os, subprocess, sys, zarr\n\
        p, shardfs, mnt = sys.argv[1:4]; MiB = 1 << 20\n\
        a = zarr.create_array(p, shape=(8 * MiB,), chunks=(4 * MiB,), dtype='uint8', \
        compressors=None, fill_value=0)\n\
        a[:4 * MiB] = 0x11\n\
        subprocess.run([shardfs, 'flush', mnt], check=True)\n\
        fd = os.open(os.path.join(p, 'c', '0'), os.O_RDONLY)\n\
        first = os.pread(fd, MiB, 0)\n\
        a[4 * MiB:] = 0x33\n\
        subprocess.run([shardfs, 'flush', mnt], check=True)\n\
        whole = first + b''.join(os.pread(fd, MiB, o) for o in range(MiB, 4 * MiB, MiB))\n\
        assert whole == b'\\x11' * (4 * MiB), 'chunk 0 changed'";
    reads_on(
        &server,
        m,
        "chunk 0 read on while chunk 1 is written",
        code,
        "own/a/c/0",
    );
}

/// Runs the reader `code` on `m`'s array `a` (with the shardfs binary and the mount point,
/// for its flushes); the shard `shard` must have been written at least twice meanwhile.
fn reads_on(server: &StoreServer, m: Mounted, what: &str, code: &str, shard: &str) {
    let shardfs = Path::new(env!("CARGO_BIN_EXE_shardfs"));
    common::mount::python_ok(what, code, &[&m.path("a"), shardfs, &m.mountpoint]);
    let requests = server.proxy.requests();
    assert!(server.puts(shard) >= 2, "{requests:?}");
    assert_ok(&m.unmount(&[]), "unmount");
}

/// As above, for a shard a native writer made (it carries no times of shardfs's): the
/// versions this mount writes over it remember which chunks they kept, so a reader of the
/// native version reads on through two rewrites of the other chunk.
fn a_reader_is_never_stale_for_rewrites_of_a_native_shard(kind: Kind) {
    let server = StoreServer::start(kind);
    let native = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, zarr\n\
         MiB = 1 << 20\n\
         a = zarr.create_array(s3_clients.native_store({:?}), name='nat/a', shape=(8 * MiB,), \
         chunks=(4 * MiB,), shards=(8 * MiB,), dtype='uint8', compressors=None, fill_value=0)\n\
         a[:4 * MiB] = 0x11\n\
         s3_clients.done()",
        script(""),
        server.native()
    );
    common::mount::python_ok("a native sharded array", &native, &[]);
    let (m, _cache) = mount(&server, "nat", &["--idle-flush", "600"]);
    let code = "import os, subprocess, sys, zarr\n\
        p, shardfs, mnt = sys.argv[1:4]; MiB = 1 << 20\n\
        fd = os.open(os.path.join(p, 'c', '0'), os.O_RDONLY)\n\
        got = os.pread(fd, MiB, 0)\n\
        a = zarr.open_array(p, mode='r+')\n\
        for value, at in ((0x33, MiB), (0x44, 2 * MiB)):\n\
        \x20   a[4 * MiB:] = value\n\
        \x20   subprocess.run([shardfs, 'flush', mnt], check=True)\n\
        \x20   got += os.pread(fd, MiB, at)\n\
        got += os.pread(fd, MiB, 3 * MiB)\n\
        assert got == b'\\x11' * (4 * MiB), 'chunk 0 changed'";
    let what = "chunk 0 read on while chunk 1 is written twice";
    reads_on(&server, m, what, code, "nat/a/c/0");
}

/// Issue 19, defect 2: A fsyncs chunk 0 (journal only) and is killed; B writes chunk 0
/// anew and unmounts; A's next mount, on the same cache, replays its journal: its record is
/// older than what the store holds and must not replace it.
fn a_killed_nodes_journal_never_overwrites_a_newer_write(kind: Kind) {
    let server = StoreServer::start(kind);
    let cache = tempfile::tempdir().unwrap();
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let a = mount_with_cache(&server, "late", cache.path(), &args);
    std::fs::create_dir(a.path("x")).unwrap();
    std::fs::write(a.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::create_dir(a.path("x/c")).unwrap();
    write_fsynced(&a.path("x/c/0"), &[1; 16]);
    a.kill_daemon();
    drop(a);
    let (b, _cb) = mount(&server, "late", &args);
    std::fs::create_dir_all(b.path("x/c")).unwrap();
    write_fsynced(&b.path("x/c/0"), &[2; 16]);
    assert_ok(&b.unmount(&[]), "unmount B");
    drop(b);
    let again = mount_with_cache(&server, "late", cache.path(), &args);
    // The record was read and judged older than the store's chunk (the replay rule).
    let log = again.log_text();
    assert!(log.contains("journaled chunk not replayed"), "{log}");
    assert_ok(&again.unmount(&[]), "unmount A after its replay");
    drop(again);
    let (c, _cc) = mount(&server, "late", &[]);
    assert_eq!(
        std::fs::read(c.path("x/c/0")).unwrap(),
        vec![2; 16],
        "B's write, newer than A's record"
    );
    assert_ok(&c.unmount(&[]), "unmount");
}

/// A 1-D uint8 array of 8 chunks of 32 bytes: another layout than `LINE_ARRAY`'s.
const WIDE_ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[256],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[32]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

/// Issue 19, defect 3: B has array `x` open; A removes it and makes a new `x` of another
/// layout; B then writes a chunk and an attribute. B's stale document must not replace
/// A's (the write fails), nor may B's chunk land as a shard of the layout B knew.
fn a_stale_zarr_json_never_overwrites_another_nodes_new_array(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let (a, _ca) = mount(&server, "meta", &args);
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::write(a.path("x/c/0"), [1; 16]).unwrap();
    flush(&a);
    let (b, _cb) = mount(&server, "meta", &args);
    assert_eq!(std::fs::read(b.path("x/c/0")).unwrap(), vec![1; 16]);
    std::fs::remove_dir_all(a.path("x")).unwrap();
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), WIDE_ARRAY).unwrap();
    for k in 0..8 {
        std::fs::write(a.path(&format!("x/c/{k}")), [3; 32]).unwrap();
    }
    assert_ok(&a.unmount(&[]), "unmount A");
    drop(a);
    // B, which still knows the old layout, writes a chunk of it.
    std::fs::write(b.path("x/c/1"), [2; 16]).unwrap();
    // Each of B's changes below is made on a document another node replaced after B read
    // it (opened: the mount looks at the store then): by zarr-python (a temporary file
    // renamed onto zarr.json; the kernel retries a rename that fails with ESTALE, so the
    // refusal is EIO), written in place (Python reports what close() says: the document is
    // published then), and removed. Each is refused, and the store keeps the other node's.
    let doc = WIDE_ARRAY.replace(r#""attributes":{}"#, r#""attributes":{"b":1}"#);
    let code = format!(
        "import errno, os, sys, zarr\n\
         p, what = sys.argv[1], sys.argv[2]\n\
         if what == 'attribute':\n\
         \x20   a = zarr.open_array(p, mode='r+')\n\
         \x20   act = lambda: a.attrs.__setitem__('b', 2)\n\
         elif what == 'document':\n\
         \x20   f = open(p + '/zarr.json', 'w')\n\
         \x20   def act():\n\
         \x20       f.write({doc:?}); f.close()\n\
         else:\n\
         \x20   open(p + '/zarr.json').read()\n\
         \x20   act = lambda: os.unlink(p + '/zarr.json')\n\
         print('ready', flush=True); sys.stdin.readline()\n\
         try:\n\
         \x20   act()\n\
         except OSError as e:\n\
         \x20   assert e.errno == errno.EIO, (what, e)\n\
         else:\n\
         \x20   sys.exit(f\"B's stale {{what}} was taken\")"
    );
    let b_x = b.path("x");
    for (i, what) in ["attribute", "document", "removal"].iter().enumerate() {
        python_between(&code, &[&b_x, Path::new(what)], || {
            // Another node writes A's document again after B read it.
            let now = server.get("meta/x/zarr.json").unwrap();
            let mut again: serde_json::Value = serde_json::from_slice(&now).unwrap();
            again["attributes"]["round"] = serde_json::json!(i);
            server.put("meta/x/zarr.json", again.to_string().as_bytes());
        });
        let kept: serde_json::Value =
            serde_json::from_slice(&server.get("meta/x/zarr.json").expect("the document")).unwrap();
        assert_eq!(kept["shape"], serde_json::json!([256]), "{what}: {kept}");
        assert_eq!(kept["attributes"].get("b"), None, "{what}: {kept}");
        assert_eq!(kept["attributes"]["round"], i, "{what}: {kept}");
    }

    // B's chunk waits, never written as a shard of the old layout, and B's unmount says
    // why until it is given up.
    let refused = b.unmount(&[]);
    let text = common::stdout(&refused) + &stderr(&refused);
    assert!(!refused.status.success(), "{text}");
    assert!(text.contains("made anew by another node"), "{text}");
    give_up(&b);
    drop(b);
    let stored = server.get("meta/x/zarr.json").expect("A's document");
    let stored: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(stored["shape"], serde_json::json!([256]), "{stored}");
    let (c, _cc) = mount(&server, "meta", &[]);
    for k in 0..8 {
        assert_eq!(
            std::fs::read(c.path(&format!("x/c/{k}"))).unwrap(),
            vec![3; 32],
            "chunk {k} of A's array"
        );
    }
    assert_eq!(
        server.keys("meta/x/c/"),
        vec!["meta/x/c/0"],
        "A's one shard"
    );
    assert_ok(&c.unmount(&[]), "unmount");
}

/// Issue 19, defect 5: the server comes back empty (the bucket gone). Reads are errors,
/// never the fill value; unmount refuses, naming the URL; once the bucket is made again
/// the unmount lands the shard together with the array's metadata.
fn a_bucket_gone_is_an_error_never_absent(kind: Kind) {
    let mut server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let (m, _cache) = mount(&server, "lost", &args);
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::write(m.path("x/c/0"), [1; 16]).unwrap();
    flush(&m);
    // Pending when the server loses everything.
    std::fs::write(m.path("x/c/2"), [2; 16]).unwrap();
    server.restart_empty();
    std::thread::sleep(Duration::from_millis(1500));
    let eio = Some(libc::EIO);
    assert_eq!(
        common::mount::errno_of(std::fs::read(m.path("x/c/1"))),
        eio,
        "a chunk never written, in a bucket that is gone"
    );
    let refused = m.unmount(&[]);
    assert!(
        !refused.status.success(),
        "unmount into a bucket that is gone"
    );
    let text = common::stdout(&refused) + &stderr(&refused);
    assert!(text.contains(&server.url("lost/x/c/0")), "{text}");
    server.make_bucket();
    flush(&m);
    assert!(
        server.get("lost/x/zarr.json").is_some(),
        "the array's metadata published again with its shard: {:?}",
        server.keys("")
    );
    // Published again once: another node removing the array after is a removal, not a
    // loss (the array is not brought back); the chunk written into it here then waits,
    // named, until given up.
    std::fs::write(m.path("x/c/3"), [3; 16]).unwrap();
    let (other, _co) = mount(&server, "lost", &[]);
    std::fs::remove_dir_all(other.path("x")).unwrap();
    assert_ok(&other.unmount(&[]), "unmount the other node");
    drop(other);
    // (Past the second for which a document once looked at is believed.)
    std::thread::sleep(Duration::from_millis(1200));
    let refused = m.unmount(&[]);
    let text = common::stdout(&refused) + &stderr(&refused);
    assert!(!refused.status.success(), "{text}");
    assert!(text.contains("gone from the store"), "{text}");
    assert_eq!(
        server.get("lost/x/zarr.json"),
        None,
        "the removed array came back"
    );
    give_up(&m);
    drop(m);
    assert!(
        server.keys("lost/x").is_empty(),
        "{:?}",
        server.keys("lost/")
    );
}

/// Issue 19, defect 7: four mounts write interleaved chunks of shared shards and are
/// unmounted at once. A shard replaced by another node while it was being merged is read
/// and merged again, like any conflict: no unmount fails.
fn parallel_unmounts_merge_and_never_fail(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (first, _c0) = mount(&server, "four", &args);
    create_shared(&first.path("a"));
    let mut mounts = vec![(first, _c0)];
    for _ in 1..4 {
        mounts.push(mount(&server, "four", &args));
    }
    let writers = mounts
        .iter()
        .enumerate()
        .map(|(i, (m, _))| {
            let parity = (i % 2).to_string();
            spawn_shared(&["write", m.path("a").to_str().unwrap(), &parity, "1"])
        })
        .collect();
    all_succeed(writers);
    let unmounts: Vec<_> = mounts
        .iter()
        .map(|(m, _)| {
            let mountpoint = m.mountpoint.clone();
            std::thread::spawn(move || {
                common::mount::shardfs_timeout(
                    &["unmount", mountpoint.to_str().unwrap()],
                    Duration::from_secs(180),
                )
            })
        })
        .collect();
    for u in unmounts {
        assert_ok(&u.join().unwrap(), "an unmount among four");
    }
    assert_ok(
        &clients(&["check-shared", &server.native(), "four/a"]),
        "every chunk landed",
    );
}

/// Issue 19, defect 4: keys other tools may write that a path cannot name. One of them
/// anywhere below the prefix stopped `shardfs mount` ("Encountered object with invalid
/// path"); each is now skipped, said once in the log, and the rest shown.
fn keys_the_mount_cannot_name_are_skipped_and_the_rest_shown(kind: Kind) {
    let server = StoreServer::start(kind);
    // Each key, and the part of it the log names (a level of the listing the mount
    // cannot show: the common prefix, or the key itself).
    let mut odd = vec![("odd/a//b.txt", "odd/a//")];
    // (Azure's SDK sends no dot segment, and Azure takes no control character;
    // fake-gcs-server lists a control character unescaped, which no XML reader takes.)
    if kind != Kind::Azure {
        odd.extend([
            ("odd/x/../d.txt", "odd/x/../"),
            ("odd/y/./e.txt", "odd/y/./"),
        ]);
    }
    if kind == Kind::S3 {
        odd.extend([
            ("odd/t\tab.txt", "odd/t\tab.txt"),
            ("odd/\u{1}.txt", "odd/\u{1}.txt"),
        ]);
    }
    // And keys the tree cannot hold: an object named like a directory, a name longer
    // than a file system takes (each said once, with the error).
    let long = format!("odd/{}", "n".repeat(300));
    let unshowable = ["odd/f/g.txt", long.as_str()];
    for key in odd
        .iter()
        .map(|o| o.0)
        .chain(["odd/ok.txt", "odd/a/fine.txt", "odd/f"])
        .chain(unshowable)
    {
        server.put(key, b"data");
    }
    let stored = server.keys("odd/");
    for (key, _) in &odd {
        assert!(
            stored.contains(&key.to_string()),
            "{key:?} not stored as such: {stored:?}"
        );
    }
    let (m, _cache) = mount(&server, "odd", &[]);
    assert_eq!(std::fs::read(m.path("ok.txt")).unwrap(), b"data");
    assert_eq!(std::fs::read(m.path("a/fine.txt")).unwrap(), b"data");
    let mut top: Vec<String> = std::fs::read_dir(&m.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"data", "the object f");
    let mut expected = vec!["a", "f", "ok.txt"];
    if kind != Kind::Azure {
        expected.extend(["x", "y"]);
    }
    expected.sort();
    assert_eq!(top, expected);
    let log = m.log_text();
    for (_, named) in &odd {
        let said = log.matches(&format!("{named:?}")).count();
        assert_eq!(said, 1, "{named:?} said {said} times:\n{log}");
    }
    for (named, why) in [("f", "Not a directory"), (&long[4..], "too long")] {
        let said = log
            .lines()
            .filter(|l| l.contains(named) && l.contains(why))
            .count();
        assert_eq!(said, 1, "{named} said {said} times:\n{log}");
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

/// A removal of a shard's last chunk removes the shard only if it is still the version
/// the mount looked at: a chunk another writer put into it in between stays (the DELETE
/// is conditional; before, a HEAD then an unconditional DELETE lost it).
fn a_removal_never_takes_a_version_written_after_it_looked(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (m, _cache) = mount(&server, "rm", &args);
    create_shared(&m.path("a"));
    python_chunk(&m.path("a"), 0);
    flush(&m);
    let (seen, release) = server.proxy.hold_once("DELETE", "rm/a/c/0/0");
    // (The removal may write the shard at once, the shard's round being complete.)
    let flushing = {
        let (mountpoint, chunk) = (m.mountpoint.clone(), m.path("a/c/0/0"));
        std::thread::spawn(move || {
            std::fs::remove_file(chunk).unwrap();
            common::mount::shardfs_timeout(
                &["flush", mountpoint.to_str().unwrap()],
                Duration::from_secs(120),
            )
        })
    };
    if seen.recv_timeout(Duration::from_secs(30)).is_err() {
        panic!(
            "the mount never removed the emptied shard: {:?}\n{}",
            server.proxy.requests(),
            m.log_text()
        );
    }
    assert_ok(
        &clients(&["native-chunk", &server.native(), "rm/a", "1"]),
        "native write",
    );
    release.send(()).unwrap();
    assert_ok(&flushing.join().unwrap(), "flush");
    assert_ok(&m.unmount(&[]), "unmount");
    let check = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, shared, zarr\n\
         a = zarr.open_array(s3_clients.native_store({:?}), path='rm/a', mode='r')[...]\n\
         assert (a[shared.region(0)] == 0).all(), 'chunk 0 (removed) came back'\n\
         assert (a[shared.region(1)] == 2).all(), 'chunk 1 (native) lost'\n\
         s3_clients.done()",
        script(""),
        server.native()
    );
    common::mount::python_ok("the native chunk kept", &check, &[]);
}

/// A shard whose stamps say its chunks were written an hour from now (a node whose clock
/// runs fast, or a hostile bucket): before, every later write of those chunks was taken for
/// an older one and dropped, the writer told it succeeded. Such times are not believed.
fn a_time_from_the_future_never_freezes_a_chunk(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let (a, _ca) = mount(&server, "future", &args);
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::write(a.path("x/c/0"), [9; 16]).unwrap();
    assert_ok(&a.unmount(&[]), "unmount A");
    drop(a);
    // The shard's stamps block (8 times, then n, a crc32c and the magic, just before the
    // 8-entry index and its crc32c) forged to an hour ahead.
    let mut shard = server.get("future/x/c/0").expect("the shard");
    let index = 8 * 16 + 4;
    let block = shard.len() - index - (8 * 8 + 16);
    let ahead = (std::time::SystemTime::now() + Duration::from_secs(3600))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for k in 0..8 {
        shard[block + 8 * k..block + 8 * k + 8].copy_from_slice(&ahead.to_le_bytes());
    }
    assert_eq!(
        &shard[block + 72..block + 80],
        b"shfsstmp",
        "the stamps block"
    );
    let crc = crc32c_of(&shard[block..block + 68]);
    shard[block + 68..block + 72].copy_from_slice(&crc.to_le_bytes());
    server.put("future/x/c/0", &shard);
    let (b, _cb) = mount(&server, "future", &args);
    write_fsynced(&b.path("x/c/0"), &[2; 16]);
    assert_ok(&b.unmount(&[]), "unmount B");
    drop(b);
    let (c, _cc) = mount(&server, "future", &[]);
    assert_eq!(
        std::fs::read(c.path("x/c/0")).unwrap(),
        vec![2; 16],
        "B's write"
    );
    assert_ok(&c.unmount(&[]), "unmount");
}

/// CRC-32C (Castagnoli), as the shard format's checksums.
fn crc32c_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A mount took its tree from the store once, at mounting: another node's later
/// `zarr.json` (here an array made again as uint8 where it was uint16, its chunks the same
/// size) was never seen, and its new chunks were decoded with the old data type (1799 for
/// 7). Documents the mount knows are compared with the store's at most once a second.
fn another_nodes_new_document_is_seen_within_seconds(kind: Kind) {
    let server = StoreServer::start(kind);
    let doc = |dtype: &str, chunk: u32| {
        common::LINE_ARRAY
            .replace("uint8", dtype)
            .replace("[128]", &format!("[{}]", 4 * chunk))
            .replace("[16]", &format!("[{chunk}]"))
    };
    let (a, _ca) = mount(&server, "seen", &["--chunks-per-shard", "4"]);
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), doc("uint16", 16)).unwrap();
    for k in 0..4 {
        std::fs::write(a.path(&format!("x/c/{k}")), [7; 32]).unwrap();
    }
    flush(&a);
    let (b, _cb) = mount(&server, "seen", &[]);
    std::fs::remove_dir_all(b.path("x")).unwrap();
    std::fs::create_dir_all(b.path("x/c")).unwrap();
    std::fs::write(b.path("x/zarr.json"), doc("uint8", 32)).unwrap();
    for k in 0..4 {
        std::fs::write(b.path(&format!("x/c/{k}")), [7; 32]).unwrap();
    }
    assert_ok(&b.unmount(&[]), "unmount B");
    drop(b);
    std::thread::sleep(Duration::from_millis(2500));
    let check = "import sys, zarr\n\
                 a = zarr.open_array(sys.argv[1], mode='r')\n\
                 assert str(a.dtype) == 'uint8', a.dtype\n\
                 assert (a[...] == 7).all(), set(a[...].tolist())";
    common::mount::python_ok("A reads B's array", check, &[&a.path("x")]);
    assert_ok(&a.unmount(&[]), "unmount A");
}

/// A killed node's fsynced chunk of a uint8 array, replayed after another node made the
/// array again as uint16 on the same grid: the record is dropped, never a chunk the new
/// array cannot read.
fn a_journaled_chunk_never_lands_in_an_array_made_again_otherwise(kind: Kind) {
    let server = StoreServer::start(kind);
    let cache = tempfile::tempdir().unwrap();
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let a = mount_with_cache(&server, "remade", cache.path(), &args);
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    write_fsynced(&a.path("x/c/1"), &[1; 16]);
    a.kill_daemon();
    drop(a);
    let (b, _cb) = mount(&server, "remade", &args);
    std::fs::write(
        b.path("x/zarr.json"),
        common::LINE_ARRAY.replace("uint8", "uint16"),
    )
    .ok();
    std::fs::remove_dir_all(b.path("x")).unwrap();
    std::fs::create_dir_all(b.path("x/c")).unwrap();
    std::fs::write(
        b.path("x/zarr.json"),
        common::LINE_ARRAY.replace("uint8", "uint16"),
    )
    .unwrap();
    std::fs::write(b.path("x/c/0"), [2; 32]).unwrap();
    assert_ok(&b.unmount(&[]), "unmount B");
    drop(b);
    let again = mount_with_cache(&server, "remade", cache.path(), &args);
    let log = again.log_text();
    assert!(log.contains("reads chunks otherwise"), "{log}");
    assert_ok(&again.unmount(&[]), "unmount A");
    drop(again);
    let (c, _cc) = mount(&server, "remade", &[]);
    let check = "import sys, zarr\n\
                 a = zarr.open_array(sys.argv[1], mode='r')[...]\n\
                 assert a.dtype == 'uint16' and (a[:16] == 0x0202).all() and (a[16:] == 0).all(), a";
    common::mount::python_ok("B's array reads", check, &[&c.path("x")]);
    assert_ok(&c.unmount(&[]), "unmount");
}

/// After a refused `zarr.json` (another node's came first), sending the same content again
/// (the temporary file renamed once more, as a retrying tool does) is refused too: it was
/// made from the version another node replaced. Content made after is the writer's own
/// (a document read again, through the kernel's cache or not, then written).
fn a_refused_document_is_not_taken_when_sent_again(kind: Kind) {
    let server = StoreServer::start(kind);
    let (a, _ca) = mount(&server, "again", &[]);
    std::fs::create_dir_all(a.path("x")).unwrap();
    std::fs::write(a.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    let theirs = common::LINE_ARRAY.replace(r#""attributes":{}"#, r#""attributes":{"by":"B"}"#);
    server.put("again/x/zarr.json", theirs.as_bytes());
    let mine = common::LINE_ARRAY.replace(r#""attributes":{}"#, r#""attributes":{"by":"A"}"#);
    std::fs::write(a.path("x/tmp.json"), &mine).unwrap();
    let first = std::fs::rename(a.path("x/tmp.json"), a.path("x/zarr.json"));
    assert!(first.is_err(), "A's stale document taken");
    std::thread::sleep(Duration::from_millis(200));
    let again = std::fs::rename(a.path("x/tmp.json"), a.path("x/zarr.json"));
    assert!(again.is_err(), "A's stale document taken when sent again");
    let stored = String::from_utf8(server.get("again/x/zarr.json").unwrap()).unwrap();
    assert!(stored.contains(r#""by":"B""#), "{stored}");
    // Read again, then written: A's own change over B's.
    let code = "import sys, zarr\n\
                a = zarr.open_array(sys.argv[1], mode='r+')\n\
                assert a.attrs['by'] == 'B', dict(a.attrs)\n\
                a.attrs['also'] = 'A'";
    common::mount::python_ok("A reads B's and adds", code, &[&a.path("x")]);
    let stored: serde_json::Value =
        serde_json::from_slice(&server.get("again/x/zarr.json").unwrap()).unwrap();
    assert_eq!(stored["attributes"]["by"], "B", "{stored}");
    assert_eq!(stored["attributes"]["also"], "A", "{stored}");
    assert_ok(&a.unmount(&[]), "unmount");
}

/// A look at a document while the bucket is gone took the absence for another node's
/// removal and dropped the mount's copy, which the store then never got back. While the
/// store is known to have lost everything, nothing is taken from it; once it is back, the
/// tree is published again.
fn a_look_while_the_bucket_is_gone_keeps_the_tree(kind: Kind) {
    let mut server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let (m, _cache) = mount(&server, "keep", &args);
    std::fs::write(
        m.path("zarr.json"),
        r#"{"zarr_format":3,"node_type":"group","attributes":{"kept":1}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    std::fs::write(m.path("x/c/0"), [1; 16]).unwrap();
    flush(&m);
    std::fs::write(m.path("x/c/1"), [2; 16]).unwrap();
    server.restart_empty();
    std::thread::sleep(Duration::from_millis(1500));
    // The mount finds the bucket gone (a chunk read); its documents are looked at while
    // the store is gone and again once it is back, before anything is written.
    let _ = std::fs::read(m.path("x/c/2"));
    let _ = std::fs::read(m.path("zarr.json"));
    server.make_bucket();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(std::fs::read(m.path("zarr.json")).is_ok());
    assert!(std::fs::read(m.path("x/zarr.json")).is_ok());
    assert_ok(&m.unmount(&[]), "unmount once the bucket is back");
    drop(m);
    let group =
        String::from_utf8(server.get("keep/zarr.json").expect("the group's document")).unwrap();
    assert!(group.contains(r#""kept":1"#), "{group}");
    let (c, _cc) = mount(&server, "keep", &[]);
    assert_eq!(std::fs::read(c.path("x/c/1")).unwrap(), vec![2; 16]);
    assert_ok(&c.unmount(&[]), "unmount");
}

/// Whether a daemon serving (or about to serve) `mountpoint` is running.
fn daemon_running(mountpoint: &Path) -> bool {
    let wanted = mountpoint.to_str().unwrap().as_bytes().to_vec();
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        args.contains(&b"--foreground".as_slice()) && args.contains(&wanted.as_slice())
    })
}

/// A `shardfs mount` interrupted (Ctrl-C) while its daemon brings the store's tree over
/// never comes up later: the daemon finds its command gone and stops before mounting (it
/// went on and mounted about 25 s later, over whatever was mounted there by then, and
/// writes went to the wrong bucket).
#[test]
fn an_interrupted_mount_never_comes_up_later() {
    let server = StoreServer::start(Kind::S3);
    server.put("late/a/zarr.json", common::LINE_ARRAY.as_bytes());
    let (seen, release) = server.proxy.hold_once("GET", "late/a/zarr.json");
    let (cache, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let log = dir.path().join("shardfs.log");
    let url = server.url("late");
    let mut command = Command::new(common::shardfs_bin())
        .args(["mount", &url, mountpoint.to_str().unwrap(), "--cache-dir"])
        .arg(cache.path())
        .arg("--log-file")
        .arg(&log)
        .envs(server.env().iter().map(|(k, v)| (*k, v.as_str())))
        .spawn()
        .unwrap();
    seen.recv_timeout(Duration::from_secs(60))
        .expect("the daemon fetches the tree");
    // SAFETY: signalling a child of ours that has not been waited for.
    unsafe { libc::kill(command.id() as i32, libc::SIGINT) };
    let _ = command.wait();
    release.send(()).unwrap();
    let start = std::time::Instant::now();
    while daemon_running(&mountpoint) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the daemon goes on"
        );
        assert!(!common::mount::is_mounted(&mountpoint), "mounted after all");
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!common::mount::is_mounted(&mountpoint), "{said}");
    assert!(said.contains("gone (interrupted)"), "{said}");
}

/// libfaketime, which test.sh installs: a process started with it in LD_PRELOAD (and its
/// children) sees the clock FAKETIME says.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A node whose clock is 20 s slow orders its writes by the store's clock: its write of a
/// chunk made after another node's is the one the shard keeps, and its flush says so (the
/// write was dropped as the older one, and flush said all was durable).
#[test]
fn a_node_with_a_slow_clock_orders_its_writes_by_the_stores() {
    let server = StoreServer::start(Kind::S3);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (b, _cb) = mount(&server, "clock", &args);
    create_shared(&b.path("x"));
    assert_ok(
        &common::shardfs(&["flush", b.mountpoint.to_str().unwrap()]),
        "flush b",
    );
    let cache = tempfile::tempdir().unwrap();
    let mut slow_args = vec!["--cache-dir", cache.path().to_str().unwrap()];
    slow_args.extend(args);
    let mut env = server.env();
    env.push(("LD_PRELOAD", LIBFAKETIME.to_string()));
    env.push(("FAKETIME", "-20s".to_string()));
    let a = Mounted::with_env(Path::new(&server.url("clock")), &slow_args, &env, LIMIT);
    std::fs::create_dir_all(b.path("x/c/0")).unwrap();
    std::fs::write(b.path("x/c/0/0"), [0x11; 64]).unwrap();
    assert_ok(
        &common::shardfs(&["flush", b.mountpoint.to_str().unwrap()]),
        "flush b",
    );
    // Later by more than the store's clock can be read to (its Date is to the second).
    std::thread::sleep(Duration::from_millis(2500));
    std::fs::create_dir_all(a.path("x/c/0")).unwrap();
    std::fs::write(a.path("x/c/0/0"), [0x22; 64]).unwrap();
    assert_ok(
        &common::shardfs(&["flush", a.mountpoint.to_str().unwrap()]),
        "flush a",
    );
    let log = a.log_text();
    assert!(log.contains("s behind the store's"), "{log}");
    assert_ok(&a.unmount(&[]), "unmount a");
    assert_ok(&b.unmount(&[]), "unmount b");
    let (c, _cc) = mount(&server, "clock", &args);
    assert_eq!(
        std::fs::read(c.path("x/c/0/0")).unwrap(),
        [0x22; 64],
        "the later write"
    );
    assert_ok(&c.unmount(&[]), "unmount c");
}

/// A prefix holding thousands of small objects beside its arrays (logs, thumbnails) comes
/// up in seconds, every answer of the store 30 ms late: they are fetched many at a time
/// (one after another, 3,000 took 27 s on a local server, and at 30 ms the mount gave up
/// after 60 s).
#[test]
fn thousands_of_small_objects_beside_arrays_mount_in_seconds() {
    let server = StoreServer::start(Kind::S3);
    server.python(&format!(
        "from concurrent.futures import ThreadPoolExecutor\n\
         put = lambda i: s3.put_object(Bucket={:?}, Key=f'many/logs/{{i}}.txt', Body=b'x')\n\
         list(ThreadPoolExecutor(16).map(put, range(2000)))",
        common::stores::BUCKET
    ));
    server.put("many/a/zarr.json", common::LINE_ARRAY.as_bytes());
    server.proxy.fault(
        "GET",
        "",
        usize::MAX,
        common::proxy::Fault::Stall(Duration::from_millis(30)),
    );
    let start = std::time::Instant::now();
    let (m, _cache) = mount(&server, "many", &[]);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(20), "mounted in {took:?}");
    assert_eq!(std::fs::read(m.path("logs/1999.txt")).unwrap(), b"x");
    assert!(m.path("a/zarr.json").is_file());
    assert_ok(&m.unmount(&[]), "unmount");
}

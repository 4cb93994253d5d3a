//! Mounts over an object store: moto's S3 server, started by each test on 127.0.0.1 and
//! stopped with it. The real clients write through the mount; the bucket is then read
//! natively, as the sharded arrays it must hold.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::mount::{Mounted, run_timeout, stats};
use common::s3::{Proxy, S3Server};
use common::{all_succeed, assert_ok, create_shared, spawn_shared, stderr};

const BUCKET: &str = "shardfs-test";
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

/// A mount of `s3://BUCKET/prefix` through `endpoint`, with its own cache directory.
fn mount(endpoint: &str, prefix: &str, extra: &[&str]) -> (Mounted, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    (
        mount_with_cache(endpoint, prefix, cache.path(), extra),
        cache,
    )
}

fn mount_with_cache(endpoint: &str, prefix: &str, cache: &Path, extra: &[&str]) -> Mounted {
    let mut args = vec!["--cache-dir", cache.to_str().unwrap()];
    args.extend_from_slice(extra);
    let url = format!("s3://{BUCKET}/{prefix}");
    Mounted::with_env(Path::new(&url), &args, &s3_env(endpoint), LIMIT)
}

/// What a client of the S3 server at `endpoint` needs in its environment.
fn s3_env(endpoint: &str) -> [(&'static str, String); 5] {
    [
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ]
}

/// The keys below `prefix` and how many versions (PUTs that landed) each has.
fn versions(server: &S3Server, prefix: &str) -> Vec<(String, usize)> {
    let out = server.python(&format!(
        "import collections\n\
         c = collections.Counter(v['Key'] for v in s3.list_object_versions(Bucket={BUCKET:?}, \
         Prefix={prefix:?}).get('Versions', []))\n\
         print('\\n'.join(f'{{k}} {{n}}' for k, n in sorted(c.items())))"
    ));
    out.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, n)| (k.to_string(), n.parse().unwrap()))
        .collect()
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

#[test]
fn both_clients_write_through_an_s3_mount_one_put_per_shard() {
    let server = S3Server::start(BUCKET);
    let (m, _cache) = mount(&server.endpoint(), "data", &["--chunks-per-shard", "2"]);
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
        let shards = versions(&server, &format!("data/{array}/c/"));
        // 128^3 in 32^3 chunks, 2x2x2 chunks per shard: 8 shards, each PUT once.
        assert_eq!(shards.len(), 8, "{array}: {shards:?}");
        assert!(shards.iter().all(|(_, n)| *n == 1), "{array}: {shards:?}");
        let key = format!("data/{array}");
        let url = server.endpoint();
        assert_ok(
            &clients(&["check-zarr", &url, &key]),
            "zarr-python reads natively",
        );
        assert_ok(
            &clients(&["check-ts", &url, &key]),
            "tensorstore reads natively",
        );
    }
    // A new mount (a new cache) shows what the bucket holds.
    let (m, _cache) = mount(&server.endpoint(), "data", &[]);
    for array in ["z", "t"] {
        let path = m.path(array);
        assert_ok(
            &clients(&["check-local", path.to_str().unwrap()]),
            "read through a mount",
        );
    }
}

/// An `az://` mount (Azurite): both clients write chunk by chunk, each shard is one blob,
/// zarr-python reads the container natively, and a new mount reads it all back (its shard
/// indexes were read with a suffix range, which Azure refuses: every read was EIO).
#[test]
fn both_clients_write_through_an_azure_mount_and_read_back() {
    let server = common::azure::Azurite::start(BUCKET);
    let az_mount = |cache: &Path, extra: &[&str]| {
        let mut args = vec!["--cache-dir", cache.to_str().unwrap()];
        args.extend_from_slice(extra);
        let url = format!("az://{BUCKET}/data");
        Mounted::with_env(Path::new(&url), &args, &server.env(), LIMIT)
    };
    let cache = tempfile::tempdir().unwrap();
    let m = az_mount(cache.path(), &["--chunks-per-shard", "2"]);
    both_clients_write(&m);
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    for array in ["z", "t"] {
        let shards = server.blobs(BUCKET, &format!("data/{array}/c/"));
        // 128^3 in 32^3 chunks, 2x2x2 chunks per shard: 8 shards.
        assert_eq!(shards.len(), 8, "{array}: {shards:?}");
        let native = format!("azurite:{}", server.endpoint());
        assert_ok(
            &clients(&["check-zarr", &native, &format!("data/{array}")]),
            "zarr-python reads natively",
        );
    }
    // A new mount (a new cache) shows what the container holds.
    let cache = tempfile::tempdir().unwrap();
    let m = az_mount(cache.path(), &[]);
    for array in ["z", "t"] {
        let path = m.path(array);
        assert_ok(
            &clients(&["check-local", path.to_str().unwrap()]),
            "read through a new mount",
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn two_s3_mounts_write_interleaved_chunks_of_the_same_shards() {
    let server = S3Server::start(BUCKET);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "0.2"];
    let (a, _ca) = mount(&server.endpoint(), "shared", &args);
    create_shared(&a.path("a"));
    // The second mount finds the array in the bucket.
    let (b, _cb) = mount(&server.endpoint(), "shared", &args);
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
    let url = server.endpoint();
    assert_ok(
        &clients(&["check-shared", &url, "shared/a"]),
        "every chunk landed",
    );
}

#[test]
fn a_store_that_goes_away_loses_nothing() {
    let server = S3Server::start(BUCKET);
    let proxy = Proxy::start(server.port);
    let (m, _cache) = mount(
        &proxy.endpoint(),
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
    assert!(text.contains("s3://shardfs-test/gone/z/c/"), "{text}");
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
    let shards = versions(&server, "gone/z/c/");
    assert_eq!(shards.len(), 8, "{shards:?}");
    assert!(
        shards.iter().all(|(_, n)| (1..=3).contains(n)),
        "{shards:?}"
    );
    assert!(
        shards.iter().filter(|(_, n)| *n == 3).count() <= 1,
        "{shards:?}"
    );
    let url = server.endpoint();
    assert_ok(
        &clients(&["check-zarr", &url, "gone/z"]),
        "everything landed",
    );
}

#[test]
fn a_shard_changed_between_read_and_write_is_merged_again() {
    let server = S3Server::start(BUCKET);
    let proxy = Proxy::start(server.port);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (m, _cache) = mount(&proxy.endpoint(), "conf", &args);
    create_shared(&m.path("a"));
    // Chunk 0 through the mount: its shard (the 4x4 chunks at the top left) waits,
    // incomplete.
    python_chunk(&m.path("a"), 0);
    // The mount's PUT of that shard is held back; meanwhile a native writer puts chunk 1
    // into the same shard, so the version the mount read is no longer the one there.
    let (seen, release) = proxy.hold_once("PUT /shardfs-test/conf/a/c/0/0 ");
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
    let url = server.endpoint();
    assert_ok(
        &clients(&["native-chunk", &url, "conf/a", "1"]),
        "native write",
    );
    release.send(()).unwrap();
    assert_ok(&unmount.join().unwrap(), "unmount");
    drop(m);
    // Without its precondition the mount's PUT would have dropped chunk 1.
    let check = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, shared, zarr\n\
         a = zarr.open_array(s3_clients.native_store({url:?}), path='conf/a', mode='r')[...]\n\
         assert (a[shared.region(0)] == 1).all(), 'chunk 0 (the mount) lost'\n\
         assert (a[shared.region(1)] == 2).all(), 'chunk 1 (native) lost'\n\
         s3_clients.done()",
        script("")
    );
    common::mount::python_ok("both chunks in the shard", &check, &[]);
    let shard = versions(&server, "conf/a/c/0/0");
    assert_eq!(
        shard,
        vec![("conf/a/c/0/0".to_string(), 2)],
        "native's, then the merge"
    );
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

#[test]
fn fsynced_chunks_of_a_killed_s3_mount_land_from_its_local_journal() {
    let server = S3Server::start(BUCKET);
    let cache = tempfile::tempdir().unwrap();
    let args = ["--chunks-per-shard", "8", "--idle-flush", "600"];
    let m = mount_with_cache(&server.endpoint(), "crash", cache.path(), &args);
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
        versions(&server, "crash/a/c/").is_empty(),
        "nothing in the store yet"
    );
    m.kill_daemon();
    drop(m);
    // The next mount on this node (same cache, named as the journal's place) replays the
    // journal into the store.
    let url = format!("s3://{BUCKET}/crash");
    let mut again_args = vec!["--journal-dir", cache.path().to_str().unwrap()];
    again_args.extend_from_slice(&args);
    let again = Mounted::with_env(
        Path::new(&url),
        &again_args,
        &s3_env(&server.endpoint()),
        LIMIT,
    );
    assert_ok(&again.unmount(&[]), "unmount");
    drop(again);
    let url = server.endpoint();
    let check = format!(
        "import sys; sys.path.insert(0, {:?}); import s3_clients, shared, zarr\n\
         a = zarr.open_array(s3_clients.native_store({url:?}), path='crash/a', mode='r')[...]\n\
         lost = [k for k in range(63) if not (a[shared.region(k)] == k + 1).all()]\n\
         assert not lost, lost\n\
         assert (a[shared.region(63)] == 0).all()\n\
         s3_clients.done()",
        script("")
    );
    common::mount::python_ok("every fsynced chunk landed", &check, &[]);
}

/// The keys the bucket holds now below `prefix`.
fn keys(server: &S3Server, prefix: &str) -> Vec<String> {
    server
        .python(&format!(
            "r = s3.list_objects_v2(Bucket={BUCKET:?}, Prefix={prefix:?})\n\
             print('\\n'.join(o['Key'] for o in r.get('Contents', [])))"
        ))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_object_mount_publishes_new_files_and_refuses_what_it_cannot() {
    let server = S3Server::start(BUCKET);
    let cache = tempfile::tempdir().unwrap();
    let m = mount_with_cache(&server.endpoint(), "files", cache.path(), &[]);
    let code = "import os, sys\n\
                open(os.path.join(sys.argv[1], 'notes.txt'), 'w').write('hello')\n\
                os.makedirs(os.path.join(sys.argv[1], 'd'))\n\
                open(os.path.join(sys.argv[1], 'd', 'f'), 'w').write('x')";
    common::mount::python_ok("new files", code, &[&m.mountpoint]);
    // The cache belongs to the running mount: a second mount of it is refused.
    let second = tempfile::tempdir().unwrap();
    let refused = run_timeout(
        Command::new(env!("CARGO_BIN_EXE_shardfs"))
            .args(["mount", &format!("s3://{BUCKET}/files")])
            .arg(second.path())
            .arg("--cache-dir")
            .arg(cache.path())
            .envs(s3_env(&server.endpoint())),
        Duration::from_secs(60),
    );
    assert!(!refused.status.success(), "a second mount of one cache");
    assert!(stderr(&refused).contains("running"), "{}", stderr(&refused));
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    // New files were held in memory and published whole.
    assert_eq!(
        keys(&server, "files/"),
        vec!["files/d/f", "files/notes.txt"]
    );
    let m = mount_with_cache(&server.endpoint(), "files", cache.path(), &[]);
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
    assert_eq!(
        keys(&server, "files/"),
        vec!["files/d/f", "files/moved.txt"]
    );
}

#[test]
fn chunk_files_copied_in_before_their_metadata_are_sharded() {
    let server = S3Server::start(BUCKET);
    // An unsharded array written natively beside the mount.
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("a");
    create_shared(&src);
    all_succeed(vec![
        spawn_shared(&["write", src.to_str().unwrap(), "0", "1"]),
        spawn_shared(&["write", src.to_str().unwrap(), "1", "1"]),
    ]);
    let (m, _cache) = mount(&server.endpoint(), "imp", &["--chunks-per-shard", "4"]);
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
    let url = server.endpoint();
    assert_ok(
        &clients(&["check-shared", &url, "imp/a"]),
        "every chunk, sharded",
    );
    // Only shards (4 of them) below the array: no chunk file reached the store as it was.
    let stored = keys(&server, "imp/a/c/");
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

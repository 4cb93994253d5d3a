//! `shardfs flush`: the barrier between "written" and "hand BACKING to readers". Pending
//! shards, incomplete ones included, are written and synced while the mount stays.

mod common;

use std::path::Path;
use std::time::Duration;

use common::mount::{Mounted, dirs, is_mounted, python_ok, shardfs_timeout, stats};
use common::{assert_ok, stderr, stdout};

const LIMIT: Duration = Duration::from_secs(300);
const LIMIT_TIME: Duration = LIMIT;

/// zarr-python makes `name` (64x64 uint8 in 16x16 chunks) and writes two of the four
/// chunks of its first shard (the others are fill value, which zarr-python skips).
fn half_a_shard(m: &Mounted, name: &str) {
    let code = "import sys, zarr\n\
                a = zarr.create_array(sys.argv[1], shape=(64, 64), chunks=(16, 16), \
                dtype='uint8', compressors=None, fill_value=0)\n\
                a[0:16, 0:16] = 1\n\
                a[16:32, 16:32] = 2";
    python_ok("half a shard", code, &[&m.path(name)]);
}

/// zarr-python reads `array` in BACKING, natively sharded, as `half_a_shard` wrote it.
fn reads_natively(array: &Path) {
    let code = "import sys, zarr, numpy as np\n\
                a = zarr.open_array(sys.argv[1], mode='r')\n\
                assert a.shards == (32, 32), a.shards\n\
                want = np.zeros((64, 64), dtype='uint8')\n\
                want[0:16, 0:16] = 1\n\
                want[16:32, 16:32] = 2\n\
                assert (a[...] == want).all()";
    python_ok("native read", code, &[array]);
}

/// A mount over `backing` whose incomplete shards wait (no idle writes), 2x2 per shard.
fn waiting_mount(backing: &Path) -> Mounted {
    Mounted::new(
        backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
        LIMIT,
    )
}

fn flush(args: &[&str]) -> std::process::Output {
    let mut all = vec!["flush"];
    all.extend_from_slice(args);
    shardfs_timeout(&all, Duration::from_secs(120))
}

#[test]
fn flush_writes_incomplete_shards_and_keeps_the_mount() {
    let (_d, backing, _) = dirs();
    let m = waiting_mount(&backing);
    half_a_shard(&m, "a");
    half_a_shard(&m, "b");
    assert!(
        !backing.join("a/c/0/0").exists(),
        "the shard waits for the rest"
    );
    // Only what lies below the path given.
    let out = flush(&[
        m.mountpoint.to_str().unwrap(),
        m.path("b").to_str().unwrap(),
    ]);
    assert_ok(&out, "flush b");
    assert!(
        stdout(&out).contains("1 shards written"),
        "{}",
        stdout(&out)
    );
    assert!(backing.join("b/c/0/0").is_file());
    assert!(!backing.join("a/c/0/0").exists(), "a is not below b");
    reads_natively(&backing.join("b"));
    // The whole mount.
    let out = flush(&[m.mountpoint.to_str().unwrap()]);
    assert_ok(&out, "flush");
    assert!(stdout(&out).starts_with("flushed "), "{}", stdout(&out));
    reads_natively(&backing.join("a"));
    assert!(is_mounted(&m.mountpoint));
    assert_eq!(stats(&m)["pending_chunks"], 0);
    // Nothing pending: a flush is quick and writes nothing.
    let out = flush(&[m.mountpoint.to_str().unwrap()]);
    assert!(
        stdout(&out).contains(" 0 shards written"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn flush_refuses_what_is_not_a_mount_or_not_in_it() {
    let (_d, backing, _) = dirs();
    let out = flush(&[backing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a shardfs mount"),
        "{}",
        stderr(&out)
    );
    let m = Mounted::new(&backing, &[], LIMIT);
    let out = flush(&[m.mountpoint.to_str().unwrap(), backing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not inside"), "{}", stderr(&out));
    // A path inside the mount that is not there is a usage error too.
    let missing = m.path("no/such/array");
    let out = flush(&[m.mountpoint.to_str().unwrap(), missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no/such/array"), "{}", stderr(&out));
}

/// Runs `shardfs ARGS` on a pseudo-terminal (util-linux `script`), for at most `limit`.
fn on_a_terminal(args: &str, limit: Duration) -> String {
    let cmd = format!(
        "timeout {} {} {args}",
        limit.as_secs_f64(),
        env!("CARGO_BIN_EXE_shardfs")
    );
    let out = common::mount::run_timeout(
        std::process::Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        limit + Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn stats_speaks_json_to_programs_and_plain_words_on_a_terminal() {
    let (_d, backing, _) = dirs();
    let m = waiting_mount(&backing);
    half_a_shard(&m, "a");
    let mnt = m.mountpoint.to_str().unwrap();
    // Piped: JSON, as before.
    assert_eq!(stats(&m)["pending_chunks"], 2);
    let view = on_a_terminal(&format!("stats {mnt}"), Duration::from_secs(10));
    assert!(view.contains("pending   1 shards, 2 chunks"), "{view}");
    assert!(view.contains("requests  "), "{view}");
    assert!(!view.contains('{'), "{view}");
    let json = on_a_terminal(&format!("stats --json {mnt}"), Duration::from_secs(10));
    assert!(json.contains("\"pending_chunks\": 2"), "{json}");
    // --watch refreshes until stopped, with the rate.
    let watched = on_a_terminal(
        &format!("stats --watch --interval 0.2 {mnt}"),
        Duration::from_secs(2),
    );
    assert!(watched.matches("\x1b[2J").count() >= 3, "{watched:?}");
    assert!(watched.contains("/s now"), "{watched}");
}

/// The count of one kind of request in a stats report (0 when none was sent).
fn requests_of(report: &serde_json::Value, kind: &str) -> u64 {
    report["fuse_requests"][kind]["count"].as_u64().unwrap_or(0)
}

#[test]
fn stats_counts_the_kernels_requests_by_kind() {
    use std::io::Write;
    let (_d, backing, _) = dirs();
    // Every request through the daemon: plain files would otherwise pass through.
    let args = [
        "--chunks-per-shard",
        "2",
        "--idle-flush",
        "600",
        "--no-passthrough",
    ];
    let m = Mounted::new(&backing, &args, LIMIT);
    std::fs::create_dir(m.path("plain")).unwrap();
    let before = stats(&m);
    // A known sequence: one create, three writes (no writeback cache: each write(2) is one
    // WRITE), one fsync, one rename.
    let mut f = std::fs::File::create(m.path("plain/f")).unwrap();
    for _ in 0..3 {
        f.write_all(&[7u8; 1024]).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    std::fs::rename(m.path("plain/f"), m.path("plain/g")).unwrap();
    // An array's document and one chunk: their closes reach the mount (FLUSH), a plain
    // file's need not (it has nothing to do then).
    std::fs::create_dir(m.path("a")).unwrap();
    std::fs::write(m.path("a/zarr.json"), ONE_D).unwrap();
    std::fs::create_dir(m.path("a/c")).unwrap();
    std::fs::write(m.path("a/c/0"), [1u8; 16]).unwrap();
    let after = stats(&m);
    let sent = |kind: &str| requests_of(&after, kind) - requests_of(&before, kind);
    assert_eq!(sent("create"), 3, "{after}");
    assert_eq!(sent("write"), 5, "{after}");
    assert_eq!(sent("fsync"), 1, "{after}");
    assert_eq!(sent("rename"), 1, "{after}");
    assert_eq!(
        sent("flush"),
        2,
        "only the document's and the chunk's close: {after}"
    );
    // Reading the stats is itself a lookup, an open and reads of the control file.
    assert!(sent("read") >= 1, "{after}");
    let seconds = after["fuse_requests"]["write"]["seconds"].as_f64().unwrap();
    assert!(seconds > 0.0, "time spent answering is counted: {after}");
}

const ONE_D: &str = r#"{"zarr_format":3,"node_type":"array","shape":[64],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default"},"fill_value":0,"codecs":[{"name":"bytes"}]}"#;

/// `--raise-max-pages` (as root) lifts the kernel's cap on request sizes to what
/// `--max-request-kb` asks: a 2 MiB write is one request.
#[test]
fn raise_max_pages_makes_a_large_write_one_request() {
    const LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";
    // The kernel's default, so that the mount has something to raise (only mounts made
    // from now on see the limit: the others keep theirs).
    std::fs::write(LIMIT, "256").unwrap();
    let (_d, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        // Through the daemon: a plain file would otherwise pass through the kernel.
        &[
            "--max-request-kb",
            "2048",
            "--raise-max-pages",
            "--no-passthrough",
        ],
        LIMIT_TIME,
    );
    let pages: u64 = std::fs::read_to_string(LIMIT)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pages * 4096 >= 2 << 20, "{LIMIT}: {pages}");
    let before = stats(&m);
    std::fs::write(m.path("big"), vec![3u8; 2 << 20]).unwrap();
    let after = stats(&m);
    assert_eq!(
        requests_of(&after, "write") - requests_of(&before, "write"),
        1,
        "{after}"
    );
    assert_eq!(std::fs::read(m.path("big")).unwrap(), vec![3u8; 2 << 20]);
}

//! An object store behaving as a cloud's does under load and faults, through the fault
//! proxy (`common::proxy`) in front of each store's server: throttling answered with
//! backoff, a request that stalls, a connection cut in the middle of an upload, a PUT that
//! landed but whose answer was lost. In each, every chunk lands or its writer (or the
//! flush) gets an error, never a silent loss, and nothing is applied twice.

mod common;

use std::path::Path;
use std::time::Duration;

use common::mount::{Mounted, shardfs_timeout, stats};
use common::proxy::Fault;
use common::stores::{Kind, StoreServer};
use common::{LINE_ARRAY, assert_ok, stdout};

const LIMIT: Duration = Duration::from_secs(400);

fn mount(server: &StoreServer, prefix: &str, extra: &[&str]) -> (Mounted, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec!["--cache-dir", cache.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let url = server.url(prefix);
    (
        Mounted::with_env(Path::new(&url), &args, &server.env(), LIMIT),
        cache,
    )
}

/// Array `x` of `LINE_ARRAY`'s layout (8 chunks of 16 bytes, 4 per shard), chunk k
/// holding k + 1, written through `m` (not yet flushed).
fn write_line(m: &Mounted) {
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), LINE_ARRAY).unwrap();
    for k in 0..8u8 {
        std::fs::write(m.path(&format!("x/c/{k}")), [k + 1; 16]).unwrap();
    }
}

/// `shardfs flush` of `m`.
fn flush(m: &Mounted) -> std::process::Output {
    shardfs_timeout(
        &["flush", m.mountpoint.to_str().unwrap()],
        Duration::from_secs(120),
    )
}

/// Every chunk of `x` holds what `write_line` wrote, read through a new mount (a node
/// that saw nothing of the writes), and each shard was written `most` times at most.
fn check_line(server: &StoreServer, prefix: &str, most: usize) {
    let (m, _cache) = mount(server, prefix, &[]);
    for k in 0..8u8 {
        assert_eq!(
            std::fs::read(m.path(&format!("x/c/{k}"))).unwrap(),
            vec![k + 1; 16],
            "chunk {k}"
        );
    }
    assert_ok(&m.unmount(&[]), "unmount the reader");
    for shard in ["c/0", "c/1"] {
        let puts = server.puts(&format!("{prefix}/x/{shard}"));
        assert!((1..=most).contains(&puts), "{shard}: {puts} PUTs");
    }
}

every_store!(
    throttling_is_waited_out_and_nothing_is_lost,
    a_stalled_request_fails_or_lands_and_never_loses_a_chunk,
    a_connection_cut_mid_upload_loses_nothing,
    an_answer_lost_after_the_write_landed_is_not_applied_twice,
    a_late_retry_never_undoes_a_newer_write_from_another_node,
);

/// 503 SlowDown for PUTs, 429 for reads: backed off and retried (object_store's retry,
/// within the mount's ten-second budget a request).
fn throttling_is_waited_out_and_nothing_is_lost(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(&server, "slow", &["--chunks-per-shard", "4"]);
    server.proxy.fault("PUT", "", 3, Fault::Status(503));
    server.proxy.fault("GET", "", 2, Fault::Status(429));
    server.proxy.fault("HEAD", "", 2, Fault::Status(503));
    write_line(&m);
    assert_ok(&flush(&m), "flush while throttled");
    let throttled = server
        .proxy
        .requests()
        .iter()
        .filter(|r| matches!(r.status, Some(503 | 429)))
        .count();
    assert!(throttled >= 3, "{:?}", server.proxy.requests());
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    check_line(&server, "slow", 1);
}

/// A shard's PUT stalls past the client's ten-second read timeout, then reaches the server
/// (late). The write fails or lands; a second flush writes what is pending, merged over
/// the late version if it landed.
fn a_stalled_request_fails_or_lands_and_never_loses_a_chunk(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(&server, "stall", &["--chunks-per-shard", "4"]);
    server.proxy.fault(
        "PUT",
        "stall/x/c/0",
        1,
        Fault::Stall(Duration::from_secs(12)),
    );
    // (The shard is written as its fourth chunk closes, and fails or lands late.)
    write_line(&m);
    let first = flush(&m);
    eprintln!("first flush: {}", stdout(&first));
    if !first.status.success() {
        assert!(stdout(&first).contains("x/c/0"), "{}", stdout(&first));
        assert!(stats(&m)["pending_chunks"].as_u64().unwrap() >= 4);
    }
    assert_ok(&flush(&m), "a flush once the network is well");
    // The mount gave up on the stalled PUT (it had no answer within its budget).
    let errors = stats(&m)["write_errors"].as_u64().unwrap();
    assert!(errors >= 1, "{:?}", server.proxy.requests());
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    check_line(&server, "stall", 3);
}

/// The first two PUTs of a shard are cut half-way through their bodies.
fn a_connection_cut_mid_upload_loses_nothing(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(&server, "reset", &["--chunks-per-shard", "4"]);
    server
        .proxy
        .fault("PUT", "reset/x/c/1", 2, Fault::ResetMidRequest);
    // (A shard write that fails at a last close is that close's error, which
    // `std::fs::write` does not report; the chunks stay pending.)
    write_line(&m);
    if !flush(&m).status.success() {
        assert_ok(&flush(&m), "a flush once the network is well");
    }
    let cut = server
        .proxy
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("reset/x/c/1") && r.status.is_none())
        .count();
    assert_eq!(cut, 2, "{:?}", server.proxy.requests());
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    check_line(&server, "reset", 1);
}

/// The server takes a PUT and its answer never reaches the mount: the array's document
/// (a create) and a shard. The client sends it again and finds its own version there: the
/// document is the mount's (not another node's), the shard is merged over itself, the
/// same chunks, once more at most.
fn an_answer_lost_after_the_write_landed_is_not_applied_twice(kind: Kind) {
    let server = StoreServer::start(kind);
    let (m, _cache) = mount(&server, "lost", &["--chunks-per-shard", "4"]);
    server
        .proxy
        .fault("PUT", "lost/x/zarr.json", 1, Fault::LoseAnswer);
    server
        .proxy
        .fault("PUT", "lost/x/c/0", 1, Fault::LoseAnswer);
    write_line(&m);
    if !flush(&m).status.success() {
        assert_ok(&flush(&m), "a flush once the network is well");
    }
    let unanswered = server
        .proxy
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.status.is_none())
        .count();
    assert_eq!(unanswered, 2, "{:?}", server.proxy.requests());
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    check_line(&server, "lost", 3);
}

/// A timed-out PUT is not retried by the client; its chunks stay pending and a later flush
/// writes them. Meanwhile the stalled PUT lands, and another node writes the same chunk
/// anew. The later flush must not put the older chunk over the newer one (the shard's
/// stamps order them).
fn a_late_retry_never_undoes_a_newer_write_from_another_node(kind: Kind) {
    let server = StoreServer::start(kind);
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (a, _ca) = mount(&server, "late", &args);
    std::fs::create_dir_all(a.path("x/c")).unwrap();
    std::fs::write(a.path("x/zarr.json"), LINE_ARRAY).unwrap();
    std::fs::write(a.path("x/c/0"), [1; 16]).unwrap();
    server.proxy.fault(
        "PUT",
        "late/x/c/0",
        1,
        Fault::Stall(Duration::from_secs(12)),
    );
    let given_up = flush(&a);
    assert!(!given_up.status.success(), "{}", stdout(&given_up));
    // The stalled PUT reaches the server now; then node B writes chunk 0 over it.
    std::thread::sleep(Duration::from_secs(3));
    let (b, _cb) = mount(&server, "late", &args);
    std::fs::write(b.path("x/c/0"), [2; 16]).unwrap();
    assert_ok(&b.unmount(&[]), "unmount B");
    drop(b);
    assert_ok(&flush(&a), "A's flush once the network is well");
    assert_ok(&a.unmount(&[]), "unmount A");
    drop(a);
    let (c, _cc) = mount(&server, "late", &[]);
    assert_eq!(
        std::fs::read(c.path("x/c/0")).unwrap(),
        vec![2; 16],
        "B's newer chunk"
    );
    assert_ok(&c.unmount(&[]), "unmount");
}

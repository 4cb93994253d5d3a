//! dask.distributed through a mount: a local cluster of worker processes writes chunks
//! smaller than the shards, several workers into one shard at once, and every chunk lands.
//! Without the mount dask would have to rechunk to whole shards to stay safe, each task
//! then holding a whole shard in memory.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::mount::{Mounted, dirs, run_timeout};
use common::{assert_ok, shardfs, stdout};

fn writer(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/dask_writer.py");
    run_timeout(
        Command::new(common::python()).arg(script).args(args),
        Duration::from_secs(300),
    )
}

#[test]
fn a_dask_cluster_writes_chunks_smaller_than_its_shards() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], Duration::from_secs(400));
    let out = writer(&["write", m.path("d").to_str().unwrap()]);
    assert_ok(&out, "dask.distributed writes through the mount");
    let out = m.unmount(&[]);
    assert_ok(&out, "unmount");
    drop(m);
    let out = writer(&["check", backing.join("d").to_str().unwrap()]);
    assert_ok(&out, "BACKING holds every chunk, sharded");
    let v = shardfs(&["verify", backing.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

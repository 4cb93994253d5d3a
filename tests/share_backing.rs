//! Writers that share one BACKING: two mounts (as on two machines over a shared file
//! system), and a mount beside tensorstore writing the sharded array natively. Each writes
//! every other chunk of the same shards and fsyncs each one; every chunk must land, and no
//! writer may see an error.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mount::{Mounted, dirs};
use common::{all_succeed, assert_ok, create_shared, shardfs, spawn_shared, stdout};

const LIMIT: Duration = Duration::from_secs(400);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/shared.py")
}

fn check(backing: &Path) {
    let a = backing.join("a");
    let out = Command::new(common::python())
        .arg(script())
        .args(["check", a.to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&out, "every chunk landed");
    let v = shardfs(&["verify", backing.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
}

#[test]
fn two_mounts_write_interleaved_chunks_of_the_same_shards() {
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let a = Mounted::new(&backing, &args, LIMIT);
    let b = Mounted::new(&backing, &args, LIMIT);
    create_shared(&a.path("a"));
    // Two rounds each: the second round's merges meet the other mount's shards.
    all_succeed(vec![
        spawn_shared(&["write", a.path("a").to_str().unwrap(), "0", "2"]),
        spawn_shared(&["write", b.path("a").to_str().unwrap(), "1", "2"]),
    ]);
    assert_ok(&a.unmount(&[]), "unmount a");
    assert_ok(&b.unmount(&[]), "unmount b");
    check(&backing);
}

#[test]
fn a_mount_and_native_tensorstore_share_shards() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "4", "--idle-flush", "600"],
        LIMIT,
    );
    create_shared(&m.path("a"));
    // tensorstore writes the sharded array in BACKING itself (read-modify-write of whole
    // shards under its lock), while the mount writes the other chunks.
    all_succeed(vec![
        spawn_shared(&["write", m.path("a").to_str().unwrap(), "0", "2"]),
        spawn_shared(&["write", backing.join("a").to_str().unwrap(), "1", "2"]),
    ]);
    assert_ok(&m.unmount(&[]), "unmount");
    check(&backing);
}

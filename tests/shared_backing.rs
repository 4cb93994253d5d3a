//! Writers that share one BACKING: two mounts (as on two machines over a shared file
//! system), and a mount beside tensorstore writing the sharded array natively. Each writes
//! every other chunk of the same shards and fsyncs each one; every chunk must land, and no
//! writer may see an error.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mount::{Mounted, dirs, python_ok};
use common::{assert_ok, shardfs, stdout};

const LIMIT: Duration = Duration::from_secs(400);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/shared.py")
}

fn spawn(args: &[&str]) -> Child {
    Command::new(common::python())
        .arg(script())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for both writers; each must succeed.
fn both_succeed(children: Vec<Child>) {
    let start = Instant::now();
    for mut c in children {
        while c.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(240) {
                let _ = c.kill();
                panic!("a writer hung");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = c.wait_with_output().unwrap();
        assert_ok(&out, "writer");
    }
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
    let create = Command::new(common::python())
        .arg(script())
        .args(["create", a.path("a").to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&create, "create");
    // Two rounds each: the second round's merges meet the other mount's shards.
    both_succeed(vec![
        spawn(&["write", a.path("a").to_str().unwrap(), "0", "2"]),
        spawn(&["write", b.path("a").to_str().unwrap(), "1", "2"]),
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
    python_ok(
        "create",
        "import sys, subprocess; subprocess.run([sys.executable, sys.argv[1], 'create', \
         sys.argv[2]], check=True)",
        &[&script(), &m.path("a")],
    );
    // tensorstore writes the sharded array in BACKING itself (read-modify-write of whole
    // shards under its lock), while the mount writes the other chunks.
    both_succeed(vec![
        spawn(&["write", m.path("a").to_str().unwrap(), "0", "2"]),
        spawn(&["write", backing.join("a").to_str().unwrap(), "1", "2"]),
    ]);
    assert_ok(&m.unmount(&[]), "unmount");
    check(&backing);
}

//! Refusals say what to do: each request the mount turns down for breaking one of its
//! rules gets one log line naming the file (its path in the mount), the errno, the rule and
//! the fix; a client repeating it does not flood the log; `shardfs stats` counts them.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::assert_ok;
use common::mount::{Mounted, dirs, errno_of, stats};

const LIMIT: Duration = Duration::from_secs(300);

/// A 16x16 uint8 array in 4x4 chunks (a 4x4 chunk grid).
const ARRAY_JSON: &str = r#"{"zarr_format":3,"node_type":"array","shape":[16,16],
    "data_type":"uint8","chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4,4]}},
    "chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
    "fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

fn mount_with_array(backing: &Path, args: &[&str]) -> (Mounted, PathBuf) {
    let m = Mounted::new(backing, args, LIMIT);
    let a = m.path("a");
    if !a.exists() {
        fs::create_dir(&a).unwrap();
        fs::write(a.join("zarr.json"), ARRAY_JSON).unwrap();
    }
    (m, a)
}

fn write_chunk(a: &Path, i: u64, j: u64, value: u8) -> std::io::Result<()> {
    fs::create_dir_all(a.join(format!("c/{i}")))?;
    fs::File::create(a.join(format!("c/{i}/{j}")))?.write_all(&[value; 16])
}

/// BACKING's array `a` with its first shard (2x2 chunks of 3s) written through a mount,
/// then damaged outside it: a byte of the index checksum (the shard's last 4 bytes)
/// flipped. Returns the shard's path and its damaged bytes.
fn damaged_shard(backing: &Path) -> (PathBuf, Vec<u8>) {
    let (m, a) = mount_with_array(backing, &["--chunks-per-shard", "2"]);
    for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        write_chunk(&a, i, j, 3).unwrap();
    }
    assert_ok(&m.unmount(&[]), "unmount");
    let shard = backing.join("a/c/0/0");
    let mut bytes = fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&shard, &bytes).unwrap();
    (shard, bytes)
}

/// The one log line refusing `file` with `errno`; it names the rule and `fix`.
fn refusal_line(m: &Mounted, file: &Path, errno: &str, fix: &str) -> String {
    let head = format!("{}: refused ({errno}): ", file.display());
    let log = m.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&head)).collect();
    assert_eq!(
        lines.len(),
        1,
        "one line starting {head:?} in the log:\n{log}"
    );
    let line = lines[0];
    assert!(line.contains(". Rule: "), "no rule in {line:?}");
    assert!(
        line.contains(". Fix: ") && line.contains(fix),
        "no fix {fix:?} in {line:?}"
    );
    line.to_string()
}

#[test]
fn a_name_that_is_no_chunk_key_is_logged_once_with_its_grid() {
    let (_d, backing, _) = dirs();
    let (m, a) = mount_with_array(&backing, &[]);
    fs::create_dir_all(a.join("c/0")).unwrap();
    for _ in 0..5 {
        let r = fs::write(a.join("c/0/9"), [1u8; 16]);
        assert_eq!(errno_of(r), Some(libc::EINVAL));
    }
    let line = refusal_line(
        &m,
        &a.join("c/0/9"),
        "EINVAL",
        "write chunks at the keys the array's zarr.json defines",
    );
    assert!(line.contains("chunk grid [4, 4]"), "{line}");
    assert!(stats(&m)["refusals"].as_u64().unwrap() >= 5);
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_file_too_big_is_refused_with_efbig_and_the_limit() {
    let (_d, backing, _) = dirs();
    let (m, a) = mount_with_array(&backing, &[]);
    write_chunk(&a, 0, 0, 1).unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(a.join("c/0/0"))
        .unwrap();
    assert_eq!(errno_of(f.set_len(1 << 62)), Some(libc::EFBIG));
    drop(f);
    let line = refusal_line(&m, &a.join("c/0/0"), "EFBIG", "a smaller chunk shape");
    assert!(line.contains("past the limit of"), "{line}");
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_layout_change_refused_with_ebusy_says_what_blocks_it() {
    let (_d, backing, _) = dirs();
    let (m, a) = mount_with_array(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
    );
    write_chunk(&a, 3, 3, 6).unwrap();
    // The shard of chunk (3, 3) cannot be written: a directory is in its way.
    fs::create_dir_all(backing.join("a/c/1/1/x")).unwrap();
    let mut f = fs::File::create(a.join("zarr.json")).unwrap();
    f.write_all(ARRAY_JSON.replace("[4,4]", "[8,8]").as_bytes())
        .unwrap();
    assert_eq!(errno_of(f.sync_all()), Some(libc::EBUSY));
    drop(f);
    let line = refusal_line(
        &m,
        &a.join("zarr.json"),
        "EBUSY",
        "then write zarr.json again",
    );
    assert!(line.contains("old layout could not be written"), "{line}");
    fs::remove_dir_all(backing.join("a/c/1/1")).unwrap();
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_read_of_a_damaged_shard_names_the_shard_and_verify() {
    let (_d, backing, _) = dirs();
    let (shard, _) = damaged_shard(&backing);
    let (m, a) = mount_with_array(&backing, &[]);
    for _ in 0..3 {
        assert_eq!(errno_of(fs::read(a.join("c/1/0"))), Some(libc::EIO));
    }
    let line = refusal_line(&m, &a.join("c/1/0"), "EIO", "run shardfs verify");
    assert!(
        line.contains(&format!("its shard {} is damaged", shard.display())),
        "{line}"
    );
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn chunks_for_a_damaged_shard_wait_and_flush_names_it_with_the_fix() {
    let (_d, backing, _) = dirs();
    let (shard, bytes) = damaged_shard(&backing);
    let (m, a) = mount_with_array(&backing, &["--idle-flush", "600"]);
    // A new chunk of the damaged shard is taken, and waits: merging it would drop what
    // the shard still holds.
    write_chunk(&a, 0, 0, 9).unwrap();
    let mnt = m.mountpoint.to_str().unwrap();
    let out = common::mount::shardfs_timeout(&["flush", mnt], LIMIT);
    assert_eq!(out.status.code(), Some(1), "flush of a damaged shard");
    let said = common::stderr(&out) + &common::stdout(&out);
    assert!(
        said.contains(&shard.display().to_string()) && said.contains("Fix: run shardfs verify"),
        "{said}"
    );
    refusal_line(&m, &shard, "EIO", "run shardfs verify");
    assert_eq!(
        fs::read(&shard).unwrap(),
        bytes,
        "the damaged shard is left alone"
    );
    assert_eq!(
        fs::read(a.join("c/0/0")).unwrap(),
        [9; 16],
        "the chunk waits"
    );
    // Removing the damaged shard lets the chunk land.
    fs::remove_file(&shard).unwrap();
    assert_ok(
        &common::mount::shardfs_timeout(&["flush", mnt], LIMIT),
        "flush",
    );
    assert_ok(&m.unmount(&[]), "unmount");
    assert!(fs::metadata(&shard).unwrap().len() > 16);
}

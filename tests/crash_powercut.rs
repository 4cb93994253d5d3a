//! The power-cut layer itself (`common::cutfs`), and the mount over it: a power cut loses
//! what was not fsynced, keeps what was, and every state it leaves mounts.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cutfs::CutFs;
use common::mount::Mounted;

const LIMIT: Duration = Duration::from_secs(120);

fn sync_dir(dir: &Path) {
    fs::File::open(dir).unwrap().sync_all().unwrap();
}

#[test]
fn a_power_cut_keeps_what_was_fsynced_and_loses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, at) = (dir.path().join("disk"), dir.path().join("layer"));
    fs::create_dir_all(&disk).unwrap();
    fs::create_dir_all(&at).unwrap();
    let layer = CutFs::mount(&disk, &at);
    fs::create_dir(at.join("d")).unwrap();
    sync_dir(&at);
    let mut f = fs::File::create(at.join("d/f")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    sync_dir(&at.join("d"));
    f.write_all(b" and lost").unwrap();
    assert_eq!(fs::read(at.join("d/f")).unwrap(), b"durable and lost");
    fs::write(at.join("d/g"), b"never synced").unwrap();
    let mut k = fs::File::create(at.join("d/k")).unwrap();
    k.write_all(b"synced, its name not").unwrap();
    k.sync_all().unwrap();
    fs::rename(at.join("d/f"), at.join("d/h")).unwrap();
    assert_eq!(fs::read(at.join("d/h")).unwrap(), b"durable and lost");
    fs::create_dir(at.join("e")).unwrap();
    drop((f, k));
    layer.cut();
    assert_eq!(
        fs::read(disk.join("d/f")).unwrap(),
        b"durable",
        "the rename is undone"
    );
    for gone in ["d/h", "d/g", "d/k", "e"] {
        assert!(
            !disk.join(gone).exists(),
            "{gone}: its name was never synced"
        );
    }
}

/// A rename is kept whole once either directory is synced; an unlink of a synced name
/// is undone unless its directory is synced too.
#[test]
fn a_power_cut_keeps_names_whose_directory_was_synced() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, at) = (dir.path().join("disk"), dir.path().join("layer"));
    fs::create_dir_all(disk.join("d")).unwrap();
    fs::create_dir_all(disk.join("e")).unwrap();
    fs::write(disk.join("d/f"), b"one").unwrap();
    fs::write(disk.join("d/g"), b"two").unwrap();
    fs::create_dir_all(&at).unwrap();
    let layer = CutFs::mount(&disk, &at);
    fs::rename(at.join("d/f"), at.join("e/f")).unwrap();
    sync_dir(&at.join("e"));
    fs::remove_file(at.join("d/g")).unwrap();
    fs::write(at.join("e/n"), b"new").unwrap();
    sync_dir(&at.join("e"));
    layer.cut();
    assert_eq!(fs::read(disk.join("e/f")).unwrap(), b"one");
    assert!(!disk.join("d/f").exists(), "the rename is kept whole");
    assert_eq!(
        fs::read(disk.join("d/g")).unwrap(),
        b"two",
        "the unlink is undone"
    );
    assert_eq!(
        fs::read(disk.join("e/n")).unwrap(),
        b"",
        "its name kept, its data not"
    );
}

#[test]
fn a_mount_over_the_layer_works() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, at) = (dir.path().join("disk"), dir.path().join("layer"));
    fs::create_dir_all(&disk).unwrap();
    fs::create_dir_all(&at).unwrap();
    let _layer = CutFs::mount(&disk, &at);
    let m = Mounted::new(&at, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("x")).unwrap();
    fs::write(m.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir_all(m.path("x/c")).unwrap();
    fs::write(m.path("x/c/0"), [1u8; 16]).unwrap();
    assert_eq!(fs::read(m.path("x/c/0")).unwrap(), vec![1u8; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// A mount over the layer at `dir/layer`, the disk at `dir/disk`.
fn mounted_over_layer(dir: &Path) -> (CutFs, Mounted, PathBuf) {
    let (disk, at) = (dir.join("disk"), dir.join("layer"));
    fs::create_dir_all(&disk).unwrap();
    fs::create_dir_all(&at).unwrap();
    let layer = CutFs::mount(&disk, &at);
    let m = Mounted::new(&at, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("x")).unwrap();
    fs::write(m.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir_all(m.path("x/c")).unwrap();
    (layer, m, disk)
}

/// The power cut, and the machine back: the daemon dies with it, and a mount of what the
/// disk holds (its journal replayed) must work.
fn power_cut(layer: CutFs, m: Mounted, disk: &Path) -> Mounted {
    layer.cut();
    m.crash();
    drop(m);
    Mounted::new(disk, &["--chunks-per-shard", "4"], LIMIT)
}

fn verify(disk: &Path) {
    let out = common::shardfs(&["verify", disk.to_str().unwrap()]);
    common::assert_ok(&out, "verify");
}

/// A new shard nobody fsynced is renamed into place before its data is synced; a power cut
/// then leaves it empty. The mount reads it as holding no chunk; `verify` names it (the one
/// problem: tensorstore refuses an empty shard), and once it is removed BACKING verifies.
#[test]
fn a_shard_left_empty_by_a_power_cut_holds_no_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, m, disk) = mounted_over_layer(dir.path());
    for k in 0..4u8 {
        fs::write(m.path(&format!("x/c/{k}")), [k + 1; 16]).unwrap();
    }
    // The names reach the disk (as the kernel may write them back any time), the data not.
    let at = dir.path().join("layer");
    for d in ["", "x", "x/c"] {
        sync_dir(&at.join(d));
    }
    let m = power_cut(layer, m, &disk);
    assert_eq!(
        fs::metadata(disk.join("x/c/0")).unwrap().len(),
        0,
        "the shard is empty"
    );
    for k in 0..4 {
        assert!(!m.path(&format!("x/c/{k}")).exists(), "chunk {k}");
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
    let out = common::shardfs(&["verify", disk.to_str().unwrap()]);
    let said = common::stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("x/c/0: empty shard file"), "{said}");
    fs::remove_file(disk.join("x/c/0")).unwrap();
    verify(&disk);
}

/// A chunk fsynced into a shard that this mount had just written without a sync: after a
/// power cut it is there (the shard is made durable before a record names what it holds).
#[test]
fn a_chunk_fsynced_over_an_unsynced_shard_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, m, disk) = mounted_over_layer(dir.path());
    for k in 0..4u8 {
        fs::write(m.path(&format!("x/c/{k}")), [k + 1; 16]).unwrap();
    }
    let mut f = fs::File::create(m.path("x/c/1")).unwrap();
    f.write_all(&[9; 16]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let m = power_cut(layer, m, &disk);
    assert_eq!(fs::read(m.path("x/c/1")).unwrap(), vec![9; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
    verify(&disk);
}

/// fsyncgate: after a sync failed, Linux may report a later sync of the same file as a
/// success though the data never reached the disk. So once one failed, no fsync is
/// acknowledged any more; what was acknowledged before survives a power cut.
#[test]
fn after_a_failed_sync_no_fsync_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, m, disk) = mounted_over_layer(dir.path());
    let write_synced = |k: u8| -> std::io::Result<()> {
        let mut f = fs::File::create(m.path(&format!("x/c/{k}")))?;
        f.write_all(&[k + 1; 16])?;
        f.sync_all()
    };
    write_synced(0).unwrap();
    layer.fail_syncs(true);
    assert!(write_synced(1).is_err(), "an fsync the disk failed");
    layer.fail_syncs(false);
    assert!(
        write_synced(2).is_err(),
        "an fsync after a failed one was acknowledged"
    );
    let out = common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "flush after a failed sync: {}",
        common::stdout(&out)
    );
    let m = power_cut(layer, m, &disk);
    assert_eq!(fs::read(m.path("x/c/0")).unwrap(), vec![1; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
    verify(&disk);
}

/// An array removed with `rm -r` and made again, its directories synced: after a power cut
/// none of the old array's chunks are back.
#[test]
fn an_array_removed_and_made_again_stays_new_after_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, m, disk) = mounted_over_layer(dir.path());
    fs::write(m.path("x/c/5"), [5u8; 16]).unwrap();
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    fs::remove_dir_all(m.path("x")).unwrap();
    fs::create_dir_all(m.path("x/c")).unwrap();
    let mut doc = fs::File::create(m.path("x/zarr.json")).unwrap();
    doc.write_all(common::LINE_ARRAY.as_bytes()).unwrap();
    doc.sync_all().unwrap();
    for d in ["x/c", "x", ""] {
        sync_dir(&m.path(d));
    }
    let m = power_cut(layer, m, &disk);
    assert!(!m.path("x/c/5").exists(), "the old array's chunk is back");
    common::assert_ok(&m.unmount(&[]), "unmount");
    verify(&disk);
}

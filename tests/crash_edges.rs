//! The POSIX edges where a mount once lost acknowledged writes or corrupted an array: each
//! defect found by trying the mount as an adversarial user would, as its own regression
//! test. A durable rename must carry the fsynced content to its new name; a `zarr.json`
//! rewritten from a shell or removed and put back must leave the array as it was; a deleted
//! chunk must stay deleted.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mount::{Mounted, dirs, run_timeout, shardfs_timeout, stats};
use common::{assert_ok, stdout};

const LIMIT: Duration = Duration::from_secs(300);

/// A 1-D uint8 array of 8 chunks of 16 bytes, stored without compression.
const LINE: &str = r#"{"zarr_format":3,"node_type":"array","shape":[128],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

/// A 16x16 uint8 array of 2x2 chunks of 8x8.
const SQUARE: &str = r#"{"zarr_format":3,"node_type":"array","shape":[16,16],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[8,8]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

fn array(m: &Mounted, name: &str, doc: &str) -> PathBuf {
    let a = m.path(name);
    fs::create_dir_all(&a).unwrap();
    fs::write(a.join("zarr.json"), doc).unwrap();
    a
}

fn write_synced(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

fn fsync_path(path: &Path) {
    fs::File::open(path).unwrap().sync_all().unwrap();
}

/// SIGKILLs the daemon, clears the dead mount point, and mounts BACKING again (which
/// replays the journal).
fn crash_and_remount(m: Mounted, args: &[&str]) -> Mounted {
    m.crash_and_remount(args, LIMIT)
}

fn verify(backing: &Path) {
    let out = shardfs_timeout(&["verify", backing.to_str().unwrap()], LIMIT);
    assert_ok(&out, "shardfs verify");
}

fn flush(m: &Mounted) {
    let out = shardfs_timeout(&["flush", m.mountpoint.to_str().unwrap()], LIMIT);
    assert_ok(&out, "shardfs flush");
}

fn stored_doc(backing: &Path, array: &str) -> serde_json::Value {
    serde_json::from_slice(&fs::read(backing.join(array).join("zarr.json")).unwrap()).unwrap()
}

fn is_sharded(doc: &serde_json::Value) -> bool {
    doc["codecs"][0]["name"] == "sharding_indexed"
}

/// Defect 1a: a chunk fsynced, closed, renamed onto another key, and fsynced there, is
/// durable at the new name only.
#[test]
fn a_chunk_renamed_after_its_fsync_is_durable_at_its_new_name() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    write_synced(&a.join("c/0"), &[7; 16]);
    fs::rename(a.join("c/0"), a.join("c/1")).unwrap();
    fsync_path(&a.join("c/1"));
    let m = crash_and_remount(m, &args);
    let a = m.path("a");
    assert_eq!(
        fs::read(a.join("c/1")).unwrap(),
        vec![7; 16],
        "c/1 after the crash"
    );
    assert!(!a.join("c/0").exists(), "c/0 came back after the crash");
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// Defect 1b: the durable-rename sequence (fsync the file, rename it into another key
/// directory, fsync both directories) keeps the chunk at its new name across a crash.
#[test]
fn the_durable_rename_sequence_survives_a_crash() {
    let args = ["--chunks-per-shard", "1,2"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", SQUARE);
    write_synced(&a.join("c/0/0"), &[9; 64]);
    fs::create_dir_all(a.join("c/1")).unwrap();
    fs::rename(a.join("c/0/0"), a.join("c/1/0")).unwrap();
    fsync_path(&a.join("c/0"));
    fsync_path(&a.join("c/1"));
    let m = crash_and_remount(m, &args);
    let a = m.path("a");
    assert_eq!(
        fs::read(a.join("c/1/0")).unwrap(),
        vec![9; 64],
        "c/1/0 after the crash"
    );
    assert!(!a.join("c/0/0").exists(), "c/0/0 came back after the crash");
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// Defect 5: an unlink that races an fsync of the array's directory leaves no record
/// behind: after a flush nothing is live, and the chunk stays deleted across a remount.
#[test]
fn an_unlink_racing_a_directory_fsync_stays_deleted() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let big = LINE
        .replace("[128]", "[67108864]")
        .replace("[16]", "[8388608]");
    let a = array(&m, "a", &big);
    let chunk = vec![5u8; 8 << 20];
    for round in 0..16u64 {
        // The shard holds the chunk alone, so that the unlink empties it and writes it at
        // once; the fsync meanwhile journals the content that replaced the stored one.
        fs::create_dir_all(a.join("c")).unwrap();
        fs::write(a.join("c/0"), &chunk).unwrap();
        flush(&m);
        fs::write(a.join("c/0"), &chunk).unwrap();
        let dir = a.clone();
        let syncer = std::thread::spawn(move || {
            let _ = fs::File::open(&dir).and_then(|f| f.sync_all());
        });
        std::thread::sleep(Duration::from_micros(700 * (round % 8)));
        fs::remove_file(a.join("c/0")).unwrap();
        syncer.join().unwrap();
    }
    flush(&m);
    let s = stats(&m);
    assert_eq!(s["pending_chunks"], 0, "{s}");
    assert_eq!(
        s["live_records"],
        0,
        "records left live: {s}\n{}",
        m.log_text()
    );
    assert_ok(&m.unmount(&[]), "unmount");
    let m = Mounted::new(&backing, &args, LIMIT);
    assert!(!m.path("a/c/0").exists(), "the deleted chunk came back");
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Writes chunks 0..8 of `a` (chunk k filled with k+1) and flushes them into shards.
fn eight_chunks(m: &Mounted, a: &Path) {
    fs::create_dir_all(a.join("c")).unwrap();
    for k in 0..8u8 {
        fs::write(a.join(format!("c/{k}")), [k + 1; 16]).unwrap();
    }
    flush(m);
}

fn assert_eight_chunks(a: &Path) {
    for k in 0..8u8 {
        assert_eq!(
            fs::read(a.join(format!("c/{k}"))).unwrap(),
            vec![k + 1; 16],
            "chunk {k}"
        );
    }
}

fn sh(script: &str) -> std::process::Output {
    run_timeout(Command::new("sh").args(["-c", script]), LIMIT)
}

fn zarr_reads(a: &Path) {
    let code = "import sys, zarr, numpy as np\n\
                z = zarr.open_array(sys.argv[1], mode='r')\n\
                want = np.repeat(np.arange(1, 9, dtype='u1'), 16)\n\
                assert (z[...] == want).all(), z[...]\n";
    common::mount::python_ok("zarr-python reads the array", code, &[a]);
}

/// Defect 2: `zarr.json` removed and put back (the document the mount showed): the shard
/// files are never taken for chunk files, and the array reads as it was.
#[test]
fn zarr_json_removed_and_put_back_leaves_the_array_unchanged() {
    let args = ["--chunks-per-shard", "4"];
    let (d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    eight_chunks(&m, &a);
    let saved = d.path().join("saved.json");
    fs::copy(a.join("zarr.json"), &saved).unwrap();
    fs::remove_file(a.join("zarr.json")).unwrap();
    fs::copy(&saved, a.join("zarr.json")).unwrap();
    assert_eight_chunks(&a);
    zarr_reads(&a);
    assert_ok(&m.unmount(&[]), "unmount");
    assert!(is_sharded(&stored_doc(&backing, "a")));
    verify(&backing);
    let m = Mounted::new(&backing, &args, LIMIT);
    assert_eight_chunks(&m.path("a"));
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Defect 2, the other half: `verify` sees a chunk whose size the codecs fix (no
/// compressor) at any other size, as when a whole shard was taken for one chunk.
#[test]
fn verify_finds_a_chunk_of_the_wrong_size() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    let a = array(&m, "a", LINE);
    eight_chunks(&m, &a);
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
    // Shard c/1 rebuilt outside the mount with its first chunk 17 bytes long.
    let shard = backing.join("a/c/1");
    let mut body = vec![5u8; 17];
    body.extend([6u8; 48]);
    let ranges = [(0u64, 17u64), (17, 16), (33, 16), (49, 16)];
    let mut index = Vec::new();
    for (off, n) in ranges {
        index.extend(off.to_le_bytes());
        index.extend(n.to_le_bytes());
    }
    let crc = crc32c::crc32c(&index);
    body.extend(&index);
    body.extend(crc.to_le_bytes());
    fs::write(&shard, &body).unwrap();
    let out = shardfs_timeout(&["verify", backing.to_str().unwrap()], LIMIT);
    assert_eq!(out.status.code(), Some(1), "verify: {}", stdout(&out));
    assert!(
        stdout(&out).contains("17 bytes") && stdout(&out).contains("16"),
        "verify names the size: {}",
        stdout(&out)
    );
}

/// Defect 6: `cat view.json > MNT/a/zarr.json` (the shell truncates, closes a duplicate
/// with nothing written, then writes) keeps the array sharded and readable.
#[test]
fn a_shell_redirect_onto_zarr_json_keeps_the_array() {
    let args = ["--chunks-per-shard", "4"];
    let (d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    eight_chunks(&m, &a);
    let view = d.path().join("view.json");
    fs::copy(a.join("zarr.json"), &view).unwrap();
    let doc = a.join("zarr.json");
    let out = sh(&format!("cat {} > {}", view.display(), doc.display()));
    assert_ok(&out, "cat > zarr.json");
    assert_eight_chunks(&a);
    zarr_reads(&a);
    // Nothing, then garbage: the array's document is never replaced by either.
    let _ = sh(&format!(": > {}", doc.display()));
    let _ = sh(&format!("echo garbage > {}", doc.display()));
    assert_eq!(fs::read(&doc).unwrap(), fs::read(&view).unwrap());
    assert_eight_chunks(&a);
    assert!(is_sharded(&stored_doc(&backing, "a")));
    assert_ok(&m.unmount(&[]), "unmount");
    assert!(is_sharded(&stored_doc(&backing, "a")));
    verify(&backing);
}

/// Defect 6, a new array: `cat <<EOF > MNT/new/zarr.json` creates it sharded.
#[test]
fn a_heredoc_creates_a_sharded_array() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let dir = m.path("new");
    fs::create_dir(&dir).unwrap();
    let out = sh(&format!(
        "cat <<EOF > {}\n{}\nEOF",
        dir.join("zarr.json").display(),
        LINE
    ));
    assert_ok(&out, "heredoc");
    eight_chunks(&m, &dir);
    assert_ok(&m.unmount(&[]), "unmount");
    assert!(is_sharded(&stored_doc(&backing, "new")));
    verify(&backing);
}

/// LINE with zstd: its chunk files may have any size (the mount never decodes them).
fn any_size_line() -> String {
    LINE.replace(
        r#"[{"name":"bytes"}]"#,
        r#"[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":0,"checksum":false}}]"#,
    )
}

/// The size of this mount's one journal segment.
fn segment_len(backing: &Path) -> u64 {
    let segs: Vec<u64> = fs::read_dir(backing.join(".shardfs/journal"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    assert_eq!(segs.len(), 1, "one segment");
    segs[0]
}

/// Fills the file system of `dir` (a tmpfs) with `dir/fill`.
fn fill_up(dir: &Path) {
    let mut f = fs::File::create(dir.join("fill")).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
}

/// Defect 4: a retirement that a full disk keeps from being recorded must not let an older
/// fsynced content replay over a newer one: `flush` fails instead of saying "all durable",
/// and once there is room again the unmount records it, so the remount reads the newer
/// content.
#[test]
fn a_retirement_refused_by_a_full_disk_fails_flush_and_rolls_nothing_back() {
    let args = ["--chunks-per-shard", "4"];
    let (d, _, _) = dirs();
    let tmpfs = common::mount::Tmpfs::new(&d.path().join("small"), "1M");
    let backing = tmpfs.0.clone();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    let b = array(&m, "b", &any_size_line());
    // Complete shards of a and b exist, so fsyncs journal into the shared segment.
    fs::create_dir_all(a.join("c")).unwrap();
    fs::create_dir_all(b.join("c")).unwrap();
    for k in 0..4u8 {
        fs::write(a.join(format!("c/{k}")), [1; 16]).unwrap();
        fs::write(b.join(format!("c/{k}")), [1; 16]).unwrap();
    }
    write_synced(&a.join("c/0"), &[2; 16]); // v1, fsynced: a record
    write_synced(&b.join("c/0"), &[2; 16]);
    // Pad the segment to a page boundary, so that the retirement needs a new page. A chunk
    // record of a 1-D array is 53 bytes and its data: a 16-byte header, then layout, ndim,
    // id, one coordinate, what the shard held and when.
    let room = 4096 - segment_len(&backing) % 4096;
    let pad = (room + 4096 - 53) % 4096;
    write_synced(&b.join("c/1"), &vec![3; pad as usize]);
    assert_eq!(segment_len(&backing) % 4096, 0, "segment padded");
    // v2 of shard 0 of a, not fsynced, written on a full disk: the shard write that would
    // retire v1's record (durably, under the shard's lock) finds no room for the shard or
    // for the retirement. Either way nothing may be called durable.
    fill_up(&backing);
    for k in 0..4u8 {
        fs::write(a.join(format!("c/{k}")), [4; 16]).unwrap();
    }
    let mnt = m.mountpoint.to_str().unwrap();
    let a_mnt = a.to_str().unwrap();
    let out = shardfs_timeout(&["flush", mnt, a_mnt], LIMIT);
    let said = format!("{}{}", stdout(&out), common::stderr(&out));
    assert_eq!(out.status.code(), Some(1), "flush on a full disk: {said}");
    assert!(
        said.contains("retirements not recorded") || said.contains("No space left"),
        "{said}"
    );
    fs::remove_file(backing.join("fill")).unwrap();
    assert_ok(&m.unmount(&[]), "unmount once there is room");
    let m = Mounted::new(&backing, &args, LIMIT);
    for k in 0..4u8 {
        assert_eq!(
            fs::read(m.path(&format!("a/c/{k}"))).unwrap(),
            vec![4; 16],
            "chunk {k}"
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Found by attacking the fix: on a full disk a rename that completed a shard returned the
/// shard write's ENOSPC though the names had moved, and the kernel kept the old name for the
/// moved file: a write through it overwrote the fsynced chunk at the new name. A rename now
/// happens whole (and succeeds) or not at all: one whose names moved succeeds and keeps the
/// shard in memory; the next rename into the array retries that shard first and is refused
/// with its error while the disk stays full, before any name moves.
#[test]
fn a_rename_on_a_full_disk_happens_whole_or_not_at_all() {
    let args = ["--chunks-per-shard", "4"];
    let (d, _, _) = dirs();
    let tmpfs = common::mount::Tmpfs::new(&d.path().join("small"), "1M");
    let backing = tmpfs.0.clone();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", &LINE.replace("[128]", "[1024]"));
    let mut want: Vec<Option<u8>> = vec![None; 64];
    for k in (0..64).step_by(2) {
        write_synced(&a.join(format!("c/{k}")), &[k as u8 + 1; 16]);
        want[k] = Some(k as u8 + 1);
    }
    fill_up(&backing);
    let mut refused = 0;
    for k in (0..64).step_by(2) {
        let (from, to) = (a.join(format!("c/{k}")), a.join(format!("c/{}", k + 1)));
        match fs::rename(&from, &to) {
            Ok(()) => want[k + 1] = want[k].take(),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "rename {k}");
                refused += 1;
            }
        }
        let _ = fs::File::open(a.join("c")).and_then(|f| f.sync_all());
        for j in [k, k + 1] {
            let got = fs::read(a.join(format!("c/{j}"))).ok();
            assert_eq!(
                got,
                want[j].map(|v| vec![v; 16]),
                "chunk {j} after rename {k}"
            );
        }
    }
    assert!(refused > 0, "no rename was refused on the full disk");
    fs::remove_file(backing.join("fill")).unwrap();
    // Written through whatever names the kernel holds now: they must be the true ones.
    for k in [3usize, 2] {
        write_synced(&a.join(format!("c/{k}")), &[100 + k as u8; 16]);
        want[k] = Some(100 + k as u8);
    }
    for (k, v) in want.iter().enumerate() {
        let got = fs::read(a.join(format!("c/{k}"))).ok();
        assert_eq!(got, v.map(|v| vec![v; 16]), "chunk {k} before the crash");
    }
    let m = crash_and_remount(m, &args);
    // (What moved while the disk was full waited in memory, not fsynced: it may be lost.)
    for k in [2usize, 3] {
        let got = fs::read(m.path(&format!("a/c/{k}"))).ok();
        assert_eq!(
            got,
            want[k].map(|v| vec![v; 16]),
            "chunk {k} after the crash"
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Found by attacking the fix: a dead mount's record went over what its shard held then (a
/// crc, or nothing), and a chunk that another mount later wrote and then put back to that
/// same state (removed again, or the same bytes again) looked untouched, so the older
/// record was replayed over the newer write. Shards now carry when each position got its
/// state (`shard::stamps`), and the later of the two stays. Mount A fsyncs chunk 0 (held
/// in its journal, unwritten); B writes chunk 0 and removes it durably, and writes chunk 4
/// anew then back to its first bytes, fsynced; A dies. Neither comes back from A.
#[test]
fn a_dead_mounts_record_never_replays_over_a_chunk_written_and_put_back() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "a", LINE);
    fs::create_dir_all(a.path("a/c")).unwrap();
    fs::write(a.path("a/c/4"), [1; 16]).unwrap();
    flush(&a);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&a.path("a/c/0"), &[2; 16]);
    write_synced(&a.path("a/c/4"), &[2; 16]);
    fs::write(b.path("a/c/0"), [3; 16]).unwrap();
    fs::write(b.path("a/c/4"), [3; 16]).unwrap();
    flush(&b);
    fs::remove_file(b.path("a/c/0")).unwrap();
    fsync_path(&b.path("a/c"));
    write_synced(&b.path("a/c/4"), &[1; 16]);
    flush(&b);
    a.crash();
    // B takes A's journal over within about a second.
    let start = std::time::Instant::now();
    while journals(&backing) > 1 {
        assert!(start.elapsed() < Duration::from_secs(20), "not taken over");
        std::thread::sleep(Duration::from_millis(200));
    }
    let check = |m: &Mounted, when: &str| {
        assert!(
            !m.path("a/c/0").exists(),
            "{when}: a removed chunk came back"
        );
        assert_eq!(
            fs::read(m.path("a/c/4")).unwrap(),
            vec![1; 16],
            "{when}: chunk 4"
        );
    };
    check(&b, "after the takeover");
    assert_ok(&b.unmount(&[]), "unmount b");
    let m = Mounted::new(&backing, &args, LIMIT);
    check(&m, "after a remount");
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// Found by reviewing the stamps: opening a stored chunk for writing without changing it
/// (`touch`), or truncating it to its own size, on another mount gave it a new time, which
/// its shard then carried, and a dead mount's later fsync of the chunk was taken for older.
/// A content keeps its time until the content changes.
#[test]
fn a_chunk_opened_unchanged_on_another_mount_never_hides_a_later_fsync() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    for name in ["opened", "truncated"] {
        array(&a, name, LINE);
        fs::create_dir_all(a.path(name).join("c")).unwrap();
        fs::write(a.path(&format!("{name}/c/0")), [1; 16]).unwrap();
        fs::write(a.path(&format!("{name}/c/1")), [9; 16]).unwrap();
    }
    flush(&a);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&a.path("opened/c/0"), &[2; 16]);
    write_synced(&a.path("truncated/c/0"), &[2; 16]);
    drop(
        fs::OpenOptions::new()
            .write(true)
            .open(b.path("opened/c/0"))
            .unwrap(),
    );
    let t = fs::OpenOptions::new()
        .write(true)
        .open(b.path("truncated/c/0"))
        .unwrap();
    t.set_len(16).unwrap();
    drop(t);
    flush(&b);
    a.crash();
    let start = std::time::Instant::now();
    while journals(&backing) > 1 {
        assert!(start.elapsed() < Duration::from_secs(20), "not taken over");
        std::thread::sleep(Duration::from_millis(200));
    }
    for name in ["opened", "truncated"] {
        let got = fs::read(b.path(&format!("{name}/c/0"))).unwrap();
        assert_eq!(got, vec![2; 16], "{name}: the fsync lost");
    }
    assert_ok(&b.unmount(&[]), "unmount b");
    verify(&backing);
}

/// Found by reviewing the stamps: on a full disk an unlink that completed a shard returned
/// the shard write's ENOSPC though the chunk was gone, and the kernel kept its name. The
/// unlink succeeds; the removal waits in memory and lands once there is room.
#[test]
fn an_unlink_on_a_full_disk_succeeds_and_the_name_is_gone() {
    let args = ["--chunks-per-shard", "4"];
    let (d, _, _) = dirs();
    let tmpfs = common::mount::Tmpfs::new(&d.path().join("small"), "1M");
    let backing = tmpfs.0.clone();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    fs::create_dir_all(a.join("c")).unwrap();
    fill_up(&backing);
    for k in 4..8 {
        // The last close completes the shard, whose write fails: it says so.
        let _ = fs::write(a.join(format!("c/{k}")), [k as u8; 16]);
    }
    fs::remove_file(a.join("c/4")).unwrap();
    assert!(
        fs::metadata(a.join("c/4")).is_err(),
        "the kernel kept the name"
    );
    let names: Vec<String> = fs::read_dir(a.join("c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.contains(&"4".to_string()), "{names:?}");
    fs::remove_file(backing.join("fill")).unwrap();
    flush(&m);
    assert_ok(&m.unmount(&[]), "unmount");
    let m = Mounted::new(&backing, &args, LIMIT);
    assert!(!m.path("a/c/4").exists(), "the removed chunk came back");
    for k in 5..8u8 {
        assert_eq!(fs::read(m.path(&format!("a/c/{k}"))).unwrap(), vec![k; 16]);
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Found by reviewing the stamps: with another mount's journal in BACKING, shards left with
/// no chunk stay (for their times) in hidden key directories, and `rm -r` of the key
/// directory of a 2-D array left them behind. They go with it.
#[test]
fn rm_r_of_a_key_directory_leaves_nothing_behind_beside_another_mount() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    let doc = SQUARE.replace("[16,16]", "[32,32]");
    let arr = array(&a, "a", &doc);
    let b = Mounted::new(&backing, &args, LIMIT);
    for (i, j) in (0..4).flat_map(|i| (0..4).map(move |j| (i, j))) {
        fs::create_dir_all(arr.join(format!("c/{i}"))).unwrap();
        fs::write(arr.join(format!("c/{i}/{j}")), [i * 4 + j + 1; 64]).unwrap();
    }
    flush(&a);
    for (i, j) in (0..2).flat_map(|i| (0..4).map(move |j| (i, j))) {
        fs::remove_file(arr.join(format!("c/{i}/{j}"))).unwrap();
    }
    flush(&a);
    fs::remove_dir_all(b.path("a/c")).unwrap();
    flush(&b);
    let left: Vec<String> = fs::read_dir(backing.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["zarr.json"], "left in BACKING");
    for m in [a, b] {
        assert_ok(&m.unmount(&[]), "unmount");
    }
}

/// Found by the third review: an fsynced chunk outside a shape shrunk since was dropped by
/// the replay ("lays chunks out elsewhere") though a live mount keeps it, and the array
/// growing back showed it gone. Replay keeps what lies inside the grid it was written in.
#[test]
fn a_chunk_fsynced_before_a_shape_shrinks_survives_a_crash() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    write_synced(&a.join("c/5"), &[9; 16]);
    let resize = |m: &Mounted, len: u64| {
        let doc = m.path("a/zarr.json");
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&doc).unwrap()).unwrap();
        v["shape"][0] = serde_json::json!(len);
        fs::write(&doc, serde_json::to_vec(&v).unwrap()).unwrap();
    };
    resize(&m, 64);
    let m = crash_and_remount(m, &args);
    resize(&m, 128);
    assert_eq!(fs::read(m.path("a/c/5")).unwrap(), vec![9; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Found by the third review: chunk files written before their `zarr.json` (cp -r) are
/// moved aside while the metadata's import writes their shards; a SIGKILL then left them
/// under their hidden names, and the array written again lacked them. They stay until the
/// array is stored, and a new import starts from them.
#[test]
fn a_kill_during_the_import_of_chunk_files_loses_none() {
    let args = ["--chunks-per-shard", "4"];
    let n = 3000u32;
    let doc = LINE.replace("[128]", &format!("[{}]", n * 16));
    for delay_ms in [60u64, 200] {
        let (_d, backing, _) = dirs();
        let m = Mounted::new(&backing, &args, LIMIT);
        let a = m.path("a");
        fs::create_dir_all(a.join("c")).unwrap();
        for k in 0..n {
            fs::write(a.join(format!("c/{k}")), [(k % 251) as u8 + 1; 16]).unwrap();
        }
        fsync_path(&a.join("c"));
        let (doc2, a2) = (doc.clone(), a.clone());
        let writer = std::thread::spawn(move || fs::write(a2.join("zarr.json"), doc2));
        std::thread::sleep(Duration::from_millis(delay_ms));
        let m = crash_and_remount(m, &args);
        let _ = writer.join();
        fs::write(m.path("a/zarr.json"), &doc).unwrap();
        for k in 0..n {
            let got = fs::read(m.path(&format!("a/c/{k}"))).ok();
            assert_eq!(
                got,
                Some(vec![(k % 251) as u8 + 1; 16]),
                "chunk {k} (kill at {delay_ms} ms)"
            );
        }
        assert_ok(&m.unmount(&[]), "unmount");
        verify(&backing);
    }
}

/// Found by the third review: a chunk its shard held, renamed into another array whose key
/// directory was then fsynced, was in both arrays after a SIGKILL: the new name's content
/// was journaled, the old name's removal only pending. The removal is journaled with it.
#[test]
fn a_chunk_renamed_across_arrays_and_fsynced_is_under_one_name_after_a_crash() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    let b = array(&m, "b", LINE);
    fs::create_dir_all(a.join("c")).unwrap();
    fs::create_dir_all(b.join("c")).unwrap();
    for k in 0..4u8 {
        fs::write(a.join(format!("c/{k}")), [k + 1; 16]).unwrap();
    }
    flush(&m);
    fs::rename(a.join("c/1"), b.join("c/1")).unwrap();
    fsync_path(&b.join("c"));
    let m = crash_and_remount(m, &args);
    assert!(
        !m.path("a/c/1").exists(),
        "the chunk is under its old name too"
    );
    assert_eq!(fs::read(m.path("b/c/1")).unwrap(), vec![2; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// Found by the third review: after RENAME_EXCHANGE of two directories holding arrays, the
/// mount forgot both inodes while the kernel had swapped its entries: for a second one
/// directory listed empty and the other's chunks were not found. The inodes swap names too.
#[test]
fn directories_exchanged_show_each_others_arrays_at_once() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    for (dir, v) in [("p", 1u8), ("q", 2)] {
        fs::create_dir(m.path(dir)).unwrap();
        let a = array(&m, &format!("{dir}/x"), LINE);
        write_synced(&a.join("c/0"), &[v; 16]);
    }
    // Looked at first, so that the kernel holds entries for them.
    for dir in ["p", "q"] {
        assert_eq!(fs::read_dir(m.path(dir)).unwrap().count(), 1);
    }
    let c = |p: &str| std::ffi::CString::new(m.path(p).to_str().unwrap()).unwrap();
    let (p, q) = (c("p"), c("q"));
    // SAFETY: two valid C strings.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::AT_FDCWD,
            q.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    for (dir, v) in [("p", 2u8), ("q", 1)] {
        let names: Vec<String> = fs::read_dir(m.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["x"], "{dir}");
        assert_eq!(
            fs::read(m.path(&format!("{dir}/x/c/0"))).unwrap(),
            vec![v; 16],
            "{dir}"
        );
    }
    let m = crash_and_remount(m, &args);
    assert_eq!(fs::read(m.path("p/x/c/0")).unwrap(), vec![2; 16]);
    assert_eq!(fs::read(m.path("q/x/c/0")).unwrap(), vec![1; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// How many journals BACKING holds.
fn journals(backing: &Path) -> usize {
    fs::read_dir(backing.join(".shardfs/journal"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
                .count()
        })
        .unwrap_or(0)
}

/// Defect 3, the other half: a live mount sharing BACKING takes over a dead mount's journal
/// promptly, without waiting for the next mount: its fsynced chunks land in their shards.
#[test]
fn a_live_mount_takes_over_a_dead_mounts_journal() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "a", LINE);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&a.path("a/c/0"), &[0xAA; 16]);
    write_synced(&a.path("a/c/5"), &[0xAB; 16]);
    a.crash();
    let start = std::time::Instant::now();
    loop {
        let s = stats(&b);
        // (Listed after the stats: the dead journal goes once its records are replayed.)
        let journals: Vec<String> = fs::read_dir(backing.join(".shardfs/journal"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let ids: std::collections::BTreeSet<&str> = journals
            .iter()
            .filter_map(|n| n.split('.').next())
            .collect();
        // Only B's own journal is left.
        if s["replayed_records"] == 2 && s["pending_chunks"] == 0 && ids.len() == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not taken over: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(fs::read(b.path("a/c/0")).unwrap(), vec![0xAA; 16]);
    assert_eq!(fs::read(b.path("a/c/5")).unwrap(), vec![0xAB; 16]);
    assert_ok(&b.unmount(&[]), "unmount b");
    verify(&backing);
}

/// A fsynced chunk renamed with no fsync after: a crash leaves it at one of its names,
/// never at neither (the old name's removal is journaled only once the content is durable
/// at the new one). Within an array, and into another array.
#[test]
fn a_fsynced_chunk_renamed_without_an_fsync_is_at_one_of_its_names() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    let b = array(&m, "b", LINE);
    fs::create_dir_all(b.join("c")).unwrap();
    write_synced(&a.join("c/0"), &[7; 16]);
    write_synced(&a.join("c/1"), &[8; 16]);
    fs::rename(a.join("c/0"), a.join("c/6")).unwrap();
    fs::rename(a.join("c/1"), b.join("c/1")).unwrap();
    let m = crash_and_remount(m, &args);
    let found = |paths: &[&str], want: &[u8]| {
        let at: Vec<&str> = paths
            .iter()
            .copied()
            .filter(|p| fs::read(m.path(p)).is_ok_and(|b| b == want))
            .collect();
        assert!(!at.is_empty(), "{want:?} at none of {paths:?}");
    };
    found(&["a/c/0", "a/c/6"], &[7; 16]);
    found(&["a/c/1", "b/c/1"], &[8; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// A file that is not a chunk, inside an array, fsynced: durable (it is written to BACKING,
/// not only held in memory). And a fsynced chunk renamed onto such a name, with the array
/// directory fsynced: durable at its new name.
#[test]
fn a_fsynced_file_inside_an_array_survives_a_crash() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    write_synced(&a.join("notes.txt"), b"hello");
    write_synced(&a.join("c/0"), &[7; 16]);
    fs::rename(a.join("c/0"), a.join("keep")).unwrap();
    fsync_path(&a);
    let m = crash_and_remount(m, &args);
    assert_eq!(fs::read(m.path("a/notes.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(m.path("a/keep")).unwrap(), vec![7; 16]);
    assert!(!m.path("a/c/0").exists(), "the renamed chunk came back");
    assert_ok(&m.unmount(&[]), "unmount");
}

/// A new array's `zarr.json` fsynced half-written: the fsync makes it durable, but the
/// document is judged when complete, and the array is stored sharded.
#[test]
fn a_new_zarr_json_fsynced_half_written_is_judged_when_complete() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let dir = m.path("n");
    fs::create_dir(&dir).unwrap();
    let mut f = fs::File::create(dir.join("zarr.json")).unwrap();
    f.write_all(&LINE.as_bytes()[..20]).unwrap();
    f.sync_all().unwrap();
    f.write_all(&LINE.as_bytes()[20..]).unwrap();
    drop(f);
    eight_chunks(&m, &dir);
    assert_ok(&m.unmount(&[]), "unmount");
    assert!(is_sharded(&stored_doc(&backing, "n")));
    verify(&backing);
}

/// Mounts of one BACKING starting at the same moment: none takes another's fresh journal
/// for a dead one (a journal's lock is locked before it gets its name), so all of them
/// come up, each with its own journal.
#[test]
fn mounts_starting_together_all_come_up() {
    let (_d, backing, _) = dirs();
    let starts: Vec<std::thread::JoinHandle<Mounted>> = (0..4)
        .map(|_| {
            let backing = backing.clone();
            std::thread::spawn(move || Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT))
        })
        .collect();
    let mounts: Vec<Mounted> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    let locks = fs::read_dir(backing.join(".shardfs/journal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        })
        .count();
    assert_eq!(locks, 4, "one live journal per mount");
    for m in &mounts {
        assert_ok(&m.unmount(&[]), "unmount");
    }
}

/// Two mounts fsync one chunk, the later-started one first, and both die: the replay
/// leaves the chunk as the later fsync wrote it (records of several journals replay in the
/// order they were written), not as the later-started mount did.
#[test]
fn two_dead_mounts_leave_a_chunk_as_the_later_fsync_wrote_it() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "a", LINE);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&b.path("a/c/0"), &[0x11; 16]);
    std::thread::sleep(Duration::from_millis(50));
    write_synced(&a.path("a/c/0"), &[0x22; 16]);
    for m in [&a, &b] {
        m.kill_daemon();
    }
    for m in [&a, &b] {
        let _ = m.unmount(&[]);
    }
    drop((a, b));
    let m = Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/0")).unwrap(), vec![0x22; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
    verify(&backing);
}

/// A file fsynced under a temporary name inside an array (so written to BACKING), then
/// renamed onto a chunk key: a crash finds it at one of its names.
#[test]
fn a_fsynced_temporary_file_renamed_onto_a_chunk_survives_a_crash() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    write_synced(&a.join("c/1.tmp"), &[5; 16]);
    fs::rename(a.join("c/1.tmp"), a.join("c/1")).unwrap();
    let m = crash_and_remount(m, &args);
    let at_one = ["a/c/1", "a/c/1.tmp"]
        .iter()
        .any(|p| fs::read(m.path(p)).is_ok_and(|b| b == [5; 16]));
    assert!(at_one, "the fsynced content is at neither name");
    assert_ok(&m.unmount(&[]), "unmount");
}

/// `zarr.json` rewritten with another data type (chunks stay where they are), then a
/// crash: the fsynced chunks are replayed, as a live mount keeps them across the rewrite.
#[test]
fn fsynced_chunks_survive_a_rewrite_of_the_data_type_and_a_crash() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    write_synced(&a.join("c/0"), &[3; 16]);
    let doc = LINE.replace("\"uint8\"", "\"int8\"");
    write_synced(&a.join("zarr.json"), doc.as_bytes());
    let m = crash_and_remount(m, &args);
    assert_eq!(fs::read(m.path("a/c/0")).unwrap(), vec![3; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// `rm -r` of an array holding an empty shard file (a crash left it): the file was never
/// shown, so it must not keep the directory from going.
#[test]
fn rm_r_of_an_array_with_an_empty_shard_file_works() {
    let args = ["--chunks-per-shard", "4"];
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = array(&m, "a", LINE);
    eight_chunks(&m, &a);
    assert_ok(&m.unmount(&[]), "unmount");
    fs::write(backing.join("a/c/1"), b"").unwrap();
    let m = Mounted::new(&backing, &args, LIMIT);
    let out = sh(&format!("rm -r {}", m.path("a").display()));
    assert_ok(&out, "rm -r");
    assert!(!backing.join("a").exists());
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Waits until only one journal is left in BACKING (a live mount took the others over).
fn await_one_journal(backing: &Path) {
    let start = std::time::Instant::now();
    loop {
        let ids = common::mount::journal_ids(backing);
        if ids.len() <= 1 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not taken over: {ids:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A live mount holds an older fsynced content of a chunk that a mount which then died
/// fsynced later: taking the dead mount's journal over, the live mount keeps the later one.
#[test]
fn a_live_mount_taking_over_keeps_a_later_fsync_of_the_dead_one() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "a", LINE);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&b.path("a/c/0"), &[0x11; 16]);
    std::thread::sleep(Duration::from_millis(50));
    write_synced(&a.path("a/c/0"), &[0x22; 16]);
    a.crash();
    await_one_journal(&backing);
    assert_eq!(
        fs::read(b.path("a/c/0")).unwrap(),
        vec![0x22; 16],
        "through the live mount"
    );
    assert_ok(&b.unmount(&[]), "unmount");
    let m = Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/0")).unwrap(), vec![0x22; 16]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// A mount killed before its journal got its name leaves a fresh lock file behind; the next
/// mount removes it (it never held a record), so no journal stays forever half made.
#[test]
fn a_journal_that_never_began_is_removed() {
    let (_d, backing, _) = dirs();
    let journal = backing.join(".shardfs/journal");
    fs::create_dir_all(&journal).unwrap();
    let unborn = journal.join("gone-1-1.lock.new");
    fs::write(&unborn, b"").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    fs::File::options()
        .write(true)
        .open(&unborn)
        .unwrap()
        .set_times(fs::FileTimes::new().set_modified(old))
        .unwrap();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    assert!(!unborn.exists(), "the unborn journal's lock file stayed");
    assert_ok(&m.unmount(&[]), "unmount");
}

/// Chunks mount A wrote into array `a`, one closed and one fsynced, neither in a shard yet.
fn a_with_two_pending_chunks(args: &[&str]) -> (tempfile::TempDir, PathBuf, Mounted, Mounted) {
    let (d, backing, _) = dirs();
    let a = Mounted::new(&backing, args, LIMIT);
    array(&a, "a", LINE);
    let b = Mounted::new(&backing, args, LIMIT);
    fs::create_dir_all(a.path("a/c")).unwrap();
    fs::write(a.path("a/c/0"), [0xA0; 16]).unwrap();
    write_synced(&a.path("a/c/2"), &[0xA2; 16]);
    (d, backing, a, b)
}

/// Found by the fourth review: another mount removed an array and made it again while
/// this one held chunks of it, and their shard writes put the old array's chunks into the
/// new one. As with a file removed on any file system, they go with the array.
#[test]
fn an_array_made_anew_by_another_mount_gets_none_of_the_old_ones_chunks() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, a, b) = a_with_two_pending_chunks(&args);
    fs::remove_dir_all(b.path("a")).unwrap();
    array(&b, "a", LINE);
    fs::create_dir_all(b.path("a/c")).unwrap();
    fs::write(b.path("a/c/1"), [0xB1; 16]).unwrap();
    flush(&b);
    flush(&a);
    let check = |m: &Mounted| {
        assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![0xB1; 16]);
        for gone in ["a/c/0", "a/c/2"] {
            assert!(!m.path(gone).exists(), "{gone} came into the new array");
        }
    };
    check(&b);
    assert_eq!(stats(&a)["pending_chunks"], 0);
    assert_ok(&a.unmount(&[]), "unmount a");
    let b = crash_and_remount(b, &args);
    check(&b);
    assert_ok(&b.unmount(&[]), "unmount b");
    verify(&backing);
}

/// Found by the fourth review, the other half: another mount moved the array's directory
/// while this one held chunks of it, and their shard writes went to the old path (where no
/// array is) instead of where the array went.
#[test]
fn an_array_moved_by_another_mount_gets_the_chunks_written_before() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, a, b) = a_with_two_pending_chunks(&args);
    fs::create_dir(b.path("g")).unwrap();
    fs::rename(b.path("a"), b.path("g/moved")).unwrap();
    flush(&a);
    let check = |m: &Mounted| {
        assert_eq!(fs::read(m.path("g/moved/c/0")).unwrap(), vec![0xA0; 16]);
        assert_eq!(fs::read(m.path("g/moved/c/2")).unwrap(), vec![0xA2; 16]);
    };
    check(&b);
    assert!(
        !backing.join("a").exists(),
        "shards written to the old path"
    );
    assert_ok(&a.unmount(&[]), "unmount a");
    let b = crash_and_remount(b, &args);
    check(&b);
    assert_ok(&b.unmount(&[]), "unmount b");
    verify(&backing);
}

/// The replay half: a mount died holding a fsynced chunk of an array that another mount
/// moved; taking its journal over puts the chunk where the array went.
#[test]
fn a_dead_mounts_fsynced_chunk_follows_its_array_moved_by_another_mount() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, a, b) = a_with_two_pending_chunks(&args);
    fs::rename(b.path("a"), b.path("moved")).unwrap();
    a.crash();
    drop(a);
    await_one_journal(&backing);
    assert_eq!(fs::read(b.path("moved/c/2")).unwrap(), vec![0xA2; 16]);
    assert!(!backing.join("a").exists(), "replayed to the old path");
    assert_ok(&b.unmount(&[]), "unmount b");
    verify(&backing);
}

/// From the review of the two-mount change (D3): mount A fsynced a chunk, another mount
/// moved the array, and A wrote that chunk again at the new path; A's old slot, written
/// after the new one (its path sorts later), put the older content back. A chunk written
/// before the move never replaces one the shard at the new path got later.
#[test]
fn a_chunk_written_before_a_move_never_replaces_one_written_after() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "z", LINE);
    let b = Mounted::new(&backing, &args, LIMIT);
    write_synced(&a.path("z/c/2"), &[0xA2; 16]);
    fs::create_dir(b.path("g")).unwrap();
    fs::rename(b.path("z"), b.path("g/b")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    write_synced(&a.path("g/b/c/2"), &[0xC2; 16]);
    flush(&a);
    assert_eq!(fs::read(b.path("g/b/c/2")).unwrap(), vec![0xC2; 16]);
    for m in [a, b] {
        assert_ok(&m.unmount(&[]), "unmount");
    }
    verify(&backing);
}

/// From the review of the two-mount change (D1): another mount replaced the array's
/// directory by a new one holding the same `zarr.json` and key directories. The live
/// mount kept its pending chunks (the same document) where a replay of them dropped
/// them (another directory). An array is its directory, for both: the chunks pending in
/// the old one go with it, and writes after land in the new one at once.
#[test]
fn an_array_whose_directory_was_replaced_is_another_array() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, a, b) = a_with_two_pending_chunks(&args);
    let base = backing.clone();
    fs::rename(base.join("a"), base.join("a.old")).unwrap();
    fs::create_dir(base.join("a")).unwrap();
    fs::rename(base.join("a.old/zarr.json"), base.join("a/zarr.json")).unwrap();
    fs::remove_dir_all(base.join("a.old")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    write_synced(&a.path("a/c/5"), &[0xD5; 16]);
    flush(&a);
    assert_eq!(fs::read(b.path("a/c/5")).unwrap(), vec![0xD5; 16]);
    for gone in ["a/c/0", "a/c/2"] {
        assert!(!b.path(gone).exists(), "{gone} came into the new directory");
    }
    for m in [a, b] {
        assert_ok(&m.unmount(&[]), "unmount");
    }
    verify(&backing);
}

/// From the review of the two-mount change (D4): with its mount point inside BACKING, a
/// mount whose array another mount removed searched BACKING for it, went into its own
/// mount, and wedged (every request thread waiting on itself). Where an array went is
/// asked of its held directory: no search.
#[test]
fn a_mount_inside_backing_never_waits_on_itself() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let inside = backing.join("zz_view");
    fs::create_dir(&inside).unwrap();
    let a = Mounted::at(&backing, &inside, &args, LIMIT);
    array(&a, "a", LINE);
    fs::create_dir_all(a.path("a/c")).unwrap();
    fs::write(a.path("a/c/0"), [0xF0; 16]).unwrap();
    fs::remove_dir_all(backing.join("a")).unwrap();
    let out = shardfs_timeout(&["flush", a.mountpoint.to_str().unwrap()], LIMIT);
    assert_ok(&out, "flush");
    assert!(!backing.join("a").exists(), "the removed array made again");
    assert_ok(&a.unmount(&[]), "unmount");
}

/// From the review of the held-directory change (D1): an array whose directory's name
/// ends in " (deleted)" (what the kernel appends to the path of a removed one) was taken
/// for removed, and its fsynced chunks were dropped. Only a directory with no name left is
/// gone.
#[test]
fn an_array_named_like_a_removed_one_keeps_its_chunks() {
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    array(&a, "x (deleted)", LINE);
    write_synced(&a.path("x (deleted)/c/0"), &[7; 16]);
    flush(&a);
    assert_ok(&a.unmount(&[]), "unmount");
    let a = Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(a.path("x (deleted)/c/0")).unwrap(), vec![7; 16]);
    assert_ok(&a.unmount(&[]), "unmount");
}

/// From the last review of the held-directory change: a shard written but not yet synced,
/// its array then moved and a directory made at the shard's old path, had the sync of
/// that path fail (EINVAL: not a file) and taken for a failed writeback: every later
/// fsync of the mount failed. Something else at the path is not a failed sync.
#[test]
fn a_directory_where_a_shard_was_never_poisons_fsync() {
    let args = ["--chunks-per-shard", "4", "--idle-flush", "600"];
    let (_d, backing, _) = dirs();
    let a = Mounted::new(&backing, &args, LIMIT);
    let arr = array(&a, "a", LINE);
    fs::create_dir_all(arr.join("c")).unwrap();
    for k in 0..4u8 {
        fs::write(arr.join(format!("c/{k}")), [k + 1; 16]).unwrap();
    }
    fs::rename(backing.join("a"), backing.join("b")).unwrap();
    fs::create_dir_all(backing.join("a/c/0")).unwrap();
    let _ = shardfs_timeout(&["flush", a.mountpoint.to_str().unwrap()], LIMIT);
    array(&a, "z", LINE);
    write_synced(&a.path("z/c/0"), &[9; 16]);
    assert_eq!(fs::read(a.path("b/c/2")).unwrap(), vec![3; 16]);
    fs::remove_dir_all(backing.join("a")).unwrap();
    assert_ok(&a.unmount(&[]), "unmount");
}

/// A rename onto an array's `zarr.json` that is refused (not Zarr metadata) left the
/// document's inode detached in the mount while the kernel kept the name: the next write
/// through that name (its dentry cached) went into the detached inode and was lost, the
/// close reporting success. The name now stays the document's until a change is made.
#[test]
fn a_refused_rename_onto_zarr_json_leaves_the_name_to_the_document() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    let a = array(&m, "x", LINE);
    // The kernel looks the document up (its dentry and inode cached from here).
    assert!(
        fs::read_to_string(a.join("zarr.json"))
            .unwrap()
            .contains("uint8")
    );
    fs::write(a.join("garbage.tmp"), b"not metadata").unwrap();
    let refused = fs::rename(a.join("garbage.tmp"), a.join("zarr.json"));
    assert!(refused.is_err(), "garbage took the array's document");
    let doc = LINE.replace(r#""attributes":{}"#, r#""attributes":{"kept":1}"#);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(a.join("zarr.json"))
        .unwrap();
    f.write_all(doc.as_bytes()).unwrap();
    drop(f);
    assert_ok(&m.unmount(&[]), "unmount");
    let stored = stored_doc(&backing, "x");
    assert_eq!(stored["attributes"]["kept"], 1, "{stored}");
}

//! Hostile and unusual requests: each test reproduces one way a client could lose data,
//! wedge the mount, kill the daemon or reach outside BACKING, and shows that it no longer
//! can.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::mount::{Mounted, chunk, dirs, errno_of, python_ok, run_timeout, small_array, stats};
use common::{assert_ok, stderr, stdout};

const LIMIT: Duration = Duration::from_secs(300);
const CLIENT: Duration = Duration::from_secs(120);

fn sh(what: &str, script: &str) -> std::process::Output {
    let out = run_timeout(Command::new("sh").args(["-c", script]), CLIENT);
    assert!(
        out.status.code().is_some(),
        "{what}: killed\n{}",
        stderr(&out)
    );
    out
}

/// The mount still answers: a listing of its root comes back.
fn responsive(m: &Mounted) {
    let out = run_timeout(
        Command::new("ls").arg(&m.mountpoint),
        Duration::from_secs(20),
    );
    assert_ok(&out, "ls of the mount root");
    assert!(m.daemon_alive(), "the daemon died:\n{}", m.log_text());
}

#[test]
fn zero_length_files_work_everywhere() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    // An empty file renamed onto zarr.json (zarr-python's store tests write empty values so).
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/zarr.tmp"), b"").unwrap();
    fs::rename(m.path("d/zarr.tmp"), m.path("d/zarr.json")).unwrap();
    assert_eq!(fs::read(m.path("d/zarr.json")).unwrap(), b"");
    // An empty plain file, an empty chunk, an empty temporary file renamed onto a chunk.
    fs::write(m.path("empty"), b"").unwrap();
    let a = small_array(&m, "a");
    fs::create_dir_all(a.join("c/0")).unwrap();
    fs::write(a.join("c/0/0"), b"").unwrap();
    fs::write(a.join("c/0/1.partial"), b"").unwrap();
    fs::rename(a.join("c/0/1.partial"), a.join("c/0/1")).unwrap();
    fs::write(a.join("notes.tmp"), b"").unwrap();
    assert_eq!(fs::metadata(a.join("c/0/0")).unwrap().len(), 0);
    assert_eq!(fs::metadata(a.join("c/0/1")).unwrap().len(), 0);
    let out = m.unmount(&[]);
    assert_ok(&out, "unmount");
    assert_eq!(fs::read(backing.join("d/zarr.json")).unwrap(), b"");
    assert_eq!(fs::read(backing.join("empty")).unwrap(), b"");
    assert_eq!(fs::read(backing.join("a/notes.tmp")).unwrap(), b"");
    // Remounted, the empty chunks are still there, still empty.
    let m = Mounted::new(&backing, &[], LIMIT);
    assert_eq!(fs::read(m.path("a/c/0/0")).unwrap(), b"");
    assert_eq!(fs::read(m.path("a/c/0/1")).unwrap(), b"");
    assert!(!m.path("a/c/1/1").exists());
    assert_ok(&m.unmount(&[]), "second unmount");
}

#[test]
fn huge_sizes_get_efbig_and_the_daemon_lives() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    let a = small_array(&m, "a");
    fs::create_dir_all(a.join("c/0")).unwrap();
    fs::write(a.join("c/0/0"), chunk(7)).unwrap();
    let out = sh(
        "truncate",
        &format!("truncate -s 1E {}", a.join("c/0/0").display()),
    );
    assert!(!out.status.success(), "truncate -s 1E succeeded");
    assert!(stderr(&out).contains("too large"), "{}", stderr(&out));
    // A write far past the end, through an open file.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(a.join("c/0/1.partial"))
        .or_else(|_| fs::File::create(a.join("c/0/1.partial")))
        .unwrap();
    let far = std::os::unix::fs::FileExt::write_at(&f, b"x", 1 << 62);
    assert_eq!(errno_of(far), Some(libc::EFBIG));
    drop(f);
    assert_eq!(fs::metadata(a.join("c/0/0")).unwrap().len(), 256);
    // fsync works, everything pending still is, and the chunk reads back as written.
    fs::File::open(a.join("c/0/0")).unwrap().sync_all().unwrap();
    responsive(&m);
    assert_eq!(fs::read(a.join("c/0/0")).unwrap(), chunk(7));
    assert!(
        m.log_text().contains("EFBIG"),
        "no log line names the refusal"
    );
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn symlinks_are_never_followed_out_of_backing() {
    let (d, backing, _) = dirs();
    let outside = d.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let target = outside.join("target");
    fs::write(&target, b"outside").unwrap();
    let before = fs::metadata(&target).unwrap();
    std::os::unix::fs::symlink(&target, backing.join("link")).unwrap();
    // A FIFO, and a link to it.
    let fifo = backing.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("fifo", backing.join("fifolink")).unwrap();
    let m = Mounted::new(&backing, &[], LIMIT);

    // touch -h sets the link's own times, never the target's (rsync -a, cp -a do this).
    let link = m.path("link");
    assert_ok(
        &sh(
            "touch -h",
            &format!("touch -h -d 2011-11-11 {}", link.display()),
        ),
        "touch -h",
    );
    let after = fs::metadata(&target).unwrap();
    assert_eq!(
        after.mtime(),
        before.mtime(),
        "the target outside was touched"
    );
    let own = fs::symlink_metadata(backing.join("link")).unwrap();
    let y2011 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_320_969_600);
    assert_eq!(own.modified().unwrap(), y2011);
    // chown -h changes the link itself; chmod of a link is refused, target untouched.
    assert_ok(
        &sh(
            "chown -h",
            &format!("chown -h 1234:1234 {}", link.display()),
        ),
        "chown -h",
    );
    assert_eq!(
        fs::symlink_metadata(backing.join("link")).unwrap().uid(),
        1234
    );
    assert_eq!(fs::metadata(&target).unwrap().uid(), before.uid());
    // Reading the links works as links do (the kernel follows them on the client side).
    assert_eq!(fs::read_link(&link).unwrap(), target);
    // A reader of a FIFO behind a link does not hang the daemon.
    let _ = run_timeout(
        Command::new("timeout").args(["3", "cat", m.path("fifolink").to_str().unwrap()]),
        Duration::from_secs(20),
    );
    responsive(&m);
    // rsync -a and cp -a of a tree with the link, inside the mount.
    let cp = sh(
        "cp -a",
        &format!("cp -a {} {}", link.display(), m.path("copy").display()),
    );
    assert_ok(&cp, "cp -a");
    assert_eq!(fs::read_link(backing.join("copy")).unwrap(), target);
    assert_eq!(fs::metadata(&target).unwrap().mtime(), before.mtime());
    assert_eq!(fs::read(&target).unwrap(), b"outside");
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn created_files_lose_setuid_and_setgid_and_chunks_are_owned_like_their_array() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
        LIMIT,
    );
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o6755)
        .open(m.path("prog"))
        .unwrap();
    drop(f);
    assert_eq!(
        fs::metadata(backing.join("prog")).unwrap().mode() & 0o6000,
        0
    );
    fs::DirBuilder::new()
        .mode(0o2775)
        .create(m.path("shared"))
        .unwrap();
    assert_eq!(
        fs::metadata(backing.join("shared")).unwrap().mode() & 0o6000,
        0
    );
    // root may still set them on purpose.
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o2775)).unwrap();
    assert_eq!(
        fs::metadata(backing.join("shared")).unwrap().mode() & 0o7777,
        0o2775
    );

    let a = small_array(&m, "a");
    std::os::unix::fs::chown(backing.join("a"), Some(4321), Some(4321)).unwrap();
    fs::create_dir_all(a.join("c/0")).unwrap();
    fs::write(a.join("c/0/0"), chunk(1)).unwrap();
    // Pending (in memory) and stored alike: the array directory's owner.
    let pending = fs::metadata(a.join("c/0/0")).unwrap();
    assert_eq!((pending.uid(), pending.gid()), (4321, 4321));
    let mut t = fs::File::create(a.join("c/0/1.partial")).unwrap();
    t.write_all(b"x").unwrap();
    // A file other than a chunk is its maker's (root here), as it will be in BACKING.
    assert_eq!(fs::metadata(a.join("c/0/1.partial")).unwrap().uid(), 0);
    drop(t);
    fs::remove_file(a.join("c/0/1.partial")).unwrap();
    fs::File::open(a.join("c/0/0")).unwrap().sync_all().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let stored = fs::metadata(a.join("c/0/0")).unwrap();
    assert_eq!((stored.uid(), stored.gid()), (4321, 4321));
    assert_eq!(
        pending.permissions().mode() & 0o777,
        stored.permissions().mode() & 0o777
    );
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn status_files_do_not_pile_up() {
    let (_d, backing, _) = dirs();
    for _ in 0..2 {
        let m = Mounted::new(&backing, &[], LIMIT);
        let control: serde_json::Value =
            serde_json::from_slice(&fs::read(m.path(".shardfs-control")).unwrap()).unwrap();
        let status = std::path::PathBuf::from(control["status_file"].as_str().unwrap());
        assert_ok(&m.unmount(&[]), "unmount");
        assert!(!status.exists(), "{} left behind", status.display());
    }
}

#[test]
fn unmount_names_what_it_cannot_write() {
    // A temporary file held in memory whose path in BACKING is taken by a directory (made
    // behind the mount's back): unmount refuses, and says which file.
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--idle-flush", "600"], LIMIT);
    let a = small_array(&m, "a");
    let mut f = fs::File::create(a.join("x.tmp")).unwrap();
    f.write_all(b"hello").unwrap();
    drop(f);
    fs::create_dir(backing.join("a/x.tmp")).unwrap();
    fs::write(backing.join("a/x.tmp/blocker"), b"").unwrap();
    let out = m.unmount(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("x.tmp"), "{}", stderr(&out));
    assert!(common::mount::is_mounted(&m.mountpoint));
    fs::remove_dir_all(backing.join("a/x.tmp")).unwrap();
    assert_ok(&m.unmount(&[]), "unmount once the way is clear");
    assert_eq!(fs::read(backing.join("a/x.tmp")).unwrap(), b"hello");
}

/// daemon does through the old path may land outside BACKING.
#[test]
fn a_directory_swapped_for_a_link_does_not_lead_outside() {
    let (d, backing, _) = dirs();
    let outside = d.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let m = Mounted::new(&backing, &[], LIMIT);
    fs::create_dir(m.path("sub")).unwrap();
    let mut open = fs::File::create(m.path("sub/file")).unwrap();
    // Behind the mount's back: sub becomes a link to a directory outside.
    fs::remove_file(backing.join("sub/file")).unwrap();
    fs::remove_dir(backing.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, backing.join("sub")).unwrap();
    // The kernel still believes sub is a directory (TTL): these reach the daemon by name.
    let _ = fs::write(m.path("sub/new"), b"x");
    let _ = fs::create_dir(m.path("sub/newdir"));
    let _ = open.write_all(b"y");
    drop(open);
    let _ = fs::set_permissions(m.path("sub/new"), fs::Permissions::from_mode(0o600));
    let made: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(made.is_empty(), "made outside BACKING: {made:?}");
    responsive(&m);
    let _ = m.unmount(&[]);
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
}

/// An unsharded 2-D uint8 array document: `n`x`n` chunks of `c`x`c`.
fn array_json(n: u64, c: u64) -> String {
    format!(
        r#"{{"zarr_format":3,"node_type":"array","shape":[{s},{s}],"data_type":"uint8",
        "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[{c},{c}]}}}},
        "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
        "fill_value":0,"codecs":[{{"name":"bytes"}}],"attributes":{{}}}}"#,
        s = n * c
    )
}

/// A mount of a fresh BACKING with `args`, holding array `a` (see `array_json`).
fn with_array(
    args: &[&str],
    n: u64,
    c: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Mounted,
    std::path::PathBuf,
) {
    let (d, backing, _) = dirs();
    let (m, a) = mount_array(&backing, args, n, c);
    (d, backing, m, a)
}

/// A mount of `backing` with `args`, in which array `a` (see `array_json`) is made.
fn mount_array(
    backing: &std::path::Path,
    args: &[&str],
    n: u64,
    c: u64,
) -> (Mounted, std::path::PathBuf) {
    let m = Mounted::new(backing, args, LIMIT);
    let a = m.path("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("zarr.json"), array_json(n, c)).unwrap();
    (m, a)
}

fn write_chunk(arr: &std::path::Path, i: u64, j: u64, bytes: &[u8]) -> std::io::Result<()> {
    fs::create_dir_all(arr.join(format!("c/{i}")))?;
    let mut f = fs::File::create(arr.join(format!("c/{i}/{j}")))?;
    f.write_all(bytes)
}

#[test]
fn races_inside_the_daemon_never_reach_writers() {
    // One writer rewrites a stored chunk in place (open without O_TRUNC, write, close)
    // while another writes and fsyncs the other chunks of the same shard, so that the
    // shard file is renamed over and over; a reader reads all the while.
    // fsync writes the shard (no journal), so that it is renamed over and over.
    let args = [
        "--chunks-per-shard",
        "2",
        "--idle-flush",
        "600",
        "--no-journal",
    ];
    let (_d, _backing, m, a) = with_array(&args, 2, 4);
    for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        write_chunk(&a, i, j, &[1; 16]).unwrap();
    }
    fs::File::open(a.join("c/0/0")).unwrap().sync_all().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_place = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(1);
                let f = fs::OpenOptions::new().write(true).open(a.join("c/0/0"))?;
                std::os::unix::fs::FileExt::write_all_at(&f, &[n; 4], 4)?;
            }
            Ok::<u8, std::io::Error>(n)
        })
    };
    let reader = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(fs::read(a.join("c/1/1"))?.len(), 16);
            }
            Ok::<(), std::io::Error>(())
        })
    };
    for round in 0..60u8 {
        for (i, j) in [(0, 1), (1, 0)] {
            write_chunk(&a, i, j, &[round; 16]).unwrap();
            fs::File::open(a.join(format!("c/{i}/{j}")))
                .unwrap()
                .sync_all()
                .unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = in_place
        .join()
        .unwrap()
        .expect("the in-place writer saw an error");
    reader.join().unwrap().expect("the reader saw an error");
    let s = stats(&m);
    assert!(s["partial_writes"].as_u64().unwrap() >= 100, "{s}");
    let c00 = fs::read(a.join("c/0/0")).unwrap();
    assert_eq!(&c00[4..8], &[last; 4]);
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_layout_change_writes_pending_chunks_under_their_layout_or_fails_with_ebusy() {
    let (_d, backing, m, a) = with_array(&["--chunks-per-shard", "2", "--idle-flush", "600"], 4, 4);
    write_chunk(&a, 0, 0, &[5; 16]).unwrap();
    write_chunk(&a, 3, 3, &[6; 16]).unwrap();
    // The shard of chunk (3, 3) cannot be written: a directory is in its way.
    fs::create_dir_all(backing.join("a/c/1/1/x")).unwrap();
    let before = fs::read(backing.join("a/zarr.json")).unwrap();
    let mut f = fs::File::create(a.join("zarr.json")).unwrap();
    f.write_all(array_json(2, 8).as_bytes()).unwrap();
    let refused = f.sync_all();
    drop(f);
    assert_eq!(errno_of(refused), Some(libc::EBUSY));
    assert_eq!(
        fs::read(backing.join("a/zarr.json")).unwrap(),
        before,
        "zarr.json changed"
    );
    assert!(
        m.log_text().contains("EBUSY"),
        "no log line names the refusal"
    );
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        fs::read(a.join("c/3/3")).unwrap(),
        [6; 16],
        "the pending chunk is gone"
    );
    // The way cleared, the same change goes through: both chunks first go into shards of
    // the layout they were written under (2x2 chunks of 4x4 each).
    fs::remove_dir_all(backing.join("a/c/1/1")).unwrap();
    let mut f = fs::File::create(a.join("zarr.json")).unwrap();
    f.write_all(array_json(2, 8).as_bytes()).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let s = stats(&m);
    assert_eq!(
        (s["pending_chunks"].as_u64(), s["panics"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    // The array goes on working under its new layout (no slot of the old one in the way).
    std::thread::sleep(Duration::from_millis(1100));
    assert!(fs::read_dir(a.join("c")).is_ok());
    write_chunk(&a, 1, 1, &[7; 64]).unwrap();
    assert_eq!(fs::read(a.join("c/1/1")).unwrap(), [7; 64]);
    assert_ok(&m.unmount(&[]), "unmount");
    let old_layout_shard = fs::read(backing.join("a/c/1/1")).unwrap();
    // 2x2 positions, one present: 16 bytes of chunk, the shard's times (4 * 8 bytes and
    // a 16-byte footer), then 4 * 16 index bytes and a crc.
    assert_eq!(old_layout_shard.len(), 16 + (4 * 8 + 16) + 4 * 16 + 4);
    assert_eq!(&old_layout_shard[..16], &[6; 16]);
}

#[test]
fn memory_pressure_bounds_open_files_and_returns_the_backing_error() {
    let (_d, backing, _) = dirs();
    let limit = 256 * 1024;
    let limit_arg = limit.to_string();
    let args = [
        "--chunks-per-shard",
        "1",
        "--idle-flush",
        "600",
        "--max-pending-memory",
        limit_arg.as_str(),
    ];
    let (m, a) = mount_array(&backing, &args, 4, 1024);
    // Four chunk files held open, 1 MiB written to each: memory stays near the limit.
    let mut files: Vec<fs::File> = (0..4)
        .map(|j| {
            fs::create_dir_all(a.join("c/0")).unwrap();
            fs::File::create(a.join(format!("c/0/{j}"))).unwrap()
        })
        .collect();
    let block = vec![3u8; 64 * 1024];
    let mut peak = 0;
    for _ in 0..16 {
        for f in &mut files {
            f.write_all(&block).unwrap();
        }
        peak = peak.max(stats(&m)["pending_bytes"].as_u64().unwrap());
    }
    assert!(
        peak <= limit + 4 * 64 * 1024,
        "pending memory reached {peak}"
    );
    // Room was made by writing the open files' chunks so far into their shards.
    let s = stats(&m);
    assert!(s["partial_writes"].as_u64().unwrap() > 0, "{s}");
    drop(files);
    // A closed temporary file bigger than the limit goes to BACKING at the next write.
    fs::write(a.join("big.tmp"), vec![9u8; 512 * 1024]).unwrap();
    write_chunk(&a, 1, 0, &[1; 16]).unwrap();
    let s = stats(&m);
    assert!(s["temp_files_persisted"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["pending_bytes"].as_u64().unwrap() <= limit, "{s}");
    assert_eq!(fs::read(a.join("big.tmp")).unwrap(), vec![9u8; 512 * 1024]);
    for j in 0..4 {
        assert_eq!(
            fs::read(a.join(format!("c/0/{j}"))).unwrap(),
            vec![3u8; 1 << 20]
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");

    // A backing store that cannot take the shards: the writer gets ENOSPC instead of
    // memory growing without bound.
    let tmp = common::mount::Tmpfs::new(&backing.join("../small"), "1m");
    let (m, a) = mount_array(&tmp.0, &args, 4, 1024);
    fs::create_dir_all(a.join("c/0")).unwrap();
    let mut f = fs::File::create(a.join("c/0/0")).unwrap();
    let mut refused = None;
    for _ in 0..64 {
        if let Err(e) = f.write_all(&block) {
            refused = e.raw_os_error();
            break;
        }
    }
    assert_eq!(refused, Some(libc::ENOSPC));
    // From then on writes are refused, and memory stops growing.
    let pending = stats(&m)["pending_bytes"].as_u64().unwrap();
    for _ in 0..8 {
        assert_eq!(errno_of(f.write_all(&block)), Some(libc::ENOSPC));
    }
    let after = stats(&m)["pending_bytes"].as_u64().unwrap();
    assert!(
        after <= pending.max(limit),
        "memory grew from {pending} to {after}"
    );
    assert!(m.daemon_alive());
    drop(f);
    drop(m);
}

#[test]
fn idle_counts_from_the_last_write_or_close() {
    let (_d, _backing, m, a) = with_array(&["--chunks-per-shard", "2", "--idle-flush", "2"], 2, 4);
    fs::create_dir_all(a.join("c/0")).unwrap();
    // A slow writer: longer than the idle time from create to close.
    let mut f = fs::File::create(a.join("c/0/0")).unwrap();
    for _ in 0..6 {
        f.write_all(&[1; 4]).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(f);
    std::thread::sleep(Duration::from_millis(1000));
    let s = stats(&m);
    assert_eq!(s["partial_writes"], 0, "written as soon as it closed: {s}");
    std::thread::sleep(Duration::from_millis(2500));
    let s = stats(&m);
    assert_eq!(s["partial_writes"], 1, "not written once idle: {s}");
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn chunks_written_while_zarr_json_is_removed_are_never_dropped_silently() {
    for round in 0..5 {
        let (_d, backing, _) = dirs();
        let m = Mounted::new(
            &backing,
            &["--chunks-per-shard", "4", "--idle-flush", "600"],
            LIMIT,
        );
        let a = m.path("a");
        fs::create_dir(&a).unwrap();
        fs::write(a.join("zarr.json"), array_json(8, 4)).unwrap();
        let stored = fs::read(backing.join("a/zarr.json")).unwrap();
        let writer = {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut ok = Vec::new();
                for k in 0..64u64 {
                    let (i, j) = (k / 8, k % 8);
                    if write_chunk(&a, i, j, &[k as u8 + 1; 16]).is_ok() {
                        ok.push(k);
                    }
                }
                ok
            })
        };
        std::thread::sleep(Duration::from_millis(3 * round));
        fs::remove_file(a.join("zarr.json")).unwrap();
        let ok = writer.join().unwrap();
        assert_ok(&m.unmount(&[]), "unmount");
        // Every write that succeeded is in BACKING: in a shard (read with the metadata put
        // back) or, written after the removal, as a plain file at its key.
        let check = r#"
import os, sys, json, shutil, zarr, numpy as np
backing, ok = sys.argv[1], json.loads(sys.argv[2])
plain = {}
for k in ok:
    p = os.path.join(backing, "a", "c", str(k // 8), str(k % 8))
    if os.path.isfile(p) and os.path.getsize(p) == 16:
        plain[k] = open(p, "rb").read()
for k, b in plain.items():
    assert b == bytes([k + 1]) * 16, k
    os.remove(os.path.join(backing, "a", "c", str(k // 8), str(k % 8)))
open(os.path.join(backing, "a", "zarr.json"), "wb").write(bytes.fromhex(sys.argv[3]))
# Chunks whose write failed may be there empty (created, then refused): not read.
a = zarr.open_array(os.path.join(backing, "a"), mode="r")
for k in ok:
    if k in plain:
        continue
    i, j = divmod(k, 8)
    assert (a[i*4:(i+1)*4, j*4:(j+1)*4] == k + 1).all(), f"chunk {k} lost"
"#;
        let ok_json = serde_json::to_string(&ok).unwrap();
        let hex: String = stored.iter().map(|b| format!("{b:02x}")).collect();
        let out = run_timeout(
            Command::new(common::python()).args([
                "-c",
                check,
                backing.to_str().unwrap(),
                &ok_json,
                &hex,
            ]),
            CLIENT,
        );
        assert_ok(&out, &format!("round {round}: every successful write kept"));
    }
}

#[test]
fn the_index_cache_stays_within_its_budget() {
    // 400 shards of 2x2 chunks with one chunk each, written partially (idle) in this very
    // mount and all read: the cache keeps to its 64 KiB.
    let budget = 64 * 1024;
    let args = [
        "--chunks-per-shard",
        "2",
        "--index-cache-bytes",
        "65536",
        "--idle-flush",
        "0.2",
    ];
    let (_d, backing, m, a) = with_array(&args, 40, 2);
    let key = |k: u64| (2 * (k / 20), 2 * (k % 20));
    for k in 0..400u64 {
        let (i, j) = key(k);
        write_chunk(&a, i, j, &[k as u8; 4]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    for k in 0..400u64 {
        let (i, j) = key(k);
        assert_eq!(
            fs::read(a.join(format!("c/{i}/{j}"))).unwrap(),
            [k as u8; 4]
        );
    }
    let s = stats(&m);
    assert_eq!(s["pending_chunks"], 0, "{s}");
    assert!(s["partial_writes"].as_u64().unwrap() >= 400, "{s}");
    assert!(
        s["index_cache_bytes"].as_u64().unwrap() <= budget + 4096,
        "{s}"
    );
    assert!(s["index_cache_entries"].as_u64().unwrap() < 400, "{s}");
    assert_ok(&m.unmount(&[]), "unmount");
    // Remounted: everything is there, and reading after eviction works.
    let m = Mounted::new(&backing, &args, LIMIT);
    for k in [0u64, 199, 399] {
        let (i, j) = key(k);
        assert_eq!(
            fs::read(m.path(&format!("a/c/{i}/{j}"))).unwrap(),
            [k as u8; 4]
        );
    }
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_writer_that_shards_itself_works_as_on_a_plain_directory() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    // zarr-python writing a sharded array chunk by chunk, then reading it, through the mount.
    let write = r#"
import sys, zarr, numpy as np
a = zarr.create_array(sys.argv[1], shape=(64, 64), chunks=(8, 8), shards=(32, 32),
                      dtype="uint16", compressors=None, fill_value=0)
data = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
for i in range(0, 64, 8):
    for j in range(0, 64, 8):
        a[i:i+8, j:j+8] = data[i:i+8, j:j+8]
b = zarr.open_array(sys.argv[1], mode="r")
assert (b[...] == data).all()
"#;
    python_ok("sharded writer through the mount", write, &[&m.path("s")]);
    // Shown as written: the shard files are there, zarr.json says sharded.
    assert!(
        fs::read_to_string(m.path("s/zarr.json"))
            .unwrap()
            .contains("sharding_indexed")
    );
    assert!(m.path("s/c/1/1").is_file());
    assert_ok(&m.unmount(&[]), "unmount");
    let v = common::shardfs(&["verify", backing.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    // Remounted: shown unsharded, like every sharded array, and reads equal.
    let m = Mounted::new(&backing, &[], LIMIT);
    assert!(
        !fs::read_to_string(m.path("s/zarr.json"))
            .unwrap()
            .contains("sharding_indexed")
    );
    assert_eq!(fs::metadata(m.path("s/c/7/7")).unwrap().len(), 8 * 8 * 2);
    let read = r#"
import sys, zarr, numpy as np
b = zarr.open_array(sys.argv[1], mode="r")
assert b.chunks == (8, 8) and (b[...] == np.arange(64 * 64, dtype="uint16").reshape(64, 64)).all()
"#;
    python_ok("unsharded view after remount", read, &[&m.path("s")]);
    assert_ok(&m.unmount(&[]), "unmount");
}

#[test]
fn a_full_journal_disk_fails_fsync_and_loses_nothing() {
    let (d, _, _) = dirs();
    let tmp = common::mount::Tmpfs::new(&d.path().join("small"), "1m");
    let backing = tmp.0.clone();
    let m = Mounted::new(
        &backing,
        &["--chunks-per-shard", "2", "--idle-flush", "600"],
        LIMIT,
    );
    let a = m.path("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("zarr.json"), array_json(2, 64)).unwrap();
    // Fill what is left of the disk.
    let mut filler = fs::File::create(backing.join("filler")).unwrap();
    let block = vec![0u8; 64 * 1024];
    while filler.write_all(&block).is_ok() {}
    drop(filler);
    fs::create_dir_all(a.join("c/0")).unwrap();
    let mut f = fs::File::create(a.join("c/0/0")).unwrap();
    f.write_all(&[5; 4096]).unwrap();
    assert_eq!(errno_of(f.sync_all()), Some(libc::ENOSPC));
    // Still pending, still readable; nothing acknowledged, nothing lost.
    assert_eq!(fs::read(a.join("c/0/0")).unwrap(), vec![5; 4096]);
    fs::remove_file(backing.join("filler")).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let s = stats(&m);
    assert_eq!(s["journaled_chunks"], 1, "{s}");
    assert_ok(&m.unmount(&[]), "unmount");
    let m = Mounted::new(&backing, &[], LIMIT);
    assert_eq!(fs::read(m.path("a/c/0/0")).unwrap(), vec![5; 4096]);
    drop(m);
    drop(tmp);
}

#[test]
fn a_failed_journal_append_leaves_no_later_record_unreadable() {
    // A shard that exists journals into the shared segments. An append that fails (disk
    // full) must not leave the array's layout booked as written: the next append's record
    // would then follow no layout record, and replay after a crash would drop it.
    let (d, _, _) = dirs();
    let tmp = common::mount::Tmpfs::new(&d.path().join("small"), "1m");
    let backing = tmp.0.clone();
    let args = ["--chunks-per-shard", "2", "--idle-flush", "600"];
    let m = Mounted::new(&backing, &args, LIMIT);
    let a = m.path("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("zarr.json"), array_json(2, 64)).unwrap();
    fs::create_dir_all(a.join("c/0")).unwrap();
    fs::write(a.join("c/0/0"), [1; 4096]).unwrap();
    assert_ok(&m.unmount(&[]), "unmount");
    let m = Mounted::new(&backing, &args, LIMIT);
    let mut filler = fs::File::create(backing.join("filler")).unwrap();
    let block = vec![0u8; 64 * 1024];
    while filler.write_all(&block).is_ok() {}
    drop(filler);
    let mut f = fs::File::create(m.path("a/c/0/1")).unwrap();
    f.write_all(&[2; 4096]).unwrap();
    assert_eq!(errno_of(f.sync_all()), Some(libc::ENOSPC));
    fs::remove_file(backing.join("filler")).unwrap();
    f.sync_all().unwrap();
    m.kill_daemon();
    drop(f);
    let m = m.crash_and_remount(&args, LIMIT);
    assert_eq!(stats(&m)["replayed_records"], 1);
    assert_eq!(fs::read(m.path("a/c/0/1")).unwrap(), vec![2; 4096]);
    assert_eq!(fs::read(m.path("a/c/0/0")).unwrap(), vec![1; 4096]);
    assert_ok(&m.unmount(&[]), "unmount");
    drop(tmp);
}

//! A root daemon on a shared machine: what another local user can prepare before it starts
//! (its runtime directory, a link or FIFO where its log goes) is refused with a clear
//! error, and a log that cannot be written (a pipe nobody reads, or one closed) never
//! blocks or takes down the mount.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mount::{dirs, is_mounted, run_timeout};

const LIMIT: Duration = Duration::from_secs(30);

/// `shardfs mount BACKING MNT` (background, default log) with the runtime directory `rt`.
fn mount_with_runtime(backing: &Path, mnt: &Path, rt: &Path) -> std::process::Output {
    let out = run_timeout(
        Command::new(common::shardfs_bin())
            .args(["mount", backing.to_str().unwrap(), mnt.to_str().unwrap()])
            .env("SHARDFS_RUNTIME_DIR", rt),
        LIMIT,
    );
    if is_mounted(mnt) {
        let _ = common::shardfs(&["unmount", mnt.to_str().unwrap()]);
    }
    out
}

#[test]
fn a_runtime_directory_someone_else_made_or_opened_is_refused() {
    let (d, backing, _) = dirs();
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let theirs = d.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open = d.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    for (rt, why) in [
        (&theirs, "belongs to uid 65534"),
        (&open, "others may use it"),
    ] {
        let out = mount_with_runtime(&backing, &mnt, rt);
        let err = common::stderr(&out);
        assert!(!out.status.success(), "mounted with {}", rt.display());
        assert!(
            err.contains(why) && err.contains("SHARDFS_RUNTIME_DIR"),
            "{err}"
        );
        assert!(!is_mounted(&mnt));
        assert_eq!(
            fs::read_dir(rt).unwrap().count(),
            0,
            "something was written there"
        );
    }
    assert_eq!(
        fs::metadata(&open).unwrap().mode() & 0o777,
        0o777,
        "tightened"
    );
}

#[test]
fn a_log_path_made_a_link_or_a_fifo_is_refused_at_once() {
    let (d, backing, _) = dirs();
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let rt = d.path().join("rt");
    fs::create_dir(&rt).unwrap();
    fs::set_permissions(&rt, fs::Permissions::from_mode(0o700)).unwrap();
    // The daemon's own name for it (`runtime::default_log_file`).
    let log = {
        let canonical = fs::canonicalize(&mnt).unwrap();
        let name = shardfs::runtime::default_log_file(&canonical);
        rt.join(name.file_name().unwrap())
    };
    // A link to a file root must not append to.
    let victim = d.path().join("victim");
    fs::write(&victim, b"untouched").unwrap();
    std::os::unix::fs::symlink(&victim, &log).unwrap();
    let out = mount_with_runtime(&backing, &mnt, &rt);
    assert!(!out.status.success(), "mounted through a log symlink");
    assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    fs::remove_file(&log).unwrap();
    // A FIFO, read by its maker (or not): refused at once, never waited on.
    let c = std::ffi::CString::new(log.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    for reader in [false, true] {
        let _r = reader.then(|| {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&log)
                .unwrap()
        });
        let start = Instant::now();
        let out = mount_with_runtime(&backing, &mnt, &rt);
        assert!(
            !out.status.success(),
            "mounted over a FIFO (reader: {reader})"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited on the FIFO"
        );
        if reader {
            assert!(
                common::stderr(&out).contains("FIFO"),
                "{}",
                common::stderr(&out)
            );
        }
    }
}

/// Unmounts and kills a foreground daemon whatever happens to the test.
struct Foreground(std::process::Child, std::path::PathBuf);

impl Drop for Foreground {
    fn drop(&mut self) {
        if is_mounted(&self.1) {
            common::mount::detach(&self.1);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_log_nobody_reads_or_that_is_closed_never_stops_the_mount() {
    let (d, backing, _) = dirs();
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // Every FUSE request logs a line: a pipe nobody reads fills within a few files.
    let child = Command::new(common::shardfs_bin())
        .args(["mount", "--foreground", "--chunks-per-shard", "4"])
        .args([&backing, &mnt])
        .env("SHARDFS_LOG", "debug,fuser=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut fg = Foreground(child, mnt.clone());
    let start = Instant::now();
    while !is_mounted(&mnt) {
        assert!(start.elapsed() < LIMIT, "never mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = mnt.join("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir(a.join("c")).unwrap();
    // In a thread: a mount that waits on its log must fail the test, not hang it (the
    // guard then tears the mount down).
    let write_all = |value: u8| {
        let a = a.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for round in 0..50 {
                for k in 0..8 {
                    let _ = fs::write(a.join(format!("c/{k}")), [value.wrapping_add(round); 16]);
                }
            }
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(LIMIT).is_ok(), "writes waited on the log");
    };
    write_all(1);
    // The reader goes away: every line now fails to be written.
    drop(fg.0.stderr.take());
    write_all(101);
    let out = run_timeout(
        Command::new(common::shardfs_bin()).args(["unmount", mnt.to_str().unwrap()]),
        LIMIT,
    );
    common::assert_ok(&out, "unmount");
    let status = fg.0.wait().unwrap();
    assert!(status.success(), "the daemon ended with {status}");
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    for k in 0..8 {
        assert_eq!(
            fs::read(m.path(&format!("a/c/{k}"))).unwrap(),
            vec![150; 16]
        );
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// Issue 18, defect 2: a shard whose valid, checksummed index declares one huge chunk (a
/// sparse 1 TiB file) made the daemon allocate it and abort, for every user of the mount.
/// Sizes from BACKING are untrusted: opening the chunk for writing or renaming it gets
/// EFBIG, reading a part of it works, and the mount lives on.
#[test]
fn a_shard_declaring_a_huge_chunk_gets_efbig_and_the_mount_lives() {
    use std::io::{Read, Write};
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir(m.path("a/c")).unwrap();
    for k in 0..4u8 {
        fs::write(m.path(&format!("a/c/{k}")), [k + 1; 16]).unwrap();
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    // Index at the end: 4 (offset, nbytes) pairs and their crc32c.
    let len: u64 = 1 << 40;
    let mut index = Vec::new();
    index.extend(0u64.to_le_bytes());
    index.extend((len - 68).to_le_bytes());
    for _ in 1..4 {
        index.extend(u64::MAX.to_le_bytes());
        index.extend(u64::MAX.to_le_bytes());
    }
    let crc = crc32c::crc32c(&index);
    index.extend(crc.to_le_bytes());
    let shard = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(backing.join("a/c/0"))
        .unwrap();
    shard.set_len(len - 68).unwrap();
    drop(shard);
    fs::OpenOptions::new()
        .append(true)
        .open(backing.join("a/c/0"))
        .unwrap()
        .write_all(&index)
        .unwrap();
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    let chunk = m.path("a/c/0");
    let mut head = [1u8; 16];
    fs::File::open(&chunk)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(head, [0; 16], "a part of it reads");
    let open = fs::OpenOptions::new().write(true).open(&chunk);
    assert_eq!(
        common::mount::errno_of(open),
        Some(libc::EFBIG),
        "open for writing"
    );
    let moved = fs::rename(&chunk, m.path("a/c/5"));
    assert_eq!(common::mount::errno_of(moved), Some(libc::EFBIG), "rename");
    assert!(m.daemon_alive(), "the daemon died");
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// Issue 18, defects 2 and 3 (sizes): a sparse 1 TiB journal segment planted in BACKING
/// made every mount abort reading it whole. It is refused, named in the log, and left
/// where it is; the mount starts, and another dead journal beside it is replayed, as it is
/// beside a FIFO or a directory planted at a journal's names.
#[test]
fn a_huge_or_strange_journal_file_is_refused_not_read() {
    let (_d, backing) = dead_journal();
    let journal = backing.join(".shardfs/journal");
    fs::write(journal.join("evil.lock"), b"").unwrap();
    let seg = fs::File::create(journal.join("evil.000001.seg")).unwrap();
    seg.set_len(1 << 40).unwrap();
    drop(seg);
    let fifo = std::ffi::CString::new(journal.join("fifo.lock").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    fs::write(journal.join("dir.lock"), b"").unwrap();
    fs::create_dir(journal.join("dir.000000.seg")).unwrap();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![0x11; 16]);
    let log = m.log_text();
    common::assert_ok(&m.unmount(&[]), "unmount");
    for name in ["evil.000001.seg", "fifo.lock", "dir.000000.seg"] {
        assert!(log.contains(name), "{name} not named: {log}");
        assert!(journal.join(name).exists(), "{name} removed");
    }
    assert!(log.contains("journal not replayed"), "{log}");
}

/// Issue 18, defect 6: a file with a long name inside an array (held in memory, then
/// written out under a temporary name) was never written: the temporary name exceeded
/// NAME_MAX, and unmount refused. Temporary names always fit.
#[test]
fn a_file_with_a_long_name_in_an_array_is_written() {
    let (_d, backing, _) = dirs();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    let name = "n".repeat(250);
    fs::write(m.path(&format!("a/{name}")), b"notes").unwrap();
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(fs::read(backing.join("a").join(&name)).unwrap(), b"notes");
}

/// A BACKING with a dead mount's journal: chunk 1 of array `a` fsynced as 0x11, then the
/// daemon killed.
fn dead_journal() -> (tempfile::TempDir, std::path::PathBuf) {
    let (d, backing, _) = dirs();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir(m.path("a/c")).unwrap();
    let mut f = fs::File::create(m.path("a/c/1")).unwrap();
    std::io::Write::write_all(&mut f, &[0x11; 16]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.crash();
    (d, backing)
}

fn journal_files(backing: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = fs::read_dir(backing.join(".shardfs/journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    out
}

/// Issue 18, defect 3: a journal planted by another user who can write BACKING was
/// replayed as root into anyone's arrays. Only journals the mount's user owns, that
/// nobody else may write and that have one name are replayed; the others stay, said in
/// the log.
#[test]
fn a_journal_another_user_could_have_written_is_not_replayed() {
    type Tamper = fn(&Path);
    let untouched: Tamper = |_| {};
    let theirs: Tamper = |p| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    let open: Tamper = |p| fs::set_permissions(p, fs::Permissions::from_mode(0o666)).unwrap();
    let linked: Tamper = |p| {
        if p.extension().is_some_and(|e| e == "seg") {
            fs::hard_link(p, p.with_extension("elsewhere")).unwrap();
        }
    };
    for (tamper, replayed, why) in [
        (untouched, true, ""),
        (theirs, false, "owned by uid 65534"),
        (open, false, "writable by others"),
        (linked, false, "names (hard links)"),
    ] {
        let (_d, backing) = dead_journal();
        let files = journal_files(&backing);
        assert!(
            files
                .iter()
                .any(|f| f.extension().is_some_and(|e| e == "seg"))
        );
        for f in &files {
            tamper(f);
        }
        let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
        let chunk = fs::read(m.path("a/c/1")).ok();
        let log = m.log_text();
        common::assert_ok(&m.unmount(&[]), "unmount");
        if replayed {
            assert_eq!(chunk, Some(vec![0x11; 16]), "the mount's own journal");
            continue;
        }
        assert_eq!(chunk, None, "replayed a journal that {why}");
        assert!(
            log.contains("journal not replayed") && log.contains(why),
            "{log}"
        );
        for f in &files {
            assert!(f.exists(), "{} removed", f.display());
        }
    }
}

/// Issue 18, defect 3: a journal directory another user made (or may write) is refused
/// with a clear error: a journal kept there could be swapped for a forged one.
#[test]
fn a_journal_directory_another_user_may_write_is_refused() {
    for mode in [None, Some(0o777)] {
        let (d, backing, _) = dirs();
        let dir = backing.join(".shardfs");
        fs::create_dir(&dir).unwrap();
        match mode {
            None => std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap(),
            Some(m) => fs::set_permissions(&dir, fs::Permissions::from_mode(m)).unwrap(),
        }
        let (out, _) = try_mount(d.path(), &backing);
        let err = common::stderr(&out);
        assert!(!out.status.success(), "mounted over {mode:?}");
        assert!(
            err.contains(".shardfs") && err.contains("forged by another user"),
            "{err}"
        );
        assert!(!dir.join("journal").exists(), "a journal was begun there");
    }
}

/// Issue 18, defect 9: a `zarr.json` asking for 2^22 chunks per shard made a 1-byte write
/// a 64 MiB shard (its index). Shard indexes are bounded at 16 MiB: such an array is shown
/// as it is, and says why in the log.
#[test]
fn an_index_larger_than_16_mib_is_refused() {
    let (_d, backing, _) = dirs();
    let n = 1u64 << 22;
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [n], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [n]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "attributes": {},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                             {"name": "crc32c"}],
            "index_location": "end"}}]
    });
    fs::create_dir(backing.join("a")).unwrap();
    fs::write(backing.join("a/zarr.json"), doc.to_string()).unwrap();
    let m = common::mount::Mounted::new(&backing, &[], LIMIT);
    fs::create_dir_all(m.path("a/c")).unwrap();
    fs::write(m.path("a/c/0"), [7u8]).unwrap();
    let log = m.log_text();
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(fs::metadata(backing.join("a/c/0")).unwrap().len(), 1);
    assert!(log.contains("more than the 16 MiB"), "{log}");
}

/// Issue 18, defect 8 (the other half): a chunk written into a damaged shard made
/// `shardfs unmount` refuse for ever. It still refuses (nothing is lost unasked) and says
/// how to give up; `--give-up` unmounts at once, names what it gives up, and leaves the
/// fsynced chunk in the journal, which the next mount replays (and starts, the chunk
/// pending, though it cannot write it into the damaged shard).
#[test]
fn unmount_never_refuses_for_ever() {
    let (d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir(m.path("a/c")).unwrap();
    for i in 0..4 {
        fs::write(m.path(&format!("a/c/{i}")), [i as u8 + 1; 16]).unwrap();
    }
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    // The index's checksum (the shard's last 4 bytes) no longer matches.
    let shard = backing.join("a/c/0");
    let mut bytes = fs::read(&shard).unwrap();
    *bytes.last_mut().unwrap() ^= 0xFF;
    fs::write(&shard, &bytes).unwrap();
    fs::write(m.path("a/c/1"), [0x51; 16]).unwrap();
    let mut f = fs::File::create(m.path("a/c/2")).unwrap();
    std::io::Write::write_all(&mut f, &[0x52; 16]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mnt = m.mountpoint.to_str().unwrap().to_string();
    let refused = common::shardfs(&["unmount", &mnt]);
    let err = common::stderr(&refused);
    assert!(
        refused.status.code() == Some(1) && is_mounted(&m.mountpoint),
        "{err}"
    );
    assert!(err.contains("a/c/0") && err.contains("--give-up"), "{err}");
    let start = Instant::now();
    let given_up = common::shardfs(&["unmount", "--give-up", &mnt]);
    let err = common::stderr(&given_up);
    assert!(!is_mounted(&m.mountpoint), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "retried for long"
    );
    // Unmounted, data given up: its own status (1 would be "not unmounted").
    assert!(
        given_up.status.code() == Some(3) && err.contains("giving up on"),
        "{err}"
    );
    assert!(err.contains("a/c/0"), "{err}");
    assert!(!m.daemon_alive());
    assert!(
        !common::mount::journal_ids(&backing).is_empty(),
        "journal gone"
    );
    // While the shard is damaged, the replayed chunk cannot be written into it: the mount
    // starts all the same, the chunk pending (and read from memory), and its unmount says
    // why it refuses.
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/2")).unwrap(), vec![0x52; 16]);
    let refused = m.unmount(&[]);
    let err = common::stderr(&refused);
    assert!(!refused.status.success() && err.contains("a/c/0"), "{err}");
    fs::rename(&shard, d.path().join("damaged-shard")).unwrap();
    common::assert_ok(&m.unmount(&[]), "unmount once the damage is moved away");
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/2")).unwrap(), vec![0x52; 16]);
    assert!(
        !m.path("a/c/1").exists(),
        "a chunk nobody fsynced came back"
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the hostile review of issue 18: a hard link at a shard's lock name (to a file of
/// someone else's, where the kernel lets users link others' files) had the root daemon
/// overwrite that file with the shard and rename it into the array. A lock file of more
/// than one name is taken away and made anew.
#[test]
fn a_hard_link_at_a_shards_lock_name_is_never_written_through() {
    let (d, backing, _) = dirs();
    let victim = d.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir_all(backing.join("a/c")).unwrap();
    fs::hard_link(&victim, backing.join("a/c/0.__lock")).unwrap();
    fs::create_dir_all(m.path("a/c")).unwrap();
    for i in 0..4u8 {
        fs::write(m.path(&format!("a/c/{i}")), [i + 1; 16]).unwrap();
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert_eq!(fs::metadata(&victim).unwrap().nlink(), 1, "still linked");
    assert_eq!(fs::metadata(backing.join("a/c/0")).unwrap().nlink(), 1);
    let out = common::shardfs(&["verify", backing.to_str().unwrap()]);
    common::assert_ok(&out, "verify");
}

/// From the hostile review of issue 18: one user could keep the mount from starting for
/// everyone, by making a directory where a dead mount's journaled chunk had its shard
/// ("journal replay could not write"). The mount starts; the chunk waits in memory and
/// lands once the path is free.
#[test]
fn a_replay_that_cannot_write_never_keeps_the_mount_from_starting() {
    let (_d, backing) = dead_journal();
    fs::create_dir_all(backing.join("a/c/0")).unwrap();
    let args = ["--chunks-per-shard", "4"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![0x11; 16]);
    fs::remove_dir(backing.join("a/c/0")).unwrap();
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert!(
        common::mount::journal_ids(&backing).is_empty(),
        "journal left"
    );
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![0x11; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the hostile review of issue 18: in a BACKING root that others may write (and that
/// is not sticky), another user could rename `.shardfs` away under a live mount and put a
/// journal of theirs in its place. Such a root is refused; a sticky one is not.
#[test]
fn a_backing_root_others_may_write_is_refused_unless_sticky() {
    for (mode, refused) in [(0o777, true), (0o775, true), (0o1777, false)] {
        let (d, backing, _) = dirs();
        fs::set_permissions(&backing, fs::Permissions::from_mode(mode)).unwrap();
        let (out, mounted) = try_mount(d.path(), &backing);
        let err = common::stderr(&out);
        assert_eq!(mounted, !refused, "mode {mode:o}: {err}");
        if refused {
            assert!(
                err.contains("writable by others") && err.contains("chmod go-w"),
                "{err}"
            );
        }
    }
}

/// From the hostile review of issue 18, defect 2: a forged index declaring fifteen
/// adjacent chunks of 4 GiB (each allowed alone) had a merge allocate 60 GiB at once and
/// abort the daemon. A merge reads no more than half the machine's memory: the shard
/// write fails, named, and the mount lives.
#[test]
fn a_merge_into_a_forged_huge_shard_fails_and_the_mount_lives() {
    use std::io::Write;
    let (_d, backing, _) = dirs();
    let doc = common::LINE_ARRAY.replace("[128]", "[256]");
    fs::create_dir_all(backing.join("a/c")).unwrap();
    let args = ["--chunks-per-shard", "16"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::write(m.path("a/zarr.json"), &doc).unwrap();
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    let each = (4u64 << 30) - 1;
    let mut index = Vec::new();
    for k in 0..15u64 {
        index.extend((k * each).to_le_bytes());
        index.extend(each.to_le_bytes());
    }
    index.extend(u64::MAX.to_le_bytes());
    index.extend(u64::MAX.to_le_bytes());
    let crc = crc32c::crc32c(&index);
    index.extend(crc.to_le_bytes());
    let mut shard = fs::File::create(backing.join("a/c/0")).unwrap();
    shard.set_len(15 * each).unwrap();
    std::io::Seek::seek(&mut shard, std::io::SeekFrom::End(0)).unwrap();
    shard.write_all(&index).unwrap();
    drop(shard);
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::write(m.path("a/c/15"), [7u8; 16]).unwrap();
    let flush = common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]);
    let err = common::stderr(&flush);
    assert!(!flush.status.success() && err.contains("a/c/0"), "{err}");
    assert!(m.daemon_alive(), "the daemon died");
    let log = m.log_text();
    assert!(log.contains("more than half"), "{log}");
    let out = common::shardfs(&["unmount", "--give-up", m.mountpoint.to_str().unwrap()]);
    assert!(!common::mount::is_mounted(&m.mountpoint), "{out:?}");
}

/// Issue 18, a suspicion confirmed: a listing of a key directory walked every directory
/// below it, however deep (a chain of 2,100 made by someone else cost each `ls` a walk,
/// and one past PATH_MAX failed it). Shard files lie at most a key's levels down; nothing
/// deeper is looked into, and the chain is shown as it is.
#[test]
fn a_deep_chain_of_directories_in_an_array_costs_a_listing_nothing() {
    let (_d, backing, _) = dirs();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir(m.path("a/c")).unwrap();
    fs::write(m.path("a/c/1"), [5u8; 16]).unwrap();
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    let chain = run_timeout(
        Command::new("python3").arg("-c").arg(format!(
            "import os\nfd = os.open({:?}, os.O_RDONLY)\nfor _ in range(2100):\n    \
             os.mkdir('xy', dir_fd=fd)\n    fd = os.open('xy', os.O_RDONLY, dir_fd=fd)\n",
            backing.join("a/c")
        )),
        LIMIT,
    );
    common::assert_ok(&chain, "the chain");
    let names: Vec<String> = fs::read_dir(m.path("a/c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.contains(&"1".to_string()) && names.contains(&"xy".to_string()),
        "{names:?}"
    );
    assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![5u8; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// The daemon's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

/// Issue 18, defect 7: with `--max-pending-memory 64M`, one file held open in an array and
/// written to 800 MB took the daemon to 846 MB. An open file other than a chunk goes to
/// BACKING when memory is over the limit, and its writer goes on writing there.
#[test]
fn an_open_file_counts_against_the_memory_limit() {
    use std::io::Write;
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4", "--max-pending-memory", "64M"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    let mut f = fs::File::create(m.path("a/big.bin")).unwrap();
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..400 {
        f.write_all(&block).unwrap();
    }
    f.flush().unwrap();
    let held = rss(m.pid);
    drop(f);
    assert!(held < 256 << 20, "the daemon holds {} MiB", held >> 20);
    let back = fs::read(m.path("a/big.bin")).unwrap();
    assert_eq!(back.len(), 400 << 20);
    assert!(
        back.chunks(1 << 20).all(|c| c == block.as_slice()),
        "content"
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(
        fs::metadata(backing.join("a/big.bin")).unwrap().len(),
        400 << 20
    );
}

/// From the hostile review of the by-path fixes (F8): a file renamed into an array is read
/// whole into memory, and was up to 4 GiB whatever the memory limit (a sparse 1 GiB file
/// took the daemon to 1 GB). One larger than the limit is refused (EFBIG) and stays.
#[test]
fn a_file_moved_into_an_array_is_bounded_by_the_memory_limit() {
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4", "--max-pending-memory", "8M"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir_all(m.path("a/c")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    let sparse = fs::File::create(m.path("sparse")).unwrap();
    sparse.set_len(256 << 20).unwrap();
    drop(sparse);
    let moved = fs::rename(m.path("sparse"), m.path("a/c/0"));
    assert_eq!(common::mount::errno_of(moved), Some(libc::EFBIG));
    assert!(rss(m.pid) < 128 << 20, "the daemon read it");
    assert_eq!(fs::metadata(m.path("sparse")).unwrap().len(), 256 << 20);
    assert!(!m.path("a/c/0").exists());
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// Issue 18, defect 6 (the log): a file held in memory that could not be written to
/// BACKING was tried, and warned of, at every tick of the flusher (4,752 lines in 5 s for
/// 50 files). It is tried again at the idle pace and said once; once the way is free it
/// lands.
#[test]
fn a_file_that_cannot_be_written_out_is_said_once() {
    let (_d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4", "--idle-flush", "0.1"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    for i in 0..20 {
        fs::write(m.path(&format!("a/notes{i}")), b"n").unwrap();
        // Where it would go, a directory: its rename into place fails.
        fs::create_dir(backing.join(format!("a/notes{i}"))).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..20 {
        fs::remove_dir(backing.join(format!("a/notes{i}"))).unwrap();
    }
    let log = m.log_text();
    common::assert_ok(&m.unmount(&[]), "unmount");
    let lines = log.matches("temporary file kept in memory").count();
    assert!(lines > 0 && lines <= 20, "{lines} lines");
    assert_eq!(fs::read(backing.join("a/notes3")).unwrap(), b"n");
}

/// Issue 18, hostile BACKING fixtures: a sparse 1 TiB `zarr.json`, a sharded one whose
/// shard shape overflows any product, and an array of 2^126 chunks written through the
/// mount. Each is shown (as it is, where it cannot be translated), reads and writes get
/// answers, and the daemon and its unmount are unharmed.
#[test]
fn hostile_documents_in_backing_leave_the_mount_working() {
    use std::io::Read;
    let (_d, backing, _) = dirs();
    fs::create_dir(backing.join("huge")).unwrap();
    let doc = fs::File::create(backing.join("huge/zarr.json")).unwrap();
    doc.set_len(1 << 40).unwrap();
    drop(doc);
    let big = (1u64 << 63) - 1;
    let wrapping = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [big, big, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration":
            {"chunk_shape": [1u64 << 62, 1u64 << 62, 4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "attributes": {},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 1, 1], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"}}]
    });
    fs::create_dir(backing.join("wrap")).unwrap();
    fs::write(backing.join("wrap/zarr.json"), wrapping.to_string()).unwrap();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    let mut head = [1u8; 8];
    fs::File::open(m.path("huge/zarr.json"))
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(head, [0; 8], "shown as it is");
    assert!(fs::read_dir(m.path("huge")).unwrap().count() == 1);
    fs::create_dir_all(m.path("wrap/c/0/0")).unwrap();
    fs::write(m.path("wrap/c/0/0/0"), b"plain").unwrap();
    assert_eq!(fs::read(backing.join("wrap/c/0/0/0")).unwrap(), b"plain");
    let vast = common::LINE_ARRAY
        .replace("\"shape\":[128]", &format!("\"shape\":[{big},{big}]"))
        .replace("\"chunk_shape\":[16]", "\"chunk_shape\":[2,2]");
    fs::create_dir(m.path("vast")).unwrap();
    fs::write(m.path("vast/zarr.json"), vast).unwrap();
    fs::create_dir_all(m.path("vast/c/9")).unwrap();
    fs::write(m.path("vast/c/9/9"), [3u8; 4]).unwrap();
    assert_eq!(fs::read(m.path("vast/c/9/9")).unwrap(), vec![3u8; 4]);
    assert!(fs::read_dir(m.path("vast/c")).unwrap().count() >= 1);
    assert!(m.daemon_alive(), "the daemon died");
    common::assert_ok(&m.unmount(&[]), "unmount");
    let out = common::shardfs(&["verify", backing.join("vast").to_str().unwrap()]);
    common::assert_ok(&out, "verify");
}

/// From the hostile review of issue 18 (D1): once an open file held in memory had gone
/// to BACKING (over the memory limit), every read and write through its descriptor
/// opened it again by its path, as root: another user who put their victim's file at that
/// path read and wrote it. The descriptor keeps to the file it wrote.
#[test]
fn an_open_file_gone_to_backing_is_never_reopened_by_its_path() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::FileExt;
    let (d, backing, _) = dirs();
    let args = ["--chunks-per-shard", "4", "--max-pending-memory", "8M"];
    let m = common::mount::Mounted::new(&backing, &args, LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("a/big.tmp"))
        .unwrap();
    f.write_all(&vec![b'o'; 12 << 20]).unwrap();
    assert!(backing.join("a/big.tmp").exists(), "not gone to BACKING");
    let victim = d.path().join("victim");
    fs::write(&victim, b"VICTIM SECRET").unwrap();
    fs::rename(&victim, backing.join("a/big.tmp")).unwrap();
    f.write_all_at(b"PWNED", 0).unwrap();
    let mut head = [0u8; 5];
    f.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"PWNED", "reads what it wrote");
    let stolen = fs::read(backing.join("a/big.tmp")).unwrap();
    assert_eq!(
        stolen, b"VICTIM SECRET",
        "the file put at its path was written"
    );
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    assert!(
        !all.starts_with(b"VICTIM"),
        "the file put at its path was read"
    );
    drop(f);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the hostile review of issue 18 (D5): a user holding the key lock of a shard of
/// theirs made `shardfs unmount --give-up` wait two minutes per lock, twice over. Giving up,
/// no lock another process holds is waited for.
#[test]
fn a_lock_someone_holds_never_keeps_give_up_waiting() {
    use std::os::fd::AsRawFd;
    let (_d, backing, _) = dirs();
    let m = common::mount::Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    fs::create_dir(m.path("a")).unwrap();
    fs::write(m.path("a/zarr.json"), common::LINE_ARRAY).unwrap();
    fs::create_dir_all(backing.join("a/c")).unwrap();
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(backing.join("a/c/0.__lock"))
        .unwrap();
    // SAFETY: a zeroed flock is valid; the fields set describe the whole file.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    // SAFETY: a valid descriptor and an initialised struct.
    assert_eq!(
        unsafe { libc::fcntl(lock.as_raw_fd(), libc::F_OFD_SETLK, &fl) },
        0
    );
    fs::create_dir_all(m.path("a/c")).unwrap();
    fs::write(m.path("a/c/0"), [1u8; 16]).unwrap();
    let start = Instant::now();
    let out = run_timeout(
        Command::new(common::shardfs_bin()).args([
            "unmount",
            "--give-up",
            m.mountpoint.to_str().unwrap(),
        ]),
        Duration::from_secs(100),
    );
    assert!(!is_mounted(&m.mountpoint), "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "gave up after {:?}",
        start.elapsed()
    );
    assert!(common::stderr(&out).contains("giving up on"), "{out:?}");
    drop(lock);
}

/// `shardfs mount BACKING d/mnt` (its log in `d`), unmounted again if it mounted. Returns
/// its output and whether it mounted.
fn try_mount(d: &Path, backing: &Path) -> (std::process::Output, bool) {
    let mnt = d.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let out = run_timeout(
        Command::new(common::shardfs_bin()).args([
            "mount",
            backing.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "--log-file",
            d.join("log").to_str().unwrap(),
        ]),
        LIMIT,
    );
    let mounted = is_mounted(&mnt);
    if mounted {
        let _ = common::shardfs(&["unmount", mnt.to_str().unwrap()]);
    }
    (out, mounted)
}

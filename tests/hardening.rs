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
    assert_eq!(fs::metadata(a.join("c/0/1.partial")).unwrap().uid(), 4321);
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

#[test]
fn stats_count_what_they_should() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    let s = stats(&m);
    assert_eq!(s["panics"], 0, "{s}");
    python_ok("noop", "pass", &[]);
    assert_ok(&m.unmount(&[]), "unmount");
}

/// A directory swapped for a symbolic link after the kernel looked it up: nothing the
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
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "something was made outside BACKING"
    );
    responsive(&m);
    let _ = m.unmount(&[]);
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
}

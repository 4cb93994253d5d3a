//! A root daemon with `--allow-other` serving two ordinary users (uids 4321 and 4322, run
//! with `setpriv`): what each makes keeps its maker, group and mode (umask applied) in
//! BACKING, in memory or not; what the mount makes on its own (shards, key directories)
//! belongs to the array directory's owner; a chunk's mode is its array's, and a chmod that
//! would close it to others on its own is refused rather than reported and dropped; one
//! user cannot read or write what the other closed to them.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::mount::{Mounted, dirs};

const LIMIT: Duration = Duration::from_secs(60);
const ALICE: u32 = 4321;
const BOB: u32 = 4322;

/// Runs `script` with `sh` as `uid` (its own group, no others), in `dir`.
fn as_user(uid: u32, dir: &Path, script: &str) -> std::process::Output {
    common::mount::run_timeout(
        Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "--",
                "sh",
                "-c",
                script,
            ])
            .current_dir(dir),
        LIMIT,
    )
}

fn ok(out: &std::process::Output, what: &str) {
    common::assert_ok(out, what);
}

/// (uid, gid, mode) of a BACKING file.
fn owner(path: &Path) -> (u32, u32, u32) {
    let m = fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

/// A mount of a BACKING with a home directory for each user, reachable by both.
fn shared_mount() -> (tempfile::TempDir, std::path::PathBuf, Mounted) {
    let (d, backing, _) = dirs();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for uid in [ALICE, BOB] {
        let home = backing.join(uid.to_string());
        fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    }
    let m = Mounted::new(
        &backing,
        &["--allow-other", "--chunks-per-shard", "4"],
        LIMIT,
    );
    (d, backing, m)
}

#[test]
fn what_a_user_makes_is_theirs_in_backing() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let script = format!(
        "umask 077 && mkdir a && printf '%s' '{}' > a/zarr.json && mkdir a/c && \
         head -c16 /dev/zero > a/c/0 && echo secret > a/secret.txt && echo x > plain.txt",
        common::LINE_ARRAY.replace('\n', "")
    );
    ok(&as_user(ALICE, &home, &script), "alice writes");
    ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    let b = backing.join(ALICE.to_string());
    for (file, mode) in [
        ("plain.txt", 0o600),
        ("a/secret.txt", 0o600),
        ("a/zarr.json", 0o600),
        // Made by the mount: the array directory's owner and mode.
        ("a/c", 0o700),
        ("a/c/0", 0o600),
    ] {
        assert_eq!(owner(&b.join(file)), (ALICE, ALICE, mode), "{file}");
    }
    // Shown as stored.
    let shown = fs::metadata(home.join("a/c/0")).unwrap();
    assert_eq!((shown.uid(), shown.mode() & 0o777), (ALICE, 0o600));

    // Bob can read none of it, nor write there.
    let bob = as_user(BOB, &home, "cat a/secret.txt || cat a/c/0 || touch a/x");
    assert!(!bob.status.success(), "bob got in");
    let bob = as_user(BOB, &home, "cat plain.txt");
    assert!(
        common::stderr(&bob).contains("Permission denied"),
        "{bob:?}"
    );
    let status = m.unmount(&[]);
    common::assert_ok(&status, "unmount");
}

#[test]
fn a_chunks_mode_is_its_arrays_and_a_change_is_refused_not_dropped() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let script = format!(
        "mkdir a && printf '%s' '{}' > a/zarr.json && mkdir a/c && head -c16 /dev/zero > a/c/0",
        common::LINE_ARRAY.replace('\n', "")
    );
    ok(&as_user(ALICE, &home, &script), "alice writes");
    // What it is already, or more open (tar -x, cp -a, before they set the directory's
    // own mode): accepted, nothing changes.
    ok(
        &as_user(ALICE, &home, "chmod 644 a/c/0"),
        "chmod to what it is",
    );
    ok(&as_user(ALICE, &home, "chmod 666 a/c/0"), "chmod more open");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        fs::metadata(home.join("a/c/0")).unwrap().mode() & 0o777,
        0o644
    );
    // Closing it to others on its own would be a change reported and never made.
    let refused = as_user(ALICE, &home, "chmod 600 a/c/0");
    assert!(
        common::stderr(&refused).contains("Operation not permitted"),
        "{refused:?}"
    );
    assert_eq!(
        fs::metadata(home.join("a/c/0")).unwrap().mode() & 0o777,
        0o644
    );
    // The array's mode is where it is set, and the chunk (and its shard) follow.
    ok(&as_user(ALICE, &home, "chmod 700 a"), "chmod the array");
    // (The kernel keeps a chunk's attributes for the mount's 1 s attribute timeout.)
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        fs::metadata(home.join("a/c/0")).unwrap().mode() & 0o777,
        0o600
    );
    // A translated zarr.json is BACKING's file: its mode changes there.
    ok(
        &as_user(ALICE, &home, "chmod 600 a/zarr.json"),
        "chmod zarr.json",
    );
    let b = backing.join(ALICE.to_string());
    assert_eq!(owner(&b.join("a/zarr.json")).2, 0o600);
    ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    assert_eq!(owner(&b.join("a/c/0")), (ALICE, ALICE, 0o600));
    // A file held in memory takes a chmod and a chown with it to BACKING.
    ok(
        &as_user(ALICE, &home, "echo n > a/notes && chmod 640 a/notes"),
        "notes",
    );
    std::os::unix::fs::chown(home.join("a/notes"), Some(BOB), None).unwrap();
    ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    assert_eq!(owner(&b.join("a/notes")), (BOB, ALICE, 0o640));
    let log = m.log_text();
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert!(
        log.contains("chmod or chown the array directory"),
        "the refusal is not logged: {log}"
    );
}

/// An object-store mount (a local S3 server): the store keeps no owners. While the mount
/// lives, a file keeps its maker and mode, so another user is refused as on a local file
/// system; a later mount shows what the store holds as the mounting user's (README,
/// "Security model": mount a store for several users only when they all may).
#[test]
fn an_object_store_mount_keeps_owners_while_it_lives() {
    let server = common::s3::S3Server::start("owners");
    let cache = tempfile::tempdir().unwrap();
    fs::set_permissions(cache.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let env = server.env();
    let args = [
        "--allow-other",
        "--chunks-per-shard",
        "4",
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let url = Path::new("s3://owners/data");
    let m = Mounted::with_env(url, &args, &env, LIMIT);
    fs::set_permissions(
        m.mountpoint.parent().unwrap(),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::create_dir(m.path("alice")).unwrap();
    std::os::unix::fs::chown(m.path("alice"), Some(ALICE), Some(ALICE)).unwrap();
    let home = m.path("alice");
    ok(
        &as_user(ALICE, &home, "umask 077 && echo secret > notes.txt"),
        "alice writes",
    );
    let shown = fs::metadata(home.join("notes.txt")).unwrap();
    assert_eq!((shown.uid(), shown.mode() & 0o777), (ALICE, 0o600));
    let bob = as_user(BOB, &home, "cat notes.txt");
    assert!(!bob.status.success(), "bob read alice's file");
    common::assert_ok(&m.unmount(&[]), "unmount");
    let m = Mounted::with_env(url, &args, &env, LIMIT);
    let shown = fs::metadata(m.path("alice/notes.txt")).unwrap();
    assert_eq!(
        shown.uid(),
        0,
        "a later mount shows the mounting user as owner"
    );
    assert_eq!(fs::read(m.path("alice/notes.txt")).unwrap(), b"secret\n");
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the hostile review of issue 18 (D6): the daemon's own umask (022) was applied on
/// top of the caller's: with umask 002 in a group directory, a member made 2755
/// directories and 0644 files the group could not write. Only the caller's umask counts.
#[test]
fn only_the_callers_umask_counts() {
    let (_d, backing, m) = shared_mount();
    let shared = backing.join("shared");
    fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(0), Some(5000)).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o2775)).unwrap();
    let out = common::mount::run_timeout(
        Command::new("setpriv")
            .args([
                &format!("--reuid={ALICE}"),
                &format!("--regid={ALICE}"),
                "--groups=5000",
                "--",
                "sh",
                "-c",
                "umask 002 && mkdir d && touch f && mkfifo p",
            ])
            .current_dir(m.path("shared")),
        LIMIT,
    );
    ok(&out, "alice makes things in the group directory");
    assert_eq!(owner(&shared.join("d")), (ALICE, 5000, 0o2775));
    assert_eq!(owner(&shared.join("f")), (ALICE, 5000, 0o664));
    assert_eq!(owner(&shared.join("p")).2, 0o664);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the hostile review of issue 18 (D2): a chmod or truncate by path went to whatever
/// file was at the path when the daemon acted; a user who swapped another user's file in
/// after the kernel's permission check (made on its cached view) had root chmod or cut the
/// victim's file. The change is made on the inode found, and refused unless the caller may
/// make it to that inode.
#[test]
fn a_chmod_by_path_never_reaches_a_file_swapped_in() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let made = "echo mine > x && chmod 666 x && stat x >/dev/null && cat x >/dev/null";
    ok(&as_user(ALICE, &home, made), "alice");
    let victim = backing.join(BOB.to_string()).join("secret");
    fs::write(&victim, b"bob's").unwrap();
    std::os::unix::fs::chown(&victim, Some(BOB), Some(BOB)).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let at = backing.join(ALICE.to_string()).join("x");
    fs::rename(&victim, &at).unwrap();
    // Within the kernel's attribute timeout it still thinks x is alice's, open to all.
    // Opens first (a denied chmod makes the kernel look again).
    let read = as_user(ALICE, &home, "echo PWNED >> x; cat x");
    let _ = as_user(ALICE, &home, "truncate -s 0 x; chmod 644 x");
    assert_eq!(owner(&at), (BOB, BOB, 0o600), "the victim's mode changed");
    assert_eq!(
        fs::read(&at).unwrap(),
        b"bob's",
        "the victim's file was changed"
    );
    assert!(
        !common::stdout(&read).contains("bob"),
        "the victim's file was read"
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// A BACKING file of `uid` with `mode` and `content`, at `path`.
fn plant(path: &Path, uid: u32, gid: u32, mode: u32, content: &[u8]) {
    fs::write(path, content).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Alice makes `x` in her home and the kernel caches it (hers, `mode`); then another
/// file of (`uid`, `gid`, `mode`) is put at the name behind the mount's back. Returns its
/// BACKING path.
fn swap_in(backing: &Path, home: &Path, uid: u32, gid: u32, mode: u32) -> std::path::PathBuf {
    swap_in_at("x", backing, home, (uid, gid, mode))
}

fn swap_in_at(
    name: &str,
    backing: &Path,
    home: &Path,
    (uid, gid, mode): (u32, u32, u32),
) -> std::path::PathBuf {
    let made = format!("echo mine > {name} && chmod {mode:o} {name} && stat {name} >/dev/null");
    ok(&as_user(ALICE, home, &made), "alice makes x");
    let other = backing.join(BOB.to_string()).join("other");
    plant(&other, uid, gid, mode, b"bob's");
    let at = backing.join(ALICE.to_string()).join(name);
    fs::rename(&other, &at).unwrap();
    at
}

/// From the hostile review of the by-path fixes (F1): a chmod by path re-checked only the
/// owner of the file swapped in, and kept a set-group-ID bit for a group its asker is
/// not in (a program that runs with another group's rights).
#[test]
fn a_chmod_never_keeps_set_group_id_for_a_group_not_the_askers() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    // Alice's own file, in a group she is not in (moved from a set-group-ID directory).
    let at = swap_in(&backing, &home, ALICE, 3000, 0o755);
    let _ = as_user(ALICE, &home, "chmod 2755 x");
    assert_eq!(owner(&at), (ALICE, 3000, 0o755), "set-group-ID kept");
    // Her own group's bit is hers to set.
    let at = swap_in_at("y", &backing, &home, (ALICE, ALICE, 0o755));
    ok(&as_user(ALICE, &home, "chmod 2755 y"), "chmod 2755");
    assert_eq!(owner(&at), (ALICE, ALICE, 0o2755));
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// F1 too: a time other than "now" is the owner's to set, even on a file others may
/// write (touch -d on another user's file swapped in).
#[test]
fn only_the_owner_sets_a_time_other_than_now() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let at = swap_in(&backing, &home, BOB, BOB, 0o666);
    let _ = as_user(ALICE, &home, "touch -m -d 2000-01-01 x");
    let year = |p: &Path| fs::metadata(p).unwrap().mtime() / (365 * 86400) + 1970;
    assert!(year(&at) > 2020, "alice set bob's file's time");
    ok(&as_user(ALICE, &home, "touch -m x"), "touch (now)");
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// F2: a file moved into an array becomes a chunk, with the array's owner and mode:
/// moving another user's 0600 file there (from a directory the mover may write) made its
/// content readable to them. Whoever could not read it may not move it there.
#[test]
fn a_file_its_mover_cannot_read_never_becomes_a_chunk() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let secret = backing.join(ALICE.to_string()).join("secret");
    plant(&secret, BOB, BOB, 0o600, b"bob's secret");
    let script = format!(
        "mkdir a && printf '%s' '{}' > a/zarr.json && mkdir a/c && mv secret a/c/0",
        common::LINE_ARRAY.replace('\n', "")
    );
    let moved = as_user(ALICE, &home, &script);
    assert!(!moved.status.success(), "the move was made: {moved:?}");
    assert_eq!(owner(&secret), (BOB, BOB, 0o600), "the file left");
    let read = as_user(ALICE, &home, "cat a/c/0");
    assert!(!common::stdout(&read).contains("bob"), "{read:?}");
    // A file its mover may read moves in as a chunk.
    plant(&secret, BOB, BOB, 0o644, &[1; 16]);
    ok(
        &as_user(ALICE, &home, "mv secret a/c/1"),
        "readable file moves",
    );
    assert_eq!(fs::read(home.join("a/c/1")).unwrap(), vec![1; 16]);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// F3 and F4: a `zarr.json` that is no array's, opened to write in place, was read by
/// path with no check (another user's file swapped in was readable), and written back as
/// whoever's file was at the name when it closed.
#[test]
fn a_zarr_json_written_in_place_is_checked_and_keeps_its_owner() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let g = backing.join(ALICE.to_string()).join("g");
    ok(
        &as_user(
            ALICE,
            &home,
            "mkdir g && echo '{}' > g/zarr.json && chmod 666 g/zarr.json",
        ),
        "alice makes g",
    );
    ok(
        &as_user(ALICE, &home, "stat g/zarr.json >/dev/null"),
        "stat",
    );
    plant(&g.join("zarr.json"), BOB, BOB, 0o600, b"bob's secret");
    let read = as_user(ALICE, &home, "cat 0<>g/zarr.json");
    assert!(!common::stdout(&read).contains("bob"), "{read:?}");
    assert!(!read.status.success(), "opened: {read:?}");

    // Alice's own, open while bob's file is put at the name: written back as hers.
    let g = backing.join(ALICE.to_string()).join("h");
    ok(
        &as_user(
            ALICE,
            &home,
            "mkdir h && echo '{}' > h/zarr.json && chmod 640 h/zarr.json",
        ),
        "again",
    );
    let mut writer = Command::new("setpriv")
        .args([&format!("--reuid={ALICE}"), &format!("--regid={ALICE}")])
        .args(["--clear-groups", "--", "/usr/bin/python3", "-c"])
        // (One descriptor, no dup: its only FLUSH is the close, after the swap.)
        .arg(
            "import os, time\n\
             fd = os.open('h/zarr.json', os.O_RDWR)\n\
             os.write(fd, b'{\"a\": 1}\\n')\n\
             time.sleep(2)\n\
             os.close(fd)",
        )
        .current_dir(&home)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let other = backing.join(BOB.to_string()).join("other");
    plant(&other, BOB, BOB, 0o600, b"bob's");
    fs::rename(&other, g.join("zarr.json")).unwrap();
    assert!(writer.wait().unwrap().success());
    ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    let log = m.log_text();
    assert_eq!(
        (
            owner(&g.join("zarr.json")),
            fs::read(g.join("zarr.json")).unwrap()
        ),
        ((ALICE, ALICE, 0o640), b"{\"a\": 1}\n".to_vec()),
        "{log}"
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// F5: a chunk fsynced is written into its shard from the journal's body: that shard was
/// root's, 0644, whatever its array's owner and mode.
#[test]
fn a_shard_made_from_the_journal_is_its_arrays_owners() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let script = format!(
        "umask 077 && mkdir a && printf '%s' '{}' > a/zarr.json && mkdir a/c && \
         dd if=/dev/zero of=a/c/3 bs=16 count=1 conv=fsync 2>/dev/null",
        common::LINE_ARRAY.replace('\n', "")
    );
    ok(&as_user(ALICE, &home, &script), "alice writes and fsyncs");
    ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    let shard = backing.join(ALICE.to_string()).join("a/c/0");
    assert_eq!(owner(&shard), (ALICE, ALICE, 0o600));
    assert_eq!(owner(shard.parent().unwrap().parent().unwrap()).0, ALICE);
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// F6: temporary names were `.NAME.shardfs-PID-N` with N counting from 0: another user
/// who made those names first (in a directory both may write) kept a file from ever being
/// written, and the mount from unmounting. Now they are random.
#[test]
fn temporary_names_cannot_be_taken_first() {
    let (d, backing, _) = dirs();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&backing, fs::Permissions::from_mode(0o1777)).unwrap();
    let args = ["--allow-other", "--max-pending-memory", "1M"];
    let m = Mounted::new(&backing, &args, LIMIT);
    let array = format!(
        "mkdir -m 1777 shared && printf '%s' '{}' > shared/zarr.json",
        common::LINE_ARRAY.replace('\n', "")
    );
    ok(
        &as_user(ALICE, &m.mountpoint, &array),
        "alice makes the array",
    );
    // In BACKING, where the daemon makes its temporary files.
    let squat = format!(
        "for n in $(seq 0 499); do touch .v.tmp.shardfs-{pid}-$n \
         .v.tmp.shardfs-{pid}-$(printf %016x $n); done",
        pid = m.pid
    );
    ok(
        &as_user(ALICE, &backing.join("shared"), &squat),
        "alice squats",
    );
    ok(
        &as_user(BOB, &m.path("shared"), "echo bobs > v.tmp"),
        "bob writes",
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
    assert_eq!(fs::read(backing.join("shared/v.tmp")).unwrap(), b"bobs\n");
}

/// F7: a directory made through the mount was made as root and given to its maker by
/// name: a user swapping a root-owned empty directory in at the name (RENAME_EXCHANGE, in a
/// loop) was given it. Made as the caller, there is nothing to give.
#[test]
fn a_directory_made_is_never_given_away_by_name() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let rootdir = backing.join(ALICE.to_string()).join("rd");
    fs::create_dir(&rootdir).unwrap();
    // Alice makes n0, n1, … through the mount while a thread of hers exchanges the
    // newest with root's `rd` in BACKING, as fast as it can.
    let race = r#"
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
mnt, backing = sys.argv[1], sys.argv[2].encode()
current, stop = [b"n0"], []
def swap():
    while not stop:
        libc.renameat2(-100, backing + b"/" + current[0], -100, backing + b"/rd", 2)
t = threading.Thread(target=swap)
t.start()
for i in range(300):
    current[0] = b"n%d" % i
    try:
        os.mkdir(os.path.join(mnt, "n%d" % i))
    except OSError:
        pass
stop.append(1)
t.join()
"#;
    let b = backing.join(ALICE.to_string());
    let script = format!(
        "/usr/bin/python3 -c '{race}' {} {}",
        home.display(),
        b.display()
    );
    ok(&as_user(ALICE, &home, &script), "alice races");
    // Whatever name it ended under, root's directory is still root's.
    let mut roots = 0;
    for entry in fs::read_dir(&b).unwrap() {
        let p = entry.unwrap().path();
        if fs::symlink_metadata(&p).unwrap().uid() == 0 {
            roots += 1;
        }
    }
    assert_eq!(roots, 1, "root's directory was given to alice");
    assert!(b.join("n299").exists() || b.join("rd").exists());
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// A directory anyone may write (not sticky), and in it bob's directory `name` holding
/// his file `vfile`, made in BACKING.
fn bobs_dir_in_open(backing: &Path, name: &str) -> std::path::PathBuf {
    let open = backing.join("open");
    if !open.exists() {
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let dir = open.join(name);
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(BOB), Some(BOB)).unwrap();
    plant(&dir.join("vfile"), BOB, BOB, 0o644, b"bob's");
    dir
}

/// From the second review of the by-path fixes (1): creates, removals and renames were
/// made as root by path, so a directory swapped in at a path the kernel had cached as the
/// caller's (renamed within a directory anyone may write) took them: alice created,
/// removed and renamed files in bob's directory. Made as the caller, the kernel refuses.
#[test]
fn a_directory_swapped_in_takes_no_change_its_owner_did_not_allow() {
    let (_d, backing, m) = shared_mount();
    let vdir = bobs_dir_in_open(&backing, "vdir");
    let open = m.path("open");
    ok(
        &as_user(
            ALICE,
            &open,
            "mkdir adir && echo m > mine && ls adir && stat adir",
        ),
        "alice caches her directory",
    );
    fs::rename(backing.join("open/adir"), backing.join("open/adir.old")).unwrap();
    fs::rename(&vdir, backing.join("open/adir")).unwrap();
    let attempts = "touch adir/planted; rm -f adir/vfile; mv mine adir/mine; \
                    mv adir/vfile stolen; mkdir adir/sub; true";
    ok(&as_user(ALICE, &open, attempts), "alice tries");
    let bobs = backing.join("open/adir");
    let mut names: Vec<_> = fs::read_dir(&bobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["vfile"], "bob's directory changed");
    assert!(!backing.join("open/stolen").exists());
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// The same for an array (1, arrays): the mount writes chunks into shards and documents
/// as root, so the caller's permission is checked again on the array's directory really
/// there: alice wrote a chunk into bob's shard, removed one and rewrote his zarr.json.
#[test]
fn an_array_swapped_in_takes_no_change_its_owner_did_not_allow() {
    let (_d, backing, m) = shared_mount();
    let open = backing.join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let line = common::LINE_ARRAY.replace('\n', "");
    let array = |name: &str| {
        format!(
            "mkdir {name} && printf '%s' '{line}' > {name}/zarr.json && mkdir {name}/c && \
             head -c16 /dev/zero > {name}/c/0"
        )
    };
    ok(
        &as_user(BOB, &m.path("open"), &array("varr")),
        "bob's array",
    );
    ok(
        &as_user(
            ALICE,
            &m.path("open"),
            &format!(
                "{} && ls aarr/c && stat aarr/c/0 aarr/zarr.json",
                array("aarr")
            ),
        ),
        "alice's array, cached",
    );
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    let shard = fs::read(open.join("varr/c/0")).unwrap();
    let doc = fs::read(open.join("varr/zarr.json")).unwrap();
    fs::rename(open.join("aarr"), open.join("aarr.old")).unwrap();
    fs::rename(open.join("varr"), open.join("aarr")).unwrap();
    let attempts = "head -c16 /dev/urandom > aarr/c/1; rm -f aarr/c/0; \
                    true > aarr/zarr.json; head -c16 /dev/urandom > aarr/c/0; true";
    ok(&as_user(ALICE, &m.path("open"), attempts), "alice tries");
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    assert_eq!(
        fs::read(open.join("aarr/c/0")).unwrap(),
        shard,
        "bob's shard"
    );
    assert_eq!(
        fs::read(open.join("aarr/zarr.json")).unwrap(),
        doc,
        "bob's zarr.json"
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the second review (2): a missing parent of a rename's destination was made by
/// the mount as root and given to its parent's owner by path: bob's directory, swapped in
/// at the name meanwhile (RENAME_EXCHANGE in a loop), became alice's.
#[test]
fn a_parent_made_for_a_rename_is_never_given_away_by_name() {
    let (_d, backing, m) = shared_mount();
    let home = m.path(&ALICE.to_string());
    let b = backing.join(ALICE.to_string());
    let vdir = b.join("vdir");
    fs::create_dir(&vdir).unwrap();
    plant(&vdir.join("keep"), BOB, BOB, 0o644, b"bob's");
    std::os::unix::fs::chown(&vdir, Some(BOB), Some(BOB)).unwrap();
    let race = r#"
import ctypes, os, shutil, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
mnt, backing = sys.argv[1], sys.argv[2]
rounds = 0
for i in range(150):
    f = os.path.join(mnt, "f%d" % i)
    open(f, "w").close()
    name = "sub%d" % i
    sub = os.path.join(mnt, name)
    try:
        os.mkdir(sub)
        os.stat(sub)
        os.rmdir(os.path.join(backing, name))
    except OSError:
        continue
    stop = []
    def swap():
        a, v = (backing + "/" + name).encode(), (backing + "/vdir").encode()
        while not stop:
            libc.renameat2(-100, a, -100, v, 2)
    t = threading.Thread(target=swap)
    t.start()
    try:
        os.rename(f, os.path.join(sub, "f%d" % i))
    except OSError:
        pass
    stop.append(1)
    t.join()
    for at in (name, "vdir"):
        p = os.path.join(backing, at)
        if os.path.exists(os.path.join(p, "keep")) and os.stat(p).st_uid != 4322:
            sys.exit("the victim directory now belongs to %d, at %s" % (os.stat(p).st_uid, at))
    # The victim directory back at its name, and what the round made gone.
    if os.path.exists(os.path.join(backing, name, "keep")):
        libc.renameat2(-100, (backing + "/" + name).encode(), -100, (backing + "/vdir").encode(), 2)
    shutil.rmtree(os.path.join(backing, name), ignore_errors=True)
    rounds += 1
print(rounds)
"#;
    let script = format!(
        "/usr/bin/python3 -c '{race}' {} {}",
        home.display(),
        b.display()
    );
    let raced = as_user(ALICE, &home, &script);
    ok(&raced, "alice races");
    let rounds: u32 = common::stdout(&raced).trim().parse().unwrap();
    assert!(rounds > 100, "only {rounds} rounds raced");
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// Bob's array `varr` and alice's `aarr` (each with chunks 0..3 and flushed), in a
/// directory anyone may write; returns what bob's shard and document hold.
fn two_arrays_in_open(backing: &Path, m: &Mounted) -> (Vec<u8>, Vec<u8>) {
    let open = backing.join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let line = common::LINE_ARRAY.replace('\n', "");
    for (uid, name) in [(BOB, "varr"), (ALICE, "aarr")] {
        let script = format!(
            "mkdir {name} && printf '%s' '{line}' > {name}/zarr.json && mkdir {name}/c && \
             for k in 0 1 2 3; do head -c16 /dev/zero > {name}/c/$k; done"
        );
        ok(&as_user(uid, &m.path("open"), &script), name);
    }
    common::assert_ok(
        &common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]),
        "flush",
    );
    (
        fs::read(open.join("varr/c/0")).unwrap(),
        fs::read(open.join("varr/zarr.json")).unwrap(),
    )
}

/// From the third review of the by-path fixes (1, 5, 6 and the chunk operations): what
/// alice had open in her array, or cached of it, went into bob's array once his directory
/// was renamed in at its path: a chunk written through a handle opened before, a file held
/// in memory written out there, a `zarr.json` committed there at close, a truncation.
#[test]
fn what_was_open_in_an_array_never_lands_in_one_swapped_in() {
    let (_d, backing, m) = shared_mount();
    let (shard, doc) = two_arrays_in_open(&backing, &m);
    let attack = r#"
import os, sys
mnt, b = sys.argv[1], sys.argv[2]
a = os.path.join(mnt, "aarr")
chunk = os.open(os.path.join(a, "c/0"), os.O_WRONLY)
notes = os.open(os.path.join(a, "notes.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(notes, b"alice")
doc = os.open(os.path.join(a, "zarr.json"), os.O_WRONLY | os.O_TRUNC)
os.stat(os.path.join(a, "c/1"))
os.rename(os.path.join(b, "aarr"), os.path.join(b, "aarr.old"))
os.rename(os.path.join(b, "varr"), os.path.join(b, "aarr"))
landed = []
def attempt(what, f):
    try:
        f()
        landed.append(what)
    except OSError:
        pass
attempt("chunk write", lambda: os.pwrite(chunk, b"X" * 16, 0))
attempt("chunk close", lambda: os.close(chunk))
attempt("notes fsync", lambda: os.fsync(notes))
attempt("doc write", lambda: os.write(doc, open(os.path.join(b, "aarr.old/zarr.json"), "rb").read().replace(b"{}", b"{\"pwned\": 1}")))
attempt("doc close", lambda: os.close(doc))
attempt("truncate", lambda: os.truncate(os.path.join(a, "c/1"), 0))
print(" ".join(x.replace(" ", "_") for x in landed))
"#;
    let script = format!(
        "/usr/bin/python3 -c '{attack}' {} {}",
        m.path("open").display(),
        backing.join("open").display()
    );
    let out = as_user(ALICE, &m.path("open"), &script);
    ok(&out, "alice's attempts");
    eprintln!("accepted: {}", common::stdout(&out));
    let _ = common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]);
    let bobs = backing.join("open/aarr");
    assert_eq!(fs::read(bobs.join("c/0")).unwrap(), shard, "bob's shard");
    assert_eq!(
        fs::read(bobs.join("zarr.json")).unwrap(),
        doc,
        "bob's zarr.json"
    );
    assert!(
        !bobs.join("notes.txt").exists(),
        "alice's file in bob's array"
    );
    let _ = m.unmount(&["--give-up"]);
}

/// From the third review (2, 3): a file moved from a directory swapped in into an array
/// was removed as root (bob's file became alice's chunk), and a chunk moved out onto a
/// name in such a directory replaced bob's file.
#[test]
fn a_move_between_an_array_and_a_directory_swapped_in_is_refused() {
    let (_d, backing, m) = shared_mount();
    let vdir = bobs_dir_in_open(&backing, "vdir");
    plant(&vdir.join("g"), BOB, BOB, 0o600, b"bob's g");
    let open = m.path("open");
    let line = common::LINE_ARRAY.replace('\n', "");
    let setup = format!(
        "mkdir adir && ls adir && stat adir && mkdir arr && printf '%s' '{line}' > arr/zarr.json \
         && mkdir arr/c && head -c16 /dev/zero > arr/c/1"
    );
    ok(
        &as_user(ALICE, &open, &setup),
        "alice's directory and array",
    );
    fs::rename(backing.join("open/adir"), backing.join("open/adir.old")).unwrap();
    fs::rename(&vdir, backing.join("open/adir")).unwrap();
    let attempts = "mv adir/vfile arr/c/0; mv arr/c/1 adir/g; true";
    ok(&as_user(ALICE, &open, attempts), "alice tries");
    let bobs = backing.join("open/adir");
    assert_eq!(fs::read(bobs.join("vfile")).unwrap(), b"bob's");
    assert_eq!(fs::read(bobs.join("g")).unwrap(), b"bob's g");
    common::assert_ok(&m.unmount(&[]), "unmount");
}

/// From the fourth review of the by-path fixes (1): a shard write checked that its
/// array's directory was at its path, then wrote by that path: alice, exchanging her
/// array's directory with bob's in a tight loop while writing and removing her chunks, had
/// her shards land in his array. The shard is written in the directory it was checked in.
#[test]
fn a_shard_write_racing_an_exchange_of_arrays_stays_in_its_own() {
    let (_d, backing, m) = shared_mount();
    race_an_exchange_of_arrays(&backing, &m);
}

/// The same, once the mount holds as many array directories as it will (4096): arrays it
/// learns of later were written by path, unchecked (fifth review); their identity is now
/// kept without a descriptor and checked in one look at the path.
#[test]
fn a_shard_write_racing_an_exchange_stays_in_its_own_past_the_most_held() {
    let (_d, backing, m) = shared_mount();
    fs::create_dir_all(m.path("many/a0")).unwrap();
    fs::write(m.path("many/a0/zarr.json"), common::LINE_ARRAY).unwrap();
    // As stored (sharded), copied behind the mount's back.
    let many = backing.join("many");
    let stored = fs::read(many.join("a0/zarr.json")).unwrap();
    for k in 1..4200 {
        let dir = many.join(format!("a{k}"));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("zarr.json"), &stored).unwrap();
    }
    for k in 0..4200 {
        fs::metadata(m.path(&format!("many/a{k}/zarr.json"))).unwrap();
    }
    race_an_exchange_of_arrays(&backing, &m);
}

fn race_an_exchange_of_arrays(backing: &Path, m: &Mounted) {
    let (shard, doc) = two_arrays_in_open(backing, m);
    let race = r#"
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
mnt, b = sys.argv[1], sys.argv[2]
a, v = (b + "/aarr").encode(), (b + "/varr").encode()
stop = []
def swap():
    while not stop:
        libc.renameat2(-100, a, -100, v, 2)
t = threading.Thread(target=swap)
t.start()
for r in range(150):
    for k in range(4):
        try:
            with open(os.path.join(mnt, "aarr/c/%d" % k), "wb") as f:
                f.write(b"A" * 16)
        except OSError:
            pass
    try:
        os.unlink(os.path.join(mnt, "aarr/c/%d" % (r % 4)))
    except OSError:
        pass
stop.append(1)
t.join()
if os.stat(b + "/aarr").st_uid != os.getuid():
    libc.renameat2(-100, a, -100, v, 2)
"#;
    let script = format!(
        "/usr/bin/python3 -c '{race}' {} {}",
        m.path("open").display(),
        backing.join("open").display()
    );
    ok(&as_user(ALICE, &m.path("open"), &script), "alice races");
    let _ = common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]);
    let bobs = backing.join("open/varr");
    assert_eq!(owner(&bobs).0, BOB, "the arrays were not put back");
    assert!(
        fs::read(bobs.join("c/0")).unwrap() == shard,
        "bob's shard changed: {}",
        m.log_text()
    );
    assert_eq!(fs::read(bobs.join("zarr.json")).unwrap(), doc);
    let _ = m.unmount(&["--give-up"]);
}

/// From the fourth review (2): a hard link of a chunk is a copy of it, and was made from
/// whatever array was at the path the kernel had cached: alice copied a chunk of bob's
/// 0700 array, renamed in at her array's path, into her own directory.
#[test]
fn a_link_of_a_chunk_reads_only_what_its_maker_may() {
    let (_d, backing, m) = shared_mount();
    two_arrays_in_open(&backing, &m);
    let open = backing.join("open");
    fs::set_permissions(open.join("varr"), fs::Permissions::from_mode(0o700)).unwrap();
    ok(
        &as_user(ALICE, &m.path("open"), "stat aarr/c/1 >/dev/null"),
        "alice caches her chunk",
    );
    fs::rename(open.join("aarr"), open.join("aarr.old")).unwrap();
    fs::rename(open.join("varr"), open.join("aarr")).unwrap();
    let home = m.path(&ALICE.to_string());
    let linked = as_user(ALICE, &home, "ln ../open/aarr/c/1 stolen");
    assert!(!linked.status.success(), "{linked:?}");
    assert!(!backing.join(ALICE.to_string()).join("stolen").exists());
    common::assert_ok(&m.unmount(&[]), "unmount");
}

//! Real mounts for tests: a guard that unmounts on drop (also when the test fails), a
//! watchdog that tears the mount down if a test hangs on it, and commands with timeouts.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{assert_ok, stdout};

/// Runs `cmd`, killing it and failing the test when it takes longer than `limit`.
pub fn run_timeout(cmd: &mut Command, limit: Duration) -> Output {
    run_limited(cmd, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cmd`, killing it when it takes longer than `limit`.
pub fn run_limited(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    // A spawn that fails (out of file descriptors, of processes) is an error, never a
    // panic: guards call this from `drop`, where a panic would abort before the mount
    // is taken down.
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{cmd:?} took longer than {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
}

pub fn shardfs_timeout(args: &[&str], limit: Duration) -> Output {
    run_timeout(Command::new(super::shardfs_bin()).args(args), limit)
}

/// Runs a fixtures.py subcommand against the mount, with a timeout.
pub fn python_timeout(args: &[&str], limit: Duration) -> Output {
    run_timeout(
        Command::new(super::python())
            .arg(super::fixtures_script())
            .args(args),
        limit,
    )
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // Bytes: another mount point's name may be anything, UTF-8 or not.
    let info = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let target = path
        .as_os_str()
        .as_bytes()
        .iter()
        .flat_map(|&b| match b {
            b' ' => b"\\040".to_vec(),
            b'\t' => b"\\011".to_vec(),
            b'\n' => b"\\012".to_vec(),
            b'\\' => b"\\134".to_vec(),
            b => vec![b],
        })
        .collect::<Vec<u8>>();
    info.split(|&b| b == b'\n')
        .any(|l| l.split(|&b| b == b' ').nth(4) == Some(target.as_slice()))
}

/// Detaches whatever is mounted at `path` (a lazy unmount), without starting a process
/// where it can: a test that ran out of file descriptors or processes must still take its
/// mount down (a leaked mount can hang CI). Then `umount -l` for what the call may not do.
pub fn detach(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: a valid NUL-terminated path; umount2 reads it and keeps nothing.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return;
        }
    }
    if is_mounted(path) {
        let _ = Command::new("umount").arg("-l").arg(path).output();
    }
}

fn force_unmount(mountpoint: &Path, pid: Option<u32>) {
    detach(mountpoint);
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: a signal to a process id; nothing is read or kept.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// A live shardfs mount of `backing` on a fresh temporary mount point.
pub struct Mounted {
    /// What `shardfs mount` printed (stdout, then stderr).
    pub mount_output: String,
    pub backing: PathBuf,
    pub mountpoint: PathBuf,
    pub log: PathBuf,
    pub pid: u32,
    _dir: tempfile::TempDir,
    stop_watchdog: Option<mpsc::Sender<()>>,
}

impl Mounted {
    /// Mounts with `shardfs mount` (the daemon form); the watchdog tears the mount down
    /// after `limit` so that a hung test fails instead of hanging CI.
    pub fn new(backing: &Path, extra_args: &[&str], limit: Duration) -> Mounted {
        Mounted::with_env(backing, extra_args, &[], limit)
    }

    /// As `new`, with `env` set for the daemon (an object store's address and keys).
    pub fn with_env(
        backing: &Path,
        extra_args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        Mounted::mount(backing, dir, mountpoint, extra_args, env, limit)
    }

    /// As `new`, at the existing directory `mountpoint` (which may lie inside BACKING).
    pub fn at(backing: &Path, mountpoint: &Path, extra_args: &[&str], limit: Duration) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        Mounted::mount(
            backing,
            dir,
            mountpoint.to_path_buf(),
            extra_args,
            &[],
            limit,
        )
    }

    fn mount(
        backing: &Path,
        dir: tempfile::TempDir,
        mountpoint: PathBuf,
        extra_args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Mounted {
        let log = dir.path().join("shardfs.log");
        let mut args = vec![
            "mount",
            backing.to_str().unwrap(),
            mountpoint.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(extra_args);
        let out = run_timeout(
            Command::new(super::shardfs_bin())
                .args(&args)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
            Duration::from_secs(30),
        );
        assert!(
            out.status.success(),
            "mount failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            is_mounted(&mountpoint),
            "mount returned before the mount was live"
        );
        let control: serde_json::Value =
            serde_json::from_slice(&std::fs::read(mountpoint.join(".shardfs-control")).unwrap())
                .unwrap();
        let pid = control["pid"].as_u64().unwrap() as u32;
        let (tx, rx) = mpsc::channel::<()>();
        let (mp, p) = (mountpoint.clone(), pid);
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "watchdog: test still using {} after {limit:?}; tearing it down",
                    mp.display()
                );
                force_unmount(&mp, Some(p));
            }
        });
        Mounted {
            mount_output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            backing: backing.to_path_buf(),
            mountpoint,
            log,
            pid,
            _dir: dir,
            stop_watchdog: Some(tx),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// The daemon's log so far. Lines reach it through the daemon's writer thread, a
    /// moment after they are logged: read until it stops growing.
    pub fn log_text(&self) -> String {
        let read = || std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = std::time::Instant::now();
        let mut last = read();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let now = read();
            if now.len() == last.len() || start.elapsed() > Duration::from_secs(2) {
                return now;
            }
            last = now;
        }
    }

    /// `shardfs unmount`, with a timeout.
    pub fn unmount(&self, extra: &[&str]) -> Output {
        let mut args = vec!["unmount", self.mountpoint.to_str().unwrap()];
        args.extend_from_slice(extra);
        shardfs_timeout(&args, Duration::from_secs(60))
    }

    pub fn daemon_alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        !stat.is_empty()
            && !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
    }

    /// A crash: the daemon killed with SIGKILL, then its dead mount cleared as a user
    /// would (`shardfs unmount`, which says so and exits 1).
    pub fn crash(&self) {
        self.kill_daemon();
        let cleared = self.unmount(&[]);
        let said = String::from_utf8_lossy(&cleared.stderr);
        assert_eq!(cleared.status.code(), Some(1), "{said}");
        assert!(said.contains("dead mount and has been cleared"), "{said}");
    }

    /// A crash, then BACKING mounted again with `args` (the new mount replays the dead
    /// one's journal before it goes live).
    pub fn crash_and_remount(self, args: &[&str], limit: Duration) -> Mounted {
        self.crash();
        let backing = self.backing.clone();
        drop(self);
        Mounted::new(&backing, args, limit)
    }

    /// Kills the daemon with SIGKILL (a crash) and waits until it is gone (at once if it
    /// is gone already).
    pub fn kill_daemon(&self) {
        if !self.daemon_alive() {
            return;
        }
        let kill = Command::new("kill")
            .arg("-KILL")
            .arg(self.pid.to_string())
            .status()
            .unwrap();
        assert!(kill.success(), "kill -KILL {}", self.pid);
        self.wait_daemon_gone(Duration::from_secs(30));
    }

    pub fn wait_daemon_gone(&self, limit: Duration) {
        let start = Instant::now();
        while self.daemon_alive() {
            assert!(start.elapsed() < limit, "daemon {} still running", self.pid);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_watchdog.take() {
            let _ = tx.send(());
        }
        // Out of file descriptors, mountinfo cannot be read: taken as still mounted.
        let unknown = std::fs::File::open("/proc/self/mountinfo").is_err();
        if unknown || is_mounted(&self.mountpoint) {
            let unmounted = run_limited(
                Command::new(super::shardfs_bin())
                    .arg("unmount")
                    .arg(&self.mountpoint),
                Duration::from_secs(60),
            );
            if !unmounted.is_ok_and(|o| o.status.success()) {
                force_unmount(&self.mountpoint, Some(self.pid));
            }
        }
        if self.daemon_alive() {
            let start = Instant::now();
            while self.daemon_alive() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.daemon_alive() {
                force_unmount(&self.mountpoint, Some(self.pid));
            }
        }
    }
}

// Helpers of the write-side tests.

const CLIENT: Duration = Duration::from_secs(180);

pub fn stats(m: &Mounted) -> Value {
    let out = shardfs_timeout(&["stats", m.mountpoint.to_str().unwrap()], CLIENT);
    assert_ok(&out, "stats");
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// Runs Python code (with the pinned clients) and `args` as its sys.argv[1:], which must
/// succeed.
pub fn python_ok(what: &str, code: &str, args: &[&Path]) {
    let out = run_timeout(
        std::process::Command::new(super::python())
            .args(["-c", code])
            .args(args),
        CLIENT,
    );
    assert_ok(&out, what);
}

pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let out = dir.path().join("expected");
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    (dir, backing, out)
}

pub fn small_array(m: &Mounted, name: &str) -> PathBuf {
    let script = format!(
        "import zarr; zarr.create_array({:?}, shape=(64, 64), chunks=(16, 16), dtype='uint8', \
         compressors=None, fill_value=0)",
        m.path(name).to_str().unwrap()
    );
    python_ok("create array", &script, &[]);
    m.path(name)
}

pub fn chunk(value: u8) -> Vec<u8> {
    vec![value; 256]
}

pub fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// A small tmpfs, unmounted on drop: a backing store that fills up.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn new(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = run_timeout(
            std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir),
            CLIENT,
        );
        assert_ok(&out, "mount tmpfs");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

/// Starts a mount in the foreground and kills it after `delay_ms` (during its replay, or
/// just after), then clears whatever it left.
pub fn kill_during_replay(backing: &Path, mountpoint: &Path, delay_ms: u64) {
    let mut child = Command::new(super::shardfs_bin())
        .args(["mount", "--foreground"])
        .arg(backing)
        .arg(mountpoint)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(delay_ms));
    let _ = child.kill();
    let _ = child.wait();
    if is_mounted(mountpoint) {
        detach(mountpoint);
    }
}

/// The journals whose files are in BACKING's journal directory, by id.
pub fn journal_ids(backing: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(backing.join(".shardfs/journal"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.split('.').next().map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where daemons of this user keep their status files (as `shardfs` finds it).
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SHARDFS_RUNTIME_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from("/run/shardfs")
}

/// `s` with its `%XX` escapes decoded.
pub fn url_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

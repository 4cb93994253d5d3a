//! The life of a mount: starting the daemon, serving until unmounted, and unmounting.
//!
//! `shardfs mount` starts a copy of itself with `--foreground` in a new session, its stderr
//! going to the log file, and returns once that copy reports the mount live (or failed)
//! through a pipe. SIGINT and SIGTERM make the daemon detach the mount; the kernel then ends
//! the session once no file is open, and the daemon exits after writing its status file.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, Session, SessionACL};
use thiserror::Error;
use tracing::{error, info, warn};

use crate::backing::Backing;
use crate::core::{CONTROL_FILE, DaemonInfo, ShardFs, WriteConfig};
use crate::fuse::FuseAdapter;
use crate::journal::JOURNAL_DIR;
use crate::store::object::ObjectBacked;

#[derive(Clone, Debug)]
pub struct MountConfig {
    /// BACKING: the directory, or for an object store, the local cache mirroring it.
    pub backing: PathBuf,
    /// The object store mounted (`s3://…`), when BACKING is its cache.
    pub object_url: Option<String>,
    /// Objects larger than this go to the object store in parts.
    pub multipart_above: u64,
    /// The object store's server, over what the environment says (`--endpoint`).
    pub endpoint: Option<String>,
    pub mountpoint: PathBuf,
    pub threads: usize,
    pub allow_other: bool,
    /// Readahead of the mount, in KiB (0 leaves the kernel's default).
    pub read_ahead_kb: u32,
    /// The largest read or write request, in KiB.
    pub max_request_kb: u32,
    /// Plain files pass through the kernel to BACKING where it can (`--no-passthrough`).
    pub passthrough: bool,
    pub write: WriteConfig,
}

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{0} is a dead shardfs mount (its daemon is gone): clear it with `shardfs unmount {0}` or `umount -l {0}`"
    )]
    DeadMount(String),
    #[error("{0} is already a mount point")]
    AlreadyMounted(String),
    #[error("{0} is not a directory")]
    NotADirectory(String),
    #[error("{0} is not a shardfs mount")]
    NotShardfs(String),
    #[error(
        "{0} is busy (files are open on it, or another shardfs command is using it); close them or use --lazy"
    )]
    Busy(String),
    #[error("the daemon failed to start: {0}")]
    StartFailed(String),
    #[error("{url}: {message}")]
    Store { url: String, message: String },
    #[error("the daemon reported: {0}")]
    Unclean(String),
    #[error("{0}")]
    Usage(String),
    /// What became of an unmount that is not the daemon's to say.
    #[error("{0}")]
    Ended(String),
    /// Unmounted as `--give-up` asked, with pending data that could not be written.
    #[error("{0}")]
    GaveUp(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `mountpoint` can be mounted on: a live directory, not already a mount, and
/// not above BACKING (the daemon would then wait on its own mount).
fn check_mountpoint(mountpoint: &Path, backing: &Path) -> Result<(), DaemonError> {
    if let (Ok(m), Ok(b)) = (fs::canonicalize(mountpoint), fs::canonicalize(backing))
        && b.starts_with(&m)
    {
        return Err(DaemonError::Usage(format!(
            "BACKING {} lies inside MOUNTPOINT {}",
            b.display(),
            m.display()
        )));
    }
    let shown = || mountpoint.display().to_string();
    if crate::mounts::is_dead_at(mountpoint) {
        return Err(DaemonError::DeadMount(shown()));
    }
    match fs::metadata(mountpoint) {
        Err(e) => Err(io_err(mountpoint)(e)),
        Ok(m) if !m.is_dir() => Err(DaemonError::NotADirectory(shown())),
        Ok(_) if crate::mounts::at(mountpoint).is_some() => {
            Err(DaemonError::AlreadyMounted(shown()))
        }
        Ok(_) => Ok(()),
    }
}

/// `shardfs mount` without `--foreground`: starts the daemon and waits until it serves.
pub fn spawn_daemon(
    config: &MountConfig,
    args: &[std::ffi::OsString],
    log_file: &Path,
) -> Result<(), DaemonError> {
    check_mountpoint(&config.mountpoint, &config.backing)?;
    if let Some(dir) = log_file.parent() {
        // The default place must be private; a directory of the user's choice is theirs.
        match dir == crate::runtime::dir() {
            true => crate::runtime::ensure_private(dir),
            false => fs::create_dir_all(dir),
        }
        .map_err(io_err(dir))?;
    }
    let log = crate::runtime::open_log(log_file).map_err(io_err(log_file))?;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io_err(Path::new("pipe"))(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just returned these two open descriptors, owned by nobody else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let exe = std::env::current_exe().map_err(io_err(Path::new("/proc/self/exe")))?;
    let write_raw = fds[1];
    let mut cmd = Command::new(exe);
    // The runtime directory as this command resolved it (the daemon writes its status
    // there, and `unmount`, run from anywhere, must find it).
    // The daemon's flags go right after the subcommand (`mount`): after the user's
    // arguments they could follow a `--` and be taken for paths.
    let (subcommand, rest) = args.split_first().unzip();
    cmd.env("SHARDFS_RUNTIME_DIR", crate::runtime::dir())
        .args(subcommand)
        .arg("--foreground")
        .arg("--ready-fd")
        .arg("3")
        .args(rest.unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: between fork and exec only async-signal-safe calls are made.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(write_raw, 3) < 0 || libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(io_err(Path::new("shardfs")))?;
    drop(write_end);
    await_report(child, read_end, log_file)
}

/// Waits for the daemon's report on `read_end`: `ok` once the mount is live, else why it
/// is not. The report comes within seconds; a daemon stuck mounting is killed.
fn await_report(
    mut child: std::process::Child,
    read_end: OwnedFd,
    log_file: &Path,
) -> Result<(), DaemonError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut report = String::new();
        let _ = fs::File::from(read_end).read_to_string(&mut report);
        let _ = tx.send(report);
    });
    let report = match rx.recv_timeout(START_TIMEOUT) {
        Ok(r) => r,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DaemonError::StartFailed(format!(
                "no report within {START_TIMEOUT:?}; see {}",
                log_file.display()
            )));
        }
    };
    if report.trim() == "ok" {
        return Ok(());
    }
    let _ = child.wait();
    let reason = if report.trim().is_empty() {
        format!("it exited; see {}", log_file.display())
    } else {
        report.trim().to_string()
    };
    Err(DaemonError::StartFailed(reason))
}

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Blocks the signals the daemon handles in this thread and every thread it starts later,
/// so that only the signal thread receives them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a zeroed, then initialised, set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// `fusermount3 -u` (or the older `fusermount`), `-z` when `lazy`; its refusal as an
/// error (EBUSY when the mount is busy).
fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let program = crate::runtime::fusermount().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "only root may unmount without fusermount3, which was not found \
             ($FUSERMOUNT_PATH, PATH, /bin, /sbin; Debian and Ubuntu: apt install fuse3)",
        )
    })?;
    let out = std::process::Command::new(&program)
        .arg(if lazy { "-uz" } else { "-u" })
        .arg("--")
        .arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(fusermount_refusal(&String::from_utf8_lossy(&out.stderr)))
}

/// fusermount3's refusal (`<program>: <what>`) as an error: busy when it ends with
/// strerror's words for EBUSY (the path, which comes before them, may say anything).
fn fusermount_refusal(said: &str) -> io::Error {
    let said = said.trim();
    let what = said.split_once(": ").map_or(said, |(_, what)| what);
    if what.ends_with("Device or resource busy") {
        return io::Error::from_raw_os_error(libc::EBUSY);
    }
    if what.contains("not found in /etc/mtab") {
        return io::Error::other("fusermount3: it is not a FUSE mount of this user's");
    }
    io::Error::other(format!("fusermount3: {what}"))
}

/// `path` absolute, with its links resolved, without entering the mount it may name (a
/// dead mount answers every look inside with ENOTCONN): the directory holding it is
/// canonicalized, and a last component that is a link followed; `m/.` is `m`, and
/// `m/sub/..` is `m`.
fn resolve_outside(path: &Path) -> PathBuf {
    let mut p = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for _ in 0..40 {
        let clean: PathBuf = p.components().collect();
        let (Some(parent), Some(name)) = (clean.parent(), clean.file_name()) else {
            // `…/..` (or `/`): what it names lies above, outside any mount it came through.
            return fs::canonicalize(&clean).unwrap_or(clean);
        };
        let parent = fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
        let joined = parent.join(name);
        match fs::read_link(&joined) {
            Ok(target) => p = parent.join(target),
            Err(_) => return joined,
        }
    }
    p
}

/// An object store that could not be opened or mirrored, named by its URL.
fn store_error(url: &str, e: impl std::fmt::Display) -> DaemonError {
    DaemonError::Store {
        url: url.to_string(),
        message: e.to_string(),
    }
}

/// The core of an object-store mount: the store opened, its tree mirrored into the cache
/// `backing`, shards read and written in the store, the rest published to it.
fn object_core(
    url: &str,
    backing: &Path,
    local: Backing,
    daemon: DaemonInfo,
    config: &MountConfig,
) -> Result<ShardFs, DaemonError> {
    let store = Arc::new(
        ObjectBacked::open_at(url, config.endpoint.as_deref())
            .map_err(|e| store_error(url, e))?
            .with_multipart_above(config.multipart_above),
    );
    take_the_stores_clock(&store, url);
    let (mirrored, held) =
        crate::store::mirror::prepare(&*store, url, backing).map_err(|e| store_error(url, e))?;
    // Held as long as the process lives: the cache is this mount's.
    std::mem::forget(held);
    let published = crate::store::mirror::Published::new(store.clone(), mirrored.tags);
    Ok(
        ShardFs::with_store(local, store, false, daemon, config.write.clone())
            .publishing_to(Arc::new(published)),
    )
}

/// Nodes of one object store order their writes of a chunk by the times written with each
/// (`shard::stamps`): those are taken on the store's clock, measured here, when this
/// machine's is off by more than the measure can tell (a node 20 s slow had its later
/// write dropped as older).
fn take_the_stores_clock(store: &ObjectBacked, url: &str) {
    const TOLERANCE_NS: i64 = 1_500_000_000;
    match store.clock_offset_ns() {
        Ok(Some(ns)) if ns.abs() > TOLERANCE_NS => {
            let (by, way) = (
                ns.abs() as f64 / 1e9,
                if ns > 0 { "behind" } else { "ahead of" },
            );
            warn!(store = %url, "this machine's clock is {by:.1} s {way} the store's: the times \
                written with chunks are taken on the store's clock (set the clock right: NTP)");
            crate::core::pending::memfile::set_clock_offset(ns);
        }
        Ok(Some(_)) => {}
        Ok(None) => warn!(store = %url, "the store's answers carry no Date: nodes order their \
            writes by their own clocks, which must agree (NTP)"),
        Err(e) => warn!(
            "the store's clock could not be read ({e}): nodes order their writes \
            by their own clocks, which must agree (NTP)"
        ),
    }
}

/// The daemon proper: mounts, reports through `ready`, serves until unmounted.
pub fn run_foreground(config: &MountConfig, ready: Option<OwnedFd>) -> Result<(), DaemonError> {
    let mut ready = ready.map(fs::File::from);
    // What the waiting `shardfs mount` is told: why not (`ok` is told below).
    let report = |ready: &mut Option<fs::File>, msg: &str| {
        if let Some(f) = ready.as_mut() {
            let _ = f.write_all(msg.as_bytes());
        }
    };
    if let Err(e) = check_mountpoint(&config.mountpoint, &config.backing) {
        report(&mut ready, &e.to_string());
        return Err(e);
    }
    let backing = fs::canonicalize(&config.backing).map_err(io_err(&config.backing))?;
    let status_file = prepare_process()?;
    let signals = block_signals();
    let daemon = DaemonInfo {
        pid: std::process::id(),
        status_file: status_file.clone(),
        mountpoint: config.mountpoint.clone(),
    };
    let core = match live_core(config, &backing, daemon) {
        Ok(core) => core,
        Err(e) => {
            report(&mut ready, &e.to_string());
            return Err(e);
        }
    };
    // Bringing the core up may take long (an object store's tree): the command that asked
    // may be gone (interrupted), and something else mounted at the mount point meanwhile.
    if ready.as_ref().is_some_and(waiter_gone) {
        return Err(DaemonError::StartFailed(
            "the `shardfs mount` that started this daemon is gone (interrupted): not mounting"
                .into(),
        ));
    }
    if let Err(e) = check_mountpoint(&config.mountpoint, &config.backing) {
        report(&mut ready, &e.to_string());
        return Err(e);
    }
    let notifier = Arc::new(std::sync::OnceLock::new());
    let session = match Session::new(
        FuseAdapter::new(
            core.clone(),
            notifier.clone(),
            config.max_request_kb * 1024,
            config.passthrough,
        ),
        &config.mountpoint,
        &fuse_config(config, &backing),
    ) {
        Ok(s) => s,
        Err(e) => {
            let e = io_err(&config.mountpoint)(e);
            report(&mut ready, &format!("mount failed: {e}"));
            return Err(e);
        }
    };
    if config.read_ahead_kb > 0 {
        raise_readahead(&config.mountpoint, config.read_ahead_kb);
    }
    unmount_on_signals(config.mountpoint.clone(), signals)?;
    let flusher = Flusher::start(core.clone(), config.write.idle_flush)?;
    info!(
        backing = %backing.display(),
        mountpoint = %config.mountpoint.display(),
        "mounted"
    );
    // A command interrupted between the check above and now never hears "ok": the mount
    // it no longer waits for goes.
    let heard = ready.as_mut().is_none_or(|f| f.write_all(b"ok\n").is_ok());
    drop(ready);
    if !heard {
        error!("the `shardfs mount` that started this daemon is gone (interrupted): unmounting");
        if let Err(e) = detach(&config.mountpoint) {
            error!("the unwanted mount could not be detached: {e}");
        }
    }
    let _ = notifier.set(session.notifier());
    let result = serve(session);
    flusher.stop();
    finish(&core, result, &status_file, &config.mountpoint)
}

/// Whether the reading end of the daemon's report pipe is closed: the `shardfs mount`
/// waiting for the report is gone.
fn waiter_gone(report: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: report.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Serves the mount's requests until it is unmounted.
fn serve(session: Session<FuseAdapter>) -> io::Result<()> {
    match session.run() {
        // The kernel tears the connection down at unmount; a thread that had just taken a
        // request off its queue then reads ECONNABORTED instead of ENODEV. Either way the
        // session is over, as asked.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            info!("the connection ended while a request was being read");
            Ok(())
        }
        r => r,
    }
}

/// The daemon's process made ready to serve: its status file's place (returned) private
/// and cleared, its descriptor limit raised, its umask cleared.
fn prepare_process() -> Result<PathBuf, DaemonError> {
    let status_file = crate::runtime::dir().join(format!("{}.status", std::process::id()));
    if let Some(dir) = status_file.parent() {
        crate::runtime::ensure_private(dir).map_err(io_err(dir))?;
    }
    let _ = fs::remove_file(&status_file);
    sweep_status_files(status_file.parent());
    raise_fd_limit();
    // The kernel applied each caller's umask to the modes it sends; the daemon's own would
    // be applied again on top (a group directory made 2775 came out 2755). Every file the
    // daemon makes for itself is given its mode explicitly.
    rustix::process::umask(rustix::fs::Mode::empty());
    Ok(status_file)
}

/// The core that serves the mount: over BACKING or an object store, with its journal,
/// and what mounts that died had made durable already in its shards.
fn live_core(
    config: &MountConfig,
    backing: &Path,
    daemon: DaemonInfo,
) -> Result<Arc<ShardFs>, DaemonError> {
    let local = Backing::new(backing.to_path_buf()).map_err(io_err(backing))?;
    let core = match &config.object_url {
        None => ShardFs::with_config(local, daemon, config.write.clone()),
        Some(url) => object_core(url, backing, local, daemon, config)?,
    };
    let core = Arc::new(if config.write.journal {
        core.with_journal()
            .map_err(io_err(&backing.join(JOURNAL_DIR)))?
    } else {
        core
    });
    // Before going live: what mounts that died had made durable goes into its shards.
    if let Err(e) = core.replay_journals() {
        let e = std::io::Error::other(format!("journal replay failed: {e}"));
        return Err(io_err(&backing.join(JOURNAL_DIR))(e));
    }
    Ok(core)
}

fn fuse_config(config: &MountConfig, backing: &Path) -> Config {
    let mut fuse_config = Config::default();
    let source = config
        .object_url
        .clone()
        .unwrap_or_else(|| backing.display().to_string());
    fuse_config.mount_options = vec![
        MountOption::FSName(format!("shardfs:{source}")),
        MountOption::Subtype("shardfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if config.allow_other {
        fuse_config.acl = SessionACL::All;
    }
    fuse_config.n_threads = Some(config.threads.max(1));
    fuse_config.clone_fd = true;
    fuse_config
}

/// SIGINT and SIGTERM (blocked in every thread) unmount, which ends the session the clean
/// way.
fn unmount_on_signals(mountpoint: PathBuf, signals: libc::sigset_t) -> Result<(), DaemonError> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `signals` is an initialised set; `sig` receives the signal number.
            while unsafe { libc::sigwait(&signals, &mut sig) } == 0 {
                info!(signal = sig, "signal received: unmounting");
                if let Err(e) = detach(&mountpoint) {
                    error!("could not unmount {}: {e}", mountpoint.display());
                }
            }
        })
        .map_err(io_err(Path::new("signal thread")))?;
    Ok(())
}

/// The background flusher: idle shards, idle files and memory pressure, a few times per
/// idle period.
struct Flusher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Flusher {
    fn start(core: Arc<ShardFs>, idle_flush: Duration) -> Result<Flusher, DaemonError> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let tick = (idle_flush / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let thread = std::thread::Builder::new()
            .name("flusher".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::park_timeout(tick);
                    if !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        core.contain("the background flusher", || core.tick());
                    }
                }
            })
            .map_err(io_err(Path::new("flusher thread")))?;
        Ok(Flusher { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// After the session: whatever is still pending is written now; failures are retried for
/// a while (the disk may be freed), then named in the status file and the log.
fn finish(
    core: &ShardFs,
    result: io::Result<()>,
    status_file: &Path,
    mountpoint: &Path,
) -> Result<(), DaemonError> {
    let flush = || {
        core.contain("the final flush", || core.flush_all())
            .unwrap_or_else(|| {
                vec!["internal error while writing what is pending (see the log)".into()]
            })
    };
    let mut failed = flush();
    let deadline = Instant::now() + EXIT_RETRY;
    let giving_up = || core.giving_up();
    while !failed.is_empty() && Instant::now() < deadline && !giving_up() {
        error!(
            "{} items not written yet, retrying: {}",
            failed.len(),
            failed.join("; ")
        );
        std::thread::sleep(Duration::from_secs(2));
        failed = flush();
    }
    if failed.is_empty()
        && let Err(e) = core.close_journal()
    {
        failed.push(format!(
            "the journal could not be closed (the next mount replays it): {e}"
        ));
    }
    let status = match (&result, failed.is_empty()) {
        (Ok(()), true) => "ok\n".to_string(),
        (_, false) => {
            for f in &failed {
                error!("lost: {f}");
            }
            format!("not written: {}\n", failed.join("; "))
        }
        (Err(e), true) => format!("session ended with an error: {e}\n"),
    };
    info!("unmounted: {}", status.trim());
    if let Err(e) = crate::runtime::write_private(status_file, status.as_bytes()) {
        error!("status file {} not written: {e}", status_file.display());
    }
    match (result, failed.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Err(e), _) => Err(io_err(mountpoint)(e)),
        (Ok(()), false) => Err(DaemonError::Unclean(status.trim().to_string())),
    }
}

/// Removes the status files of daemons that are gone, once nobody can still be waiting to
/// read them (a plain `umount` leaves one behind; `shardfs unmount` removes its own).
fn sweep_status_files(dir: Option<&Path>) {
    let Some(Ok(entries)) = dir.map(fs::read_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".status"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
        if old && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// How long a daemon whose mount is gone keeps retrying writes that failed.
const EXIT_RETRY: Duration = Duration::from_secs(30);

/// Raises the soft limit on open files to the hard limit: shard files are opened per read
/// (and a conversion keeps the large chunk files of the shards it builds open).
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a properly initialised struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Sets the mount's readahead. The kernel offers FUSE at most its default (128 KiB) at
/// INIT, which splits every chunk file of more than 128 KiB into several READ round trips;
/// the backing-device setting in sysfs lifts that. Best effort: without it the mount works,
/// only slower.
fn raise_readahead(mountpoint: &Path, kb: u32) {
    let Some(dev) = crate::mounts::at(mountpoint).map(|e| e.device) else {
        info!("readahead left as it is: no mountinfo entry for the mount");
        return;
    };
    let knob = PathBuf::from(format!("/sys/class/bdi/{dev}/read_ahead_kb"));
    match fs::write(&knob, kb.to_string()) {
        Ok(()) => info!(kb, "readahead set"),
        Err(e) => info!("readahead left as it is ({}: {e})", knob.display()),
    }
}

/// The daemon's answers through the control file.
#[derive(serde::Deserialize)]
struct ControlInfo {
    pid: u32,
    status_file: PathBuf,
    stats: crate::core::stats::StatsReport,
}

fn read_control(control: &Path) -> Result<ControlInfo, DaemonError> {
    let bytes = fs::read(control).map_err(io_err(control))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| io_err(control)(io::Error::new(io::ErrorKind::InvalidData, e)))
}

/// The daemon's counters.
pub fn stats_report(mountpoint: &Path) -> Result<crate::core::stats::StatsReport, DaemonError> {
    Ok(read_control(&mountpoint.join(CONTROL_FILE))?.stats)
}

/// `mountpoint`, canonical (relative paths, trailing slashes and symlinks name the same
/// mount), if a shardfs mount is there.
fn live_mount(mountpoint: &Path) -> Result<PathBuf, DaemonError> {
    let canonical = fs::canonicalize(mountpoint).map_err(io_err(mountpoint))?;
    let is_shardfs = crate::mounts::at(&canonical).is_some_and(|e| e.is_shardfs());
    if !is_shardfs {
        return Err(DaemonError::NotShardfs(canonical.display().to_string()));
    }
    Ok(canonical)
}

/// What the daemon says it could not write, after a flush failed.
fn not_written(control: &Path) -> String {
    let failed = read_control(control)
        .map(|i| i.stats.failed)
        .unwrap_or_default();
    if failed.is_empty() {
        "nothing named; see the daemon's log".to_string()
    } else {
        failed.join("; ")
    }
}

/// Sends a flush command to the daemon and waits for it; on a terminal, when it takes more
/// than a second, shows what is left and the rate on stderr meanwhile.
fn control_flush(control: &Path, command: &str) -> io::Result<()> {
    use std::io::IsTerminal;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = std::io::stderr().is_terminal().then(|| {
        let (control, done) = (control.to_path_buf(), done.clone());
        std::thread::spawn(move || show_progress(&control, &done))
    });
    let result = fs::OpenOptions::new()
        .write(true)
        .open(control)
        .and_then(|mut f| f.write_all(command.as_bytes()));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(p) = progress {
        let _ = p.join();
    }
    result
}

/// The progress line of a flush: pending shards and bytes left, and the rate written.
fn show_progress(control: &Path, done: &std::sync::atomic::AtomicBool) {
    let start = std::time::Instant::now();
    let first = read_control(control).map(|i| i.stats).ok();
    let mut shown = false;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        if start.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let (Some(first), Ok(now)) = (&first, read_control(control)) else {
            continue;
        };
        let now = now.stats;
        let rate = now.bytes_written.saturating_sub(first.bytes_written) as f64
            / start.elapsed().as_secs_f64();
        use std::io::Write as _;
        let _ = write!(
            std::io::stderr(),
            "\r\x1b[Kwriting: {} shards, {:.1} MiB left, {:.1} MiB/s, {:.0} s",
            now.pending_shards,
            now.pending_bytes as f64 / (1 << 20) as f64,
            rate / (1 << 20) as f64,
            start.elapsed().as_secs_f64()
        );
        shown = true;
    }
    if shown {
        say!("");
    }
}

/// `shardfs flush`: everything pending (below `path`, when given) is written and made
/// durable now, the mount staying; returns a one-line summary.
pub fn flush(mountpoint: &Path, path: Option<&Path>) -> Result<String, DaemonError> {
    let mountpoint = &live_mount(mountpoint)?;
    let shown = mountpoint.display().to_string();
    let below = match path {
        None => PathBuf::new(),
        Some(p) => {
            // A PATH that is not there is the caller's mistake; other errors are the mount's.
            let full = fs::canonicalize(p).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => DaemonError::Usage(format!("{}: {e}", p.display())),
                _ => io_err(p)(e),
            })?;
            full.strip_prefix(mountpoint)
                .map(Path::to_path_buf)
                .map_err(|_| DaemonError::Usage(format!("{} is not inside {shown}", p.display())))?
        }
    };
    let control = mountpoint.join(CONTROL_FILE);
    let before = read_control(&control)?.stats;
    let start = std::time::Instant::now();
    let command = format!("flush {}", below.display());
    if let Err(e) = control_flush(&control, &command) {
        let what = not_written(&control);
        return Err(DaemonError::Unclean(format!(
            "not everything could be written ({e}); it stays pending in {shown}. Not written: \
             {what}"
        )));
    }
    let after = read_control(&control)?.stats;
    let what = if below.as_os_str().is_empty() {
        shown
    } else {
        mountpoint.join(&below).display().to_string()
    };
    Ok(format!(
        "flushed {what}: {} shards written ({} bytes), all durable, in {:.2} s",
        after.shards_written.saturating_sub(before.shards_written),
        after.bytes_written.saturating_sub(before.bytes_written),
        start.elapsed().as_secs_f64()
    ))
}

/// `shardfs unmount`: unmount, then wait for the daemon to finish writing and exit. The
/// mount is pinned by its directory first (`mounts::Pinned`): every look at it and the
/// unmount go through that directory, so a path changed meanwhile cannot make this
/// unmount another mount.
pub fn unmount(mountpoint: &Path, lazy: bool, give_up: bool) -> Result<(), DaemonError> {
    let resolved = resolve_outside(mountpoint);
    let pinned = crate::mounts::Pinned::find(&resolved)
        .map_err(io_err(&resolved))?
        .filter(|p| p.entry.is_shardfs())
        .ok_or_else(|| DaemonError::NotShardfs(resolved.display().to_string()))?;
    let shown = pinned.shown();
    if pinned.is_dead() {
        umount_pinned(&pinned, true).map_err(io_err(&resolved))?;
        return Err(DaemonError::Ended(format!(
            "{shown} was a dead mount and has been cleared; whatever its daemon had not \
             written when it died is lost"
        )));
    }
    let control = pinned.path().join(CONTROL_FILE);
    let info = read_control(&control).map_err(|e| not_yours(&shown, e))?;
    // Checked while the daemon lives (its /proc entry tells whose it is).
    let ours = Ours {
        daemon: is_daemon_of(info.pid, &pinned.entry),
        status: crate::runtime::is_our_status_file(&info.status_file, info.pid),
    };
    let given_up = flush_before_unmount(&control, &shown, give_up)?;
    if !pinned.still_there() {
        return Err(DaemonError::Ended(format!(
            "{shown} is no longer the mount it was when asked (unmounted, or another \
             mounted there meanwhile): nothing unmounted"
        )));
    }
    unmount_now(&pinned, lazy).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => DaemonError::Busy(shown.clone()),
        _ => io_err(&resolved)(e),
    })?;
    if let Some(other) = crate::mounts::table()
        .into_iter()
        .find(|e| e.device == pinned.entry.device)
    {
        return Err(DaemonError::Ended(format!(
            "unmounted at {shown}, but the same mount is also at {} (a bind mount): its \
             daemon serves on until that is unmounted too",
            other.mount_point.display()
        )));
    }
    if !ours.daemon {
        return Err(DaemonError::Ended(format!(
            "unmounted; its daemon (pid {}) is not one of this user's, so it was not waited \
             for (see the daemon's log)",
            info.pid
        )));
    }
    daemon_verdict(&info, ours.status, given_up)
}

/// Unmounts the pinned mount. Busy is tried again for two seconds: another `shardfs`
/// command (a second unmount, a flush) holds the control file open a moment, and an
/// unmount that lost the race to another finds the mount gone, which is no failure.
fn unmount_now(pinned: &crate::mounts::Pinned, lazy: bool) -> io::Result<()> {
    let start = Instant::now();
    loop {
        match umount_pinned(pinned, lazy) {
            Err(_) if !pinned.still_there() => {
                return Err(io::Error::other(
                    "it was unmounted meanwhile by another command (which reports what its \
                     daemon says)",
                ));
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && start.elapsed() < Duration::from_secs(2) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Detaches the mount at `mountpoint` (the daemon's own, at a signal): pinned first, as
/// every unmount.
fn detach(mountpoint: &Path) -> io::Result<()> {
    match crate::mounts::Pinned::find(mountpoint)? {
        Some(pinned) => umount_pinned(&pinned, true),
        None => Err(io::Error::other("no mount there")),
    }
}

/// Unmounts the pinned mount (`lazy`: detached at once): `umount2` through its directory
/// as root; as another user through `fusermount3`, which finds the mount point itself
/// (it is set-user-ID root, and unmounts a user's own FUSE mounts only).
fn umount_pinned(pinned: &crate::mounts::Pinned, lazy: bool) -> io::Result<()> {
    match pinned.umount(if lazy { libc::MNT_DETACH } else { 0 }) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && !crate::runtime::is_root() => {
            fusermount_unmount(&pinned.entry.mount_point, lazy)
        }
        r => r,
    }
}

/// An error reaching a mount's control file: permission denied is another user's mount.
fn not_yours(shown: &str, e: DaemonError) -> DaemonError {
    match &e {
        DaemonError::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
            DaemonError::Ended(format!(
                "{shown} is another user's mount (it is closed to you): only they, or \
                 root, may unmount it"
            ))
        }
        _ => e,
    }
}

/// Whether process `pid`, named by a mount's control file, is the daemon serving `entry`,
/// to be waited for: a shardfs daemon (`--foreground`) of this user's, who must be the
/// mount's owner as the kernel recorded it (`user_id=`, which nobody can forge). The
/// control file is the mount's to say, and a FUSE file system mounted under a `shardfs:`
/// name could name any process (root's own, or one of another PID namespace's).
fn is_daemon_of(pid: u32, entry: &crate::mounts::MountEntry) -> bool {
    let euid = rustix::process::geteuid().as_raw();
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let daemon = cmdline.split(|&b| b == 0).any(|a| a == b"--foreground");
    daemon && entry.user_id == Some(euid) && crate::runtime::is_our_process(pid)
}

/// Whose the daemon of a mount is, and whether its status file may be believed.
struct Ours {
    daemon: bool,
    status: bool,
}

/// Everything pending is written while the mount is still there: when that fails, the
/// mount stays (nothing is lost) and the failures are named. Giving up, no lock another
/// process holds is waited for, from the first flush on; what could not be written is
/// returned.
fn flush_before_unmount(
    control: &Path,
    shown: &str,
    give_up: bool,
) -> Result<Option<String>, DaemonError> {
    if give_up && let Err(e) = control_flush(control, "give-up") {
        return Err(not_yours(shown, io_err(control)(e)));
    }
    let Err(e) = control_flush(control, "flush") else {
        return Ok(None);
    };
    if e.kind() == io::ErrorKind::PermissionDenied {
        return Err(not_yours(shown, io_err(control)(e)));
    }
    let what = not_written(control);
    if give_up {
        return Ok(Some(what));
    }
    Err(DaemonError::Unclean(format!(
        "pending data could not be written ({e}); {shown} stays mounted. Not written: \
         {what}. Fix the cause and unmount again, or give it up: `shardfs unmount \
         --give-up {shown}` (what was fsynced stays in the journal, for the next mount to \
         write; the rest is lost)"
    )))
}

/// After the unmount: waits for the daemon to exit and reads what it says of its end
/// (when its status file can be believed: `status`).
fn daemon_verdict(
    info: &ControlInfo,
    status: bool,
    given_up: Option<String>,
) -> Result<(), DaemonError> {
    if !wait_for_exit(info.pid) {
        return Err(DaemonError::Ended(format!(
            "unmounted, but the daemon (pid {}) is still running; see its log",
            info.pid
        )));
    }
    if !status {
        return Err(DaemonError::Ended(format!(
            "unmounted and its daemon has exited, but its status file {} is gone or not in \
             a private directory of yours (was its runtime directory removed?): what it \
             said of its end is unknown; see its log",
            info.status_file.display()
        )));
    }
    let status = fs::read_to_string(&info.status_file);
    // Read once, by the one who asked: it has served its purpose.
    let _ = fs::remove_file(&info.status_file);
    let all_written = matches!(&status, Ok(s) if s.trim() == "ok");
    // Given up, unless the daemon's last try at its end wrote everything after all.
    if let Some(what) = given_up.filter(|_| !all_written) {
        return Err(DaemonError::GaveUp(format!(
            "unmounted, giving up on: {what}. What of it was fsynced stays in the journal, \
             for the next mount of BACKING to write"
        )));
    }
    match status {
        Ok(s) if s.trim() == "ok" => Ok(()),
        Ok(s) => Err(DaemonError::Unclean(s.trim().to_string())),
        Err(e) => Err(DaemonError::Unclean(format!(
            "no status from the daemon ({}: {e})",
            info.status_file.display()
        ))),
    }
}

/// Waits until process `pid` is gone.
fn wait_for_exit(pid: u32) -> bool {
    let start = Instant::now();
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    while proc_dir.exists() {
        if start.elapsed() > EXIT_RETRY + Duration::from_secs(60) {
            return false;
        }
        // A zombie has finished; its parent (the shell that ran `shardfs mount`) reaps it.
        if let Ok(stat) = fs::read_to_string(proc_dir.join("stat"))
            && stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            return true;
        }
        let step = if start.elapsed() < Duration::from_secs(1) {
            10
        } else {
            100
        };
        std::thread::sleep(Duration::from_millis(step));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review of issue 20: a refusal whose path held "busy" was taken for EBUSY, and the
    /// program's name came twice.
    #[test]
    fn fusermount3s_refusals_are_told_by_their_end_not_by_the_path() {
        let busy = fusermount_refusal(
            "/usr/bin/fusermount3: failed to unmount /home/u/not busy: Device or resource busy\n",
        );
        assert_eq!(busy.raw_os_error(), Some(libc::EBUSY));
        let gone = fusermount_refusal(
            "/usr/bin/fusermount3: entry for /home/u/busy not found in /etc/mtab",
        );
        assert_eq!(gone.raw_os_error(), None);
        assert_eq!(
            gone.to_string(),
            "fusermount3: it is not a FUSE mount of this user's"
        );
        let other = fusermount_refusal("fusermount3: something else");
        assert_eq!(other.to_string(), "fusermount3: something else");
    }

    /// The pid a mount's control file names is waited for only when it is a shardfs
    /// daemon of this user's who owns the mount (review of issue 20: root waited 90 s on
    /// pid 1, and took another mount's daemon and status file for this one's).
    #[test]
    fn only_a_daemon_of_the_mounts_owner_is_waited_for() {
        let euid = rustix::process::geteuid().as_raw();
        let entry = |user_id| crate::mounts::MountEntry {
            id: 1,
            device: "0:1".into(),
            mount_point: "/m".into(),
            fstype: "fuse".into(),
            source: "shardfs:/b".into(),
            user_id,
        };
        let mut daemon = std::process::Command::new("python3")
            .args(["-c", "import time; time.sleep(30)", "--foreground"])
            .spawn()
            .unwrap();
        let pid = daemon.id();
        // Until python has exec'd (its command line is then the one given).
        for _ in 0..500 {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.windows(12).any(|w| w == b"--foreground") {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(is_daemon_of(pid, &entry(Some(euid))));
        assert!(
            !is_daemon_of(pid, &entry(Some(euid + 1))),
            "another owner's mount"
        );
        assert!(!is_daemon_of(pid, &entry(None)));
        assert!(
            !is_daemon_of(std::process::id(), &entry(Some(euid))),
            "not a daemon"
        );
        assert!(!is_daemon_of(2, &entry(Some(euid))), "a kernel thread");
        let _ = daemon.kill();
        let _ = daemon.wait();
    }

    /// A mount named through a link or as `m/.` is found without entering it (a dead
    /// mount answers ENOTCONN to every look inside).
    #[test]
    fn a_mount_point_is_resolved_from_outside() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        let m = real.join("m");
        fs::create_dir(&m).unwrap();
        std::os::unix::fs::symlink("m", real.join("lnk")).unwrap();
        std::os::unix::fs::symlink(real.join("lnk"), real.join("lnk2")).unwrap();
        assert_eq!(resolve_outside(&real.join("lnk")), m);
        assert_eq!(resolve_outside(&real.join("lnk2")), m);
        assert_eq!(resolve_outside(&m.join(".")), m);
        assert_eq!(resolve_outside(&real.join("lnk").join("")), m);
        fs::create_dir(m.join("sub")).unwrap();
        assert_eq!(
            resolve_outside(&m.join("sub").join("..")),
            m,
            "review: `..` last"
        );
        assert_eq!(resolve_outside(&real.join("lnk/sub/..")), m);
    }
}

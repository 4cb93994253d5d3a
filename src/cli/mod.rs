//! The `shardfs` command line.

mod convert;
mod helper;
mod inspect;
mod scan;
mod stats;
mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::convert::plan::Goal;
use thiserror::Error;

/// Zarr v3 shards, written as plain chunk files.
#[derive(Parser, Debug)]
#[command(name = "shardfs", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the index of a shard file, or of every shard of an array directory.
    ///
    /// For a shard file, the array's zarr.json is looked up in the parent directories.
    /// Exit status: 0 when every index could be read and its checksum matches, 1 when not,
    /// 2 on usage or I/O errors.
    Inspect {
        /// A shard file or an array directory.
        path: PathBuf,
        /// Print JSON: one object per shard file, a list of them for an array directory.
        #[arg(long)]
        json: bool,
    },
    /// Check an array or a whole hierarchy: metadata documents and every shard.
    ///
    /// Prints one line per problem, naming the file and the fault. Exit status: 0 when all
    /// is sound, 1 when anything is wrong, 2 on usage or I/O errors.
    Verify {
        /// An array directory, a group directory, or any directory holding Zarr nodes.
        path: PathBuf,
    },
    /// Mount BACKING at MOUNTPOINT, showing every sharded array unsharded.
    ///
    /// Returns once the mount is live; the daemon runs on in the background and logs to
    /// --log-file. With --foreground it stays attached and logs to stderr. SIGINT or SIGTERM
    /// to the daemon unmount cleanly.
    Mount(MountArgs),
    /// Show what a mount has written and what is pending: a short view on a terminal,
    /// JSON otherwise (or with --json).
    Stats {
        mountpoint: PathBuf,
        /// JSON, also on a terminal.
        #[arg(long)]
        json: bool,
        /// Show it again every --interval seconds, with the rate written, until interrupted.
        #[arg(long)]
        watch: bool,
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Link mount.fuse.shardfs (in PREFIX) to this binary, so that `mount -t fuse.shardfs
    /// BACKING MOUNTPOINT -o OPTIONS` and /etc/fstab lines of type fuse.shardfs work.
    InstallMountHelper {
        #[arg(long, default_value = "/usr/sbin")]
        prefix: PathBuf,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    ///
    /// For bash: `shardfs completions bash > /etc/bash_completion.d/shardfs`.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) to stdout: `shardfs man > /usr/share/man/man1/shardfs.1`.
    Man,
    /// Write and sync every pending shard (of PATH, or of the whole mount) now, without
    /// unmounting: when it returns, BACKING holds complete, natively readable shards.
    ///
    /// Exit status: 0 when everything was written (a one-line summary is printed), 1 when
    /// not (the shards not written are named; they stay pending), 2 on usage errors.
    Flush {
        mountpoint: PathBuf,
        /// A directory inside the mount: only what lies below it.
        path: Option<PathBuf>,
    },
    /// Pack unsharded Zarr v3 arrays into shards: every array below SRC is written to DST
    /// sharded, each chunk's bytes copied as stored (never decoded), each shard written
    /// once; everything else is copied as it is.
    ///
    /// SRC and DST are directories or object stores (s3://, gs://, az://); DST must be
    /// empty. Without DST, SRC is packed in place (crash-safe: run it again to finish).
    /// Exit status: 0 when all was packed (a summary is printed), 1 when not (the reason
    /// is printed), 2 on usage errors.
    Pack(convert::PackArgs),
    /// Unpack sharded Zarr v3 arrays: every sharded array below SRC becomes unsharded, a
    /// file per chunk, each chunk's bytes copied as stored; everything else is copied as
    /// it is.
    ///
    /// SRC and DST as for `pack`; without DST, in place. Exit status as for `pack`.
    Unpack(convert::UnpackArgs),
    /// Reshard sharded Zarr v3 arrays: every sharded array below SRC gets shards of
    /// another shape, each chunk's bytes copied as stored.
    ///
    /// SRC and DST as for `pack`; without DST, in place. Exit status as for `pack`.
    Reshard(convert::PackArgs),
    /// Unmount a shardfs mount and wait for its daemon to exit.
    ///
    /// Exit status: 0 when everything was written and the daemon exited cleanly; 1 when not
    /// (the reason is printed: not unmounted, or unmounted without the daemon's word that
    /// all was written); 2 on usage errors; 3 when `--give-up` unmounted with pending data
    /// that could not be written (named; what of it was fsynced stays in the journal).
    Unmount {
        mountpoint: PathBuf,
        /// Detach now even if files are open; the daemon exits when the last one closes.
        #[arg(long)]
        lazy: bool,
        /// Unmount even when pending data cannot be written (a damaged shard, a full or
        /// failing disk): what was fsynced stays in the journal for the next mount, the
        /// rest is lost; what is given up is named.
        #[arg(long)]
        give_up: bool,
    },
}

#[derive(clap::Args, Debug, Clone)]
struct MountArgs {
    /// The directory holding the Zarr hierarchy (a path, or file:///PATH), or an object
    /// store: s3://BUCKET/PREFIX
    /// (also gs://, az://), with credentials and endpoint from the environment
    /// (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ALLOW_HTTP=true for a plain-HTTP endpoint).
    backing: PathBuf,
    /// For an object store: the local directory holding the tree's directories and
    /// metadata documents (mirrored at every mount) and the fsync journal, replayed by the
    /// next mount on this node [default: /var/cache/shardfs/<the URL, made a name> for
    /// root, else $XDG_CACHE_HOME/shardfs/… or ~/.cache/shardfs/…].
    #[arg(long, visible_alias = "journal-dir")]
    cache_dir: Option<PathBuf>,
    /// For an object store: shards larger than this are written as multipart uploads
    /// (which, unlike a single PUT, cannot be made conditional; suffixes K, M, G); from
    /// 16M (the size of a part) to 5G (the most one PUT may carry).
    #[arg(long, default_value = "4G", value_parser = parse_multipart_above)]
    multipart_above: u64,
    /// For an object store: the server to reach, in place of the provider's own: an
    /// S3-compatible store (MinIO, Ceph RGW, Cloudflare R2, Wasabi) or an emulator. Over
    /// AWS_ENDPOINT_URL, GOOGLE_BASE_URL or AZURE_STORAGE_ENDPOINT (for Azure, with the
    /// account in it as the server names it). An http:// URL allows plain HTTP.
    #[arg(long)]
    endpoint: Option<String>,
    /// Where to show it.
    mountpoint: PathBuf,
    /// Stay attached and log to stderr.
    #[arg(long)]
    foreground: bool,
    /// The daemon's log file [default: <runtime dir>/<mountpoint>.log; the runtime dir is
    /// /run/shardfs for root, else $XDG_RUNTIME_DIR/shardfs, else $TMPDIR/shardfs-UID].
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Threads serving requests.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Let other users than the one mounting use the mount.
    #[arg(long)]
    allow_other: bool,
    /// Readahead of the mount in KiB; chunk files up to this size are read in one request
    /// (0 keeps the kernel's 128 KiB).
    #[arg(long, default_value_t = 1024)]
    read_ahead_kb: u32,
    /// The largest read or write request, in KiB (up to 16384). The kernel caps it at
    /// /proc/sys/fs/fuse/max_pages_limit pages (256 by default: 1 MiB), which root may
    /// raise.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(4..=16384))]
    max_request_kb: u32,
    /// As root: raise /proc/sys/fs/fuse/max_pages_limit (for every FUSE mount of this
    /// machine from now on; never lowered) so that --max-request-kb is not capped.
    #[arg(long)]
    raise_max_pages: bool,
    /// Serve every read and write of plain files (outside arrays) through the daemon. By
    /// default, where the kernel offers FUSE passthrough (Linux 6.9+, the daemon as root),
    /// files opened in plain directories are read and written by the kernel in BACKING
    /// directly, at native speed.
    #[arg(long)]
    no_passthrough: bool,
    /// Chunks per shard for arrays created through the mount: one number for every axis,
    /// or one per axis (`4,4,2`). Default: the auto policy.
    #[arg(long)]
    chunks_per_shard: Option<crate::zarr::ChunksPerShard>,
    /// The auto policy's target of uncompressed bytes per shard (suffixes K, M, G).
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    shard_target_bytes: u64,
    /// Store the raw chunks (codecs without a compressor) of arrays created through the
    /// mount compressed with zstd at LEVEL (-7 to 22, default 3): `zstd` or `zstd:LEVEL`.
    /// The mount shows them as written; BACKING holds an ordinary zstd array.
    #[arg(long, value_name = "zstd[:LEVEL]", value_parser = convert::parse_compress)]
    compress: Option<i32>,
    /// Seconds without change after which a shard with pending chunks is written as it is.
    #[arg(long, default_value_t = 5.0)]
    idle_flush: f64,
    /// Bytes of pending data held in memory before partial shards are written (suffixes
    /// K, M, G).
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    max_pending_memory: u64,
    /// Memory for cached shard indexes (16 bytes per chunk position) and per-shard state
    /// (suffixes K, M, G). Least recently used entries go first.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    index_cache_bytes: u64,
    /// fsync writes the shards concerned instead of appending to the journal (slower for
    /// writers that fsync every chunk, such as tensorstore).
    #[arg(long)]
    no_journal: bool,
    /// Journal bytes kept before the shards holding journaled chunks are written out
    /// (suffixes K, M, G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    max_journal_bytes: u64,
    /// Internal: the descriptor on which the daemon reports that the mount is live.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
}

/// Errors that stop a command before it can give a verdict (exit status 2).
#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CliError {
    pub fn io(path: &Path, source: std::io::Error) -> CliError {
        CliError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A command's verdict: everything sound, or problems found (exit status 1).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Sound,
    Problems,
}

/// A size in bytes, with an optional K, M, G or T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        Some('G') => (&s[..s.len() - 1], 30),
        Some('T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (a number, optionally with K, M, G or T)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `--multipart-above`: a size a multipart upload can be cut into and a single PUT can
/// carry, refused otherwise (a value silently changed would not be what was asked).
fn parse_multipart_above(s: &str) -> Result<u64, String> {
    use crate::store::object::{MOST_IN_ONE_PUT, PART_BYTES};
    let n = parse_size(s)?;
    if !(PART_BYTES..=MOST_IN_ONE_PUT).contains(&n) {
        return Err(format!(
            "{s:?} is outside 16M..5G: each part of an upload but the last is 16 MiB, and one \
             PUT carries at most 5 GiB"
        ));
    }
    Ok(n)
}

fn report_daemon(result: Result<(), crate::daemon::DaemonError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ crate::daemon::DaemonError::GaveUp(_)) => {
            say!("shardfs: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            say!("shardfs: {e}");
            ExitCode::from(1)
        }
    }
}

/// Canonical paths: the mount table and the checks compare them byte for byte. A dead
/// mount point cannot be canonicalized; its absolute path is used then.
fn abs(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// `argv`: the command line in `shardfs mount …` form (the daemon gets it too).
fn mount(args: MountArgs, argv: Vec<std::ffi::OsString>) -> ExitCode {
    use crate::daemon::{run_foreground, spawn_daemon};
    use crate::runtime::default_log_file;
    use std::os::fd::{FromRawFd, OwnedFd};

    let config = match allowed_mount(&args) {
        Ok(config) => config,
        Err(why) => {
            say!("shardfs: {why}");
            return ExitCode::from(2);
        }
    };
    if args.foreground {
        let _log = crate::logging::init();
        // SAFETY: the parent passed this descriptor for us alone.
        let ready = args.ready_fd.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        return report_daemon(run_foreground(&config, ready));
    }
    let log_file = args
        .log_file
        .clone()
        .unwrap_or_else(|| default_log_file(&config.mountpoint));
    // The daemon gets the same arguments, plus --foreground.
    let child_args: Vec<std::ffi::OsString> = argv.into_iter().skip(1).collect();
    report_daemon(spawn_daemon(&config, &child_args, &log_file))
}

/// The mount asked for, once this user may mount it (`may_mount`) and its BACKING is a
/// directory (an object store's cache made then); else why not, in one line.
fn allowed_mount(args: &MountArgs) -> Result<crate::daemon::MountConfig, String> {
    let url = args
        .backing
        .to_str()
        .filter(|b| crate::store::object::is_object_url(b))
        .map(str::to_string);
    let backing = match (&url, &args.cache_dir) {
        // file:///PATH is the directory PATH.
        (None, _) => match args
            .backing
            .to_str()
            .and_then(|b| b.strip_prefix("file://"))
        {
            Some(path) => abs(Path::new(path)),
            None => abs(&args.backing),
        },
        (Some(_), Some(dir)) => std::path::absolute(dir).unwrap_or_else(|_| dir.clone()),
        (Some(_), None) => PathBuf::new(), // made below, once mounting is allowed
    };
    let mut config = crate::daemon::MountConfig {
        object_url: url,
        multipart_above: args.multipart_above,
        endpoint: args.endpoint.clone(),
        backing,
        mountpoint: abs(&args.mountpoint),
        threads: args.threads,
        allow_other: args.allow_other,
        read_ahead_kb: args.read_ahead_kb,
        max_request_kb: args.max_request_kb,
        passthrough: !args.no_passthrough,
        write: write_config(args),
    };
    may_mount(&config)?;
    if args.raise_max_pages {
        raise_max_pages(args.max_request_kb)?;
    }
    if let Some(url) = &config.object_url {
        let dir = object_cache(url, args.cache_dir.is_none(), &config.backing)
            .map_err(|e| e.to_string())?;
        config.backing = abs(&dir);
    }
    if !config.backing.is_dir() {
        return Err(format!("{} is not a directory", config.backing.display()));
    }
    Ok(config)
}

/// How the mount writes, from its options.
fn write_config(args: &MountArgs) -> crate::core::WriteConfig {
    crate::core::WriteConfig {
        policy: match &args.chunks_per_shard {
            Some(cps) => crate::zarr::ShardPolicy::Explicit(cps.clone()),
            None => crate::zarr::ShardPolicy::Auto {
                target_bytes: args.shard_target_bytes,
            },
        },
        idle_flush: std::time::Duration::from_secs_f64(args.idle_flush.max(0.0)),
        max_pending: args.max_pending_memory,
        index_cache: args.index_cache_bytes,
        journal: !args.no_journal,
        max_journal: args.max_journal_bytes,
        compress: args.compress,
    }
}

/// What keeps this user from mounting, said in one line with what to do, before anything
/// is started (or made): a user other than root mounts through fusermount3, needs
/// `/dev/fuse`, may let others in only where /etc/fuse.conf allows it, and mounts where
/// fusermount3 lets them (it refuses the rest, less clearly, after the daemon started).
fn may_mount(config: &crate::daemon::MountConfig) -> Result<(), String> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(format!(
            "/dev/fuse: {e}: FUSE is not usable here (load the fuse module; a user needs \
             the device readable and writable, mode 0666 as distributions ship it, or the \
             group that owns it)"
        ));
    }
    if crate::runtime::is_root() {
        return Ok(());
    }
    if crate::runtime::fusermount().is_none() {
        return Err(
            "mounting as a user other than root needs fusermount3, which was not found \
             ($FUSERMOUNT_PATH, PATH, /bin, /sbin; Debian and Ubuntu: apt install fuse3; \
             Fedora: dnf install fuse3)"
                .into(),
        );
    }
    if config.allow_other {
        fuse_conf_allows_other()?;
    }
    may_mount_on(&config.mountpoint)
}

/// Whether /etc/fuse.conf has `user_allow_other`, read as fusermount3 reads it: a `#`
/// starts a comment, blanks around are ignored, and a line without its newline (the last,
/// or one too long) does not count. fusermount3 reads it as the user: a file they cannot
/// read allows nothing.
fn fuse_conf_allows_other() -> Result<(), String> {
    let conf = std::fs::read("/etc/fuse.conf").map_err(|e| {
        format!(
            "--allow-other needs the line user_allow_other in /etc/fuse.conf, which cannot \
             be read ({e}; fusermount3 reads it as you): mount without --allow-other, or ask \
             root to make it readable"
        )
    })?;
    match allows_other(&conf) {
        true => Ok(()),
        false => Err(
            "--allow-other needs the line user_allow_other in /etc/fuse.conf (root may add \
             it); without it, mount without --allow-other"
                .into(),
        ),
    }
}

/// Whether a fuse.conf's text lets users mount with allow_other (`fuse_conf_allows_other`).
fn allows_other(conf: &[u8]) -> bool {
    conf.split_inclusive(|&b| b == b'\n').any(|l| {
        let Some(l) = l.strip_suffix(b"\n").filter(|l| l.len() < 255) else {
            return false;
        };
        // fgets stops at a NUL for fusermount3: the line is then cut (and skipped).
        if l.contains(&0) {
            return false;
        }
        let l = l.split(|&b| b == b'#').next().unwrap_or_default();
        // isspace(3): blanks, and the vertical tab Rust's trim_ascii does not take.
        let blank = |b: &u8| b" \t\n\x0b\x0c\r".contains(b);
        let start = l.iter().position(|b| !blank(b)).unwrap_or(l.len());
        let end = l.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
        &l[start..end] == b"user_allow_other"
    })
}

/// Whether fusermount3 lets this user mount on `mountpoint`: a directory they may read,
/// write and enter, and, if its sticky bit is set (as /tmp's), one of their own.
fn may_mount_on(mountpoint: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mountpoint) else {
        return Ok(()); // said later, with the daemon's checks
    };
    let uid = rustix::process::geteuid().as_raw();
    let shown = mountpoint.display();
    if m.mode() & libc::S_ISVTX != 0 && m.uid() != uid {
        return Err(format!(
            "{shown} belongs to another user (uid {}) and is sticky: mount on a directory \
             of your own",
            m.uid()
        ));
    }
    // fusermount3 enters it and needs to write it; the FUSE library opens it.
    use rustix::fs::Access;
    let usable = Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK;
    if m.is_dir() && rustix::fs::access(mountpoint, usable).is_err() {
        return Err(format!(
            "{shown} is not readable, writable and enterable by you (owner uid {}): mount \
             on a directory of your own, or one you may use so",
            m.uid()
        ));
    }
    Ok(())
}

/// The local cache of an object store: `--cache-dir` as given (`given`), else one
/// directory per URL in this user's cache directory. Made if missing.
fn object_cache(url: &str, default: bool, given: &Path) -> std::io::Result<PathBuf> {
    let dir = match default {
        true => crate::runtime::cache_dir()?.join(url_dir_name(url)),
        false => given.to_path_buf(),
    };
    // Made closed to others, as the default: it holds the user's data.
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

fn url_dir_name(url: &str) -> String {
    url.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match as_mount_helper(argv) {
        Ok(argv) => argv,
        Err(code) => return code,
    };
    let cli = Cli::parse_from(argv.clone());
    if !matches!(cli.command, Command::Mount(_)) {
        quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Inspect { path, json } => inspect::run(&path, json),
        Command::Verify { path } => verify::run(&path),
        Command::Mount(args) => return mount(args, argv),
        Command::Stats {
            mountpoint,
            json,
            watch,
            interval,
        } => return stats::run(&mountpoint, json, watch, interval),
        Command::Unmount {
            mountpoint,
            lazy,
            give_up,
        } => {
            return report_daemon(crate::daemon::unmount(&mountpoint, lazy, give_up));
        }
        Command::InstallMountHelper { prefix } => return install_mount_helper(&prefix),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "shardfs", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Man => return print_man(),
        Command::Pack(args) => return convert::run(Goal::Pack, &args.common, Some(&args.shards)),
        Command::Unpack(args) => return convert::run(Goal::Unpack, &args.common, None),
        Command::Reshard(args) => {
            return convert::run(Goal::Reshard, &args.common, Some(&args.shards));
        }
        Command::Flush { mountpoint, path } => return flush(&mountpoint, path.as_deref()),
    };
    match result {
        Ok(Verdict::Sound) => ExitCode::SUCCESS,
        Ok(Verdict::Problems) => ExitCode::from(1),
        Err(e) => {
            say!("shardfs: {e}");
            ExitCode::from(2)
        }
    }
}

/// A command's output piped into `head`, `grep -q` or a pager that quits ends the command
/// as it ends every Unix tool: killed by SIGPIPE, quietly (Rust ignores the signal, so a
/// write would fail with EPIPE and `println!` panic). Not for the daemon, whose log may be
/// a pipe nobody reads.
fn quiet_on_closed_pipe() {
    // SAFETY: restoring a signal's default disposition has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Run as `mount.fuse.shardfs` (by mount(8)), the helper's arguments become a `shardfs
/// mount` command line; `Err` is the exit code when there is nothing to mount.
fn as_mount_helper(argv: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, ExitCode> {
    let as_helper = argv
        .first()
        .and_then(|a| a.to_str())
        .is_some_and(helper::started_as_helper);
    if !as_helper {
        return Ok(argv);
    }
    let given: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into()).collect();
    match helper::mount_args(&given) {
        Ok(Some(args)) => Ok(args.into_iter().map(Into::into).collect()),
        Ok(None) => Err(ExitCode::SUCCESS),
        Err(e) => {
            say!("{}: {e}", helper::HELPER_NAME);
            Err(ExitCode::from(2))
        }
    }
}

fn install_mount_helper(prefix: &Path) -> ExitCode {
    match helper::install(prefix) {
        Ok(link) => {
            println!("installed {}", link.display());
            ExitCode::SUCCESS
        }
        Err(e)
            if !crate::runtime::is_root() && e.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            say!(
                "shardfs: {}: {e}: mount(8) runs helpers from /sbin and /usr/sbin, which \
                 root installs into (`sudo /usr/local/bin/shardfs install-mount-helper`, from a \
                 binary only root may change); a user mounts with `shardfs mount` instead",
                prefix.display()
            );
            ExitCode::from(1)
        }
        Err(e) => {
            say!("shardfs: {}: {e}", prefix.display());
            ExitCode::from(1)
        }
    }
}

fn print_man() -> ExitCode {
    let cmd = <Cli as clap::CommandFactory>::command();
    match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("shardfs: {e}");
            ExitCode::from(1)
        }
    }
}

/// `shardfs flush`: the summary line, 1 naming what was not written, 2 on usage errors.
fn flush(mountpoint: &Path, path: Option<&Path>) -> ExitCode {
    match crate::daemon::flush(mountpoint, path) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e @ crate::daemon::DaemonError::Usage(_)) => {
            say!("shardfs: {e}");
            ExitCode::from(2)
        }
        Err(e) => report_daemon(Err(e)),
    }
}

/// Raises the kernel's cap on FUSE request sizes to cover `kb` KiB (`--raise-max-pages`).
fn raise_max_pages(kb: u32) -> Result<(), String> {
    const LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";
    let page = rustix::param::page_size() as u64;
    let want = (u64::from(kb) * 1024).div_ceil(page);
    let now: u64 = std::fs::read_to_string(LIMIT)
        .map_err(|e| {
            format!(
                "--raise-max-pages: {LIMIT}: {e} (a kernel before 6.13 has a fixed cap of 1 MiB)"
            )
        })?
        .trim()
        .parse()
        .map_err(|e| format!("--raise-max-pages: {LIMIT}: {e}"))?;
    if now >= want {
        return Ok(());
    }
    std::fs::write(LIMIT, want.to_string())
        .map_err(|e| format!("--raise-max-pages: writing {want} to {LIMIT}: {e} (it takes root)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fuse.conf is read as fusermount3 reads it (review of issue 20: a trailing comment
    /// was taken for a missing line, a line without its newline for one that counts).
    #[test]
    fn fuse_conf_is_read_as_fusermount3_reads_it() {
        assert!(allows_other(b"user_allow_other\n"));
        assert!(allows_other(
            b"# users may share\n  user_allow_other # let them\n"
        ));
        assert!(allows_other(b"\tuser_allow_other\t\n"));
        assert!(
            allows_other(b"user_allow_other\x0b\n"),
            "isspace takes a vertical tab"
        );
        assert!(
            !allows_other(b"x\0\nuser_allow_other"),
            "cut at the NUL, no newline"
        );
        assert!(!allows_other(b"user_allow_other\0\n"));
        assert!(!allows_other(b"#user_allow_other\n"));
        assert!(
            !allows_other(b"user_allow_other"),
            "no newline: fusermount3 skips it"
        );
        assert!(!allows_other(b"user_allow_others\n"));
        assert!(!allows_other(b""));
        let long = format!("user_allow_other{}\n", " ".repeat(300));
        assert!(
            !allows_other(long.as_bytes()),
            "too long for fusermount3's line"
        );
    }
}

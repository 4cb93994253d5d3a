//! `shardfs pack`, `unpack`, `reshard`: the command line over `crate::convert`: where SRC
//! and DST are, the progress on a terminal, the summary.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use crate::backing::Backing;
use crate::convert::in_place::convert_in_place;
use crate::convert::plan::Goal;
use crate::convert::{Options, Summary, pack::pack as convert_into};
use crate::store::Store;
use crate::store::object::{ObjectBacked, is_object_url};
use crate::zarr::{ChunksPerShard, ShardPolicy};

/// What every conversion takes.
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// The data to convert: a directory or an object store URL.
    src: String,
    /// Where the result goes (empty or missing): a directory or an object store URL.
    /// Without it, SRC is converted in place (see the README's "In place").
    dst: Option<String>,
    /// Objects built and written at once (1 to 4096). Default: the number of CPUs.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=4096))]
    jobs: Option<u16>,
    /// Print the plan (each array, its chunks and what is written) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// The object store's endpoint (a local S3 server, a GCS emulator).
    #[arg(long)]
    endpoint: Option<String>,
}

/// How shards are shaped, and whether raw chunks are compressed.
#[derive(clap::Args, Debug)]
pub struct ShardArgs {
    /// Chunks per shard: one number for every axis, or one per axis (`4,4,2`). Default:
    /// the auto policy (--shard-target-bytes).
    #[arg(long, conflicts_with = "shard_shape")]
    chunks_per_shard: Option<ChunksPerShard>,
    /// The shards' shape in elements (`256,256,64`), a multiple of each array's chunks.
    #[arg(long, value_delimiter = ',')]
    shard_shape: Option<Vec<u64>>,
    /// The auto policy's target of uncompressed bytes per shard (suffixes K, M, G).
    #[arg(long, default_value = "128M", value_parser = target_bytes)]
    shard_target_bytes: u64,
    /// Compress raw chunks (arrays whose codecs have no compressor) with zstd, at LEVEL
    /// (-7 to 22, default 3): `zstd` or `zstd:LEVEL`. Arrays that compress already are
    /// left as they are.
    #[arg(long, value_name = "zstd[:LEVEL]", value_parser = parse_compress)]
    compress: Option<i32>,
}

#[derive(clap::Args, Debug)]
pub struct PackArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub shards: ShardArgs,
}

#[derive(clap::Args, Debug)]
pub struct UnpackArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A shard target of at least one byte (0 would make every shard a single chunk by
/// accident; `--chunks-per-shard 1` says so on purpose).
fn target_bytes(text: &str) -> Result<u64, String> {
    match super::parse_size(text)? {
        0 => Err(
            "a shard target of 0 bytes: give --chunks-per-shard 1 for one chunk per shard".into(),
        ),
        n => Ok(n),
    }
}

pub(super) fn parse_compress(text: &str) -> Result<i32, String> {
    let level = match text.split_once(':') {
        None if text == "zstd" => 3,
        Some(("zstd", level)) => level.parse().map_err(|e| format!("{level}: {e}"))?,
        _ => return Err(format!("{text}: only zstd or zstd:LEVEL")),
    };
    match (-7..=22).contains(&level) {
        true => Ok(level),
        false => Err(format!("zstd level {level} is outside -7..22")),
    }
}

/// Runs `shardfs pack`, `unpack` or `reshard`.
pub fn run(goal: Goal, args: &CommonArgs, shards: Option<&ShardArgs>) -> ExitCode {
    let name = command_name(goal);
    if let Some(why) = args.dst.as_deref().and_then(|dst| nested(&args.src, dst)) {
        say!("shardfs {name}: {why}");
        return ExitCode::from(2);
    }
    if args.dst.is_none()
        && let Some(why) = consolidated_above(&args.src, name)
    {
        say!("shardfs {name}: {why}");
        return ExitCode::from(2);
    }
    if args.dst.is_none()
        && let Some(why) = live_mount_over(&args.src)
    {
        say!(
            "shardfs {name}: {why}: a conversion in place would change shards under it \
             (it keeps the old layout, and what it holds pending would be written into shards \
             of the wrong shape). Unmount it first, or convert into a DST; nothing written"
        );
        return ExitCode::from(1);
    }
    // A destination directory this run makes.
    let made = args
        .dst
        .as_deref()
        .filter(|d| !is_object_url(d) && !Path::new(d).exists() && !args.dry_run)
        .map(PathBuf::from);
    let (src, target) = match stores(args) {
        Ok(s) => s,
        Err(e) => {
            say!("shardfs {name}: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = options(goal, args, shards);
    crate::daemon::raise_fd_limit();
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let array_started = std::sync::Mutex::new(Instant::now());
    let progress = move |done: u64, all: u64, bytes: u64| {
        if terminal {
            eprint!("\r{}", progress_line(&array_started, done, all, bytes));
        }
    };
    let converted = match &target {
        Target::InPlace => convert_in_place(src.as_ref(), &opts, &progress),
        Target::Nowhere => convert_into(src.as_ref(), None, &opts, &progress),
        Target::Into(dst) => convert_into(src.as_ref(), Some(dst.as_ref()), &opts, &progress),
    };
    if converted.is_err()
        && let Some(made) = &made
    {
        // Made by this run and still empty (refused in the planning pass): not left behind.
        let _ = std::fs::remove_dir(made);
    }
    if terminal {
        eprint!("\r\x1b[K");
    }
    match converted {
        Ok(summary) => {
            report(
                goal,
                &summary,
                args.dry_run,
                started.elapsed().as_secs_f64(),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            say!("shardfs {name}: {e}");
            ExitCode::from(1)
        }
    }
}

/// `done/all written, B MiB of chunks, R MiB/s, T s left` for the array being converted
/// (`done` 0, as an array begins, restarts the clock).
fn progress_line(started: &std::sync::Mutex<Instant>, done: u64, all: u64, bytes: u64) -> String {
    let mut started = started.lock().unwrap_or_else(|e| e.into_inner());
    if done == 0 {
        *started = Instant::now();
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let left = (all - done.min(all)) as f64 * secs / done.max(1) as f64;
    format!(
        "{done}/{all} written, {} of chunks, {}/s, {left:.0} s left\x1b[K",
        mib(bytes),
        mib((bytes as f64 / secs) as u64)
    )
}

fn command_name(goal: Goal) -> &'static str {
    match goal {
        Goal::Pack => "pack",
        Goal::Unpack => "unpack",
        Goal::Reshard => "reshard",
    }
}

/// SRC, and where the result goes.
fn stores(args: &CommonArgs) -> Result<(Arc<dyn Store>, Target), String> {
    let src = open(&args.src, args, false)?;
    let Some(dst) = &args.dst else {
        return Ok((src, Target::InPlace));
    };
    // A dry run's destination need not exist.
    let missing = !is_object_url(dst) && !Path::new(dst).exists();
    Ok(match args.dry_run && missing {
        true => (src, Target::Nowhere),
        false => (src, Target::Into(open(dst, args, !args.dry_run)?)),
    })
}

/// Where a conversion writes.
enum Target {
    Into(Arc<dyn Store>),
    /// A dry run's destination that does not exist yet.
    Nowhere,
    InPlace,
}

fn options(goal: Goal, args: &CommonArgs, shards: Option<&ShardArgs>) -> Options {
    Options {
        goal,
        compress: shards.and_then(|s| s.compress),
        policy: match shards {
            Some(ShardArgs {
                chunks_per_shard: Some(cps),
                ..
            }) => ShardPolicy::Explicit(cps.clone()),
            Some(s) => ShardPolicy::Auto {
                target_bytes: s.shard_target_bytes,
            },
            None => ShardPolicy::default(),
        },
        shard_shape: shards.and_then(|s| s.shard_shape.clone()),
        jobs: args.jobs.map(usize::from).unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        dry_run: args.dry_run,
    }
}

/// The store at `location`; a directory is made first when `make` (a destination).
fn open(location: &str, args: &CommonArgs, make: bool) -> Result<Arc<dyn Store>, String> {
    if is_object_url(location) {
        let store = ObjectBacked::open_at(location, args.endpoint.as_deref())
            .map_err(|e| format!("{location}: {e}"))?;
        return Ok(Arc::new(store));
    }
    let path = PathBuf::from(location);
    if path.exists() && !path.is_dir() {
        return Err(format!("{location}: not a directory"));
    }
    if make {
        std::fs::create_dir_all(&path).map_err(|e| format!("{location}: {e}"))?;
    }
    let dir = absolute(&path).map_err(|e| format!("{location}: {e}"))?;
    let backing = Backing::new(dir).map_err(|e| format!("{location}: {e}"))?;
    Ok(Arc::new(backing))
}

fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    match path.exists() {
        true => std::fs::canonicalize(path),
        false => std::path::absolute(path),
    }
}

fn report(goal: Goal, s: &Summary, dry_run: bool, seconds: f64) {
    let what = |cps: &[u64]| match cps.is_empty() {
        true => "chunk files".to_string(),
        false => {
            let cps: Vec<String> = cps.iter().map(u64::to_string).collect();
            format!("shards of {} chunks", cps.join("x"))
        }
    };
    if dry_run {
        for a in &s.arrays {
            let (n, cps) = (a.chunks, what(&a.chunks_per_shard));
            println!("{}: {n} chunks into {} {cps}", shown(&a.dir), a.shards);
        }
        println!(
            "dry run: {} arrays, {} objects to write, {} other objects; nothing written",
            s.arrays.len(),
            s.shards(),
            s.copied
        );
        return;
    }
    if s.resumed > 0 {
        println!(
            "finished {} stopped conversions in place (as each began: its state file names it)",
            s.resumed
        );
    }
    let stored = match s.stored_bytes == s.chunk_bytes {
        true => String::new(),
        false => format!(
            ", stored as {}: {:.2} of that",
            mib(s.stored_bytes),
            s.stored_bytes as f64 / s.chunk_bytes.max(1) as f64
        ),
    };
    println!(
        "{} {} arrays: {} objects from {} chunks ({}{stored}) in {seconds:.1} s ({}/s); {} other objects copied",
        match goal {
            Goal::Pack => "packed",
            Goal::Unpack => "unpacked",
            Goal::Reshard => "resharded",
        },
        s.arrays.len(),
        s.shards(),
        s.chunks(),
        mib(s.chunk_bytes),
        mib((s.chunk_bytes as f64 / seconds.max(1e-3)) as u64),
        s.copied
    );
}

fn shown(dir: &Path) -> String {
    match dir.as_os_str().is_empty() {
        true => ".".into(),
        false => dir.display().to_string(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Why SRC and DST may not be used together: one inside the other (or the same), so that
/// the walk of SRC would meet what is being written.
fn nested(src: &str, dst: &str) -> Option<String> {
    let (a, b) = match (is_object_url(src), is_object_url(dst)) {
        (true, true) => (url_prefix(src), url_prefix(dst)),
        (false, false) => (
            resolved(Path::new(src)).ok()?,
            resolved(Path::new(dst)).ok()?,
        ),
        _ => return None,
    };
    let by_path = a.starts_with(&b) || b.starts_with(&a);
    let by_identity = || {
        let local = !is_object_url(src);
        local
            && (holds_dir_of(&a, &nearest_existing(&b)) || holds_dir_of(&b, &nearest_existing(&a)))
    };
    (by_path || by_identity())
        .then(|| format!("{src} and {dst} overlap: one lies inside the other"))
}

/// `path` itself, or the nearest directory above it that exists (where `mkdir -p` would
/// begin).
fn nearest_existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// Whether the tree at `top` holds the directory `inner` (compared by device and inode: a
/// bind mount shows a directory of the tree under another path, which no path comparison
/// sees). Links are not followed, as the conversions follow none.
fn holds_dir_of(top: &Path, inner: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(wanted) = std::fs::metadata(inner).map(|m| (m.dev(), m.ino())) else {
        return false;
    };
    let mut stack = vec![top.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if (meta.dev(), meta.ino()) == wanted {
            return true;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    false
}

/// An object store URL as a path (scheme, bucket, then the prefix's parts).
fn url_prefix(url: &str) -> PathBuf {
    PathBuf::from(url.replacen("://", "/", 1))
}

/// `path` with every link and `..` resolved, also where its end does not exist yet (each
/// missing part taken as `mkdir -p` would make it).
fn resolved(path: &Path) -> std::io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let mut missing = Vec::new();
    let mut existing = path.as_path();
    while !existing.exists() {
        missing.push(existing.file_name().map(|n| n.to_owned()));
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    let mut out = std::fs::canonicalize(existing)?;
    for part in missing.into_iter().rev() {
        match part {
            Some(name) => out.push(name),
            None => drop(out.pop()), // `..`
        }
        if out.exists() {
            out = std::fs::canonicalize(&out)?;
        }
    }
    Ok(out)
}

/// Which live shardfs mount serves a BACKING that holds SRC (or lies inside it), if one
/// does: a mount of this machine (its mount table), or of any machine sharing the file
/// system (a journal in `.shardfs/journal` of SRC or a directory above, whose lock a
/// live mount holds).
fn live_mount_over(src: &str) -> Option<String> {
    if is_object_url(src) {
        return None;
    }
    let real = resolved(Path::new(src)).ok()?;
    for entry in crate::mounts::table()
        .into_iter()
        .filter(|e| e.is_shardfs())
    {
        let source = entry.source.to_string_lossy();
        let backing = source.trim_start_matches("shardfs:");
        let backing = backing.strip_prefix("file://").unwrap_or(backing);
        let Ok(backing) = std::fs::canonicalize(backing) else {
            continue;
        };
        if real.starts_with(&backing) || backing.starts_with(&real) {
            return Some(format!(
                "{src} is in {} (BACKING of the shardfs mount at {})",
                backing.display(),
                entry.mount_point.display()
            ));
        }
    }
    real.ancestors()
        .map(|dir| dir.join(crate::journal::JOURNAL_DIR))
        .find(|journals| journal_held(journals))
        .map(|journals| {
            format!(
                "{src} is in a BACKING a live shardfs mount holds (a journal in {} is locked; \
                 the mount may be on another machine)",
                journals.display()
            )
        })
}

/// Whether a lock file in the journal directory `dir` is locked by someone (a live mount).
/// A directory this user may not read says nothing.
fn journal_held(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let lock = e.file_name().to_string_lossy().ends_with(".lock");
        let file = std::fs::OpenOptions::new().read(true).open(e.path());
        lock && file.is_ok_and(|f| crate::backing::lock::held_by_someone(&f))
    })
}

/// Why SRC may not be converted in place: a group above it has consolidated metadata naming
/// the arrays below, which a pack of SRC alone would leave stale (a reader trusting it
/// would take shards for chunks).
fn consolidated_above(src: &str, name: &str) -> Option<String> {
    if is_object_url(src) {
        return None;
    }
    // Above SRC as named (a link may lead out of the hierarchy it lies in) and above where
    // it really is.
    let named: PathBuf =
        std::path::absolute(src)
            .ok()?
            .components()
            .fold(PathBuf::new(), |mut p, c| {
                match c {
                    std::path::Component::ParentDir => drop(p.pop()),
                    c => p.push(c),
                }
                p
            });
    let real = resolved(Path::new(src)).ok()?;
    let above = named.ancestors().skip(1).chain(real.ancestors().skip(1));
    above.map(Path::to_path_buf).collect::<Vec<_>>().into_iter().find_map(|dir| {
        let Ok(Some(Ok(crate::zarr::Node::Group(g)))) = super::scan::read_node(&dir) else {
            return None;
        };
        g.consolidated_entries().map(|_| {
            format!(
                "{} has consolidated metadata naming the arrays below {src}: {name} {} in place instead (its consolidated metadata is rewritten), or remove it first",
                dir.display(),
                dir.display()
            )
        })
    })
}

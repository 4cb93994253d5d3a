//! The mount against a reference model: a plain directory. Random, seeded, reproducible
//! sequences of file operations (create, write at offsets, truncate, rename onto existing
//! names and of open files, link, unlink, mkdir, rmdir, fsync, read, stat) from several
//! threads, over an array directory (chunk keys and temporary names) and a plain directory,
//! are applied to both side by side. Every result must agree, and so must the whole tree
//! after unmount and remount; the array in BACKING must then read equal in zarr-python.
//!
//! Each thread owns its names (chunks of the same shards are spread over the threads), so
//! both sides see the same order of operations per name while shards are shared. A failing
//! sequence is shrunk (replayed on one thread, cut down while it still fails) and printed
//! with its seed. `SHARDFS_DIFF_SEEDS=N` runs more seeds.
//!
//! Where the mount differs from a plain directory by design, the model does not go:
//! directories of the chunk-key tree exist only while something lies below them, and hard
//! links inside arrays are copies, so links are made only in the plain directory and the
//! key directories are compared by their files. With FUSE passthrough (the default), a
//! plain file open through it is not renamed into the array (EBUSY: its later writes would
//! not follow it); the reference then does not rename it either. The model runs with
//! passthrough and with `--no-passthrough`, where every rename of an open file goes.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Rng;
use common::mount::{Mounted, python_ok};

const LIMIT: Duration = Duration::from_secs(400);
const THREADS: usize = 3;
const OPS_PER_THREAD: usize = 700;
/// The array: 4x4 chunks of 2x2 uint8 (4 bytes each), 2x2 chunks per shard.
const GRID: u64 = 4;
const ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[8,8],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2,2]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

#[derive(Clone, Debug)]
enum Op {
    /// open (create; truncate or not), write `len` bytes of `byte` at `offset`, close.
    Write {
        file: usize,
        offset: u64,
        len: usize,
        byte: u8,
        trunc: bool,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
    Unlink {
        file: usize,
    },
    Fsync {
        file: usize,
    },
    Read {
        file: usize,
    },
    Stat {
        file: usize,
    },
    Mkdir,
    Rmdir,
    /// Open an existing file for writing into handle slot `slot` (no truncation).
    Open {
        slot: usize,
        file: usize,
    },
    WriteAt {
        slot: usize,
        offset: u64,
        len: usize,
        byte: u8,
    },
    ReadAt {
        slot: usize,
    },
    FsyncHandle {
        slot: usize,
    },
    Close {
        slot: usize,
    },
}

/// The names one thread owns, relative to the mount (and to the reference).
fn names(t: usize) -> Vec<String> {
    let mut out = Vec::new();
    for k in (0..GRID * GRID).filter(|k| *k as usize % THREADS == t) {
        let (i, j) = (k / GRID, k % GRID);
        out.push(format!("a/c/{i}/{j}"));
        out.push(format!("a/c/{i}/{j}.t{t}.partial"));
    }
    out.push(format!("a/t{t}.tmp"));
    for f in 0..3 {
        out.push(format!("p/t{t}_{f}"));
    }
    out.push(format!("p/t{t}_d/f"));
    // Hard links live apart: a file with two names that moves into an array becomes a
    // copy there (by design), so linked names are never renamed.
    out.push(format!("p/t{t}_L0"));
    out.push(format!("p/t{t}_L1"));
    out
}

fn is_link_name(name: &str) -> bool {
    name.contains("_L")
}

fn gen_op(rng: &mut Rng, n: usize, names: &[String]) -> Op {
    let file = rng.below(n);
    let slot = rng.below(3);
    let small = |rng: &mut Rng, m: usize| rng.below(m) as u64;
    match rng.below(100) {
        0..=24 => Op::Write {
            file,
            offset: if rng.below(4) == 0 { small(rng, 6) } else { 0 },
            len: rng.below(9),
            byte: rng.next() as u8,
            trunc: rng.below(3) != 0,
        },
        25..=31 => Op::Truncate {
            file,
            size: small(rng, 10),
        },
        32..=45 => {
            let movable: Vec<usize> = (0..n).filter(|i| !is_link_name(&names[*i])).collect();
            Op::Rename {
                from: movable[rng.below(movable.len())],
                to: movable[rng.below(movable.len())],
            }
        }
        46..=49 => {
            let linked: Vec<usize> = (0..n).filter(|i| is_link_name(&names[*i])).collect();
            Op::Link {
                from: linked[rng.below(linked.len())],
                to: linked[rng.below(linked.len())],
            }
        }
        50..=57 => Op::Unlink { file },
        58..=61 => Op::Fsync { file },
        62..=69 => Op::Read { file },
        70..=75 => Op::Stat { file },
        76..=77 => Op::Mkdir,
        78..=79 => Op::Rmdir,
        80..=85 => Op::Open { slot, file },
        86..=92 => Op::WriteAt {
            slot,
            offset: small(rng, 8),
            len: 1 + rng.below(6),
            byte: rng.next() as u8,
        },
        93..=95 => Op::ReadAt { slot },
        96..=97 => Op::FsyncHandle { slot },
        _ => Op::Close { slot },
    }
}

/// What an operation gave: an errno, or what it read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Data(Vec<u8>),
    Size(u64),
    Errno(i32),
}

fn outcome<T>(r: std::io::Result<T>, f: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => f(v),
        Err(e) => Outcome::Errno(e.raw_os_error().unwrap_or(-1)),
    }
}

/// One side: a root, and the thread's open handles.
struct Side {
    root: PathBuf,
    handles: [Option<fs::File>; 3],
    /// The name each slot's file has now, as far as this side's own operations tell, and
    /// whether it was opened in the plain directory (where it passes through).
    open_names: [Option<(usize, bool)>; 3],
}

/// How the mount is run: with FUSE passthrough of plain files or not.
#[derive(Clone, Copy, Debug)]
struct Mode {
    passthrough: bool,
}

impl Mode {
    fn args(self) -> Vec<&'static str> {
        let mut args = ARGS.to_vec();
        if !self.passthrough {
            args.push("--no-passthrough");
        }
        args
    }
}

/// Applies `op` to the mount's side and the reference's; `Err` with both outcomes when
/// they disagree. A rename of a plain file open in a slot into the array may meet EBUSY on
/// the mount by design under passthrough; the reference then skips it.
fn step(
    (m, r): (&mut Side, &mut Side),
    op: &Op,
    names: &[String],
    t: usize,
    mode: Mode,
) -> Result<(), (Outcome, Outcome)> {
    let got = m.apply(op, names, t);
    if mode.passthrough && got == Outcome::Errno(libc::EBUSY) && m.busy_by_design(op, names) {
        return Ok(());
    }
    let want = r.apply(op, names, t);
    if got == want {
        Ok(())
    } else {
        Err((got, want))
    }
}

impl Side {
    fn new(root: &Path) -> Side {
        Side {
            root: root.to_path_buf(),
            handles: [None, None, None],
            open_names: [None, None, None],
        }
    }

    /// Whether `op` renames a plain file open in a slot into the array.
    fn busy_by_design(&self, op: &Op, names: &[String]) -> bool {
        match op {
            Op::Rename { from, to } => {
                names[*to].starts_with("a/") && self.open_names.contains(&Some((*from, true)))
            }
            _ => false,
        }
    }

    /// Follows the slots' files through a successful rename or unlink.
    fn follow(&mut self, op: &Op) {
        for slot in self.open_names.iter_mut() {
            *slot = match (op, *slot) {
                (Op::Rename { from, to }, Some((f, p))) if f == *from => Some((*to, p)),
                (Op::Rename { to, .. }, Some((f, _))) if f == *to => None,
                (Op::Unlink { file }, Some((f, _))) if f == *file => None,
                (_, s) => s,
            };
        }
    }

    fn apply(&mut self, op: &Op, names: &[String], t: usize) -> Outcome {
        let out = self.apply_here(op, names, t);
        if out == Outcome::Ok {
            self.follow(op);
        }
        out
    }

    fn apply_here(&mut self, op: &Op, names: &[String], t: usize) -> Outcome {
        let path = |i: usize| self.root.join(&names[i]);
        let ok = |_| Outcome::Ok;
        match op {
            Op::Write {
                file,
                offset,
                len,
                byte,
                trunc,
            } => outcome(
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(*trunc)
                    .open(path(*file))
                    .and_then(|f| f.write_all_at(&vec![*byte; *len], *offset)),
                ok,
            ),
            Op::Truncate { file, size } => outcome(
                fs::OpenOptions::new()
                    .write(true)
                    .open(path(*file))
                    .and_then(|f| f.set_len(*size)),
                ok,
            ),
            Op::Rename { from, to } => outcome(fs::rename(path(*from), path(*to)), ok),
            Op::Link { from, to } => outcome(fs::hard_link(path(*from), path(*to)), ok),
            Op::Unlink { file } => outcome(fs::remove_file(path(*file)), ok),
            Op::Fsync { file } => outcome(
                fs::OpenOptions::new()
                    .write(true)
                    .open(path(*file))
                    .and_then(|f| f.sync_all()),
                ok,
            ),
            Op::Read { file } => outcome(fs::read(path(*file)), Outcome::Data),
            Op::Stat { file } => outcome(fs::metadata(path(*file)), |m| Outcome::Size(m.len())),
            Op::Mkdir => outcome(fs::create_dir(self.root.join(format!("p/t{t}_d"))), ok),
            Op::Rmdir => outcome(fs::remove_dir(self.root.join(format!("p/t{t}_d"))), ok),
            Op::Open { slot, file } => {
                let r = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path(*file));
                outcome(r, |f| {
                    self.handles[*slot] = Some(f);
                    self.open_names[*slot] = Some((*file, names[*file].starts_with("p/")));
                    Outcome::Ok
                })
            }
            Op::WriteAt {
                slot,
                offset,
                len,
                byte,
            } => match &self.handles[*slot] {
                Some(f) => outcome(f.write_all_at(&vec![*byte; *len], *offset), ok),
                None => Outcome::Errno(libc::EBADF),
            },
            Op::ReadAt { slot } => match &mut self.handles[*slot] {
                Some(f) => {
                    let mut buf = Vec::new();
                    let r = f
                        .seek_start()
                        .and_then(|_| f.read_to_end(&mut buf).map(|_| buf));
                    outcome(r, Outcome::Data)
                }
                None => Outcome::Errno(libc::EBADF),
            },
            Op::FsyncHandle { slot } => match &self.handles[*slot] {
                Some(f) => outcome(f.sync_all(), ok),
                None => Outcome::Errno(libc::EBADF),
            },
            Op::Close { slot } => {
                self.handles[*slot] = None;
                self.open_names[*slot] = None;
                Outcome::Ok
            }
        }
    }
}

trait SeekStart {
    fn seek_start(&mut self) -> std::io::Result<u64>;
}

impl SeekStart for fs::File {
    fn seek_start(&mut self) -> std::io::Result<u64> {
        std::io::Seek::seek(self, std::io::SeekFrom::Start(0))
    }
}

/// Runs `ops` (one list per thread, each thread on its own names) on the mount and the
/// reference side by side. Returns the first disagreement.
fn run_threads(mount: &Path, reference: &Path, ops: &[Vec<Op>], mode: Mode) -> Result<(), String> {
    std::thread::scope(|s| {
        let runs: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(t, ops)| {
                s.spawn(move || {
                    let names = names(t);
                    let (mut m, mut r) = (Side::new(mount), Side::new(reference));
                    for (i, op) in ops.iter().enumerate() {
                        if let Err((got, want)) = step((&mut m, &mut r), op, &names, t, mode) {
                            return Err(format!(
                                "thread {t}, op {i} {op:?}: mount {got:?}, reference {want:?}"
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        runs.into_iter().try_for_each(|h| h.join().unwrap())
    })
}

/// Every regular file below `root`, with its content.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    common::files_below(root)
        .into_iter()
        .filter(|f| !f.starts_with(".shardfs") && f != "a/zarr.json")
        .map(|f| {
            let data = fs::read(root.join(&f)).unwrap();
            (f, data)
        })
        .collect()
}

fn compare_trees(mount: &Path, reference: &Path, when: &str) -> Result<(), String> {
    let (m, r) = (tree(mount), tree(reference));
    if m == r {
        return Ok(());
    }
    let only = |a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>| -> Vec<String> {
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| format!("{k} ({} bytes)", v.len()))
            .collect()
    };
    Err(format!(
        "{when}: the trees differ; mount: {:?}; reference: {:?}",
        only(&m, &r),
        only(&r, &m)
    ))
}

const ARGS: [&str; 4] = ["--chunks-per-shard", "2", "--idle-flush", "0.3"];

/// BACKING under a mount, and the reference beside it, both holding the array `a` (with
/// its key directories) and the plain directory `p`.
struct Setup {
    mode: Mode,
    _dir: tempfile::TempDir,
    backing: PathBuf,
    reference: PathBuf,
    mount: Mounted,
}

fn setup(mode: Mode) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (backing, reference) = (dir.path().join("backing"), dir.path().join("reference"));
    for root in [&backing, &reference] {
        fs::create_dir_all(root.join("p")).unwrap();
    }
    let mount = Mounted::new(&backing, &mode.args(), LIMIT);
    for root in [&mount.mountpoint, &reference] {
        fs::create_dir(root.join("a")).unwrap();
        fs::write(root.join("a/zarr.json"), ARRAY).unwrap();
        for i in 0..GRID {
            fs::create_dir_all(root.join(format!("a/c/{i}"))).unwrap();
        }
    }
    Setup {
        mode,
        _dir: dir,
        backing,
        reference,
        mount,
    }
}

impl Setup {
    /// The trees agree while mounted and after a remount; with `native`, the array in
    /// BACKING also reads equal in zarr-python.
    fn finish(self, native: bool) -> Result<(), String> {
        compare_trees(&self.mount.mountpoint, &self.reference, "mounted")?;
        let out = self.mount.unmount(&[]);
        if !out.status.success() {
            return Err(format!("unmount: {}", common::stderr(&out)));
        }
        drop(self.mount);
        let m = Mounted::new(&self.backing, &self.mode.args(), LIMIT);
        compare_trees(&m.mountpoint, &self.reference, "after remount")?;
        drop(m);
        if native {
            check_native(&self.backing, &self.reference);
        }
        Ok(())
    }

    /// A disagreement, with the end of the mount's log.
    fn failure(&self, e: String) -> String {
        let log = self.mount.log_text();
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .filter(|l| !l.contains("DEBUG") || (l.contains("failed") && !l.contains("no such")))
            .take(15)
            .collect();
        format!(
            "{e}\nmount log (last lines, newest first):\n{}",
            tail.join("\n")
        )
    }
}

/// Runs `ops` on the mount and the reference, and compares everything: each result, the
/// trees while mounted and after a remount, and the array read natively.
fn trial(ops: &[Vec<Op>], mode: Mode) -> Result<(), String> {
    let s = setup(mode);
    if let Err(e) = run_threads(&s.mount.mountpoint, &s.reference, ops, mode) {
        return Err(s.failure(e));
    }
    s.finish(true)
}

/// zarr-python reads every chunk of the array in BACKING as the reference holds it (a
/// chunk file of another size than 4 bytes is not a valid chunk and is left out).
fn check_native(backing: &Path, reference: &Path) {
    let check = r#"
import os, sys, zarr, numpy as np
a = zarr.open_array(os.path.join(sys.argv[1], "a"), mode="r")
for i in range(4):
    for j in range(4):
        p = os.path.join(sys.argv[2], "a", "c", str(i), str(j))
        want = open(p, "rb").read() if os.path.isfile(p) else bytes(4)
        if len(want) != 4:
            continue
        got = a[2*i:2*i+2, 2*j:2*j+2].tobytes()
        assert got == want, (i, j, got, want)
"#;
    python_ok("native read of the array", check, &[backing, reference]);
}

/// Cuts a failing sequence down: replayed on one thread (each op keeping its own thread's
/// names), halves and then single ops are dropped while it still fails.
fn shrink(ops: &[Vec<Op>], mode: Mode) -> Vec<(usize, Op)> {
    let mut seq: Vec<(usize, Op)> = Vec::new();
    let longest = ops.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for (t, list) in ops.iter().enumerate() {
            if let Some(op) = list.get(i) {
                seq.push((t, op.clone()));
            }
        }
    }
    let fails = |seq: &[(usize, Op)]| trial_serial(seq, mode).is_err();
    if !fails(&seq) {
        return seq;
    }
    // Often one thread's operations are enough.
    for t in 0..THREADS {
        let alone: Vec<(usize, Op)> = seq.iter().filter(|(u, _)| *u == t).cloned().collect();
        if fails(&alone) {
            seq = alone;
            break;
        }
    }
    let mut chunk = seq.len() / 2;
    let mut budget = 200;
    while chunk >= 1 && budget > 0 {
        let mut i = 0;
        while i < seq.len() && budget > 0 {
            let mut candidate = seq.clone();
            candidate.drain(i..(i + chunk).min(seq.len()));
            budget -= 1;
            if fails(&candidate) {
                seq = candidate;
            } else {
                i += chunk;
            }
        }
        chunk /= 2;
    }
    seq
}

/// A single-threaded trial of an interleaved sequence.
fn trial_serial(seq: &[(usize, Op)], mode: Mode) -> Result<(), String> {
    let s = setup(mode);
    let mut sides: Vec<(Side, Side)> = (0..THREADS)
        .map(|_| (Side::new(&s.mount.mountpoint), Side::new(&s.reference)))
        .collect();
    for (i, (t, op)) in seq.iter().enumerate() {
        let names = names(*t);
        let (ms, rs) = &mut sides[*t];
        if let Err((got, want)) = step((ms, rs), op, &names, *t, mode) {
            return Err(format!(
                "op {i} (thread {t}) {op:?}: mount {got:?}, reference {want:?}"
            ));
        }
    }
    drop(sides);
    s.finish(false)
}

fn ops_for(seed: u64) -> Vec<Vec<Op>> {
    (0..THREADS)
        .map(|t| {
            let mut rng = Rng::new(seed * 1000 + t as u64);
            let names = names(t);
            (0..OPS_PER_THREAD)
                .map(|_| gen_op(&mut rng, names.len(), &names))
                .collect()
        })
        .collect()
}

#[test]
fn the_mount_agrees_with_a_plain_directory() {
    let seeds: u64 = std::env::var("SHARDFS_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let modes = [Mode { passthrough: true }, Mode { passthrough: false }];
    for (seed, mode) in (1..=seeds).flat_map(|s| modes.map(|m| (s, m))) {
        let ops = ops_for(seed);
        if let Err(e) = trial(&ops, mode) {
            if std::env::var_os("SHARDFS_DIFF_NO_SHRINK").is_some() {
                panic!("seed {seed} {mode:?}: {e}");
            }
            let minimal = shrink(&ops, mode);
            let shown: Vec<String> = minimal
                .iter()
                .map(|(t, op)| format!("  thread {t}: {op:?}"))
                .collect();
            panic!(
                "seed {seed} {mode:?}: {e}\nshrunk to {} operations (replayed on one thread):\n{}\n{}",
                minimal.len(),
                shown.join("\n"),
                trial_serial(&minimal, mode)
                    .err()
                    .unwrap_or_else(|| "(passes when replayed \
                    serially: the failure needs the threads' interleaving)"
                        .into())
            );
        }
    }
}

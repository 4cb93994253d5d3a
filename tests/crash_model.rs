//! The crash-consistency model test: random, seeded, reproducible sequences of what users
//! and tools do to a mount (writes, partial writes, truncation, fsync of files and
//! directories, renames onto existing names and across arrays, unlinks, arrays removed
//! and made again, `zarr.json` rewritten by a redirect, by a rename, removed and put back,
//! `shardfs flush`, clean remounts, SIGKILLs, a second mount that takes over a dead one's
//! journal, and kills during replay), run against a real mount and against a model of
//! POSIX durability.
//!
//! The model: for each chunk, after a crash, the allowed contents are the one at its last
//! durability point (an fsync of the file, or of its directory, `shardfs flush`, a clean
//! unmount; absent for a removal made durable) and any content written since. Every read
//! after a remount must be allowed; at the end `shardfs verify` passes and zarr-python
//! reads every array as the mount showed it. A failing sequence is shrunk to a shorter
//! one that still fails, and printed.
//!
//! In the power-cut sequences, BACKING is a layer (`common::cutfs`) that loses whatever was not
//! fsynced when a crash comes: a power cut, not only a SIGKILL (which keeps the page cache).
//! Every state it leaves must mount and lose nothing acknowledged.
//!
//! `cargo test --test crash_model -- [--sequences N] [--power-cuts M] [--seed S] [--ops K]`: N
//! sequences with SIGKILLs (12 by default), then M with power cuts (6).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Rng;
use common::cutfs::CutFs;
use common::mount::{Mounted, journal_ids, kill_during_replay, run_limited};

const LIMIT: Duration = Duration::from_secs(600);
const ARRAYS: [&str; 2] = ["x", "y"];
/// Chunks per array (1-D, 16 bytes each, 4 per shard: 2 shards).
const KEYS: u64 = 8;
const ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[128],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

type Content = Option<Vec<u8>>;
type Key = (usize, u64);

#[derive(Clone, Debug)]
enum Op {
    /// O_TRUNC, write the whole chunk, close.
    Write(Key),
    /// Overwrite 4 bytes inside an existing chunk.
    Patch(Key, u8),
    /// ftruncate to nothing, then write the whole chunk again through the same handle.
    Refill(Key),
    FsyncFile(Key),
    /// fsync of the array's key directory (`c`), or of the array directory.
    FsyncDir(usize, bool),
    Rename(Key, Key),
    /// A new content written into a file that is renamed onto the second key while still
    /// open, half before the rename and half after (tensorstore's lock file, any writer
    /// whose file is moved under it), with the file fsynced before it is closed when `true`.
    RenameOpen(Key, Key, bool),
    Unlink(Key),
    /// `rm -r` of the array, then its `zarr.json` written again.
    Recreate(usize),
    /// The `zarr.json` the mount shows written back: by a shell redirect (0), a temporary
    /// file renamed over it (1), removed and put back (2); or another layout written over
    /// it (3: the array twice as long, or back, as a resize does; its chunks stay where
    /// they are).
    RewriteMeta(usize, u8),
    /// Native tensorstore (zarr3 driver, `file` kvstore with its defaults: fsync, OS
    /// locks) writes the whole chunk through the mount: durable once it returns.
    Tensorstore(Key),
    Flush,
    Remount,
    /// A second mount of BACKING, which survives the next crash and takes over.
    Witness,
    /// SIGKILL of the daemon; with `true`, the next mount is killed during its replay too.
    Crash(bool),
    /// The disk fills up (`true`: every write to it fails with ENOSPC) or is freed; only
    /// under the power-cut layer. While full, an operation may fail: it then makes nothing
    /// durable, and what it wrote may or may not be the chunk's content.
    Full(bool),
    /// The disk fails syncs (EIO, nothing reaches it) from now until `false`; only under the
    /// power-cut layer. A failed sync is never retried into a success, so from the first
    /// one every fsync fails until the next crash's replay: operations may fail meanwhile,
    /// making nothing durable, and no clean unmount can happen.
    SyncFails(bool),
}

/// What the model knows of one chunk.
#[derive(Clone, Debug, Default)]
struct Chunk {
    current: Content,
    durable: Content,
    later: Vec<Content>,
}

impl Chunk {
    fn set(&mut self, c: Content) {
        self.current = c.clone();
        self.later.push(c);
    }

    fn sync(&mut self) {
        self.durable = self.current.clone();
        self.later.clear();
    }

    fn allows(&self, c: &Content) -> bool {
        self.durable == *c || self.later.contains(c)
    }

    /// After a crash, what was read is where the chunk stands.
    fn settle(&mut self, c: Content) {
        self.current = c.clone();
        self.durable = c;
        self.later.clear();
    }
}

struct World {
    /// The directory where BACKING's files are.
    disk: PathBuf,
    /// What the mounts mount: `disk`, or the power-cut layer over it.
    backing: PathBuf,
    layer: Option<CutFs>,
    scratch: PathBuf,
    args: Vec<String>,
    /// The mount compresses the arrays' raw chunks (`--compress`).
    compress: bool,
    mount: Option<Mounted>,
    witness: Option<Mounted>,
    model: BTreeMap<Key, Chunk>,
    counter: u64,
    full: bool,
    /// Syncs failed since the last crash: fsyncs fail until a new mount replays.
    degraded: bool,
    log: Vec<String>,
}

fn content(counter: u64, (a, k): Key) -> Vec<u8> {
    let mut v = counter.to_le_bytes().to_vec();
    v.extend([a as u8, k as u8, 0xC0, 0xDE, 0, 0, 0, 0]);
    v
}

impl World {
    fn new(dir: &Path, setup: &Setup) -> World {
        let (idle, power_cut) = (setup.idle.as_str(), setup.power_cut);
        let disk = dir.join("disk");
        let scratch = dir.join("scratch");
        fs::create_dir_all(&disk).unwrap();
        fs::create_dir_all(&scratch).unwrap();
        let (backing, layer) = if power_cut {
            let at = dir.join("layer");
            fs::create_dir_all(&at).unwrap();
            let layer = CutFs::mount(&disk, &at);
            (at, Some(layer))
        } else {
            (disk.clone(), None)
        };
        let mut args: Vec<String> = ["--chunks-per-shard", "4", "--idle-flush", idle]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if setup.compress {
            args.extend(["--compress".to_string(), "zstd:1".to_string()]);
        }
        let mut w = World {
            compress: setup.compress,
            disk,
            backing,
            layer,
            scratch,
            args,
            mount: None,
            witness: None,
            model: BTreeMap::new(),
            counter: 0,
            full: false,
            degraded: false,
            log: Vec::new(),
        };
        w.mount = Some(w.mount_now().expect("the first mount"));
        for a in 0..ARRAYS.len() {
            w.make_array(a);
        }
        w
    }

    /// A mount of BACKING; a mount that fails (its replay, say) is a failed sequence.
    fn mount_now(&self) -> Result<Mounted, String> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mount = std::panic::AssertUnwindSafe(|| Mounted::new(&self.backing, &args, LIMIT));
        std::panic::catch_unwind(mount).map_err(|p| {
            let text = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            text.unwrap_or_default()
        })
    }

    fn m(&self) -> &Mounted {
        self.mount.as_ref().unwrap()
    }

    fn array_path(&self, a: usize) -> PathBuf {
        self.m().path(ARRAYS[a])
    }

    fn chunk_path(&self, (a, k): Key) -> PathBuf {
        self.array_path(a).join(format!("c/{k}"))
    }

    /// Makes array `a` the careful way POSIX asks for, so that it is there after any crash:
    /// its document fsynced, then its directories and the one above them.
    fn make_array(&mut self, a: usize) {
        let dir = self.array_path(a);
        fs::create_dir_all(dir.join("c")).unwrap();
        let mut doc = fs::File::create(dir.join("zarr.json")).unwrap();
        doc.write_all(ARRAY.as_bytes()).unwrap();
        doc.sync_all().unwrap();
        for d in [dir.join("c"), dir.clone(), self.m().mountpoint.clone()] {
            fs::File::open(d).unwrap().sync_all().unwrap();
        }
        for k in 0..KEYS {
            self.model.insert((a, k), Chunk::default());
        }
    }

    fn exists(&self, key: Key) -> bool {
        self.model[&key].current.is_some()
    }

    fn next(&mut self, key: Key) -> Vec<u8> {
        self.counter += 1;
        content(self.counter, key)
    }

    /// Runs `op`; `Err` says what went wrong (an unexpected error, or a read the model
    /// does not allow). On a full disk an operation may fail: what it would have made
    /// durable is not, and what it wrote may or may not be the content.
    fn run(&mut self, op: &Op) -> Result<(), String> {
        if !self.full && !self.degraded {
            return self.run_op(op);
        }
        // The model takes a write before it is made and a durability point only after it
        // returned: a write that failed on the full disk is in memory all the same (the
        // mount holds it; its close or shard write failed), and nothing became durable.
        let may_fail = !matches!(op, Op::Crash(_) | Op::Full(_) | Op::SyncFails(_));
        match self.run_op(op) {
            Err(e)
                if may_fail
                    && (e.contains("No space left") || e.contains("Input/output error")) =>
            {
                self.observe_names(op)
            }
            other => other,
        }
    }

    /// After a failed rename or unlink: the mount reports a shard write that failed, but
    /// the names changed (as documented: the data stays pending). What each name holds is
    /// read back and taken as a later state, once the kernel's view of the names (cached
    /// for the one-second TTL, and not updated by a call that failed) has expired.
    fn observe_names(&mut self, op: &Op) -> Result<(), String> {
        let keys = match op {
            Op::Rename(a, b) | Op::RenameOpen(a, b, _) => vec![*a, *b],
            Op::Unlink(a) => vec![*a],
            _ => return Ok(()),
        };
        std::thread::sleep(Duration::from_millis(1100));
        for k in keys {
            let now = match fs::read(self.chunk_path(k)) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("read {k:?} after a failed rename: {e}")),
            };
            let chunk = self.model.get_mut(&k).unwrap();
            if chunk.current != now {
                chunk.set(now);
            }
        }
        Ok(())
    }

    fn run_op(&mut self, op: &Op) -> Result<(), String> {
        self.log.push(format!("{op:?}"));
        match op {
            Op::Recreate(_)
            | Op::RewriteMeta(..)
            | Op::Flush
            | Op::Remount
            | Op::Witness
            | Op::Crash(_)
            | Op::Full(_)
            | Op::SyncFails(_) => self.run_tree_op(op),
            _ => self.run_chunk_op(op),
        }
    }

    /// The operations on chunks: writes, fsyncs, renames, unlinks.
    fn run_chunk_op(&mut self, op: &Op) -> Result<(), String> {
        let io = |r: std::io::Result<()>, what: &str| r.map_err(|e| format!("{what}: {e}"));
        match op.clone() {
            Op::Write(key) => {
                let c = self.next(key);
                let path = self.chunk_path(key);
                self.model.get_mut(&key).unwrap().set(Some(c.clone()));
                io(fs::create_dir_all(path.parent().unwrap()), "mkdir")?;
                io(fs::write(path, &c), "write")?;
            }
            Op::Patch(key, at) => {
                let mut c = self.model[&key].current.clone().unwrap();
                // Within what the chunk holds now (a layout rewrite may have made it shorter).
                if c.len() < 4 {
                    return Ok(());
                }
                let at = (at as usize) % (c.len() - 3).min(13);
                let patch = self.next(key)[..4].to_vec();
                c[at..at + 4].copy_from_slice(&patch);
                self.model.get_mut(&key).unwrap().set(Some(c));
                let r = fs::OpenOptions::new()
                    .write(true)
                    .open(self.chunk_path(key))
                    .and_then(|mut f| {
                        f.seek(SeekFrom::Start(at as u64))?;
                        f.write_all(&patch)
                    });
                io(r, "patch")?;
            }
            Op::Refill(key) => {
                let c = self.next(key);
                self.model.get_mut(&key).unwrap().set(Some(c.clone()));
                let r = fs::OpenOptions::new()
                    .write(true)
                    .open(self.chunk_path(key))
                    .and_then(|mut f| {
                        f.set_len(0)?;
                        f.write_all(&c)
                    });
                io(r, "refill")?;
            }
            Op::FsyncFile(key) => {
                let r = fs::File::open(self.chunk_path(key)).and_then(|f| f.sync_all());
                io(r, "fsync")?;
                self.model.get_mut(&key).unwrap().sync();
            }
            Op::FsyncDir(a, key_dir) => {
                let mut dir = self.array_path(a);
                // A key directory with no chunk left may be gone: then the array's.
                if key_dir && dir.join("c").exists() {
                    dir = dir.join("c");
                }
                io(fs::File::open(&dir).and_then(|f| f.sync_all()), "fsync dir")?;
                for k in 0..KEYS {
                    self.model.get_mut(&(a, k)).unwrap().sync();
                }
            }
            Op::Rename(from, to) => {
                let dest = self.chunk_path(to);
                io(fs::create_dir_all(dest.parent().unwrap()), "mkdir")?;
                io(fs::rename(self.chunk_path(from), dest), "rename")?;
                let c = self.model[&from].current.clone();
                self.model.get_mut(&to).unwrap().set(c);
                self.model.get_mut(&from).unwrap().set(None);
            }
            Op::RenameOpen(from, to, sync) => self.rename_open(from, to, sync)?,
            Op::Tensorstore(key) => self.tensorstore_write(key)?,
            Op::Unlink(key) => {
                io(fs::remove_file(self.chunk_path(key)), "unlink")?;
                self.model.get_mut(&key).unwrap().set(None);
            }
            _ => unreachable!("not an operation on chunks: {op:?}"),
        }
        Ok(())
    }

    /// The operations on arrays and mounts: recreate, rewrite metadata, flush, remount,
    /// crashes, a full disk.
    fn run_tree_op(&mut self, op: &Op) -> Result<(), String> {
        let io = |r: std::io::Result<()>, what: &str| r.map_err(|e| format!("{what}: {e}"));
        match op.clone() {
            Op::Recreate(a) => {
                io(fs::remove_dir_all(self.array_path(a)), "rm -r")?;
                // Gone from BACKING once rm -r returns: nothing of it may come back.
                for k in 0..KEYS {
                    self.model.get_mut(&(a, k)).unwrap().settle(None);
                }
                self.make_array(a);
            }
            Op::RewriteMeta(a, how) => self.rewrite_meta(a, how)?,
            Op::Flush => {
                self.shardfs_ok(&["flush", self.m().mountpoint.to_str().unwrap()])?;
                self.model.values_mut().for_each(Chunk::sync);
            }
            Op::Remount => {
                let out = self.m().unmount(&[]);
                if !out.status.success() {
                    return Err(format!("unmount: {}", common::stderr(&out)));
                }
                self.mount = None;
                self.model.values_mut().for_each(Chunk::sync);
                self.mount = Some(self.mount_now()?);
            }
            Op::Witness => {
                // A power cut takes every mount on the machine down: no survivor.
                if self.witness.is_none() && self.layer.is_none() {
                    self.witness = Some(self.mount_now()?);
                }
            }
            Op::Crash(during_replay) => self.crash(during_replay)?,
            Op::Full(on) => {
                if let Some(layer) = &self.layer {
                    layer.fill(on);
                    self.full = on;
                }
            }
            Op::SyncFails(on) => {
                if let Some(layer) = &self.layer {
                    layer.fail_syncs(on);
                    self.degraded |= on;
                }
            }
            _ => unreachable!("an operation on chunks: {op:?}"),
        }
        Ok(())
    }

    fn rename_open(&mut self, from: Key, to: Key, sync: bool) -> Result<(), String> {
        let c = self.next(to);
        let dest = self.chunk_path(to);
        self.model.get_mut(&from).unwrap().set(None);
        self.model.get_mut(&to).unwrap().set(Some(c.clone()));
        let r = fs::create_dir_all(dest.parent().unwrap()).and_then(|_| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .open(self.chunk_path(from))?;
            f.set_len(0)?;
            f.write_all(&c[..8])?;
            fs::rename(self.chunk_path(from), &dest)?;
            f.write_all(&c[8..])?;
            if sync {
                f.sync_all()?;
            }
            Ok(())
        });
        r.map_err(|e| format!("rename of an open file: {e}"))?;
        if sync {
            self.model.get_mut(&to).unwrap().sync();
        }
        Ok(())
    }

    /// Native tensorstore writes a new content of chunk `key`; durable once it returns.
    fn tensorstore_write(&mut self, key: Key) -> Result<(), String> {
        let c = self.next(key);
        self.model.get_mut(&key).unwrap().set(Some(c.clone()));
        self.run_tensorstore(key, &c)?;
        self.model.get_mut(&key).unwrap().sync();
        Ok(())
    }

    fn run_tensorstore(&self, (a, k): Key, c: &[u8]) -> Result<(), String> {
        let code = "import sys, numpy as np, tensorstore as ts\n\
                    path, k, data = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])\n\
                    spec = {'driver': 'zarr3', 'kvstore': {'driver': 'file', 'path': path}}\n\
                    t = ts.open(spec, open=True).result()\n\
                    t[k * 16:(k + 1) * 16].write(np.frombuffer(data, dtype=np.uint8)).result()\n";
        let hex: String = c.iter().map(|b| format!("{b:02x}")).collect();
        let out = run_limited(
            Command::new(common::python())
                .args(["-c", code])
                .arg(self.array_path(a))
                .arg(k.to_string())
                .arg(hex),
            LIMIT,
        )?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("tensorstore: {}", common::stderr(&out))),
        }
    }

    fn shardfs_ok(&self, args: &[&str]) -> Result<(), String> {
        let out = run_limited(Command::new(common::shardfs_bin()).args(args), LIMIT)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "shardfs {args:?}: {}{}",
                common::stdout(&out),
                common::stderr(&out)
            ))
        }
    }

    fn rewrite_meta(&mut self, a: usize, how: u8) -> Result<(), String> {
        let doc = self.array_path(a).join("zarr.json");
        let view = fs::read(&doc).map_err(|e| format!("read zarr.json: {e}"))?;
        if how % 4 == 3 {
            return self.relayout(&doc, &view);
        }
        let saved = self.scratch.join("view.json");
        fs::write(&saved, &view).unwrap();
        let r = match how % 4 {
            0 => {
                let script = format!("cat '{}' > '{}'", saved.display(), doc.display());
                let out = run_limited(Command::new("sh").args(["-c", &script]), LIMIT)?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(std::io::Error::other(common::stderr(&out)))
                }
            }
            1 => {
                let tmp = self.array_path(a).join("zarr.0123abcd.partial");
                fs::write(&tmp, &view).and_then(|_| fs::rename(&tmp, &doc))
            }
            _ => fs::remove_file(&doc).and_then(|_| fs::write(&doc, &view)),
        };
        r.map_err(|e| format!("rewrite zarr.json ({how}): {e}"))?;
        match fs::read(&doc) {
            Ok(after) if after == view => Ok(()),
            Ok(after) => Err(format!(
                "zarr.json changed by writing it back: {}",
                String::from_utf8_lossy(&after)
            )),
            Err(e) => Err(format!("zarr.json after writing it back: {e}")),
        }
    }

    /// Another layout over `doc` (the view `view`): the array twice as long, or back.
    fn relayout(&self, doc: &Path, view: &[u8]) -> Result<(), String> {
        let mut v: serde_json::Value =
            serde_json::from_slice(view).map_err(|e| format!("the view of zarr.json: {e}"))?;
        let long = v["shape"][0].as_u64() == Some(KEYS * 16);
        v["shape"][0] = serde_json::json!(if long { KEYS * 32 } else { KEYS * 16 });
        let text = serde_json::to_vec_pretty(&v).unwrap();
        fs::write(doc, &text).map_err(|e| format!("write another layout: {e}"))?;
        let after: serde_json::Value = fs::read(doc)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        match after["shape"] == v["shape"] {
            true => Ok(()),
            false => Err(format!("zarr.json after another layout: {after}")),
        }
    }

    /// SIGKILL, then whoever comes next (the witness, or a new mount, maybe killed during
    /// its replay first) must show only what the model allows.
    fn crash(&mut self, during_replay: bool) -> Result<(), String> {
        let dead = self.mount.take().unwrap();
        // A power cut: from this moment on nothing more reaches the disk, and what was
        // not synced is gone; then the daemon dies with the machine.
        if let Some(layer) = self.layer.take() {
            layer.cut();
        }
        dead.crash();
        let mountpoint = dead.mountpoint.clone();
        if self.layer.is_none() && self.backing != self.disk {
            // The machine back: the disk as the cut left it (with room again), under a new
            // layer.
            self.layer = Some(CutFs::mount(&self.disk, &self.backing));
            self.full = false;
        }
        // A new mount's replay: syncs are trusted again.
        self.degraded = false;
        if let Some(w) = self.witness.take() {
            drop(dead);
            self.mount = Some(w);
            self.await_takeover()?;
        } else {
            if during_replay {
                kill_during_replay(&self.backing, &mountpoint, 5 + self.counter % 60);
            }
            drop(dead);
            self.mount = Some(self.mount_now()?);
        }
        self.check_allowed()
    }

    /// Waits until the witness has taken over the dead mount's journal (one journal left).
    fn await_takeover(&self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let ids = journal_ids(&self.disk);
            if ids.len() <= 1 {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                let log = self.m().log_text();
                let tail: Vec<&str> = log.lines().rev().take(12).collect();
                return Err(format!(
                    "the witness did not take over: journals {ids:?}; its log, last lines first:\n{}",
                    tail.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every chunk reads as the model allows; what was read is then where it stands.
    fn check_allowed(&mut self) -> Result<(), String> {
        let keys: Vec<Key> = self.model.keys().copied().collect();
        for key in keys {
            let got = match fs::read(self.chunk_path(key)) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("read {key:?}: {e}")),
            };
            let chunk = self.model.get_mut(&key).unwrap();
            if !chunk.allows(&got) {
                return Err(format!(
                    "{}/c/{} after the crash: {:?}, allowed {:?} or one of {:?}",
                    ARRAYS[key.0],
                    key.1,
                    got.as_deref().map(label),
                    chunk.durable.as_deref().map(label),
                    chunk
                        .later
                        .iter()
                        .map(|c| c.as_deref().map(label))
                        .collect::<Vec<_>>()
                ));
            }
            chunk.settle(got);
        }
        Ok(())
    }

    /// The end: everything written, BACKING verifies, and zarr-python reads every array
    /// as the model has it.
    fn finish(&mut self) -> Result<(), String> {
        if let Some(layer) = &self.layer {
            layer.fill(false);
            layer.fail_syncs(false);
        }
        // A mount whose syncs failed cannot unmount cleanly: it dies, and the next mount
        // replays what it acknowledged.
        if self.degraded {
            self.crash(false)?;
        }
        // A write that failed half-way on the full disk left a partial chunk, as it would
        // on any file system: its writer writes it again.
        let partial: Vec<Key> = self
            .model
            .iter()
            .filter(|(_, c)| c.current.as_ref().is_some_and(|c| c.len() != 16))
            .map(|(k, _)| *k)
            .collect();
        for k in partial {
            self.run_op(&Op::Write(k))?;
        }
        if let Some(w) = self.witness.take() {
            let out = w.unmount(&[]);
            if !out.status.success() {
                return Err(format!("unmount of the witness: {}", common::stderr(&out)));
            }
        }
        let out = self.m().unmount(&[]);
        if !out.status.success() {
            return Err(format!("final unmount: {}", common::stderr(&out)));
        }
        self.mount = None;
        self.layer = None;
        let v = common::shardfs(&["verify", self.disk.to_str().unwrap()]);
        if v.status.code() != Some(0) {
            return Err(format!("verify: {}", common::stdout(&v)));
        }
        self.stored_as_asked()?;
        self.zarr_reads()
    }

    /// With `--compress`, every array is stored with zstd among its chunks' codecs (the
    /// native reads that follow then decompress them); without, none is.
    fn stored_as_asked(&self) -> Result<(), String> {
        for a in ARRAYS {
            let doc = fs::read_to_string(self.disk.join(a).join("zarr.json"))
                .map_err(|e| format!("{a}/zarr.json: {e}"))?;
            if doc.contains("\"zstd\"") != self.compress {
                return Err(format!("{a} stored with compress={}: {doc}", self.compress));
            }
        }
        Ok(())
    }

    fn zarr_reads(&self) -> Result<(), String> {
        // The first KEYS chunks: the model's (another layout may make the array longer).
        let code = format!(
            "import sys, zarr\n\
             for p in sys.argv[1:]:\n    \
                 print(zarr.open_array(p, mode='r')[:{}].tobytes().hex())\n",
            KEYS * 16
        );
        let paths: Vec<PathBuf> = ARRAYS.iter().map(|a| self.disk.join(a)).collect();
        let out = run_limited(
            Command::new(common::python())
                .args(["-c", &code])
                .args(&paths),
            LIMIT,
        )?;
        if !out.status.success() {
            return Err(format!("zarr-python: {}", common::stderr(&out)));
        }
        let text = common::stdout(&out);
        for (a, line) in text.lines().enumerate() {
            let want: String = (0..KEYS)
                .map(|k| {
                    let c = self.model[&(a, k)].current.clone().unwrap_or(vec![0; 16]);
                    c.iter().map(|b| format!("{b:02x}")).collect::<String>()
                })
                .collect();
            if line != want {
                return Err(format!(
                    "zarr-python reads {} as {line}, not {want}",
                    ARRAYS[a]
                ));
            }
        }
        Ok(())
    }
}

/// A content's short name: the write that made it.
fn label(c: &[u8]) -> String {
    let n = u64::from_le_bytes(c.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
    format!("#{n}({}B)", c.len())
}

/// A random sequence of `n` operations, ending in a crash when `crash_at_end`. Operations
/// whose preconditions the model does not meet when they come are skipped (`applicable`).
fn sequence(rng: &mut Rng, n: usize, crash_at_end: bool) -> Vec<Op> {
    let key = |rng: &mut Rng| (rng.below(ARRAYS.len()), rng.below(KEYS as usize) as u64);
    let mut ops: Vec<Op> = (0..n)
        .map(|_| match rng.below(100) {
            0..30 => Op::Write(key(rng)),
            30..37 => Op::Patch(key(rng), rng.below(256) as u8),
            37..41 => Op::Refill(key(rng)),
            41..53 => Op::FsyncFile(key(rng)),
            53..61 => Op::FsyncDir(rng.below(ARRAYS.len()), rng.below(2) == 0),
            61..68 => Op::Rename(key(rng), key(rng)),
            68..71 => Op::RenameOpen(key(rng), key(rng), rng.below(2) == 0),
            71..78 => Op::Unlink(key(rng)),
            78..80 => Op::Recreate(rng.below(ARRAYS.len())),
            80..84 => Op::RewriteMeta(rng.below(ARRAYS.len()), rng.below(4) as u8),
            84..85 => Op::Tensorstore(key(rng)),
            85..89 => Op::Flush,
            89..91 => Op::Remount,
            91..94 => Op::Witness,
            94..96 => Op::Full(rng.below(2) == 0),
            96..97 => Op::SyncFails(rng.below(2) == 0),
            _ => Op::Crash(rng.below(2) == 0),
        })
        .collect();
    if crash_at_end {
        ops.push(Op::Crash(rng.below(2) == 0));
    }
    ops
}

/// Whether `op` can run on what the model holds now.
fn applicable(w: &World, op: &Op) -> bool {
    match op {
        Op::Patch(k, _) | Op::Refill(k) | Op::FsyncFile(k) | Op::Unlink(k) => w.exists(*k),
        Op::Rename(from, to) | Op::RenameOpen(from, to, _) => from != to && w.exists(*from),
        // Not on a full disk: their partial failures are more than the model tracks.
        Op::Recreate(_) | Op::RewriteMeta(..) | Op::Tensorstore(_) | Op::Remount | Op::Witness => {
            !w.full && !w.degraded
        }
        _ => true,
    }
}

/// Runs `ops` on a fresh BACKING; `Err` says where and what failed.
/// How a sequence's mounts run: idle flush, power cuts, transparent compression.
#[derive(Clone, Debug)]
struct Setup {
    idle: String,
    power_cut: bool,
    compress: bool,
}

fn run_sequence(ops: &[Op], setup: &Setup) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), setup);
    for (i, op) in ops.iter().enumerate() {
        if !applicable(&w, op) {
            continue;
        }
        w.run(op).map_err(|e| format!("op {i} {op:?}: {e}"))?;
    }
    w.finish()
}

/// Drops operations while the sequence still fails, and returns the shortest found.
fn shrink(mut ops: Vec<Op>, setup: &Setup) -> (Vec<Op>, String) {
    let mut why = run_sequence(&ops, setup).err().unwrap_or_default();
    let mut i = 0;
    let mut tries = 0;
    while i < ops.len() && tries < 60 {
        tries += 1;
        let mut fewer = ops.clone();
        fewer.remove(i);
        match run_sequence(&fewer, setup) {
            Err(e) => {
                ops = fewer;
                why = e;
            }
            Ok(()) => i += 1,
        }
    }
    (ops, why)
}

/// Runs `count` sequences from `seed` on; returns (passed, failed, passed ending in a crash).
fn run_many(count: u64, seed: u64, n_ops: usize, power_cut: bool) -> (u64, u64, u64) {
    let what = if power_cut {
        "model (power cuts)"
    } else {
        "model"
    };
    let (mut passed, mut failed, mut crashed) = (0, 0, 0);
    for s in 0..count {
        let seed = seed + s;
        let mut rng = Rng::new(seed);
        let idle = format!("{:.2}", 0.05 + rng.below(100) as f64 / 100.0);
        // Three in four end in a crash; the others in a clean unmount.
        let crash_at_end = rng.below(4) != 0;
        let ops = sequence(&mut rng, n_ops, crash_at_end);
        // Every other sequence through a mount that compresses the chunks it stores.
        let setup = Setup {
            idle,
            power_cut,
            compress: seed % 2 == 1,
        };
        match run_sequence(&ops, &setup) {
            Ok(()) => {
                passed += 1;
                crashed += crash_at_end as u64;
            }
            Err(e) => {
                failed += 1;
                println!("{what} sequence seed {seed} ({setup:?}): FAILED: {e}");
                let (small, why) = shrink(ops, &setup);
                println!("  shrunk to {} operations: {small:?}\n  {why}", small.len());
            }
        }
    }
    println!("{what}: {passed} passed ({crashed} ended in a crash), {failed} failed");
    (passed, failed, crashed)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| common::harness_value(&args, flag);
    if args.iter().any(|a| a == "--list") {
        println!("model_sequences: test");
        return;
    }
    let seed = value("--seed").unwrap_or(1);
    let n_ops = value("--ops").unwrap_or(24) as usize;
    let (p1, f1, _) = run_many(value("--sequences").unwrap_or(12), seed, n_ops, false);
    let (p2, f2, _) = run_many(value("--power-cuts").unwrap_or(6), seed, n_ops, true);
    println!("model: {} passed, {} failed", p1 + p2, f1 + f2);
    if f1 + f2 > 0 {
        std::process::exit(1);
    }
}

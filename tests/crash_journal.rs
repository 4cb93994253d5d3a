//! The crash test, with the journal. A writer writes chunk by chunk with fsync (of the file,
//! or of its directory); the daemon is killed with SIGKILL at a random moment (shard
//! writes are in flight at random too: the idle time is short); half the time the next
//! mount is killed as well, during its replay. After the final remount, every chunk whose
//! fsync returned reads back exactly (or as a later round of the same chunk), and every
//! shard passes `shardfs verify`.
//!
//! `cargo test --test crash_journal -- --trials N [--seed S]` runs N trials (3 by default).

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Rng;
use common::mount::{Mounted, kill_during_replay};

const LIMIT: Duration = Duration::from_secs(300);
/// 8x8 chunks of 8x8 uint8 (64 bytes), 2x2 chunks per shard.
const GRID: u64 = 8;
const ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[64,64],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[8,8]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

/// Round `r` of chunk `k`: the round, then the chunk's number, over 64 bytes.
fn content(r: u64, k: u64) -> Vec<u8> {
    let mut v = r.to_le_bytes().to_vec();
    v.resize(64, k as u8);
    v
}

/// Writes rounds of every chunk, in a random order, with fsync, until an error (the
/// daemon is gone). `acked[k]` is the last round of chunk k whose fsync returned.
fn writer(array: &Path, seed: u64, acked: &Mutex<Vec<u64>>) {
    let mut rng = Rng::new(seed);
    for r in 1.. {
        let mut order: Vec<u64> = (0..GRID * GRID).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for k in order {
            let dir = array.join(format!("c/{}", k / GRID));
            let file = dir.join((k % GRID).to_string());
            let write = || -> std::io::Result<Option<fs::File>> {
                fs::create_dir_all(&dir)?;
                match r % 3 {
                    0 => {
                        // Close, then fsync the directory.
                        fs::write(&file, content(r, k))?;
                        fs::File::open(&dir)?.sync_all()?;
                        Ok(None)
                    }
                    1 => {
                        // tensorstore's order: KEY.__lock written and fsynced, renamed onto
                        // KEY, the directory fsynced; closed only after that (the ack).
                        let lock = dir.join(format!("{}.__lock", k % GRID));
                        let mut f = fs::OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .open(&lock)?;
                        f.write_all(&content(r, k))?;
                        f.sync_all()?;
                        fs::rename(&lock, &file)?;
                        fs::File::open(&dir)?.sync_all()?;
                        Ok(Some(f))
                    }
                    _ => {
                        let mut f = fs::File::create(&file)?;
                        f.write_all(&content(r, k))?;
                        f.sync_all()?;
                        Ok(None)
                    }
                }
            };
            let Ok(still_open) = write() else {
                return;
            };
            acked.lock().unwrap()[k as usize] = r;
            drop(still_open);
        }
    }
}

fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status();
}

/// One trial; `Err` says what did not hold.
fn trial(seed: u64) -> Result<String, String> {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    fs::create_dir(&backing).unwrap();
    let idle = format!("{:.2}", 0.05 + rng.below(50) as f64 / 100.0);
    let args = ["--chunks-per-shard", "2", "--idle-flush", idle.as_str()];
    let m = Mounted::new(&backing, &args, LIMIT);
    let array = m.path("a");
    fs::create_dir(&array).unwrap();
    fs::write(array.join("zarr.json"), ARRAY).unwrap();
    let acked = Arc::new(Mutex::new(vec![0u64; (GRID * GRID) as usize]));
    let w = {
        let (array, acked) = (array.clone(), acked.clone());
        std::thread::spawn(move || writer(&array, seed, &acked))
    };
    std::thread::sleep(Duration::from_millis(20 + rng.below(700) as u64));
    kill9(m.pid);
    w.join().unwrap();
    m.wait_daemon_gone(Duration::from_secs(30));
    let _ = m.unmount(&[]); // clears the dead mount
    let mut what = format!(
        "idle {idle}s, acked rounds {:?}",
        acked.lock().unwrap().iter().max()
    );
    if rng.below(2) == 0 {
        let delay = rng.below(60) as u64;
        kill_during_replay(&backing, &m.mountpoint, delay);
        what += &format!(", a replay killed after {delay} ms");
    }
    drop(m);
    if let Some(keep) = std::env::var_os("SHARDFS_CRASH_KEEP") {
        let keep = Path::new(&keep).join(format!("seed{seed}"));
        let _ = Command::new("cp")
            .arg("-a")
            .arg(&backing)
            .arg(&keep)
            .status();
        fs::write(
            keep.join("acked.json"),
            format!("{:?}", acked.lock().unwrap()),
        )
        .unwrap();
    }
    check(&backing, &args, &acked.lock().unwrap())?;
    Ok(what)
}

/// The final mount: every acknowledged chunk reads back, and BACKING verifies.
fn check(backing: &Path, args: &[&str], acked: &[u64]) -> Result<(), String> {
    let m = Mounted::new(backing, args, LIMIT);
    for (k, &r) in acked.iter().enumerate() {
        let k = k as u64;
        let path = m.path(&format!("a/c/{}/{}", k / GRID, k % GRID));
        let got = fs::read(&path);
        if r == 0 {
            // Never acknowledged: absent, or some round of this chunk, never torn.
            match got {
                Err(_) => continue,
                Ok(b) if b.len() == 64 && b[8..].iter().all(|&x| x == k as u8) => continue,
                Ok(b) => return Err(format!("chunk {k}: torn content {b:?}")),
            }
        }
        let b = got.map_err(|e| format!("chunk {k} (round {r} acknowledged) lost: {e}"))?;
        let round = u64::from_le_bytes(b.get(..8).unwrap_or(&[0; 8]).try_into().unwrap());
        if b.len() != 64 || round < r || b != content(round, k) {
            return Err(format!(
                "chunk {k}: round {r} acknowledged, found round {round} ({} bytes)",
                b.len()
            ));
        }
    }
    let out = m.unmount(&[]);
    if !out.status.success() {
        let log = fs::read_to_string(&m.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        return Err(format!(
            "unmount: {}\ndaemon log, last lines first:\n{}",
            common::stderr(&out),
            tail.join("\n")
        ));
    }
    let v = common::shardfs(&["verify", backing.to_str().unwrap()]);
    if v.status.code() != Some(0) {
        return Err(format!("verify: {}", common::stdout(&v)));
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| common::harness_value(&args, flag);
    // `cargo test` passes its own flags (--quiet, test filters): only ours are read.
    if args.iter().any(|a| a == "--list") {
        println!("crash_trials: test");
        return;
    }
    let trials = value("--trials").unwrap_or(3);
    let seed = value("--seed").unwrap_or(1);
    let (mut passed, mut failed) = (0, 0);
    for t in 0..trials {
        match trial(seed + t) {
            Ok(what) => {
                passed += 1;
                println!("crash trial {} (seed {}): ok ({what})", t + 1, seed + t);
            }
            Err(e) => {
                failed += 1;
                println!("crash trial {} (seed {}): FAILED: {e}", t + 1, seed + t);
            }
        }
    }
    println!("crash: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

//! Helpers shared by the integration tests: the pinned Python clients and the shardfs binary.
#![allow(dead_code)]

pub mod convert;
pub mod cutfs;
pub mod mount;
pub mod proxy;
pub mod s3;
pub mod stores;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The venv's Python with the pinned clients. `scripts/test.sh` sets SHARDFS_PYTHON; a test
/// that needs the clients fails, never skips, without it.
/// The value of `--flag N` among a harness's arguments (`cargo test` passes its own flags
/// too: only ours are read).
pub fn harness_value(args: &[String], flag: &str) -> Option<u64> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse::<u64>().ok())
}

/// A 1-D uint8 array of 8 chunks of 16 bytes, stored without compression.
pub const LINE_ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[128],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

pub fn python() -> PathBuf {
    let path = std::env::var_os("SHARDFS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    assert!(
        path.exists(),
        "no Python with the pinned clients at {}: run scripts/test.sh, which creates the venv \
         and sets SHARDFS_PYTHON",
        path.display()
    );
    path
}

pub fn fixtures_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/fixtures.py")
}

/// Runs `tests/py/fixtures.py` with `args`, panicking with its output on failure.
pub fn run_fixtures(args: &[&str]) -> String {
    let script = fixtures_script();
    let mut all = vec![script.to_str().unwrap()];
    all.extend(args);
    python_run(&all, &format!("fixtures.py {args:?}"))
}

/// Runs the pinned Python with `args` and returns its stdout, panicking with `what` and
/// its output when it fails.
pub fn python_run(args: &[&str], what: &str) -> String {
    let out = Command::new(python())
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The shardfs binary under test: cargo's, or `SHARDFS_BIN` (a copy kept still while a
/// long model run goes on and the tree is rebuilt).
pub fn shardfs_bin() -> PathBuf {
    std::env::var_os("SHARDFS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_shardfs")))
}

pub fn shardfs(args: &[&str]) -> Output {
    Command::new(shardfs_bin())
        .args(args)
        .output()
        .expect("shardfs runs")
}

/// Fails the test with the command's output unless it succeeded.
pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} ({}):\n{}\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Copies a directory tree (files and directories only).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every regular file below `dir`, as `/`-separated paths relative to it.
pub fn files_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry.path().strip_prefix(dir).unwrap().to_path_buf();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// A small deterministic generator (xorshift64*), so that a failure names its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Starts `tests/py/shared.py` with `args` (its output captured).
pub fn spawn_shared(args: &[&str]) -> std::process::Child {
    Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/shared.py"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for every writer (4 minutes at most in all); each must succeed.
pub fn all_succeed(children: Vec<std::process::Child>) {
    let start = std::time::Instant::now();
    for mut c in children {
        while c.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(240) {
                let _ = c.kill();
                panic!("a writer hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_ok(&c.wait_with_output().unwrap(), "writer");
    }
}

/// shared.py makes its array at `path` (through a mount).
pub fn create_shared(path: &Path) {
    let mut c = spawn_shared(&["create", path.to_str().unwrap()]);
    let status = c.wait().unwrap();
    let out = c.wait_with_output().unwrap();
    assert_ok(&Output { status, ..out }, "shared.py create");
}

/// Waits until a server the tests started (`child`) listens on 127.0.0.1:`port`: panics if
/// it exits first (the port was taken meanwhile: never talk to another test's server) or
/// takes over 30 s.
pub fn wait_listening(child: &mut std::process::Child, port: u16, what: &str) {
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited: {status}");
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{what} did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs the Python `script` (with the pinned clients) and returns its stdout; `what` names
/// it when it fails.
pub fn python_stdout(script: &str, what: &str) -> String {
    python_run(&["-c", script], what)
}

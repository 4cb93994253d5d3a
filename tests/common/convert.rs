//! Helpers of the conversion tests (`convert_*`): the arrays of `tests/py/pack_cases.py`,
//! the files below a directory, a small tmpfs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn cases_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pack_cases.py")
}

/// Runs `tests/py/pack_cases.py` with `args`; its stdout.
pub fn cases(args: &[&str]) -> String {
    let script = cases_script();
    let mut all = vec![script.to_str().unwrap()];
    all.extend(args);
    super::python_run(&all, &format!("pack_cases.py {args:?}"))
}

/// `tests/py/pack_crash.py`: `command` run in place on copies of `pristine`, killed with
/// SIGKILL at random moments for `trials` trials (seeded with `seed`), every array read
/// after each kill, each trial finished by reruns. Checks that kills fell before the flip
/// and after it, not only at the start or the end; returns the harness's report.
pub fn killed_anywhere(
    pristine: &Path,
    work: &Path,
    command: &[&str],
    trials: &str,
    seed: &str,
) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pack_crash.py");
    let bin = super::shardfs_bin();
    let mut args = vec![s(&script), s(&bin), s(pristine), s(work), trials, seed];
    args.extend(command);
    let out = super::python_run(&args, &format!("pack_crash.py {command:?}"));
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    eprintln!("{command:?} in place under SIGKILL: {report}");
    let by_state = report["kills_by_state"].as_object().unwrap();
    for state in ["before the flip (staging)", "after the flip (finishing)"] {
        assert!(by_state.contains_key(state), "{state}: {report}");
    }
    report
}

/// A fresh source hierarchy in a temporary directory.
pub fn source() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    cases(&["write", src.to_str().unwrap()]);
    (dir, src)
}

/// Every file below `dir` with its content.
pub fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().into(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every file below `dir` whose name says it is a leftover of a pack in place.
pub fn leftovers(dir: &Path) -> Vec<PathBuf> {
    contents(dir)
        .into_keys()
        .filter(|k| {
            let name = k.file_name().unwrap().to_string_lossy();
            name == ".shardfs-pack.json"
                || name.ends_with(".__lock")
                || name.ends_with(".shardfs-staged")
        })
        .collect()
}

/// A tmpfs mounted for one test, unmounted when dropped.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", s(at)])
            .status()
            .unwrap();
        assert!(ok.success(), "mounting a tmpfs");
        Tmpfs(at.to_path_buf())
    }

    pub fn resize(&self, size: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}"), s(&self.0)])
            .status()
            .unwrap();
        assert!(ok.success(), "resizing the tmpfs");
    }

    pub fn used(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.0).unwrap();
        (st.f_blocks - st.f_bfree) * st.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        super::mount::detach(&self.0);
    }
}

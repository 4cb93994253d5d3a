//! Helpers of the conversion tests (`convert_*`): the arrays of `tests/py/pack_cases.py`,
//! the files below a directory, a small tmpfs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::python;

pub fn cases_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pack_cases.py")
}

pub fn cases(args: &[&str]) -> String {
    let out = std::process::Command::new(python())
        .arg(cases_script())
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "pack_cases.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
            name == ".shardfs-pack.json" || name.ends_with(".__lock")
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
        let _ = std::process::Command::new("umount")
            .args(["-l", s(&self.0)])
            .status();
    }
}

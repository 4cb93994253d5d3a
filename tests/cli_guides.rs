//! The README's "Using shardfs with …" section, run as written: for each tool, the
//! section's opening block (which mounts) and then the tool's blocks, in order, with
//! `/data/zarr`, `/mnt/zarr` and `/tmp/guide` replaced by fresh directories. A Rust block is
//! not run: it must be the text of a file in `examples/`, which a block runs. After the
//! blocks, BACKING itself is checked, apart from what the examples assert: `shardfs verify`
//! passes, each array the guide names is stored sharded with shards of several chunks,
//! and the mount reports no write error and unmounts cleanly.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mount::{is_mounted, run_timeout, shardfs_timeout};
use common::{assert_ok, stderr, stdout};
use serde_json::Value;

const SECTION: &str = "## Using shardfs with";
const LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Block {
    lang: String,
    code: String,
}

/// The section's opening blocks, and each `###` guide's title and blocks.
fn readme_guides() -> (Vec<Block>, Vec<(String, Vec<Block>)>) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme
        .find(SECTION)
        .expect("the README has the guides section");
    let mut intro = Vec::new();
    let mut guides: Vec<(String, Vec<Block>)> = Vec::new();
    let mut lines = readme[start + SECTION.len()..].lines();
    while let Some(line) = lines.next() {
        if line.starts_with("## ") {
            break; // the next section
        } else if let Some(title) = line.strip_prefix("### ") {
            guides.push((title.trim().to_string(), Vec::new()));
        } else if let Some(lang) = line.trim_start().strip_prefix("```") {
            let block = Block {
                lang: lang.trim().to_string(),
                code: fenced_code(&mut lines, &line[..line.len() - line.trim_start().len()]),
            };
            match guides.last_mut() {
                Some((_, blocks)) => blocks.push(block),
                None => intro.push(block),
            }
        }
    }
    (intro, guides)
}

/// The lines of a code block up to its closing fence, less the fence's indentation.
fn fenced_code<'a>(lines: &mut impl Iterator<Item = &'a str>, indent: &str) -> String {
    let mut code = String::new();
    loop {
        let line = lines
            .next()
            .expect("a code block of the guides is not closed");
        if line.trim_start() == "```" {
            return code;
        }
        code.push_str(line.strip_prefix(indent).unwrap_or(line));
        code.push('\n');
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directories the README's paths stand for in one run.
struct Places {
    _dir: tempfile::TempDir,
    data: PathBuf,
    mnt: PathBuf,
    scratch: PathBuf,
}

impl Places {
    fn new() -> Places {
        let dir = tempfile::tempdir().unwrap();
        let [data, mnt, scratch] = ["data", "mnt", "scratch"].map(|n| dir.path().join(n));
        for d in [&data, &mnt, &scratch] {
            std::fs::create_dir(d).unwrap();
        }
        Places {
            _dir: dir,
            data,
            mnt,
            scratch,
        }
    }

    fn substitute(&self, code: &str) -> String {
        let ours = self._dir.path().to_string_lossy();
        assert!(
            ["/data/zarr", "/mnt/zarr", "/tmp/guide"]
                .iter()
                .all(|p| !ours.contains(p)),
            "the temporary directory {ours} holds a path the README uses"
        );
        // The examples run the tests' own build (`cargo run` in the profile of the tests).
        let code = if cfg!(debug_assertions) {
            code.to_string()
        } else {
            code.replace("cargo run ", "cargo run --release ")
        };
        code.replace("/data/zarr", self.data.to_str().unwrap())
            .replace("/mnt/zarr", self.mnt.to_str().unwrap())
            .replace("/tmp/guide", self.scratch.to_str().unwrap())
    }
}

/// Unmounts the guide's mount when the test ends, passed or failed.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            // Never a panic here (a failed spawn): the detach below must still run.
            let _ = common::mount::run_limited(
                Command::new(common::shardfs_bin())
                    .args(["unmount", "--lazy"])
                    .arg(&self.0),
                Duration::from_secs(120),
            );
        }
        if is_mounted(&self.0) {
            common::mount::detach(&self.0);
        }
    }
}

/// `PATH` with the shardfs binary and the venv's `python` first.
fn search_path() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_shardfs")).parent().unwrap();
    let venv_bin = common::python().parent().unwrap().to_path_buf();
    format!(
        "{}:{}:{}",
        bin.display(),
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn run_block(places: &Places, n: usize, block: &Block) {
    let code = places.substitute(&block.code);
    let mut cmd = match block.lang.as_str() {
        "sh" => {
            let mut c = Command::new("bash");
            c.args(["-euo", "pipefail", "-c", &code]);
            c
        }
        "python" => {
            let script = places.scratch.join(format!("block{n}.py"));
            std::fs::write(&script, &code).unwrap();
            let mut c = Command::new(common::python());
            c.arg(script);
            c
        }
        "rust" => return assert_is_an_example(&block.code),
        other => panic!("a guide block in {other:?}: the test runs sh, python and rust"),
    };
    let out = run_timeout(cmd.current_dir(repo()).env("PATH", search_path()), LIMIT);
    assert_ok(&out, &format!("block {n} ({}):\n{code}", block.lang));
}

/// A Rust block is shown, not run: it is the text of a file in `examples/`.
fn assert_is_an_example(code: &str) {
    let examples = std::fs::read_dir(repo().join("examples")).unwrap();
    let found = examples
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .any(|text| text == code);
    assert!(
        found,
        "the README's Rust block is no file of examples/:\n{code}"
    );
}

/// Runs the guide titled `title` and checks that each of `arrays` (paths in BACKING) is
/// sharded and sound. Returns BACKING's path, for checks of the guide's own.
fn run_guide(title: &str, arrays: &[&str]) -> Places {
    let (intro, guides) = readme_guides();
    let blocks = &guides
        .iter()
        .find(|(t, _)| t == title)
        .unwrap_or_else(|| panic!("no README guide {title:?}"))
        .1;
    assert!(!blocks.is_empty(), "the guide {title:?} has no code");
    let places = Places::new();
    let _unmount = Unmount(places.mnt.clone());
    for (n, block) in intro.iter().chain(blocks).enumerate() {
        run_block(&places, n, block);
    }
    assert!(is_mounted(&places.mnt), "the opening block mounts");
    let stats = mount_stats(&places.mnt);
    for counter in ["write_errors", "panics", "pending_shards", "refusals"] {
        assert_eq!(stats[counter], 0, "{counter} after the guide: {stats}");
    }
    let verify = shardfs_timeout(&["verify", places.data.to_str().unwrap()], LIMIT);
    assert_ok(&verify, "shardfs verify BACKING");
    for array in arrays {
        assert_sharded(&places.data.join(array));
    }
    let out = shardfs_timeout(&["unmount", places.mnt.to_str().unwrap()], LIMIT);
    assert_ok(&out, "unmount");
    places
}

fn mount_stats(mnt: &Path) -> Value {
    let out = shardfs_timeout(&["stats", "--json", mnt.to_str().unwrap()], LIMIT);
    assert_ok(&out, "stats");
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// `array` in BACKING has sharded metadata and at least one shard of several chunks.
fn assert_sharded(array: &Path) {
    let meta: Value =
        serde_json::from_slice(&std::fs::read(array.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(
        meta["codecs"][0]["name"],
        "sharding_indexed",
        "{} is stored sharded",
        array.display()
    );
    let out = shardfs_timeout(&["inspect", "--json", array.to_str().unwrap()], LIMIT);
    assert_ok(&out, "inspect");
    let shards: Vec<Value> = serde_json::from_str(&stdout(&out)).unwrap();
    let most = shards
        .iter()
        .map(|s| s["chunks"].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    assert!(
        most > 1,
        "{}: {} shards, none with more than one chunk\n{}",
        array.display(),
        shards.len(),
        stderr(&out)
    );
}

#[test]
fn every_guide_is_tested() {
    let (intro, guides) = readme_guides();
    assert!(
        intro
            .iter()
            .any(|b| b.code.contains("shardfs mount /data/zarr /mnt/zarr")),
        "the section opens with the mount"
    );
    let titles: Vec<&str> = guides.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        titles,
        [
            "zarr-python",
            "tensorstore",
            "xarray",
            "dask",
            "zarrs",
            "OME-Zarr",
            "`cp -r`, `rsync -a` and `tar -x`",
        ],
        "each README guide has its test below"
    );
}

#[test]
fn guide_zarr_python() {
    run_guide("zarr-python", &["zarr-python.zarr"]);
}

#[test]
fn guide_tensorstore() {
    run_guide("tensorstore", &["tensorstore.zarr"]);
}

#[test]
fn guide_xarray() {
    run_guide("xarray", &["climate.zarr/temperature"]);
}

#[test]
fn guide_dask() {
    run_guide("dask", &["dask.zarr"]);
}

#[test]
fn guide_zarrs() {
    let places = run_guide("zarrs", &["zarrs.zarr", "zarrs-pipeline.zarr"]);
    reads_with_zarrs(&places.data);
}

/// zarrs itself reads what it wrote through the mount, natively from BACKING, through its
/// own sharding codec: every chunk holds its value.
fn reads_with_zarrs(data: &Path) {
    use zarrs::array::{Array, ArraySubset};
    let store = std::sync::Arc::new(zarrs::filesystem::FilesystemStore::new(data).unwrap());
    let array = Array::open(store, "/zarrs.zarr").unwrap();
    for (z, y, x) in [(0u64, 0u64, 0u64), (0, 0, 1), (3, 5, 7), (7, 7, 7)] {
        let start = [z * 32, y * 32, x * 32];
        let subset = ArraySubset::new_with_start_shape(start.to_vec(), vec![32, 32, 32]).unwrap();
        let values: Vec<u16> = array.retrieve_array_subset(&subset).unwrap();
        let want = (z * 64 + y * 8 + x) as u16;
        assert!(
            values.iter().all(|v| *v == want),
            "chunk ({z}, {y}, {x}) read natively by zarrs"
        );
    }
}

#[test]
fn guide_ome_zarr() {
    run_guide("OME-Zarr", &["cells.ome.zarr/s0", "cells.ome.zarr/s1"]);
}

#[test]
fn guide_cp_rsync_tar() {
    run_guide(
        "`cp -r`, `rsync -a` and `tar -x`",
        &["copied.zarr", "rsynced.zarr", "untarred/src.zarr"],
    );
}

//! pjdfstest (the Rust rewrite, from crates.io; `scripts/test.sh` installs it) on a plain
//! directory of a real mount. Every test must pass, except those listed in
//! `tests/pjdfstest/shardfs.toml` as expected failures, each with its reason (also in the
//! README); an expected failure that passes fails the run too, so the list stays true.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::mount::{Mounted, dirs, run_timeout};
use common::{stderr, stdout};

#[test]
fn pjdfstest_passes_on_a_plain_directory_of_the_mount() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--allow-other"], Duration::from_secs(900));
    let dir = m.path("plain");
    std::fs::create_dir(&dir).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pjdfstest/shardfs.toml");
    let out = run_timeout(
        Command::new("pjdfstest")
            .arg("-c")
            .arg(&config)
            .arg("-p")
            .arg(&dir),
        Duration::from_secs(600),
    );
    let text = stdout(&out);
    let summary = text
        .lines()
        .rfind(|l| l.starts_with("Summary:"))
        .unwrap_or("no summary")
        .to_string();
    eprintln!("pjdfstest on the mount: {summary}");
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("FAILED")).collect();
    assert!(
        out.status.success(),
        "{summary}\n{}\n{}",
        failed.join("\n"),
        stderr(&out)
    );
    assert!(m.daemon_alive());
}

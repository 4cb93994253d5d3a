//! Every command explains itself.

mod common;

use common::{shardfs, stdout};

#[test]
fn every_command_has_help() {
    for (cmd, needle) in [
        ("inspect", "--json"),
        ("verify", "Exit status"),
        ("mount", "--foreground"),
        ("mount", "--journal-dir"),
        ("mount", "--cache-dir"),
        ("flush", "Exit status"),
        ("stats", "--watch"),
        ("unmount", "--lazy"),
    ] {
        let out = shardfs(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help");
        let text = stdout(&out);
        assert!(text.contains("Usage: shardfs"), "{cmd}: {text}");
        assert!(text.contains(needle), "{cmd} help lacks {needle}: {text}");
    }
    let out = shardfs(&["--help"]);
    for cmd in ["inspect", "verify", "mount", "unmount"] {
        assert!(stdout(&out).contains(cmd));
    }
    // A usage error exits 2.
    assert_eq!(shardfs(&["inspect"]).status.code(), Some(2));
}

#[test]
fn version_completions_and_manual() {
    let out = shardfs(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out).trim(),
        format!("shardfs {}", env!("CARGO_PKG_VERSION"))
    );
    for (shell, needle) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef shardfs"),
        ("fish", "complete -c shardfs"),
    ] {
        let out = shardfs(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = stdout(&out);
        assert!(text.contains(needle), "{shell}: {text}");
        // Every command is completed.
        for cmd in ["mount", "unmount", "flush", "stats", "inspect", "verify"] {
            assert!(text.contains(cmd), "{shell} lacks {cmd}");
        }
    }
    let out = shardfs(&["man"]);
    assert!(out.status.success());
    let page = stdout(&out);
    assert!(page.contains(".TH shardfs 1"), "{page}");
    assert!(page.contains("flush"), "{page}");
}

/// Issue 19, defect 6: `--multipart-above 1K` was raised to 16 MiB without a word. A value
/// no upload can use is refused, saying the bounds.
#[test]
fn a_multipart_threshold_outside_its_bounds_is_refused() {
    for size in ["1K", "15M", "6G"] {
        let out = shardfs(&[
            "mount",
            "s3://b/p",
            "/nonexistent",
            "--multipart-above",
            size,
        ]);
        assert_eq!(out.status.code(), Some(2), "{size}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("outside 16M..5G"), "{size}: {err}");
    }
}

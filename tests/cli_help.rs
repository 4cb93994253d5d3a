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

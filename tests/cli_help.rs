//! Every command explains itself.

mod common;

use common::{shardfs, stdout};

#[test]
fn every_command_has_help() {
    for (cmd, needle) in [
        ("inspect", "--json"),
        ("verify", "Exit status"),
        ("mount", "--foreground"),
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

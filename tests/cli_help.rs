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
        ("pack", "--chunks-per-shard"),
        ("pack", "Exit status"),
    ] {
        let out = shardfs(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help");
        let text = stdout(&out);
        assert!(text.contains("Usage: shardfs"), "{cmd}: {text}");
        assert!(text.contains(needle), "{cmd} help lacks {needle}: {text}");
    }
    let out = shardfs(&["--help"]);
    for cmd in ["inspect", "verify", "mount", "unmount", "pack"] {
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
        for cmd in [
            "mount", "unmount", "flush", "stats", "inspect", "verify", "pack",
        ] {
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

/// Runs shardfs with `args`, its output a pipe closed before it writes (as `head` closes
/// it): the command must end quietly, as Unix tools do (killed by SIGPIPE, or done), never
/// with a panic or an error message. Issue 20: `stats | head`, `inspect`, `completions`
/// panicked ("failed printing to stdout: Broken pipe"); `man` said "Broken pipe" and
/// exited 1.
fn into_a_closed_pipe(args: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(common::shardfs_bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "{args:?} said: {err}");
    let quiet = out.status.success() || out.status.signal() == Some(libc::SIGPIPE);
    assert!(quiet, "{args:?} ended with {:?}", out.status);
}

#[test]
fn no_command_complains_of_a_closed_pipe() {
    for args in [
        vec!["man"],
        vec!["completions", "bash"],
        vec!["--help"],
        vec!["mount", "--help"],
    ] {
        into_a_closed_pipe(&args);
    }
    let (_d, backing, _) = common::mount::dirs();
    let m = common::mount::Mounted::new(&backing, &[], std::time::Duration::from_secs(120));
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), common::LINE_ARRAY).unwrap();
    for k in 0..8u8 {
        std::fs::write(m.path(&format!("x/c/{k}")), [k; 16]).unwrap();
    }
    let mountpoint = m.mountpoint.to_str().unwrap();
    into_a_closed_pipe(&["stats", mountpoint]);
    into_a_closed_pipe(&["stats", mountpoint, "--json"]);
    into_a_closed_pipe(&["flush", mountpoint]);
    common::assert_ok(&m.unmount(&[]), "unmount");
    let array = backing.join("x");
    into_a_closed_pipe(&["inspect", array.to_str().unwrap()]);
    into_a_closed_pipe(&["inspect", array.to_str().unwrap(), "--json"]);
    into_a_closed_pipe(&["verify", array.to_str().unwrap()]);
    let unpacked = _d.path().join("nowhere");
    into_a_closed_pipe(&[
        "pack",
        backing.to_str().unwrap(),
        unpacked.to_str().unwrap(),
        "--dry-run",
    ]);
}

/// `mount` keeps SIGPIPE ignored (its daemon outlives the terminal), so its messages may
/// meet a closed stderr: a refusal is still exit status 2, not a panic (review of issue
/// 20: 101).
#[test]
fn a_refused_mount_with_stderr_closed_still_exits_2() {
    let (_d, _, mountpoint) = common::mount::dirs();
    let bin = common::shardfs_bin();
    let script = format!(
        "'{}' mount /nonexistent/backing '{}' 2>&-",
        bin.display(),
        mountpoint.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

//! `mount -t fuse.shardfs BACKING MOUNTPOINT -o OPTIONS`, and the same in `/etc/fstab`:
//! mount(8) runs `mount.fuse.shardfs BACKING MOUNTPOINT [-sfnv] -o OPTIONS`, which is this
//! binary under that name (`shardfs install-mount-helper` makes the link). Every
//! `shardfs mount` option is an `-o` option, with `_` for `-` (`chunks_per_shard=8`,
//! `max_pending_memory=2G`, `allow_other`); the generic options mount(8) and fstab carry
//! (`defaults`, `nodev`, `noauto`, `_netdev`, `x-systemd.…`) are left to them.

use std::io;
use std::path::{Path, PathBuf};

/// The name mount(8) looks for, for the type `fuse.shardfs`.
pub const HELPER_NAME: &str = "mount.fuse.shardfs";

/// Options that are mount(8)'s or the kernel's, not shardfs's (FUSE mounts are always
/// nosuid and nodev; shardfs mounts noatime).
const GENERIC: &[&str] = &[
    "defaults",
    "rw",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "group",
    "owner",
    "_netdev",
    "nofail",
    "async",
    "sync",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "lazytime",
    "nolazytime",
    "loud",
    "silent",
];

/// shardfs options that take no value.
const FLAGS: &[&str] = &["allow_other", "no_journal", "no_passthrough"];

/// Whether this process was started as the mount helper.
pub fn started_as_helper(argv0: &str) -> bool {
    Path::new(argv0).file_name().and_then(|n| n.to_str()) == Some(HELPER_NAME)
}

/// The `shardfs mount …` command line for mount(8)'s `argv`. `Ok(None)`: nothing to do
/// (`-f`, a fake mount).
pub fn mount_args(argv: &[String]) -> Result<Option<Vec<String>>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut args = argv.iter().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => options.extend(
                args.next()
                    .ok_or("-o needs its options")?
                    .split(',')
                    .map(str::to_string),
            ),
            "-f" => fake = true,
            // No mtab to write, sloppy options are fine, verbose: nothing to change here.
            "-n" | "-s" | "-v" => {}
            o if o.starts_with("-o") => options.extend(o[2..].split(',').map(str::to_string)),
            o if o.starts_with('-') => return Err(format!("unknown mount(8) flag {o}")),
            p => positional.push(p.to_string()),
        }
    }
    let [backing, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.shardfs BACKING MOUNTPOINT [-o OPTIONS]".to_string())?;
    if fake {
        return Ok(None);
    }
    let mut out = vec!["shardfs".into(), "mount".into(), backing, mountpoint];
    for option in options.iter().filter(|o| !o.is_empty()) {
        out.extend(translate(option)?);
    }
    Ok(Some(out))
}

/// One `-o` option as `shardfs mount` arguments.
fn translate(option: &str) -> Result<Vec<String>, String> {
    let (key, value) = match option.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (option, None),
    };
    if GENERIC.contains(&key) || key.starts_with("x-") || key == "comment" {
        return Ok(Vec::new());
    }
    if key == "ro" {
        return Err("a shardfs mount is read-write; \"ro\" is not supported".into());
    }
    let flag = format!("--{}", key.replace('_', "-"));
    match value {
        None if FLAGS.contains(&key) => Ok(vec![flag]),
        None => Err(format!("the option {key} needs a value ({key}=…)")),
        Some(v) => Ok(vec![flag, v.to_string()]),
    }
}

/// Links `prefix/mount.fuse.shardfs` to this binary, replacing an older link.
pub fn install(prefix: &Path) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?.canonicalize()?;
    if crate::runtime::is_root() {
        only_root_may_change(&exe)?;
    }
    let link = prefix.join(HELPER_NAME);
    match std::fs::remove_file(&link) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(&exe, &link)?;
    Ok(link)
}

/// mount(8) runs the helper as root, so the binary it links to, and every directory above
/// it, must be changeable by root alone: a binary in a user's venv (`sudo $(which
/// shardfs) install-mount-helper`) would let that user run anything as root.
fn only_root_may_change(exe: &Path) -> io::Result<()> {
    let Some((p, open)) = crate::runtime::changeable_by_others(exe, &[0], false)? else {
        return Ok(());
    };
    let who = match open {
        true => "may be written by users other than root",
        false => "is not root's",
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is refused: {} {who}, and mount(8) would run the binary as root: install \
             shardfs where only root may write (e.g. `install -m 755 {} \
             /usr/local/bin/shardfs`) and run install-mount-helper from there",
            exe.display(),
            p.display(),
            exe.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn options_become_mount_arguments() {
        let got = mount_args(&args(
            "/sbin/mount.fuse.shardfs /b /m -o rw,nodev,chunks_per_shard=8,allow_other,\
             idle_flush=5,x-systemd.automount,_netdev",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            args("shardfs mount /b /m --chunks-per-shard 8 --allow-other --idle-flush 5")
        );
        assert_eq!(mount_args(&args("x /b /m -f -o rw")).unwrap(), None);
        assert!(mount_args(&args("x /b /m -o ro")).is_err());
        assert!(mount_args(&args("x /b -o rw")).is_err());
        assert!(mount_args(&args("x /b /m -o threads")).is_err());
    }
}

//! Mounting with the system's tools: `mount -t fuse.shardfs`, an fstab line, and a plain
//! `umount`, through the mount.fuse.shardfs helper.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::assert_ok;
use common::mount::{is_mounted, python_ok, run_timeout};

/// Unmounts (lazily) whatever is still mounted at the mount point, and removes an
/// installed helper, when a test ends, passing or not.
struct Cleanup {
    mountpoint: PathBuf,
    installed: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            common::mount::detach(&self.mountpoint);
        }
        if let Some(link) = &self.installed {
            let _ = std::fs::remove_file(link);
        }
    }
}

/// The shardfs binary copied, mode 0755, into a new directory that root alone may change
/// (below /usr/local/lib), removed with the value.
fn root_only_copy_of_shardfs() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let parent = Path::new("/usr/local/lib");
    std::fs::create_dir_all(parent).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("shardfs-test-")
        .tempdir_in(parent)
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("shardfs");
    std::fs::copy(env!("CARGO_BIN_EXE_shardfs"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn run(cmd: &mut Command) -> std::process::Output {
    run_timeout(cmd, Duration::from_secs(60))
}

/// zarr-python writes two of the four chunks of the first shard of `array`.
fn half_a_shard(array: &Path) {
    let code = "import sys, zarr\n\
                a = zarr.create_array(sys.argv[1], shape=(64, 64), chunks=(16, 16), \
                dtype='uint8', compressors=None, fill_value=0)\n\
                a[0:16, 0:16] = 1\n\
                a[16:32, 16:32] = 2";
    python_ok("half a shard", code, &[array]);
}

/// After a plain umount the daemon writes what was pending, then exits: the shard shows
/// up in BACKING, and reads natively.
fn lands_after_umount(mountpoint: &Path, backing: &Path) {
    assert_ok(&run(Command::new("umount").arg(mountpoint)), "umount");
    let shard = backing.join("a/c/0/0");
    let start = Instant::now();
    while !shard.is_file() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no shard after umount"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let code = "import sys, zarr\n\
                a = zarr.open_array(sys.argv[1], mode='r')\n\
                assert a.shards == (32, 32), a.shards\n\
                assert (a[0:16, 0:16] == 1).all() and (a[16:32, 16:32] == 2).all()";
    python_ok("native read", code, &[&backing.join("a")]);
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mnt"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&mountpoint).unwrap();
    (dir, backing, mountpoint)
}

#[test]
fn the_helper_takes_mount_options_and_a_plain_umount_writes_everything() {
    let (dir, backing, mountpoint) = dirs();
    let _cleanup = Cleanup {
        mountpoint: mountpoint.clone(),
        installed: None,
    };
    let helper = dir.path().join("mount.fuse.shardfs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_shardfs"), &helper).unwrap();
    let out = run(Command::new(&helper).arg(&backing).arg(&mountpoint).args([
        "-o",
        "rw,nodev,chunks_per_shard=2,idle_flush=600,max_pending_memory=1G",
    ]));
    assert_ok(&out, "mount.fuse.shardfs");
    assert!(is_mounted(&mountpoint));
    half_a_shard(&mountpoint.join("a"));
    lands_after_umount(&mountpoint, &backing);
    // An option shardfs does not know is refused, naming it.
    let out = run(Command::new(&helper)
        .arg(&backing)
        .arg(&mountpoint)
        .args(["-o", "chunks_per_shrad=2"]));
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("chunks-per-shrad"),
        "{}",
        common::stderr(&out)
    );
    assert!(!is_mounted(&mountpoint));
}

#[test]
fn mount_t_and_an_fstab_line_use_the_installed_helper() {
    let (dir, backing, mountpoint) = dirs();
    let prefix = Path::new("/usr/sbin");
    let mut cleanup = Cleanup {
        mountpoint: mountpoint.clone(),
        installed: None,
    };
    // mount(8) runs the helper as root: it links only to a binary that root alone may
    // change, wherever the checkout lies (one under /tmp is refused, rightly).
    let root_only = root_only_copy_of_shardfs();
    let out = run(Command::new(root_only.path().join("shardfs"))
        .args(["install-mount-helper", "--prefix"])
        .arg(prefix));
    assert_ok(&out, "install-mount-helper");
    cleanup.installed = Some(prefix.join("mount.fuse.shardfs"));
    // mount -t
    let out = run(Command::new("mount")
        .args(["-t", "fuse.shardfs"])
        .arg(&backing)
        .arg(&mountpoint)
        .args(["-o", "chunks_per_shard=2,idle_flush=600"]));
    assert_ok(&out, "mount -t fuse.shardfs");
    assert!(is_mounted(&mountpoint));
    half_a_shard(&mountpoint.join("a"));
    lands_after_umount(&mountpoint, &backing);
    // An fstab line (a file of its own, given to mount with -T).
    std::fs::remove_dir_all(backing.join("a")).unwrap();
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.shardfs noauto,chunks_per_shard=2,idle_flush=600 0 0\n",
            backing.display(),
            mountpoint.display()
        ),
    )
    .unwrap();
    let out = run(Command::new("mount").arg("-T").arg(&fstab).arg(&mountpoint));
    assert_ok(&out, "mount from an fstab line");
    assert!(is_mounted(&mountpoint));
    half_a_shard(&mountpoint.join("a"));
    lands_after_umount(&mountpoint, &backing);
}

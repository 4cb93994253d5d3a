//! Where most users are: not root. `scripts/test.sh` makes an ordinary user (`SHARDFS_USER`,
//! with a venv of its own, `SHARDFS_USER_PYTHON`), installs fuse3 (fusermount3) and makes
//! `/dev/fuse` usable by everyone, as distributions ship it. Each test runs shardfs as that
//! user (`setpriv`), from a copy of the binary in a directory it can read, on directories
//! of its own: mount, write with zarr-python, flush, stats, unmount (through fusermount3),
//! a lazy unmount with a file open, an object-store mount with its default paths, and each
//! refusal (exit status 2, one line saying what to do, nothing mounted).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::mount::{is_mounted, run_timeout};
use common::stores::{Kind, StoreServer};
use common::{assert_ok, stderr, stdout};

/// The ordinary user, and a directory of theirs holding a copy of shardfs.
struct User {
    name: String,
    uid: u32,
    gid: u32,
    home: PathBuf,
    python: PathBuf,
    dir: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        let name = std::env::var("SHARDFS_USER")
            .expect("SHARDFS_USER: run scripts/test.sh, which makes the ordinary user");
        let python = PathBuf::from(
            std::env::var("SHARDFS_USER_PYTHON").expect("SHARDFS_USER_PYTHON (scripts/test.sh)"),
        );
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            stdout(&out).trim().parse().unwrap()
        };
        let (uid, gid) = (id("-u"), id("-g"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("shardfs");
        std::fs::copy(common::shardfs_bin(), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let user = User {
            home: dir.path().join("home"),
            name,
            uid,
            gid,
            python,
            dir,
        };
        user.own_dir(&user.home);
        user
    }

    /// A new directory of the user's below theirs.
    fn own_dir(&self, path: &Path) -> PathBuf {
        std::fs::create_dir_all(path).unwrap();
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid)).unwrap();
        path.to_path_buf()
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("shardfs")
    }

    /// `program args` as the user, with a plain environment and `env` added.
    fn command(&self, program: &Path, args: &[&str], env: &[(&str, String)]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("env")
            .arg("-i")
            .arg(format!("HOME={}", self.home.display()))
            .arg(format!("USER={}", self.name))
            .arg("PATH=/usr/local/bin:/usr/bin:/bin");
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(program).args(args);
        cmd
    }

    fn run(&self, program: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
        run_timeout(
            &mut self.command(program, args, env),
            Duration::from_secs(180),
        )
    }

    fn shardfs(&self, args: &[&str]) -> Output {
        self.run(&self.bin(), args, &[])
    }

    fn python(&self, code: &str, args: &[&Path]) -> Output {
        let mut all = vec!["-c", code];
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        all.extend(args);
        self.run(&self.python, &all, &[])
    }
}

/// Writes a 32x32 uint8 array of 8x8 chunks, chunk by chunk, at `path`.
const WRITE: &str = "import sys, numpy as np, zarr\n\
    a = zarr.create_array(sys.argv[1], shape=(32, 32), chunks=(8, 8), dtype='uint8', \
    compressors=None, fill_value=0)\n\
    d = np.arange(32 * 32, dtype='uint8').reshape(32, 32)\n\
    for i in range(0, 32, 8):\n\
    \x20   for j in range(0, 32, 8):\n\
    \x20       a[i:i + 8, j:j + 8] = d[i:i + 8, j:j + 8]";

#[test]
fn an_ordinary_user_mounts_writes_flushes_and_unmounts() {
    let user = User::new();
    let backing = user.own_dir(&user.home.join("b"));
    let mnt = user.own_dir(&user.home.join("m"));
    let m = mnt.to_str().unwrap();
    assert_ok(
        &user.shardfs(&[
            "mount",
            backing.to_str().unwrap(),
            m,
            "--chunks-per-shard",
            "2",
        ]),
        "mount as the user",
    );
    let guard = Unmounted(mnt.clone());
    assert_ok(&user.python(WRITE, &[&mnt.join("a")]), "zarr-python writes");
    let flushed = user.shardfs(&["flush", m]);
    assert_ok(&flushed, "flush");
    assert!(stdout(&flushed).contains("flushed"), "{}", stdout(&flushed));
    let stats = user.shardfs(&["stats", m, "--json"]);
    assert_ok(&stats, "stats");
    let stats: serde_json::Value = serde_json::from_str(&stdout(&stats)).unwrap();
    assert_eq!(stats["pending_chunks"], 0, "{stats}");
    assert_ok(&user.shardfs(&["unmount", m]), "unmount as the user");
    assert!(!is_mounted(&mnt));
    drop(guard);
    // BACKING holds the array sharded, as any reader sees it.
    assert_ok(
        &common::shardfs(&["verify", backing.to_str().unwrap()]),
        "verify",
    );
    let check = "import sys, numpy as np, zarr\n\
                 a = zarr.open_array(sys.argv[1], mode='r')\n\
                 assert a.shards == (16, 16), a.shards\n\
                 d = np.arange(32 * 32, dtype='uint8').reshape(32, 32)\n\
                 assert (a[...] == d).all()";
    common::mount::python_ok("read natively", check, &[&backing.join("a")]);
}

#[test]
fn an_ordinary_users_lazy_unmount_waits_for_the_last_file() {
    let user = User::new();
    let backing = user.own_dir(&user.home.join("b"));
    let mnt = user.own_dir(&user.home.join("m"));
    let m = mnt.to_str().unwrap();
    assert_ok(
        &user.shardfs(&["mount", backing.to_str().unwrap(), m]),
        "mount",
    );
    let guard = Unmounted(mnt.clone());
    std::fs::write(mnt.join("f.txt"), b"kept").ok();
    let code = "import sys, time\n\
                f = open(sys.argv[1], 'w'); f.write('held open'); f.flush()\n\
                print('open', flush=True); time.sleep(3); f.close()";
    let mut holder = user
        .command(
            &user.python,
            &["-c", code, mnt.join("held.txt").to_str().unwrap()],
            &[],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let busy = user.shardfs(&["unmount", m]);
    assert_eq!(busy.status.code(), Some(1), "{}", stderr(&busy));
    assert!(stderr(&busy).contains("busy"), "{}", stderr(&busy));
    assert_ok(&user.shardfs(&["unmount", "--lazy", m]), "lazy unmount");
    assert!(holder.wait().unwrap().success());
    assert!(!is_mounted(&mnt));
    drop(guard);
    assert_eq!(
        std::fs::read_to_string(backing.join("held.txt")).unwrap(),
        "held open"
    );
}

#[test]
fn an_ordinary_user_mounts_an_object_store_with_default_paths() {
    let user = User::new();
    let server = StoreServer::start(Kind::S3);
    let mnt = user.own_dir(&user.home.join("m"));
    let m = mnt.to_str().unwrap();
    let env: Vec<(&str, String)> = server.env();
    let url = server.url("mine");
    let mounted = user.run(
        &user.bin(),
        &["mount", &url, m, "--chunks-per-shard", "2"],
        &env,
    );
    assert_ok(&mounted, "mount s3:// as the user");
    let guard = Unmounted(mnt.clone());
    assert_ok(&user.python(WRITE, &[&mnt.join("a")]), "zarr-python writes");
    assert_ok(&user.run(&user.bin(), &["unmount", m], &env), "unmount");
    drop(guard);
    // The cache in the user's ~/.cache, the shards in the bucket.
    let cache = user.home.join(".cache/shardfs");
    let made: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(made.len(), 1, "{}", cache.display());
    assert_eq!(server.keys("mine/a/c/").len(), 4);
}

#[test]
fn what_keeps_an_ordinary_user_from_mounting_is_said_in_one_line() {
    let user = User::new();
    let backing = user.own_dir(&user.home.join("b"));
    let mnt = user.own_dir(&user.home.join("m"));
    let (b, m) = (backing.to_str().unwrap(), mnt.to_str().unwrap());
    let refused = |out: Output, needle: &str| {
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains(needle), "{text}");
        assert!(!is_mounted(&mnt), "{text}");
    };
    // --allow-other without user_allow_other in /etc/fuse.conf.
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    assert!(
        !conf.lines().any(|l| l.trim() == "user_allow_other"),
        "this machine allows users --allow-other: the test needs it not to"
    );
    refused(
        user.shardfs(&["mount", b, m, "--allow-other"]),
        "user_allow_other",
    );
    // No fusermount3 on PATH.
    let mut no_helper = user.command(&user.bin(), &["mount", b, m], &[]);
    no_helper.env_clear();
    let args: Vec<String> = no_helper
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .map(|a| {
            if a.starts_with("PATH=") {
                "PATH=/nonexistent".to_string()
            } else {
                a
            }
        })
        .collect();
    let out = run_timeout(Command::new("setpriv").args(&args), Duration::from_secs(60));
    refused(out, "fusermount3");
    // A mount point of another user's.
    let theirs = user.dir.path().join("root-owned");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = user.shardfs(&["mount", b, theirs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("another user"), "{}", stderr(&out));
    assert!(!is_mounted(&theirs));
    // /dev/fuse closed to the user (in a mount namespace of the test's own, where a file
    // only root may open stands in for it).
    let closed = user.dir.path().join("closed-fuse");
    std::fs::write(&closed, b"").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inner = user.command(&user.bin(), &["mount", b, m], &[]);
    let quoted: Vec<String> = std::iter::once(inner.get_program())
        .chain(inner.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let script = format!(
        "mount --bind {} /dev/fuse && exec {}",
        closed.display(),
        quoted.join(" ")
    );
    let out = run_timeout(
        Command::new("unshare").args(["--mount", "sh", "-c", &script]),
        Duration::from_secs(60),
    );
    refused(out, "/dev/fuse");
}

/// Unmounts (lazily) on drop, the test failing or not.
struct Unmounted(PathBuf);

impl Drop for Unmounted {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        }
    }
}

/// `pip install shardfs` (the wheel `scripts/test.sh` builds with maturin) into a fresh
/// venv puts the binary on its PATH and a module over it; the README's example runs as
/// written, as root and as the ordinary user: a mount as a context manager, `flush()`,
/// `stats()`, an unmount at the end even when the block fails, a failed command raised with
/// its message.
#[test]
fn pip_install_shardfs_gives_the_binary_and_a_python_module() {
    let user = User::new();
    let venv = fresh_venv_with_the_wheel(&user);
    let python = venv.join("bin/python");
    let version = Path::new(env!("CARGO_PKG_VERSION"));
    // As root, then as the user (each on directories of its own).
    let root_dir = tempfile::tempdir().unwrap();
    let (b, m) = (root_dir.path().join("b"), root_dir.path().join("m"));
    std::fs::create_dir_all(&b).unwrap();
    std::fs::create_dir_all(&m).unwrap();
    let as_root = run_timeout(
        Command::new(&python)
            .args(["-c", EXAMPLE])
            .args([&b, &m, version]),
        Duration::from_secs(180),
    );
    assert_ok(&as_root, "the example, as root");
    check_img(&b);
    let backing = user.own_dir(&user.home.join("b"));
    let mnt = user.own_dir(&user.home.join("m"));
    let _guard = Unmounted(mnt.clone());
    let out = user.run(
        &python,
        &[
            "-c",
            EXAMPLE,
            backing.to_str().unwrap(),
            mnt.to_str().unwrap(),
            env!("CARGO_PKG_VERSION"),
        ],
        &[],
    );
    assert_ok(&out, "the example, as the user");
    assert!(!is_mounted(&mnt));
    check_img(&backing);
}

/// The README's example, then an error inside a block and a refused mount.
const EXAMPLE: &str = "import sys, numpy as np, zarr, shardfs\n\
    b, m = sys.argv[1], sys.argv[2]\n\
    assert shardfs.__version__ == sys.argv[3], shardfs.__version__\n\
    data = np.arange(512 * 512, dtype='uint16').reshape(512, 512)\n\
    with shardfs.mount(b, m, chunks_per_shard=64) as m_:\n\
    \x20   zarr.create_array(m_.path / 'img', shape=(512, 512), chunks=(64, 64), dtype='uint16')[:] = data\n\
    \x20   assert m_.flush().startswith('flushed'), 'flush'\n\
    \x20   stats = m_.stats()\n\
    \x20   assert stats['pending_chunks'] == 0 and stats['shards_written'] >= 1, stats\n\
    assert not m_.mounted\n\
    try:\n\
    \x20   with shardfs.mount(b, m) as m_:\n\
    \x20       raise KeyError('in the block')\n\
    except KeyError:\n\
    \x20   assert not m_.mounted, 'an error in the block still unmounts'\n\
    try:\n\
    \x20   shardfs.mount(b, '/nonexistent/mountpoint')\n\
    except shardfs.ShardfsError as e:\n\
    \x20   assert e.returncode in (1, 2) and 'nonexistent' in e.message, e.message\n\
    else:\n\
    \x20   sys.exit('a refused mount raised nothing')";

/// BACKING's `img`, as the example wrote it: sharded, read natively.
fn check_img(backing: &Path) {
    let check = "import sys, numpy as np, zarr\n\
                 a = zarr.open_array(sys.argv[1], mode='r')\n\
                 assert a.shards is not None and a.shards != a.chunks, a.shards\n\
                 assert (a[...] == np.arange(512 * 512, dtype='uint16').reshape(512, 512)).all()";
    common::mount::python_ok("read natively", check, &[&backing.join("img")]);
}

/// A new venv (from the system's Python, readable by the user) with the wheel installed
/// and nothing else of its own: zarr and numpy come from the user's venv by a `.pth`.
fn fresh_venv_with_the_wheel(user: &User) -> PathBuf {
    let wheel = std::env::var("SHARDFS_WHEEL").expect("SHARDFS_WHEEL (scripts/test.sh builds it)");
    let venv = user.dir.path().join("venv");
    assert_ok(
        &run_timeout(
            Command::new("/usr/bin/python3")
                .args(["-m", "venv"])
                .arg(&venv),
            Duration::from_secs(120),
        ),
        "a fresh venv",
    );
    let site = |python: &Path| {
        let out = Command::new(python)
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ])
            .output()
            .unwrap();
        PathBuf::from(stdout(&out).trim())
    };
    let installed = run_timeout(
        Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .arg(&wheel),
        Duration::from_secs(180),
    );
    assert_ok(&installed, "pip install the wheel");
    // (After the install: pip would take the user venv's packages for this one's.)
    let deps = site(&user.python);
    std::fs::write(
        site(&venv.join("bin/python")).join("deps.pth"),
        format!("{}\n", deps.display()),
    )
    .unwrap();
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rX")
        .arg(&venv)
        .status();
    venv
}

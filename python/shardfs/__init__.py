"""shardfs from Python: a mount as a context manager over the `shardfs` command.

    import shardfs
    with shardfs.mount("/data/zarr", "/tmp/zmnt", chunks_per_shard=64) as m:
        zarr.create_array(m.path / "img", ...)[:] = data
        m.flush()            # the barrier, as `shardfs flush`
        print(m.stats())     # a dict, as `shardfs stats --json`
    # unmounted here; an error in the block still unmounts, and a failed unmount raises

Everything goes through the `shardfs` binary installed with this package (no second
implementation): options are `shardfs mount`'s, with `_` for `-` (`True` for a flag), and
a command that fails raises `ShardfsError` with its message. Works without root (through
fusermount3).
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

__all__ = ["Mount", "ShardfsError", "mount", "binary"]


def _version():
    try:
        from importlib.metadata import version
        return version("shardfs")
    except Exception:
        return "unknown"


__version__ = _version()


class ShardfsError(RuntimeError):
    """A `shardfs` command that failed: its arguments, exit status and message."""

    def __init__(self, args, returncode, message):
        super().__init__(message)
        self.command = list(args)
        self.returncode = returncode
        self.message = message

    def __reduce__(self):
        # So that it crosses process boundaries (multiprocessing, dask) intact.
        return (ShardfsError, (self.command, self.returncode, self.message))


def binary():
    """The `shardfs` binary: the one this package installed, else the one on PATH."""
    name = "shardfs"
    for scripts in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(scripts, name)
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise ShardfsError([name], None, "the shardfs binary is not installed")
    return found


def _run(*args):
    """Runs `shardfs ARGS`; its standard output, or `ShardfsError` with its message."""
    command = [binary(), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip()
                   or f"exit status {done.returncode}")
        raise ShardfsError(command, done.returncode, message)
    return done.stdout


# The daemon's own options: a mount from here always returns once it is live.
_NOT_OPTIONS = {"foreground", "ready_fd"}


def _options(options):
    """`shardfs` options from keywords, each value attached (`--flag=value`) so that one
    starting with `-` stays a value."""
    args = []
    for key, value in options.items():
        if key in _NOT_OPTIONS:
            raise ValueError(f"{key} is not an option of shardfs.mount")
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        else:
            args.append(f"{flag}={value}")
    return args


def _unescape(field):
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes; a
    # name need not be UTF-8 (kept as the surrogates os.fsdecode gives).
    raw = field.encode("utf-8", "surrogateescape")
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), raw)
    return raw.decode("utf-8", "surrogateescape")


def _is_mount_point(path):
    """Whether `path` is a mount point now (in this process's view)."""
    path = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return any(_unescape(line.split(" ")[4]) == path for line in f)
    except OSError:
        return True


class Mount:
    """A live mount of `backing` at `path` (a `pathlib.Path`)."""

    def __init__(self, backing, path):
        self.backing = backing
        self.path = pathlib.Path(path)
        self.mounted = True

    def flush(self, below=None):
        """Writes every pending shard (below `below`, a path in the mount) now, durably;
        returns the summary line."""
        args = ["flush", "--", self.path] + ([below] if below is not None else [])
        return _run(*args).strip()

    def stats(self):
        """The mount's counters, as `shardfs stats --json` gives them."""
        return json.loads(_run("stats", "--json", "--", self.path))

    def unmount(self, lazy=False, give_up=False):
        """Unmounts, after everything pending is written; raises when that fails (the mount
        then stays, nothing lost)."""
        try:
            _run("unmount", *_options({"lazy": lazy, "give_up": give_up}), "--", self.path)
        except ShardfsError:
            # Some failures still unmount (a lazy unmount whose last file stays open
            # long, a daemon that ended badly): what is true now is what counts.
            self.mounted = _is_mount_point(self.path)
            raise
        self.mounted = False

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if self.mounted:
            # An error in the block still unmounts; a failed unmount raises (chained to
            # the block's error, if any).
            self.unmount()
        return False

    def __repr__(self):
        state = "mounted" if self.mounted else "unmounted"
        return f"<shardfs.Mount {self.backing} at {self.path} ({state})>"


def mount(backing, mountpoint, **options):
    """Mounts `backing` (a directory or an object-store URL) at `mountpoint`, returning
    once the mount is live. `options` are `shardfs mount`'s: `chunks_per_shard=64`,
    `idle_flush=5`, `cache_dir=...`, `allow_other=True`."""
    backing = str(backing)
    if "://" not in backing:
        backing = os.path.abspath(backing)
    # Absolute: the block may change the working directory before the unmount.
    mountpoint = os.path.abspath(mountpoint)
    _run("mount", *_options(options), "--", backing, mountpoint)
    return Mount(backing, mountpoint)

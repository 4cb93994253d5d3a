"""Random SIGKILLs of a conversion in place (`shardfs pack SRC`, or `unpack`, `reshard`):
after each kill every array must read equal to its pristine copy, and running the command
again must finish the conversion.

    pack_crash.py SHARDFS PRISTINE WORK TRIALS SEED [COMMAND ARG...]

PRISTINE holds arrays written by pack_cases.py (packed already, for unpack and reshard).
COMMAND ARG... is the conversion (default: pack --chunks-per-shard 2); ROOT is added after
the command. Between a kill and the rerun, a user sometimes writes into an array whose
document is still the one it began with. Prints a JSON report: trials, kills, and the
kills that fell in each state (before the flip with a state file / after it with one)."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import zarr

from pack_cases import arrays, compare


def document(root, name):
    with open(os.path.join(root, name, "zarr.json")) as f:
        return json.load(f)


def state_of(pristine, root):
    """Which of the in-place steps the arrays of `root` are in."""
    states = set()
    for name in arrays(root):
        leftover = os.path.exists(os.path.join(root, name, ".shardfs-pack.json"))
        if not leftover:
            continue
        flipped = document(root, name) != document(pristine, name)
        states.add("after the flip (finishing)" if flipped else "before the flip (staging)")
    return sorted(states) or ["no state file"]


def reads_equal(expected, root):
    for name, a in expected.items():
        b = zarr.open_array(os.path.join(root, name), mode="r")[...]
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{name} differs after a kill"


def write_while_stopped(rng, expected, pristine, root):
    """A user's write between a kill and the rerun, into an array not yet flipped (its
    document still the one it began with): a rerun must convert what it holds then."""
    path = os.path.join(root, "zp/two")
    if document(root, "zp/two") != document(pristine, "zp/two"):
        return False
    # Half the time the fill value: zarr-python removes those chunk files.
    value = rng.choice([0, rng.randrange(1, 256)])
    a = zarr.open_array(path, mode="r+")
    a[0:16, 0:10] = value
    expected["zp/two"][0:16, 0:10] = value
    return True


COMMAND = ["pack", "--chunks-per-shard", "2"]


def pack(shardfs, root):
    return subprocess.Popen([shardfs, COMMAND[0], root, *COMMAND[1:], "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main(shardfs, pristine, work, trials, seed, *command):
    if command:
        COMMAND[:] = command
    rng = random.Random(int(seed))
    names = arrays(pristine)
    # How long an uninterrupted pack takes here: kills fall anywhere inside it.
    root = os.path.join(work, "timing")
    shutil.copytree(pristine, root)
    start = time.monotonic()
    assert pack(shardfs, root).wait() == 0
    span = (time.monotonic() - start) * 1.2
    shutil.rmtree(root)
    kills, seen, writes = 0, {}, 0
    for trial in range(int(trials)):
        root = os.path.join(work, f"t{trial}")
        shutil.copytree(pristine, root)
        expected = {n: zarr.open_array(os.path.join(pristine, n), mode="r")[...] for n in names}
        while True:
            p = pack(shardfs, root)
            try:
                p.wait(timeout=rng.uniform(0, span))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                for s in state_of(pristine, root):
                    seen[s] = seen.get(s, 0) + 1
                reads_equal(expected, root)
                if rng.random() < 0.3 and write_while_stopped(rng, expected, pristine, root):
                    writes += 1
                continue
            assert p.returncode == 0, p.stderr.read().decode()
            break
        reads_equal(expected, root)
        leftovers = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                     if f == ".shardfs-pack.json" or f.endswith((".__lock", ".shardfs-staged"))]
        assert not leftovers, leftovers
        if trial % 10 == 0 and all(np.array_equal(expected[n], zarr.open_array(
                os.path.join(pristine, n), mode="r")[...]) for n in names):
            compare(pristine, root)  # both clients, once in a while
        shutil.rmtree(root)
    print(json.dumps({"trials": int(trials), "kills": kills, "kills_by_state": seen,
                      "writes_between": writes, "span_s": span}))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""A writer updating chunks while `shardfs pack SRC` converts the array in place
(tests/convert_pack.rs): no completed write may be lost, whatever pack says.

  pack_writers.py SHARDFS WORK TRIALS    prints one JSON line: pack's exit statuses counted,
                                          and the writes made during the runs
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import zarr

SHAPE, CHUNK = (64, 1024, 256), (1, 1024, 256)  # 64 chunks of 256 KiB


def trial(shardfs, root, seed):
    """Odd trials set an attribute again and again instead of writing chunks."""
    attrs = seed % 2 == 1
    rng = np.random.default_rng(seed)
    shutil.rmtree(root, ignore_errors=True)
    a = zarr.create_array(root, shape=SHAPE, chunks=CHUNK, dtype="uint8",
                          compressors=None, fill_value=0)
    a[...] = 1
    expected = np.ones(SHAPE[0], dtype=np.uint8)
    pack = subprocess.Popen([shardfs, "pack", root], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    writes, attr = 0, None
    while pack.poll() is None:
        # Opened anew each time: a writer that starts while the array is sharded writes
        # through its new layout (a read-modify-write of the shard, as zarr-python does).
        a = zarr.open_array(root, mode="r+")
        if attrs:
            attr = writes
            a.attrs["n"] = attr
        else:
            i = int(rng.integers(SHAPE[0]))
            v = int(rng.integers(2, 255))
            a[i] = v
            expected[i] = v
        writes += 1
    err = pack.stderr.read().decode()
    a = zarr.open_array(root, mode="r")
    got = a[:, 0, 0]
    lost = [int(i) for i in np.nonzero(got != expected)[0]]
    if attr is not None and a.attrs.get("n") != attr:
        lost.append(f"attribute n: {a.attrs.get('n')} instead of {attr}")
    return pack.returncode, writes, lost, err


def main(shardfs, work, trials):
    codes, writes, lost = {}, 0, []
    for t in range(int(trials)):
        code, n, gone, err = trial(shardfs, os.path.join(work, "a"), t)
        codes[code] = codes.get(code, 0) + 1
        writes += n
        if gone:
            lost.append({"trial": t, "exit": code, "chunks": gone, "pack said": err[-400:]})
        if code not in (0, 1):
            lost.append({"trial": t, "exit": code, "pack said": err[-400:]})
    print(json.dumps({"exits": codes, "writes": writes, "lost": lost}))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Writers that share shards: each writes every other chunk of one 2-D uint8 array, with
tensorstore's default file kvstore (which fsyncs every chunk file and its directory).

    shared.py create PATH              zarr-python makes the array (unsharded, through a mount)
    shared.py write PATH PARITY ROUNDS tensorstore writes chunks k with k % 2 == PARITY
    shared.py check PATH               every chunk k holds k + 1 (read natively)

Chunk k (C order over the 8x8 chunk grid) holds the value k + 1 everywhere.
"""
import sys

import numpy as np

SHAPE, CHUNK = (64, 64), (8, 8)
GRID = (SHAPE[0] // CHUNK[0], SHAPE[1] // CHUNK[1])


def region(k):
    i, j = divmod(k, GRID[1])
    return (slice(i * CHUNK[0], (i + 1) * CHUNK[0]), slice(j * CHUNK[1], (j + 1) * CHUNK[1]))


def create(path):
    import zarr
    zarr.create_array(path, shape=SHAPE, chunks=CHUNK, dtype="uint8", compressors=None,
                      fill_value=0)


def write(path, parity, rounds):
    import tensorstore as ts
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}).result()
    for _ in range(rounds):
        for k in range(parity, GRID[0] * GRID[1], 2):
            t[region(k)] = np.full(CHUNK, k + 1, dtype="uint8")


def check(path):
    import zarr
    a = zarr.open_array(path, mode="r")[...]
    missing = [k for k in range(GRID[0] * GRID[1]) if not (a[region(k)] == k + 1).all()]
    if missing:
        sys.exit(f"{len(missing)} of {GRID[0] * GRID[1]} chunks lost: {missing}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "create":
        create(args[0])
    elif cmd == "write":
        write(args[0], int(args[1]), int(args[2]))
    elif cmd == "check":
        check(args[0])
    else:
        sys.exit(f"unknown command {cmd}")

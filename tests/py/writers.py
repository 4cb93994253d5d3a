"""Real writers writing through a shardfs mount. Each scenario writes arrays under ROOT (a
path inside the mount) and saves what a reader must find afterwards as <name>.npy in OUT.

    writers.py SCENARIO ROOT OUT
"""

import errno
import json
import os
import sys
import warnings

import numpy as np
import tensorstore as ts
import zarr
from zarr.codecs import ZstdCodec

warnings.filterwarnings("ignore")


def sample(shape, dtype, seed, holes=True):
    """Random nonzero data; with `holes`, the first chunk-sized corner and the last rows
    are fill value (0), so that writers skipping empty chunks skip some."""
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 200, size=shape).astype(dtype)
    if holes:
        data[tuple(slice(0, max(1, s // 4)) for s in shape)] = 0
        data[-max(1, shape[0] // 8):] = 0
    return data


def regions(shape, chunks):
    grid = [range(0, s, c) for s, c in zip(shape, chunks)]
    for start in np.ndindex(*[len(g) for g in grid]):
        yield tuple(slice(g[i], min(g[i] + c, s))
                    for i, g, c, s in zip(start, grid, chunks, shape))


def zarr_array(root, name, shape, chunks, dtype, zstd=False, empty=False, enc=("default", "/")):
    return zarr.create_array(
        os.path.join(root, name), shape=shape, chunks=chunks, dtype=dtype,
        compressors=ZstdCodec(level=1) if zstd else None, fill_value=0,
        chunk_key_encoding={"name": enc[0], "separator": enc[1]},
        config={"write_empty_chunks": empty}, overwrite=True,
        attributes={"writer": "zarr-python"}, dimension_names=["y", "x"][:len(shape)] or None)


def save(out, name, data):
    np.save(os.path.join(out, name + ".npy"), data)


def zarr_python(root, out):
    # Whole-array writes, skipping empty chunks (the default) and writing them.
    for i, empty in enumerate((False, True)):
        shape, chunks = (90, 70), (10, 10)
        data = sample(shape, "int32", i)
        a = zarr_array(root, f"whole_empty_{empty}", shape, chunks, "int32", zstd=True, empty=empty)
        a[...] = data
        save(out, f"whole_empty_{empty}", data)
    # Chunk by chunk, in C order, each region one chunk.
    shape, chunks = (64, 48), (8, 8)
    data = sample(shape, "uint16", 7)
    a = zarr_array(root, "by_chunk", shape, chunks, "uint16", enc=("v2", "."))
    for r in regions(shape, chunks):
        a[r] = data[r]
    save(out, "by_chunk", data)
    # Resize: grow, write into the new part, shrink.
    a = zarr_array(root, "resized", (40, 40), (10, 10), "float32")
    data = sample((40, 40), "float32", 8, holes=False)
    a[...] = data
    a.resize((60, 50))
    grown = np.zeros((60, 50), "float32")
    grown[:40, :40] = data
    grown[40:, :] = 3.5
    a[40:, :] = 3.5
    a.resize((45, 50))
    save(out, "resized", grown[:45, :50])
    # Overwrite: a second create_array(overwrite=True) replaces the first array.
    a = zarr_array(root, "overwritten", (30, 30), (10, 10), "int64")
    a[...] = sample((30, 30), "int64", 9)
    a = zarr_array(root, "overwritten", (20, 25), (5, 5), "int64", zstd=True)
    data = sample((20, 25), "int64", 10)
    a[...] = data
    save(out, "overwritten", data)
    # Reading back through the mount before unmount.
    for name in ("whole_empty_False", "by_chunk", "resized", "overwritten"):
        expected = np.load(os.path.join(out, name + ".npy"))
        got = zarr.open_array(os.path.join(root, name), mode="r")[...]
        if not np.array_equal(got, expected):
            sys.exit(f"{name}: read through the mount differs before unmount")
    print("ok")


def ts_spec(path, shape, chunks, dtype):
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
            "metadata": {"shape": list(shape), "data_type": dtype,
                         "chunk_grid": {"name": "regular",
                                        "configuration": {"chunk_shape": list(chunks)}},
                         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                    {"name": "zstd", "configuration": {"level": 1}}],
                         "dimension_names": ["a", "b", "c"][:len(shape)]}}


def tensorstore(root, out):
    # The default file kvstore: lock files, fsync of files and directories.
    shape, chunks = (40, 30, 20), (10, 10, 10)
    data = sample(shape, "int16", 20)
    t = ts.open(ts_spec(os.path.join(root, "ts_whole"), shape, chunks, "int16"),
                create=True, delete_existing=True).result()
    t[...] = data
    save(out, "ts_whole", data)
    shape, chunks = (32, 24), (8, 8)
    data = sample(shape, "uint8", 21)
    t = ts.open(ts_spec(os.path.join(root, "ts_by_chunk"), shape, chunks, "uint8"),
                create=True, delete_existing=True).result()
    for r in regions(shape, chunks):
        t[r].write(data[r]).result()
    save(out, "ts_by_chunk", data)
    got = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                  "path": os.path.join(root, "ts_by_chunk")}},
                  open=True).result().read().result()
    if not np.array_equal(got, data):
        sys.exit("ts_by_chunk: read through the mount differs before unmount")
    print("ok")


def counted(root, out):
    """Chunk by chunk, every chunk non-empty, so that every shard completes."""
    shape, chunks = (64, 64), (16, 16)
    data = sample(shape, "uint8", 30, holes=False)
    a = zarr_array(root, "counted", shape, chunks, "uint8")
    for r in regions(shape, chunks):
        a[r] = data[r]
    save(out, "counted", data)
    print("ok")


def ts_counted(root, out):
    """tensorstore with its defaults (a lock file, fsync of every chunk file and its
    directory), chunk by chunk and whole-array; every chunk non-empty, so every shard
    completes: 64x64 in 16x16 chunks (4 shards of 2x2) and 32x32 in 8x8 chunks (1 shard of
    4x4) written whole."""
    shape, chunks = (64, 64), (16, 16)
    data = sample(shape, "uint8", 31, holes=False)
    t = ts.open(ts_spec(os.path.join(root, "ts_counted"), shape, chunks, "uint8"),
                create=True, delete_existing=True).result()
    for r in regions(shape, chunks):
        t[r].write(data[r]).result()
    save(out, "ts_counted", data)
    whole = sample((32, 32), "uint8", 32, holes=False)
    t = ts.open(ts_spec(os.path.join(root, "ts_counted_whole"), (32, 32), (8, 8), "uint8"),
                create=True, delete_existing=True).result()
    t[...] = whole
    save(out, "ts_counted_whole", whole)
    print("ok")


def sparse(root, out):
    """Skipping empty chunks: some shards never see all their positions written."""
    shape, chunks = (64, 64), (16, 16)
    data = sample(shape, "uint8", 31)
    a = zarr_array(root, "sparse", shape, chunks, "uint8")
    a[...] = data
    save(out, "sparse", data)
    print("ok")


def hierarchy(root, out):
    """A group with arrays, consolidated through the mount: BACKING's group document must
    describe the sharded arrays, or native readers would misread them."""
    g = zarr.open_group(os.path.join(root, "h"), mode="w", attributes={"about": "h"})
    sub = g.create_group("sub")
    for parent, name, shape in ((g, "x", (40, 30)), (sub, "y", (25,))):
        chunks = tuple(max(1, s // 4) for s in shape)
        a = parent.create_array(name, shape=shape, chunks=chunks, dtype="float64",
                                fill_value=0.0, dimension_names=["i", "j"][:len(shape)])
        data = sample(shape, "float64", len(name) + 50)
        a[...] = data
        full = name if parent is g else "sub/" + name
        save(out, "h_" + full.replace("/", "_"), data)
    zarr.consolidate_metadata(os.path.join(root, "h"))
    print("ok")


def check_hierarchy(root, out):
    g = zarr.open_consolidated(os.path.join(root, "h"), mode="r")
    for full in ("x", "sub/y"):
        arr = g[full]
        if arr.shards is None:
            sys.exit(f"{full}: consolidated metadata in BACKING says unsharded")
        expected = np.load(os.path.join(out, "h_" + full.replace("/", "_") + ".npy"))
        if not np.array_equal(arr[...], expected):
            sys.exit(f"{full}: differs")
    print("ok")


def spread(root, out):
    """One chunk into each of many shards, none complete: only memory pressure writes."""
    shape, chunks = (64, 64), (8, 8)
    data = np.zeros(shape, "uint8")
    a = zarr_array(root, "spread", shape, chunks, "uint8")
    for i in range(0, 64, 16):
        for j in range(0, 64, 16):
            data[i:i + 8, j:j + 8] = (i + j) // 8 + 1
            a[i:i + 8, j:j + 8] = data[i:i + 8, j:j + 8]
    save(out, "spread", data)
    print("ok")


def fill_up(root, out):
    """Writes chunk by chunk until the backing store is full; saves what was written before
    the failing region. (A shard that could not be written keeps its chunks pending in the
    mount, and the next chunk renamed into the array is refused, never reaching it.)"""
    shape, chunks = (1024, 1024), (256, 256)
    data = sample(shape, "uint8", 40, holes=False)
    a = zarr_array(root, "full", shape, chunks, "uint8")
    expected = np.zeros(shape, "uint8")
    failed = None
    for k, r in enumerate(regions(shape, chunks)):
        try:
            a[r] = data[r]
        except OSError as e:
            failed = (k, e.errno, str(e))
            break
        expected[r] = data[r]
    save(out, "full", expected)
    print(json.dumps({"failed_region": failed and failed[0],
                      "errno": failed and failed[1],
                      "enospc": failed is not None and failed[1] == errno.ENOSPC,
                      "message": failed and failed[2]}))


if __name__ == "__main__":
    scenario, root, out = sys.argv[1:4]
    {"zarr-python": zarr_python, "tensorstore": tensorstore, "counted": counted, "ts-counted": ts_counted,
     "sparse": sparse, "fill-up": fill_up, "hierarchy": hierarchy,
     "check-hierarchy": check_hierarchy, "spread": spread}[scenario](root, out)

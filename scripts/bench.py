"""Benchmarks of shardfs against the native writers, run by scripts/bench.sh.

    bench.py all   --shardfs BIN [--quick] [--runs N] [--markdown FILE] [--parts P,..]
                   [--only NAME]                                          (bench_matrix.py)
    bench.py read  --shardfs BIN --dir DIR [--runs N]
    bench.py write --shardfs BIN --dir DIR [--runs N]
    bench.py fsync --shardfs BIN --dir DIR [--runs N]

`read`: a 512^3 uint8 array, sharded, read whole: zarr-python and tensorstore natively from
BACKING, and through the mount (the unsharded view). `write`: scenario S3 (512^3 uint8,
64^3 chunks, 512 chunks per shard, one 64^3 region at
a time in C order): native unsharded, native sharded, and unsharded through the mount
including the unmount. `fsync`: tensorstore with its defaults (an fsync of every chunk file
and its directory) in S1 (the whole 512^3 array at once, 128^3 chunks, 64 per shard), S2
(384^3 chunk by chunk, 48^3 chunks, 512 per shard) and S3: native unsharded against the
mount (the journal makes those fsyncs cheap), unmount included. Medians of N runs; ratios
are against the same run's native figures.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import tensorstore as ts
import zarr

import bench_matrix

warnings.filterwarnings("ignore")

N = 512


def data():
    return np.random.default_rng(0).integers(0, 256, size=(N, N, N), dtype=np.uint8)


def median_time(fn, runs, setup=None):
    times = []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


class Mount:
    def __init__(self, shardfs, backing, mountpoint, extra=()):
        self.shardfs, self.mountpoint = shardfs, mountpoint
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run([shardfs, "mount", backing, mountpoint, *extra], check=True)

    def unmount(self):
        subprocess.run([self.shardfs, "unmount", self.mountpoint], check=True)


def zarr_read(path):
    return zarr.open_array(path, mode="r")[...]


def ts_read(path):
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}},
                   open=True).result().read().result()


def bench_read(args):
    """Native and mounted reads alternate, and every mounted read is the first one after a
    fresh mount (an empty page cache on the mount's side, a warm one on BACKING's, as for
    the native read)."""
    results = {}
    arr = data()
    for chunk, shard in ((64, 256), (128, 512)):
        name = f"read_c{chunk}_s{shard}"
        backing = os.path.join(args.dir, name)
        shutil.rmtree(backing, ignore_errors=True)
        a = zarr.create_array(os.path.join(backing, "a"), shape=arr.shape, chunks=(chunk,) * 3,
                              shards=(shard,) * 3, dtype="uint8", compressors=None,
                              fill_value=0)
        a[...] = arr
        mnt = os.path.join(args.dir, "mnt")
        row = {}
        for client, fn in (("zarr-python", zarr_read), ("tensorstore", ts_read)):
            native, mounted = [], []
            for i in range(args.runs):
                t = time.perf_counter()
                fn(os.path.join(backing, "a"))
                native.append(time.perf_counter() - t)
                m = Mount(args.shardfs, backing, mnt)
                try:
                    t = time.perf_counter()
                    got = fn(os.path.join(mnt, "a"))
                    mounted.append(time.perf_counter() - t)
                    if i == 0:
                        assert np.array_equal(got, arr), "mount read differs"
                finally:
                    m.unmount()
            row[client] = {"native_sharded_s": statistics.median(native),
                           "mount_s": statistics.median(mounted),
                           "ratio": statistics.median(mounted) / statistics.median(native)}
        results[name] = row
    return results


def regions():
    c = 64
    for i in range(0, N, c):
        for j in range(0, N, c):
            for k in range(0, N, c):
                yield (slice(i, i + c), slice(j, j + c), slice(k, k + c))


def zarr_write(path, arr, shards):
    a = zarr.create_array(path, shape=arr.shape, chunks=(64,) * 3, shards=shards,
                          dtype="uint8", compressors=None, fill_value=0, overwrite=True)
    for r in regions():
        a[r] = arr[r]


def ts_writer(sync):
    def ts_write(path, arr, shards):
        codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if shards:
            codecs = [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [64] * 3, "codecs": codecs}}]
        t = ts.open({"driver": "zarr3",
                     "kvstore": {"driver": "file", "path": path,
                                 "file_io_sync": sync},
                     "metadata": {"shape": list(arr.shape), "data_type": "uint8",
                                  "chunk_grid": {"name": "regular", "configuration": {
                                      "chunk_shape": list(shards or (64,) * 3)}},
                                  "codecs": codecs, "fill_value": 0}},
                    create=True, delete_existing=True).result()
        for r in regions():
            t[r].write(arr[r]).result()
    return ts_write


def bench_write(args):
    """Scenario S3: native unsharded and sharded, and unsharded through the mount with 512
    chunks per shard (8 per axis), the unmount included. tensorstore runs with its
    default (a file and directory fsync per chunk, which the mount's journal absorbs) and
    with file_io_sync off."""
    arr = data()
    results = {}
    clients = (("zarr-python", zarr_write, args.runs),
               ("tensorstore", ts_writer(True), args.runs),
               ("tensorstore file_io_sync=false", ts_writer(False), args.runs))
    for client, fn, runs in clients:
        row = {}
        target = os.path.join(args.dir, "w")

        def clean():
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)

        row["native_unsharded_s"], _ = median_time(
            lambda: fn(os.path.join(target, "a"), arr, None), args.runs, clean)
        if not args.skip_native_sharded and client != "tensorstore file_io_sync=false":
            row["native_sharded_s"], _ = median_time(
                lambda: fn(os.path.join(target, "a"), arr, (N,) * 3), 1, clean)
        mnt = os.path.join(args.dir, "mnt")
        counts = []

        def through_mount():
            m = Mount(args.shardfs, target, mnt, ["--chunks-per-shard", "8"])
            try:
                fn(os.path.join(mnt, "a"), arr, None)
                stats = subprocess.run([args.shardfs, "stats", mnt], check=True,
                                       capture_output=True, text=True).stdout
                counts.append(json.loads(stats))
            finally:
                m.unmount()

        row["mount_s"], _ = median_time(through_mount, runs, clean)
        row["ratio_vs_native_unsharded"] = row["mount_s"] / row["native_unsharded_s"]
        if "native_sharded_s" in row:
            row["speedup_vs_native_sharded"] = row["native_sharded_s"] / row["mount_s"]
        row["shard_writes"] = [c.get("shards_written") for c in counts]
        row["partial_writes"] = [c.get("partial_writes") for c in counts]
        row["merges"] = [c.get("merges") for c in counts]
        got = zarr.open_array(os.path.join(target, "a"), mode="r")[...]
        assert np.array_equal(got, arr), "what the mount wrote differs"
        results[client] = row
        print(json.dumps({client: row}), file=sys.stderr, flush=True)
    return results


def ts_fsync_scenario(n, chunk, whole, sharded=False):
    """tensorstore, defaults, writing an n^3 uint8 array in `chunk`^3 chunks: whole, or
    one chunk-sized region at a time in C order. `sharded`: natively, into one n^3 shard."""
    arr = np.random.default_rng(1).integers(0, 256, size=(n,) * 3, dtype=np.uint8)
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
    grid = [chunk] * 3
    if sharded:
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [chunk] * 3, "codecs": codecs}}]
        grid = [n] * 3

    def write(path):
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                     "metadata": {"shape": [n] * 3, "data_type": "uint8",
                                  "chunk_grid": {"name": "regular", "configuration": {
                                      "chunk_shape": grid}},
                                  "codecs": codecs, "fill_value": 0}},
                    create=True, delete_existing=True).result()
        if whole:
            t[...] = arr
            return
        for i in range(0, n, chunk):
            for j in range(0, n, chunk):
                for k in range(0, n, chunk):
                    t[i:i + chunk, j:j + chunk, k:k + chunk].write(
                        arr[i:i + chunk, j:j + chunk, k:k + chunk]).result()
    return write


def bench_fsync(args):
    scenarios = {"S1 whole 512^3, 128^3 chunks, 64 per shard": (512, 128, True, "4"),
                 "S2 384^3 chunk by chunk, 48^3 chunks, 512 per shard": (384, 48, False, "8"),
                 "S3 512^3 chunk by chunk, 64^3 chunks, 512 per shard": (512, 64, False, "8")}
    results = {}
    for name, (n, chunk, whole, cps) in scenarios.items():
        write = ts_fsync_scenario(n, chunk, whole)
        target = os.path.join(args.dir, "f")
        mnt = os.path.join(args.dir, "mnt")

        def clean():
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)

        counts = []

        def through_mount():
            m = Mount(args.shardfs, target, mnt, ["--chunks-per-shard", cps])
            try:
                write(os.path.join(mnt, "a"))
                counts.append(json.loads(subprocess.run(
                    [args.shardfs, "stats", mnt], check=True, capture_output=True,
                    text=True).stdout))
            finally:
                m.unmount()

        # Interleaved, so that the machine's moods fall on both alike.
        native, mounted = [], []
        for _ in range(args.runs):
            native.append(median_time(lambda: write(os.path.join(target, "a")), 1, clean)[0])
            mounted.append(median_time(through_mount, 1, clean)[0])
        row = {"native_unsharded_s": statistics.median(native),
               "mount_s": statistics.median(mounted),
               "native_runs": native, "mount_runs": mounted,
               "shard_writes": [c.get("shards_written") for c in counts],
               "merges": [c.get("merges") for c in counts],
               "journaled_chunks": [c.get("journaled_chunks") for c in counts],
               "group_commits": [c.get("group_commits") for c in counts]}
        row["ratio_vs_native_unsharded"] = row["mount_s"] / row["native_unsharded_s"]
        if name.startswith("S3") and not args.skip_native_sharded:
            # Once: tensorstore rewrites the shard for every chunk (a minute and more).
            sharded = ts_fsync_scenario(n, chunk, whole, sharded=True)
            row["native_sharded_s"] = median_time(
                lambda: sharded(os.path.join(target, "a")), 1, clean)[0]
            row["speedup_vs_native_sharded"] = row["native_sharded_s"] / row["mount_s"]
        results[name] = row
        print(json.dumps({name: row}), file=sys.stderr, flush=True)
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["all", "read", "write", "fsync"])
    p.add_argument("--shardfs", required=True)
    p.add_argument("--dir", default=None)
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--skip-native-sharded", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="all: a small version, to check the driver rather than the speed")
    p.add_argument("--markdown", default=None, help="all: also write a markdown table here")
    p.add_argument("--parts", default=None,
                   help="all: only these parts, comma-separated (scenarios, read_s1, plain_files, "
                        "per_shard, per_array)")
    p.add_argument("--mount-args", default="",
                   help="all: more arguments for every mount of the scenarios (one string)")
    p.add_argument("--only", default=None,
                   help="all: only the scenarios whose name contains this (e.g. 'S2 tensorstore')")
    args = p.parse_args()
    if args.runs is None:
        # 9 interleaved rounds for the matrix: fewer cannot tell 1.25x from 1.6x here.
        args.runs = 1 if args.quick else (9 if args.what == "all" else 5)
    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="shardfs-bench-", dir="/var/tmp")
    try:
        run = {"all": bench_matrix.run_all, "read": bench_read, "write": bench_write,
               "fsync": bench_fsync}[args.what]
        results = run(args)
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    from importlib.metadata import version
    out = {"what": args.what, "runs": args.runs, "zarr": version("zarr"),
           "tensorstore": version("tensorstore"), "numpy": version("numpy"),
           "results": results}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())

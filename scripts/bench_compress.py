"""Benchmark of transparent zstd (run by `scripts/bench.sh compress`): zarr-python writes
smooth float32 (a sum of sines, as a simulation field) raw through a mount with
`--compress zstd`, against zarr-python writing the same array natively, sharded the same
way, with its own zstd; with, for scale, the mount without `--compress` and native
zarr-python unsharded with its own zstd.

    bench_compress.py --shardfs BIN [--dir DIR] [--rounds N] [--quick]

Two ways of writing: the whole array in one call (zarr-python then writes each shard once,
its best case), and chunk by chunk (one call per chunk, as acquisition software writes:
a native sharded writer rewrites the shard at each one). Each run is timed until the data
is on disk (for a mount: mount, write, unmount, `sync`); the runs of a round go in turn
(interleaved, so that the VM's drift hits all alike). Reports the median and spread (min-
max) per variant over the rounds, the median of per-round ratios to the native sharded
zstd writer, and the stored size.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

CHUNK = 64
SHARD = 256  # 4 x 4 x 4 chunks per shard


def field(n):
    x = np.linspace(0, 4 * np.pi, n, dtype=np.float32)
    return (np.sin(x)[:, None, None] * np.cos(x)[None, :, None]
            + 0.5 * np.sin(2 * x)[None, None, :]).astype(np.float32)


def write(path, data, how, compressors, shards):
    import zarr
    a = zarr.create_array(path, shape=data.shape, chunks=(CHUNK,) * 3, shards=shards,
                          dtype="float32", compressors=compressors, fill_value=0)
    if how == "whole":
        a[...] = data
        return
    n = data.shape[0] // CHUNK
    for i in range(n):
        for j in range(n):
            for k in range(n):
                s = tuple(slice(c * CHUNK, (c + 1) * CHUNK) for c in (i, j, k))
                a[s] = data[s]


def stored_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def native(args, data, how, sharded, out):
    import zarr
    zstd = zarr.codecs.ZstdCodec(level=3)
    start = time.perf_counter()
    write(out, data, how, zstd, (SHARD,) * 3 if sharded else None)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def mounted(args, data, how, compress, out):
    mnt = os.path.join(args.dir, "mnt")
    os.makedirs(out)
    os.makedirs(mnt, exist_ok=True)
    opts = ["--chunks-per-shard", str(SHARD // CHUNK)] + (["--compress", "zstd"] if compress else [])
    start = time.perf_counter()
    subprocess.run([args.shardfs, "mount", out, mnt, *opts], check=True)
    try:
        write(os.path.join(mnt, "a"), data, how, None, None)
    finally:
        subprocess.run([args.shardfs, "unmount", mnt], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


VARIANTS = {
    "zarr-python sharded, its own zstd": lambda a, d, h, o: native(a, d, h, True, o),
    "mount --compress zstd, zarr-python raw": lambda a, d, h, o: mounted(a, d, h, True, o),
    "mount, zarr-python raw (no compression)": lambda a, d, h, o: mounted(a, d, h, False, o),
    "zarr-python unsharded, its own zstd": lambda a, d, h, o: native(a, d, h, False, o),
}
BASE = "zarr-python sharded, its own zstd"


def bench(args, data, how):
    out = os.path.join(args.dir, "out")
    times = {v: [] for v in VARIANTS}
    sizes = {}
    for r in range(args.rounds):
        for name, run in VARIANTS.items():
            shutil.rmtree(out, ignore_errors=True)
            times[name].append(run(args, data, how, out))
            sizes[name] = stored_bytes(out)
        shutil.rmtree(out, ignore_errors=True)
        print(f"{how} round {r + 1}: " +
              ", ".join(f"{v} {times[v][-1]:.2f} s" for v in VARIANTS), file=sys.stderr)
    row = {}
    for name, ts in times.items():
        ratios = [t / b for t, b in zip(ts, times[BASE])]
        row[name] = {"median_s": round(statistics.median(ts), 3),
                     "min_s": round(min(ts), 3), "max_s": round(max(ts), 3),
                     "ratio_to_native_sharded": round(statistics.median(ratios), 2),
                     "stored_bytes": sizes[name],
                     "size_ratio": round(data.nbytes / sizes[name], 2)}
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shardfs", required=True)
    p.add_argument("--dir", default="/var/tmp/shardfs-bench-compress")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    import zarr
    n = 256 if args.quick else 512
    data = field(n)
    results = {"array": f"{n}^3 float32 ({data.nbytes >> 20} MiB), chunks 64^3, "
                        f"shards 256^3", "zarr": zarr.__version__}
    for how in ("whole", "chunk by chunk"):
        results[how] = bench(args, data, how)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

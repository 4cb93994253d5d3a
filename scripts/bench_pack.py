"""Benchmark of `shardfs pack` (run by `scripts/bench.sh pack`): existing unsharded arrays
into shards, against the floor (`cp -r` of the same bytes: one read and one write), against
`zarrs_reencode` (crate zarrs_tools: decodes and re-encodes every chunk), and against
`cp -r` into a mount (the mount packs as the files arrive). Then `--compress zstd` on
smooth float32 data: the stored size and the throughput.

    bench_pack.py --shardfs BIN --zarrs-reencode BIN [--dir DIR] [--rounds N] [--quick]

Cases: 10^5 chunk files of 32^3 uint8 (3.3 GB, 512 chunks per shard) and 10^3 chunks of
128^3 uint8 (2.1 GB, 64 per shard), raw random bytes (nothing to compress); and the 10^3
chunks of 128^3 compressed with zstd (sparse data, about 3x smaller), where a
re-encoder must decompress and compress every chunk; written as zarr-python lays them
out. Every round runs each tool once, in turn (interleaved, so that
the VM's drift hits all alike), on the same source, each timed until its output is on
disk (`sync` included); the output is removed between runs, outside the timing. Reports,
per tool, the median time and its spread (min-max) over the rounds, and the median of
the per-round ratios to `cp -r`.
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

CASES = {
    # name: (chunk edge, chunk grid, chunks per shard on each axis, zstd-compressed)
    "1e5 x 32^3 uint8": (32, (50, 50, 40), 8, False),
    "1e3 x 128^3 uint8": (128, (10, 10, 10), 4, False),
    "1e3 x 128^3 uint8, zstd": (128, (10, 10, 10), 4, True),
}
QUICK = {
    "1e4 x 32^3 uint8": (32, (25, 20, 20), 8, False),
    "1e2 x 128^3 uint8": (128, (5, 5, 4), 4, False),
    "1e2 x 128^3 uint8, zstd": (128, (5, 5, 4), 4, True),
}


def write_source(path, edge, grid, compressed=False):
    """An unsharded uint8 array of raw chunks (or, `compressed`, of zstd-compressed chunks
    of sparse data, three bytes in four zero: about 3x smaller), the files as zarr-python
    writes them."""
    shape = [edge * g for g in grid]
    meta = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [edge] * 3}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}
    if compressed:
        import numcodecs
        meta["codecs"].append({"name": "zstd", "configuration": {"level": 3, "checksum": False}})
        zstd = numcodecs.Zstd(level=3)
    os.makedirs(path)
    with open(os.path.join(path, "zarr.json"), "w") as f:
        json.dump(meta, f)
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size=64 << 20, dtype=np.uint8)
    if compressed:
        pool = np.where(pool % 4 == 0, pool, 0).astype(np.uint8)  # 3 in 4 bytes zero
    pool = pool.tobytes()
    size = edge ** 3
    n = 0
    for i in range(grid[0]):
        for j in range(grid[1]):
            d = os.path.join(path, "c", str(i), str(j))
            os.makedirs(d)
            for k in range(grid[2]):
                at = (n * 7919 * 4096) % (len(pool) - size)
                chunk = pool[at:at + size]
                with open(os.path.join(d, str(k)), "wb") as f:
                    f.write(zstd.encode(chunk) if compressed else chunk)
                n += 1
    subprocess.run(["sync"], check=True)


def timed(cmd, out):
    """Seconds until `cmd` is done and its output on disk; then the output goes."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["sync"], check=True)
    took = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    return took


def through_mount(shardfs, src, backing, mnt, cps):
    """`cp -r` into a fresh mount, until the unmount is done and BACKING is on disk."""
    os.makedirs(backing)
    os.makedirs(mnt, exist_ok=True)
    start = time.perf_counter()
    subprocess.run([shardfs, "mount", backing, mnt, "--chunks-per-shard", str(cps)],
                   check=True)
    try:
        subprocess.run(["cp", "-r", src, os.path.join(mnt, "a")], check=True)
    finally:
        subprocess.run([shardfs, "unmount", mnt], check=True)
    subprocess.run(["sync"], check=True)
    took = time.perf_counter() - start
    shutil.rmtree(backing)
    subprocess.run(["sync"], check=True)
    return took


def spread(times):
    return {"median_s": round(statistics.median(times), 3),
            "min_s": round(min(times), 3), "max_s": round(max(times), 3)}


def bench_case(args, name, edge, grid, cps, compressed):
    src = os.path.join(args.dir, "src")
    shutil.rmtree(src, ignore_errors=True)
    write_source(src, edge, grid, compressed)
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    out = os.path.join(args.dir, "out")
    shard = ",".join([str(edge * cps)] * 3)
    tools = {
        "cp -r": lambda: timed(["cp", "-r", src, out], out),
        "shardfs pack": lambda: timed([args.shardfs, "pack", src, out,
                                       "--chunks-per-shard", str(cps)], out),
        "zarrs_reencode": lambda: timed([args.zarrs_reencode, "--shard-shape", shard,
                                         src, out], out),
        "cp -r into a mount": lambda: through_mount(args.shardfs, src, out,
                                                    os.path.join(args.dir, "mnt"), cps),
    }
    times = {t: [] for t in tools}
    for r in range(args.rounds):
        for tool, run in tools.items():
            times[tool].append(run())
        print(f"{name} round {r + 1}: " +
              ", ".join(f"{t} {times[t][-1]:.2f} s" for t in tools), file=sys.stderr)
    floor = times["cp -r"]
    row = {}
    for tool, ts in times.items():
        ratios = [t / f for t, f in zip(ts, floor)]
        row[tool] = {**spread(ts), "ratio_to_cp": round(statistics.median(ratios), 2),
                     "ratio_min": round(min(ratios), 2), "ratio_max": round(max(ratios), 2)}
    shutil.rmtree(src)
    nbytes = edge ** 3 * int(np.prod(grid))
    return {"chunks": int(np.prod(grid)), "bytes": nbytes, "stored_bytes": stored,
            "chunks_per_shard": cps ** 3, "tools": row}


def bench_compress(args):
    """Smooth float32 (a sum of sines, as a simulation field), raw chunks of 64^3: stored
    size and time of `pack --compress zstd` against a plain pack of the same array."""
    import zarr
    src = os.path.join(args.dir, "smooth")
    shutil.rmtree(src, ignore_errors=True)
    n = 256 if args.quick else 512
    x = np.linspace(0, 4 * np.pi, n, dtype=np.float32)
    field = (np.sin(x)[:, None, None] * np.cos(x)[None, :, None]
             + 0.5 * np.sin(2 * x)[None, None, :]).astype(np.float32)
    a = zarr.create_array(src, shape=field.shape, chunks=(64,) * 3, dtype="float32",
                          compressors=None, fill_value=0)
    a[...] = field
    subprocess.run(["sync"], check=True)
    raw = field.nbytes
    out = os.path.join(args.dir, "out")
    row = {"array_bytes": raw}
    for label, extra in (("pack", []), ("pack --compress zstd", ["--compress", "zstd"]),
                         ("pack --compress zstd:9", ["--compress", "zstd:9"])):
        times, stored = [], 0
        for _ in range(args.rounds):
            start = time.perf_counter()
            subprocess.run([args.shardfs, "pack", src, out, "--chunks-per-shard", "4", *extra],
                           check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
            stored = sum(os.path.getsize(os.path.join(d, f))
                         for d, _, fs in os.walk(out) for f in fs)
            shutil.rmtree(out)
        row[label] = {**spread(times), "stored_bytes": stored,
                      "ratio": round(raw / stored, 2),
                      "MiB_per_s": round(raw / statistics.median(times) / 2**20, 1)}
    shutil.rmtree(src)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shardfs", required=True)
    p.add_argument("--zarrs-reencode", required=True)
    p.add_argument("--dir", default="/var/tmp/shardfs-bench-pack")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    results = {}
    for name, (edge, grid, cps, compressed) in (QUICK if args.quick else CASES).items():
        results[name] = bench_case(args, name, edge, grid, cps, compressed)
    results["compress smooth float32"] = bench_compress(args)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

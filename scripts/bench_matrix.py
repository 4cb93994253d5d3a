"""The whole benchmark matrix, run by `scripts/bench.sh all [--quick] [--runs N]`.

In one run, for zarr-python and tensorstore (defaults: tensorstore fsyncs every chunk):

- S1-S3: 512^3 uint8, random. S1 writes the whole array at once in 128^3 chunks; S2 writes
  one 128^3 region at a time (64 chunks per shard); S3 one 64^3 region at a time (512 per
  shard). Each natively unsharded, natively sharded (one run: it is slow) and unsharded
  through the mount (mount and unmount included).
- S4: S1 and S2 on smooth float32 data with zstd.
- S5: reading S1's array, sharded: natively and through a fresh mount.
- chunks per shard: time per chunk writing chunk by chunk through the mount, with 8, 64,
  512 and 4096 chunks per shard.
- shards per array: latency of `stat`, and of open+read, of chunks not looked up before,
  and `find | wc -l`, over arrays of 10^2 to 10^5 shards.
- the daemon's peak RSS in every mounted run.

`--quick` runs a small version (128^3 arrays, up to 10^3 shards, one run) to check the
driver, not the speed. Output: JSON on stdout, a markdown table with `--markdown FILE`.
"""

import json
import os
import resource
import shutil
import statistics
import subprocess
import time

import numpy as np
import tensorstore as ts
import zarr


def sizes(quick):
    """(n, {scenario: (chunk, whole)}) for S1-S3."""
    if quick:
        return 128, {"S1": (32, True), "S2": (32, False), "S3": (16, False)}
    return 512, {"S1": (128, True), "S2": (128, False), "S3": (64, False)}


def regions(n, chunk):
    for i in range(0, n, chunk):
        for j in range(0, n, chunk):
            for k in range(0, n, chunk):
                yield (slice(i, i + chunk), slice(j, j + chunk), slice(k, k + chunk))


def zarr_writer(n, chunk, whole, shard=None, zstd=False):
    def write(path, arr):
        kw = {} if zstd else {"compressors": None}
        a = zarr.create_array(path, shape=arr.shape, chunks=(chunk,) * 3,
                              shards=(shard,) * 3 if shard else None, dtype=arr.dtype,
                              fill_value=0, overwrite=True, **kw)
        if whole:
            a[...] = arr
        else:
            for r in regions(n, chunk):
                a[r] = arr[r]
    return write


def ts_writer(n, chunk, whole, shard=None, zstd=False):
    def write(path, arr):
        codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if zstd:
            codecs.append({"name": "zstd", "configuration": {"level": 0}})
        grid = [chunk] * 3
        if shard:
            codecs = [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [chunk] * 3, "codecs": codecs}}]
            grid = [shard] * 3
        dtype = "float32" if arr.dtype == np.float32 else "uint8"
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                     "metadata": {"shape": [n] * 3, "data_type": dtype,
                                  "chunk_grid": {"name": "regular",
                                                 "configuration": {"chunk_shape": grid}},
                                  "codecs": codecs, "fill_value": 0}},
                    create=True, delete_existing=True).result()
        if whole:
            t[...] = arr
        else:
            for r in regions(n, chunk):
                t[r].write(arr[r]).result()
    return write


WRITERS = {"zarr-python": zarr_writer, "tensorstore": ts_writer}


def daemon_pid(mountpoint):
    """The daemon serving `mountpoint` (its command line names it)."""
    want = os.path.realpath(mountpoint).encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"mount" in cmd and any(os.path.realpath(c) == want for c in cmd if c):
            return int(p)
    return None


def peak_rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (its threads included)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds():
    """User + system CPU seconds of this process (the writer: its threads included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def stats_of(shardfs, mountpoint):
    return json.loads(subprocess.run([shardfs, "stats", mountpoint], check=True,
                                     capture_output=True, text=True).stdout)


class Mounted:
    """A mount for one run: stats, the daemon's CPU time and peak RSS are read before
    unmounting (after a flush, so that they include writing the last shards)."""

    def __init__(self, shardfs, backing, mountpoint, extra=()):
        self.shardfs, self.mountpoint = shardfs, mountpoint
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run([shardfs, "mount", backing, mountpoint, *extra], check=True)
        self.pid = daemon_pid(mountpoint)
        # The requests of mounting (and of this reading) are not the writer's.
        self.requests_before = stats_of(shardfs, mountpoint).get("fuse_requests", {})

    def finish(self, flush=False):
        if flush:
            subprocess.run([self.shardfs, "flush", self.mountpoint], check=True,
                           capture_output=True)
        stats = stats_of(self.shardfs, self.mountpoint)
        stats["daemon_cpu_s"] = cpu_seconds(self.pid)
        stats["requests_sent"] = requests_between(self.requests_before,
                                                  stats.get("fuse_requests", {}))
        rss = peak_rss_mib(self.pid)
        done = subprocess.run([self.shardfs, "unmount", self.mountpoint])
        if done.returncode != 0:
            # Never left mounted, whatever failed (a writer that died with files open).
            subprocess.run([self.shardfs, "unmount", "--lazy", "--give-up", self.mountpoint])
            raise RuntimeError(f"unmount of {self.mountpoint} failed: {done.returncode}")
        return stats, rss


def requests_between(before, after):
    """Requests of each kind sent between two stats readings (the second reading's own
    lookup, open and reads of the control file included: a handful)."""
    out = {}
    for kind, c in after.items():
        n = c["count"] - before.get(kind, {}).get("count", 0)
        if n:
            out[kind] = n
    return out


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def timed_cpu(fn):
    """(wall seconds, this process's CPU seconds) of `fn`."""
    c = own_cpu_seconds()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, own_cpu_seconds() - c


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def spread(xs):
    """median, min, max of a list of numbers."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def write_row(args, writer, arr, cps, n_chunk_shard, chunks, native_sharded=True):
    """Native unsharded and mounted times of one writer, interleaved round by round (the
    VM's speed drifts: a round's two runs see the same machine), with CPU times, the
    kernel's requests per chunk, and once the native sharded time."""
    target = os.path.join(args.dir, "w")
    mnt = os.path.join(args.dir, "mnt")
    rounds = []
    for _ in range(args.runs):
        fresh(target)
        native, native_cpu = timed_cpu(lambda: writer(None)(os.path.join(target, "a"), arr))
        fresh(target)
        t = time.perf_counter()
        c = own_cpu_seconds()
        extra = ["--chunks-per-shard", str(cps), *(getattr(args, "mount_args", "") or "").split()]
        m = Mounted(args.shardfs, target, mnt, extra)
        try:
            writer(None)(os.path.join(mnt, "a"), arr)
            writer_cpu = own_cpu_seconds() - c
        finally:
            stats, peak = m.finish(flush=True)
        rounds.append({"native_s": native, "native_cpu_s": native_cpu,
                       "mount_s": time.perf_counter() - t, "writer_cpu_s": writer_cpu,
                       "daemon_cpu_s": stats["daemon_cpu_s"], "rss": peak,
                       "writes": stats["shards_written"], "merges": stats["merges"],
                       "requests": stats["requests_sent"]})
    got = zarr.open_array(os.path.join(target, "a"), mode="r")[...]
    assert np.array_equal(got, arr), "what the mount wrote differs"
    row = summarize(rounds, chunks)
    if native_sharded:
        fresh(target)
        row["native_sharded_s"] = timed(
            lambda: writer(n_chunk_shard)(os.path.join(target, "a"), arr))
        row["mount_speedup_vs_native_sharded"] = row["native_sharded_s"] / row["mount_s"]
    return row


def summarize(rounds, chunks):
    """One row from the rounds: medians with their spread, the median of the per-round
    ratios, CPU times, requests per chunk (median round, by kind)."""
    col = lambda k: [r[k] for r in rounds]  # noqa: E731
    ratios = [r["mount_s"] / r["native_s"] for r in rounds]
    totals = [sum(r["requests"].values()) for r in rounds]
    mid = rounds[totals.index(sorted(totals)[len(totals) // 2])]
    row = {"native_unsharded_s": statistics.median(col("native_s")),
           "mount_s": statistics.median(col("mount_s")),
           "native_unsharded_spread": spread(col("native_s")),
           "mount_spread": spread(col("mount_s")),
           "ratio_vs_native_unsharded": statistics.median(ratios),
           "ratio_spread": spread(ratios),
           "native_cpu_s": statistics.median(col("native_cpu_s")),
           "writer_cpu_s": statistics.median(col("writer_cpu_s")),
           "daemon_cpu_s": statistics.median(col("daemon_cpu_s")),
           "rounds": len(rounds),
           "shard_writes": col("writes"), "merges": col("merges"),
           "daemon_peak_rss_mib": max(col("rss")),
           "requests_per_chunk": sum(mid["requests"].values()) / chunks,
           "requests_by_kind_per_chunk": {k: n / chunks for k, n in
                                          sorted(mid["requests"].items())}}
    return row


def scenarios(args):
    """S1-S4, both clients."""
    n, table = sizes(args.quick)
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, size=(n,) * 3, dtype=np.uint8)
    # Smooth data, so that zstd has something to do.
    x = np.linspace(0, 8 * np.pi, n, dtype=np.float32)
    f32 = (np.sin(x)[:, None, None] * np.cos(x)[None, :, None] + x[None, None, :] / 10)
    f32 = f32.astype(np.float32)
    out = {}
    jobs = [(name, chunk, whole, u8, False) for name, (chunk, whole) in table.items()]
    jobs += [(f"S4 ({name} float32 zstd)", table[name][0], table[name][1], f32, True)
             for name in ("S1", "S2")]
    for name, chunk, whole, arr, zstd in jobs:
        for client, make in WRITERS.items():
            if args.only and args.only not in f"{name} {client}":
                continue
            def writer(shard, make=make, chunk=chunk, whole=whole, zstd=zstd):
                return make(n, chunk, whole, shard, zstd)
            row = write_row(args, writer, arr, n // chunk, n, (n // chunk) ** 3)
            out[f"{name} {client}"] = row
            log(f"{name} {client}", row)
    return out


def read_s1(args):
    """S5: S1's array, sharded, read whole natively and through a fresh mount."""
    n, table = sizes(args.quick)
    arr = np.random.default_rng(0).integers(0, 256, size=(n,) * 3, dtype=np.uint8)
    out = {}
    # S1's 128^3 chunks (2 MiB), and 64^3 ones (256 KiB), sharded as in S1.
    for chunk in (table["S1"][0], table["S1"][0] // 2):
        out.update(read_one(args, n, chunk, arr))
    return out


def read_one(args, n, chunk, arr):
    backing = os.path.join(args.dir, "r")
    fresh(backing)
    zarr_writer(n, chunk, True, n)(os.path.join(backing, "a"), arr)
    readers = {
        "zarr-python": lambda p: zarr.open_array(p, mode="r")[...],
        "tensorstore": lambda p: ts.open({"driver": "zarr3", "kvstore": {
            "driver": "file", "path": p}}, open=True).result().read().result(),
    }
    mnt = os.path.join(args.dir, "mnt")
    out = {}
    for client, read in readers.items():
        native, mounted, rss = [], [], []
        for _ in range(args.runs):
            native.append(timed(lambda: read(os.path.join(backing, "a"))))
            m = Mounted(args.shardfs, backing, mnt)
            try:
                got = []
                mounted.append(timed(lambda: got.append(read(os.path.join(mnt, "a")))))
                assert np.array_equal(got[0], arr), "mount read differs"
            finally:
                rss.append(m.finish()[1])
        row = {"native_sharded_s": statistics.median(native),
               "mount_s": statistics.median(mounted), "daemon_peak_rss_mib": max(rss)}
        row["ratio"] = row["mount_s"] / row["native_sharded_s"]
        out[f"S5 read, {chunk}^3 chunks, {client}"] = row
        log(f"S5 {chunk} {client}", row)
    return out


def per_shard(args):
    """Time per chunk, writing chunk by chunk through the mount, by chunks per shard."""
    n, chunk = (32, 4) if args.quick else (512, 32)
    arr = np.random.default_rng(2).integers(0, 256, size=(n,) * 3, dtype=np.uint8)
    out = {}
    for cps in (2, 4, 8) if args.quick else (2, 4, 8, 16):
        chunks = (n // chunk) ** 3
        for client, make in WRITERS.items():
            row = write_row(args, lambda shard, make=make: make(n, chunk, False, shard), arr,
                            cps, None, chunks, native_sharded=False)
            row["chunks_per_shard"] = cps ** 3
            row["mount_ms_per_chunk"] = row["mount_s"] / chunks * 1e3
            row["native_unsharded_ms_per_chunk"] = row["native_unsharded_s"] / chunks * 1e3
            out[f"{cps ** 3} chunks per shard {client}"] = row
            log(f"cps {cps ** 3} {client}", row)
    return out


def build_shards(backing, shards):
    """A 2-D array of `shards` shards (2x2 chunks of 8x8 uint8 each), every shard file a
    copy of one written by zarr-python (fast to make at 10^5 shards)."""
    cols = min(shards, 100)
    rows = shards // cols
    path = os.path.join(backing, "a")
    a = zarr.create_array(path, shape=(rows * 16, cols * 16), chunks=(8, 8), shards=(16, 16),
                          dtype="uint8", compressors=None, fill_value=0)
    a[0:16, 0:16] = np.arange(256, dtype=np.uint8).reshape(16, 16)
    one = open(os.path.join(path, "c", "0", "0"), "rb").read()
    for i in range(rows):
        os.makedirs(os.path.join(path, "c", str(i)), exist_ok=True)
        for j in range(cols):
            with open(os.path.join(path, "c", str(i), str(j)), "wb") as f:
                f.write(one)
    return rows * 2, cols * 2  # the chunk grid


def native_chunk(shard_dir, i, j):
    """One chunk of shard (i, j) read natively: open, index (4 entries + crc), chunk."""
    with open(f"{shard_dir}/{i}/{j}", "rb") as f:
        f.seek(-(4 * 16 + 4), os.SEEK_END)
        index = f.read(4 * 16 + 4)
        offset, nbytes = int.from_bytes(index[0:8], "little"), int.from_bytes(index[8:16], "little")
        f.seek(offset)
        return f.read(nbytes)


def zarr_one_chunk(path, k):
    """zarr-python opens the array and reads the 8x8 chunk at chunk coordinates `k`."""
    a = zarr.open_array(path, mode="r")
    return a[k[0] * 8:(k[0] + 1) * 8, k[1] * 8:(k[1] + 1) * 8]


def latency(fn, keys):
    times = []
    for k in keys:
        t = time.perf_counter()
        fn(k)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def per_array(args):
    """Chunk latency and `find` by the number of shards in the array."""
    counts = getattr(args, "shard_counts", None) or (
        (100, 1000) if args.quick else (100, 1000, 10_000, 100_000))
    mnt = os.path.join(args.dir, "mnt")
    out = {}
    for shards in counts:
        backing = os.path.join(args.dir, f"s{shards}")
        fresh(backing)
        grid = build_shards(backing, shards)
        rng = np.random.default_rng(3)
        # Distinct rows: each stat also looks up a key directory never looked up before.
        rows = rng.permutation(grid[0])[:200]
        keys = [(int(r), int(rng.integers(0, grid[1]))) for r in rows]
        m = Mounted(args.shardfs, backing, mnt)
        try:
            a = os.path.join(mnt, "a", "c")
            # First, with nothing cached in the daemon: the listing of the top key
            # directory, whose entries grow with the array (its cost per entry should not).
            ls_s = timed(lambda: os.listdir(a))
            stat_ms = latency(lambda k: os.stat(f"{a}/{k[0]}/{k[1]}"), keys)
            read_ms = latency(lambda k: open(f"{a}/{k[0]}/{(k[1] + 1) % grid[1]}",
                                             "rb").read(), keys)
            find_s = timed(lambda: subprocess.run(f"find {mnt}/a | wc -l", shell=True,
                                                  check=True, capture_output=True))
            # As a user sees it: zarr-python opening the array and reading one chunk.
            zarr_ms = latency(lambda k: zarr_one_chunk(os.path.join(mnt, "a"), k), keys[:50])
        finally:
            _, rss = m.finish()
        native_find = timed(lambda: subprocess.run(f"find {backing}/a | wc -l", shell=True,
                                                   check=True, capture_output=True))
        # What a native reader does at the least for one chunk: open the shard file, read
        # its index (at the end), read the chunk.
        shard_dir = os.path.join(backing, "a", "c")
        native_read_ms = latency(lambda k: native_chunk(shard_dir, k[0] // 2, k[1] // 2), keys)
        native_zarr_ms = latency(lambda k: zarr_one_chunk(os.path.join(backing, "a"), k),
                                 keys[:50])
        chunks = grid[0] * grid[1]
        row = {"shards": shards, "chunks": chunks, "ls_top_ms": ls_s * 1e3,
               "ls_top_us_per_entry": ls_s / grid[0] * 1e6, "stat_ms": stat_ms, "open_read_ms": read_ms,
               "find_s": find_s, "find_us_per_chunk": find_s / chunks * 1e6,
               "native_find_s_over_shard_files": native_find,
               "native_sharded_open_read_ms": native_read_ms,
               "zarr_open_read_chunk_ms": zarr_ms, "native_zarr_open_read_chunk_ms": native_zarr_ms,
               "daemon_peak_rss_mib": rss}
        out[f"{shards} shards"] = row
        log(f"{shards} shards", row)
        shutil.rmtree(backing, ignore_errors=True)
    return out


def plain_io(path, size, write):
    """Writes (1 MiB writes, then fsync) or reads `size` bytes of the file at `path`."""
    block = bytes(range(256)) * 4096
    t = time.perf_counter()
    if write:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(size // len(block)):
            os.write(fd, block)
        os.fsync(fd)
    else:
        fd = os.open(path, os.O_RDONLY)
        while os.read(fd, 1 << 20):
            pass
    os.close(fd)
    return time.perf_counter() - t


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def plain_files(args):
    """A file outside every array (1 GiB; 128 MiB quick): written with fsync, read cold
    (caches dropped) and warm, natively and through a mount with and without FUSE
    passthrough, interleaved round by round."""
    size = (128 if args.quick else 1024) << 20
    mnt = os.path.join(args.dir, "mnt")
    backing = os.path.join(args.dir, "plain")
    how = {"native": None, "mount": [], "mount --no-passthrough": ["--no-passthrough"]}
    times = {(w, op): [] for w in how for op in ("write", "read cold", "read warm")}
    requests = {}
    for _ in range(args.runs):
        for where, extra in how.items():
            fresh(backing)
            m = Mounted(args.shardfs, backing, mnt, extra) if extra is not None else None
            try:
                path = os.path.join(mnt if m else backing, "f")
                times[(where, "write")].append(plain_io(path, size, True))
                drop_caches()
                times[(where, "read cold")].append(plain_io(path, size, False))
                times[(where, "read warm")].append(plain_io(path, size, False))
            finally:
                if m:
                    stats, _ = m.finish()
                    requests[where] = {k: v for k, v in stats["requests_sent"].items()
                                       if k in ("read", "write")}
                    requests[where]["passthrough"] = stats.get("passthrough")
    out = {}
    for (where, op), ts in times.items():
        row = {"s": statistics.median(ts), "spread": spread(ts),
               "gib_per_s": size / statistics.median(ts) / (1 << 30)}
        if where != "native":
            native = times[("native", op)]
            row["ratio"] = statistics.median([t / n for t, n in zip(ts, native)])
            row["requests"] = requests.get(where)
        out[f"{op}, {where}"] = row
        log(f"{op}, {where}", row)
    return out


def log(name, row):
    print(json.dumps({name: row}), file=__import__("sys").stderr, flush=True)


def run_all(args):
    results = {}
    wanted = (args.parts or "scenarios,read_s1,per_shard,per_array,plain_files").split(",")
    for part in (scenarios, read_s1, per_shard, per_array, plain_files):
        if part.__name__ in wanted:
            results[part.__name__] = part(args)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
    return results


def cell(r, name):
    """The time `name` of a row as 'median (min–max)'."""
    sp = r[f"{name}_spread"]
    return f"{sp['median']:.2f} s ({sp['min']:.2f}–{sp['max']:.2f})"


def markdown(results):
    lines = ["| scenario | native unsharded | native sharded | mount | mount / unsharded |"
             " CPU native / writer + daemon | requests per chunk | peak RSS |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.get("scenarios", {}).items():
        sharded = f"{r['native_sharded_s']:.2f} s" if "native_sharded_s" in r else "-"
        rs = r["ratio_spread"]
        lines.append(f"| {name} | {cell(r, 'native_unsharded')} | {sharded} | "
                     f"{cell(r, 'mount')} | {r['ratio_vs_native_unsharded']:.2f} "
                     f"({rs['min']:.2f}–{rs['max']:.2f}) | "
                     f"{r['native_cpu_s']:.2f} / {r['writer_cpu_s']:.2f} + "
                     f"{r['daemon_cpu_s']:.2f} s | {r['requests_per_chunk']:.1f} | "
                     f"{r['daemon_peak_rss_mib']:.0f} MiB |")
    if results.get("read_s1"):
        lines += ["", "| read | native sharded | mount | ratio | peak RSS |",
                  "|---|---|---|---|---|"]
    for name, r in results.get("read_s1", {}).items():
        lines.append(f"| {name} | {r['native_sharded_s']:.2f} s | {r['mount_s']:.2f} s | "
                     f"{r['ratio']:.2f} | {r['daemon_peak_rss_mib']:.0f} MiB |")
    if results.get("per_shard"):
        lines += ["", "| chunks per shard | client | mount ms/chunk | native unsharded ms/chunk |"
                  " peak RSS |", "|---|---|---|---|---|"]
    for name, r in results.get("per_shard", {}).items():
        client = name.split(" ")[-1]
        lines.append(f"| {r['chunks_per_shard']} | {client} | {r['mount_ms_per_chunk']:.3f} | "
                     f"{r['native_unsharded_ms_per_chunk']:.3f} | "
                     f"{r['daemon_peak_rss_mib']:.0f} MiB |")
    if results.get("plain_files"):
        lines += ["", "| plain file, 1 GiB | time | GiB/s | mount / native |", "|---|---|---|---|"]
        for name, r in results["plain_files"].items():
            sp = r["spread"]
            ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
            lines.append(f"| {name} | {r['s']:.2f} s ({sp['min']:.2f}–{sp['max']:.2f}) | "
                         f"{r['gib_per_s']:.2f} | {ratio} |")
    if results.get("per_array"):
        lines += ["", "| shards | chunks | stat | open+read | native sharded open+read |"
                  " zarr-python open array + read chunk (native sharded) | find |"
                  " find per chunk | native find (shard files) | ls c/ per entry | peak RSS |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.get("per_array", {}).values():
        lines.append(f"| {r['shards']} | {r['chunks']} | {r['stat_ms']:.3f} ms | "
                     f"{r['open_read_ms']:.3f} ms | {r['native_sharded_open_read_ms']:.3f} ms | "
                     f"{r['zarr_open_read_chunk_ms']:.2f} ms "
                     f"({r['native_zarr_open_read_chunk_ms']:.2f} ms) | "
                     f"{r['find_s']:.2f} s | "
                     f"{r['find_us_per_chunk']:.1f} us | "
                     f"{r['native_find_s_over_shard_files']:.2f} s | "
                     f"{r['ls_top_us_per_entry']:.0f} us | "
                     f"{r['daemon_peak_rss_mib']:.0f} MiB |")
    return "\n".join(lines) + "\n"

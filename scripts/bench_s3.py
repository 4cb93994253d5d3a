"""Writing Zarr to an S3-compatible server (a local moto server), chunk by chunk, three ways:
zarr-python unsharded straight to the server (through obstore), zarr-python sharded straight
to the server, and zarr-python unsharded through a shardfs mount of the bucket (which stores
it sharded; mount and unmount included). Also 8 writer threads on the same shards, straight
and through the mount. Prints JSON: seconds (medians), requests counted at the server by
method, and chunks lost.

    scripts/bench.sh s3 [--n 256] [--runs 3]      (or: bench_s3.py --shardfs BIN ...)

S2 here is 64^3 chunks, S3 32^3 chunks, both in 128^3 shards of a 256^3 uint8 array.
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import collections
import os
import re
import tempfile

import boto3
import numpy as np
import obstore.store
import zarr
import zarr.storage


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    def __init__(self):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port)).close()
                break
            except OSError:
                time.sleep(0.05)
        self.s3 = boto3.client("s3", endpoint_url=self.url, aws_access_key_id="t",
                               aws_secret_access_key="t", region_name="us-east-1")

    def bucket(self, name):
        self.s3.create_bucket(Bucket=name)
        return self.store(name)

    def store(self, name):
        return obstore.store.S3Store(name, endpoint=self.url, access_key_id="t",
                                     secret_access_key="t", region="us-east-1",
                                     client_options={"allow_http": True})

    def requests_since(self, offset):
        """Requests the server logged after `offset` bytes of its log, by method; and the
        log's new end."""
        with open(self.log.name, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        counts = collections.Counter(
            "LIST" if "list-type=" in target else method
            for method, target in re.findall(r'"(GET|PUT|POST|HEAD|DELETE) (\S+)', text))
        return dict(counts), offset + len(text.encode())

    def log_end(self):
        return os.path.getsize(self.log.name)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def regions(n, c):
    return [(slice(i, i + c), slice(j, j + c), slice(k, k + c))
            for i in range(0, n, c) for j in range(0, n, c) for k in range(0, n, c)]


def fill(a, n, chunk, data, workers):
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda r: a.__setitem__(r, data[r]), regions(n, chunk)))


def lost(read_back, n, chunk, data):
    return sum(1 for r in regions(n, chunk) if not np.array_equal(read_back[r], data[r]))


def direct(moto, name, n, chunk, shard, data, workers=1):
    """zarr-python straight to the server, sharded or not."""
    store = zarr.storage.ObjectStore(moto.bucket(name))
    start = moto.log_end()
    a = zarr.create_array(store, name="a", shape=(n,) * 3, chunks=(chunk,) * 3,
                          shards=None if shard is None else (shard,) * 3, dtype="uint8",
                          compressors=None, fill_value=0)
    t = time.perf_counter()
    fill(a, n, chunk, data, workers)
    seconds = time.perf_counter() - t
    requests, _ = moto.requests_since(start)
    back = zarr.open_array(store, path="a", mode="r")[...]
    return {"seconds": seconds, "requests": requests,
            "chunks_lost": lost(back, n, chunk, data)}


def mounted(moto, shardfs, name, n, chunk, shard, data, workers=1):
    """zarr-python unsharded through a shardfs mount of the bucket."""
    moto.bucket(name)
    env = dict(os.environ, AWS_ENDPOINT_URL=moto.url, AWS_ACCESS_KEY_ID="t",
               AWS_SECRET_ACCESS_KEY="t", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
    with tempfile.TemporaryDirectory() as tmp:
        mnt, cache = os.path.join(tmp, "mnt"), os.path.join(tmp, "cache")
        os.makedirs(mnt)
        start = moto.log_end()
        t = time.perf_counter()
        subprocess.run([shardfs, "mount", f"s3://{name}/data", mnt, "--cache-dir", cache,
                        "--chunks-per-shard", str(shard // chunk)], check=True, env=env)
        try:
            a = zarr.create_array(f"{mnt}/a", shape=(n,) * 3, chunks=(chunk,) * 3,
                                  dtype="uint8", compressors=None, fill_value=0)
            fill(a, n, chunk, data, workers)
        finally:
            subprocess.run([shardfs, "unmount", mnt], check=True)
        seconds = time.perf_counter() - t
    requests, _ = moto.requests_since(start)
    store = zarr.storage.ObjectStore(moto.store(name))
    back = zarr.open_array(store, path="data/a", mode="r")
    assert back.shards == (shard,) * 3, back.shards
    return {"seconds": seconds, "requests": requests,
            "chunks_lost": lost(back[...], n, chunk, data)}


def median_of(runs):
    return {**runs[0], "seconds": statistics.median(r["seconds"] for r in runs),
            "runs_seconds": [round(r["seconds"], 3) for r in runs],
            "chunks_lost": [r["chunks_lost"] for r in runs]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shardfs", required=True)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--shard", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    data = np.random.default_rng(1).integers(0, 255, (args.n,) * 3, dtype=np.uint8)
    moto = Moto()
    out = {"zarr": zarr.__version__, "n": args.n, "shard": args.shard}
    try:
        for label, chunk in (("S2", 64), ("S3", 32)):
            ways = {
                "unsharded, direct": lambda b, w: direct(moto, b, args.n, chunk, None, data, w),
                "sharded, direct": lambda b, w: direct(moto, b, args.n, chunk, args.shard, data,
                                                       w),
                "through the mount": lambda b, w: mounted(moto, args.shardfs, b, args.n, chunk,
                                                          args.shard, data, w),
            }
            rows = {}
            for way, run in ways.items():
                rows[way] = median_of([run(f"b{len(out)}-{len(rows)}-{i}", 1)
                                       for i in range(args.runs)])
            for way in ("sharded, direct", "through the mount"):
                rows[f"{way}, 8 writers"] = median_of(
                    [ways[way](f"b{len(out)}-w{way[:3]}-{i}", 8) for i in range(args.runs)])
            out[f"{label} ({chunk}^3 chunks)"] = rows
            print(json.dumps({label: rows}), file=sys.stderr, flush=True)
        print(json.dumps(out, indent=1))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()

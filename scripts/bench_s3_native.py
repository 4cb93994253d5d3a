"""What writing Zarr directly to an S3-compatible server costs, the baseline an object-store
mount is measured against: zarr-python (through obstore) writing chunk by chunk, sharded and
unsharded, to a local moto server. Prints JSON: seconds, PUTs and GETs (counted at the
server), and chunks lost when several writers share shards.

    bench_s3_native.py [--n 256] [--chunk 32] [--shard 128] [--runs 3]
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

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
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
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
        self.s3.put_bucket_versioning(Bucket=name,
                                      VersioningConfiguration={"Status": "Enabled"})
        return obstore.store.S3Store(name, endpoint=self.url, access_key_id="t",
                                     secret_access_key="t", region="us-east-1",
                                     client_options={"allow_http": True})

    def puts(self, bucket):
        """Every PUT that landed is a version."""
        n, kwargs = 0, {"Bucket": bucket}
        while True:
            r = self.s3.list_object_versions(**kwargs)
            n += len(r.get("Versions", []))
            if not r.get("IsTruncated"):
                return n
            kwargs.update(KeyMarker=r["NextKeyMarker"],
                          VersionIdMarker=r["NextVersionIdMarker"])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def regions(n, c):
    return [(slice(i, i + c), slice(j, j + c), slice(k, k + c))
            for i in range(0, n, c) for j in range(0, n, c) for k in range(0, n, c)]


def write(moto, name, n, chunk, shard, data, workers=1):
    store = zarr.storage.ObjectStore(moto.bucket(name))
    a = zarr.create_array(store, name="a", shape=(n,) * 3, chunks=(chunk,) * 3,
                          shards=None if shard is None else (shard,) * 3, dtype="uint8",
                          compressors=None, fill_value=0)
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda r: a.__setitem__(r, data[r]), regions(n, chunk)))
    seconds = time.perf_counter() - t
    back = zarr.open_array(store, path="a", mode="r")[...]
    lost = sum(1 for r in regions(n, chunk) if not np.array_equal(back[r], data[r]))
    return {"seconds": seconds, "puts": moto.puts(name), "chunks": len(regions(n, chunk)),
            "shards": (n // shard) ** 3 if shard else 0, "chunks_lost": lost}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--shard", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    data = np.random.default_rng(1).integers(0, 255, (args.n,) * 3, dtype=np.uint8)
    moto = Moto()
    try:
        out = {"zarr": zarr.__version__, "n": args.n, "chunk": args.chunk, "shard": args.shard}
        for label, shard, workers in (("unsharded", None, 1), ("sharded", args.shard, 1),
                                      ("sharded, 8 writers", args.shard, 8)):
            runs = [write(moto, f"b{i}-{label.replace(' ', '').replace(',', '-')}", args.n,
                          args.chunk, shard, data, workers) for i in range(args.runs)]
            out[label] = {**runs[0], "seconds": statistics.median(r["seconds"] for r in runs),
                          "chunks_lost": [r["chunks_lost"] for r in runs]}
        print(json.dumps(out, indent=1))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()

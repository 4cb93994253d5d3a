"""dask.distributed writing through a mount: a local cluster of worker processes stores a
dask array whose chunks are the Zarr chunks, many to a shard, so several workers write
chunks of the same shard at once. `check` reads BACKING natively, sharded.

    dask_writer.py write MOUNTED_ARRAY   /   dask_writer.py check BACKING_ARRAY
"""

import sys

import numpy as np
import zarr

SHAPE, CHUNKS = (256, 256, 64), (32, 32, 32)


def data():
    return np.random.default_rng(7).integers(1, 60000, size=SHAPE, dtype="uint16")


def write(path):
    import dask.array as da
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster):
        z = zarr.create_array(path, shape=SHAPE, chunks=CHUNKS, dtype="uint16",
                              fill_value=0, compressors=None)
        x = da.from_array(data(), chunks=CHUNKS)
        da.store(x, z, lock=False)


def check(path):
    a = zarr.open_array(path, mode="r")
    codecs = [c.to_dict()["name"] for c in a.metadata.codecs]
    assert codecs == ["sharding_indexed"], codecs
    shard = a.shards
    assert shard is not None and all(s > c for s, c in zip(shard, CHUNKS)), shard
    np.testing.assert_array_equal(a[...], data())


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])

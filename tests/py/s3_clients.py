"""The real clients on both sides of an object-store mount.

    s3_clients.py write-zarr PATH            zarr-python writes the array chunk by chunk (mount)
    s3_clients.py create-zarr PATH           ... only makes it; fill-zarr PATH [even|odd] only
                                             fills it (every chunk, or every other one)
    s3_clients.py write-ts PATH              tensorstore (file kvstore, fsyncs) the same
    s3_clients.py check-local PATH           zarr-python reads the array at PATH (a mount)
    s3_clients.py check-zarr URL KEY         zarr-python reads the bucket natively (obstore)
    s3_clients.py check-ts URL KEY           tensorstore reads it natively (s3 kvstore)
    s3_clients.py check-shared URL KEY       shared.py's array: chunk k holds k + 1
    s3_clients.py native-chunk URL KEY K     zarr-python writes chunk K of shared.py's array
                                             natively (a read-modify-write of its shard)

URL is the endpoint; the bucket is "shardfs-test"; KEY the array's key prefix.
"""

import os
import sys

import numpy as np

SHAPE, CHUNK = (128, 128, 128), (32, 32, 32)
BUCKET = "shardfs-test"


def data():
    return np.random.default_rng(1).integers(0, 255, SHAPE, dtype=np.uint8)


def regions():
    n = [s // c for s, c in zip(SHAPE, CHUNK)]
    for i in range(n[0]):
        for j in range(n[1]):
            for k in range(n[2]):
                yield tuple(slice(x * c, (x + 1) * c) for x, c in zip((i, j, k), CHUNK))


def create_zarr(path):
    import zarr
    return zarr.create_array(path, shape=SHAPE, chunks=CHUNK, dtype="uint8",
                             compressors=None, fill_value=0)


def fill_zarr(path, part="all", a=None):
    """Writes every chunk, or those whose index in C order is even or odd."""
    import zarr
    a = a if a is not None else zarr.open_array(path, mode="r+")
    d = data()
    for n, r in enumerate(regions()):
        if part == "all" or (n % 2 == 0) == (part == "even"):
            a[r] = d[r]


def write_zarr(path):
    fill_zarr(path, "all", create_zarr(path))


def write_ts(path):
    import tensorstore as ts
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                 "metadata": {"shape": list(SHAPE), "data_type": "uint8",
                              "chunk_grid": {"name": "regular",
                                             "configuration": {"chunk_shape": list(CHUNK)}},
                              "codecs": [{"name": "bytes"}]},
                 "create": True}).result()
    d = data()
    for r in regions():
        t[r].write(d[r]).result()


def check_local(path):
    import zarr
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data())


def done():
    """Ends the process once its work succeeded, without the interpreter's teardown:
    obstore's Tokio threads may still run then and abort the process (SIGABRT, no output)
    although everything asked of them is done. A failure still raises before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def native_store(url):
    """The bucket (container) at the server `url`: an S3 endpoint, `azurite:ENDPOINT`, or
    `gcs:ENDPOINT|SERVICE_ACCOUNT_FILE` (the XML layer in front of fake-gcs-server)."""
    import obstore.store
    import zarr.storage
    if url.startswith("gcs:"):
        endpoint, account = url[len("gcs:"):].split("|")
        return zarr.storage.ObjectStore(obstore.store.GCSStore(
            BUCKET, config={"base_url": endpoint, "service_account_path": account},
            client_options={"allow_http": True}))
    if url.startswith("azurite:"):
        os.environ["AZURITE_BLOB_STORAGE_URL"] = url[len("azurite:"):]
        return zarr.storage.ObjectStore(obstore.store.AzureStore(BUCKET, use_emulator=True))
    return zarr.storage.ObjectStore(obstore.store.S3Store(
        BUCKET, endpoint=url, access_key_id="testing", secret_access_key="testing",
        region="us-east-1", client_options={"allow_http": True}))


def check_zarr(url, key):
    import zarr
    a = zarr.open_array(native_store(url), path=key, mode="r")
    assert a.shards is not None and a.shards != a.chunks, (a.shards, a.chunks)
    np.testing.assert_array_equal(a[...], data())


def check_ts(url, key):
    import tensorstore as ts
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    t = ts.open({"driver": "zarr3", "kvstore": {
        "driver": "s3", "bucket": BUCKET, "path": key.rstrip("/") + "/", "endpoint": url,
        "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}}).result()
    np.testing.assert_array_equal(t.read().result(), data())


def check_shared(url, key):
    import zarr
    sys.path.insert(0, os.path.dirname(__file__))
    import shared
    a = zarr.open_array(native_store(url), path=key, mode="r")[...]
    n = shared.GRID[0] * shared.GRID[1]
    missing = [k for k in range(n) if not (a[shared.region(k)] == k + 1).all()]
    if missing:
        sys.exit(f"{len(missing)} of {n} chunks lost: {missing}")


def native_chunk(url, key, k):
    import zarr
    sys.path.insert(0, os.path.dirname(__file__))
    import shared
    a = zarr.open_array(native_store(url), path=key, mode="r+")
    a[shared.region(k)] = k + 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"write-zarr": write_zarr, "create-zarr": create_zarr, "fill-zarr": fill_zarr, "write-ts": write_ts, "check-zarr": check_zarr,
     "check-ts": check_ts, "check-shared": check_shared, "check-local": check_local,
     "native-chunk": lambda u, k, c: native_chunk(u, k, int(c))}[cmd](*args)
    done()

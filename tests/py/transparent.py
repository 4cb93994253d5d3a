"""Writers and readers for the transparent-zstd tests (tests/write_transparent.rs).

  transparent.py write DIR EXPECTED   raw arrays by zarr-python and tensorstore, one array
                                      with zarr-python's own zstd; what each should read as
                                      saved to EXPECTED as .npy
  transparent.py check DIR EXPECTED   every array reads as saved, in zarr-python and in
                                      tensorstore
"""

import os
import sys

import numpy as np
import tensorstore as ts
import zarr

# name: (shape, chunks, dtype, writer, zarr-python's compressors)
ARRAYS = {
    # Edge chunks cut by the shape; a 3-D integer array.
    "zp_raw": ((50, 70), (16, 16), "float32", "zarr", None),
    "zp_3d": ((20, 20, 20), (8, 8, 8), "int16", "zarr", None),
    # tensorstore fsyncs every chunk it writes: through the journal's bodies.
    "ts_raw": ((64, 48), (16, 16), "float32", "tensorstore", None),
    # A writer that compresses already: left as it is.
    "zp_own": ((50, 70), (16, 16), "float32", "zarr", "zstd"),
}


def field(shape, dtype):
    idx = np.indices(shape).sum(axis=0)
    return (np.sin(idx / 7.0) * 100).astype(dtype)


def ts_spec(path, shape=None, chunks=None, dtype=None):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}
    if shape is not None:
        spec["metadata"] = {
            "shape": list(shape),
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "fill_value": 0,
        }
        spec["create"] = True
    return spec


def write(root, expected):
    for name, (shape, chunks, dtype, writer, comp) in ARRAYS.items():
        path = os.path.join(root, name)
        x = field(shape, dtype)
        if writer == "tensorstore":
            t = ts.open(ts_spec(path, shape, chunks, dtype)).result()
            t.write(x).result()
            x[5, 7] = -3
            t[5, 7].write(-3).result()
        else:
            compressors = zarr.codecs.ZstdCodec(level=1) if comp else None
            a = zarr.create_array(path, shape=shape, chunks=chunks, dtype=dtype,
                                  compressors=compressors, fill_value=0)
            a[...] = x
            # Into a chunk already in its shard: read, changed, written back.
            idx = (3,) * len(shape)
            a[idx] = -1
            x[idx] = -1
            # A chunk of fill values only: zarr-python removes its file.
            corner = tuple(slice(0, c) for c in chunks)
            a[corner] = 0
            x[corner] = 0
        np.save(os.path.join(expected, name + ".npy"), x)


def check(root, expected):
    for name in ARRAYS:
        path = os.path.join(root, name)
        want = np.load(os.path.join(expected, name + ".npy"))
        got = zarr.open_array(path, mode="r")[...]
        assert np.array_equal(got, want), f"zarr-python reads {path} otherwise"
        got = ts.open(ts_spec(path)).result().read().result()
        assert np.array_equal(got, want), f"tensorstore reads {path} otherwise"
    print("equal", len(ARRAYS))


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2], sys.argv[3])

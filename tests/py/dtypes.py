"""The data-type matrix (tests/write_transparent.rs): one small array of every fixed-size
data type zarr-python writes, written natively and unsharded, copied into a mount and
read back.

  dtypes.py write SRC EXPECTED       an array per data type under SRC (zarr-python, raw,
                                     unsharded, chunks cut by the shape); what each holds
                                     saved to EXPECTED as .npy
  dtypes.py copy SRC DST ORDER       copies every array of SRC to DST: ORDER `doc-first`
                                     (zarr.json, then the chunk files) or `chunks-first`
                                     (the chunk files, then zarr.json, as a copy in another
                                     order than the writer's may do)
  dtypes.py check DIR EXPECTED       every array under DIR reads as saved (zarr-python)
  dtypes.py names                    the arrays' names, one a line
"""

import os
import shutil
import sys
import warnings

import numpy as np
import zarr

warnings.filterwarnings("ignore")

DTYPES = {
    "bool": "bool", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64", "float16": "float16", "float32": "float32",
    "float64": "float64", "complex64": "complex64", "complex128": "complex128",
    "datetime64": "datetime64[s]", "timedelta64": "timedelta64[ms]",
    "bytes7": "S7", "utf32x5": "U5", "void6": "V6",
    "structured": np.dtype([("a", "<i4"), ("b", "<f8")]),
}
SHAPE, CHUNKS = (10, 6), (4, 4)


def data(dtype):
    n = int(np.prod(SHAPE))
    raw = (np.arange(n, dtype=np.uint64) * 2654435761 % 251 + 1).astype(np.uint8)
    dt = np.dtype(dtype)
    out = np.zeros(n, dtype=dt)
    flat = out.view(np.uint8).reshape(n, dt.itemsize)
    for i in range(dt.itemsize):
        flat[:, i] = np.roll(raw, i)
    if dt.kind == "b":
        out = (raw % 2).astype(bool)
    elif dt.kind in "fc":
        out = (raw.astype(np.float64) / 7).astype(dt)
    elif dt.kind in "mM":
        out = raw.astype(np.int64).astype(dt)
    elif dt.kind == "U":
        out = np.array(["x" * (int(r) % 5 + 1) for r in raw], dtype=dt)
    elif dt.kind == "S":
        out = np.array([b"y" * (int(r) % 7 + 1) for r in raw], dtype=dt)
    return out.reshape(SHAPE)


def write(src, expected):
    os.makedirs(expected, exist_ok=True)
    for name, dtype in DTYPES.items():
        x = data(dtype)
        a = zarr.create_array(os.path.join(src, name), shape=SHAPE, chunks=CHUNKS,
                              dtype=dtype, compressors=None)
        a[...] = x
        np.save(os.path.join(expected, name + ".npy"), x, allow_pickle=False)


def copy(src, dst, order):
    for name in DTYPES:
        s, d = os.path.join(src, name), os.path.join(dst, name)
        os.makedirs(d)
        doc = lambda: shutil.copyfile(os.path.join(s, "zarr.json"), os.path.join(d, "zarr.json"))
        if order == "doc-first":
            doc()
        for root, _, files in sorted(os.walk(s)):
            rel = os.path.relpath(root, s)
            for f in sorted(files):
                if f == "zarr.json":
                    continue
                os.makedirs(os.path.join(d, rel), exist_ok=True)
                shutil.copyfile(os.path.join(root, f), os.path.join(d, rel, f))
        if order == "chunks-first":
            doc()


def check(root, expected):
    bad = []
    for name in DTYPES:
        want = np.load(os.path.join(expected, name + ".npy"), allow_pickle=False)
        try:
            got = zarr.open_array(os.path.join(root, name), mode="r")[...]
            if got.dtype != want.dtype or not np.array_equal(got, want):
                bad.append(f"{name}: differs")
        except Exception as e:
            bad.append(f"{name}: {type(e).__name__}: {e}")
    if bad:
        sys.exit("\n".join(bad))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"write": write, "copy": copy, "check": check,
     "names": lambda: print("\n".join(DTYPES))}[cmd](*args)

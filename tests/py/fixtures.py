"""Fixtures and independent checks for the Rust tests, written with the real clients.

Subcommands:
  native OUT          sharded arrays written natively by zarr-python and tensorstore, with
                      an independent (numpy) reading of every shard index in OUT/manifest.json
  unsharded OUT       unsharded arrays written by zarr-python; data saved as <array>.npy
  metadata OUT        zarr.json documents written by zarr-python and tensorstore
  check-read DIR NPY  read the array at DIR with zarr-python and tensorstore; compare to NPY
"""

import json
import math
import os
import sys
import warnings

import google_crc32c
import numpy as np
import tensorstore as ts
import zarr
from zarr.codecs import ZstdCodec

warnings.filterwarnings("ignore")

# name, writer, shape, inner chunk, shard, dtype, index location, zstd?, key encoding
NATIVE_CASES = [
    ("zp_1d_end_zstd_default", "zarr", (50,), (4,), (12,), "uint8", "end", True, ("default", "/")),
    ("zp_2d_start_raw_v2dot", "zarr", (10, 7), (2, 3), (4, 6), "int32", "start", False, ("v2", ".")),
    ("zp_3d_end_raw_defaultdot", "zarr", (9, 10, 11), (2, 3, 4), (4, 6, 8), "uint16", "end", False, ("default", ".")),
    ("zp_4d_start_zstd_v2slash", "zarr", (5, 6, 7, 3), (2, 2, 3, 2), (4, 4, 6, 2), "float32", "start", True, ("v2", "/")),
    ("ts_1d_start_raw_default", "tensorstore", (50,), (4,), (12,), "uint8", "start", False, ("default", "/")),
    ("ts_2d_end_zstd_v2dot", "tensorstore", (10, 7), (2, 3), (4, 6), "int32", "end", True, ("v2", ".")),
    ("ts_3d_start_zstd_defaultdot", "tensorstore", (9, 10, 11), (2, 3, 4), (4, 6, 8), "uint16", "start", True, ("default", ".")),
    ("ts_4d_end_raw_v2slash", "tensorstore", (5, 6, 7, 3), (2, 2, 3, 2), (4, 4, 6, 2), "float64", "end", False, ("v2", "/")),
]


def sample_data(shape, inner, shard, dtype, seed):
    """Random nonzero data with holes: the first inner chunk and the whole last shard along
    axis 0 (when there is more than one) are zero, so that some chunks are never stored."""
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 100, size=shape).astype(dtype)
    data[tuple(slice(0, c) for c in inner)] = 0
    if shape[0] > shard[0]:
        data[(shape[0] - 1) // shard[0] * shard[0]:] = 0
    return data


def write_zarr(path, shape, inner, shard, dtype, location, use_zstd, enc, data):
    arr = zarr.create_array(
        path, shape=shape, chunks=inner,
        shards=None if shard is None else {"shape": shard, "index_location": location},
        dtype=dtype, compressors=ZstdCodec(level=3) if use_zstd else None,
        chunk_key_encoding={"name": enc[0], "separator": enc[1]},
        fill_value=0, overwrite=True, attributes={"writer": "zarr-python"},
    )
    arr[...] = data


def write_tensorstore(path, shape, inner, shard, dtype, location, use_zstd, enc, data):
    inner_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if use_zstd:
        inner_codecs.append({"name": "zstd", "configuration": {"level": 3}})
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": list(shape), "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
            "chunk_key_encoding": {"name": enc[0], "configuration": {"separator": enc[1]}},
            "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(inner), "codecs": inner_codecs,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                 {"name": "crc32c"}],
                "index_location": location}}],
        },
    }
    t = ts.open(spec, create=True, delete_existing=True).result()
    t[...] = data


def read_index(path, cps, location):
    """Reads a shard index with numpy, independently of shardfs."""
    n = math.prod(cps)
    size = 16 * n + 4
    with open(path, "rb") as f:
        data = f.read()
    raw = data[:size] if location == "start" else data[-size:]
    body, crc = raw[:-4], raw[-4:]
    pairs = np.frombuffer(body, "<u8").reshape(n, 2)
    missing = np.uint64(2**64 - 1)
    chunks = []
    for i, (off, nb) in enumerate(pairs):
        if off == missing and nb == missing:
            continue
        coords = [int(c) for c in np.unravel_index(i, cps)] if cps else []
        chunks.append({"coords": coords, "offset": int(off), "nbytes": int(nb)})
    return {
        "index_location": location,
        "crc32c_ok": google_crc32c.value(body) == int.from_bytes(crc, "little"),
        "chunks": chunks,
    }


def encode_key(coords, enc):
    name, sep = enc
    parts = [str(c) for c in coords]
    if name == "default":
        return sep.join(["c"] + parts)
    return sep.join(parts) if parts else "0"


def parse_key(key, enc, ndim):
    name, sep = enc
    parts = key.split(sep)
    if name == "default":
        parts = parts[1:]
    assert len(parts) == ndim, key
    return [int(p) for p in parts]


def shard_files(array_dir):
    for d, _, files in os.walk(array_dir):
        for f in files:
            if f != "zarr.json":
                p = os.path.join(d, f)
                yield os.path.relpath(p, array_dir).replace(os.sep, "/"), p


def native(out):
    manifest = []
    for i, (name, writer, shape, inner, shard, dtype, loc, zst, enc) in enumerate(NATIVE_CASES):
        path = os.path.join(out, name)
        data = sample_data(shape, inner, shard, dtype, i)
        fn = write_zarr if writer == "zarr" else write_tensorstore
        fn(path, shape, inner, shard, dtype, loc, zst, enc, data)
        np.save(path + ".npy", data)
        cps = [s // c for s, c in zip(shard, inner)]
        shards = {key: read_index(p, cps, loc) for key, p in shard_files(path)}
        chunk_files = {}
        for key, info in shards.items():
            shard_coords = parse_key(key, enc, len(shape))
            for c in info["chunks"]:
                coords = [sc * n + w for sc, n, w in zip(shard_coords, cps, c["coords"])]
                chunk_files[encode_key(coords, enc)] = {"nbytes": c["nbytes"], "shard": key,
                                                        "offset": c["offset"]}
        grid_count = math.prod(-(-s // c) for s, c in zip(shape, shard))
        manifest.append({"name": name, "path": path, "writer": writer, "shards": shards,
                         "shard_grid_count": grid_count, "chunk_files": chunk_files})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


# name, shape, chunk, dtype, zstd?, key encoding
UNSHARDED_CASES = [
    ("u_1d_zstd_default", (50,), (4,), "uint8", True, ("default", "/")),
    ("u_2d_raw_v2dot", (10, 7), (2, 3), "int32", False, ("v2", ".")),
    ("u_3d_zstd_defaultdot", (9, 10, 11), (2, 3, 4), "uint16", True, ("default", ".")),
    ("u_4d_raw_v2slash", (5, 6, 7, 3), (2, 2, 3, 2), "float64", False, ("v2", "/")),
]


def unsharded(out):
    manifest = []
    for i, (name, shape, chunk, dtype, zst, enc) in enumerate(UNSHARDED_CASES):
        path = os.path.join(out, name)
        data = sample_data(shape, chunk, tuple(2 * c for c in chunk), dtype, 100 + i)
        write_zarr(path, shape, chunk, None, dtype, None, zst, enc, data)
        np.save(path + ".npy", data)
        manifest.append({"name": name, "path": path})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def metadata(out):
    """zarr.json documents of several kinds; for each sharded one, the zarr.json that
    zarr-python writes for the same array unsharded (chunks = inner chunks)."""
    docs = []

    def add(kind, path, unsharded_twin=None):
        docs.append({"kind": kind, "path": os.path.join(path, "zarr.json"),
                     "unsharded_twin": unsharded_twin and os.path.join(unsharded_twin, "zarr.json")})

    for sharded in (True, False):
        for j, (name, shape, chunk, dtype, zst, enc) in enumerate(UNSHARDED_CASES):
            p = os.path.join(out, f"zp_{'s' if sharded else 'u'}_{name}")
            twin = os.path.join(out, f"zp_twin_{name}")
            shard = tuple(2 * c for c in chunk)
            arr = zarr.create_array(
                p, shape=shape, chunks=chunk, shards=shard if sharded else None, dtype=dtype,
                compressors=ZstdCodec(level=1) if zst else None,
                chunk_key_encoding={"name": enc[0], "separator": enc[1]},
                dimension_names=[f"d{k}" for k in range(len(shape))] if j % 2 == 0 else None,
                attributes={"title": name, "nested": {"list": [1, 2.5, None, "x"]}},
                fill_value=0, overwrite=True)
            if sharded:
                zarr.create_array(
                    twin, shape=shape, chunks=chunk, dtype=dtype,
                    compressors=ZstdCodec(level=1) if zst else None,
                    chunk_key_encoding={"name": enc[0], "separator": enc[1]},
                    dimension_names=arr.metadata.dimension_names,
                    attributes={"title": name, "nested": {"list": [1, 2.5, None, "x"]}},
                    fill_value=0, overwrite=True)
                add("zarr-python sharded array", p, twin)
            else:
                add("zarr-python unsharded array", p)

    # A hierarchy with consolidated metadata, sharded, and its unsharded twin.
    for sharded in (True, False):
        root = os.path.join(out, "hier_sharded" if sharded else "hier_twin")
        g = zarr.open_group(root, mode="w", attributes={"about": "root"})
        sub = g.create_group("sub", attributes={"level": 1})
        for parent, nm in ((g, "a"), (sub, "b")):
            parent.create_array(nm, shape=(20, 30), chunks=(5, 6),
                                shards=(10, 12) if sharded else None, dtype="float32",
                                dimension_names=["y", "x"], attributes={"name": nm},
                                fill_value=0.0)
        zarr.consolidate_metadata(root)
    add("zarr-python consolidated group", os.path.join(out, "hier_sharded"),
        os.path.join(out, "hier_twin"))
    add("zarr-python group", os.path.join(out, "hier_sharded", "sub"))
    add("zarr-python sharded array in group", os.path.join(out, "hier_sharded", "sub", "b"),
        os.path.join(out, "hier_twin", "sub", "b"))

    # tensorstore, sharded (index at the start, and at the end, which it leaves out as the
    # default) and unsharded, with attributes and dimension names.
    for kind in ("s", "s_end", "u"):
        sharded = kind != "u"
        p = os.path.join(out, f"ts_{kind}")
        inner_codecs = [{"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "zstd", "configuration": {"level": 1}}]
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [4, 5], "codecs": inner_codecs,
            "index_location": "start" if kind == "s" else "end"}}] if sharded else inner_codecs
        ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": p},
                 "metadata": {"shape": [16, 25], "data_type": "int16",
                              "chunk_grid": {"name": "regular", "configuration": {
                                  "chunk_shape": [8, 25] if sharded else [4, 5]}},
                              "codecs": codecs, "dimension_names": ["row", ""],
                              "attributes": {"k": [1, {"z": True}]}}},
                create=True, delete_existing=True).result()
        add(f"tensorstore {kind} array", p)

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(docs, f)


def hierarchy(out):
    """A group hierarchy of sharded arrays with data, consolidated; data saved as .npy."""
    root = os.path.join(out, "hier")
    g = zarr.open_group(root, mode="w", attributes={"about": "root"})
    sub = g.create_group("sub", attributes={"level": 1})
    arrays = {}
    for parent, path, shape, inner, shard, dtype in (
            (g, "a", (20, 30), (5, 6), (10, 12), "float32"),
            (sub, "b", (17,), (4,), (8,), "int64"),
            (sub, "c", (6, 7, 8), (2, 3, 4), (4, 6, 8), "uint16")):
        arr = parent.create_array(path.split("/")[-1], shape=shape, chunks=inner, shards=shard,
                                  dtype=dtype, dimension_names=[f"d{i}" for i in range(len(shape))],
                                  attributes={"name": path}, fill_value=0)
        data = sample_data(shape, inner, shard, dtype, len(arrays) + 50)
        arr[...] = data
        full = path if parent is g else "sub/" + path
        np.save(os.path.join(out, full.replace("/", "_") + ".npy"), data)
        arrays[full] = {"chunks": list(inner), "npy": os.path.join(out, full.replace("/", "_") + ".npy")}
    zarr.consolidate_metadata(root)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"root": root, "arrays": arrays}, f)


def check_consolidated(root, manifest_path):
    """Opens ROOT through its consolidated metadata only and checks every array: unsharded
    chunks equal to the inner chunks, data equal to the saved .npy (zarr-python), and
    tensorstore reads each array equal too."""
    with open(manifest_path) as f:
        arrays = json.load(f)["arrays"]
    g = zarr.open_consolidated(root, mode="r")
    seen = 0
    for path, info in arrays.items():
        arr = g[path]
        if arr.shards is not None:
            sys.exit(f"{path}: consolidated metadata still says sharded: {arr.shards}")
        if list(arr.chunks) != info["chunks"]:
            sys.exit(f"{path}: chunks {arr.chunks} != inner {info['chunks']}")
        expected = np.load(info["npy"])
        if not np.array_equal(arr[...], expected):
            sys.exit(f"{path}: zarr-python read differs")
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(root, path)}},
                    open=True).result()
        if not np.array_equal(t.read().result(), expected):
            sys.exit(f"{path}: tensorstore read differs")
        seen += 1
    print(f"checked {seen}")


def twins(out):
    """Arrays written twice by zarr-python with the same data and codecs: sharded, and
    unsharded with chunks = the inner chunks."""
    names = []
    for i, (name, shape, inner, shard, dtype, zst, enc) in enumerate((
            ("t_2d_zstd_default", (10, 7), (2, 3), (4, 6), "int32", True, ("default", "/")),
            ("t_3d_raw_v2dot", (9, 10, 11), (2, 3, 4), (4, 6, 8), "uint16", False, ("v2", ".")),
            ("t_1d_zstd_defaultdot", (50,), (4,), (12,), "float64", True, ("default", ".")))):
        data = sample_data(shape, inner, shard, dtype, 200 + i)
        write_zarr(os.path.join(out, "sharded", name), shape, inner, shard, dtype, "end", zst, enc, data)
        write_zarr(os.path.join(out, "unsharded", name), shape, inner, None, dtype, None, zst, enc, data)
        names.append(name)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(names, f)


def rewrite(array_dir, npy, seed):
    """Writes new random data into an existing array (natively) and saves it as NPY."""
    arr = zarr.open_array(array_dir, mode="r+")
    data = np.random.default_rng(int(seed)).integers(1, 100, size=arr.shape).astype(arr.dtype)
    arr[...] = data
    np.save(npy, data)


def check_read(array_dir, npy):
    expected = np.load(npy)
    got_zarr = zarr.open_array(array_dir, mode="r")[...]
    got_ts = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": array_dir}},
                     open=True).result().read().result()
    for who, got in (("zarr-python", got_zarr), ("tensorstore", got_ts)):
        if got.shape != expected.shape or got.dtype != expected.dtype or not np.array_equal(got, expected):
            print(f"{who} read of {array_dir} differs from {npy}", file=sys.stderr)
            sys.exit(1)
    print("equal")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"native": native, "unsharded": unsharded, "metadata": metadata, "hierarchy": hierarchy,
     "twins": twins, "rewrite": rewrite, "check-read": check_read,
     "check-consolidated": check_consolidated}[cmd](*args)

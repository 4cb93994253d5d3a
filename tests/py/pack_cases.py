"""Arrays for the pack tests, written by the real clients, and their comparison.

    pack_cases.py write SRC      a hierarchy of unsharded arrays (zarr-python and
                                 tensorstore: 1-D to 4-D, partial edge chunks, missing
                                 chunks, '/' and '.' keys, compressed and raw), sharded
                                 arrays (zarr-python, index at the end; tensorstore,
                                 index at the start, '.' keys, chunks missing) and a
                                 group with attributes
    pack_cases.py reads SRC DST  every array reads equal with zarr-python (no consolidated
                                 metadata, which a pack in place sets aside meanwhile)
    pack_cases.py write_v2 SRC [filters]   Zarr v2 arrays and groups (see write_v2)
    pack_cases.py compare_v2 SRC DST       they read equal as sharded v3 arrays
    pack_cases.py compare SRC DST
                                 every array reads equal in SRC and DST with zarr-python
                                 and tensorstore; arrays unsharded in SRC are sharded in DST
"""
import json
import os
import sys

import numpy as np
import tensorstore as ts
import zarr

ZP_ARRAYS = {
    # name: (shape, chunks, dtype, key separator, compressed)
    "one": ((100,), (7,), "int32", "/", True),
    "two": ((33, 21), (8, 5), "uint8", "/", False),
    "three": ((17, 9, 12), (4, 4, 5), "float32", ".", True),
    "four": ((5, 6, 7, 3), (2, 3, 2, 2), "uint16", "/", False),
}


def values(shape, dtype):
    n = int(np.prod(shape))
    return (np.arange(n) % 251 + 1).astype(dtype).reshape(shape)


def write(src):
    g = zarr.open_group(src, mode="w")
    g.attrs["about"] = "pack test"
    for name, (shape, chunks, dtype, sep, compressed) in ZP_ARRAYS.items():
        a = g.create_array(
            f"zp/{name}", shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
            chunk_key_encoding={"name": "default", "separator": sep},
            compressors="auto" if compressed else None)
        data = values(shape, dtype)
        # The first chunk holds only the fill value: zarr-python writes no file for it.
        data[tuple(slice(0, c) for c in chunks)] = 0
        a[...] = data
    g.create_array("sharded", shape=(8, 8), chunks=(2, 2), shards=(4, 4),
                   dtype="uint8")[...] = 9
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{src}/ts/arr"},
                 "metadata": {"shape": [40, 30], "data_type": "int16",
                              "chunk_grid": {"name": "regular",
                                             "configuration": {"chunk_shape": [16, 16]}},
                              "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                         {"name": "zstd", "configuration": {"level": 1}}]}},
                create=True).result()
    t[0:32, :].write(values((32, 30), "int16")).result()  # row 2 of chunks stays missing
    # Sharded by tensorstore with the index at the start and '.' keys, chunks missing.
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}]
    index = inner + [{"name": "crc32c"}]
    start = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{src}/ts/start"},
                     "metadata": {"shape": [20, 12, 9], "data_type": "uint16",
                                  "chunk_grid": {"name": "regular",
                                                 "configuration": {"chunk_shape": [8, 8, 6]}},
                                  "chunk_key_encoding": {"name": "default",
                                                         "configuration": {"separator": "."}},
                                  "codecs": [{"name": "sharding_indexed", "configuration": {
                                      "chunk_shape": [4, 4, 3], "codecs": inner,
                                      "index_codecs": index, "index_location": "start"}}]}},
                    create=True).result()
    start[0:14, :, 0:7].write(values((14, 12, 7), "uint16")).result()
    zarr.open_group(f"{src}/ts", mode="a")
    # The top group's consolidated metadata lists every array as written (unsharded).
    zarr.consolidate_metadata(src)


V2_ARRAYS = {
    # name: zarr-python's create_array arguments (zarr_format=2)
    "blosc": dict(shape=(33, 21), chunks=(8, 5), dtype="<i4"),
    "zstd_f": dict(shape=(17, 9, 4), chunks=(4, 4, 3), dtype="<f4", order="F"),
    "raw_slash": dict(shape=(50,), chunks=(7,), dtype="|u1",
                      chunk_key_encoding={"name": "v2", "separator": "/"}),
    "gzip_big": dict(shape=(12, 12), chunks=(5, 5), dtype=">u2"),
}


def write_v2(src, filters=""):
    """Zarr v2 arrays as zarr-python 3 writes them with zarr_format=2: blosc (bitshuffle),
    zstd in Fortran order, raw with '/' keys, gzip big-endian; a group's attributes and
    consolidated metadata. With `filters`, one array with a Delta filter too."""
    import warnings
    import numcodecs
    warnings.simplefilter("ignore")
    compressors = {"blosc": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=2),
                   "zstd_f": numcodecs.Zstd(level=2), "raw_slash": None,
                   "gzip_big": numcodecs.GZip(level=1)}
    g = zarr.open_group(src, mode="w", zarr_format=2)
    g.attrs["about"] = "v2"
    for name, kw in V2_ARRAYS.items():
        a = g.create_array(f"sub/{name}", fill_value=0, compressors=compressors[name], **kw)
        a[...] = values(kw["shape"], kw["dtype"])
        a.attrs["name"] = name
    if filters:
        g.create_array("delta", shape=(10,), chunks=(5,), dtype="<i4", fill_value=0,
                       filters=[numcodecs.Delta(dtype="<i4")])[...] = np.arange(10)
    zarr.consolidate_metadata(src)


def compare_v2(src, dst):
    for name in V2_ARRAYS:
        a = zarr.open_array(f"{src}/sub/{name}", mode="r", zarr_format=2)
        b = zarr.open_array(f"{dst}/sub/{name}", mode="r", zarr_format=3)
        # The same type; its byte order is the codec's in v3 (a big-endian v2 array reads
        # as native numbers).
        same_type = (a.dtype.kind, a.dtype.itemsize) == (b.dtype.kind, b.dtype.itemsize)
        assert same_type and np.array_equal(a[...], b[...]), f"{name}: zarr-python"
        assert b.shards is not None and dict(b.attrs) == {"name": name}, name
        t = ts.open({"driver": "zarr3",
                     "kvstore": {"driver": "file", "path": f"{dst}/sub/{name}"}}).result()
        assert np.array_equal(t.read().result(), a[...]), f"{name}: tensorstore"
    assert dict(zarr.open_group(dst, mode="r", zarr_format=3).attrs) == {"about": "v2"}
    leftover = [os.path.join(d, f) for d, _, fs in os.walk(dst) for f in fs if f.startswith(".z")]
    assert not leftover, leftover
    print("ok")


def arrays(root):
    out = []
    for d, _, files in os.walk(root):
        if "zarr.json" in files:
            with open(os.path.join(d, "zarr.json")) as f:
                if json.load(f)["node_type"] == "array":
                    out.append(os.path.relpath(d, root))
    return sorted(out)


def sharded(meta_dir):
    with open(os.path.join(meta_dir, "zarr.json")) as f:
        return json.load(f)["codecs"][0]["name"] == "sharding_indexed"


def reads(src, dst):
    """Every array reads equal with zarr-python, through its own document."""
    for name in arrays(src):
        a = zarr.open_array(os.path.join(src, name), mode="r")[...]
        b = zarr.open_array(os.path.join(dst, name), mode="r")[...]
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{name} differs"


def compare(src, dst):
    names = arrays(src)
    assert arrays(dst) == names, (arrays(dst), names)
    report = {}
    for name in names:
        a = zarr.open_array(os.path.join(src, name), mode="r")[...]
        b = zarr.open_array(os.path.join(dst, name), mode="r")[...]
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{name}: zarr-python differs"
        t = ts.open({"driver": "zarr3",
                     "kvstore": {"driver": "file", "path": os.path.join(dst, name)}}).result()
        assert np.array_equal(t.read().result(), a), f"{name}: tensorstore differs"
        report[name] = {"sharded_before": sharded(os.path.join(src, name)),
                        "sharded_after": sharded(os.path.join(dst, name))}
    assert dict(zarr.open_group(dst, mode="r").attrs) == dict(zarr.open_group(src, mode="r").attrs)
    # A reader trusting the consolidated metadata sees the arrays as packed.
    consolidated = zarr.open_consolidated(dst, mode="r")
    for name in names:
        a = zarr.open_array(os.path.join(src, name), mode="r")[...]
        assert np.array_equal(consolidated[name][...], a), f"{name}: consolidated differs"
    print(json.dumps(report))


if __name__ == "__main__":
    {"write": write, "compare": compare, "reads": reads, "write_v2": write_v2,
     "compare_v2": compare_v2}[sys.argv[1]](*sys.argv[2:])

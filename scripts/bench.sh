#!/usr/bin/env bash
# Benchmarks (not tests): shardfs against the native writers, in one run.
#   scripts/bench.sh all [--quick] [--runs N] [--markdown FILE] [--parts P,..] [--only NAME]
#                        [--mount-args '...']
#                                        the whole matrix (scripts/bench_matrix.py): 9
#                                        interleaved rounds, medians (min-max), CPU times,
#                                        requests per chunk
#   scripts/bench.sh read  [--runs N]    reading a 512^3 array through the mount vs natively
#   scripts/bench.sh write [--runs N]    scenario S3 (chunk-by-chunk writes) through the mount
#   scripts/bench.sh fsync [--runs N]    tensorstore with its fsyncs, S1-S3 (the journal)
#   scripts/bench.sh s3 [--runs N]       object store: S2, S3 through a mount of a local S3
#                                        server against zarr-python straight to it
#   scripts/bench.sh pack [--rounds N] [--quick]
#                                        shardfs pack against cp -r, zarrs_reencode and cp -r
#                                        into a mount; --compress zstd (scripts/bench_pack.py;
#                                        installs zarrs_tools 0.8.1 into .tools/zarrs)
#   scripts/bench.sh compress [--rounds N] [--quick]
#                                        zarr-python raw through a mount with --compress zstd
#                                        against zarr-python with its own zstd
#                                        (scripts/bench_compress.py)
# Prints JSON with medians and ratios. Uses the venv of scripts/test.sh (created if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SHARDFS_VENV:-$PWD/.venv}"
if ! cmp -s scripts/requirements.txt "$venv/.shardfs-requirements" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements.txt
    cp scripts/requirements.txt "$venv/.shardfs-requirements"
fi
cargo build --release --quiet
if [ "${1:-}" = pack ]; then
    shift
    reencode="$PWD/.tools/zarrs/bin/zarrs_reencode"
    if [ ! -x "$reencode" ]; then
        cargo install --quiet --locked zarrs_tools --version 0.8.1 --root "$PWD/.tools/zarrs"
    fi
    exec "$venv/bin/python" scripts/bench_pack.py "$@" --shardfs "$PWD/target/release/shardfs" \
        --zarrs-reencode "$reencode"
fi
if [ "${1:-}" = compress ]; then
    shift
    exec "$venv/bin/python" scripts/bench_compress.py "$@" --shardfs "$PWD/target/release/shardfs"
fi
if [ "${1:-}" = s3 ]; then
    shift
    exec "$venv/bin/python" scripts/bench_s3.py "$@" --shardfs "$PWD/target/release/shardfs"
fi
exec "$venv/bin/python" scripts/bench.py "$@" --shardfs "$PWD/target/release/shardfs"

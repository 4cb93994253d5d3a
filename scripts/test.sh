#!/usr/bin/env bash
# Runs every test: formatting and lint checks, unit tests, and the integration tests that
# drive the real clients (zarr-python, tensorstore) and real FUSE mounts.
#
# Creates a Python venv with the pinned clients (scripts/requirements.txt) at .venv, or at
# $SHARDFS_VENV, and passes it to the tests through SHARDFS_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

# rsync is one of the writers the tests drive; fresh machines lack it.
if ! command -v rsync >/dev/null; then
    echo "== installing rsync"
    (apt-get install -y -q rsync >/dev/null 2>&1 ||
        (apt-get update -q >/dev/null && apt-get install -y -q rsync >/dev/null))
fi

# libfaketime: a test runs a mount whose clock is slow.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    echo "== installing faketime"
    (apt-get install -y -q faketime >/dev/null 2>&1 ||
        (apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null))
fi

# pjdfstest (the Rust rewrite, pinned) runs on a plain directory of a mount; it links
# libacl.
if ! command -v pjdfstest >/dev/null; then
    echo "== installing pjdfstest"
    (apt-get install -y -q libacl1-dev >/dev/null 2>&1 ||
        (apt-get update -q >/dev/null && apt-get install -y -q libacl1-dev >/dev/null))
    cargo install --quiet --locked pjdfstest --version 0.2.2
fi

venv="${SHARDFS_VENV:-$PWD/.venv}"
stamp="$venv/.shardfs-requirements"
if ! cmp -s scripts/requirements.txt "$stamp" 2>/dev/null; then
    echo "== creating the Python venv at $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements.txt
    cp scripts/requirements.txt "$stamp"
fi
export SHARDFS_PYTHON="$venv/bin/python"
"$SHARDFS_PYTHON" -c 'import zarr, tensorstore, numpy' # fail here, not in the tests

# An ordinary user, to run mounts as most users do: through fusermount3 (Debian's fuse3),
# with /dev/fuse usable by everyone (mode 0666, as distributions ship it), and a Python
# venv of its own outside the checkout (which may lie where it cannot read), made from
# the system's Python (the one above lives under /root).
if ! command -v fusermount3 >/dev/null; then
    echo "== installing fuse3"
    (apt-get install -y -q fuse3 >/dev/null 2>&1 ||
        (apt-get update -q >/dev/null && apt-get install -y -q fuse3 >/dev/null))
fi
chmod 0666 /dev/fuse
user=shardfs-user
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$user"
user_venv=/opt/shardfs-test/venv-user
if ! cmp -s scripts/requirements-user.txt "$user_venv/.shardfs-requirements" 2>/dev/null; then
    echo "== creating the ordinary user's venv at $user_venv"
    if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1 || ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
        (apt-get install -y -q python3-venv >/dev/null 2>&1 ||
            (apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null))
    fi
    rm -rf "$user_venv"
    mkdir -p "$(dirname "$user_venv")"
    /usr/bin/python3 -m venv "$user_venv"
    "$user_venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-user.txt
    cp scripts/requirements-user.txt "$user_venv/.shardfs-requirements"
    chmod -R a+rX "$(dirname "$user_venv")"
fi
export SHARDFS_USER="$user" SHARDFS_USER_PYTHON="$user_venv/bin/python"

# Azurite (npm), the local Azure Blob Storage server the object-store tests start on
# 127.0.0.1, installed beside the project (Node.js is needed; a fresh machine may lack it).
azurite_version=3.35.0
azurite="$PWD/.tools/azurite"
if ! grep -qs "\"version\": \"$azurite_version\"" "$azurite/node_modules/azurite/package.json"; then
    echo "== installing Azurite $azurite_version"
    if ! command -v npm >/dev/null; then
        (apt-get install -y -q nodejs npm >/dev/null 2>&1 ||
            (apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null))
    fi
    npm install --silent --no-audit --no-fund --prefix "$azurite" "azurite@$azurite_version"
fi
export SHARDFS_AZURITE="$azurite/node_modules/.bin/azurite-blob"

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings
# The wheel `pip install shardfs` installs (maturin, pyproject.toml), built from the same
# debug build the tests use; tests/cli_ordinary_user.rs installs it into the user's venv.
echo "== maturin build (the shardfs wheel)"
rm -rf target/shardfs-wheel
"$venv/bin/maturin" build --quiet --profile dev --out target/shardfs-wheel
export SHARDFS_WHEEL="$(ls "$PWD"/target/shardfs-wheel/shardfs-*.whl)"
echo "== cargo test"
cargo test --quiet --no-fail-fast "$@"

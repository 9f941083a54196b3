#!/usr/bin/env bash
# Build .gpu/, the folder a lent GPU machine needs beside the working tree (the `device` tool's `carry`):
# that machine has Python with CUDA torch but none of this project's other packages and no mosquitto, and
# reaches no network. So: wheels of our dependencies for its Python (--python, default 3.12) and this
# project's own wheel in .gpu/whl, and mosquitto with its libraries (Debian 12 packages) in .gpu/mq.
# Run here, at the project's root, after `make .venv/.installed-stamp`; then carry .gpu to the device and
# run bench/device/run.sh there. .gpu is ignored by git through .git/info/exclude (added when missing).
# --base REV also unpacks that revision into .gpu/base, for run.sh's `compare` step (that machine has no
# git history to unpack it from).
set -euo pipefail
python_version=3.12
base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python_version="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    *) echo "usage: bench/device/prepare.sh [--python 3.12] [--base REV]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
venv=.venv/bin
[ -x "$venv/pip" ] || { echo "no $venv/pip: run make .venv/.installed-stamp first" >&2; exit 1; }
mkdir -p .git/info .gpu/whl .gpu/mq/lib
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

# what the GPU machine lacks, at the versions this project's .venv runs (so they never drift apart)
missing="aiomqtt paho-mqtt prompt_toolkit wcwidth cryptography cffi pycparser pydantic pydantic_core
  annotated-types typing-inspection blake3 xxhash packaging nats-py psutil starlette uvicorn pytest-asyncio
  pytest-timeout"
pinned=$("$venv/python" -c 'import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))' $missing)
echo "wheels for Python $python_version -> .gpu/whl: $pinned"
# shellcheck disable=SC2086 # one argument per requirement
"$venv/pip" download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 -d .gpu/whl $pinned
rm -f .gpu/whl/open_swarm_learning-*.whl
"$venv/pip" wheel -q --no-deps --no-build-isolation -w .gpu/whl .

echo "mosquitto -> .gpu/mq"
debs=$(mktemp -d)
(cd "$debs" && apt-get download -q mosquitto libcjson1 libmosquitto1 libdlt2 libwrap0 >/dev/null)
for deb in "$debs"/*.deb; do dpkg -x "$deb" .gpu/mq; done
rm -rf "$debs"
# every shared library mosquitto needs that is not in glibc itself, beside it
ldd .gpu/mq/usr/sbin/mosquitto | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" .gpu/mq/lib/ ;;
  esac
done
cp -L .gpu/mq/usr/lib/x86_64-linux-gnu/*.so* .gpu/mq/lib/ 2>/dev/null || true
if [ -n "$base" ]; then
  echo "$base -> .gpu/base"
  rm -rf .gpu/base && mkdir -p .gpu/base
  git archive --format=tar "$base" | tar -x -C .gpu/base
fi
du -sh .gpu/whl .gpu/mq

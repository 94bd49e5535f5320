#!/usr/bin/env bash
# Installs what is missing, builds megactx and runs the whole CPU test suite:
# unit, parity and end-to-end tests (ctest), then every libFuzzer target for a
# bounded time in a separate clang build. GPU tests (label "gpu") run only on
# the GPU machine through scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs=$(nproc)
# ccache keys on paths relative to the checkout, so clones in other folders
# (CI) reuse objects compiled earlier on the same machine.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
# A test that fails is run once more before it counts (HttpServer's
# 100-continue test has failed once under load; see docs/development.md).
ctest --test-dir build -LE gpu --output-on-failure -j "$jobs" --timeout 900 --repeat until-pass:2

if ls tests/fuzz/*.cmake >/dev/null 2>&1; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMEGACTX_FUZZ=ON -DMEGACTX_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Release
  cmake --build build-fuzz -j "$jobs"
  ctest --test-dir build-fuzz -L fuzz --output-on-failure -j "$jobs"
fi
echo "megactx: all tests passed"

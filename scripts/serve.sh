#!/usr/bin/env bash
# Installs what is missing, builds megactx and serves the embedded default
# model on http://127.0.0.1:30000 (OpenAI API under /v1, native API /generate,
# the web playground and dashboard at /).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target megactx
exec ./build/megactx serve --model models/default --host 127.0.0.1 --port "${PORT:-30000}" "$@"

#!/usr/bin/env bash
# Installs every build and test dependency of megactx from Debian's packages.
# Idempotent: packages already present are skipped by apt-get.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  nlohmann-json3-dev libpcre2-dev libopenblas-dev libboost-dev
  libcli11-dev libfmt-dev libspdlog-dev libxxhash-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-jinja2 python3-numpy python3-requests python3-torch
  chromium fonts-dejavu-core
)
# python3-torch: the RL trainer loop test (tests/e2e/trainer_loop_test.py) trains
# the default model on the CPU. It brings 156 packages (48 MB to download, about
# 550 MiB installed, 55 s to install on the 2-core CI machine).
# chromium: the web UI's browser tests (tests/web, driven by playwright-core).
# Node.js with npm (end-to-end tests drive the server with the official openai
# client; the web UI is built with npm packages).
# Some images ship Node.js from another source whose nodejs conflicts with Debian's npm.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all dependencies present"

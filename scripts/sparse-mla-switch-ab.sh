#!/usr/bin/env bash
# A/B of the sparse MLA switches that are still off, in one device command. Each set of switches
# first runs its tests (a set that fails them is not timed), then its benchmark, each in its own
# process (the switches are read once per process), alternated with the defaults on one machine.
#
#   prefill (dsa_attention_bench --prefill-only; sparse_mla_test's fp8-ring and rising-max cases):
#     the ping-pong consumers, free-running (1) and alternating (2); the same with a CTA per row
#     (their spill-free build); the output scales loaded ahead.
#   decode (dsa_attention_bench --quick --decode-section 2 at 8K and --decode-section 3 at 8K,
#     model_decode_bench on the GLM-5.2 attention config at batch 4 and 16 where BIN_DIR has it;
#     all of sparse_mla_test): the cluster kernel's scores kept in registers; decode's splits on
#     the fp8-ring layout.
#
#   (device) bash scripts/sparse-mla-switch-ab.sh BIN_DIR [ROUNDS] [prefill|decode]
#
# Prints each run's table rows under its switches.
set -uo pipefail
bin=${1:?usage: scripts/sparse-mla-switch-ab.sh BIN_DIR [ROUNDS] [prefill|decode]}
rounds=${2:-2}
only=${3:-}
bin=$(cd "$bin" && pwd)
cd "$(dirname "$0")/.."  # the benchmark configs
log=${OUT:-/tmp}/sparse-mla-switch-test.log

# tested FILTER SWITCHES...: the sets whose tests pass, one per line.
tested() {
  local filter=$1 switches
  shift
  echo "== tests ($filter): defaults" >&2
  timeout 150 "$bin/sparse_mla_test" --gtest_filter="$filter" 2>&1 |
    grep -E '^\[  (PASSED|FAILED) |Failure' | head -8 >&2
  for switches in "$@"; do
    echo "== tests ($filter): $switches" >&2
    if env $switches timeout 150 "$bin/sparse_mla_test" --gtest_filter="$filter" >"$log" 2>&1; then
      grep -E '^\[  PASSED ' "$log" >&2
      echo "$switches"
    else
      grep -E '^\[  FAILED |Failure|error' "$log" | head -8 >&2
    fi
  done
}

if [[ "$only" != decode ]]; then
  mapfile -t passing < <(tested '*Fp8Ring*:*RisingMax*' \
    "MEGACTX_SPARSE_MLA_PINGPONG=1" \
    "MEGACTX_SPARSE_MLA_PINGPONG=2" \
    "MEGACTX_SPARSE_MLA_PERSISTENT=0 MEGACTX_SPARSE_MLA_PINGPONG=1" \
    "MEGACTX_SPARSE_MLA_SCALES_AHEAD=1")
  for round in $(seq "$rounds"); do
    for switches in "" "${passing[@]}"; do
      echo "== prefill, round $round: ${switches:-defaults}"
      env $switches timeout 150 "$bin/dsa_attention_bench" --prefill-only 2>&1 |
        grep -E '^\| [0-9]|TFLOP|dsa_attention_bench:' | grep -v '^|---'
    done
  done
fi

if [[ "$only" != prefill ]]; then
  mapfile -t passing < <(tested '*' "MEGACTX_SPARSE_MLA_REGISTER_SCORES=1" \
    "MEGACTX_SPARSE_MLA_FP8RING_SPLITS=1")
  for round in $(seq "$rounds"); do
    for switches in "" "${passing[@]}"; do
      echo "== decode, round $round: ${switches:-defaults}"
      env $switches timeout 100 "$bin/dsa_attention_bench" --quick --decode-section 2 \
        --max-context 8192 2>&1 | grep -E '^\| |dsa_attention_bench:' | grep -v '^|---'
      env $switches timeout 100 "$bin/dsa_attention_bench" --quick --decode-section 3 \
        --min-context 8192 --max-context 8192 2>&1 | grep -E '^\| |dsa_attention_bench:' |
        grep -v '^|---'
      # The few-row batches whose splits the fp8-ring switch moves, in the whole model.
      [[ -x "$bin/model_decode_bench" ]] &&
        env $switches timeout 100 "$bin/model_decode_bench" \
          --config bench/cuda/configs/glm52_attention.json --kv-dtype fp8 --precision bf16 \
          --attention fast --graphs on --batches 4,16 2>&1 | grep -E '^\| [0-9a-z]|read' |
        grep -v '^|---'
    done
  done
fi

#!/usr/bin/env bash
# A/B of the sparse MLA prefill switches that are still off: each set of switches runs the fp8-ring
# tests of sparse_mla_test (the new form must pass them before it is timed), then
# dsa_attention_bench --prefill-only, each in its own process (the switches are read once per
# process), alternated with the defaults on one machine. The ping-pong consumers, free-running (1)
# and alternating (2); the same with a CTA per row (their spill-free build); the output scales
# loaded ahead.
#
#   (device) bash scripts/prefill-switch-ab.sh BIN_DIR [ROUNDS]
#
# Prints each run's prefill table rows under its switches; a set whose tests fail is not timed.
set -uo pipefail
bin=${1:?usage: scripts/prefill-switch-ab.sh BIN_DIR [ROUNDS]}
rounds=${2:-2}
sets=(
  "MEGACTX_SPARSE_MLA_PINGPONG=1"
  "MEGACTX_SPARSE_MLA_PINGPONG=2"
  "MEGACTX_SPARSE_MLA_PERSISTENT=0 MEGACTX_SPARSE_MLA_PINGPONG=1"
  "MEGACTX_SPARSE_MLA_SCALES_AHEAD=1"
)
echo "== tests: defaults"
timeout 120 "$bin/sparse_mla_test" --gtest_filter='*Fp8Ring*:*RisingMax*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |Failure' | head -8
passing=()
for switches in "${sets[@]}"; do
  echo "== tests: $switches"
  if env $switches timeout 120 "$bin/sparse_mla_test" --gtest_filter='*Fp8Ring*:*RisingMax*' \
    >/tmp/prefill-switch-test.log 2>&1; then
    passing+=("$switches")
    grep -E '^\[  PASSED ' /tmp/prefill-switch-test.log
  else
    grep -E '^\[  FAILED |Failure|error' /tmp/prefill-switch-test.log | head -8
  fi
done
for round in $(seq "$rounds"); do
  for switches in "" "${passing[@]}"; do
    echo "== round $round: ${switches:-defaults}"
    env $switches timeout 150 "$bin/dsa_attention_bench" --prefill-only 2>&1 |
      grep -E '^\| [0-9]|TFLOP|dsa_attention_bench:' | grep -v '^|---'
  done
done

#!/usr/bin/env bash
# A/B of the decode switches: model_decode_bench on glm_1b once per set of switches, each in its
# own process (the switches are read once per process), on one machine. The defaults; the ones
# still off (the weight prefetch, the experts reading the norm's fp8 copy, the SwiGLU GEMV, the
# tensor-core bf16 linear at 9-64 rows); the expert split-K forced on and off (by default it follows
# the grid size);
# and the earlier defaults (cuBLAS for the router's logits and the bf16 linears of decode, no
# split-K).
#
#   (device) bash scripts/decode-switch-ab.sh BIN_DIR [BATCHES] [quick|split|skinny]
#
# quick: only the defaults and every switch on, twice each in turn (when device time is short).
# split: the defaults, the expert split-K forced on, forced off, and the earlier defaults.
# skinny: the defaults, bf16_skinny, and bf16_skinny with the deep pipeline, twice each, bf16
# weights, on glm_1b and on the GLM-5.2 attention config.
# Prints each run's table rows (ms per step and the share of the read floor) under its switches.
set -uo pipefail
bin=${1:?usage: scripts/decode-switch-ab.sh BIN_DIR [BATCHES]}
batches=${2:-1,16,64}
all_on="MEGACTX_WEIGHT_PREFETCH=1 MEGACTX_MOE_SHARED_FP8_INPUT=1 MEGACTX_BF16_GEMV_SWIGLU=1 MEGACTX_BF16_SKINNY=1"
old_defaults="MEGACTX_FUSED_ROUTER=0 MEGACTX_BF16_GEMV=0 MEGACTX_BF16_EXPERT_SPLIT_K=1 MEGACTX_FP8_EXPERT_SPLIT_K=1"
runs=(
  ""
  "MEGACTX_WEIGHT_PREFETCH=1"
  "MEGACTX_MOE_SHARED_FP8_INPUT=1"
  "MEGACTX_BF16_GEMV_SWIGLU=1"
  "MEGACTX_BF16_SKINNY=1"
  "MEGACTX_BF16_SKINNY=1 MEGACTX_BF16_SKINNY_DEEP=1"
  "MEGACTX_BF16_EXPERT_SPLIT_K=4 MEGACTX_FP8_EXPERT_SPLIT_K=2"
  "MEGACTX_BF16_EXPERT_SPLIT_K=1 MEGACTX_FP8_EXPERT_SPLIT_K=1"
  "$old_defaults"
  "$all_on"
  ""
)
[[ "${3:-}" == quick ]] && runs=("" "$all_on" "" "$all_on")
[[ "${3:-}" == split ]] && runs=("" "${runs[6]}" "${runs[7]}" "$old_defaults")
configs=glm_1b
precisions=bf16,fp8
if [[ "${3:-}" == skinny ]]; then
  runs=("" "${runs[4]}" "${runs[5]}" "" "${runs[4]}" "${runs[5]}")
  configs="glm_1b glm52_attention"
  precisions=bf16
fi
for config in $configs; do
  for switches in "${runs[@]}"; do
    echo "== $config: ${switches:-defaults}"
    env $switches timeout 120 "$bin/model_decode_bench" --config "bench/cuda/configs/$config.json" \
      --kv-dtype fp8 --precision "$precisions" --attention fast --graphs on --batches "$batches" 2>&1 |
      grep -E "^\| (bf16|fp8) |^read-only|model_decode_bench:"
  done
done

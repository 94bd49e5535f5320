#!/usr/bin/env bash
# Every performance target of the decode and prefill issues, measured in one or two device calls,
# each beside the floor or ceiling its benchmark measures in the same run (docs/benchmarks.md's top
# table holds the latest of each). The targets are stated for an H200: say which GPU ran them.
#
#   decode (~5 min): the attention side of a GLM-5.2 decode step at 8K-1M (target: under 0.5 ms at
#     8K, 4x its byte floor at 128K, 1.5x at 1M); whole-model decode on the GLM-5.2 attention config
#     and glm_1b, bf16 and fp8 weights (60% of the read floor at batch 1 and 16; fp8 faster than bf16
#     at every batch); MTP k = 3 against k = 0 through serve on the default model (1.5x at 1
#     request, 1.2x at 16).
#   prefill (~4 min): the fused indexer prefill (600 TFLOP/s), sparse MLA prefill (400 TFLOP/s),
#     time to first token at 128K and 1M through serve on the GLM-5.2 attention config (2x its FLOP
#     floor) and the memory plan's step scratch at 1M (4 GB).
#
#   (device) bash scripts/issue-targets.sh BIN_DIR [decode|prefill|all]
#
# BIN_DIR holds dsa_attention_bench, model_decode_bench, indexer_prefill_bench and megactx
# (GPU_PACK_ONLY="dsa_attention_bench model_decode_bench indexer_prefill_bench megactx"
# scripts/gpu-check.sh --pack build .gpu-carry). Each benchmark's whole log goes to $OUT (or /tmp);
# its tables are printed here.
set -uo pipefail
bin=${1:?usage: scripts/issue-targets.sh BIN_DIR [decode|prefill|all]}
part=${2:-all}
out=${OUT:-/tmp}
cd "$(dirname "$0")/.."

# step NAME SECONDS COMMAND...: runs COMMAND under a timeout, its log in $out/NAME.log, and prints
# the log's table rows and ceiling lines.
step() {
  local name=$1 seconds=$2 start rc
  shift 2
  echo "== $name: $*"
  start=$(date +%s)
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  rc=$?
  grep -E '^\||ceiling|floor|read-only|TFLOP|memory plan|^# ' "$out/$name.log" | grep -v '^|---'
  echo "== $name: exit $rc, $(($(date +%s) - start)) s"
}

if [[ "$part" == all || "$part" == decode ]]; then
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
  step attention_side 150 "$bin/dsa_attention_bench" --quick --decode-section 3 \
    --max-context 1048576
  for config in glm52_attention glm_1b; do
    step "decode_$config" 150 "$bin/model_decode_bench" --config "bench/cuda/configs/$config.json" \
      --kv-dtype fp8 --precision bf16,fp8 --attention fast --graphs on --batches 1,4,16,64
  done
  step mtp_serve 300 python3 tools/bench/mtp_serve_bench.py --megactx "$bin/megactx" --steps 0,3 \
    --concurrency 1,16 --rounds 3 -- --device cuda --cuda-bf16
fi

if [[ "$part" == all || "$part" == prefill ]]; then
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
  step indexer_prefill 150 "$bin/indexer_prefill_bench" --fused-only
  step sparse_mla_prefill 150 "$bin/dsa_attention_bench" --prefill-only
  step ttft 400 python3 tools/bench/prefill_serve_bench.py --megactx "$bin/megactx" \
    --checkpoint /tmp/glm52_attention_ckpt --lengths 131072,1048576 --no-hf
fi

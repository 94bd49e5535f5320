#!/usr/bin/env bash
# ad-hoc device round (untracked)
bash scripts/gpu-steps.sh .gpu-carry \
  'timeout 150 $B/decode_select_test' \
  'timeout 200 $B/indexer_topk_test' \
  'timeout 100 $B/attention_stack_test' \
  'timeout 120 $B/dsa_attention_bench --quick --decode-section 1 --max-context 8192' \
  'for v in 0 1 0 1; do MEGACTX_DECODE_SELECT=$v timeout 100 $B/dsa_attention_bench --quick --decode-section 3 --min-context 8192 --max-context 8192 | grep -E "^\| 8K|ceilings"; done' \
  'MEGACTX_DECODE_SELECT=1 timeout 200 $B/cuda_fast_attention_test' \
  'MEGACTX_DECODE_SELECT=1 timeout 200 $B/cuda_model_test' \
  'for v in 0 1 0 1; do MEGACTX_DECODE_SELECT=$v timeout 100 $B/model_decode_bench --config bench/cuda/configs/glm52_attention.json --context 8192 --kv-dtype fp8 --precision bf16 --attention fast --graphs on --batches 1,16 | tail -4; done' \
  'timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/decode_select_test 2>&1 | tail -5' \
  'timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $B/decode_select_test --gtest_filter="*Ragged*:*Ties*" 2>&1 | tail -5' \
  'timeout 120 compute-sanitizer --tool synccheck --error-exitcode 9 $B/decode_select_test --gtest_filter="*Ragged*:*Ties*" 2>&1 | tail -5'

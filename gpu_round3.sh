#!/usr/bin/env bash
bash scripts/gpu-steps.sh .gpu-carry \
  'timeout 150 $B/decode_select_test 2>&1 | tail -3' \
  'timeout 150 $B/indexer_topk_test 2>&1 | tail -3' \
  'for v in 0 1 3 4 5 2 0; do echo probe $v; MEGACTX_DECODE_SELECT_PROBE=$v timeout 100 $B/dsa_attention_bench --quick --decode-section 1 --max-context 8192 | grep -E "^\| 8K"; done' \
  'timeout 150 compute-sanitizer --tool synccheck --num-cuda-barriers 100000 $B/decode_select_test --gtest_filter="*Ragged*:*Ties*" 2>&1 | grep -v "^\[ " | head -40' \
  'timeout 150 compute-sanitizer --tool memcheck $B/decode_select_test 2>&1 | tail -3'

#!/usr/bin/env bash
bash scripts/gpu-steps.sh .gpu-carry \
  'timeout 150 $B/decode_select_test 2>&1 | tail -2' \
  'MEGACTX_TOPK_WARP_COUNTS=1 timeout 150 $B/indexer_topk_test 2>&1 | tail -2' \
  'for w in 0 1 0 1; do for v in 0 16 0; do echo warp_counts $w probe $v; MEGACTX_TOPK_WARP_COUNTS=$w MEGACTX_DECODE_SELECT_PROBE=$v timeout 100 $B/dsa_attention_bench --quick --decode-section 1 --max-context 8192 | grep -E "^\| 8K"; done; done' \
  'for w in 0 1 0 1; do MEGACTX_TOPK_WARP_COUNTS=$w timeout 100 $B/dsa_attention_bench --quick --decode-section 3 --min-context 8192 --max-context 8192 | grep -E "^\| 8K"; done' \
  'MEGACTX_TOPK_WARP_COUNTS=1 timeout 200 compute-sanitizer --tool racecheck $B/indexer_topk_test --gtest_filter="*DecodeBatch*:*Ties*" 2>&1 | tail -3'

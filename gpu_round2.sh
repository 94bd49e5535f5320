#!/usr/bin/env bash
bash scripts/gpu-steps.sh .gpu-carry \
  'timeout 120 compute-sanitizer --tool synccheck $B/decode_select_test --gtest_filter="*Ragged*" 2>&1 | head -60' \
  'timeout 120 compute-sanitizer --tool synccheck $B/indexer_topk_test --gtest_filter="*DecodeBatch*" 2>&1 | grep -v "^\[" | head -30' \
  'for v in 0 1 2 0; do MEGACTX_DECODE_SELECT_PROBE=$v timeout 100 $B/dsa_attention_bench --quick --decode-section 1 --max-context 8192 | grep -E "^\| 8K"; done' \
  'timeout 200 ncu --kernel-name regex:decode_select_kernel --launch-skip 30 --launch-count 1 --set full --import-source yes -o $OUT/select $B/dsa_attention_bench --quick --decode-section 1 --max-context 8192 > /dev/null; ncu --import $OUT/select.ncu-rep --page details 2>&1 | head -250'

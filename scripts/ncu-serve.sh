#!/usr/bin/env bash
# `megactx` under Nsight Compute with one metric per kernel (its device time): a drop-in for the
# megactx binary that the serve benchmarks start, so that a whole request's kernels can be summed
# (the GPU machine has no Nsight Systems). The benchmark's SIGTERM is forwarded to megactx itself,
# so that ncu sees the application exit and writes its log.
#
#   MEGACTX_BIN=build/megactx NCU_LOG=ncu.csv python3 tools/bench/prefill_serve_bench.py \
#       --megactx scripts/ncu-serve.sh --checkpoint /tmp/ckpt --no-hf --lengths 32768 \
#       --warmup-tokens 512
#   python3 tools/bench/ncu_kernel_summary.py ncu.csv
set -uo pipefail
megactx=${MEGACTX_BIN:?MEGACTX_BIN: the megactx binary}
log=${NCU_LOG:?NCU_LOG: where ncu writes its CSV}
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$ncu_bin" --metrics gpu__time_duration.sum --csv --page raw --clock-control none \
  --log-file "$log" "$megactx" "$@" &
ncu_pid=$!
stop() { pkill -TERM -f "^$megactx " || true; }
trap stop TERM INT
wait "$ncu_pid"
wait "$ncu_pid"

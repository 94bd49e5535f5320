#!/usr/bin/env bash
# The one script for the GPU machine: runs every GPU test (label gpu) and the
# DSA benchmarks, writes full logs to $OUT and prints a short summary last.
#
#   scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR   (on the build machine)
#       copies the GPU test binaries and the benchmark out of a CUDA build
#       (cmake -S . -B BUILD_DIR -G Ninja -DMEGACTX_CUDA=ON; build targets
#       indexer_topk_test sparse_mla_test attention_stack_test dsa_attention_bench)
#       with the non-system shared libraries they need into PACK_DIR/{bin,lib}.
#   scripts/gpu-check.sh PACK_DIR [--quick]            (on the GPU machine)
#       runs them: tests in parallel, compute-sanitizer memcheck + racecheck,
#       then the benchmark and the PyTorch peer baselines one at a time.
set -uo pipefail

if [[ "${1:-}" == "--pack" ]]; then
  build=$2 pack=$3
  mkdir -p "$pack/bin" "$pack/lib"
  for binary in "$build"/tests/cuda/*_test "$build"/bench/cuda/dsa_attention_bench; do
    [[ -x "$binary" ]] || continue
    cp "$binary" "$pack/bin/" && strip "$pack/bin/$(basename "$binary")"
    ldd "$binary" | awk '/=> \// {print $3}' | while read -r library; do
      case "$(basename "$library")" in
        libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
        libcuda*|libcublas*|libnvidia*) ;;  # the GPU machine's CUDA toolkit provides these
        *) cp -L "$library" "$pack/lib/" ;;
      esac
    done
  done
  du -sh "$pack"
  exit 0
fi

pack=${1:?usage: scripts/gpu-check.sh PACK_DIR [--quick]}
quick=${2:-}
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader >"$out/tests.log" 2>&1
note "gpu: $(head -1 "$out/tests.log")"

# 1. Tests, each binary in parallel (their CPU references take most of the time).
pids=()
for test in "$pack"/bin/*_test; do
  ("$test" --gtest_color=no >"$out/$(basename "$test").part" 2>&1; echo "exit $?" >>"$out/$(basename "$test").part") &
  pids+=($!)
done
# 2. compute-sanitizer at the same time (memcheck on every test but the 1M one,
#    racecheck on the shared-memory kernels).
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
(
  for test in "$pack"/bin/*_test; do
    echo "== memcheck $(basename "$test")"
    timeout 300 "$sanitizer" --tool memcheck --leak-check full "$test" --gtest_color=no \
      --gtest_filter='-*OneMillion*:*DefaultSplits*' 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|error" | head -20
  done
  echo "== racecheck"
  timeout 240 "$sanitizer" --tool racecheck "$pack/bin/sparse_mla_test" --gtest_color=no \
    --gtest_filter='*ManySplitsSingleRow*' 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|hazard" | head -10
  timeout 240 "$sanitizer" --tool racecheck "$pack/bin/indexer_topk_test" --gtest_color=no \
    --gtest_filter='*MtpVerification*:*Ties*' 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|hazard" | head -10
) >"$out/sanitizer.log" 2>&1 &
sanitizer_pid=$!
wait "${pids[@]}"
for part in "$out"/*.part; do cat "$part" >>"$out/tests.log"; rm -f "$part"; done
note "tests: $(grep -c '^\[       OK \]' "$out/tests.log") ok, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$out/tests.log") failed"
grep '^\[  FAILED  \] [A-Za-z]' "$out/tests.log" | sort -u | head -20 | tee -a "$summary"
wait "$sanitizer_pid"
note "sanitizer: $(grep -E 'SUMMARY' "$out/sanitizer.log" | tr '\n' ';')"

# 3. Benchmarks, one at a time.
bench_args=()
[[ "$quick" == "--quick" ]] && bench_args+=(--quick)
timeout 420 "$pack/bin/dsa_attention_bench" "${bench_args[@]}" >"$out/bench.md" 2>&1
note "bench exit $?"
timeout 300 python3 tools/bench/dsa_torch_baseline.py "${bench_args[@]}" --json "$out/torch_baseline.json" \
  >"$out/torch_baseline.md" 2>&1
note "torch baseline exit $?"

echo
echo "==== summary ===="
cat "$summary"
grep -E '^\| (1024K|128K) \| 1 |^\| 64x2 |^\| 1024K \|' "$out/bench.md" | head -8
grep -E 'topk\(2048\) of 1024K|matmul\+relu\+sum\+topk' "$out/torch_baseline.md" | tail -2

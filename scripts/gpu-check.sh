#!/usr/bin/env bash
# The one script for the GPU machine: runs every GPU test (label gpu) and the
# DSA benchmarks, writes full logs to $OUT and prints a short summary last.
#
#   [GPU_PACK_ONLY="megactx a_test ..."] scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR   (build machine)
#       copies the GPU test binaries (every tests/<folder> whose CMakeLists.txt
#       says LABELS gpu) and the bench/cuda executables out of a CUDA build
#       (cmake -S . -B BUILD_DIR -G Ninja -DMEGACTX_CUDA=ON; build those
#       targets, e.g. indexer_topk_test sparse_mla_test attention_stack_test
#       dsa_attention_bench) with the non-system shared libraries they need
#       into PACK_DIR/{bin,lib}.
#   scripts/gpu-check.sh PACK_DIR [--quick]            (on the GPU machine)
#       runs them: tests in parallel, compute-sanitizer memcheck + racecheck + synccheck,
#       then the benchmark and the PyTorch peer baselines one at a time.
set -uo pipefail

if [[ "${1:-}" == "--pack" ]]; then
  build=$2 pack=$3
  rm -rf "$pack" && mkdir -p "$pack/bin" "$pack/lib"
  # Every test folder whose CMakeLists.txt gives LABELS gpu, and the CUDA benchmarks.
  binaries=()
  for folder in $(grep -l "LABELS gpu" tests/*/CMakeLists.txt | xargs -n1 dirname | xargs -n1 basename); do
    binaries+=("$build/tests/$folder"/*_test)
  done
  binaries+=("$build"/bench/cuda/* "$build/bench/engine/host_tier_bench" "$build/megactx")
  for binary in "${binaries[@]}"; do
    [[ -f "$binary" ]] || continue
    [[ -x "$binary" ]] || continue
    # GPU_PACK_ONLY="megactx cuda_ops_test ...": only these binaries (the run
    # tool carries at most 64 MiB together with the tracked tree, ~46 MiB).
    [[ -z "${GPU_PACK_ONLY:-}" || " $GPU_PACK_ONLY " == *" $(basename "$binary") "* ]] || continue
    cp "$binary" "$pack/bin/" && strip "$pack/bin/$(basename "$binary")"
    ldd "$binary" | awk '/=> \// {print $3}' | while read -r library; do
      case "$(basename "$library")" in
        libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
        libcuda*|libcublas*|libnvidia*) ;;  # the GPU machine's CUDA toolkit provides these
        *) cp -L "$library" "$pack/lib/" ;;
      esac
    done
  done
  # OpenBLAS alone is 36 MB: binaries and libraries travel xz-compressed (the carry limit is
  # 64 MiB together with the tree).
  # A 256 MiB window spans all the statically linked binaries, so their shared code is stored
  # once (xz -9's 64 MiB window spans two or three: 19 against 15 MB for seven binaries).
  XZ_OPT='--lzma2=preset=9,dict=256MiB' tar -C "$pack" -cJf "$pack/pack.tar.xz" bin lib &&
    rm -rf "${pack:?}/bin" "${pack:?}/lib"
  du -sh "$pack"
  exit 0
fi

pack=${1:?usage: scripts/gpu-check.sh PACK_DIR [--quick]}
quick=${2:-}
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
if [[ -f "$pack/pack.tar.xz" ]]; then
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf "$pack/pack.tar.xz"
  pack=$unpacked
fi
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
# NCCL for the communicator's tests: $MEGACTX_NCCL_LIBRARY, else the copy PyTorch's wheels bring
# (the CUDA toolkit has none), else whatever the loader finds.
if [[ -z "${MEGACTX_NCCL_LIBRARY:-}" ]]; then
  nccl=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [[ -n "$nccl" && -f "$nccl" ]] && export MEGACTX_NCCL_LIBRARY=$nccl
fi
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader >"$out/tests.log" 2>&1
note "gpu: $(head -1 "$out/tests.log")"

# 1. Tests, each binary in parallel (their CPU references take most of the time).
# GPU_CHECK_TESTS=0 skips them (a sanitizer-only call: every sanitizer job runs its case too); a
# list of binary names (GPU_CHECK_TESTS="fused_indexer_topk_test sparse_mla_test") runs only those.
pids=()
[[ "${GPU_CHECK_TESTS:-1}" == 0 ]] || for test in "$pack"/bin/*_test; do
  [[ "${GPU_CHECK_TESTS:-1}" == 1 || " ${GPU_CHECK_TESTS} " == *" $(basename "$test") "* ]] || continue
  # The group binary forks ranks that each build a model, case after case:
  # beside the other binaries it needs more than the default (it ran out of
  # 300 s sharing the GPU with cuda_group_serve_test, 2026-12-05); a device
  # call lasts at most 600 s.
  limit=${TEST_TIMEOUT:-300}
  [[ "$(basename "$test")" == cuda_model_group_test ]] && limit=${GROUP_TEST_TIMEOUT:-540}
  (timeout "$limit" "$test" --gtest_color=no >"$out/$(basename "$test").part" 2>&1; echo "$(basename "$test") exit $?" >>"$out/$(basename "$test").part") &
  pids+=($!)
done
# 2. compute-sanitizer at the same time (memcheck on every test but the 1M one,
#    racecheck on the shared-memory kernels). GPU_CHECK_SANITIZER=full instead
#    runs memcheck on every test case separately (slow: minutes per model-level
#    case), so that every case finishes under it; SANITIZER_CASES (a regex over
#    "binary Suite.Case") picks a share when one call is not long enough.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitize() {  # tool binary filter
  echo "== $1 $(basename "$2") ($3)"
  timeout "${SANITIZER_TIMEOUT:-120}" "$sanitizer" --tool "$1" "$2" --gtest_color=no --gtest_filter="$3" 2>&1 |
    grep -E "SUMMARY|PASSED|FAILED|Invalid|hazard|rror" | head -20
}
sanitizer_pids=()
if [[ "${GPU_CHECK_SANITIZER:-1}" == 1 ]]; then
  for test in "$pack"/bin/*_test; do
    sanitize memcheck "$test" '-*OneMillion*:*DefaultSplits*:*KeepsTheTargetDistribution*' >"$out/memcheck_$(basename "$test").sanitizer" 2>&1 &
    sanitizer_pids+=($!)
  done
  sanitize racecheck "$pack/bin/sparse_mla_test" '*ManySplitsSingleRow*' >"$out/racecheck_mla.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize racecheck "$pack/bin/sparse_mla_test" '*WgmmaPrefillOddTopK*:*WgmmaPrefillOneHundred*:*Fp8RingPrefillOddTopK*' \
    >"$out/racecheck_mla_wgmma.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize racecheck "$pack/bin/indexer_topk_test" '*MtpVerification*:*Ties*' >"$out/racecheck_indexer.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  [[ -x "$pack/bin/fused_indexer_topk_test" ]] &&
    sanitize racecheck "$pack/bin/fused_indexer_topk_test" '*ScoresMatch*:*FewCtas*:*DecodeLike*' \
      >"$out/racecheck_fused_indexer.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  # synccheck on the warp-specialised kernels: their named barriers must be
  # reached as PTX allows (an aligned barrier from one instruction, converged);
  # the fused indexer lost candidates when they were not.
  [[ -x "$pack/bin/fused_indexer_topk_test" ]] &&
    sanitize synccheck "$pack/bin/fused_indexer_topk_test" '*FewCtas*:*SixtyFourHeads*' \
      >"$out/synccheck_fused_indexer.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize synccheck "$pack/bin/sparse_mla_test" '*WgmmaPrefillOddTopK*:*Fp8RingPrefillOddTopK*' >"$out/synccheck_mla.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  # The cluster top-k's warp-collective claims and cluster barriers (not yet run under synccheck).
  sanitize synccheck "$pack/bin/indexer_topk_test" '*Ties*:*LongestRows*' >"$out/synccheck_indexer.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize racecheck "$pack/bin/position_topk_test" '*Ragged*:*TiesAtTheThreshold*:*SharedMemoryLimit*' \
    >"$out/racecheck_position_topk.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize racecheck "$pack/bin/cuda_moe_test" '*PlanMatches*:*GroupedExperts*' >"$out/racecheck_moe.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
  sanitize racecheck "$pack/bin/dsa_fast_path_test" '*Glue*' >"$out/racecheck_fast_path.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
fi
if [[ "${GPU_CHECK_SANITIZER:-1}" == full ]]; then
  # Every test case on its own under memcheck, and every case of the binaries
  # that run shared-memory kernels under racecheck, SANITIZER_JOBS at a time: a
  # model- or engine-level binary takes longer than one timeout under memcheck
  # as a whole, its cases one by one do not. SANITIZER_TOOLS picks the tools,
  # SANITIZER_CASES (a regex over "tool binary Suite.Case") a share of the jobs
  # when one call is not long enough. The slowest binaries go first.
  racecheck_binaries=${RACECHECK_BINARIES:-attention_stack_test dsa_fast_path_test indexer_topk_test fused_indexer_topk_test
    position_topk_test sparse_mla_test cuda_gemm_test cuda_fp8_weights_test cuda_moe_test
    cuda_moe_fp8_test device_sampler_test cuda_sampler_test cuda_model_test}
  # The model-level binary's cases that reach the dense and fallback kernels
  # (norms, RoPE, softmax, fallback indexer/attention) under racecheck; its
  # other cases run the same kernels on more inputs.
  racecheck_model_cases=${RACECHECK_MODEL_CASES:-Fp32PrefillMatchesCpuModel|BatchedSequencesDoNotMix|BadInputIsAnError}
  # Whole-model cases of the MoE binaries run the grouped-expert kernels that
  # their kernel-level cases race-check, for minutes more under racecheck.
  racecheck_skip_cases=${RACECHECK_SKIP_CASES:-WholeModel|GlmFp8DeviceMoe}
  slow_first="cuda_engine_test cuda_speculative_test cuda_model_test cuda_fp8_weights_test cuda_fast_attention_test cuda_graph_test cuda_moe_test cuda_moe_fp8_test"
  for test in $slow_first; do [[ -x "$pack/bin/$test" ]] && echo "$pack/bin/$test"; done >"$out/binaries.txt"
  for test in "$pack"/bin/*_test; do grep -qx "$test" "$out/binaries.txt" || echo "$test"; done >>"$out/binaries.txt"
  while read -r test; do
    "$test" --gtest_list_tests 2>/dev/null |
      awk -v bin="$test" '/^[^ ]/ {suite = $1} /^  / {print bin, suite $1}' |
      while read -r binary case; do
        [[ " ${SANITIZER_TOOLS:-memcheck racecheck} " == *" memcheck "* ]] && echo "memcheck $binary $case"
        if [[ " ${SANITIZER_TOOLS:-memcheck racecheck} " == *" racecheck "* &&
          " $(echo $racecheck_binaries) " == *" $(basename "$binary") "* ]] &&
          [[ "$(basename "$binary")" != cuda_model_test || "$case" =~ $racecheck_model_cases ]] &&
          ! [[ "$case" =~ $racecheck_skip_cases ]]; then
          echo "racecheck $binary $case"
        fi
      done
  done <"$out/binaries.txt" | grep -E "${SANITIZER_CASES:-.}" |
    # SANITIZER_SKIP: a file of job lines ("tool binary-name case") already clean in an earlier call.
    awk -v skip="${SANITIZER_SKIP:-}" 'BEGIN { if (skip != "") while ((getline line < skip) > 0) done[line] = 1 }
      { n = split($2, parts, "/"); if (!((($1 " " parts[n] " " $3)) in done)) print }' >"$out/sanitizer_jobs.txt"
  rm -f "$out/binaries.txt"
  # SANITIZER_BUDGET: seconds from here after which no job starts and running
  # ones stop (so one device call ends in time); SANITIZER_TIMEOUT: per job.
  # Cases that make a CUDA call fail on purpose (a start-up allocation larger
  # than the device) run with API-error reports off; memory accesses are still checked.
  # MEGACTX_UNDER_SANITIZER=1 lets the slowest engine cases shorten their runs (same paths).
  export sanitizer sanitizer_deadline=$(($(date +%s) + ${SANITIZER_BUDGET:-100000}))
  # RACECHECK_EXCLUDE_KERNELS (a kernel-name substring) leaves kernels out of
  # racecheck; none by default: excluding cuBLAS's nvjet kernels made the
  # sanitizer fail on a hardware exception (CUDA 13.0, H200). Hazards reported
  # only inside cuBLAS's own nvjet GEMM kernels get their own verdict below.
  export expected_api_errors=${EXPECTED_API_ERRORS:-CudaEngineMemory.TooSmallBudgetsAreErrors} MEGACTX_UNDER_SANITIZER=1
  export racecheck_exclude=${RACECHECK_EXCLUDE_KERNELS:-}
  # One line per job: "tool binary case: clean|clean, host only|ERRORS|timeout|not started
  # (summary; test result; seconds)".
  xargs -P "${SANITIZER_JOBS:-12}" -L 1 bash -c \
    'start=$SECONDS
     limit=$((sanitizer_deadline - $(date +%s)))
     ((limit > ${SANITIZER_TIMEOUT:-550})) && limit=${SANITIZER_TIMEOUT:-550}
     if ((limit < 5)); then echo "$0 $(basename "$1") $2: not started (budget spent)"; exit 0; fi
     options=()
     [[ "$2" =~ ^($expected_api_errors)$ ]] && options+=(--report-api-errors no)
     [[ "$0" == racecheck && -n "$racecheck_exclude" ]] && options+=(--kernel-name-exclude "kns=$racecheck_exclude")
     log=$(timeout "$limit" "$sanitizer" --tool "$0" "${options[@]}" "$1" --gtest_color=no \
       --gtest_filter="$2" 2>&1)
     status=$?
     if [[ "$0" == racecheck && ${#options[@]} -gt 0 ]] && ! grep -q "SUMMARY" <<<"$log" &&
       grep -qiE "unrecognized|unknown option|invalid option" <<<"$log"; then
       log=$(timeout "$limit" "$sanitizer" --tool "$0" "$1" --gtest_color=no --gtest_filter="$2" 2>&1)
       status=$?
     fi
     summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" <<<"$log" | head -1 | sed "s/^========= //")
     result=$(grep -oE "^\[  (PASSED|FAILED)  \]" <<<"$log" | head -1 | tr -d "[] ")
     # A host-only case creates no CUDA context: the sanitizer prints no summary.
     if [[ -z "$summary" && "$result" == PASSED ]]; then verdict="clean, host only"
     elif [[ -z "$summary" ]]; then verdict=timeout
     elif grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" <<<"$summary"; then verdict=clean
     elif [[ "$0" == racecheck && "$result" == PASSED ]] && grep -q "Race reported between" <<<"$log" &&
       ! grep -E -A1 "Race reported between" <<<"$log" | grep -E "access at" | grep -vq "access at nvjet_"; then
       verdict="clean, hazards only inside cuBLAS nvjet kernels"
     else verdict=ERRORS; fi
     line="$0 $(basename "$1") $2: $verdict (${summary:-no summary}; test ${result:-unfinished}; $((SECONDS - start)) s)"
     [[ $verdict == ERRORS || $verdict == *nvjet* ]] && line+=$'"'"'\n'"'"'$(grep -E "^=========" <<<"$log" | head -40 | sed "s/^/    /")
     echo "$line"' \
    <"$out/sanitizer_jobs.txt" >"$out/sanitizer_full.sanitizer" 2>&1 &
  sanitizer_pids+=($!)
fi
if [[ "${GPU_CHECK_TESTS:-1}" != 0 ]]; then
  wait "${pids[@]}"
  for part in "$out"/*_test.part; do cat "$part" >>"$out/tests.log"; rm -f "$part"; done
  note "tests: $(grep -c '^\[       OK \]' "$out/tests.log") ok, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$out/tests.log") failed"
  grep '^\[  FAILED  \] [A-Za-z]' "$out/tests.log" | sort -u | head -20 | tee -a "$summary"
  # What failed, in the summary itself (the logs may not come back from a device call).
  grep -A6 ': Failure$' "$out/tests.log" | head -40 | tee -a "$summary"
  # The sparse MLA prefill kernel's f16-ring layout at one split too (the
  # fp8-ring layout's fallback, MEGACTX_SPARSE_MLA_FP8RING=0) through the
  # model's fast path against its reference paths.
  if [[ -x "$pack/bin/cuda_fast_attention_test" ]]; then
    MEGACTX_SPARSE_MLA_FP8RING=0 timeout "${TEST_TIMEOUT:-300}" "$pack/bin/cuda_fast_attention_test" \
      --gtest_color=no >"$out/f16ring_fast_attention.log" 2>&1
    note "cuda_fast_attention_test with MEGACTX_SPARSE_MLA_FP8RING=0 exit $?"
  fi
  # The routed experts' split along k forced on at every grid size (by default
  # only small grids split: expert_kernels.h), and forced off.
  for split in on off; do
    [[ $split == on ]] && bf16_split=4 fp8_split=2 || bf16_split=1 fp8_split=1
    if [[ -x "$pack/bin/cuda_moe_test" ]]; then
      MEGACTX_BF16_EXPERT_SPLIT_K=$bf16_split timeout "${TEST_TIMEOUT:-300}" "$pack/bin/cuda_moe_test" \
        --gtest_color=no >"$out/split_k_${split}_moe.log" 2>&1
      note "cuda_moe_test with MEGACTX_BF16_EXPERT_SPLIT_K=$bf16_split exit $?"
    fi
    if [[ -x "$pack/bin/cuda_moe_fp8_test" ]]; then
      MEGACTX_FP8_EXPERT_SPLIT_K=$fp8_split timeout "${TEST_TIMEOUT:-300}" "$pack/bin/cuda_moe_fp8_test" \
        --gtest_color=no >"$out/split_k_${split}_moe_fp8.log" 2>&1
      note "cuda_moe_fp8_test with MEGACTX_FP8_EXPERT_SPLIT_K=$fp8_split exit $?"
    fi
  done
  # The decode switches that are not the default (docs/development.md): the weight prefetch, the
  # experts reading the norm's fp8 copy, the SwiGLU GEMV, together;
  # the tensor-core bf16 linear at 9-64 rows; through the model tests they change; and the fused
  # router and the bf16 GEMV switched off (their cuBLAS fallbacks); and the decode sparse MLA
  # loading its slots and entries after the grid-dependency wait, behind a query pack (as before);
  # and its scores kept in registers; the fp8-ring prefill's output scales loaded ahead, and its
  # ping-pong consumers, free-running and alternating; decode's splits on the fp8 ring (not yet
  # measured).
  for switches in \
    "MEGACTX_WEIGHT_PREFETCH=1 MEGACTX_MOE_SHARED_FP8_INPUT=1 MEGACTX_BF16_GEMV_SWIGLU=1" \
    "MEGACTX_SPARSE_MLA_EARLY_INPUTS=0" \
    "MEGACTX_SPARSE_MLA_REGISTER_SCORES=1" \
    "MEGACTX_SPARSE_MLA_SCALES_AHEAD=1" \
    "MEGACTX_SPARSE_MLA_PINGPONG=1" \
    "MEGACTX_SPARSE_MLA_PINGPONG=2" \
    "MEGACTX_SPARSE_MLA_FP8RING_SPLITS=1" \
    "MEGACTX_BF16_SKINNY=1" \
    "MEGACTX_BF16_SKINNY=1 MEGACTX_BF16_SKINNY_DEEP=1" \
    "MEGACTX_FUSED_ROUTER=0 MEGACTX_BF16_GEMV=0"; do
    for test in cuda_moe_test cuda_moe_fp8_test cuda_fp8_weights_test cuda_model_test \
      sparse_mla_test; do
      [[ -x "$pack/bin/$test" ]] || continue
      env $switches timeout "${TEST_TIMEOUT:-300}" "$pack/bin/$test" --gtest_color=no \
        >"$out/switches_${switches//[ =]/_}_$test.log" 2>&1
      note "$test with $switches exit $?"
    done
  done
fi
wait "${sanitizer_pids[@]}"
: >"$out/sanitizer.log"
for part in "$out"/*.sanitizer; do
  [[ -f "$part" ]] && cat "$part" >>"$out/sanitizer.log" && rm -f "$part"
done
if [[ -f "$out/sanitizer_jobs.txt" ]]; then
  jobs_run=$(grep -cE '^(memcheck|racecheck) ' "$out/sanitizer.log")
  note "sanitizer per case: $(wc -l <"$out/sanitizer_jobs.txt") jobs ($(grep -c '^memcheck' "$out/sanitizer_jobs.txt") memcheck, $(grep -c '^racecheck' "$out/sanitizer_jobs.txt") racecheck), $jobs_run reported: $(grep -c ': clean (' "$out/sanitizer.log") clean, $(grep -c ': clean, host only' "$out/sanitizer.log") host only, $(grep -c ': clean, hazards only inside cuBLAS' "$out/sanitizer.log") with hazards only inside cuBLAS, $(grep -c ': ERRORS (' "$out/sanitizer.log") with errors, $(grep -c ': timeout (' "$out/sanitizer.log") timed out, $(grep -c ': not started' "$out/sanitizer.log") not started"
  grep -E '^(memcheck|racecheck) ' "$out/sanitizer.log" | grep -v -e ': clean (' -e ': clean, host only' | head -30 | tee -a "$summary"
  rm -f "$out/sanitizer_jobs.txt"
else
  note "sanitizer: $(grep -E 'SUMMARY' "$out/sanitizer.log" | tr '\n' ';')"
fi

# The CLI on the GPU: generate / serve --device cuda against the CPU, every
# CUDA switch (tests/cuda_engine/cli_devices_test.py --cuda).
if [[ "${GPU_CHECK_CLI:-1}" == 1 ]]; then
  timeout "${CLI_TIMEOUT:-400}" python3 tests/cuda_engine/cli_devices_test.py --megactx "$pack/bin/megactx" --cuda \
    >"$out/cli_devices.log" 2>&1
  note "cli_devices_test --cuda exit $?"
  # The web UI's calls answered by the CUDA server as by the CPU one (no browser
  # on this machine; tests/web/web_api_devices_test.py).
  timeout "${CLI_TIMEOUT:-400}" python3 tests/web/web_api_devices_test.py --megactx "$pack/bin/megactx" \
    --cuda >"$out/web_api_devices.log" 2>&1
  note "web_api_devices_test --cuda exit $?"
  # serve --device cuda --tensor-parallel-size 2 (and experts split) on this
  # machine's GPU(s): ranks on one GPU over host collectives and over NCCL.
  timeout "${CLI_TIMEOUT:-400}" python3 tests/cuda_engine/cuda_group_serve_test.py \
    --megactx "$pack/bin/megactx" --fixture tests/fixtures/hf/glm_schedule \
    >"$out/cuda_group_serve.log" 2>&1
  note "cuda_group_serve_test exit $?"
  grep -E "^(ok|FAIL)" "$out/cuda_group_serve.log" | tee -a "$summary"
fi

# The RL trainer loop with the policy and teacher servers on the GPU in the
# fp32 mode; the machine's PyTorch trains on its CPU (exit 77: no torch).
if [[ "${GPU_CHECK_TRAINER:-1}" == 1 ]]; then
  timeout "${TRAINER_TIMEOUT:-600}" python3 tests/e2e/trainer_loop_test.py --megactx "$pack/bin/megactx" \
    --model models/default --device cuda --nccl-group >"$out/trainer_loop.log" 2>&1
  note "trainer_loop_test --device cuda exit $?"
  grep -E "max \|" "$out/trainer_loop.log" | sed 's/^ *//' | tee -a "$summary"
  # Weight updates of a native fp8 checkpoint on the GPU (fp8 weights, the CUDA default).
  timeout 200 python3 tests/e2e/fp8_weight_update_test.py --megactx "$pack/bin/megactx" \
    -- --device cuda >"$out/fp8_weight_update.log" 2>&1
  note "fp8_weight_update_test --device cuda exit $?"
  grep -E "^FAIL|max \|" "$out/fp8_weight_update.log" | tee -a "$summary"
fi

# Rollout against scoring logprobs on the GPU (tests/e2e/logprob_consistency_test.py):
# bit-identical with --deterministic in the fp32 mode, with bf16 weights over
# fp8 / bf16 KV, and with native fp8 weights (the fp8 fixture, ids only); the
# same figures without it (docs/benchmarks.md).
if [[ "${GPU_CHECK_DETERMINISTIC:-1}" == 1 ]]; then
  for case in "models/default|--kv-dtype f32" "models/default|--cuda-bf16 --kv-dtype fp8" \
      "models/default|--cuda-bf16 --kv-dtype bf16" \
      "tests/fixtures/hf/glm_fp8|--skip-tokenizer-init --kv-dtype fp8"; do
    model="${case%%|*}"
    mode="${case#*|}"
    # shellcheck disable=SC2086  # $mode is a list of flags
    timeout 200 python3 tests/e2e/logprob_consistency_test.py --megactx "$pack/bin/megactx" \
      --model "$model" --expect-exact -- --device cuda --deterministic $mode \
      >>"$out/logprob_consistency.log" 2>&1
    note "logprob_consistency $model --deterministic $mode exit $?"
    # shellcheck disable=SC2086
    timeout 200 python3 tests/e2e/logprob_consistency_test.py --megactx "$pack/bin/megactx" \
      --model "$model" -- --device cuda $mode >>"$out/logprob_consistency.log" 2>&1
  done
  grep -E '^\| --' "$out/logprob_consistency.log" | tee -a "$summary"
fi

# 3. Benchmarks, one at a time. GPU_CHECK_BENCH picks them: "dsa,model" (the
#    default: the DSA attention kernels and the whole-model decode, each with
#    its PyTorch peer), "model", "dsa", "mtp" (MTP speculation through the
#    Engine on models/default, k = 0 as the baseline), "prefill" (the fused
#    indexer + top-k vs the two-kernel indexer), "deterministic" (decode through serve
#    with and without --deterministic, and scoring vs plain prefill through serve in
#    both), "profile" (ncu's device time per kernel of decode steps), "ncukernels" (ncu --set full
#    on one launch of each prefill kernel: the wgmma sparse MLA, the fused indexer), "hosttier"
#    (the host KV tier's page copies and prefix hits), "hostlatent" (the live host tier: concurrent
#    long requests through serve with and without --host-latent-memory), "decode" (decode tok/s through serve
#    against concurrency and prompt length, MTP k = 0/1/3/7, with charts), "ttft" (long-context
#    prefill: time to first token through serve from 4K to 1M tokens on GLM-5.2's attention
#    config, against its FLOP floor and transformers, with a chart), "fp8linear" (the fp8
#    linears at decode row counts against cuBLAS bf16 and the read floor), "bf16linear" (the
#    bf16 GEMV and bf16_skinny against cuBLAS and the read floor), "longdecode" (decode
#    tok/s through serve at 1K to 1M tokens of context and 1 / 4 / 16 requests on that config,
#    against its memory-read floor, with a chart), "weightsync" (a whole-model push of the
#    default model through every weight transport into a --device cuda server, CUDA tensors by
#    IPC handle for the tensor transport), "sass" (cuobjdump -sass of the kernels whose names
#    match SASS_KERNELS (default the fused indexer and the fp8-ring sparse MLA) in SASS_BINARY
#    (default megactx), xz-compressed, and what each of their loops issues per iteration:
#    tools/bench/sass_loops.py; the build machine's CUDA has no cuobjdump), any comma list, or
#    0. "decode" is matched as
#    a whole word of the list, so that "longdecode" does not run the default-model sweep too.
benches=${GPU_CHECK_BENCH:-dsa,model}
[[ "$benches" == 1 ]] && benches=dsa,model
bench_args=()
[[ "$quick" == "--quick" ]] && bench_args+=(--quick)
if [[ "$benches" == *dsa* ]]; then
  # DSA_BENCH_ARGS: more arguments, e.g. "--prefill-only --max-context 131072".
  # shellcheck disable=SC2086  # $DSA_BENCH_ARGS is a list of arguments
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/dsa_attention_bench" "${bench_args[@]}" ${DSA_BENCH_ARGS:-} >"$out/bench.md" 2>&1
  note "dsa bench exit $?"
  timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench/dsa_torch_baseline.py "${bench_args[@]}" --json "$out/torch_baseline.json" \
    >"$out/torch_baseline.md" 2>&1
  note "dsa torch baseline exit $?"
fi
if [[ "$benches" == *model* ]]; then
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/model_decode_bench" --config bench/cuda/configs/glm_1b.json \
    >"$out/model_decode.md" 2>&1
  note "model decode bench exit $?"
  # The FP8 KV cache: the fp8 DSA kernels (fast) against the fp32 fallback kernels.
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/model_decode_bench" --config bench/cuda/configs/glm_1b.json \
    --kv-dtype fp8 --precision bf16 >"$out/model_decode_fp8.md" 2>&1
  note "model decode bench (fp8 KV) exit $?"
  # Native fp8 weights (e4m3 + 128x128 scales) beside bf16, FP8 KV, fast attention.
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/model_decode_bench" --config bench/cuda/configs/glm_1b.json \
    --kv-dtype fp8 --precision bf16,fp8 --attention fast >"$out/model_decode_fp8_weights.md" 2>&1
  note "model decode bench (fp8 weights, fp8 KV) exit $?"
  timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench/decode_torch_baseline.py >"$out/model_decode_torch.md" 2>&1
  note "model decode torch baseline exit $?"
fi
if [[ "$benches" == *model* ]]; then
  # The fallback indexer's top-k (every shape the fast DSA path does not serve).
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/fallback_topk_bench" "${bench_args[@]}" >"$out/fallback_topk.md" 2>&1
  note "fallback topk bench exit $?"
fi
if [[ "$benches" == *fp8linear* ]]; then
  # The fp8 linears at decode row counts: GEMV, few-row MMA, 64x64 MMA, cuBLAS bf16, read floor.
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/fp8_linear_bench" "${bench_args[@]}" >"$out/fp8_linear.md" 2>&1
  note "fp8 linear bench exit $?"
fi
if [[ "$benches" == *bf16linear* ]]; then
  # The bf16 linears at decode row counts: the GEMV, bf16_skinny (four stages and deep), cuBLAS.
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/bf16_linear_bench" "${bench_args[@]}" >"$out/bf16_linear.md" 2>&1
  note "bf16 linear bench exit $?"
fi
if [[ "$benches" == *prefill* ]]; then
  # Indexer prefill: the fused indexer + top-k against the two-kernel path.
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/indexer_prefill_bench" "${bench_args[@]}" >"$out/indexer_prefill.md" 2>&1
  note "indexer prefill bench exit $?"
fi
if [[ "$benches" == *mtp* ]]; then
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/mtp_engine_bench" ${MTP_BENCH_ARGS:-} >"$out/mtp_engine.md" 2>&1
  note "mtp engine bench exit $?"
  # MTP through serve, always drafting and with the measured per-batch choice.
  for flag in "" "--speculative-auto"; do
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench/mtp_serve_bench.py --megactx "$pack/bin/megactx" \
      --model models/default --steps 0,3 --concurrency 1,4,16,64 --rounds 2 -- --device cuda \
      --cuda-bf16 $flag >>"$out/mtp_serve.md" 2>&1
    note "mtp serve bench ${flag:-(always drafting)} exit $?"
  done
fi
if [[ ",$benches," == *,decode,* ]]; then
  # Decode through serve on the default model: tok/s against concurrent requests at two prompt
  # lengths (DECODE_PROMPTS, default "1024 8192"), MTP k = 1, 3, 7 against k = 0 in the same
  # run, and their charts.
  for prompt in ${DECODE_PROMPTS:-1024 8192}; do
    timeout "${DECODE_TIMEOUT:-280}" python3 tools/bench/mtp_serve_bench.py --megactx "$pack/bin/megactx" \
      --model models/default --steps 0,1,3,7 --concurrency 1,4,16,64,256 --prompt-tokens "$prompt" \
      --new-tokens 128 --rounds 1 --kv-memory 24GiB --json "$out/decode_$prompt.json" -- \
      --device cuda --cuda-bf16 --max-running-requests 256 >>"$out/decode_serve.md" 2>&1
    note "decode serve sweep, prompts of $prompt tokens, exit $?"
  done
  python3 tools/bench/decode_plots.py "$out" "$out"/decode_*.json >>"$out/decode_serve.md" 2>&1
fi
if [[ "$benches" == *ttft* ]]; then
  # Time to first token through serve on the GLM-5.2 attention config (the checkpoint is made once
  # by transformers and kept in /tmp), beside the FLOP floor at this GPU's measured GEMM ceilings
  # and transformers' own forward pass, with the clocks sampled meanwhile. TTFT_ARGS: more
  # arguments, e.g. --lengths 4096,16384 or --sustained-seconds 20 (the GEMM rate held under load).
  # shellcheck disable=SC2086  # $TTFT_ARGS is a list of arguments
  timeout "${TTFT_TIMEOUT:-540}" python3 tools/bench/prefill_serve_bench.py --megactx "$pack/bin/megactx" \
    --checkpoint /tmp/glm52_attention_ckpt --json "$out/ttft.json" --plot "$out/ttft.svg" \
    ${TTFT_ARGS:-} >"$out/ttft.md" 2>&1
  note "ttft (prefill through serve) exit $?"
fi
if [[ "$benches" == *longdecode* ]]; then
  # Decode at long contexts through serve on the GLM-5.2 attention config (the ttft block's
  # checkpoint, made once in /tmp): each context prefilled once, then 1 / 4 / 16 requests of the
  # same prompt decoding from the prefix cache, beside the step's read floor (weights + the KV
  # each request reads) at this GPU's measured read bandwidth. LONG_DECODE_ARGS: more
  # arguments, e.g. --contexts 8192,131072.
  # shellcheck disable=SC2086  # $LONG_DECODE_ARGS is a list of arguments
  timeout "${LONG_DECODE_TIMEOUT:-560}" python3 tools/bench/long_decode_bench.py --megactx "$pack/bin/megactx" \
    --checkpoint /tmp/glm52_attention_ckpt --json "$out/long_decode.json" --plot "$out/long_decode.svg" \
    ${LONG_DECODE_ARGS:-} >"$out/long_decode.md" 2>&1
  note "longdecode (decode at long contexts through serve) exit $?"
fi
if [[ "$benches" == *hostlatent* ]]; then
  # The live host tier: concurrent long requests on the GLM-5.2 attention config (the ttft block's
  # checkpoint, made once in /tmp) through a plain server and one with --host-latent-memory, the
  # same --kv-memory. HOST_LATENT_ARGS: more arguments, e.g. --context 262144.
  # shellcheck disable=SC2086  # $HOST_LATENT_ARGS is a list of arguments
  timeout "${HOST_LATENT_TIMEOUT:-560}" python3 tools/bench/host_latent_bench.py --megactx "$pack/bin/megactx" \
    --checkpoint /tmp/glm52_attention_ckpt --json "$out/host_latent.json" --plot "$out/host_latent.svg" \
    ${HOST_LATENT_ARGS:-} >"$out/host_latent.md" 2>&1
  note "hostlatent (the live host tier through serve) exit $?"
fi
if [[ "$benches" == *sass* ]]; then
  # SASS of the named kernels out of one packed binary (every binary links them all; SASS_BINARY,
  # default megactx), and what each of their loops issues per iteration.
  sass="$out/${SASS_BINARY:-megactx}.sass"
  cuobjdump -sass "$pack/bin/${SASS_BINARY:-megactx}" |
    awk -v pattern="${SASS_KERNELS:-fused_indexer_topk_kernel|sparse_mla_fp8ring_kernel}" \
      '/Function : /{keep = ($0 ~ pattern)} keep' >"$sass"
  python3 tools/bench/sass_loops.py "$sass" --min-instructions 100 >"$out/sass_loops.md" 2>&1
  note "sass (kernel SASS and per-loop instruction counts) exit $?"
  xz -f "$sass"
fi
if [[ "$benches" == *weightsync* ]]; then
  # Weight sync through every transport (disk, body, shm, distributed on gloo, tensor by CUDA IPC:
  # NCCL needs a trainer GPU beside the server's, which one GPU cannot give).
  timeout "${WEIGHT_SYNC_TIMEOUT:-300}" python3 tools/bench/weight_update_bench.py \
    --megactx "$pack/bin/megactx" --model models/default --rounds 6 --cuda-tensors \
    -- --device cuda --cuda-bf16 >"$out/weight_sync.md" 2>&1
  note "weightsync (weight sync through every transport) exit $?"
fi
if [[ "$benches" == *hosttier* ]]; then
  # The host KV tier's page copies against one contiguous pinned copy, and a
  # host-tier prefix hit against recomputing the prefix (bench/engine/host_tier_bench.cpp).
  timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/host_tier_bench" --model models/default --device cuda \
    --prompt 16384 --kv-dtype bf16 >"$out/host_tier.md" 2>&1
  note "host tier bench exit $?"
fi
if [[ "$benches" == *profile* ]]; then
  # Where a decode step's device time goes, kernel by kernel: ncu (one metric, the
  # benchmark's timed steps only, graphs off so every kernel is its own launch),
  # summed per kernel by tools/bench/ncu_kernel_summary.py. PROFILE_CASES: lines of
  # "title|model_decode_bench arguments".
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  cases=${PROFILE_CASES:-"glm_1b bf16 fp8-KV batch 1|--config bench/cuda/configs/glm_1b.json --kv-dtype fp8 --precision bf16 --attention fast --batches 1
glm_1b bf16 fp8-KV batch 16|--config bench/cuda/configs/glm_1b.json --kv-dtype fp8 --precision bf16 --attention fast --batches 16
default model bf16 batch 16|--config models/default --kv-dtype bf16 --precision bf16 --batches 16 --context 512
default model bf16 batch 64|--config models/default --kv-dtype bf16 --precision bf16 --batches 64 --context 512"}
  n=0
  while IFS='|' read -r title arguments; do
    [[ -z "$title" ]] && continue
    n=$((n + 1))
    # shellcheck disable=SC2086  # $arguments is a list of flags
    timeout "${PROFILE_TIMEOUT:-240}" "$ncu_bin" --profile-from-start off --metrics gpu__time_duration.sum \
      --csv --page raw --clock-control none --log-file "$out/ncu_$n.csv" \
      "$pack/bin/model_decode_bench" $arguments --graphs off --steps 4 >"$out/ncu_$n.log" 2>&1
    note "profile '$title' exit $?"
    python3 tools/bench/ncu_kernel_summary.py "$out/ncu_$n.csv" --per 4 --title "$title" \
      >>"$out/profile.md" 2>&1
  done <<<"$cases"
fi
if [[ "$benches" == *ncukernels* ]]; then
  # Stall reasons and pipe use of the prefill kernels, one launch each: the wgmma sparse MLA (out
  # of dsa_attention_bench's prefill section) and the fused indexer + top-k (indexer_prefill_bench).
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for job in "sparse_mla_prefill_kernel dsa_attention_bench" "fused_indexer_topk_kernel indexer_prefill_bench"; do
    read -r kernel binary <<<"$job"
    timeout "${PROFILE_TIMEOUT:-240}" "$ncu_bin" --set full --kernel-name "regex:$kernel" --launch-skip 2 \
      --launch-count 1 "$pack/bin/$binary" --quick >"$out/ncu_$kernel.txt" 2>&1
    note "kernel profile $kernel exit $?"
  done
fi
if [[ "$benches" == *deterministic* ]]; then
  # What --deterministic costs: decode through serve with and without it.
  for flag in "" "--deterministic"; do
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench/mtp_serve_bench.py --megactx "$pack/bin/megactx" \
      --model models/default --steps 0 --concurrency 1,16 --rounds 2 -- --device cuda --cuda-bf16 \
      --kv-dtype fp8 $flag >>"$out/deterministic_cost.md" 2>&1
    note "deterministic cost bench ${flag:-(plain)} exit $?"
  done
  # Scoring (prefill with every position's logprob) beside plain prefill and decode, the
  # fp32 mode and bf16 + fp8 KV, each with and without the mode.
  timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench/scoring_bench.py --megactx "$pack/bin/megactx" \
    --model models/default --concurrency 1,8 --tokens 1024 --decode-tokens 64 --repeat 2 -- \
    --device cuda --kv-dtype f32 ';;' --device cuda --kv-dtype f32 --deterministic ';;' \
    --device cuda --cuda-bf16 --kv-dtype fp8 ';;' --device cuda --cuda-bf16 --kv-dtype fp8 \
    --deterministic >"$out/scoring.md" 2>&1
  note "scoring bench exit $?"
fi

echo
echo "==== summary ===="
cat "$summary"
if [[ -f "$out/bench.md" ]]; then
  grep -E '^\| (1024K|128K) \| 1 |^\| 64x2 |^\| 1024K \|' "$out/bench.md" | head -8
  grep -E 'topk\(2048\) of 1024K|matmul\+relu\+sum\+topk' "$out/torch_baseline.md" | tail -2
fi
[[ -f "$out/model_decode.md" ]] && grep -E '^\| (fp32|bf16) |copy' "$out/model_decode.md"
[[ -f "$out/model_decode_fp8.md" ]] && grep -E '^\| (fp32|bf16) ' "$out/model_decode_fp8.md"
[[ -f "$out/model_decode_fp8_weights.md" ]] && grep -E '^\| (bf16|fp8) ' "$out/model_decode_fp8_weights.md"
[[ -f "$out/model_decode_torch.md" ]] && grep -E '^\| eager' "$out/model_decode_torch.md"
[[ -f "$out/mtp_engine.md" ]] && grep -E '^\| (fp32|bf16) ' "$out/mtp_engine.md"
[[ -f "$out/fp8_linear.md" ]] && grep -E '^\| [A-Zg]' "$out/fp8_linear.md"
[[ -f "$out/indexer_prefill.md" ]] && grep -E '^\| [0-9d]' "$out/indexer_prefill.md"
[[ -f "$out/profile.md" ]] && grep -v '^$' "$out/profile.md" | head -60
[[ -f "$out/ttft.md" ]] && grep -E '^\| [0-9]+ \||^(ceilings|clocks|sustained|plan): ' "$out/ttft.md"
[[ -f "$out/long_decode.md" ]] && grep -E '^\| [0-9]+ \| [0-9]+ \||^(read bandwidth|plan): ' "$out/long_decode.md"
# A device call brings back at most 8 files from $OUT: past that, every log
# but the summary goes into one archive.
if [[ -n "${OUT:-}" && $(find "$out" -maxdepth 1 -type f | wc -l) -gt 8 ]]; then
  (cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt -printf '%P\n' |
    XZ_OPT=-6 tar -cJf logs.tar.xz -T - --remove-files)
fi
exit 0

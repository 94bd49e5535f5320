#!/usr/bin/env bash
# Runs ad-hoc steps on the GPU machine against a pack of binaries, each with its own log: what a
# session's one-off device call needs (a few tests, a benchmark, a serve run) without the whole
# of scripts/gpu-check.sh.
#
#   (build machine) GPU_PACK_ONLY="megactx cuda_model_test" scripts/gpu-check.sh --pack build .gpu-carry
#   (device, run tool with carry [".gpu-carry"])
#   bash scripts/gpu-steps.sh .gpu-carry 'timeout 200 $B/cuda_model_test' \
#       'python3 tests/e2e/trainer_loop_test.py --megactx $B/megactx --model models/default --device cuda'
#
# Each step is a shell string evaluated with $B (the unpacked binaries) and $OUT (logs come back
# from there); it prints the step's exit code, seconds and the last $TAIL (15) lines of its log.
set -uo pipefail
pack=${1:?usage: scripts/gpu-steps.sh PACK_DIR STEP...}
shift
out=${OUT:-$PWD/gpu-steps-out}
mkdir -p "$out"
export OUT=$out B=/tmp/megactx-pack/bin
# Unpacked again whenever the pack differs from the one unpacked last (a warm
# machine keeps /tmp between calls, and a pack may hold only some binaries).
if [[ -f $pack/pack.tar.xz ]]; then
  stamp=$(sha256sum "$pack/pack.tar.xz" | cut -d' ' -f1)
  if [[ "$(cat /tmp/megactx-pack/.stamp 2>/dev/null)" != "$stamp" ]]; then
    rm -rf /tmp/megactx-pack && mkdir -p /tmp/megactx-pack &&
      tar -C /tmp/megactx-pack -xJf "$pack/pack.tar.xz" && echo "$stamp" >/tmp/megactx-pack/.stamp
  fi
fi
export LD_LIBRARY_PATH=/tmp/megactx-pack/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# NCCL from PyTorch's wheels (the CUDA toolkit has none), as scripts/gpu-check.sh finds it.
if [[ -z "${MEGACTX_NCCL_LIBRARY:-}" ]]; then
  nccl=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [[ -n "$nccl" && -f "$nccl" ]] && export MEGACTX_NCCL_LIBRARY=$nccl
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
i=0
for step in "$@"; do
  i=$((i + 1))
  log=$out/step$i.log
  start=$(date +%s%N)
  (eval "$step") >"$log" 2>&1
  rc=$?
  elapsed=$((($(date +%s%N) - start) / 1000000))
  printf '== step %d rc=%d %d.%03ds: %s\n' "$i" "$rc" $((elapsed / 1000)) $((elapsed % 1000)) "${step:0:150}"
  tail -n "${TAIL:-15}" "$log"
done

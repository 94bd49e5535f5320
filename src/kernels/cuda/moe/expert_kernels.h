// Internal to kernels/cuda/moe: the arguments of the grouped expert kernels
// (one launch per projection: gate_up with the SwiGLU epilogue, or down) and
// the launchers of the bf16 tensor-core variant (grouped_experts_mma.cu) and
// the fp8 variant (grouped_experts_fp8.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct ExpertArgs {
  const float* input = nullptr;   // gate_up: x [rows, H]; down: act [pairs, I] bucket order
  const void* weights = nullptr;  // [E, weight_rows, in] float32 or bf16
  int64_t in = 0;                 // H (gate_up) or I (down)
  int64_t neurons = 0;            // I (gate_up: rows j and I + j) or H (down)
  int64_t top_k = 0;
  const int32_t* tile_count = nullptr;  // [1]
  const int32_t* tiles = nullptr;       // [max_tiles, 3]
  const int32_t* pair_of = nullptr;     // [pairs]
  float* output = nullptr;  // gate_up: act [pairs, I] bucket order; down: [rows, top_k, H]
  // fp8 weights only: `input` replaced by its quantize_e4m3_groups output
  // (input_q [rows or pairs, in] e4m3 dense, input_scale [.., ceil(in / 128)]),
  // weight_scale [E, weight_scale_rows, ceil(in / 128)] block scales with
  // weights[e]'s rows mapped to scale rows by scale_split (DeviceMatrix).
  const uint8_t* input_q = nullptr;
  const float* input_scale = nullptr;
  const float* weight_scale = nullptr;
  int64_t weight_scale_rows = 0;
  int64_t scale_split = 0;
  bool batch_invariant = false;  // GroupedMoeShape::batch_invariant
};

// bf16 weights on tensor cores (mma.sync m16n8k16, fp32 accumulation): a
// warp takes 16 weight rows, the tile's up to 32 rows are four groups of
// n = 8 columns.
void launch_bf16_mma_experts(const ExpertArgs& args, bool gate_up, int64_t max_tiles,
                             cudaStream_t stream);

// fp8 weights on tensor cores (grouped_experts_fp8.cu, mma.sync m16n8k32
// e4m3): the tile's e4m3 inputs against e4m3 weights, each 128-column
// group's sums promoted to float32 times the input's group scale and the
// weight's block scale (the dense fp8 tensor-core kernels' products).
void launch_fp8_experts(const ExpertArgs& args, bool gate_up, int64_t max_tiles,
                        cudaStream_t stream);

// Whether an expert kernel's CTA splits k over `split` warps per weight-row
// warp. Split-K adds warps where the grid alone cannot fill the GPU: on the
// H200, glm_1b's batch-1 step (96 and 128 CTAs per expert launch) went from
// 1.50 to 1.40 ms (bf16) and 1.21 to 1.18 ms (fp8) with it, while batch 16
// (432 and 576 CTAs) went from 2.05 to 2.27 and 2.08 to 2.13 ms
// (docs/benchmarks.md). So by default it splits when the grid has at most two
// CTAs per multiprocessor. `variable` (an A/B switch read once per process)
// forces it: "1" never splits, the number `split` always does; any other value
// is an error, not a silent default. expert_split_from_env returns the forced
// split, or 0 when unset (automatic); callers read it once per process.
int expert_split_from_env(const char* variable, int split);
// In the deterministic mode (batch_invariant) only the forced split applies:
// the automatic one would make a row's bits depend on its batch.
bool expert_split_k(int forced, int64_t grid_ctas, bool batch_invariant);

// The grids the automatic choice splits: at most this many CTAs per multiprocessor.
inline constexpr int64_t kExpertSplitMaxCtasPerSm = 2;

}  // namespace megactx::cuda

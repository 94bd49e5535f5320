// bf16 linears of 1..kBf16SkinnyMaxRows rows on tensor cores: y [rows, out]
// = x [rows, in] . w [out, in]^T, x and w bf16, float32 accumulation
// (mma.sync m16n8k16), y float32 or bf16. For decode batches and MTP
// verifications past the bf16 GEMV's rows (bf16_gemv.h), where cuBLAS's
// kernels take no part in programmatic dependent launch and its split-K
// adds a reduction launch per linear.
//
// A CTA owns 128 weight rows (8 warps of 16, the MMA's M) and every input
// row (up to 64: eight N = 8 column groups). Weights and x go through shared
// memory 64 k at a time (one 128-byte line per row), four stages of cp.async
// in flight, and ldmatrix gives each warp its fragments: the weights are read
// once, in whole lines, and x's traffic is rows / 128 of theirs. (A first
// form read x per warp from global memory, rows / 16 of the weights' bytes
// from L2, and lost to cuBLAS: docs/benchmarks.md.) The first stages' weights
// are requested before the grid-dependency wait: weights are never written
// by a step, so they stream while the kernel ahead finishes.
//
// Where the weight-row tiles cannot fill the GPU, `split` CTAs share a tile
// along k; each stores its float32 sums in `parts`, and the tile's last CTA
// (an atomic count in done[tile], set back to 0) adds them in part order and
// writes y. The split depends on out and in only, never on rows, so a row's
// bits do not depend on the batch it came in.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm/bf16_product.h"

namespace megactx::cuda {

inline constexpr int64_t kBf16SkinnyMaxRows = 64;
inline constexpr int kBf16SkinnyMaxSplit = 16;
inline constexpr int kBf16SkinnyWarps = 8;   // weight-row warps per CTA (16 rows each)
inline constexpr int kBf16SkinnyChunk = 64;  // k per pipeline stage

// Blas's default for bf16 linears of kBf16GemvMaxRows + 1 ..
// kBf16SkinnyMaxRows rows. Off until it has run on a GPU
// (CudaGemm.Bf16SkinnyMatchesDoubleLoops) and been measured against cuBLAS;
// MEGACTX_BF16_SKINNY=0 / 1 sets it for every Blas created afterwards.
inline constexpr bool kBf16Skinny = false;

// How deep the cp.async pipeline runs: four stages (three 64-k chunks of
// every weight row in flight), or as many as two CTAs per multiprocessor fit
// (up to six: longer runs of each row in flight, as cuBLAS's 8-16-stage
// kernels keep). ProcessDefault: kBf16SkinnyDeep, or MEGACTX_BF16_SKINNY_DEEP=0 / 1.
enum class Bf16SkinnyPipeline { ProcessDefault, FourStages, Deep };
inline constexpr bool kBf16SkinnyDeep = false;

struct Bf16Skinny : Bf16Product {
  // SwiGLU (as Bf16Gemv::swiglu): w is [2 out, in] (gate rows, then up
  // rows) and y bf16 [rows, y_stride] = silu(gate) * up with gate and up
  // rounded to bf16 first, the bits of this kernel into bf16 [rows, 2 out]
  // followed by silu_mul_bf16 (the same tiles and split).
  bool swiglu = false;
  // CTAs along k per weight-row tile: 0 chooses (bf16_skinny_plan), 1 ..
  // kBf16SkinnyMaxSplit forces it (fewer when `in` has fewer 64-wide chunks).
  int split = 0;
  Bf16SkinnyPipeline pipeline = Bf16SkinnyPipeline::ProcessDefault;
  // Scratch for a split over k, sized by bf16_skinny_plan: parts float32
  // [split, rows, weight rows], done int32 [tiles], zero before the first
  // call (each call leaves it zero).
  float* parts = nullptr;
  int64_t parts_capacity = 0;  // floats
  int32_t* done = nullptr;
  int64_t done_capacity = 0;
};

struct Bf16SkinnyPlan {
  int split = 1;
  int64_t chunks_per_part = 0;  // kBf16SkinnyChunk-wide chunks of k per part
  int64_t tiles = 0;            // CTAs along the weight rows (128 of them, SwiGLU 64 + 64)
  int64_t parts_floats = 0;     // scratch g.parts needs (0 without a split)
};
int64_t bf16_skinny_tiles(const Bf16Skinny& g);
// The split bf16_skinny would take for g (g.split, or its own choice when 0:
// as many CTAs as two per multiprocessor hold, at least four chunks of k
// each).
Bf16SkinnyPlan bf16_skinny_plan(const Bf16Skinny& g);

// Launches it when it serves the shape: 1..kBf16SkinnyMaxRows rows, `in` and
// x_stride multiples of 8, x and w 16-byte aligned, split 0 ..
// kBf16SkinnyMaxSplit; false otherwise, launching nothing (the caller runs
// cuBLAS). A split without scratch of the plan's size is an error.
bool bf16_skinny(const Bf16Skinny& g, cudaStream_t stream);

// The kernel's launch (bf16_skinny.cu), after bf16_skinny's checks and plan.
void launch_bf16_skinny(const Bf16Skinny& g, int split, int64_t chunks_per_part, bool deep,
                        cudaStream_t stream);

}  // namespace megactx::cuda

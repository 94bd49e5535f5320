// bf16 linears of 1..kBf16SkinnyMaxRows rows on tensor cores: y [rows, out]
// = x [rows, in] . w [out, in]^T, x and w bf16, float32 accumulation
// (mma.sync m16n8k16), y float32 or bf16. For decode batches and MTP
// verifications past the bf16 GEMV's rows (bf16_gemv.h), where cuBLAS's
// kernels read the weights at a fraction of the read bandwidth and take no
// part in programmatic dependent launch.
//
// A warp owns 16 weight rows (the MMA's M) and a tile of up to 32 input rows
// (four N = 8 column groups), read straight from global memory (L1 serves
// the tile to every warp). 4 weight-row warps per CTA; where that grid
// cannot fill the GPU, one weight-row warp per CTA times 8 warps along k,
// their sums added in shared memory in part order: the result does not
// depend on timing, and a row's bits depend only on the split.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm/bf16_product.h"

namespace megactx::cuda {

inline constexpr int64_t kBf16SkinnyMaxRows = 64;

// Blas's default for bf16 linears of kBf16GemvMaxRows + 1 ..
// kBf16SkinnyMaxRows rows. Off until it has run on a GPU
// (CudaGemm.Bf16SkinnyMatchesDoubleLoops) and been measured against cuBLAS;
// MEGACTX_BF16_SKINNY=0 / 1 sets it for every Blas created afterwards.
inline constexpr bool kBf16Skinny = false;

struct Bf16Skinny : Bf16Product {
  // SwiGLU (as Bf16Gemv::swiglu): w is [2 out, in] (gate rows, then up
  // rows) and y bf16 [rows, y_stride] = silu(gate) * up with gate and up
  // rounded to bf16 first, the bits of this kernel into bf16 [rows, 2 out]
  // followed by silu_mul_bf16 (the same split: the grids are the same).
  bool swiglu = false;
  // Warps along k per weight-row warp: 0 chooses (8 when the unsplit grid
  // has at most two CTAs per multiprocessor, else 1); 1 or 8 forces it.
  int split = 0;
};

// Launches it when it serves the shape: 1..kBf16SkinnyMaxRows rows, `in` and
// x_stride multiples of 8, x and w 16-byte aligned, split 0, 1 or 8; false
// otherwise, launching nothing (the caller runs cuBLAS).
bool bf16_skinny(const Bf16Skinny& g, cudaStream_t stream);

}  // namespace megactx::cuda

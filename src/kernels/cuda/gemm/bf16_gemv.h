// bf16 linears of decode batches (1..kBf16GemvMaxRows rows): y [rows, out] =
// x [rows, in] . w [out, in]^T, x and w bf16, float32 accumulation, y float32
// or bf16 (rounded to nearest even). One warp per output column streams its weight row
// in 16-byte loads, several in flight per lane; each lane sums its share of k
// for every row in k order, then the warp reduces: a row's result does not
// depend on how many rows came with it.
//
// Why not cuBLAS at these sizes: its kernels take no part in programmatic
// dependent launch (launch.cuh), so each linear of a decode step waits out
// the launch of the next and the tail of the last; this kernel can also ask
// L2 for its weights before the wait (prefetch_weights), so a 1-8 MB weight
// streams while the kernel ahead finishes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm/bf16_product.h"

namespace megactx::cuda {

// Rows bf16_gemv serves. Past 8, x's reads per weight byte make it L1- and
// FMA-bound: a 9-16-row form (two weight rows per warp) took glm_1b's bf16
// batch-16 step from 1.99 to 3.59 ms against cuBLAS on the H200 and was
// removed (docs/benchmarks.md).
inline constexpr int64_t kBf16GemvMaxRows = 8;

// Blas's default for bf16 linears of up to kBf16GemvMaxRows rows. On: its
// test passes on the H200, and it took glm_1b's bf16 batch-1 decode step from
// 1.50 to 1.27 ms against cuBLAS (docs/benchmarks.md).
inline constexpr bool kBf16Gemv = true;

// Blas::linear_swiglu_bf16's default: the dense SwiGLU MLPs' gate_up
// projection and silu_mul in one launch (Bf16Gemv::swiglu) for the rows
// Blas sends to bf16_gemv.
// Off until it has run on a GPU (CudaGemm.Bf16GemvSwigluEqualsTheGemvAndSiluMul);
// MEGACTX_BF16_GEMV_SWIGLU=0 / 1 sets it for every Blas created afterwards.
inline constexpr bool kBf16GemvSwiglu = false;

struct Bf16Gemv : Bf16Product {
  // SwiGLU: w is [2 out, in] (gate rows, then up rows, as a fused gate_up
  // projection) and y bf16 [rows, y_stride] = silu(gate) * up, gate and up
  // rounded to bf16 first: the bits of the plain GEMV into bf16 followed by
  // silu_mul_bf16 (elementwise_ops.h), in one launch. y_f32 is ignored.
  bool swiglu = false;
  bool prefetch_weights = false;
};

// Launches it when it serves the shape: 1..kBf16GemvMaxRows rows, `in` and
// x_stride multiples of 8, x and w 16-byte aligned; false otherwise,
// launching nothing (the caller runs cuBLAS).
bool bf16_gemv(const Bf16Gemv& g, cudaStream_t stream);

}  // namespace megactx::cuda

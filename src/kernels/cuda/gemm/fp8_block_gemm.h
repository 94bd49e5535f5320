// GEMM with fp8 e4m3 weights in the checkpoint's 128x128 block scaling
// (weight_scale_inv of DeepSeek/GLM fp8 checkpoints), dequantized per block
// on the fly -- the weights never exist upcast in memory:
//   y[rows, out] = x[rows, in] . (w[out, in] * scale[out / 128, in / 128])^T
// x is float32, bf16, or e4m3 with one float32 scale per 1x128 group of a row
// (x_scale, DeepGEMM-style per-token-group activations; quantize_e4m3_groups
// in gemm.h makes them) (row stride x_stride), accumulation fp32, y float32
// or bf16 (row stride y_stride). A tiled SIMT kernel: correct for any shape,
// simple; the tensor-core path (wgmma / cuBLASLt block scaling) replaces it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class ActType : uint8_t { F32, BF16, E4M3 };

// Scale row of weight row `row` under the 128x128 block scales, with rows >=
// scale_split (when > 0) restarting their blocks there (DeviceMatrix::
// scale_split in gemm.h: stacked gate/up matrices). Host and device code.
__host__ __device__ inline int64_t fp8_scale_row(int64_t row, int64_t scale_split) {
  if (scale_split > 0 && row >= scale_split)
    return (scale_split + 127) / 128 + (row - scale_split) / 128;
  return row / 128;
}

struct Fp8BlockGemm {
  const void* x = nullptr;  // [rows, in]
  ActType x_type = ActType::F32;
  int64_t x_stride = 0;
  const float* x_scale = nullptr;  // E4M3 x only: [rows, ceil(in / 128)] (dense)
  const uint8_t* w = nullptr;      // [out, in] e4m3 bytes
  const float* scale = nullptr;    // [ceil(out / 128), ceil(in / 128)] (see scale_split)
  // Rows >= scale_split (when > 0) restart their 128-row scale blocks there
  // (stacked gate/up matrices): DeviceMatrix::scale_split in gemm.h.
  int64_t scale_split = 0;
  void* y = nullptr;  // [rows, out]
  ActType y_type = ActType::F32;
  int64_t y_stride = 0;
  int64_t rows = 0, in = 0, out = 0;
  // The decode kernels (GEMV, skinny) prefetch their weight rows into L2
  // before waiting for the kernel before them (Blas::set_weight_prefetch).
  bool prefetch_weights = false;
};

void fp8_block_gemm(const Fp8BlockGemm& g, cudaStream_t stream);

// The decode shape (fp8_block_gemv.cu): up to kFp8GemvMaxRows rows of E4M3
// inputs, `in` and x_stride multiples of 16, 16-byte aligned x and w; one
// warp per output column streams its weight row. The same products as
// fp8_block_gemm in another summation order. Returns false, launching
// nothing, for any other shape (the caller runs fp8_block_gemm).
constexpr int64_t kFp8GemvMaxRows = 8;
bool fp8_block_gemv(const Fp8BlockGemm& g, cudaStream_t stream);

// Few rows on tensor cores (fp8_block_gemm_skinny.cu, mma.sync m16n8k32 with
// the weight rows as M and up to 32 input rows as N, per-128-group
// promotion): 1..kFp8SkinnyMaxRows rows of E4M3 inputs, `in` and x_stride
// multiples of 8, 8-byte aligned x and w; returns false, launching nothing,
// otherwise. Every weight byte is read once per 32 input rows, by one warp;
// where the weight has too few rows to give every SM a CTA, 2 or 4 warps
// share a row block's k groups (fp8_block_gemm_skinny_split: the split for
// a shape on a GPU of that many SMs). Sums agree with double loops to ~1e-7
// relative on the H200 (FewRowTensorCoreKernelAgreesWithTheReference).
// Blas::linear_fp8 takes it for 2..64 rows.
constexpr int64_t kFp8SkinnyMaxRows = 64;
bool fp8_block_gemm_skinny(const Fp8BlockGemm& g, cudaStream_t stream);
int fp8_block_gemm_skinny_split(int64_t rows, int64_t in, int64_t out, int multiprocessors);
// Its input tile: 8 x 1, 2 or 4 rows (the MMA's N per column group).
int fp8_block_gemm_skinny_column_groups(int64_t rows, int64_t out, int multiprocessors);

// Tensor cores (fp8_block_gemm_mma.cu, mma.sync m16n8k32 e4m3, per-128-group
// promotion to float32 with both scales): E4M3 inputs, `in` and x_stride
// multiples of 16, 16-byte aligned x and w; returns false, launching
// nothing, otherwise. Sums agree with fp8_block_gemm to ~1e-4 relative (the
// MMA's internal accumulation over 128 products is not full float32).
// Blas::linear_fp8 takes it by default for more than 64 rows (its GPU tests
// passed on the H200); MEGACTX_FP8_TENSOR_CORES=0 keeps the tiled kernel
// (and turns the few-row kernel above off too).
bool fp8_block_gemm_tensor_cores(const Fp8BlockGemm& g, cudaStream_t stream);

}  // namespace megactx::cuda

// The deterministic mode's GEMM: y[rows, out] = x[rows, in] . w[out, in]^T in
// which every output element is one chain of fused multiply-adds over k = 0,
// 1, ..., in - 1 in order (no split-K, no tile- or shape-dependent kernel
// choice), so a row's result is bit-identical whether it is computed alone (a
// decode step), among hundreds (a prefill chunk) or among k + 1 (an MTP
// verification). cuBLAS picks its algorithm, tile and split by shape, so the
// same row gets other roundings in other batches. CUDA cores, 32 x 64 output
// tiles; slower than the tensor-core GEMMs, which is the mode's price.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class GemmElement { F32, BF16 };

struct InvariantGemm {
  const void* x = nullptr;  // [rows, in], row stride x_stride
  GemmElement x_type = GemmElement::F32;
  int64_t x_stride = 0;
  // float32 x rounded to bf16 first (the bf16 mode's numerics: bf16 products).
  bool round_x_to_bf16 = false;
  const void* w = nullptr;  // [out, in], dense rows
  GemmElement w_type = GemmElement::F32;
  void* y = nullptr;  // [rows, out], row stride y_stride
  GemmElement y_type = GemmElement::F32;
  int64_t y_stride = 0;
  int64_t rows = 0, in = 0, out = 0;
  // `batch` independent products (element strides between them).
  int64_t batch = 1, x_batch_stride = 0, w_batch_stride = 0, y_batch_stride = 0;
};

// No host sync, no allocation: graph-capturable.
void batch_invariant_gemm(const InvariantGemm& g, cudaStream_t stream);

}  // namespace megactx::cuda

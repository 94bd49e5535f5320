// What the decode-linear benchmarks (fp8_linear_bench, bf16_linear_bench)
// share: their stream, read floor and cuBLAS handle, the number of weight
// copies that keeps every timed call reading HBM, the cuBLAS bf16 peer, and
// the table's empty cells.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "bench/cuda/support/read_bandwidth.h"

namespace megactx::cuda {

// A run of one: its stream, the read floor measured on it (printed under
// `title`), and a cuBLAS handle on the stream for the bf16 peer; exits with
// an error when cuBLAS cannot start.
struct LinearBenchRun {
  explicit LinearBenchRun(const char* title);
  ~LinearBenchRun();
  LinearBenchRun(const LinearBenchRun&) = delete;
  LinearBenchRun& operator=(const LinearBenchRun&) = delete;
  cudaStream_t stream = nullptr;
  ReadBandwidth floor;
  cublasHandle_t cublas = nullptr;
};

struct LinearShape {
  const char* name;
  int64_t in, out;
};

// Copies of a weight of `bytes` totalling at least 256 MiB (> 4x the 60 MB L2
// of an H200), at least 2: calls that cycle through them read HBM.
int hbm_copies(size_t bytes);

// y [rows, out] float32 = x [rows, in] . w [out, in]^T on cublasGemmEx, bf16
// inputs (what Blas runs for bf16 linears past its own kernels' rows).
void cublas_bf16_linear(cublasHandle_t handle, int64_t rows, int64_t in, int64_t out,
                        const __nv_bfloat16* w, const __nv_bfloat16* x, float* y);

// "12.34", or "-" for a kernel that did not run (us <= 0).
std::string us_or_dash(double us);

}  // namespace megactx::cuda

// The compute ceiling the sparse MLA benchmarks divide by: cuBLAS's bf16 GEMM
// of 8192^3 (fp32 accumulation) on this GPU, the median of timed runs. The sparse MLA
// kernels' f16 wgmmas run at the bf16 rate, so this is their FLOP ceiling.
#pragma once

#include <cuda_runtime.h>

namespace megactx::cuda {

// TFLOP/s of the median of `runs` timed GEMMs after one warm-up (0 when cuBLAS
// cannot be initialised). Allocates and frees three 128 MiB matrices.
double measure_bf16_gemm_tflops(int runs = 10, cudaStream_t stream = nullptr);

}  // namespace megactx::cuda

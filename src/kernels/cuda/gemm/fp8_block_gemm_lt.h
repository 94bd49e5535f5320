// The block-scaled fp8 GEMM on cuBLASLt (Hopper, CUDA 12.9+): the weights'
// 128x128 scales as CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, the
// activations' 1x128 group scales as VEC128_32F, fp32 output. Why beside the
// hand-written kernels of fp8_block_gemm.h: on wgmma with TMA it reads the
// weights at 2.1-2.8 TB/s from 8 rows on for GLM-5.2's shapes (q_b, o_proj,
// experts), where the few-row mma.sync kernel stays latency-bound (o_proj at
// 64 rows: 36 against 206 us) and the 64x64 tiled kernel is 10x slower still;
// for small matrices (glm_1b's q_a) the few-row kernel stays faster. Blas
// chooses (gemm.cpp). Accuracy: the MMA's fp8 accumulation within each 128
// group keeps ~14 mantissa bits (1-2e-4 of the largest output, as DeepGEMM's
// promotion per 128), far below the e4m3 rounding of the inputs.
//
// Scale layouts cuBLASLt reads (found against a double-loop reference on the
// H200, every other order gives garbage): the weight's [ceil(out / 128),
// ceil(in / 128)] as the checkpoint stores it, the activations' as
// [ceil(in / 128), rows] (rows fastest: quantize_e4m3_groups'
// scales_by_group).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {

class Fp8LtGemm {
 public:
  explicit Fp8LtGemm(cudaStream_t stream);
  ~Fp8LtGemm();
  Fp8LtGemm(const Fp8LtGemm&) = delete;
  Fp8LtGemm& operator=(const Fp8LtGemm&) = delete;

  // The workspace cuBLASLt may use (the same fixed one as cuBLAS: calls are
  // ordered on one stream), so captured graphs hold no per-capture buffers.
  void set_workspace(void* data, size_t bytes);
  // Whether cuBLASLt has an algorithm for this shape and layout: e4m3 x,
  // float32 y, `in` and `out` multiples of 128, rows a multiple of 8, the
  // weight's scale grid a plain one (scale_split 0 or a multiple of 128),
  // 16-byte aligned x, w and y rows.
  // Plans the shape on first sight (a heuristic query, host only).
  bool supports(const Fp8BlockGemm& g);
  // Runs `g`, whose x_scale is [ceil(in / 128), rows]; supports(g) first.
  void run(const Fp8BlockGemm& g);
  int64_t runs() const { return runs_; }

 private:
  struct Plan;
  // rows, in, out, y_stride, and the alignment (bytes, 16..256) common to the
  // x, w and y pointers, which the heuristic must be told (it assumes 256).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
  Plan* plan(const Key& key, const Fp8BlockGemm& g);

  cudaStream_t stream_ = nullptr;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t runs_ = 0;
};

}  // namespace megactx::cuda

// GEMMs on cuBLASLt, planned once per shape: the block-scaled fp8 GEMM and
// bf16 GEMMs of decode sizes.
//
// fp8 (Hopper, CUDA 12.9+): the weights' 128x128 scales as
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, the activations' 1x128 group
// scales as VEC128_32F, fp32 output. Why beside the hand-written kernels of
// fp8_block_gemm.h: on wgmma with TMA it reads the weights at 2.1-2.8 TB/s
// from 8 rows on for GLM-5.2's shapes (q_b, o_proj, experts), where the
// few-row mma.sync kernel stays latency-bound (o_proj at 64 rows: 36 against
// 206 us) and the 64x64 tiled kernel is 10x slower still; for small matrices
// (glm_1b's q_a) the few-row kernel stays faster. Blas chooses (gemm.cpp).
// Accuracy: the MMA's fp8 accumulation within each 128 group keeps ~14
// mantissa bits (1-2e-4 of the largest output, as DeepGEMM's promotion per
// 128), far below the e4m3 rounding of the inputs.
// Scale layouts cuBLASLt reads (found against a double-loop reference on the
// H200, every other order gives garbage): the weight's [ceil(out / 128),
// ceil(in / 128)] as the checkpoint stores it, the activations' as
// [ceil(in / 128), rows] (rows fastest: quantize_e4m3_groups'
// scales_by_group).
//
// bf16: the same product cublasGemmEx computes, with a say over how split-K
// sums its parts. At decode sizes (a few rows, long `in`) cuBLAS splits k and
// sums the parts in a second kernel (28 of the 174 launches of a GLM-5.2
// attention-config decode step at batch 16); LtReduction::InKernel asks the
// heuristic for algorithms that sum in the GEMM's own kernel (in place, in
// the float32 output, ordered by counters in the workspace, so the order is
// fixed) or do not split. bf16 outputs always sum their parts in float32
// (a separate kernel): in place would round every part to bf16, and without
// a split a long `in` is 2-7x slower (fp8_linear_bench).
//
// Every plan keeps the heuristic's answers (up to kMaxCandidates per query).
// With autotuning (set_autotune) a plan of up to kAutotuneMaxRows rows (the
// decode shapes that CUDA Graphs replay; a prefill chunk's row count would
// time its large GEMMs for every new chunk length) times them on the first
// run() outside a graph capture, with that call's operands, and keeps the
// fastest:
// the heuristic's first answer was up to 1.3x slower than the best of them
// at decode sizes (fp8_linear_bench). choose() picks one by hand
// (benchmarks and tests).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {

// y [rows, out] = x [rows, in] . w [out, in]^T, bf16 x and w (row strides
// x_stride and in), y bf16 or float32 (row stride y_stride); fp32 sums.
struct Bf16LtGemm {
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  void* y = nullptr;
  int64_t y_stride = 0;
  bool y_f32 = true;
  int64_t rows = 0, in = 0, out = 0;
};

// Which split-K algorithms the heuristic may answer with.
enum class LtReduction {
  Any,       // the heuristic's choice, a separate reduction kernel included
  InKernel,  // no split, or (float32 outputs) split-K summed in place by the
             // GEMM's own kernel
};

class LtGemm {
 public:
  static constexpr int kMaxCandidates = 8;
  static constexpr int64_t kAutotuneMaxRows = 64;

  explicit LtGemm(cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // The workspace cuBLASLt may use (the same fixed one as cuBLAS: calls are
  // ordered on one stream), so captured graphs hold no per-capture buffers.
  // Clears the plans (the heuristic's answers depend on its size).
  void set_workspace(void* data, size_t bytes);
  // The reduction policy of plans made afterwards (clears the plans); with
  // autotuning, float32 outputs take the candidates of both policies.
  void set_reduction(LtReduction fp8, LtReduction bf16);
  // Whether plans time their candidates (clears the plans). Off by default;
  // Blas turns it on.
  void set_autotune(bool on);

  // Whether cuBLASLt has an algorithm for this shape and layout: e4m3 x,
  // float32 or bf16 y, `in` and `out` multiples of 128, rows a multiple of 8, the
  // weight's scale grid a plain one (scale_split 0 or a multiple of 128),
  // 16-byte aligned x, w and y rows.
  // Plans the shape on first sight (a heuristic query, host only).
  bool supports(const Fp8BlockGemm& g);
  // Runs `g`, whose x_scale is [ceil(in / 128), rows]; supports(g) first.
  void run(const Fp8BlockGemm& g);

  // bf16: in, x_stride and y_stride whole 16-byte rows, 16-byte aligned
  // pointers, and an algorithm under the bf16 reduction policy.
  bool supports(const Bf16LtGemm& g);
  void run(const Bf16LtGemm& g);

  // The plan's candidates (the heuristic's answers, best first), the one
  // run() takes (a choice by hand ends autotuning for the plan), and what
  // each is (split-K parts and reduction scheme).
  int candidates(const Fp8BlockGemm& g);
  int candidates(const Bf16LtGemm& g);
  void choose(const Fp8BlockGemm& g, int candidate);
  void choose(const Bf16LtGemm& g, int candidate);
  std::string describe(const Fp8BlockGemm& g, int candidate);
  std::string describe(const Bf16LtGemm& g, int candidate);

  int64_t fp8_runs() const { return fp8_runs_; }
  int64_t bf16_runs() const { return bf16_runs_; }

 private:
  struct Plan;
  // Kind (0 fp8 -> f32, 1 bf16 -> f32, 2 bf16 -> bf16, 3 fp8 -> bf16), rows, in, out, x_stride,
  // y_stride, and the alignment (bytes, 16..256) common to the x, w and y
  // pointers, which the heuristic must be told (it assumes 256).
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static Key key_of(const Fp8BlockGemm& g);
  static Key key_of(const Bf16LtGemm& g);
  Plan* plan(const Fp8BlockGemm& g);
  Plan* plan(const Bf16LtGemm& g);
  // A plan's descriptor (fp32 compute, w transposed) and layouts: A and B of
  // cudaDataType `element`, D of `output`.
  static std::unique_ptr<Plan> new_plan(int element, int output, int64_t rows, int64_t in,
                                        int64_t out, int64_t x_stride, int64_t y_stride);
  void choose(Plan& p, int candidate);
  // Asks the heuristic for `p`'s candidates under `reduction`.
  void find_algorithms(Plan& p, LtReduction reduction, int64_t alignment, bool f32_output);
  // Times p's candidates on these operands and chooses the fastest, once per
  // plan (autotuning; decode row counts; not inside a graph capture).
  void tune(Plan& p, int64_t rows, const void* w, const void* x, void* y);
  Plan* remember(const Key& key, std::unique_ptr<Plan> plan);
  void launch(Plan& p, const void* w, const void* x, void* y);

  cudaStream_t stream_ = nullptr;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  LtReduction fp8_reduction_ = LtReduction::Any;
  LtReduction bf16_reduction_ = LtReduction::InKernel;
  bool autotune_ = false;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t fp8_runs_ = 0, bf16_runs_ = 0;
};

}  // namespace megactx::cuda

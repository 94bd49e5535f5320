// GEMMs of the CUDA model, in the CPU Backend's row-major convention:
// y[rows, out] (row stride y_stride) = x[rows, in] (row stride x_stride) . w[out, in]^T.
// fp32 runs cublasSgemm with TF32 off (the exact-parity mode); bf16 runs
// cublasGemmEx on tensor cores with fp32 accumulation; fp8 (checkpoint e4m3
// weights with 128x128 block scales, kept as shipped) quantises x to e4m3 per
// 1x128 group on the device and runs the block-scaled GEMM of fp8_block_gemm.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_skinny.h"
#include "kernels/cuda/gemm/cublaslt_gemm.h"

namespace megactx::cuda {

// A weight matrix w [out, in] (row-major) on the device: float32 (the parity
// mode), bf16 (the fast mode) or fp8 block-scaled (`scale` set: data is e4m3
// bytes, as an fp8 checkpoint ships them).
struct DeviceMatrix {
  const void* data = nullptr;
  bool bf16 = false;
  // fp8 only: weight_scale_inv [scale rows, ceil(in / 128)] float32; weight
  // row r is scaled by scale row r / 128. Two stacked checkpoint matrices (the
  // MLP's gate rows then up rows) whose first part is not a multiple of 128
  // rows: rows >= scale_split restart their 128-row blocks at scale_split,
  // i.e. use scale row ceil(scale_split / 128) + (r - scale_split) / 128
  // (fp8_scale_row in fp8_block_gemm.h).
  const float* scale = nullptr;
  int64_t scale_split = 0;
  bool fp8() const { return scale != nullptr; }
  explicit operator bool() const { return data != nullptr; }
};

// Per-token-group activation quantisation (DeepSeek/DeepGEMM style): x [rows,
// in] float32 (row stride x_stride) -> q [rows, in] e4m3 (dense) and scale
// [rows, ceil(in / 128)] with scale = amax(group) / 448 (1 for an all-zero
// group) and q = e4m3(x / scale), round to nearest even, saturating. One warp
// per group; no host sync, graph-capturable. scales_by_group: scale laid out
// [ceil(in / 128), rows] instead (what cuBLASLt's VEC128 scales read).
void quantize_e4m3_groups(const float* x, int64_t rows, int64_t in, int64_t x_stride, uint8_t* q,
                          float* scale, cudaStream_t stream, bool scales_by_group = false);

// x [rows, n] float32 (row stride x_stride) -> y [rows, n] bf16 (dense).
void float_to_bf16_rows(const float* x, int64_t rows, int64_t n, int64_t x_stride, void* y,
                        cudaStream_t stream);

class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
              int64_t out, float* y, int64_t y_stride);
  void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y) {
    linear(x, rows, in, in, w, out, y, out);
  }
  // y = x . w^T with a float32 or bf16 weight: bf16 weights round x to bf16
  // (a grow-only scratch of this Blas) and accumulate in float32.
  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
              int64_t out, float* y, int64_t y_stride);
  void linear(const float* x, int64_t rows, int64_t in, DeviceMatrix w, int64_t out, float* y) {
    linear(x, rows, in, in, w, out, y, out);
  }
  // The same with y in bf16 [rows, out] (row stride y_stride): for outputs
  // whose consumers read bf16 anyway (the MLA queries of the bf16 absorbed
  // products), half the bytes and no conversion after. bf16 or fp8 weights
  // (fp8: the block-scaled GEMM writes bf16), not in the deterministic mode.
  void linear_to_bf16(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                      int64_t out, void* y, int64_t y_stride);
  // A SwiGLU MLP's first half in one launch when it can: act [rows, inter]
  // bf16 = silu(gate) * up of the bf16 gate_up projection (w [2 inter, in],
  // bf16), the bits of linear_to_bf16 into [rows, 2 inter] followed by
  // silu_mul_bf16. Only with the switch on (kBf16GemvSwiglu), for the rows
  // Blas sends to bf16_gemv or bf16_skinny (their SwiGLU forms), bf16
  // weights, outside the deterministic mode, and shapes they serve;
  // otherwise returns false having launched nothing.
  bool linear_swiglu_bf16(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                          DeviceMatrix w, int64_t inter, void* act);
  // `batch` independent linears: x_b = x + b * x_batch_stride, w_b = w + b *
  // w_batch_stride, y_b = y + b * y_batch_stride (per-head MLA absorption).
  void linear_batched(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                      int64_t x_batch_stride, const float* w, int64_t out, int64_t w_batch_stride,
                      float* y, int64_t y_stride, int64_t y_batch_stride, int64_t batch);
  // linear_batched on bf16 inputs and weights (tensor cores, float32
  // accumulate; y float32 when y_f32, else bf16): for products whose input
  // or consumer is bf16 already (the sparse MLA's packed queries and its
  // output). Not for the deterministic mode.
  void linear_batched_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride,
                           int64_t x_batch_stride, const void* w, int64_t out,
                           int64_t w_batch_stride, void* y, int64_t y_stride,
                           int64_t y_batch_stride, int64_t batch, bool y_f32);
  // Inputs already rounded to bf16 by the kernel that wrote them (rmsnorm,
  // add_rmsnorm, silu_mul with their bf16 outputs): share_input(x, ..., x_bf16)
  // says that x [rows, in] (row stride x_stride) has the copy x_bf16 [rows, in]
  // (dense) until unshare_input(x) or clear_shared_inputs(); a bf16 linear of
  // that input, or of a block of its rows (x + r * x_stride, the same in and
  // stride), reads the copy instead of converting x. The writer of x
  // must write the copy too. float32 and fp8 weights, and the deterministic
  // mode, read x as before. At most kSharedInputs at a time; a null x_bf16
  // shares nothing (the float32 mode makes no copies).
  // f32_written = false: the writer wrote only the copy (every linear of x
  // has bf16 weights); a linear that would read x itself (float32 or fp8
  // weights, the deterministic mode, a block outside the shared rows) throws
  // instead of reading what was never written.
  static constexpr int kSharedInputs = 2;
  void share_input(const float* x, int64_t rows, int64_t in, int64_t x_stride, const void* x_bf16,
                   bool f32_written = true);
  // The same for an e4m3 copy (rmsnorm's Fp8Copy: q [rows, in] dense, the
  // group scales [rows, groups] and [groups, rows]): an fp8 linear of x, or
  // of a block of its rows, reads it instead of quantising x (cuBLASLt only
  // for all of x's rows: its scale layout has the row count as its stride).
  // Call after share_input of the same x (which replaces the slot); the
  // float32 values stay written (a linear outside the copy reads them).
  void share_fp8_input(const float* x, int64_t rows, int64_t in, int64_t x_stride, const uint8_t* q,
                       const float* scale_rows, const float* scale_groups);
  void unshare_input(const float* x);
  void clear_shared_inputs();
  // x's e4m3 copy (share_fp8_input) when one holds x [rows, in] (row stride
  // x_stride): its codes [rows, in] (dense) and group scales [rows, groups];
  // both null otherwise. For kernels that quantise their inputs themselves
  // (the grouped fp8 experts).
  struct Fp8Input {
    const uint8_t* q = nullptr;
    const float* scale_rows = nullptr;
  };
  Fp8Input fp8_copy_of(const float* x, int64_t rows, int64_t in, int64_t x_stride) const;
  // bf16 x [rows, in] . bf16 w [out, in]^T -> y (bf16, or float32 when y_f32).
  void linear_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride, const void* w,
                   int64_t out, void* y, int64_t y_stride, bool y_f32);
  // fp8 w (w.fp8()): x quantised per 1x128 group into this Blas's grow-only
  // scratch, then the block-scaled GEMM; y float32. Any shape: the ragged last
  // group / block is handled by the kernels (no padding, no dequantised copy).
  void linear_fp8(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                  int64_t out, float* y, int64_t y_stride);
  // The same with y float32 or bf16 (y_type; linear_to_bf16's fp8 weights).
  void linear_fp8(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                  int64_t out, void* y, int64_t y_stride, ActType y_type);
  // Two or more rows on the tensor-core fp8 kernels (fp8_block_gemm_skinny up
  // to 64 rows, fp8_block_gemm_tensor_cores beyond) instead of the SIMT ones
  // (the GEMV up to 8 rows, the tiled kernel). On by default (its GPU tests against double
  // loops and the CPU emulation pass on the H200); the environment variable
  // MEGACTX_FP8_TENSOR_CORES=0 turns it off for every Blas created afterwards.
  void set_fp8_tensor_cores(bool on) { fp8_tensor_cores_ = on; }
  // fp8 linears on cuBLASLt's block-scaled GEMM (cublaslt_gemm.h) where it
  // beats the hand-written kernels: more than 64 rows, or from 8 rows on for
  // large weights (fp8_lt_rows). On by default; MEGACTX_FP8_CUBLASLT=0 turns
  // it off for every Blas created afterwards (A/B runs).
  void set_fp8_cublaslt(bool on) { fp8_cublaslt_ = on; }
  // bf16 linears of up to kBf16LtMaxRows rows on cuBLASLt, its candidates
  // timed per shape (cublaslt_gemm.h: cuBLAS's own choice at decode sizes
  // adds a split-K reduction kernel per linear). Off by default: through
  // CUDA Graphs it measured neutral to 2.5% faster on the GLM-5.2 attention
  // config (batch 64: 1.97 against 2.02 ms) and 2-5% slower on glm_1b
  // (batch 4: 1.81 against 1.73 ms; docs/benchmarks.md);
  // MEGACTX_BF16_CUBLASLT=1 turns it on for every Blas created afterwards.
  // Each decode-size cuBLASLt plan (fp8 too) times the heuristic's candidates
  // on its first eager call and keeps the fastest (LtGemm::set_autotune);
  // MEGACTX_LT_AUTOTUNE=0 takes the heuristic's first answer under the
  // split-K policy of MEGACTX_FP8_LT_REDUCTION / MEGACTX_BF16_LT_REDUCTION =
  // any | inkernel (defaults: any / inkernel).
  static constexpr int64_t kBf16LtMaxRows = 64;
  void set_bf16_cublaslt(bool on) { bf16_cublaslt_ = on; }
  // Linears cuBLASLt ran so far (tests: the path was taken).
  int64_t fp8_cublaslt_runs() const;
  int64_t bf16_cublaslt_runs() const;
  // bf16 linears of up to kBf16GemvMaxRows rows on bf16_gemv (bf16_gemv.h)
  // instead of cuBLAS: a kernel that takes part in programmatic dependent
  // launch. On by default (kBf16Gemv); MEGACTX_BF16_GEMV=0 / 1 sets it for
  // every Blas created afterwards.
  void set_bf16_gemv(bool on) { bf16_gemv_ = on; }
  // The fp8 decode kernels (the GEMV, the skinny tensor-core kernel) ask L2
  // for their weight rows before waiting for the kernel ahead of them
  // (programmatic dependent launch), so the weights stream while it finishes;
  // so does bf16_gemv.
  // Same results either way. Off by default until measured;
  // MEGACTX_WEIGHT_PREFETCH=1 turns it on for every Blas created afterwards.
  void set_weight_prefetch(bool on) { weight_prefetch_ = on; }
  void set_bf16_gemv_swiglu(bool on) { bf16_gemv_swiglu_ = on; }
  // bf16 linears past bf16_gemv's rows, up to kBf16SkinnyMaxRows, on the
  // few-row tensor-core kernel (bf16_skinny.h) instead of cuBLAS: kBf16Skinny,
  // MEGACTX_BF16_SKINNY=0 / 1.
  void set_bf16_skinny(bool on) { bf16_skinny_ = on; }
  // The deterministic mode: float32 and bf16 linears on batch_invariant_gemm
  // (batch_invariant_gemm.h) instead of cuBLAS; fp8 weights on the tiled
  // block-scaled kernel at every row count.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }
  // linear_batched (the per-head MLA absorption products) on TF32 tensor cores
  // (inputs rounded to a 10-bit mantissa, finer than the bf16 mode's own bf16
  // rounding) instead of pedantic fp32 FFMA: the bf16 and fp8-weight modes turn
  // it on (at 1M-token prefill the fp32 products took 9 of 42 s on the H200).
  // The deterministic mode's kernel is unaffected.
  void set_batched_tf32(bool on) { batched_tf32_ = on; }

  // A caller-owned cuBLAS workspace (cublasSetWorkspace): captured CUDA
  // Graphs and eager launches then share one fixed workspace (without it,
  // cuBLAS allocates one per capture).
  void set_workspace(void* data, size_t bytes);
  // How often a grow-only scratch of this Blas was reallocated: a captured
  // CUDA Graph holds the address it was captured with, so a change means the
  // graph must be captured again (model/cuda/decode_graph.h).
  uint64_t reallocations() const { return reallocations_; }

 private:
  // Grows a scratch buffer (synchronising first: the previous kernel on this
  // stream may still read it). After warm-up at the largest shape no call
  // allocates, so the linears can be captured in a CUDA Graph.
  void* grow(void*& buffer, size_t& capacity, size_t bytes);
  bool batched_tf32_ = false;
  void* handle_ = nullptr;  // cublasHandle_t
  cudaStream_t stream_ = nullptr;
  void* x_bf16_ = nullptr;  // [rows, in] bf16 inputs of the last bf16 linear
  size_t x_bf16_bytes_ = 0;
  // x [rows, in] (row stride x_stride) in bf16: the shared copy
  // (share_input) when there is one, else converted into x_bf16_.
  const void* bf16_input(const float* x, int64_t rows, int64_t in, int64_t x_stride);
  struct SharedInput {
    const float* x = nullptr;  // null: the slot is free
    int64_t rows = 0, in = 0, stride = 0;
    const void* bf16 = nullptr;               // [rows, in] bf16, written beside x
    bool f32_written = true;                  // false: only the copy holds the values
    const uint8_t* fp8 = nullptr;             // [rows, in] e4m3 (share_fp8_input)
    const float* fp8_scale_rows = nullptr;    // [rows, groups]
    const float* fp8_scale_groups = nullptr;  // [groups, rows]
  };
  // x's slot, else a free one (megactx::Error naming `caller` when none is).
  SharedInput* slot_for(const float* x, const char* caller);
  // The shared input whose rows hold x [rows, in] (row stride x_stride) with
  // a bf16 copy (or, with fp8, an e4m3 one), and x's first row in it; null when none.
  const SharedInput* shared_copy(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                                 bool fp8, int64_t& row) const;
  // Throws when x points into a shared input whose float32 values were not
  // written (share_input's f32_written = false).
  void check_f32_written(const float* x) const;
  SharedInput shared_[kSharedInputs];
  // bf16_skinny's split-K scratch (its plan's sizes): parts float32, and the
  // per-tile counters, zeroed when allocated (each launch leaves them zero).
  void skinny_scratch(Bf16Skinny& g);
  void* skinny_parts_ = nullptr;
  size_t skinny_parts_bytes_ = 0;
  void* skinny_done_ = nullptr;
  size_t skinny_done_bytes_ = 0;
  void* x_fp8_ = nullptr;  // [rows, in] e4m3 inputs of the last fp8 linear
  size_t x_fp8_bytes_ = 0;
  void* x_scale_ = nullptr;  // [rows, ceil(in / 128)] their group scales
  size_t x_scale_bytes_ = 0;
  uint64_t reallocations_ = 0;
  bool fp8_tensor_cores_ = true;
  bool fp8_cublaslt_ = true;
  bool bf16_cublaslt_ = false;
  bool weight_prefetch_ = false;
  bool bf16_gemv_swiglu_ = kBf16GemvSwiglu;
  bool bf16_skinny_ = kBf16Skinny;
  bool bf16_gemv_ = kBf16Gemv;
  std::unique_ptr<LtGemm> lt_;
  bool batch_invariant_ = false;
};

}  // namespace megactx::cuda

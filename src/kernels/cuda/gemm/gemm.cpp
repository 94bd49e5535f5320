#include "kernels/cuda/gemm/gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/env_switch.h"
#include "core/error.h"
#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/batch_invariant_gemm.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/linear_operands.h"

namespace megactx::cuda {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLAS {} failed: {} ({})", what, cublasGetStatusString(status),
         static_cast<int>(status));
  }
}

// An A/B switch of cuBLASLt's split-K policy: "any" or "inkernel".
LtReduction lt_reduction(const char* variable, LtReduction fallback) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string_view text(value);
  MEGACTX_CHECK(text == "any" || text == "inkernel", "{}={}: expected any or inkernel", variable,
                text);
  return text == "any" ? LtReduction::Any : LtReduction::InKernel;
}

int narrow(int64_t value, const char* what) {
  MEGACTX_CHECK(value >= 0 && value <= INT32_MAX, "GEMM {} = {} does not fit cuBLAS int", what,
                value);
  return static_cast<int>(value);
}

// The batch-invariant product of one shape, float32 everywhere unless the caller says otherwise.
InvariantGemm invariant_gemm(const void* x, int64_t x_stride, const void* w, void* y,
                             int64_t y_stride, int64_t rows, int64_t in, int64_t out) {
  return linear_operands<InvariantGemm>(x, x_stride, w, y, y_stride, rows, in, out);
}

}  // namespace

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "create");
  handle_ = handle;
  check(cublasSetStream(handle, stream), "set stream");
  // Pedantic: no TF32 or reduced-precision shortcuts in the fp32 parity mode.
  check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
  // fp8 GEMMs of more than 8 rows on tensor cores unless
  // MEGACTX_FP8_TENSOR_CORES=0 (the tiled SIMT kernel, e.g. to compare).
  const char* tensor_cores = std::getenv("MEGACTX_FP8_TENSOR_CORES");
  fp8_tensor_cores_ = tensor_cores == nullptr || std::string_view(tensor_cores) != "0";
  const char* cublaslt = std::getenv("MEGACTX_FP8_CUBLASLT");
  fp8_cublaslt_ = cublaslt == nullptr || std::string_view(cublaslt) != "0";
  const char* bf16_cublaslt = std::getenv("MEGACTX_BF16_CUBLASLT");
  bf16_cublaslt_ = bf16_cublaslt != nullptr && std::string_view(bf16_cublaslt) == "1";
  lt_ = std::make_unique<LtGemm>(stream);
  lt_->set_reduction(lt_reduction("MEGACTX_FP8_LT_REDUCTION", LtReduction::Any),
                     lt_reduction("MEGACTX_BF16_LT_REDUCTION", LtReduction::InKernel));
  bf16_gemv_ = env_switch("MEGACTX_BF16_GEMV", kBf16Gemv);
  weight_prefetch_ = env_switch("MEGACTX_WEIGHT_PREFETCH", false);
  bf16_gemv_swiglu_ = env_switch("MEGACTX_BF16_GEMV_SWIGLU", kBf16GemvSwiglu);
  bf16_skinny_ = env_switch("MEGACTX_BF16_SKINNY", kBf16Skinny);
  const char* autotune = std::getenv("MEGACTX_LT_AUTOTUNE");
  lt_->set_autotune(autotune == nullptr || std::string_view(autotune) != "0");
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (x_bf16_ != nullptr) cudaFree(x_bf16_);
  if (x_fp8_ != nullptr) cudaFree(x_fp8_);
  if (x_scale_ != nullptr) cudaFree(x_scale_);
  if (skinny_parts_ != nullptr) cudaFree(skinny_parts_);
  if (skinny_done_ != nullptr) cudaFree(skinny_done_);
}

Blas::SharedInput* Blas::slot_for(const float* x, const char* caller) {
  SharedInput* slot = nullptr;  // x's slot, else the first free one
  for (SharedInput& shared : shared_) {
    if (shared.x == x) {
      slot = &shared;
      break;
    }
    if (shared.x == nullptr && slot == nullptr) slot = &shared;
  }
  MEGACTX_CHECK(slot != nullptr, "Blas::{}: more than {} shared inputs at once", caller,
                kSharedInputs);
  return slot;
}

void Blas::share_input(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                       const void* x_bf16, bool f32_written) {
  if (x_bf16 == nullptr) {
    unshare_input(x);  // x is being rewritten: no copy of its old values may stay
    return;
  }
  SharedInput* slot = slot_for(x, "share_input");
  *slot = SharedInput{x, rows, in, x_stride, x_bf16, f32_written};
}

void Blas::check_f32_written(const float* x) const {
  for (const SharedInput& shared : shared_) {
    if (shared.x == nullptr || shared.f32_written) continue;
    const auto at = reinterpret_cast<uintptr_t>(x), base = reinterpret_cast<uintptr_t>(shared.x);
    const auto bytes = static_cast<uintptr_t>(shared.rows * shared.stride) * sizeof(float);
    MEGACTX_CHECK(at < base || at >= base + bytes,
                  "Blas: a linear reads float32 values of a shared input that only has its bf16 "
                  "copy written");
  }
}

void Blas::share_fp8_input(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                           const uint8_t* q, const float* scale_rows, const float* scale_groups) {
  if (q == nullptr) {  // x rewritten without an e4m3 copy: drop an old one
    for (SharedInput& shared : shared_)
      if (shared.x == x) shared.fp8 = nullptr;
    return;
  }
  SharedInput* slot = slot_for(x, "share_fp8_input");  // share_input's, if it ran
  MEGACTX_CHECK(slot->x == nullptr || (slot->rows == rows && slot->in == in &&
                                       slot->stride == x_stride && slot->f32_written),
                "Blas::share_fp8_input: x is shared with another shape or without its float32 "
                "values");
  if (slot->x == nullptr) *slot = SharedInput{x, rows, in, x_stride, nullptr, true};
  slot->fp8 = q;
  slot->fp8_scale_rows = scale_rows;
  slot->fp8_scale_groups = scale_groups;
}

const Blas::SharedInput* Blas::shared_copy(const float* x, int64_t rows, int64_t in,
                                           int64_t x_stride, bool fp8, int64_t& row) const {
  for (const SharedInput& shared : shared_) {
    if (shared.x == nullptr || (fp8 ? shared.fp8 == nullptr : shared.bf16 == nullptr) ||
        shared.in != in || shared.stride != x_stride)
      continue;
    // x may start at a row of the shared input (a row block of it).
    const auto at = reinterpret_cast<uintptr_t>(x), base = reinterpret_cast<uintptr_t>(shared.x);
    const auto row_bytes = static_cast<uintptr_t>(x_stride) * sizeof(float);
    if (at < base || (at - base) % row_bytes != 0) continue;
    row = static_cast<int64_t>((at - base) / row_bytes);
    if (row + rows <= shared.rows) return &shared;
  }
  return nullptr;
}

Blas::Fp8Input Blas::fp8_copy_of(const float* x, int64_t rows, int64_t in, int64_t x_stride) const {
  int64_t row = 0;
  const SharedInput* copy = shared_copy(x, rows, in, x_stride, /*fp8=*/true, row);
  if (copy == nullptr) return {};
  const int64_t groups = (in + 127) / 128;
  return {copy->fp8 + row * in, copy->fp8_scale_rows + row * groups};
}

void Blas::unshare_input(const float* x) {
  for (SharedInput& shared : shared_)
    if (shared.x == x) shared = SharedInput{};
}

void Blas::clear_shared_inputs() {
  for (SharedInput& shared : shared_) shared = SharedInput{};
}

void* Blas::grow(void*& buffer, size_t& capacity, size_t bytes) {
  if (bytes > capacity) {
    // The previous GEMM on this stream may still read the old buffer.
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (buffer != nullptr) MEGACTX_CUDA_CHECK(cudaFree(buffer));
    buffer = nullptr;
    capacity = 0;
    MEGACTX_CUDA_CHECK(cudaMalloc(&buffer, bytes));
    capacity = bytes;
    ++reallocations_;
  }
  return buffer;
}

void Blas::set_workspace(void* data, size_t bytes) {
  check(cublasSetWorkspace(static_cast<cublasHandle_t>(handle_), data, bytes), "set workspace");
  lt_->set_workspace(data, bytes);  // the same stream: never used at once
}

int64_t Blas::fp8_cublaslt_runs() const {
  return lt_->fp8_runs();
}

int64_t Blas::bf16_cublaslt_runs() const {
  return lt_->bf16_runs();
}

namespace {

// Where cuBLASLt's block-scaled GEMM beats the hand-written fp8 kernels
// (fp8_linear_bench and the H200 probe of 2026-12-03, weights from HBM): past
// 64 rows always (the alternative is the 64x64 tiled kernel, 5-10x slower);
// from 8 rows (its smallest row count) for weights of 16M+ elements
// (GLM-5.2's o_proj 100M at 8 rows: 37.1 against 46.1 us on the few-row
// kernel with four groups in flight, at 16 rows 36.7 against 62.4; q_b
// 33.5M at 8 rows 16.2 against 18.6); from 33 rows for 4M+ (glm_1b's MLP
// down 11.5M at 64 rows: 14.8 against 22.7 us; at 16 rows the few-row
// kernel wins, 12.2 against 14.2). Small matrices stay on the few-row kernel
// (glm_1b's q_a, 1.5M: 7.9 against 10.1 us at 64 rows). Between 1.6M and 4M
// it depends on K more than on size (H100, 64 rows: q_b 768 x 3072 6.9
// against 8.4 us, the shared expert's 2048 x 1536 10.2 against 11.4, but its
// 768 x 2048 down 7.2 against 5.9). MEGACTX_FP8_LT_MIN_ELEMENTS moves the
// 33-64-row bound, in weight elements, for A/B runs.
int64_t fp8_lt_min_elements_33_64() {
  static const int64_t elements = [] {
    const char* value = std::getenv("MEGACTX_FP8_LT_MIN_ELEMENTS");
    if (value == nullptr || *value == '\0') return int64_t{4} << 20;
    return std::max<int64_t>(0, std::atoll(value));
  }();
  return elements;
}

bool fp8_lt_rows(int64_t rows, int64_t in, int64_t out) {
  const int64_t elements = in * out;
  return rows > 64 || (rows >= 8 && elements >= (int64_t{16} << 20)) ||
         (rows > 32 && elements >= fp8_lt_min_elements_33_64());
}

}  // namespace

void Blas::linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                  int64_t out, float* y, int64_t y_stride) {
  if (w.fp8()) {
    linear_fp8(x, rows, in, x_stride, w, out, y, y_stride);
    return;
  }
  if (!w.bf16) {
    linear(x, rows, in, x_stride, static_cast<const float*>(w.data), out, y, y_stride);
    return;
  }
  if (rows == 0 || out == 0) return;
  if (batch_invariant_) {
    check_f32_written(x);  // the fp32 and fp8 paths check in their own calls
    InvariantGemm g = invariant_gemm(x, x_stride, w.data, y, y_stride, rows, in, out);
    g.round_x_to_bf16 = true;  // as the cuBLAS path below: bf16 products
    g.w_type = GemmElement::BF16;
    batch_invariant_gemm(g, stream_);
    return;
  }
  linear_bf16(bf16_input(x, rows, in, x_stride), rows, in, in, w.data, out, y, y_stride,
              /*y_f32=*/true);
}

void Blas::linear_to_bf16(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                          DeviceMatrix w, int64_t out, void* y, int64_t y_stride) {
  MEGACTX_CHECK((w.bf16 || w.fp8()) && !batch_invariant_,
                "linear_to_bf16: bf16 or fp8 weights outside the deterministic mode only");
  if (rows == 0 || out == 0) return;
  if (w.fp8()) {
    linear_fp8(x, rows, in, x_stride, w, out, y, y_stride, ActType::BF16);
    return;
  }
  linear_bf16(bf16_input(x, rows, in, x_stride), rows, in, in, w.data, out, y, y_stride,
              /*y_f32=*/false);
}

void Blas::skinny_scratch(Bf16Skinny& g) {
  const Bf16SkinnyPlan plan = bf16_skinny_plan(g);
  if (plan.split <= 1) return;
  g.parts = static_cast<float*>(grow(skinny_parts_, skinny_parts_bytes_,
                                     static_cast<size_t>(plan.parts_floats) * sizeof(float)));
  g.parts_capacity = static_cast<int64_t>(skinny_parts_bytes_ / sizeof(float));
  const size_t had = skinny_done_bytes_;
  g.done = static_cast<int32_t*>(
      grow(skinny_done_, skinny_done_bytes_, static_cast<size_t>(plan.tiles) * sizeof(int32_t)));
  if (skinny_done_bytes_ != had)
    MEGACTX_CUDA_CHECK(cudaMemsetAsync(g.done, 0, skinny_done_bytes_, stream_));
  g.done_capacity = static_cast<int64_t>(skinny_done_bytes_ / sizeof(int32_t));
}

bool Blas::linear_swiglu_bf16(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                              DeviceMatrix w, int64_t inter, void* act) {
  // Which kernel would run the plain gate_up product of these rows.
  const bool gemv = bf16_gemv_ && rows <= kBf16GemvMaxRows;
  const bool skinny = !gemv && bf16_skinny_ && rows <= kBf16SkinnyMaxRows;
  // bf16_input's copy is [rows, in] at an aligned base (in % 8 == 0 keeps
  // every row 16-byte aligned); the weights must be too.
  if (!bf16_gemv_swiglu_ || !(gemv || skinny) || batch_invariant_ || !w.bf16 || w.fp8() ||
      rows < 1 || in % 8 != 0 || !aligned16(w.data))
    return false;
  const void* x16 = bf16_input(x, rows, in, x_stride);
  if (skinny) {
    Bf16Skinny g = linear_operands<Bf16Skinny>(x16, in, w.data, act, inter, rows, in, inter);
    g.swiglu = true;
    skinny_scratch(g);
    MEGACTX_CHECK(bf16_skinny(g, stream_),
                  "linear_swiglu_bf16: bf16_skinny declined a checked shape");
    return true;
  }
  Bf16Gemv g = linear_operands<Bf16Gemv>(x16, in, w.data, act, inter, rows, in, inter);
  g.swiglu = true;
  g.prefetch_weights = weight_prefetch_;
  MEGACTX_CHECK(bf16_gemv(g, stream_), "linear_swiglu_bf16: bf16_gemv declined a checked shape");
  return true;
}

const void* Blas::bf16_input(const float* x, int64_t rows, int64_t in, int64_t x_stride) {
  int64_t row = 0;
  if (const SharedInput* shared = shared_copy(x, rows, in, x_stride, /*fp8=*/false, row))
    return static_cast<const uint16_t*>(shared->bf16) + row * in;
  check_f32_written(x);
  void* x_bf16 = grow(x_bf16_, x_bf16_bytes_, static_cast<size_t>(rows * in) * 2);
  float_to_bf16_rows(x, rows, in, x_stride, x_bf16, stream_);
  return x_bf16;
}

void Blas::linear_fp8(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                      int64_t out, float* y, int64_t y_stride) {
  linear_fp8(x, rows, in, x_stride, w, out, y, y_stride, ActType::F32);
}

void Blas::linear_fp8(const float* x, int64_t rows, int64_t in, int64_t x_stride, DeviceMatrix w,
                      int64_t out, void* y, int64_t y_stride, ActType y_type) {
  MEGACTX_CHECK(w.fp8(), "linear_fp8: the weight has no block scales");
  MEGACTX_CHECK(y_type == ActType::F32 || y_type == ActType::BF16,
                "linear_fp8: float32 or bf16 outputs");
  const int64_t y_element = y_type == ActType::F32 ? 4 : 2;
  check_f32_written(x);
  if (rows == 0 || out == 0) return;
  const int64_t groups = (in + 127) / 128;
  auto* q = static_cast<uint8_t*>(grow(x_fp8_, x_fp8_bytes_, static_cast<size_t>(rows * in)));
  auto* scale = static_cast<float*>(
      grow(x_scale_, x_scale_bytes_, static_cast<size_t>(rows * groups) * sizeof(float)));
  Fp8BlockGemm g;
  g.x = q;
  g.x_type = ActType::E4M3;
  g.x_stride = in;
  g.x_scale = scale;
  g.w = static_cast<const uint8_t*>(w.data);
  g.scale = w.scale;
  g.scale_split = w.scale_split;
  g.y = y;
  g.y_type = y_type;
  g.y_stride = y_stride;
  g.in = in;
  g.out = out;
  // cuBLASLt takes row counts in multiples of 8 (cublaslt_gemm.h): a
  // prefill chunk of any length sends its first rows & ~7 there and its last
  // few rows to the decode kernels.
  g.rows = rows > 64 ? rows & ~int64_t{7} : rows;
  // It takes whole 128-row blocks of the weight too: an output width that is
  // not a multiple of 128 (the stacked q_a | kv_a, 2048 + 576) sends its
  // first out & ~127 outputs there and the last few to the hand-written
  // kernels (whose 64-row kernel took 38 us for that weight at 64 rows).
  g.out = out & ~int64_t{127};
  // An e4m3 copy the producer of x wrote (share_fp8_input): the same codes
  // and scales the quantisation below would write, so it is skipped.
  int64_t copy_row = 0;
  const SharedInput* copy = shared_copy(x, rows, in, x_stride, /*fp8=*/true, copy_row);
  if (!batch_invariant_ && fp8_cublaslt_ && g.out > 0 && fp8_lt_rows(g.rows, in, out) &&
      lt_->supports(g)) {
    if (copy != nullptr && copy_row == 0 && g.rows == copy->rows) {
      g.x = copy->fp8;
      g.x_scale = copy->fp8_scale_groups;
    } else {
      quantize_e4m3_groups(x, g.rows, in, x_stride, q, scale, stream_, /*scales_by_group=*/true);
    }
    lt_->run(g);
    if (g.out < out) {
      // Weight rows g.out.. : g.out is a multiple of 128 (and so is any
      // scale_split that supports() took), so their scale rows start at g.out / 128.
      DeviceMatrix tail = w;
      tail.data = static_cast<const uint8_t*>(w.data) + g.out * in;
      tail.scale = w.scale + (g.out / 128) * groups;
      tail.scale_split = w.scale_split > g.out ? w.scale_split - g.out : 0;
      linear_fp8(x, g.rows, in, x_stride, tail, out - g.out,
                 static_cast<char*>(y) + g.out * y_element, y_stride, y_type);
    }
    if (g.rows < rows)
      linear_fp8(x + g.rows * x_stride, rows - g.rows, in, x_stride, w, out,
                 static_cast<char*>(y) + g.rows * y_stride * y_element, y_stride, y_type);
    return;
  }
  g.out = out;
  g.rows = rows;
  g.prefetch_weights = weight_prefetch_;
  if (copy != nullptr) {
    g.x = copy->fp8 + copy_row * in;
    g.x_scale = copy->fp8_scale_rows + copy_row * groups;
  } else {
    quantize_e4m3_groups(x, rows, in, x_stride, q, scale, stream_);
  }
  // One row streams the weights once per warp on CUDA cores; up to 64 rows
  // (decode batches, MTP verifications) stream them once per 32 rows on
  // tensor cores (fp8_linear_bench: from 4 rows on, 1.3-4x faster than the
  // GEMV, which does the FMAs of every row); larger batches run the tiled
  // tensor-core kernel (or the SIMT one when they are switched off or the
  // shape does not suit them).
  if (!batch_invariant_) {
    if (rows == 1 && fp8_block_gemv(g, stream_)) return;
    if (fp8_tensor_cores_ && fp8_block_gemm_skinny(g, stream_)) return;
    if (fp8_block_gemv(g, stream_)) return;
    if (fp8_tensor_cores_ && fp8_block_gemm_tensor_cores(g, stream_)) return;
  }
  fp8_block_gemm(g, stream_);
}

// Row-major y = x . w^T is column-major y^T = w . x^T: w [out, in] row-major is
// the column-major [in, out] matrix with ld = in, taken transposed.
void Blas::linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
                  int64_t out, float* y, int64_t y_stride) {
  if (rows == 0 || out == 0) return;
  check_f32_written(x);
  if (batch_invariant_) {
    batch_invariant_gemm(invariant_gemm(x, x_stride, w, y, y_stride, rows, in, out), stream_);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  check(
      cublasSgemm(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N,
                  narrow(out, "out"), narrow(rows, "rows"), narrow(in, "in"), &one, w,
                  narrow(in, "ldw"), x, narrow(x_stride, "ldx"), &zero, y, narrow(y_stride, "ldy")),
      "sgemm");
}

void Blas::linear_batched(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                          int64_t x_batch_stride, const float* w, int64_t out,
                          int64_t w_batch_stride, float* y, int64_t y_stride,
                          int64_t y_batch_stride, int64_t batch) {
  if (rows == 0 || out == 0 || batch == 0) return;
  check_f32_written(x);
  if (batch_invariant_) {
    MEGACTX_CHECK(w_batch_stride >= out * in || batch == 1,
                  "linear_batched: overlapping weights need cuBLAS");
    InvariantGemm g = invariant_gemm(x, x_stride, w, y, y_stride, rows, in, out);
    g.batch = batch;
    g.x_batch_stride = x_batch_stride;
    g.w_batch_stride = w_batch_stride;
    g.y_batch_stride = y_batch_stride;
    batch_invariant_gemm(g, stream_);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  if (batched_tf32_) {
    check(cublasGemmStridedBatchedEx(
              static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, narrow(out, "out"),
              narrow(rows, "rows"), narrow(in, "in"), &one, w, CUDA_R_32F, narrow(in, "ldw"),
              w_batch_stride, x, CUDA_R_32F, narrow(x_stride, "ldx"), x_batch_stride, &zero, y,
              CUDA_R_32F, narrow(y_stride, "ldy"), y_batch_stride, narrow(batch, "batch"),
              CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
          "tf32 gemm batched");
    return;
  }
  check(cublasSgemmStridedBatched(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N,
                                  narrow(out, "out"), narrow(rows, "rows"), narrow(in, "in"), &one,
                                  w, narrow(in, "ldw"), w_batch_stride, x, narrow(x_stride, "ldx"),
                                  x_batch_stride, &zero, y, narrow(y_stride, "ldy"), y_batch_stride,
                                  narrow(batch, "batch")),
        "sgemm batched");
}

void Blas::linear_batched_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride,
                               int64_t x_batch_stride, const void* w, int64_t out,
                               int64_t w_batch_stride, void* y, int64_t y_stride,
                               int64_t y_batch_stride, int64_t batch, bool y_f32) {
  if (rows == 0 || out == 0 || batch == 0) return;
  MEGACTX_CHECK(!batch_invariant_, "linear_batched_bf16: not in the deterministic mode");
  auto handle = static_cast<cublasHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "set math mode");
  const cublasStatus_t status = cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, narrow(out, "out"), narrow(rows, "rows"), narrow(in, "in"),
      &one, w, CUDA_R_16BF, narrow(in, "ldw"), w_batch_stride, x, CUDA_R_16BF,
      narrow(x_stride, "ldx"), x_batch_stride, &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
      narrow(y_stride, "ldy"), y_batch_stride, narrow(batch, "batch"), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
  check(status, "bf16 gemm batched");
}

void Blas::linear_bf16(const void* x, int64_t rows, int64_t in, int64_t x_stride, const void* w,
                       int64_t out, void* y, int64_t y_stride, bool y_f32) {
  if (rows == 0 || out == 0) return;
  if (batch_invariant_) {
    InvariantGemm g = invariant_gemm(x, x_stride, w, y, y_stride, rows, in, out);
    g.x_type = GemmElement::BF16;
    g.w_type = GemmElement::BF16;
    g.y_type = y_f32 ? GemmElement::F32 : GemmElement::BF16;
    batch_invariant_gemm(g, stream_);
    return;
  }
  if (bf16_gemv_ && rows <= kBf16GemvMaxRows) {
    Bf16Gemv g = linear_operands<Bf16Gemv>(x, x_stride, w, y, y_stride, rows, in, out);
    g.y_f32 = y_f32;
    g.prefetch_weights = weight_prefetch_;
    if (bf16_gemv(g, stream_)) return;
  }
  if (bf16_skinny_ && rows <= kBf16SkinnyMaxRows) {
    Bf16Skinny g = linear_operands<Bf16Skinny>(x, x_stride, w, y, y_stride, rows, in, out);
    g.y_f32 = y_f32;
    skinny_scratch(g);
    if (bf16_skinny(g, stream_)) return;
  }
  if (bf16_cublaslt_ && rows <= kBf16LtMaxRows) {
    Bf16LtGemm g = linear_operands<Bf16LtGemm>(x, x_stride, w, y, y_stride, rows, in, out);
    g.y_f32 = y_f32;
    if (lt_->supports(g)) {
      lt_->run(g);
      return;
    }
  }
  auto handle = static_cast<cublasHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  // Tensor cores for bf16; the handle stays pedantic for the fp32 calls.
  check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "set math mode");
  const cublasStatus_t status =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, narrow(out, "out"), narrow(rows, "rows"),
                   narrow(in, "in"), &one, w, CUDA_R_16BF, narrow(in, "ldw"), x, CUDA_R_16BF,
                   narrow(x_stride, "ldx"), &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                   narrow(y_stride, "ldy"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  check(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
  check(status, "gemm bf16");
}

}  // namespace megactx::cuda

// Element-wise and row-wise fp32 kernels of the CUDA model (the parity mode):
// the same operations as the CPU Backend (model/backend.h), on device
// pointers, launched on `stream`. Row-major float32 unless stated. No host
// synchronisation inside any of them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// out[n, hidden] = table[ids[i], :]  (ids on the device)
void embed_gather(const float* table, const int32_t* ids, int64_t n, int64_t hidden, float* out,
                  cudaStream_t stream);

// An e4m3 copy of a norm's (or silu_mul's) output for the fp8 linears that read it
// (Blas::share_fp8_input), exactly as quantize_e4m3_groups (gemm.h) would
// write it from the float32 output: q [rows, n] (dense) and every 1x128
// group's scale in both of its layouts, scale_rows [rows, groups] (the
// hand-written kernels) and scale_groups [groups, rows] (cuBLASLt). A null q:
// no copy. A norm writes one only for rows up to kFp8CopyMaxWidth wide (it
// holds them in registers): the caller checks the width.
struct Fp8Copy {
  uint8_t* q = nullptr;
  float* scale_rows = nullptr;
  float* scale_groups = nullptr;
};
inline constexpr int64_t kFp8CopyMaxWidth = 8192;

// y[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps); x and y may alias. With
// y_bf16, also y rounded to bf16 there ([rows, n], dense): the copy the bf16
// linears that read y take instead of converting it themselves
// (Blas::share_input); with fp8.q, the e4m3 copy above.
void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride, cudaStream_t stream, void* y_bf16 = nullptr,
             Fp8Copy fp8 = {});

// x[r] += branch[r], then rmsnorm(x[r]) -> y[r] (and y_bf16) in one launch: a
// decoder layer's residual add and the norm after it. The same operations as
// add_into + rmsnorm, so the same bits. x, branch, y [rows, n], dense. A null
// y writes only y_bf16 (every reader of the norm is a bf16 linear).
void add_rmsnorm(float* x, const float* branch, int64_t rows, int64_t n, const float* weight,
                 float eps, float* y, cudaStream_t stream, void* y_bf16 = nullptr,
                 Fp8Copy fp8 = {});

// torch.nn.LayerNorm (biased variance); x, y [rows, n].
void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y, cudaStream_t stream);

// In place on x[rows, heads, ...] (dim rotary values at each head's start);
// cos/sin [rows, dim / 2]. Interleaved pairs (2i, 2i+1) or halves (i, i+dim/2).
void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved, cudaStream_t stream);

// RoPE tables on the device, the same bits as RopeTable::fill (model/rope.h):
// cos/sin [count, half] = float(cos/sin(double(inv_freq[i] * float(pos)))) *
// attention_factor, positions [count] and inv_freq [half] on the device. A
// prefill chunk's tables (16K rows x 32 pairs, 1M double cos / sin: ~20 ms on
// the host) take microseconds here.
void rope_tables(const int32_t* positions, int64_t count, const float* inv_freq, int64_t half,
                 float attention_factor, float* cos, float* sin, cudaStream_t stream);

// out[rows, n] = silu(gate) * up; gate/up rows have stride `stride`. With
// out_bf16, also out rounded to bf16 there (as rmsnorm's y_bf16); with fp8.q,
// out's e4m3 copy (Fp8Copy above; any width).
void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out, cudaStream_t stream, void* out_bf16 = nullptr, Fp8Copy fp8 = {});

// The same on bf16 gate / up, writing only out_bf16 [rows, n] (float32
// arithmetic, one rounding at the end). Column pairs: n and stride even, the
// pointers 4-byte aligned.
void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, int64_t rows, int64_t n,
                   int64_t stride, uint16_t* out_bf16, cudaStream_t stream);

// x[i] += y[i] for i < count.
void add_into(float* x, const float* y, int64_t count, cudaStream_t stream);
// x[i] *= factor.
void scale(float* x, float factor, int64_t count, cudaStream_t stream);
// out[i, :] = x[rows[i], :]  (rows on the device), hidden wide.
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t hidden, float* out,
                 cudaStream_t stream);
// The same for int32 rows (selections, token ids).
void gather_rows(const int32_t* x, const int32_t* rows, int64_t n, int64_t hidden, int32_t* out,
                 cudaStream_t stream);
// out[r * out_stride] = argmax of x[r, :n] (the lowest index on ties, as the
// CPU sampler's argmax), one thread block per row.
void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, int64_t out_stride,
                 cudaStream_t stream);
// out[rows[i], :] += gates[i] * y[i, :]; rows distinct within one call.
void scatter_add_rows(const float* y, const int32_t* rows, const float* gates, int64_t n,
                      int64_t hidden, float* out, cudaStream_t stream);

// Expert parallelism: ids [n] (moe_route's, global expert indices; moe/router.h) become
// this rank's local indices, id - first for first <= id < first + local, and
// -1 for the other ranks' experts (which the grouped MoE leaves out). In place.
void localize_expert_ids(int32_t* ids, int64_t n, int64_t first, int64_t local,
                         cudaStream_t stream);

}  // namespace megactx::cuda

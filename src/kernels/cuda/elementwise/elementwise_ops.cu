// fp32 dense kernels of the CUDA model; see dense_ops.h. Simple, one row per
// block where a reduction is needed: they carry the exact-parity mode, the
// bf16/fp8 fast path replaces the heavy ones.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdlib>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/row_launch.cuh"
#include "kernels/cuda/common/row_ops.cuh"
#include "kernels/cuda/elementwise/elementwise_ops.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  return grid_stride_blocks(count, kThreads);
}

// On row_launch (common/row_launch.cuh).
__global__ void embed_gather_kernel(const float* table, const int32_t* ids, int64_t n,
                                    int64_t hidden, float* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (ROW_LAUNCH_ROWS(row, n)) {
    const float* source = table + static_cast<int64_t>(ids[row]) * hidden;
    for (ROW_LAUNCH_COLUMNS(i, hidden)) out[row * hidden + i] = source[i];
  }
}

// kAdd: x[r] += branch[r] first (add_rmsnorm; x is then written, dense rows).
// A thread's elements are i = tid, tid + 256, ...; rows up to kCachedPerThread
// x 256 wide are held in registers, so that all of a thread's loads are in
// flight at once (a loop that adds each load before issuing the next waits a
// memory round trip per element: ~6.5 us per launch at batch 1 on a
// 2048-wide row, ncu). The sum runs in the same order either way (same bits).
// Rows up to kNarrowCached x 256 wide take an instantiation that holds only
// that many: the 32-value one needs ~130 registers, two blocks per SM, and
// so few bytes in flight that GLM-5.2's 2048-wide q_a norm ran at ~0.8 TB/s
// in a 16K-row prefill chunk (H100; the 6144-wide norms ~2.7).
constexpr int kCachedPerThread = 32;
constexpr int kNarrowCached = 8;
// And up to 24 x 256 (GLM-5.2's 6144-wide hidden norms): ~100 registers, two
// blocks per SM instead of one.
constexpr int kMediumCached = 24;

static_assert(kCachedPerThread * kThreads == kFp8CopyMaxWidth);

// The e4m3 copy of a row held as kCachedPerThread values per thread (element
// threadIdx.x + 256 k): the 128-group of element i is four warps' values at
// one k, so each warp's amax goes through shared memory, and one thread per
// group turns it into the group's scale s (quantize_e4m3_groups' IEEE
// division) and 1 / s, correctly rounded. Each value is then divided by s
// without a division: q0 = x * (1 / s), one FMA for the exact remainder
// x - q0 s, one more for q0 + remainder / s -- Markstein's correction, which
// gives the correctly rounded quotient (the IEEE division's bits) whenever the
// quotient is a normal number; below 2^-126 it may differ by an ulp, and
// there e4m3 rounds both to the same signed zero (x's sign, kept explicitly). A per-element
// __fdiv_rn (a branch to its slow path each) took the norm from 5.6 to 12.5 us per launch at batch
// 1 (ncu, H200): 24 of them in a row per thread.
struct Fp8GroupScales {
  float scale[kFp8CopyMaxWidth / 128];
  float inverse[kFp8CopyMaxWidth / 128];
};

template <int kCached>
__device__ __forceinline__ void write_fp8_copy(const float (&outs)[kCached], int64_t n,
                                               const Fp8Copy& fp8,
                                               float (&warp_max)[kCached][kThreads / 32],
                                               Fp8GroupScales& groups_shared) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int k = 0; k < kCached; ++k) {
    if (int64_t{k} * kThreads >= n) break;  // uniform: the rest of the row is padding
    float m = fabsf(outs[k]);               // 0 past n, as the quantiser's padding
    for (int offset = 16; offset > 0; offset /= 2)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (lane == 0) warp_max[k][warp] = m;
  }
  __syncthreads();
  const int64_t row = blockIdx.x, rows = gridDim.x, groups = (n + 127) / 128;
  if (threadIdx.x < groups) {
    // Group g is k = g / 2, warps 4 (g % 2) .. 4 (g % 2) + 3.
    const float* m = warp_max[threadIdx.x / 2] + 4 * (threadIdx.x % 2);
    const float amax = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    groups_shared.scale[threadIdx.x] = s;
    groups_shared.inverse[threadIdx.x] = __frcp_rn(s);
    fp8.scale_rows[row * groups + threadIdx.x] = s;
    fp8.scale_groups[threadIdx.x * rows + row] = s;
  }
  __syncthreads();
  const int half = static_cast<int>(threadIdx.x) / 128;  // which group of the 256 at k
#pragma unroll
  for (int k = 0; k < kCached; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * kThreads;
    if (int64_t{k} * kThreads >= n) break;
    if (i >= n) continue;
    const float s = groups_shared.scale[2 * k + half],
                inverse = groups_shared.inverse[2 * k + half];
    const float q0 = __fmul_rn(outs[k], inverse);
    const float remainder = __fmaf_rn(-q0, s, outs[k]);  // exact
    // The quotient's sign is x's (the FMAs would turn -0 into +0).
    fp8.q[row * n + i] = __nv_fp8_e4m3(copysignf(__fmaf_rn(remainder, inverse, q0), outs[k])).__x;
  }
}

// kFp8: write fp8's copy too (a separate instantiation: the plain norm keeps
// its registers).
// kCached: values held per thread (kCachedPerThread, or kNarrowCached for
// rows that fit it).
template <bool kAdd, bool kFp8, int kCached>
__global__ void rmsnorm_kernel(float* x, const float* branch, int64_t n, int64_t x_stride,
                               const float* weight, float eps, float* y, int64_t y_stride,
                               __nv_bfloat16* y_bf16, Fp8Copy fp8) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float shared[kThreads / 32];
  __shared__ float warp_max[kCached][kThreads / 32];  // fp8 copies only
  __shared__ Fp8GroupScales fp8_groups;               // fp8 copies only
  float* xr = x + blockIdx.x * x_stride;
  float* yr = y != nullptr ? y + blockIdx.x * y_stride : nullptr;
  float sum = 0.0f;
  if (n <= kCached * kThreads) {
    // The weights too, with the row's loads: at decode sizes (a block or a
    // few per launch) the launch is a chain of memory round trips, and
    // loading them after the sum would add one.
    float values[kCached], weights[kCached];
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kThreads;
      values[k] = i < n ? xr[i] : 0.0f;
      weights[k] = i < n ? weight[i] : 0.0f;
      if constexpr (kAdd) {
        if (i < n) values[k] += branch[blockIdx.x * n + i];
      }
    }
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kThreads;
      if (i < n) {
        if constexpr (kAdd) xr[i] = values[k];
        sum += values[k] * values[k];
      }
    }
    const float inv = rsqrtf(block_sum<kThreads>(sum, shared) / static_cast<float>(n) + eps);
    float outs[kCached];
#pragma unroll
    for (int k = 0; k < kCached; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kThreads;
      outs[k] = 0.0f;
      if (i < n) {
        outs[k] = weights[k] * (values[k] * inv);
        if (y != nullptr) yr[i] = outs[k];
        if (y_bf16 != nullptr) y_bf16[blockIdx.x * n + i] = __float2bfloat16_rn(outs[k]);
      }
    }
    if constexpr (kFp8) write_fp8_copy(outs, n, fp8, warp_max, fp8_groups);
    return;
  }
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += branch[blockIdx.x * n + i];
      xr[i] = v;
    }
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads>(sum, shared) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float out = weight[i] * (xr[i] * inv);
    if (y != nullptr) yr[i] = out;
    if (y_bf16 != nullptr) y_bf16[blockIdx.x * n + i] = __float2bfloat16_rn(out);
  }
}

__global__ void layernorm_kernel(const float* x, int64_t n, const float* weight, const float* bias,
                                 float eps, float* y) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float shared[kThreads / 32];
  layernorm_row<kThreads>(x + blockIdx.x * n, n, weight, bias, eps, y + blockIdx.x * n, shared);
}

// On row_launch (common/row_launch.cuh): (head, pair) along x.
__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t dim, const float* cos, const float* sin,
                            bool interleaved) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int32_t half = static_cast<int32_t>(dim / 2);
  for (ROW_LAUNCH_ROWS(r, rows)) {
    for (ROW_LAUNCH_COLUMNS(j, heads * half)) {
      const int32_t h = static_cast<int32_t>(j) / half, i = static_cast<int32_t>(j) - h * half;
      float* v = x + r * row_stride + h * head_stride;
      float* a = interleaved ? v + 2 * i : v + i;
      float* b = interleaved ? v + 2 * i + 1 : v + i + half;
      const float c = cos[r * half + i], s = sin[r * half + i];
      const float x1 = *a, x2 = *b;
      *a = rope_first(x1, x2, c, s);
      *b = rope_second(x1, x2, c, s);
    }
  }
}

__global__ void rope_tables_kernel(const int32_t* positions, int64_t count, const float* inv_freq,
                                   int64_t half, float attention_factor, float* cos, float* sin) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < count * half;
       t += int64_t{gridDim.x} * blockDim.x) {
    // Rounded as the host's float expressions: no contraction into an FMA.
    const float angle = __fmul_rn(inv_freq[t % half], static_cast<float>(positions[t / half]));
    double s = 0.0, c = 0.0;
    ::sincos(static_cast<double>(angle), &s, &c);
    cos[t] = __fmul_rn(static_cast<float>(c), attention_factor);
    sin[t] = __fmul_rn(static_cast<float>(s), attention_factor);
  }
}

// On row_launch (common/row_launch.cuh).
__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t rows, int64_t n,
                                int64_t stride, float* out, __nv_bfloat16* out_bf16) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (ROW_LAUNCH_ROWS(r, rows)) {
    for (ROW_LAUNCH_COLUMNS(i, n)) {
      const float g = gate[r * stride + i];
      const float value = g / (1.0f + expf(-g)) * up[r * stride + i];
      out[r * n + i] = value;
      if (out_bf16 != nullptr) out_bf16[r * n + i] = __float2bfloat16_rn(value);
    }
  }
}

// silu_mul with the e4m3 copy of out (Fp8Copy) for an fp8 down projection:
// one warp per (row, 128-column group), as quantize_e4m3_groups, so that the
// group's amax is a shuffle reduction; the values are silu_mul_kernel's
// expression (the same bits) and the codes and scales the quantiser's.
__global__ void silu_mul_fp8_kernel(const float* gate, const float* up, int64_t rows, int64_t n,
                                    int64_t stride, float* out, __nv_bfloat16* out_bf16,
                                    Fp8Copy fp8) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t groups = (n + 127) / 128;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= rows * groups) return;  // whole warps leave together
  const int64_t row = warp / groups, group = warp % groups, col0 = group * 128;
  float values[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t col = col0 + lane + 32 * i;
    values[i] = 0.0f;
    if (col < n) {
      const float g = gate[row * stride + col];
      values[i] = g / (1.0f + expf(-g)) * up[row * stride + col];
      out[row * n + col] = values[i];
      if (out_bf16 != nullptr) out_bf16[row * n + col] = __float2bfloat16_rn(values[i]);
    }
    amax = fmaxf(amax, fabsf(values[i]));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t col = col0 + lane + 32 * i;
    if (col < n) fp8.q[row * n + col] = __nv_fp8_e4m3(__fdiv_rn(values[i], s)).__x;
  }
  if (lane == 0) {
    fp8.scale_rows[row * groups + group] = s;
    fp8.scale_groups[group * rows + row] = s;
  }
}

// On row_launch, two columns per thread (n even: 4-byte bf16 pairs).
__global__ void silu_mul_bf16_kernel(const __nv_bfloat162* gate, const __nv_bfloat162* up,
                                     int64_t rows, int64_t pairs, int64_t stride,
                                     __nv_bfloat162* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (ROW_LAUNCH_ROWS(r, rows)) {
    for (ROW_LAUNCH_COLUMNS(i, pairs)) {
      const float2 g = __bfloat1622float2(gate[r * stride + i]);
      const float2 u = __bfloat1622float2(up[r * stride + i]);
      out[r * pairs + i] =
          __floats2bfloat162_rn(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y);
    }
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < count;
       t += int64_t{gridDim.x} * blockDim.x)
    x[t] += y[t];
}

__global__ void scale_kernel(float* x, float factor, int64_t count) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < count;
       t += int64_t{gridDim.x} * blockDim.x)
    x[t] *= factor;
}

template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int64_t n, int64_t hidden,
                                   T* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n * hidden;
       t += int64_t{gridDim.x} * blockDim.x)
    out[t] = x[static_cast<int64_t>(rows[t / hidden]) * hidden + t % hidden];
}

// One block of kThreads per row: each thread scans a strided share, then a
// shared-memory tree keeps the larger value, the lower index on ties.
template <int kBlock>
__global__ void argmax_rows_kernel(const float* x, int64_t n, int32_t* out, int64_t out_stride) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ float values[kBlock];
  __shared__ int64_t indices[kBlock];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float best = -INFINITY;
  int64_t index = n;  // past the end: loses every tie
  for (int64_t i = threadIdx.x; i < n; i += kBlock) {
    const float v = row[i];
    if (v > best || index == n) {  // the first value seen, then strictly larger ones
      best = v;
      index = i;
    }
  }
  values[threadIdx.x] = best;
  indices[threadIdx.x] = index;
  __syncthreads();
  for (int half = kBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float v = values[threadIdx.x + half];
      const int64_t j = indices[threadIdx.x + half];
      const float u = values[threadIdx.x];
      const int64_t i = indices[threadIdx.x];
      if (j < n && (i == n || v > u || (v == u && j < i))) {
        values[threadIdx.x] = v;
        indices[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x * out_stride] = static_cast<int32_t>(indices[0]);
}

__global__ void scatter_add_rows_kernel(const float* y, const int32_t* rows, const float* gates,
                                        int64_t n, int64_t hidden, float* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n * hidden;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t / hidden;
    out[static_cast<int64_t>(rows[i]) * hidden + t % hidden] += gates[i] * y[t];
  }
}

__global__ void localize_expert_ids_kernel(int32_t* ids, int64_t n, int64_t first, int64_t local) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = static_cast<int64_t>(ids[i]) - first;
    ids[i] = e >= 0 && e < local ? static_cast<int32_t>(e) : -1;
  }
}

using RmsnormKernel = void (*)(float*, const float*, int64_t, int64_t, const float*, float, float*,
                               int64_t, __nv_bfloat16*, Fp8Copy);

// The instantiation for a row of n values (narrow rows hold fewer per thread).
// MEGACTX_CUDA_NORM_ROWS_CACHED=32: every row on the 32-value instantiation (A/B runs; read once).
bool fitted_norms() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_CUDA_NORM_ROWS_CACHED");
    return !(value != nullptr && std::atoi(value) == kCachedPerThread);
  }();
  return on;
}

template <bool kAdd, int kCached>
RmsnormKernel rmsnorm_instance(const Fp8Copy& fp8) {
  return fp8.q != nullptr ? rmsnorm_kernel<kAdd, true, kCached>
                          : rmsnorm_kernel<kAdd, false, kCached>;
}

template <bool kAdd>
RmsnormKernel rmsnorm_variant(int64_t n, const Fp8Copy& fp8) {
  if (fitted_norms() && n <= kNarrowCached * kThreads)
    return rmsnorm_instance<kAdd, kNarrowCached>(fp8);
  if (fitted_norms() && n <= kMediumCached * kThreads)
    return rmsnorm_instance<kAdd, kMediumCached>(fp8);
  return rmsnorm_instance<kAdd, kCachedPerThread>(fp8);
}

}  // namespace

void embed_gather(const float* table, const int32_t* ids, int64_t n, int64_t hidden, float* out,
                  cudaStream_t stream) {
  const RowLaunch shape = row_launch(n, hidden);
  launch_kernel(embed_gather_kernel, shape.grid, shape.block, 0, stream, table, ids, n, hidden,
                out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
             float eps, float* y, int64_t y_stride, cudaStream_t stream, void* y_bf16,
             Fp8Copy fp8) {
  if (rows == 0) return;
  // kAdd false: x is only read.
  launch_kernel(rmsnorm_variant<false>(n, fp8), static_cast<unsigned>(rows), kThreads, 0, stream,
                const_cast<float*>(x), nullptr, n, x_stride, weight, eps, y, y_stride,
                static_cast<__nv_bfloat16*>(y_bf16), fp8);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void add_rmsnorm(float* x, const float* branch, int64_t rows, int64_t n, const float* weight,
                 float eps, float* y, cudaStream_t stream, void* y_bf16, Fp8Copy fp8) {
  if (rows == 0) return;
  launch_kernel(rmsnorm_variant<true>(n, fp8), static_cast<unsigned>(rows), kThreads, 0, stream, x,
                branch, n, n, weight, eps, y, n, static_cast<__nv_bfloat16*>(y_bf16), fp8);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
               float eps, float* y, cudaStream_t stream) {
  if (rows == 0) return;
  launch_kernel(layernorm_kernel, static_cast<unsigned>(rows), kThreads, 0, stream, x, n, weight,
                bias, eps, y);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
          int64_t dim, const float* cos, const float* sin, bool interleaved, cudaStream_t stream) {
  const RowLaunch shape = row_launch(rows, heads * (dim / 2));
  launch_kernel(rope_kernel, shape.grid, shape.block, 0, stream, x, rows, heads, row_stride,
                head_stride, dim, cos, sin, interleaved);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void rope_tables(const int32_t* positions, int64_t count, const float* inv_freq, int64_t half,
                 float attention_factor, float* cos, float* sin, cudaStream_t stream) {
  if (count == 0) return;
  launch_kernel(rope_tables_kernel, blocks_for(count * half), kThreads, 0, stream, positions, count,
                inv_freq, half, attention_factor, cos, sin);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
              float* out, cudaStream_t stream, void* out_bf16, Fp8Copy fp8) {
  if (fp8.q != nullptr) {
    const int64_t warps = rows * ((n + 127) / 128);
    if (warps == 0) return;
    launch_kernel(silu_mul_fp8_kernel,
                  static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads), kThreads, 0,
                  stream, gate, up, rows, n, stride, out, static_cast<__nv_bfloat16*>(out_bf16),
                  fp8);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const RowLaunch shape = row_launch(rows, n);
  launch_kernel(silu_mul_kernel, shape.grid, shape.block, 0, stream, gate, up, rows, n, stride, out,
                static_cast<__nv_bfloat16*>(out_bf16));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, int64_t rows, int64_t n,
                   int64_t stride, uint16_t* out_bf16, cudaStream_t stream) {
  if (rows * n == 0) return;
  const RowLaunch shape = row_launch(rows, n / 2);
  launch_kernel(silu_mul_bf16_kernel, shape.grid, shape.block, 0, stream,
                reinterpret_cast<const __nv_bfloat162*>(gate),
                reinterpret_cast<const __nv_bfloat162*>(up), rows, n / 2, stride / 2,
                reinterpret_cast<__nv_bfloat162*>(out_bf16));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void add_into(float* x, const float* y, int64_t count, cudaStream_t stream) {
  launch_kernel(add_kernel, blocks_for(count), kThreads, 0, stream, x, y, count);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float factor, int64_t count, cudaStream_t stream) {
  launch_kernel(scale_kernel, blocks_for(count), kThreads, 0, stream, x, factor, count);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t hidden, float* out,
                 cudaStream_t stream) {
  launch_kernel(gather_rows_kernel<float>, blocks_for(n * hidden), kThreads, 0, stream, x, rows, n,
                hidden, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const int32_t* x, const int32_t* rows, int64_t n, int64_t hidden, int32_t* out,
                 cudaStream_t stream) {
  if (n * hidden == 0) return;
  launch_kernel(gather_rows_kernel<int32_t>, blocks_for(n * hidden), kThreads, 0, stream, x, rows,
                n, hidden, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, int64_t out_stride,
                 cudaStream_t stream) {
  if (rows == 0) return;
  constexpr int kBlock = 256;
  launch_kernel(argmax_rows_kernel<kBlock>, static_cast<unsigned>(rows), kBlock, 0, stream, x, n,
                out, out_stride);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_rows(const float* y, const int32_t* rows, const float* gates, int64_t n,
                      int64_t hidden, float* out, cudaStream_t stream) {
  launch_kernel(scatter_add_rows_kernel, blocks_for(n * hidden), kThreads, 0, stream, y, rows,
                gates, n, hidden, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void localize_expert_ids(int32_t* ids, int64_t n, int64_t first, int64_t local,
                         cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(localize_expert_ids_kernel, blocks_for(n), kThreads, 0, stream, ids, n, first,
                local);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda

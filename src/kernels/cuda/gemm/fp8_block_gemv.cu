// The decode shape of the fp8 block-scaled GEMM (fp8_block_gemm.h): a few
// rows of e4m3 inputs against a weight that must be streamed once. One warp
// per output column walks its weight row in 16-byte loads (16 e4m3 values
// of one 128-column block, so one weight scale and one input-group scale per
// load); each lane accumulates every row, then the warp reduces. The products
// are the tiled kernel's (e4m3 x * its group scale times e4m3 w * its block
// scale, in float32); only the summation order differs.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBytesPerLane = 16;
constexpr int kWarpStep = 32 * kBytesPerLane;  // columns a warp covers per step
constexpr int kBlockScale = 128;

__device__ float e4m3_to_float(uint32_t bits) {
  __nv_fp8_e4m3 value;
  value.__x = static_cast<__nv_fp8_storage_t>(bits);
  return static_cast<float>(value);
}

// 16 e4m3 bytes (little-endian in the 4 words) times `scale`.
__device__ void unpack16(uint4 packed, float scale, float out[16]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      out[4 * i + j] = e4m3_to_float((words[i] >> (8 * j)) & 0xffu) * scale;
}

// Walks column col's weight row as lane `lane` reads it: 16-byte loads at
// k = 16 lane, + 512, ..., kUnroll of them issued back to back before any is
// used, and consume(packed, k, its block scale) for each in k order.
template <int kUnroll, typename Consume>
__device__ __forceinline__ void for_each_weight_load(const Fp8BlockGemm& g, int64_t col, int lane,
                                                     Consume&& consume) {
  const int64_t groups = (g.in + kBlockScale - 1) / kBlockScale;
  const uint8_t* w_row = g.w + col * g.in;                                       // [in]
  const float* w_scales = g.scale + fp8_scale_row(col, g.scale_split) * groups;  // [groups]
  for (int64_t k0 = static_cast<int64_t>(lane) * kBytesPerLane; k0 < g.in;
       k0 += kUnroll * kWarpStep) {
    uint4 packed[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kWarpStep;
      packed[u] = k < g.in ? *reinterpret_cast<const uint4*>(w_row + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kWarpStep;
      if (k >= g.in) break;
      consume(packed[u], k, w_scales[k / kBlockScale]);
    }
  }
}

// kUnroll weight loads of a lane in flight before their products: one 16-byte
// load per lane at a time left the GEMV at ~40% of the read bandwidth
// (a warp's 512 bytes in flight per step are too few to cover the latency).
template <int kRows, int kUnroll>
__global__ void fp8_block_gemv_kernel(Fp8BlockGemm g) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  // Weights are never written by a step's kernels: they may be asked for
  // before the wait.
  if (g.prefetch_weights && lane == 0 && col < g.out) prefetch_l2(g.w + col * g.in, g.in);
  grid_dependency_wait();
  grid_dependency_trigger();
  if (col >= g.out) return;  // the whole warp: no shuffle below is left half-empty
  const int64_t groups = (g.in + kBlockScale - 1) / kBlockScale;
  const auto* x = static_cast<const uint8_t*>(g.x);  // [kRows, x_stride]
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  for_each_weight_load<kUnroll>(g, col, lane, [&](uint4 packed, int64_t k, float scale) {
    float w[16];
    unpack16(packed, scale, w);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float xv[16];
      unpack16(*reinterpret_cast<const uint4*>(x + r * g.x_stride + k),
               g.x_scale[r * groups + k / kBlockScale], xv);
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[r] += xv[j] * w[j];
    }
  });
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    for (int offset = 16; offset > 0; offset /= 2)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t index = r * g.y_stride + col;
    if (g.y_type == ActType::F32) {
      static_cast<float*>(g.y)[index] = acc[r];
    } else {
      static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[r]);
    }
  }
}

// One row (decode at batch 1), the same products and the same order as
// fp8_block_gemv_kernel<1>, for fewer instructions: the per-element path
// above spends ~150 instructions per 16 weight bytes (two byte-wise e4m3
// conversions and two scalings per product), which bounds it near half the
// read bandwidth. Here the block first writes x * its group scale as floats
// into shared memory, once for its 16 columns, and a lane converts its
// weights two at a time (cvt f16x2.e4m3x2, exact).
// Shared layout, conflict-free float2 reads: element k = 512 s + 16 l + 2 p + e
// (warp step s, lane l, pair p) at float 512 s + 64 p + 2 l + e.
constexpr int kRowWarps = 16;

__device__ __forceinline__ int row_x_index(int64_t k) {
  const int64_t step = k / kWarpStep;
  const int within = static_cast<int>(k % kWarpStep);
  const int lane = within / kBytesPerLane, j = within % kBytesPerLane;
  return static_cast<int>(step * kWarpStep) + (j / 2) * 64 + lane * 2 + (j % 2);
}

template <int kUnroll>
__global__ void __launch_bounds__(kRowWarps * 32) fp8_block_gemv_row_kernel(Fp8BlockGemm g) {
  extern __shared__ float xs[];  // [round_up(in, 512)], the layout above
  {
    // The block's kRowWarps weight rows are contiguous: one prefetch, before
    // the wait (weights are never written by a step's kernels).
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowWarps;
    if (g.prefetch_weights && threadIdx.x == 0 && first < g.out) {
      const int64_t cols = g.out - first < kRowWarps ? g.out - first : kRowWarps;
      prefetch_l2(g.w + first * g.in, cols * g.in);
    }
  }
  grid_dependency_wait();
  grid_dependency_trigger();
  const auto* x = static_cast<const uint8_t*>(g.x);
  for (int64_t k = 4 * static_cast<int64_t>(threadIdx.x); k < g.in; k += 4 * blockDim.x) {
    float v[4];
    e4m3x4_to_float(*reinterpret_cast<const uint32_t*>(x + k), v);
    const float scale = g.x_scale[k / kBlockScale];
#pragma unroll
    for (int e = 0; e < 4; ++e) xs[row_x_index(k + e)] = v[e] * scale;
  }
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (col >= g.out) return;  // the whole warp
  const float2* x2 = reinterpret_cast<const float2*>(xs);
  float acc = 0.0f;
  for_each_weight_load<kUnroll>(g, col, lane, [&](uint4 packed, int64_t k, float scale) {
    const float2* xk = x2 + (k / kWarpStep) * (kWarpStep / 2) + lane;  // pair p at + 32 p
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float w[4];
      e4m3x4_to_float(words[i], w);
      const float2 a = xk[32 * (2 * i)], b = xk[32 * (2 * i + 1)];
      acc += a.x * (w[0] * scale);
      acc += a.y * (w[1] * scale);
      acc += b.x * (w[2] * scale);
      acc += b.y * (w[3] * scale);
    }
  });
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane != 0) return;
  if (g.y_type == ActType::F32) {
    static_cast<float*>(g.y)[col] = acc;
  } else {
    static_cast<__nv_bfloat16*>(g.y)[col] = __float2bfloat16_rn(acc);
  }
}

// The row kernel's shared bytes; 0 when x does not fit (the general kernel then).
size_t row_kernel_shared_bytes(int64_t in) {
  const int64_t bytes = (in + kWarpStep - 1) / kWarpStep * kWarpStep * 4;
  return bytes <= 200 * 1024 ? static_cast<size_t>(bytes) : 0;
}

// MEGACTX_FP8_GEMV_FAST=0: the per-element kernel with one load in flight per
// lane, as before the row kernel and the unrolled loads (A/B runs; read once).
bool fast_gemv() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_FP8_GEMV_FAST");
    return !(value != nullptr && value[0] == '0');
  }();
  return on;
}

template <int kRows>
void launch(const Fp8BlockGemm& g, cudaStream_t stream) {
  const int64_t blocks = (g.out + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Up to 4 rows: 4 loads in flight (more rows hold more x registers per load).
  constexpr int kUnroll = kRows <= 4 ? 4 : 2;
  if (fast_gemv())
    launch_kernel(fp8_block_gemv_kernel<kRows, kUnroll>, static_cast<unsigned>(blocks),
                  kWarpsPerBlock * 32, 0, stream, g);
  else
    launch_kernel(fp8_block_gemv_kernel<kRows, 1>, static_cast<unsigned>(blocks),
                  kWarpsPerBlock * 32, 0, stream, g);
}

}  // namespace

bool fp8_block_gemv(const Fp8BlockGemm& g, cudaStream_t stream) {
  // 16-byte loads of whole rows: `in` and the input row stride in multiples
  // of 16 bytes, 16-byte aligned bases.
  if (g.x_type != ActType::E4M3 || g.rows < 1 || g.rows > kFp8GemvMaxRows || g.in % 16 != 0 ||
      g.x_stride % 16 != 0 || !aligned16(g.x) || !aligned16(g.w)) {
    return false;
  }
  if (g.out == 0) return true;
  if (g.rows == 1 && fast_gemv()) {
    if (const size_t shared = row_kernel_shared_bytes(g.in)) {
      static const bool configured = [] {
        MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
            fp8_block_gemv_row_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        return true;
      }();
      (void)configured;
      const int64_t blocks = (g.out + kRowWarps - 1) / kRowWarps;
      launch_kernel(fp8_block_gemv_row_kernel<4>, static_cast<unsigned>(blocks), kRowWarps * 32,
                    shared, stream, g);
      MEGACTX_CUDA_CHECK(cudaGetLastError());
      return true;
    }
  }
  switch (g.rows) {
    case 1:
      launch<1>(g, stream);
      break;
    case 2:
      launch<2>(g, stream);
      break;
    case 3:
      launch<3>(g, stream);
      break;
    case 4:
      launch<4>(g, stream);
      break;
    case 5:
      launch<5>(g, stream);
      break;
    case 6:
      launch<6>(g, stream);
      break;
    case 7:
      launch<7>(g, stream);
      break;
    default:
      launch<8>(g, stream);
      break;
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megactx::cuda

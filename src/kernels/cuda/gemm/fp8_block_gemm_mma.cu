// The fp8 block-scaled GEMM on tensor cores (fp8_block_gemm.h,
// fp8_block_gemm_tensor_cores): e4m3 inputs x e4m3 weights with
// mma.sync.m16n8k32 (sm_89+), DeepGEMM-style promotion: each 128-column
// group's partial sums come out of the MMA unscaled and are added to float32
// accumulators times x_scale[row, group] * w_scale[block(col), group], so the
// tensor cores' limited internal accumulation only spans 128 products.
//
// Block: 64 rows x 64 output columns, 4 warps in 2 x 2, each 32 x 32 = 2 x 4
// MMA tiles of 16 x 8. One stage = one 128-column group of x and w staged in
// shared memory (rows padded to 144 bytes: the fragment loads of a warp hit
// 32 distinct banks). Simple and synchronous (no cp.async pipeline yet).
//
// Fragments of m16n8k32 with 8-bit inputs (PTX ISA; g = lane / 4, t = lane % 4):
//   A (16 x 32, row-major): a0 = row g, k 4t..4t+3; a1 = row g+8, same k;
//                           a2 = row g, k 16+4t..; a3 = row g+8, k 16+4t..
//   B (32 x 8, column n contiguous in k): b0 = column g, k 4t..4t+3; b1 = k 16+4t..
//   C (16 x 8, float32): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"

namespace megactx::cuda {
namespace {

constexpr int kRowsPerBlock = 64;
constexpr int kColsPerBlock = 64;
constexpr int kGroup = 128;             // k columns per stage = one scale group
constexpr int kRowBytes = kGroup + 16;  // shared-memory row pitch
constexpr int kThreads = 128;

__device__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ uint32_t load_word(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__global__ void __launch_bounds__(kThreads) fp8_block_gemm_mma_kernel(Fp8BlockGemm g) {
  __shared__ alignas(16) uint8_t xs[kRowsPerBlock][kRowBytes];  // [64 rows, 128 k] e4m3
  __shared__ alignas(16) uint8_t ws[kColsPerBlock][kRowBytes];  // [64 cols, 128 k] e4m3
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int gid = lane / 4, tig = lane % 4;
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColsPerBlock;
  const int64_t groups = (g.in + kGroup - 1) / kGroup;
  const auto* x = static_cast<const uint8_t*>(g.x);

  float acc[2][4][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;

  for (int64_t group = 0; group < groups; ++group) {
    const int64_t k0 = group * kGroup;
    // Stage x and w: 64 rows x 8 chunks of 16 bytes each; `in` is a multiple
    // of 16, so a chunk is wholly inside or wholly past the end (zeros).
    for (int i = tid; i < kRowsPerBlock * (kGroup / 16); i += kThreads) {
      const int r = i / (kGroup / 16), c = (i % (kGroup / 16)) * 16;
      const int64_t k = k0 + c;
      uint4 xv = make_uint4(0, 0, 0, 0), wv = make_uint4(0, 0, 0, 0);
      if (row0 + r < g.rows && k < g.in)
        xv = *reinterpret_cast<const uint4*>(x + (row0 + r) * g.x_stride + k);
      if (col0 + r < g.out && k < g.in)
        wv = *reinterpret_cast<const uint4*>(g.w + (col0 + r) * g.in + k);
      *reinterpret_cast<uint4*>(&xs[r][c]) = xv;
      *reinterpret_cast<uint4*>(&ws[r][c]) = wv;
    }
    __syncthreads();

    float part[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[m][n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kGroup / 32; ++ks) {
      const int kb = ks * 32 + tig * 4;
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int r = warp_row + m * 16 + gid;
        a[m][0] = load_word(&xs[r][kb]);
        a[m][1] = load_word(&xs[r + 8][kb]);
        a[m][2] = load_word(&xs[r][kb + 16]);
        a[m][3] = load_word(&xs[r + 8][kb + 16]);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = warp_col + n * 8 + gid;
        b[n][0] = load_word(&ws[c][kb]);
        b[n][1] = load_word(&ws[c][kb + 16]);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n) mma_e4m3(part[m][n], a[m], b[n]);
    }

    // Promote: partial of this group times its input and weight scales.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = row0 + warp_row + m * 16 + gid + h * 8;
        const float x_scale = row < g.rows ? g.x_scale[row * groups + group] : 0.0f;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int64_t col = col0 + warp_col + n * 8 + tig * 2 + j;
            const float w_scale =
                col < g.out ? g.scale[fp8_scale_row(col, g.scale_split) * groups + group] : 0.0f;
            acc[m][n][h * 2 + j] += part[m][n][h * 2 + j] * (x_scale * w_scale);
          }
        }
      }
    }
    __syncthreads();  // the next stage overwrites xs / ws
  }

#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + warp_row + m * 16 + gid + h * 8;
      if (row >= g.rows) continue;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t col = col0 + warp_col + n * 8 + tig * 2 + j;
          if (col >= g.out) continue;
          const int64_t index = row * g.y_stride + col;
          if (g.y_type == ActType::F32) {
            static_cast<float*>(g.y)[index] = acc[m][n][h * 2 + j];
          } else {
            static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[m][n][h * 2 + j]);
          }
        }
      }
    }
  }
}

}  // namespace

bool fp8_block_gemm_tensor_cores(const Fp8BlockGemm& g, cudaStream_t stream) {
  if (g.x_type != ActType::E4M3 || g.in % 16 != 0 || g.x_stride % 16 != 0 || !aligned16(g.x) ||
      !aligned16(g.w)) {
    return false;
  }
  if (g.rows == 0 || g.out == 0) return true;
  const dim3 grid(static_cast<unsigned>((g.out + kColsPerBlock - 1) / kColsPerBlock),
                  static_cast<unsigned>((g.rows + kRowsPerBlock - 1) / kRowsPerBlock));
  fp8_block_gemm_mma_kernel<<<grid, kThreads, 0, stream>>>(g);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megactx::cuda

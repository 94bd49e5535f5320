// fp8 routed experts (e4m3 weights with 128x128 block scales, as an fp8
// checkpoint ships them) on the grouped device path: the grouped expert
// kernel of grouped_experts.cu over e4m3 weights. The inputs (x rows for
// gate_up, the SwiGLU activations for down) arrive quantised per 1x128 group
// by quantize_e4m3_groups, exactly as Blas::linear_fp8 quantises them for the
// host dispatch, so every product is the fp8 GEMV's
// (e4m3 x * group scale) * (e4m3 w * block scale) in float32; only the
// summation order differs.
//
// Grid (neuron blocks, max_tiles). A CTA takes one tile (one expert, up to
// kGroupedMoeTileRowsFp8 of its pairs) and stages the tile's inputs as
// float32 (code times group scale) 512 values at a time; each warp streams 4
// weight rows of that expert in 8-byte loads (8 e4m3 values of one 128-column
// block: one weight scale per load) and applies every value to all of the
// tile's rows; a lane requests all its weights of a chunk before the inputs
// are staged. Each weight byte is read once per tile; decode is bound by
// those bytes (1 per parameter). 8-byte loads keep `in` a multiple of 8 (the
// grouped path's rule) rather than 16.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/moe/expert_kernels.h"
#include "kernels/cuda/moe/grouped_moe.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kWeightRowsPerWarp = 4;
constexpr int kChunk = 512;  // input values per row staged per pass ([8, 512] floats: 16 KiB)
constexpr int kTileRows = static_cast<int>(kGroupedMoeTileRowsFp8);
constexpr int kValues = 8;   // e4m3 values per lane load (8 bytes)
constexpr int kGroup = 128;  // scale block edge (weights) and group width (inputs)
constexpr int kSteps = kChunk / (32 * kValues);  // warp-wide 8-byte loads per row per chunk
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kChunk % kGroup == 0 && kGroup % kValues == 0,
              "a lane's 8 values never straddle a 128-column block");

__device__ float e4m3_to_float(uint32_t bits) {
  __nv_fp8_e4m3 value;
  value.__x = static_cast<__nv_fp8_storage_t>(bits);
  return static_cast<float>(value);
}

// 8 e4m3 bytes (little-endian in the 2 words) times `scale`.
__device__ void unpack8(uint2 packed, float scale, float (&out)[kValues]) {
  const uint32_t words[2] = {packed.x, packed.y};
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      out[4 * i + j] = e4m3_to_float((words[i] >> (8 * j)) & 0xffu) * scale;
}

// DeviceMatrix's scale row rule (fp8_scale_row in gemm.h).
__device__ int64_t scale_row(int64_t row, int64_t split) {
  if (split > 0 && row >= split) return (split + kGroup - 1) / kGroup + (row - split) / kGroup;
  return row / kGroup;
}

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) expert_fp8_kernel(ExpertArgs a) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *a.tile_count) return;  // the routing left this tile empty
  const int expert = a.tiles[3 * tile];
  const int start = a.tiles[3 * tile + 1];
  const int m = a.tiles[3 * tile + 2];  // 1..kTileRows

  __shared__ __align__(16) float staged[kTileRows][kChunk];  // [R, chunk] dequantised inputs
  __shared__ int64_t source[kTileRows];  // input row (of input_q / input_scale) per tile row
  if (threadIdx.x < kTileRows) {
    int64_t row = 0;
    if (static_cast<int>(threadIdx.x) < m) {
      const int position = start + static_cast<int>(threadIdx.x);
      row = kGateUp ? a.pair_of[position] / a.top_k : position;
    }
    source[threadIdx.x] = row;
  }
  const int64_t groups = (a.in + kGroup - 1) / kGroup;  // scale columns of weights and inputs

  // This warp's weight rows: gate_up (gate j0, up j0, gate j0+1, up j0+1),
  // down (neurons n0 .. n0+3). Rows past the matrix are not read.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  constexpr int kNeuronsPerWarp = kGateUp ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp;
  const int64_t first_neuron = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kNeuronsPerWarp;
  const int64_t weight_rows = kGateUp ? 2 * a.neurons : a.neurons;
  const uint8_t* expert_weights =
      static_cast<const uint8_t*>(a.weights) + static_cast<int64_t>(expert) * weight_rows * a.in;
  const float* expert_scales =
      a.weight_scale + static_cast<int64_t>(expert) * a.weight_scale_rows * groups;
  const uint8_t* row_pointer[kWeightRowsPerWarp];  // [in] e4m3
  const float* row_scales[kWeightRowsPerWarp];     // [groups]
  bool row_valid[kWeightRowsPerWarp];
#pragma unroll
  for (int c = 0; c < kWeightRowsPerWarp; ++c) {
    const int64_t neuron = first_neuron + (kGateUp ? c / 2 : c);
    row_valid[c] = neuron < a.neurons;
    const int64_t row = row_valid[c] ? (kGateUp ? neuron + (c % 2) * a.neurons : neuron) : 0;
    row_pointer[c] = expert_weights + row * a.in;
    row_scales[c] = expert_scales + scale_row(row, a.scale_split) * groups;
  }

  float acc[kWeightRowsPerWarp][kTileRows];
#pragma unroll
  for (int c = 0; c < kWeightRowsPerWarp; ++c)
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) acc[c][r] = 0.0f;

  for (int64_t k0 = 0; k0 < a.in; k0 += kChunk) {
    const int length = static_cast<int>(a.in - k0 < kChunk ? a.in - k0 : kChunk);  // % 8 == 0
    // This lane's weights of the whole chunk (kSteps x 4 rows x 8 bytes) are
    // requested before the inputs are staged, so their latency overlaps the
    // staging; segments past the chunk or rows past the matrix are zeros.
    uint2 raw[kSteps][kWeightRowsPerWarp];
    float weight_scale[kSteps][kWeightRowsPerWarp];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int k = (step * 32 + lane) * kValues;
#pragma unroll
      for (int c = 0; c < kWeightRowsPerWarp; ++c) {
        const bool load = row_valid[c] && k < length;
        raw[step][c] = load ? __ldg(reinterpret_cast<const uint2*>(row_pointer[c] + k0 + k))
                            : make_uint2(0, 0);
        weight_scale[step][c] = load ? __ldg(row_scales[c] + (k0 + k) / kGroup) : 0.0f;
      }
    }
    __syncthreads();  // the previous chunk is consumed; source[] is visible
    const int vectors = length / kValues;
    for (int i = static_cast<int>(threadIdx.x); i < m * vectors; i += kThreads) {
      const int r = i / vectors, v = i % vectors;
      const int64_t col = k0 + kValues * v;
      const uint2 q = *reinterpret_cast<const uint2*>(a.input_q + source[r] * a.in + col);
      float x[kValues];
      unpack8(q, a.input_scale[source[r] * groups + col / kGroup], x);
      *reinterpret_cast<float4*>(&staged[r][kValues * v]) = make_float4(x[0], x[1], x[2], x[3]);
      *reinterpret_cast<float4*>(&staged[r][kValues * v + 4]) = make_float4(x[4], x[5], x[6], x[7]);
    }
    __syncthreads();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int k = (step * 32 + lane) * kValues;
      if (k >= length) break;  // this lane's part of the chunk is done (no shuffles below)
      float w[kWeightRowsPerWarp][kValues];
#pragma unroll
      for (int c = 0; c < kWeightRowsPerWarp; ++c)
        unpack8(raw[step][c], weight_scale[step][c], w[c]);
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        if (r >= m) break;  // uniform over the CTA
        const float4 x0 = *reinterpret_cast<const float4*>(&staged[r][k]);
        const float4 x1 = *reinterpret_cast<const float4*>(&staged[r][k + 4]);
        const float x[kValues] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int c = 0; c < kWeightRowsPerWarp; ++c)
#pragma unroll
          for (int v = 0; v < kValues; ++v) acc[c][r] = fmaf(x[v], w[c][v], acc[c][r]);
      }
    }
  }

  // Sum each accumulator over the warp's lanes (a fixed butterfly order).
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < kWeightRowsPerWarp; ++c)
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        acc[c][r] += __shfl_xor_sync(kFullMask, acc[c][r], offset);
  }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) {
    if (r >= m) break;
    const int position = start + r;
    if constexpr (kGateUp) {
#pragma unroll
      for (int i = 0; i < kNeuronsPerWarp; ++i) {
        if (!row_valid[2 * i]) continue;
        const float gate = acc[2 * i][r], up = acc[2 * i + 1][r];
        // silu(gate) * up, the expression of elementwise_ops' silu_mul.
        a.output[static_cast<int64_t>(position) * a.neurons + first_neuron + i] =
            gate / (1.0f + expf(-gate)) * up;
      }
    } else {
      const int64_t pair = a.pair_of[position];
#pragma unroll
      for (int c = 0; c < kWeightRowsPerWarp; ++c)
        if (row_valid[c]) a.output[pair * a.neurons + first_neuron + c] = acc[c][r];
    }
  }
}

template <bool kGateUp>
void launch(const ExpertArgs& args, int64_t max_tiles, cudaStream_t stream) {
  constexpr int64_t kNeuronsPerCta =
      kWarps * (kGateUp ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp);
  const dim3 grid(static_cast<unsigned>((args.neurons + kNeuronsPerCta - 1) / kNeuronsPerCta),
                  static_cast<unsigned>(max_tiles));
  launch_kernel(expert_fp8_kernel<kGateUp>, grid, kThreads, 0, stream, args);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_fp8_experts(const ExpertArgs& args, bool gate_up, int64_t max_tiles,
                        cudaStream_t stream) {
  if (gate_up) {
    launch<true>(args, max_tiles, stream);
  } else {
    launch<false>(args, max_tiles, stream);
  }
}

}  // namespace megactx::cuda

// (b) and (c) of the grouped MoE path: the routed experts' SwiGLU MLPs as
// two grouped GEMV-like kernels over the tiles of grouped_moe_plan, and the
// slot-order combination into the output rows.
//
// Expert kernel: grid (neuron blocks, max_tiles). A CTA takes one tile (one
// expert, up to R = kGroupedMoeTileRowsF32 of its pairs), stages the tile's
// input rows in shared memory 512 values at a time, and each warp streams
// kWeightRowsPerWarp weight rows of that expert (16-byte loads), multiplying
// every row it reads into all of the tile's inputs with per-(weight row,
// input row) float32 accumulators in registers. Each weight byte is read once
// per tile. The gate_up kernel pairs gate row j with up row I + j in a warp
// and writes silu(gate) * up; the down kernel writes each pair's output.
// This CUDA-core kernel serves float32 weights (the exact-parity mode: fp32
// FMAs, no TF32); bf16 weights take the tensor-core kernel of
// grouped_experts_mma.cu, fp8 weights grouped_experts_fp8.cu after their
// inputs are quantised here.
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/moe/expert_kernels.h"
#include "kernels/cuda/moe/grouped_moe.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kWeightRowsPerWarp = 4;
constexpr int kChunk = 512;  // input values per row staged per pass ([16, 512] floats: 32 KiB)
constexpr int kTileRows = static_cast<int>(kGroupedMoeTileRowsF32);
constexpr unsigned kFullMask = 0xffffffffu;

// 16 bytes of weights -> float32 values (float32 weights only today; the
// template leaves room for another 16-byte weight kind).
template <typename Weight>
struct WeightLoad;
template <>
struct WeightLoad<float> {
  static constexpr int kValues = 4;
  __device__ static void load(const float* source, float (&out)[kValues]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(source));
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

template <typename Weight, bool kGateUp>
__global__ void __launch_bounds__(kThreads) expert_kernel(ExpertArgs a) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *a.tile_count) return;  // the routing left this tile empty
  const int expert = a.tiles[3 * tile];
  const int start = a.tiles[3 * tile + 1];
  const int m = a.tiles[3 * tile + 2];  // 1..kTileRows

  __shared__ __align__(16) float staged[kTileRows][kChunk];  // [R, chunk] inputs
  __shared__ int64_t source[kTileRows];  // element offset of each tile row's input
  if (threadIdx.x < kTileRows) {
    int64_t row = 0;
    if (static_cast<int>(threadIdx.x) < m) {
      const int position = start + static_cast<int>(threadIdx.x);
      row = kGateUp ? a.pair_of[position] / a.top_k : position;
    }
    source[threadIdx.x] = row * a.in;
  }

  // This warp's weight rows: gate_up (gate j0, up j0, gate j0+1, up j0+1),
  // down (neurons n0 .. n0+3). Rows past the matrix are not read.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  constexpr int kNeuronsPerWarp = kGateUp ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp;
  const int64_t first_neuron = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kNeuronsPerWarp;
  const int64_t weight_rows = kGateUp ? 2 * a.neurons : a.neurons;
  const Weight* expert_weights =
      static_cast<const Weight*>(a.weights) + static_cast<int64_t>(expert) * weight_rows * a.in;
  const Weight* row_pointer[kWeightRowsPerWarp];
  bool row_valid[kWeightRowsPerWarp];
#pragma unroll
  for (int c = 0; c < kWeightRowsPerWarp; ++c) {
    const int64_t neuron = first_neuron + (kGateUp ? c / 2 : c);
    row_valid[c] = neuron < a.neurons;
    const int64_t row = kGateUp ? neuron + (c % 2) * a.neurons : neuron;
    row_pointer[c] = expert_weights + (row_valid[c] ? row : 0) * a.in;
  }

  using Load = WeightLoad<Weight>;
  constexpr int kValues = Load::kValues;
  float acc[kWeightRowsPerWarp][kTileRows];
#pragma unroll
  for (int c = 0; c < kWeightRowsPerWarp; ++c)
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) acc[c][r] = 0.0f;

  for (int64_t k0 = 0; k0 < a.in; k0 += kChunk) {
    const int length = static_cast<int>(a.in - k0 < kChunk ? a.in - k0 : kChunk);  // % 8 == 0
    __syncthreads();  // the previous chunk is consumed; source[] is visible
    const int vectors = length / 4;
    for (int i = static_cast<int>(threadIdx.x); i < m * vectors; i += kThreads) {
      const int r = i / vectors, v = i % vectors;
      const float4 x = *reinterpret_cast<const float4*>(a.input + source[r] + k0 + 4 * v);
      *reinterpret_cast<float4*>(&staged[r][4 * v]) = x;
    }
    __syncthreads();
    for (int k = lane * kValues; k < length; k += 32 * kValues) {
      float w[kWeightRowsPerWarp][kValues];
#pragma unroll
      for (int c = 0; c < kWeightRowsPerWarp; ++c) {
        if (row_valid[c]) {
          Load::load(row_pointer[c] + k0 + k, w[c]);
        } else {
#pragma unroll
          for (int v = 0; v < kValues; ++v) w[c][v] = 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        if (r >= m) break;  // uniform over the CTA
        float x[kValues];
#pragma unroll
        for (int v = 0; v < kValues; v += 4) {
          const float4 x4 = *reinterpret_cast<const float4*>(&staged[r][k + v]);
          x[v] = x4.x;
          x[v + 1] = x4.y;
          x[v + 2] = x4.z;
          x[v + 3] = x4.w;
        }
#pragma unroll
        for (int c = 0; c < kWeightRowsPerWarp; ++c)
#pragma unroll
          for (int v = 0; v < kValues; ++v) acc[c][r] = fmaf(w[c][v], x[v], acc[c][r]);
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

// out[r, n] = sum over slots s (in order) of gates[r, s] * pair_out[r, s, n],
// then + shared[r, n]: the float operations of the host dispatch's memset,
// scatter-add per expert (ascending ids = slot order) and add_into.
__global__ void combine_kernel(const int32_t* ids, const float* gates, int64_t rows, int64_t top_k,
                               int64_t hidden, int64_t experts, const float* pair_out,
                               const float* shared, float* out) {
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < rows * hidden;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = t / hidden, n = t % hidden;
    float sum = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      const int64_t pair = r * top_k + s;
      const int32_t e = ids[pair];
      if (e >= 0 && e < experts) sum += gates[pair] * pair_out[pair * hidden + n];
    }
    if (shared != nullptr) sum += shared[t];
    out[t] = sum;
  }
}

template <typename Weight, bool kGateUp>
void launch_expert(const ExpertArgs& args, int64_t max_tiles, cudaStream_t stream) {
  constexpr int64_t kNeuronsPerCta =
      kWarps * (kGateUp ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp);
  const dim3 grid(static_cast<unsigned>((args.neurons + kNeuronsPerCta - 1) / kNeuronsPerCta),
                  static_cast<unsigned>(max_tiles));
  launch_kernel(expert_kernel<Weight, kGateUp>, grid, kThreads, 0, stream, args);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

template <bool kGateUp>
void launch_expert(const ExpertArgs& args, bool bf16, int64_t max_tiles, cudaStream_t stream) {
  if (bf16) {
    launch_bf16_mma_experts(args, kGateUp, max_tiles, stream);
  } else {
    launch_expert<float, kGateUp>(args, max_tiles, stream);
  }
}

}  // namespace

void grouped_moe_experts(const float* x, const GroupedMoeShape& shape,
                         const StackedExperts& weights, const GroupedMoeBuffers& buffers,
                         cudaStream_t stream) {
  const GroupedMoeLayout layout = grouped_moe_layout(shape);
  check_grouped_moe_inputs(x, shape, weights, buffers);
  ExpertArgs args;
  args.top_k = shape.top_k;
  args.batch_invariant = shape.batch_invariant;
  args.tile_count = buffers.plan + layout.tile_count;
  args.tiles = buffers.plan + layout.tiles;
  args.pair_of = buffers.plan + layout.pair_of;

  if (weights.fp8) {
    // Inputs quantised per 1x128 group as Blas::linear_fp8 does: x [rows, H]
    // before gate_up, the activations [pairs, I] (bucket order) before down.
    // Every bucket position is quantised (a fixed grid); positions no tile
    // covers (invalid ids) are never read.
    auto* workspace = static_cast<uint8_t*>(buffers.fp8);
    auto* x_q = workspace + layout.fp8_x_q;
    auto* x_scale = reinterpret_cast<float*>(workspace + layout.fp8_x_scale);
    auto* act_q = workspace + layout.fp8_act_q;
    auto* act_scale = reinterpret_cast<float*>(workspace + layout.fp8_act_scale);
    if (buffers.x_q != nullptr) {
      args.input_q = buffers.x_q;
      args.input_scale = buffers.x_scale;
    } else {
      quantize_e4m3_groups(x, shape.rows, shape.hidden, shape.hidden, x_q, x_scale, stream);
      args.input_q = x_q;
      args.input_scale = x_scale;
    }
    args.weights = weights.gate_up;
    args.weight_scale = weights.gate_up_scale;
    args.weight_scale_rows =
        grouped_moe_gate_up_scale_rows(shape.intermediate, weights.gate_up_scale_split);
    args.scale_split = weights.gate_up_scale_split;
    args.in = shape.hidden;
    args.neurons = shape.intermediate;
    args.output = buffers.act;
    launch_fp8_experts(args, /*gate_up=*/true, layout.max_tiles, stream);

    quantize_e4m3_groups(buffers.act, shape.pairs(), shape.intermediate, shape.intermediate, act_q,
                         act_scale, stream);
    args.input_q = act_q;
    args.input_scale = act_scale;
    args.weights = weights.down;
    args.weight_scale = weights.down_scale;
    args.weight_scale_rows = (shape.hidden + 127) / 128;
    args.scale_split = 0;
    args.in = shape.intermediate;
    args.neurons = shape.hidden;
    args.output = buffers.pair_out;
    launch_fp8_experts(args, /*gate_up=*/false, layout.max_tiles, stream);
    return;
  }

  args.input = x;  // [rows, H], gathered through pair_of
  args.weights = weights.gate_up;
  args.in = shape.hidden;
  args.neurons = shape.intermediate;
  args.output = buffers.act;
  launch_expert<true>(args, weights.bf16, layout.max_tiles, stream);

  args.input = buffers.act;
  args.weights = weights.down;
  args.in = shape.intermediate;
  args.neurons = shape.hidden;
  args.output = buffers.pair_out;
  launch_expert<false>(args, weights.bf16, layout.max_tiles, stream);
}

void grouped_moe_combine(const int32_t* ids, const float* gates, const GroupedMoeShape& shape,
                         const float* pair_out, const float* shared, float* out,
                         cudaStream_t stream) {
  const int64_t total = shape.rows * shape.hidden;
  if (total == 0) return;
  constexpr int kCombineThreads = 256;
  const int64_t blocks = (total + kCombineThreads - 1) / kCombineThreads;
  launch_kernel(combine_kernel, static_cast<unsigned>(blocks < 4096 ? blocks : 4096),
                kCombineThreads, 0, stream, ids, gates, shape.rows, shape.top_k, shape.hidden,
                shape.experts, pair_out, shared, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

void grouped_moe(const float* x, const int32_t* ids, const float* gates,
                 const GroupedMoeShape& shape, const StackedExperts& weights, const float* shared,
                 const GroupedMoeBuffers& buffers, float* out, cudaStream_t stream) {
  check_grouped_moe_inputs(x, shape, weights, buffers);  // before anything is launched
  grouped_moe_plan(ids, shape, buffers.plan, stream);
  grouped_moe_experts(x, shape, weights, buffers, stream);
  grouped_moe_combine(ids, gates, shape, buffers.pair_out, shared, out, stream);
}

}  // namespace megactx::cuda

// Routed experts of a MoE layer on the device with no host synchronisation
// (decode, MTP verification and other small row counts): the routed
// (row, slot) pairs are bucketed by expert on the device, then each expert's
// SwiGLU MLP runs as grouped GEMV-like kernels whose grids depend only on the
// shape (rows, top_k, ...), never on the routing, so the whole sequence can
// be captured in a CUDA Graph. CTAs of tiles the routing left empty exit at
// once.
//
// Each CTA streams its slice of one expert's weight rows once and applies it
// to up to tile_rows() of that expert's rows:
// decode is weight-bandwidth bound, so weights are read once per tile of rows.
// Weights are float32 (the exact-parity mode: CUDA-core FMAs), bf16
// (tensor-core MMAs with the tile's rows as the n = 8 columns) or fp8 (e4m3
// with 128x128 block scales, as a checkpoint ships them); bf16 weights round
// the kernel inputs (the gathered rows, the SwiGLU activations) to bf16 and
// accumulate in float32, as Blas::linear's bf16 path does; fp8 weights
// quantise them per 1x128 group with quantize_e4m3_groups, as
// Blas::linear_fp8 does, so the products are the host dispatch's.
//
// Sum over slots in slot order (ids ascending per row, so the order of the
// host dispatch's scatter-add): each pair's expert output is written to
// pair_out[rows, top_k, H] and one reduction per output element adds them, so
// results do not depend on scheduling (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// Rows of one expert one CTA applies its weights to: float32 weights keep a
// register accumulator per (weight row, tile row) on CUDA cores; bf16 weights
// use four n = 8 tensor-core column groups, so a tile of 32 rows costs no
// more weight traffic than one row.
inline constexpr int64_t kGroupedMoeTileRowsF32 = 16;
inline constexpr int64_t kGroupedMoeTileRowsBf16 = 32;
// fp8 weights: tensor cores too (the weight rows as the MMA's M, the tile's
// rows as four n = 8 column groups).
inline constexpr int64_t kGroupedMoeTileRowsFp8 = 32;
// Bounds of the grouped path (larger batches take the host dispatch, whose
// GEMMs read each expert's weights once for all its rows and use tensor
// cores): rows per call (the largest decode-graph bucket) and routed pairs
// (rows * top_k: the workspace grows with them).
inline constexpr int64_t kGroupedMoeMaxRows = 256;
inline constexpr int64_t kGroupedMoeMaxPairs = 4096;

struct GroupedMoeShape {
  int64_t rows = 0;          // tokens of the call
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I, per expert
  int64_t experts = 0;       // E routed experts
  int64_t top_k = 0;         // experts per token
  bool bf16 = false;         // the weights' kind (StackedExperts::bf16): sets the tile rows
  bool fp8 = false;          // e4m3 weights (StackedExperts::fp8); bf16 must then be false
  // The deterministic mode: a row's bits must not depend on the rows beside
  // it, so no kernel choice may follow the grid size (the experts' split-K
  // stays at its forced or unsplit form: expert_split_k).
  bool batch_invariant = false;
  int64_t pairs() const { return rows * top_k; }
  int64_t tile_rows() const {
    if (fp8) return kGroupedMoeTileRowsFp8;
    return bf16 ? kGroupedMoeTileRowsBf16 : kGroupedMoeTileRowsF32;
  }
};

// The plan buffer (int32) written by grouped_moe_plan, offsets in elements.
// tile_count [1]; tiles [max_tiles, 3] = (expert, first bucket position,
// rows); pair_of [pairs]: bucket position -> pair (row * top_k + slot),
// pairs grouped by expert (ascending), in pair order within an expert;
// counts [E] pairs per expert; offsets [E + 1] first bucket position per
// expert. Pairs whose expert id is outside [0, E) are left out.
struct GroupedMoeLayout {
  int64_t max_tiles = 0;  // grid bound: min(E, pairs) + pairs / tile_rows()
  int64_t tile_count = 0, tiles = 0, pair_of = 0, counts = 0, offsets = 0;
  int64_t plan_ints = 0;        // size of the plan buffer
  int64_t act_floats = 0;       // [pairs, I] SwiGLU activations, bucket order
  int64_t pair_out_floats = 0;  // [rows, top_k, H] expert outputs per pair
  int plan_threads = 0;         // bucketing block: pairs rounded up to a warp, <= 512
  size_t plan_shared_bytes = 0;
  // fp8 only (0 otherwise): the quantised kernel inputs, byte offsets into
  // GroupedMoeBuffers::fp8 (each 16-byte aligned): x_q [rows, H] e4m3,
  // x_scale [rows, ceil(H / 128)] float32, act_q [pairs, I] e4m3, act_scale
  // [pairs, ceil(I / 128)] float32 (quantize_e4m3_groups' outputs).
  size_t fp8_x_q = 0, fp8_x_scale = 0, fp8_act_q = 0, fp8_act_scale = 0;
  size_t fp8_bytes = 0;
};

// True when the grouped path serves `shape` (rows and pairs within the
// bounds, H and I multiples of 8 for 16-byte weight loads, the bucketing
// kernel's shared memory within 48 KiB).
bool grouped_moe_supported(const GroupedMoeShape& shape);
// As grouped_moe_supported, but a megactx::Error naming what does not fit.
void check_grouped_moe(const GroupedMoeShape& shape);
// Layout and buffer sizes of `shape` (checks it first).
GroupedMoeLayout grouped_moe_layout(const GroupedMoeShape& shape);

// Routed experts stacked: expert e's gate_up rows at gate_up + e * 2I * H.
struct StackedExperts {
  const void* gate_up = nullptr;  // [E, 2I, H]: gate rows [0, I), up rows [I, 2I)
  const void* down = nullptr;     // [E, H, I]
  bool bf16 = false;              // else float32 (or fp8)
  // fp8: gate_up / down are e4m3 bytes, each expert's 128x128 block scales
  // (weight_scale_inv) stacked the same way: gate_up_scale [E,
  // gate_up_scale_rows(), ceil(H / 128)], down_scale [E, ceil(H / 128),
  // ceil(I / 128)]. gate_up_scale_split is DeviceMatrix::scale_split of each
  // expert's gate_up (I when gate and up were stacked from two checkpoint
  // matrices, 0 when they share one scale grid).
  bool fp8 = false;
  const float* gate_up_scale = nullptr;
  const float* down_scale = nullptr;
  int64_t gate_up_scale_split = 0;
};

// Scale rows of one expert's stacked gate_up [2I, H] under `scale_split`
// (the last weight row's scale row + 1, DeviceMatrix's rule).
int64_t grouped_moe_gate_up_scale_rows(int64_t intermediate, int64_t scale_split);

struct GroupedMoeBuffers {
  int32_t* plan = nullptr;    // [layout.plan_ints]
  float* act = nullptr;       // [layout.act_floats]
  float* pair_out = nullptr;  // [layout.pair_out_floats]
  void* fp8 = nullptr;        // fp8 weights only: [layout.fp8_bytes], 16-byte aligned
  // fp8 weights, optional: an e4m3 copy of x that its producer wrote with
  // quantize_e4m3_groups's codes and scales (the norm's Fp8Copy): x_q [rows,
  // hidden] dense, 16-byte aligned, x_scale [rows, ceil(hidden / 128)]. The
  // gate / up kernel then reads it instead of quantising x again (the same bits).
  const uint8_t* x_q = nullptr;
  const float* x_scale = nullptr;
};

// Whether the model hands the grouped fp8 experts the norm's e4m3 copy of
// their input (GroupedMoeBuffers::x_q): kSharedFp8MoeInput, or
// MEGACTX_MOE_SHARED_FP8_INPUT=0 / 1 for A/B runs (other values are an error).
// Off until it has run on a GPU.
inline constexpr bool kSharedFp8MoeInput = false;
bool shared_fp8_moe_input();

// Errors for missing weights or buffers, weights of another kind than
// shape.bf16 / shape.fp8 say, fp8 weights without scales, and inputs not 16-byte aligned (the
// kernels load 16 bytes at a time).
void check_grouped_moe_inputs(const float* x, const GroupedMoeShape& shape,
                              const StackedExperts& weights, const GroupedMoeBuffers& buffers);

// (a) Buckets ids [rows, top_k] by expert into `plan` (one thread block).
void grouped_moe_plan(const int32_t* ids, const GroupedMoeShape& shape, int32_t* plan,
                      cudaStream_t stream);

// The whole routed computation, (a) to (c):
// out[r, :] = sum_s gates[r, s] * expert_{ids[r, s]}(x[r, :])  (+ shared[r, :] last,
// when shared is not null). x, shared, out [rows, H] float32, 16-byte aligned;
// ids, gates [rows, top_k] (a moe_route output). out may not alias x.
void grouped_moe(const float* x, const int32_t* ids, const float* gates,
                 const GroupedMoeShape& shape, const StackedExperts& weights, const float* shared,
                 const GroupedMoeBuffers& buffers, float* out, cudaStream_t stream);

// (b) and (c) alone, over a plan made by grouped_moe_plan for the same shape
// (grouped_moe runs the three in order).
void grouped_moe_experts(const float* x, const GroupedMoeShape& shape,
                         const StackedExperts& weights, const GroupedMoeBuffers& buffers,
                         cudaStream_t stream);
void grouped_moe_combine(const int32_t* ids, const float* gates, const GroupedMoeShape& shape,
                         const float* pair_out, const float* shared, float* out,
                         cudaStream_t stream);

}  // namespace megactx::cuda

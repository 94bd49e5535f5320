// The indexer's scoring and its top-k of a few decode rows in one launch: one
// thread-block cluster of kDecodeSelectCtas CTAs per row scores the row's
// keys into shared memory and selects the top k among them with cluster
// barriers; no score reaches global memory.
//
// Why: at an 8K context a full layer's indexer costs ~12.5 us on an H100 in
// two launches: the scores (~5 us over 32 CTAs, written to global memory) and
// the one-CTA top-k (~7.5 us, a dependent chain on one SM that re-reads
// them; docs/benchmarks.md). Here the CTAs that score the keys also select
// among them.
//
// The scores are the scoring kernel's, bit for bit (the same per-warp steps,
// indexer/indexer_tiles.cuh). The selection is a radix select over the
// order-preserving uint32 image of the scores, 8 bits per level from the top:
// each CTA counts its keys of the level's digit in a 256-bin histogram, every
// CTA sums all CTAs' histograms through distributed shared memory and finds
// the threshold digit itself (the same answer everywhere: one cluster barrier
// per level), and a level ends the search early when the threshold bin holds
// exactly the ties still needed. Each CTA then writes its own keys above the
// threshold, and as many tied keys as are still needed, at output positions
// from a cluster-wide prefix of per-CTA counts. The order of a row's entries
// is fixed for a given input (CTA rank, then thread, then key), unspecified
// otherwise, as radix_topk's; rows with at most top_k visible keys take all
// of them, -1 after.
//
// Rows are independent (a cluster each): causal MTP rows of one request read
// the same pages, each for itself. Where it serves: at most
// kDecodeSelectMaxRows rows of at most kDecodeSelectMaxVisible keys, 32 or 64
// heads, on GPUs that hold a cluster of 16 CTAs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

inline constexpr int kDecodeSelectCtas = 16;  // CTAs per row (a non-portable cluster size)
inline constexpr int kDecodeSelectMaxPagesPerCta = 16;
inline constexpr int kDecodeSelectMaxVisible =
    kDecodeSelectCtas * kDecodeSelectMaxPagesPerCta * kPageTokens;  // 16384
inline constexpr int kDecodeSelectMaxRows = 64;

struct DecodeSelectParams {
  const uint8_t* queries = nullptr;      // [rows, heads, 128] e4m3 (quantize_indexer_queries)
  const float* weights = nullptr;        // [rows, heads] folded head weights
  const uint8_t* key_pool = nullptr;     // [num_pages * 64, 132] indexer cache of this layer
  const int32_t* block_table = nullptr;  // [num_requests, block_table_stride] physical page ids
  const int32_t* row_request = nullptr;  // [rows] request of each row
  const int32_t* row_visible = nullptr;  // [rows] keys visible to each row (causal length)
  int block_table_stride = 0;
  int rows = 0;
  int heads = 0;  // 32 (GLM-5.x) or 64 (DeepSeek-V3.2)
  int top_k = 0;
  int max_visible = 0;  // >= every row_visible; sizes the CTAs' shares of a row
  // out [rows, top_k]: the selected positions p, or with write_slots their
  // physical slots (block_table[p / 64] * 64 + p % 64); -1 past min(top_k, visible).
  int32_t* out = nullptr;
  bool write_slots = false;
  // Optional (tests): [rows, score_stride] the scores as computed, for
  // p < row_visible of the rows with more than top_k visible keys.
  float* scores = nullptr;
  int64_t score_stride = 0;
  int probe_stage = 0;  // PROBE
};

// Whether the kernel serves this shape on this GPU.
bool decode_select_serves(int rows, int heads, int max_visible);

// Whether the model's decode and the benchmark's attention stack take the
// kernel where it serves: MEGACTX_DECODE_SELECT=1 (off by default until its
// measurement on a GPU decides).
bool decode_select_enabled();

// Validates (megactx::Error) and launches on `stream`.
void decode_indexer_select(const DecodeSelectParams& params, cudaStream_t stream);

namespace detail {
void launch_decode_indexer_select(const DecodeSelectParams& params, cudaStream_t stream);
bool decode_select_resident();  // a cluster of the kernel fits this GPU
}  // namespace detail

}  // namespace megactx::cuda

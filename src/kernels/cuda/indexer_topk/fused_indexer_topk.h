// Fused DSA indexer + top-k for prefill chunks: scores many query rows
// against the paged fp8 key cache on fp8 tensor cores and keeps, per row, a
// streaming top-k, so no [rows, context] score matrix ever exists.
//
//   score(row, p) = key_scale(p) * sum_h weight(row, h) * relu(q8(row, h) . k8(p))
//
// (the same function as kernels/cuda/indexer/indexer.h; weights are the
// folded ones of quantize_indexer_queries). Result per row: the positions of
// min(top_k, visible) largest scores in unspecified order (ties: any of them,
// as radix_topk), then -1 up to top_k.
//
// Work split. A planning kernel cuts the rows into tiles of consecutive rows
// that share a page table (a segment of one request), kFusedTileRows(heads)
// rows each (16 for 32 heads, 8 for 64). A persistent grid (one CTA per SM)
// is dealt the tiles in a fixed order, heaviest first, snaking over the CTAs
// round by round (no claim to share, so no CTA-wide barrier between tiles;
// each warpgroup loads its own rows' queries). In a CTA one producer warp streams
// the tile's key pages (64 keys, 8448 B) with TMA bulk copies through a
// 4-stage ring; four consumer warpgroups each own a quarter of the tile's rows
// (128 = rows x heads tensor-core columns; two warpgroups of 256 columns in
// the other variants) and score every page:
//   acc[key, (row, head)] = k8[key, :] . q8[row, head, :]   (wgmma m64n128k32
//   e4m3, keys from registers, queries from shared memory)
// then relu * weight summed over heads (on the tensor cores: relu(acc) in bf16
// times the weights, a second wgmma whose A fragments are the accumulator
// registers; or in fp32 on the CUDA cores), times the key scale.
//
// Streaming selection per row: a threshold (the k-th largest key seen at the
// last compaction) and a candidate buffer of kFusedCandidates entries (the
// order-preserving uint32 image of the score and the position) in global
// memory, one per row of a CTA's current tile. A score above the threshold is
// appended; when a buffer passes kFusedCandidates - 64 entries its warpgroup
// compacts it to exactly top_k entries with a radix select in shared memory
// and raises the threshold. At the end of a tile the same select writes the
// row's result. A tile streams its pages newest first: scores that favour
// recent keys (an indexer's usual recency bias) raise the threshold at once,
// so few older keys become candidates (32K prompt of rising scores: 593
// against 389 TFLOP/s oldest first; random scores alike). Scratch: O(SMs x
// tile rows x kFusedCandidates) plus O(rows), independent of the context length.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

inline constexpr int kFusedMaxTopk = 2048;
inline constexpr int kFusedCandidates = 8192;  // candidate entries per row of an active tile
inline constexpr int kFusedMaxTileRows = 16;
// The four-warpgroup kernel's default compaction-check interval in key pages
// (FusedIndexerTopkParams::check_pages; measured in docs/benchmarks.md).
inline constexpr int kFusedCheckPages = 4;

// Rows per tile: 256 tensor-core columns per warpgroup / heads, two warpgroups.
constexpr int fused_tile_rows(int heads) {
  return 2 * (256 / heads);
}

struct FusedIndexerTopkParams {
  const uint8_t* queries = nullptr;      // [rows, heads, 128] e4m3
  const float* weights = nullptr;        // [rows, heads] head weight * query scale * D^-0.5
  const uint8_t* key_pool = nullptr;     // [num_pages * 64, 132] indexer cache of this layer
  const int32_t* page_tables = nullptr;  // concatenated page tables (physical page ids)
  // [rows] where each row's page table starts in page_tables. Consecutive rows
  // with the same offset are one segment (rows of one request); tiles never
  // cross a segment.
  const int32_t* row_table = nullptr;
  const int32_t* row_visible = nullptr;    // [rows] keys visible to each row (causal length)
  const int32_t* row_positions = nullptr;  // [rows] used when row_visible is null: visible = p + 1
  int rows = 0;
  int heads = 0;                  // 32 (GLM-5.x) or 64 (DeepSeek-V3.2)
  int top_k = 0;                  // 1..kFusedMaxTopk
  int max_visible = 0;            // >= every visible length (validation only)
  int32_t* out = nullptr;         // [rows, top_k] out: positions, -1 padding
  int32_t* out_counts = nullptr;  // optional [rows] out: min(top_k, visible)
  // fused_indexer_topk_workspace_bytes(rows, ctas) bytes; needs no zeroing
  // (the planning kernel initialises what is read), reusable by the next call
  // on the same stream and capturable in a CUDA graph.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int ctas = 0;       // persistent CTAs (0: one per SM); the workspace is sized by it
  bool wgmma = true;  // false: the same kernel scoring with mma.sync (a comparison path)
  // wgmma only: the sum over heads on the tensor cores, relu(q8 . k8) and the
  // weights rounded to bf16 (each weight split into two bf16 parts, so only
  // the ReLU'd products are rounded: 2^-9 relative each), 16 wgmma m64n16k16
  // per page in place of 256 CUDA-core instructions per thread. false: fp32
  // FMAs on the CUDA cores (exact sums of the exact fp8 products). The two
  // differ on NaN codes in the cache or the queries (a broken model): the
  // bf16 conversion keeps a NaN product, so the key's score is NaN and ranks
  // above every number, where fmaxf(NaN, 0) counted it as 0.
  bool tensor_head_sum = true;
  // The fp32 head sum only (tensor_head_sum = false; anything else is an
  // error): the two consumer warpgroups take turns issuing their MMAs, so that
  // one's epilogue runs while the other's MMAs do. Measured no faster than
  // free-running warpgroups (1M keys 31.2 vs 30.3 ms, 128K prompt 188 vs
  // 180 ms), so off by default; kept as a tested variant.
  bool ping_pong = false;
  // Consumer warpgroups per CTA with the tensor-core head sum: 4 (each scores
  // a quarter of the tile's 512 (row, head) columns with m64n128 MMAs, so
  // three warpgroups' MMAs can run while one is in its epilogue) or 2 (halves,
  // m64n256). 0 picks 4 for the tensor-core head sum and 2 for the other
  // paths, which have only the two-warpgroup layout (4 there is an error).
  int consumer_warpgroups = 0;
  // The order a tile streams its key pages in: newest first (true), so that
  // scores which rise towards the query's position (recency) set a high
  // threshold early and few later keys become candidates; or oldest first.
  // The selected set is the same up to ties either way.
  bool newest_first = true;
  // How often (in key pages) each consumer warpgroup looks for rows whose
  // candidate buffer passed its high-water mark (a warpgroup barrier each
  // time; the mark sits that many pages below the buffer's end): 1 or 4 (4:
  // the four-warpgroup tensor-core head sum only), or 0 for the default:
  // kFusedCheckPages with that layout, 1 with the others.
  int check_pages = 0;
  // Tests only: when set, every score the kernel computes for a visible key is
  // also written here ([rows, debug_stride] fp32), to tell scoring from selection.
  float* debug_scores = nullptr;
  int64_t debug_stride = 0;
};

// Bytes of workspace for `rows` rows on `ctas` persistent CTAs: per-row
// visible lengths and tiles, plus ctas x kFusedMaxTileRows candidate buffers
// (kFusedCandidates x 8 B each: 64 KiB per row of an active tile).
size_t fused_indexer_topk_workspace_bytes(int64_t rows, int ctas);

// The CTAs a call with params.ctas == 0 uses on the current device (its SM count).
int fused_indexer_topk_default_ctas();

// Validates (megactx::Error) and launches the planning and the fused kernel on `stream`.
void fused_indexer_topk(const FusedIndexerTopkParams& params, cudaStream_t stream);

namespace detail {
void launch_fused_indexer_topk(const FusedIndexerTopkParams& params, int ctas, cudaStream_t stream);
}  // namespace detail

}  // namespace megactx::cuda

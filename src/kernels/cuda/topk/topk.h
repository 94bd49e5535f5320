// Top-k selection of indexer scores into physical cache slots, on the GPU.
//
// A multi-CTA radix select: every pass spreads one row's scores over many CTAs
// (kTopkChunk scores each); each CTA builds a shared-memory histogram of the
// next digit of the candidates still tied with the threshold prefix, adds it
// to the row's global histogram, and the last CTA to finish (a ticket counter)
// picks the digit where the k-th largest lies. Digits are 12, 12 and 8 bits of
// the order-preserving uint32 image of the score, so after three passes the
// exact k-th value is known (earlier when the threshold bin holds exactly the
// ties still needed: the row settles there and the later passes return); a collect pass then writes
// the positions above it and as many equal ones as are still needed (ties: any of them) as physical
// slots (block_table[p / 64] * 64 + p % 64). Rows with at most k visible keys
// take them all in one pass; slots past min(k, visible) are -1.
//
// Positions mode: with block_table == nullptr the selection is written as the
// positions p themselves (row_request and block_table_stride are then unused).
// The CUDA model keeps positions (its MTP layer and shared-indexer layers
// reuse them) and maps them to slots per attention call. Either way the order
// within a row's first min(k, visible) entries is unspecified.
//
// When every row has at most kTopkSmallRow scores, one CTA per row does the
// same passes with the row held in shared memory, in a single launch.
//
// A few rows (at most kTopkClusterMaxRows: a decode step's, an MTP
// verification's) of kTopkClusterMinVisible to kTopkClusterMaxVisible keys
// take one thread-block cluster per row instead (cluster_topk.cu): the same
// digits and collect in one launch, the row's keys in the CTAs' shared
// memory, the histograms summed through distributed shared memory. On the
// H200 it selects from 32K / 128K keys in 10.0 / 15.0 us against 15.6 /
// 20.9 for the one-CTA kernel and the passes; at 8K the one-CTA kernel is
// as fast, from 512K the passes are faster. TopkParams::path picks a kernel
// family explicitly (tests, benchmarks); MEGACTX_TOPK_CLUSTER=0 keeps the
// automatic choice off the cluster kernel (A/B runs).
//
// The workspace (histograms, counters) must be zero before the first call; the
// kernels leave it zero again, so the calls can be replayed in a CUDA graph
// (the cluster kernel does not use it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

inline constexpr int kTopkChunk = 8192;      // scores per CTA in each pass
inline constexpr int kTopkSmallRow = 32768;  // rows up to this long: one CTA each, keys in smem
inline constexpr int kTopkHistogramBins = 4096;
inline constexpr int kTopkRowState = 8;     // int32 counters per row
inline constexpr int kTopkClusterCtas = 8;  // CTAs per row in the cluster kernel
inline constexpr int kTopkClusterThreads = 1024;
inline constexpr int kTopkClusterMaxVisible = 48 * kTopkClusterCtas * kTopkClusterThreads;  // 384K
inline constexpr int kTopkClusterMinVisible = 16384;  // shorter rows: the one-CTA kernel
inline constexpr int kTopkClusterMaxRows = 64;        // more rows: the passes fill the GPU as well

enum class TopkPath : uint8_t {
  Auto,     // the cluster kernel where it is chosen (see above), else the passes
  Passes,   // the one-CTA kernel (rows up to kTopkSmallRow) or the multi-CTA passes
  Cluster,  // one cluster per row: <= kTopkClusterMaxRows rows of <= kTopkClusterMaxVisible keys
};

struct TopkParams {
  const float* scores = nullptr;  // [rows, score_stride]; entries p < row_visible[row] are read
  int64_t score_stride = 0;
  const int32_t* row_visible = nullptr;  // [rows]
  const int32_t* row_request = nullptr;  // [rows] request whose block table maps positions to slots
  const int32_t* block_table = nullptr;  // [num_requests, block_table_stride]; null: positions mode
  int block_table_stride = 0;
  int rows = 0;
  int top_k = 0;
  int max_visible = 0;           // >= every row_visible; sizes the grid
  int32_t* out_slots = nullptr;  // [rows, top_k] out: physical slots (or positions), -1 padding
  // Workspace (zeroed once with cudaMemset; left zeroed):
  uint32_t* histogram = nullptr;  // [rows, kTopkHistogramBins]
  int32_t* row_state = nullptr;   // [rows, kTopkRowState]
  TopkPath path = TopkPath::Auto;
};

// Whether the cluster kernel serves this shape, and which family a call takes.
bool topk_cluster_serves(const TopkParams& params);
TopkPath topk_path_chosen(const TopkParams& params);

// Validates (megactx::Error) and launches the chosen kernel family on `stream`.
void radix_topk(const TopkParams& params, cudaStream_t stream);

namespace detail {
void launch_radix_topk(const TopkParams& params, cudaStream_t stream);
void launch_cluster_topk(const TopkParams& params, cudaStream_t stream);
bool cluster_topk_resident();  // a cluster of the kernel fits this GPU
}  // namespace detail

}  // namespace megactx::cuda

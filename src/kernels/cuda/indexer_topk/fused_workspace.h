// Byte layout of the fused indexer + top-k workspace (fused_indexer_topk.h),
// shared by the host checks and the kernels. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"

namespace megactx::cuda::fused {

inline size_t round_up_256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

struct WorkspaceLayout {
  size_t counters = 0;   // int32 [4]: the tile count (the rest spare)
  size_t visible = 0;    // int32 [rows]
  size_t tiles = 0;      // int4 [rows]: first row, row count, key pages of the longest row
  size_t keys = 0;       // uint32 [ctas, kFusedMaxTileRows, kFusedCandidates]
  size_t positions = 0;  // int32 [ctas, kFusedMaxTileRows, kFusedCandidates]
  size_t total = 0;
};

inline WorkspaceLayout workspace_layout(int64_t rows, int ctas) {
  const size_t n = static_cast<size_t>(rows > 0 ? rows : 1);
  const size_t buffers =
      static_cast<size_t>(ctas > 0 ? ctas : 1) * kFusedMaxTileRows * kFusedCandidates * 4;
  WorkspaceLayout layout;
  layout.counters = 0;
  layout.visible = 256;
  layout.tiles = layout.visible + round_up_256(4 * n);
  layout.keys = layout.tiles + round_up_256(16 * n);
  layout.positions = layout.keys + buffers;
  layout.total = layout.positions + buffers;
  return layout;
}

}  // namespace megactx::cuda::fused

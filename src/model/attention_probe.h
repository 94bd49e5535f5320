// A look at the CPU model's sparse attention as it runs, for evaluation tools
// (the indexer's recall against the dense attention: model/indexer_recall.h):
// per layer and sequence, the rows' absorbed queries, the selection they
// attend through and a way to read any cached latent of the sequence.
// DsaModel::set_attention_probe installs one; it costs nothing when unset.
#pragma once

#include <cstdint>
#include <functional>

namespace megactx {

struct AttentionProbeLayer {
  int64_t layer = 0;
  int64_t indexer_source = 0;  // the full layer whose top-k this layer attends through
  int64_t heads = 0, kv_lora = 0, rope = 0;
  float scale = 1.0f;               // softmax scale of the scores
  int64_t start = 0;                // position of the first row
  int64_t rows = 0;                 // new rows of the sequence in this step
  const float* q_latent = nullptr;  // [rows, heads, kv_lora]: q_nope . W_UK
  const float* q_rope = nullptr;    // [rows, heads, rope], rotated
  const int32_t* topk = nullptr;    // [rows, index_topk] selected positions, -1 padded
  const int64_t* counts = nullptr;  // [rows] selected per row
  int64_t index_topk = 0;
  // Writes the cached entry of `position` (< start + rows): [kv_lora | rope].
  std::function<void(int64_t position, float* entry)> read_entry;
};

using AttentionProbe = std::function<void(const AttentionProbeLayer&)>;

}  // namespace megactx

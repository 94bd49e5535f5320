// The attention side of one decode (or MTP verification) step over every
// layer, with IndexShare: a full layer runs its indexer and top-k and turns the
// result into physical slots; each shared layer reuses the slots of the most
// recent full layer and has no indexer cache at all. Projections (q_a/q_b,
// kv_a, W_UK/W_UV, o_proj) are not part of this step: the caller computes the
// absorbed queries and applies W_UV to the outputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace megactx::cuda {

// Full (runs the indexer) iff max(layer - offset + 1, 0) % freq == 0, as in
// GLM-5.x's index_topk_freq / index_skip_topk_offset.
std::vector<bool> index_share_schedule(int layers, int freq, int offset);

struct AttentionStackShape {
  int rows = 0;            // query rows of the step (requests x tokens per request)
  int rows_per_group = 1;  // tokens per request (1..8), rows of one request are consecutive
  int heads = 64;          // attention heads (multiple of 64)
  int index_heads = 32;    // indexer heads (32 or 64)
  int top_k = 2048;
  int num_splits = 1;          // sparse MLA key splits
  bool cluster_merge = false;  // SparseMlaParams::cluster_merge (num_splits 8 or 16)
  // SparseMlaParams::inputs_ready_at_launch on the shared layers (the full
  // layers' top-k runs right before their sparse MLA here, unlike in the model,
  // where the query pack stands between).
  bool early_inputs = false;
  float softmax_scale = 0;
  const int32_t* block_table = nullptr;  // [requests, block_table_stride]
  int block_table_stride = 0;
  const int32_t* row_request = nullptr;  // [rows]
  const int32_t* row_visible = nullptr;  // [rows] causal lengths
  int max_visible = 0;
};

struct AttentionLayerBuffers {
  // Full layers only (null for shared layers):
  const uint8_t* indexer_queries = nullptr;  // [rows, index_heads, 128] e4m3
  const float* indexer_weights = nullptr;    // [rows, index_heads] folded weights (indexer.h)
  const uint8_t* indexer_pool = nullptr;     // [slots, 132]
  // Every layer:
  const uint16_t* q = nullptr;           // [rows, heads, 576] bf16, absorbed
  const uint8_t* latent_pool = nullptr;  // [slots, 656]
  uint16_t* out = nullptr;               // [rows, heads, 512] bf16
  float* lse = nullptr;                  // [rows, heads]
};

struct AttentionStackWorkspace {
  float* scores = nullptr;  // [rows, score_stride]
  int64_t score_stride = 0;
  uint32_t* histogram = nullptr;  // [rows, kTopkHistogramBins], zeroed once
  int32_t* row_state = nullptr;   // [rows, kTopkRowState], zeroed once
  int32_t* slots = nullptr;       // [rows, top_k]: the slots that travel from full to shared layers
  float* partial_out = nullptr;   // [rows, num_splits, heads, 512] when num_splits > 1
  float* partial_lse = nullptr;   // [rows, num_splits, heads]
};

// Runs every layer in order on `stream`; returns how many indexers ran.
// Throws megactx::Error when the first layer is not full or a full layer lacks
// its indexer buffers.
int run_attention_stack(const AttentionStackShape& shape, const std::vector<bool>& full_layers,
                        const std::vector<AttentionLayerBuffers>& layers,
                        const AttentionStackWorkspace& workspace, cudaStream_t stream);

}  // namespace megactx::cuda

// IndexShare layer loop: indexer + top-k on full layers, sparse MLA everywhere.
#include "bench/cuda/support/attention_stack.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/sparse_mla/sparse_mla.h"
#include "kernels/cuda/topk/topk.h"

namespace megactx::cuda {

std::vector<bool> index_share_schedule(int layers, int freq, int offset) {
  MEGACTX_CHECK(layers >= 0 && freq >= 1, "index_share_schedule: layers {} freq {}", layers, freq);
  std::vector<bool> full(static_cast<size_t>(layers));
  for (int layer = 0; layer < layers; ++layer)
    full[layer] = std::max(layer - offset + 1, 0) % freq == 0;
  return full;
}

int run_attention_stack(const AttentionStackShape& shape, const std::vector<bool>& full_layers,
                        const std::vector<AttentionLayerBuffers>& layers,
                        const AttentionStackWorkspace& workspace, cudaStream_t stream) {
  MEGACTX_CHECK(full_layers.size() == layers.size(),
                "attention stack: schedule has {} layers, buffers {}", full_layers.size(),
                layers.size());
  MEGACTX_CHECK(layers.empty() || full_layers.front(),
                "attention stack: layer 0 must run the indexer");
  int indexer_runs = 0;
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    const AttentionLayerBuffers& buffers = layers[layer];
    if (full_layers[layer]) {
      MEGACTX_CHECK(buffers.indexer_queries && buffers.indexer_weights && buffers.indexer_pool,
                    "attention stack: full layer {} has no indexer buffers", layer);
      IndexerScoreParams scoring;
      scoring.queries = buffers.indexer_queries;
      scoring.weights = buffers.indexer_weights;
      scoring.key_pool = buffers.indexer_pool;
      scoring.block_table = shape.block_table;
      scoring.block_table_stride = shape.block_table_stride;
      scoring.row_request = shape.row_request;
      scoring.row_visible = shape.row_visible;
      scoring.scores = workspace.scores;
      scoring.score_stride = workspace.score_stride;
      scoring.rows = shape.rows;
      scoring.heads = shape.index_heads;
      scoring.rows_per_group = shape.rows_per_group;
      scoring.max_visible = shape.max_visible;
      indexer_scores(scoring, stream);

      TopkParams selection;
      selection.scores = workspace.scores;
      selection.score_stride = workspace.score_stride;
      selection.row_visible = shape.row_visible;
      selection.row_request = shape.row_request;
      selection.block_table = shape.block_table;
      selection.block_table_stride = shape.block_table_stride;
      selection.rows = shape.rows;
      selection.top_k = shape.top_k;
      selection.max_visible = shape.max_visible;
      selection.out_slots = workspace.slots;
      selection.histogram = workspace.histogram;
      selection.row_state = workspace.row_state;
      radix_topk(selection, stream);
      ++indexer_runs;
    }
    SparseMlaParams attention;
    attention.q = buffers.q;
    attention.slots = workspace.slots;
    attention.kv_pool = buffers.latent_pool;
    attention.out = buffers.out;
    attention.lse = buffers.lse;
    attention.partial_out = workspace.partial_out;
    attention.partial_lse = workspace.partial_lse;
    attention.rows = shape.rows;
    attention.heads = shape.heads;
    attention.top_k = shape.top_k;
    attention.num_splits = shape.num_splits;
    attention.cluster_merge = shape.cluster_merge;
    attention.inputs_ready_at_launch = shape.early_inputs && !full_layers[layer];
    attention.softmax_scale = shape.softmax_scale;
    sparse_mla_attention(attention, stream);
  }
  return indexer_runs;
}

}  // namespace megactx::cuda

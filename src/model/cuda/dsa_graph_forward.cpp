// CudaDsaModel: decode steps as CUDA Graphs over batch-size buckets (see
// model/cuda/decode_graph.h for the scheme): which steps qualify, the packed
// input upload, replay or eager run + capture, and the copy of the real rows'
// outputs.
#if MEGACTX_HAVE_CUDA
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/expert_dispatch.h"

namespace megactx {
namespace cuda {

namespace {

GroupedMoeShape grouped_shape(const ModelConfig& config, const DeviceLayer& w, int64_t rows) {
  const int64_t intermediate = w.experts.empty() ? 0 : w.experts.front().intermediate;
  GroupedMoeShape shape{rows, config.hidden_size, intermediate, config.n_routed_experts,
                        config.num_experts_per_tok};
  // The experts' kind sets the tile rows the bounds depend on (as moe()
  // builds it).
  shape.bf16 = w.experts_gate_up.bf16;
  shape.fp8 = w.experts_gate_up.fp8();
  return shape;
}

// Both stacks of one kind: float32, bf16, or fp8 with block scales (fp8 down
// needs its one scale grid: scale_split 0).
bool stacked_experts(const DeviceLayer& w) {
  const int64_t intermediate = w.experts.empty() ? 0 : w.experts.front().intermediate;
  return w.experts_gate_up && w.experts_down && w.experts_gate_up.bf16 == w.experts_down.bf16 &&
         w.experts_gate_up.fp8() == w.experts_down.fp8() && w.experts_down.scale_split == 0 &&
         (w.experts_gate_up.scale_split == 0 || w.experts_gate_up.scale_split == intermediate);
}

}  // namespace

int64_t CudaDsaModel::grouped_moe_rows(const DeviceLayer& w, int64_t rows) const {
  if (!options_.batch_invariant) return rows;
  // The grouped kernels compute every row independently of the rows beside
  // it (tests: CudaMoe.DeterministicAndBatchInvariant and its fp8 twin), so
  // fixed chunks keep a token's MoE output independent of its step's size.
  // Served row counts are a prefix 1..n (the bounds grow with the rows):
  // binary search for n.
  int64_t lo = 0, hi = kGroupedMoeMaxRows;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (grouped_moe_supported(grouped_shape(config_, w, mid)))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

bool CudaDsaModel::moe_on_device(const DeviceLayer& w, int64_t rows) const {
  if (!options_.device_moe || !stacked_experts(w)) return false;
  // The deterministic mode: every row count on the grouped kernels (in chunks,
  // moe()) when they serve the layer at all; else every row count on the host
  // dispatch, whose expert GEMMs go through the batch-invariant Blas.
  if (options_.batch_invariant) return grouped_moe_rows(w, rows) > 0;
  return grouped_moe_supported(grouped_shape(config_, w, rows));
}

bool CudaDsaModel::grouped_call_on_device(const DeviceLayer& w, int64_t rows, int64_t top_k) const {
  if (!options_.device_moe || !stacked_experts(w)) return false;
  GroupedMoeShape shape = grouped_shape(config_, w, rows);
  shape.top_k = top_k;
  return grouped_moe_supported(shape);
}

int64_t CudaDsaModel::graph_gathered_rows(int64_t rows) const {
  if (!gathered_dispatch_layout(plan_) || plan_.moe_dispatch == MoeDispatch::all_to_all) return 0;
  return gathered_rows_of(plan_, rows);
}

bool CudaDsaModel::ffn_capturable(int64_t rows) const {
  if (plan_.expert_all_to_all) {
    // The experts sharded and reached by all-to-all (data-parallel attention,
    // context parallelism): the gathered dispatch (fixed sizes; the
    // all-to-all reads its counts on the host), every rank's rows padded.
    const int64_t padded = graph_gathered_rows(rows);
    if (padded == 0) return false;
    for (const DeviceLayer& w : weights_->layers)
      if (w.is_moe && !gathered_on_device(w, padded)) return false;
    return true;
  }
  // The host dispatch reads expert ids back and cannot be captured. (A
  // capture that still hits a sync fails cleanly and the key runs eagerly
  // from then on: DecodeGraphCache::capture.)
  // Steps the deterministic mode splits into chunks run eagerly: the memory
  // plan sizes graphs for the rows one grouped call serves.
  for (const DeviceLayer& w : weights_->layers) {
    if (w.is_moe && (!moe_on_device(w, rows) || grouped_moe_rows(w, rows) < rows)) return false;
  }
  return true;
}

std::optional<DecodeGraphKey> CudaDsaModel::graph_key(const ForwardBatch& batch,
                                                      const PagedKvCache& cache) const {
  // The phase timer records events between phases and reads them per step.
  if (!options_.cuda_graphs || timer_.enabled()) return std::nullopt;
  // Data-parallel attention: whether the step runs as a graph and its bucket
  // come from the whole step's shape (ForwardBatch::dp_step), the same on
  // every rank, so all ranks pad to the same rows (the gathered dispatch's)
  // and a rank with no sequences replays a graph of padding rows.
  const bool data_parallel = plan_.expert_all_to_all && plan_.context_parallel_size == 1;
  if (data_parallel ? batch.dp_step.max_sequences == 0 : batch.sequences.empty())
    return std::nullopt;
  const int64_t per_sequence = data_parallel
                                   ? batch.dp_step.tokens_per_sequence
                                   : static_cast<int64_t>(batch.sequences.front().tokens.size());
  if (per_sequence < 1 || per_sequence > kMaxGraphTokensPerSequence) return std::nullopt;
  int64_t max_context = 0;
  for (const SequenceInput& in : batch.sequences) {
    if (static_cast<int64_t>(in.tokens.size()) != per_sequence) return std::nullopt;
    max_context = std::max(max_context, in.start_position + per_sequence);
  }
  const int64_t sequences =
      batch_bucket(graph_buckets_, data_parallel ? batch.dp_step.max_sequences
                                                 : static_cast<int64_t>(batch.sequences.size()));
  if (sequences == 0 || !ffn_capturable(sequences * per_sequence)) return std::nullopt;
  DecodeGraphKey key;
  key.sequences = sequences;
  key.tokens_per_sequence = per_sequence;
  key.context = context_bucket(max_context);
  key.kv_dtype = static_cast<int>(cache.spec().dtype);
  key.cache = cache_fingerprint(cache, config_.num_hidden_layers);
  key.routed_experts = batch.want_routed_experts;
  if (plan_.layer_split) {
    // LayerSplit: the selected entries' form only, whose sizes the key fixes
    // (the pool form sends the pages in use). In a graph step no page is
    // counted as in use: every rank decides from the key alone.
    Step probe;
    probe.tokens = key.rows();
    probe.max_context = key.context;
    probe.latent = cache_layouts(cache.spec()).latent;
    probe.rows.page_size = cache.spec().page_size;
    if (!sends_selected_entries(probe, cache)) return std::nullopt;
  }
  return key;
}

ForwardOutput CudaDsaModel::forward_graph(const ForwardBatch& batch, PagedKvCache& cache,
                                          const DecodeGraphKey& key) {
  const int64_t hidden = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  const int64_t rows = key.rows();
  const int64_t page_size = cache.spec().page_size;
  const DecodeInputLayout layout(key, config_.qk_rope_head_dim / 2, page_size);
  Scratch& sc = scratch_;

  // Pack the inputs (the previous forward ended with a stream sync, so its
  // upload from the staging is complete); padding rows get RoPE of position
  // 0 (finite values for rows nobody reads).
  auto* words = static_cast<int32_t*>(
      graphs_.staging().get(static_cast<size_t>(layout.capacity_words) * sizeof(int32_t)));
  graph_positions_.resize(static_cast<size_t>(rows));
  const PackedDecodeInputs packed =
      pack_decode_inputs(batch, key, layout, page_size, words, graph_positions_.data());
  rope_.fill(graph_positions_.data(), rows, reinterpret_cast<float*>(words + layout.cos),
             reinterpret_cast<float*>(words + layout.sin));
  const int64_t logit_count = packed.logit_count;

  int32_t* block = graphs_.inputs().get<int32_t>(layout.capacity_words);
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(block, words,
                                     static_cast<size_t>(packed.upload_words) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream_));

  Step step;
  ++selection_epoch_;
  step.tokens = rows;
  step.max_context = key.context;
  const CacheLayouts layouts = cache_layouts(cache.spec());
  step.latent = layouts.latent;
  step.indexer = layouts.indexer;
  step.rows.page_size = page_size;
  step.rows.page_tables = block + layout.page_tables;
  step.rows.table_offset = block + layout.table_offset;
  step.rows.positions = block + layout.positions;
  step.cos = reinterpret_cast<const float*>(block + layout.cos);
  step.sin = reinterpret_cast<const float*>(block + layout.sin);
  step.topk = sc.topk.get<int32_t>(rows * index_topk_);
  step.counts = sc.counts.get<int32_t>(rows);
  const int32_t* ids = block + layout.ids;
  const int32_t* logit_rows = block + layout.logit_rows;
  float* logits = sc.logits.get<float>(rows * vocab);
  // Each run gets a fresh copy of the step: layers fill per-step fields
  // (the fast path's token tables) that a capture must record again.
  auto record = [&] {
    Step fresh = step;
    if (plan_.layer_split) begin_layer_split_step({});  // no pool form in a graph step
    if (key.routed_experts) begin_routed_capture(rows);
    run_layers(fresh, ids, logit_rows, rows, cache, logits);
    routed_ids_ = nullptr;
  };

  graphs_.sync_epoch(scratch_epoch());
  if (cudaGraphExec_t graph = graphs_.find(key)) {
    graphs_.launch(graph, stream_);
  } else {
    // First sight of this key (or its capture failed): run eagerly, which
    // also grows every scratch buffer to this shape, then capture the same
    // launches (nothing executes) for the next steps. The epoch read after
    // the eager run drops graphs whose buffers that run moved.
    graphs_.count_eager_step();
    record();
    if (!graphs_.failed(key)) {
      graphs_.capture(key, scratch_epoch(), stream_, record);
    }
  }

  ForwardOutput output;
  const int64_t real_rows = packed.real_rows;
  // Real rows come first (pack_decode_inputs), padding after.
  if (key.routed_experts) output.routed_experts = routed_experts_to_host(real_rows);
  if (batch.want_hidden_states) {
    output.hidden_states = Tensor::empty({real_rows, hidden});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(output.hidden_states.raw(), sc.x.as<float>(),
                                       static_cast<size_t>(real_rows * hidden) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
  }
  const size_t logit_bytes = static_cast<size_t>(logit_count * vocab) * sizeof(float);
  if (options_.logits_on_device) {
    // The caller owns the returned tensor (a pooled buffer).
    output.logits = logits_pool_.take({logit_count, vocab});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(output.logits.raw(), logits, logit_bytes,
                                       cudaMemcpyDeviceToDevice, stream_));
  } else {
    output.logits = Tensor::empty({logit_count, vocab});
    MEGACTX_CUDA_CHECK(
        cudaMemcpyAsync(output.logits.raw(), logits, logit_bytes, cudaMemcpyDeviceToHost, stream_));
  }
  finish_forward(batch);
  return output;
}

}  // namespace cuda

void* cuda_model_stream(const LanguageModel& model) {
  const auto* cuda_model = dynamic_cast<const cuda::CudaDsaModel*>(&model);
  MEGACTX_CHECK(cuda_model != nullptr, "cuda_model_stream: not a CUDA model");
  return cuda_model->stream();
}

CudaGraphStats cuda_graph_stats(const LanguageModel& model, bool mtp) {
  const auto* cuda_model = dynamic_cast<const cuda::CudaDsaModel*>(&model);
  MEGACTX_CHECK(cuda_model != nullptr, "cuda_graph_stats: not a CUDA model");
  return cuda_model->graph_stats(mtp);
}

}  // namespace megactx
#endif  // MEGACTX_HAVE_CUDA

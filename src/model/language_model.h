// LanguageModel: what the engine runs. One forward over a batch of sequences,
// each appending new tokens to its pages of the PagedKvCache and asking for
// logits at some of them. The same call serves prefill (many new tokens),
// chunked prefill (a chunk at a later start), decode (one new token) and
// speculative verification (1 + k new tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/host_kv_tier.h"
#include "cache/kv_cache.h"
#include "core/tensor.h"
#include "io/model_config.h"

namespace megactx {

class Checkpoint;  // io/checkpoint.h
class MtpLayer;    // model/mtp_layer.h
class RankRows;    // model/group_model.h

struct SequenceInput {
  std::span<const int32_t>
      tokens;                  // [n] new tokens, at positions [start_position, start_position + n)
  int64_t start_position = 0;  // tokens of this sequence already in the cache
  std::span<const int32_t> page_table;  // pages covering positions [0, start_position + n)
  int64_t logits_from = -1;  // logits for new tokens [logits_from, n); -1 means n - 1 only
  // How many logits rows the sequence asks for.
  int64_t logits_rows() const {
    return logits_from < 0 ? 1 : static_cast<int64_t>(tokens.size()) - logits_from;
  }
};

struct ForwardBatch {
  std::vector<SequenceInput> sequences;
  bool want_hidden_states = false;  // the MTP head needs the last layer's hidden states
  // Routing replay for MoE RL: the experts every new token was routed to.
  bool want_routed_experts = false;
  // Data-parallel attention over a group (LanguageModel::rank_rows): each
  // logits row stays with the rank that computed it, which samples it
  // (engine/rank_sampler.h), instead of every row going to rank 0. Ignored
  // by a model without rank_rows.
  bool logits_at_ranks = false;
  // Data-parallel attention: the whole step's shape, which every rank's share
  // carries (rank_share sets it) so that all ranks make the same choices
  // though their own sequences differ: the MoE layers' dispatch and the rows
  // it pads to, a CUDA Graph's batch bucket (expert_dispatch.h). Zeros: not
  // a data-parallel share.
  struct DataParallelStep {
    int64_t max_sequences = 0;        // the most sequences of any rank's share
    int64_t max_rows = 0;             // the most new tokens of any rank's share
    int64_t tokens_per_sequence = 0;  // every sequence's new tokens; 0 when they differ
  };
  DataParallelStep dp_step;
};

struct ForwardOutput {
  // [rows, vocab] float32; rows are the requested positions, sequence by
  // sequence in batch order. On the CUDA backend it stays on the device.
  // With ForwardBatch::logits_at_ranks: rank 0's rows only, in order.
  Tensor logits;
  // [total new tokens, hidden] (before the final norm) when asked for.
  Tensor hidden_states;
  // [total new tokens, num_hidden_layers, num_experts_per_tok] int32 on the
  // host when asked for: the routed expert ids (selection order) of every
  // token at every MoE layer, -1 at dense layers.
  Tensor routed_experts;
  // With ForwardBatch::logits_at_ranks: [rows] the data-parallel rank
  // (0 .. data_parallel_ranks() - 1) holding each requested row's logits.
  std::vector<int> logits_ranks;
};

// The outputs of a forward with no rows, on the host: logits [0, vocab],
// hidden states [0, hidden], routed experts [0, layers, top_k] (a rank of a
// data-parallel group without rows in a step, or one that reports none).
ForwardOutput no_rows_output(const ModelConfig& config);

// What reading the live host tier's offload pages cost so far (cache/kv_cache.h;
// counts since the model was made). A device model stages the selected
// entries of offload pages through a hot cache kept across steps
// (model/cuda: kernels/cuda/kv_copy/stage_offload.h); the host model reads
// them in place and reports zeros.
struct OffloadReadStats {
  int64_t selected_entries = 0;  // offload entries the decode steps' top-k selected
  int64_t hot_hits = 0;          // of those, read from the hot cache without a copy
  int64_t copied_bytes = 0;      // host -> device bytes the staging copied (all layers)
  int64_t read_steps = 0;        // forwards that staged offload entries
};

// What the CUDA-graph decode of a CUDA model did so far
// (LanguageModel::graph_stats: tests, benchmarks, /metrics); zeros for a
// model that runs no graphs.
struct CudaGraphStats {
  int64_t captures = 0;         // graphs captured
  int64_t replays = 0;          // steps run by one graph launch
  int64_t eager_steps = 0;      // bucketed steps run eagerly (a key's first step)
  int64_t invalidations = 0;    // times every graph was dropped (scratch moved)
  int64_t failed_captures = 0;  // keys that could not be captured (eager since)
  int64_t cached = 0;           // graphs held now
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;
  // Appends every sequence's new tokens to the cache and returns their logits.
  virtual ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) = 0;

  // What the engine builds around a model lives where the model computes, so
  // the model makes it and the engine never asks which device it is on. The
  // defaults are the host's: plain host pools, memcpy page copies, no MTP.
  //
  // The pools forward() reads and writes (zeroed; a clear Error when they do
  // not fit).
  virtual std::unique_ptr<PagedKvCache> make_kv_cache(const KvCacheSpec& spec) const;
  // Host pools of the prefix cache's host tier (pinned for a device model)
  // and the copies between them and make_kv_cache's pools.
  virtual std::unique_ptr<PagedKvCache> make_host_kv_cache(const KvCacheSpec& spec) const;
  virtual KvPageCopy kv_page_copy() const;
  // The pools each rank of the model's group allocates for the whole model's
  // `whole`, rank by rank (LayerSplit: each rank its own layers'; the page
  // numbering is the same on every rank, so the rank with the most bytes per
  // page bounds the pages of a memory budget); {whole} when every rank holds
  // every pool.
  virtual std::vector<KvCacheSpec> kv_cache_shares(const KvCacheSpec& whole) const {
    return {whole};
  }
  // Data-parallel attention over a group: the KV cache's device pages are
  // this many equal ranges, range r held by rank r's pools, and every
  // sequence's pages must lie in one range (its rows run on that rank).
  // 1: every page on every rank that holds the cache.
  virtual int data_parallel_ranks() const { return 1; }
  // Data-parallel attention over a group: how the ranks sample the rows a
  // forward with ForwardBatch::logits_at_ranks left with them; null when
  // every logits row reaches rank 0.
  virtual RankRows* rank_rows() { return nullptr; }
  // The checkpoint's MTP layer beside this model (its weights from
  // `checkpoint`, or the one at `model_dir`); an Error for a model that cannot
  // run one. Load it again after reload_weights.
  virtual std::unique_ptr<MtpLayer> load_mtp_layer(const Checkpoint& checkpoint);
  std::unique_ptr<MtpLayer> load_mtp_layer(const std::string& model_dir);
  // Replaces every weight with `checkpoint`'s (same architecture and shapes:
  // RL weight updates). The new weights are built before the old ones go, so
  // an Error (a tensor missing or misshapen) leaves the model as it was; a
  // device model needs room for both copies meanwhile. Any MTP layer made
  // before is stale afterwards.
  virtual void reload_weights(const Checkpoint& checkpoint);
  // The model's final norm (the input of lm_head) over host rows: x [rows,
  // hidden] (ForwardOutput::hidden_states) into out [rows, hidden]
  // (return_hidden_states). An Error for a model without one.
  virtual void final_norm(const float* x, int64_t rows, float* out) const;
  // Frees the weights' memory (release_memory_occupation); reload_weights
  // brings them back. forward() is an Error in between.
  virtual void release_weights();
  // A host copy of a float32 tensor forward() returned (logits on the device).
  virtual Tensor to_host(const Tensor& tensor) const { return tensor; }
  // The stream (a cudaStream_t) every forward runs on; null on the host. A
  // device sampler runs on it, after the forward, without a host sync.
  virtual void* compute_stream() const { return nullptr; }
  virtual OffloadReadStats offload_read_stats() const { return {}; }
  // The target's decode graphs, or (`mtp`) those of the MTP layer it holds
  // (refills and draft steps).
  virtual CudaGraphStats graph_stats(bool mtp = false) const {
    (void)mtp;
    return {};
  }
};

}  // namespace megactx

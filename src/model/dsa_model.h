// DsaModel: the forward pass shared by glm_moe_dsa and deepseek_v32 (MLA with
// q-LoRA and a latent KV cache, the DSA indexer with IndexShare, dense SwiGLU
// and group-limited sigmoid MoE), over the PagedKvCache, on a Backend.
// The architecture files (glm_moe_dsa.cpp, deepseek_v32.cpp) check what is
// specific to each and build it.
#pragma once

#include <cstddef>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/attention_probe.h"
#include "model/backend.h"
#include "model/dsa_weights.h"
#include "model/language_model.h"
#include "model/model_plan.h"
#include "model/rope.h"
#include "model/weight_source.h"
#include "parallel/communicator.h"

namespace megactx {

struct DsaModelOptions {
  // Replaces config.index_topk (tests: a value >= the context attends densely).
  std::optional<int64_t> index_topk_override;
  // This process's parallel group (not owned; outlives the model) and how the
  // model is spread over it (model_plan.h: ModelPlan, parallel_plan): null or
  // a group of one is the whole model.
  parallel::Communicator* group = nullptr;
  bool expert_parallel = false;
  bool data_parallel_attention = false;
  int data_parallel_size = 0;  // ParallelLayout's: 0 = one replica per rank
  bool context_parallel = false;
  int context_parallel_size = 0;    // ParallelLayout's: 0 = the whole group
  bool experts_over_group = false;  // ParallelLayout's (ModelPlan::experts_over_shares)
  MoeDispatch moe_dispatch = MoeDispatch::automatic;  // ParallelLayout's
  bool split_indexer = false;                         // ModelPlan::indexer_split
  // LayerSplit over the tensor-parallel group (ModelPlan::kv_owner).
  bool layer_split = false;
};

class DsaModel final : public LanguageModel {
 public:
  // `plan` is plan_model(config, options.index_topk_override); `weights` were
  // loaded for it (build_dsa_model does both).
  DsaModel(ModelConfig config, ModelPlan plan, DsaWeights weights, std::unique_ptr<Backend> backend,
           parallel::Communicator* group = nullptr);

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return backend_->device(); }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override;
  using LanguageModel::load_mtp_layer;
  std::unique_ptr<MtpLayer> load_mtp_layer(const Checkpoint& checkpoint) override;
  void reload_weights(const Checkpoint& checkpoint) override;
  void release_weights() override;
  void final_norm(const float* x, int64_t rows, float* out) const override;
  // LayerSplit: the pools of this rank's layers (and the MTP layer's) only.
  std::unique_ptr<PagedKvCache> make_kv_cache(const KvCacheSpec& spec) const override;
  std::unique_ptr<PagedKvCache> make_host_kv_cache(const KvCacheSpec& spec) const override;
  std::vector<KvCacheSpec> kv_cache_shares(const KvCacheSpec& whole) const override;

  int64_t index_topk() const { return plan_.attention.index_topk; }
  // LayerSplit: selected latent entries that travelled ahead of their layer
  // (attention()'s prefetch of a shared layer's old-context entries), so far.
  int64_t prefetched_entries() const { return prefetched_entries_; }
  const ModelPlan& plan() const { return plan_; }
  const DsaWeights& weights() const { return weights_; }
  Backend& backend() { return *backend_; }
  // Called per layer and sequence of every forward with the rows' queries and
  // selection (evaluation tools; not with LayerSplit or context parallelism,
  // whose latents live on other ranks). An empty function removes it.
  void set_attention_probe(AttentionProbe probe) { attention_probe_ = std::move(probe); }

  // One decoder layer on its own, for the MTP layer (model/mtp_layer.h): the
  // rows of every sequence, in batch order, run through `w` with the cache
  // pools of `cache_layer`. The layer must run its indexer unless shared.
  struct LayerSequence {
    int64_t start = 0;  // position of the first row (RoPE; cache slot when written)
    int64_t count = 0;  // rows
    std::span<const int32_t> pages;
    // KVShare + IndexShare (MTP draft steps >= 1): no cache entry is written
    // and no indexer runs; every row attends over cache positions
    // [0, shared_context) through the one selection `shared_topk`
    // ([index_topk] positions, `shared_count` valid).
    bool shared = false;
    int64_t shared_context = 0;
    std::span<const int32_t> shared_topk;
    int64_t shared_count = 0;
    // The row whose selection is reported (-1: the last).
    int64_t output_row = -1;
    // Out (unshared runs): the indexer's selection of that row.
    std::vector<int32_t> last_topk;
    int64_t last_count = 0;
  };
  // x: [total rows, hidden], updated in place (residual stream in and out).
  void run_layer(const LayerWeights& w, int64_t cache_layer, std::span<LayerSequence> sequences,
                 float* x, PagedKvCache& cache);

 private:
  struct Step;  // per-forward token bookkeeping and scratch (dsa_model.cpp)

  void check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const;
  // Context parallelism: this rank's contiguous share of a step's rows (a
  // Step whose `whole` is `whole`), and rows [rows of the share, width] of
  // every rank gathered into [whole.tokens, width] in row order (collective).
  Step share_of(const Step& whole) const;
  template <typename T>
  std::vector<T> gather_rows(const T* rows, int64_t width, const Step& share);
  void attention(const LayerWeights& lw, int64_t layer, const float* h, Step& step,
                 PagedKvCache& cache, float* out);
  void indexer(const LayerWeights& lw, int64_t layer, const float* h, const float* q_resid,
               Step& step, PagedKvCache& cache);
  // LayerSplit: the selection `owner`'s indexer made (every sequence's topk
  // and counts) on every rank (collective).
  void share_topk(Step& step, int owner);
  void decoder_layer(const LayerWeights& w, int64_t layer, Step& step, PagedKvCache& cache,
                     float* x);
  void mlp(const MlpWeights& w, const float* h, int64_t rows, float* out);
  // The MoE of `rows` rows into out [rows, hidden]: routed (this rank's
  // experts) plus shared experts.
  void moe(const MoeWeights& w, const float* h, int64_t rows, float* out);
  // The routed part alone (out zeroed first); the routing of rows
  // [record_first, record_first + record_rows) is what forward() captures.
  void moe_routed(const MoeWeights& w, const float* h, int64_t rows, float* out,
                  int64_t record_first, int64_t record_rows);
  // ModelPlan::experts_over_shares: the MoE of this share's rows of `step`,
  // complete (the sum over the whole group is taken here).
  void moe_over_shares(const MoeWeights& w, const float* h, const Step& step, float* out);
  // Data-parallel attention over shares of tensor-parallel ranks
  // (ModelPlan::data_parallel_rank): the MoE of the share's `rows` rows of
  // `h` ([rows, hidden], the same on every tensor rank of the share),
  // complete: each tensor rank's slice of the rows to the routed experts by
  // all-to-all over the whole group, the slices gathered back within the
  // share, plus the shared experts' sum over the share.
  void moe_over_tensor_slices(const MoeWeights& w, const float* h, int64_t rows, float* out);
  // forward()'s routed-expert capture (ForwardBatch::want_routed_experts):
  // ids [tokens, layers, top_k]; `layer` is the decoder layer moe() serves.
  struct RoutedCapture {
    int32_t* ids = nullptr;
    int64_t layer = 0;
  };
  RoutedCapture routed_;

  // The attention and feed-forward outputs of a tensor-parallel rank are
  // partial sums: the group adds them up (nothing without tensor parallelism).
  void reduce_partial(float* data, int64_t count);
  // Expert parallelism with data-parallel attention: the routed (token,
  // expert, gate) pairs of this rank's rows go to their experts' ranks, the
  // rows those ranks send here run through this rank's experts, and the
  // results come back and are added into out [rows, hidden] with their gates.
  void routed_experts_all_to_all(const MoeWeights& w, const float* h, int64_t rows,
                                 const std::vector<int32_t>& ids, const std::vector<float>& gates,
                                 float* out);
  // The gathered dispatch (expert_dispatch.h) of the same: this rank's rows
  // padded to gathered_rows_, every rank's gathered, this rank's experts
  // over all of them, each rank's partial sums back to it and added into out.
  void routed_experts_gathered(const MoeWeights& w, const float* h, int64_t rows,
                               const std::vector<int32_t>& ids, const std::vector<float>& gates,
                               float* out);
  // The forward's gathered dispatch rows (gathered_dispatch_rows; 0: the
  // all-to-all, as for the MTP layer's runs).
  int64_t gathered_rows_ = 0;

  ModelConfig config_;
  DsaWeights weights_;
  std::unique_ptr<Backend> backend_;
  RopeTable rope_;
  ModelPlan plan_;
  parallel::Communicator* group_ = nullptr;
  // The groups of the tensor-parallel sums and the context-parallel gathers:
  // group_ itself, or with both kinds of parallelism its splits (owned here).
  parallel::Communicator* tensor_group_ = nullptr;
  parallel::Communicator* context_group_ = nullptr;
  std::unique_ptr<parallel::Communicator> tensor_split_, context_split_;
  // LayerSplit: the tensor group's copy that carries the selected entries
  // while the ranks compute (attention()).
  parallel::Communicator* entry_group_ = nullptr;
  std::unique_ptr<parallel::Communicator> entry_split_;
  // LayerSplit's second entry slot: the next layer's entries from before
  // this step (its cache already holds them), sent by their owner on
  // entry_group_ while this layer's attention and feed-forward run: the
  // selected ones when the next layer shares this one's selection
  // (IndexShare), every one when it runs its own indexer over a step whose
  // selection can cover its whole context (a prefill chunk: the layer
  // streamed ahead). The next layer checks the selection is the same (or
  // takes its entries by position) and sends only the entries of this step's
  // own rows (written by that layer).
  struct EntryPrefetch {
    int64_t layer = -1;  // -1: none
    const Step* step = nullptr;
    bool whole = false;  // every old position, else the old ones of `selected`
    std::vector<std::vector<int32_t>> selected;  // per sequence, attention()'s order
    std::vector<int64_t> sequence_first;         // whole: sequence i's first entry in raw
    std::vector<std::byte> raw;                  // the old entries, [entries, latent bytes]
    std::future<void> sent;
  };
  EntryPrefetch prefetch_;
  int64_t prefetched_entries_ = 0;
  AttentionProbe attention_probe_;
  // Starts the prefetch of layer `next`'s entries of `selected` (the
  // positions before each sequence's new rows) when it applies.
  void prefetch_entries(int64_t next, const Step& step,
                        const std::vector<std::vector<int32_t>>& selected, PagedKvCache& cache);
  // Waits for a prefetch in flight (entry_group_ carries one collective at a
  // time) and forgets it.
  void drop_prefetch();
};

// Plans the model (the architecture's checks first), loads every weight the
// plan names from `weights` and builds it on `backend`.
std::unique_ptr<DsaModel> build_dsa_model(const ModelConfig& config, WeightSource& weights,
                                          std::unique_ptr<Backend> backend,
                                          const DsaModelOptions& options);

// This process's plan: plan_model(config, options.index_topk_override), cut
// for its rank by parallel_plan when options.group has several ranks (the
// host model's and the CUDA model's checkpoint load's, one rule).
ModelPlan rank_model_plan(const ModelConfig& config, const DsaModelOptions& options);

}  // namespace megactx

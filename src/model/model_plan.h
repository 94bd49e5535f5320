// The one description of a DSA model (glm_moe_dsa, deepseek_v32) that every
// forward pass reads: the CPU DsaModel, the CUDA model and both MTP layers.
// Built once from ModelConfig; neither forward re-derives a shape, an eps or
// the layer schedule. A tensor-parallel split belongs here too, so that it is
// written once for every device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/kv_cache.h"
#include "io/model_config.h"

namespace megactx {

// The q_a / kv_a RMSNorms of MLA and the indexer's key LayerNorm use a fixed
// 1e-6 in HF's DeepseekV3 / GLM code, not config.rms_norm_eps.
inline constexpr float kLatentNormEps = 1e-6f;
inline constexpr float kIndexerNormEps = 1e-6f;

// Attention of every decoder layer (MLA with the absorbed, MQA-style decode)
// and its DSA indexer.
struct AttentionDims {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t q_lora = 0;   // 0: q projected straight from the hidden state
  int64_t kv_lora = 0;  // the cached latent c_kv
  int64_t nope = 0;     // per head: q/k without RoPE
  int64_t rope = 0;     // per head: q/k with RoPE (one shared k_rope per token)
  int64_t qk = 0;       // nope + rope
  int64_t value = 0;    // per head: v
  int64_t entry = 0;    // cached row per token and layer: kv_lora + rope
  int64_t index_heads = 0;
  int64_t index_dim = 0;         // [rope | nope] per indexer head (rope first, unlike MLA)
  int64_t index_topk = 0;        // keys each query attends to (a test may override it)
  float softmax_scale = 1.0f;    // qk^-0.5, with YaRN's mscale
  bool rope_interleave = false;  // MLA's RoPE pairs (x0, x1), ... instead of halves
  bool indexer_rope_interleave = false;
};

// One decoder layer; layer num_hidden_layers is the MTP layer.
struct LayerPlan {
  int64_t layer = 0;
  // A full layer scores its own top-k; a shared one (IndexShare) attends
  // through the selection of `indexer_source`, the last full layer before it.
  bool runs_indexer = false;
  int64_t indexer_source = 0;
  bool moe = false;  // routed (+ shared) experts, else the dense SwiGLU MLP
};

// How data-parallel attention's MoE layers reach the routed experts
// (ModelPlan::moe_dispatch, expert_dispatch.h).
enum class MoeDispatch {
  automatic,   // gathered in the steps a CUDA Graph holds, else the all-to-all
  all_to_all,  // each routed (row, slot) pair to its expert's rank and back
  gathered,    // every rank's rows, padded to one size, gathered by every rank
};
// "auto" | "all-to-all" | "gathered"; anything else is an Error.
MoeDispatch parse_moe_dispatch(const std::string& name);

struct ModelPlan {
  AttentionDims attention;
  float rms_norm_eps = 1e-6f;     // every other RMSNorm
  std::vector<LayerPlan> layers;  // [num_hidden_layers]
  LayerPlan mtp;                  // runs its own indexer
  bool has_mtp = false;           // num_nextn_predict_layers > 0
  // Parallelism over a group of processes (parallel/communicator.h):
  // * tensor parallel (tensor_parallel_size > 1): this rank computes
  //   attention.heads of the model's heads (its rank-th share) and the
  //   rank-th share of every dense MLP's and shared expert's width (and of
  //   every routed expert's, unless expert parallel); the indexer, the latent
  //   cache, the norms, the router, the embeddings and lm_head are whole. The
  //   attention and feed-forward outputs are partial sums that the group adds
  //   up before the residual add;
  // * expert parallel (expert_parallel_size > 1): this rank holds routed
  //   experts [first_expert, first_expert + n_routed_experts / size), whole.
  //   With tensor-parallel attention every rank has every token: it applies
  //   its experts and the sum over the group completes the MoE. With
  //   data-parallel attention (expert_all_to_all) every rank has its own
  //   requests, attention and dense MLPs whole: the routed rows go to their
  //   experts' ranks and come back by all-to-all.
  // * context parallel (context_parallel_size > 1): the weights and the
  //   caches whole on every rank; this rank computes the rank-th contiguous
  //   share of every step's rows (a long prompt split across the group), the
  //   new rows' latents and indexer keys are gathered so that every rank's
  //   cache holds all of them, and the final hidden rows are gathered for the
  //   logits.
  int context_parallel_rank = 0;
  int context_parallel_size = 1;
  // * data-parallel attention over shares of tensor-parallel ranks
  //   (data_parallel_size > 1 with tensor_parallel_size > 1): each share
  //   serves its own requests with the heads, dense MLPs and shared experts
  //   split over its tensor ranks (their sums within the share); a MoE layer
  //   gives each tensor rank a slice of its share's rows, sends the slices to
  //   the routed experts (sharded over the whole group) by all-to-all and
  //   gathers the share's rows back (DsaModel::moe_over_tensor_slices).
  int data_parallel_rank = 0;
  int data_parallel_size = 1;
  int tensor_parallel_rank = 0;
  int tensor_parallel_size = 1;
  int expert_parallel_rank = 0;
  int expert_parallel_size = 1;
  bool expert_all_to_all = false;
  //   How they get there (one rank per replica of data-parallel attention or
  //   per context share; expert_dispatch.h): the all-to-all of the routed
  //   pairs (exact sizes, which the host reads), or gathered (fixed sizes: a
  //   CUDA Graph can hold it). Replicas of tensor ranks take the all-to-all.
  MoeDispatch moe_dispatch = MoeDispatch::all_to_all;
  // * experts over the shares (experts_over_shares: context shares of
  //   tensor-parallel ranks with the routed experts sharded over the whole
  //   group, expert rank = rank): a MoE layer gathers every share's rows,
  //   applies this rank's experts to all of them, adds this rank's share of
  //   the shared experts to its own share's rows, and one sum over the whole
  //   group completes every row's MoE (each share keeps its rows). Each rank
  //   holds 1 / (shares x tensor ranks) of the experts, not 1 / tensor ranks.
  bool experts_over_shares = false;
  int64_t first_expert = 0;
  int64_t local_experts = 0;  // 0: all of them (no expert parallelism)
  // * LayerSplit (layer_split, over the tensor-parallel group): each decoder
  //   layer's latent and indexer-key pools live on one rank, kv_owner[layer];
  //   the MTP layer's on every rank. The owner writes the new rows, runs the
  //   layer's indexer (its top-k goes to the group) and gathers the latent
  //   entries the rows selected for the group; every rank attends with its
  //   own heads over them (dsa_model.cpp).
  bool layer_split = false;
  std::vector<int> kv_owner;  // [num_hidden_layers] with layer_split, else empty
  // * The indexer split over the tensor-parallel group (indexer_split): this
  //   rank holds attention.index_heads of the indexer's heads (its rank-th
  //   share of wq_b's and weights_proj's rows) and scores the context with
  //   them; the group adds the partial scores (an all_reduce of [rows,
  //   context] floats per indexer layer) and every rank takes the same top-k.
  //   Without it the indexer is whole on every rank (no communication).
  bool indexer_split = false;

  const LayerPlan& layer(int64_t index) const {
    return index == static_cast<int64_t>(layers.size()) ? mtp
                                                        : layers.at(static_cast<size_t>(index));
  }
  // The rank that holds decoder layer `index`'s caches; -1: every rank (no
  // LayerSplit, or the MTP layer).
  int kv_owner_of(int64_t index) const {
    return index >= 0 && index < static_cast<int64_t>(kv_owner.size())
               ? kv_owner[static_cast<size_t>(index)]
               : -1;
  }
  // Whether rank `rank` of the group (this rank by default) holds (reads and
  // writes) layer `index`'s caches.
  bool holds_kv(int64_t index, int rank) const {
    const int owner = kv_owner_of(index);
    return owner < 0 || owner == rank;
  }
  bool holds_kv(int64_t index) const { return holds_kv(index, tensor_parallel_rank); }
};

// Checks what every forward pass needs (the architecture's own rules from
// architectures.h, layer 0 runs its indexer, supported activation, routing
// and MoE shapes, a positive top-k) and throws megactx::Error otherwise: the
// load paths call it before reading a weight.
ModelPlan plan_model(const ModelConfig& config, std::optional<int64_t> index_topk_override = {});

// How a model is spread over a group of `size` processes (rank `rank`):
// tensor-parallel attention and MLPs unless data_parallel_attention, routed
// experts sharded by index when expert_parallel; or every step's rows split
// when context_parallel, over the whole group (weights whole) or, with
// context_parallel_size C dividing size, over C shares of size / C
// tensor-parallel ranks each (rank = context rank x (size / C) + tensor rank).
struct ParallelLayout {
  int rank = 0;
  int size = 1;
  bool expert_parallel = false;
  bool data_parallel_attention = false;
  // With data-parallel attention: the attention replicas (0: size, one rank
  // each). Fewer: shares of size / data_parallel_size tensor-parallel ranks
  // (SGLang's --dp-size below --tp-size), the tensor rank innermost.
  int data_parallel_size = 0;
  bool context_parallel = false;  // not with data-parallel attention
  int context_parallel_size = 0;  // with context_parallel: the shares (0: size)
  // With expert_parallel and context shares of tensor-parallel ranks: the
  // experts sharded over the whole group (ModelPlan::experts_over_shares)
  // instead of over each share's tensor-parallel ranks.
  bool experts_over_group = false;
  // With the experts sharded and reached by the all-to-all (data-parallel
  // attention of one rank per replica, context parallelism over the whole
  // group): ModelPlan::moe_dispatch (an Error for another value than
  // automatic in other layouts).
  MoeDispatch moe_dispatch = MoeDispatch::automatic;
  // LayerSplit over the tensor-parallel group (not with data-parallel
  // attention or context parallelism): see ModelPlan::kv_owner.
  bool layer_split = false;
  // The indexer's heads split over the tensor-parallel group
  // (ModelPlan::indexer_split; not with LayerSplit, whose owner runs it).
  bool split_indexer = false;
};

// LayerSplit's owners of `layers` decoder layers over `size` ranks: the
// layers that run their indexer first (they hold an indexer pool besides the
// latent one), then the others, each group in layer order, each layer to the
// rank holding the fewest cache elements per token so far (latent kv_lora +
// rope, plus index_dim with an indexer; ties to the lowest rank). With every
// layer alike (DeepSeek-V3.2) that is layer % size; with IndexShare the
// indexer pools spread evenly too (layer % 2 would give rank 0 three of the
// default model's four). No rank holds more than one layer's pools above
// another.
std::vector<int> layer_split_owners(const std::vector<LayerPlan>& layers,
                                    const AttentionDims& attention, int size);

// The pools rank `rank` of `plan`'s group allocates for `whole` (LayerSplit:
// the decoder layers it owns, and the MTP layer's when `whole` has them);
// `whole` itself without LayerSplit.
KvCacheSpec layer_split_spec(const ModelPlan& plan, const KvCacheSpec& whole, int rank);
// Whether LayerSplit sends a layer's entries ahead of use, during the layer
// before (both models): MEGACTX_LAYER_SPLIT_PREFETCH=0 sends each at its own
// layer instead (A/B runs; read once, and every rank of a serve group
// inherits it).
bool layer_split_prefetch();

// Every tensor-parallel rank's layer_split_spec of `whole` (LanguageModel::
// kv_cache_shares), or {whole} without LayerSplit. `borrowed_pools`: a rank
// that lacks some layer's pool also counts that many borrowed latent pools
// (KvCacheSpec::borrowed_latent_pools: the GPU ranks' two for the owners'
// pools; the host model's exchange needs none).
std::vector<KvCacheSpec> layer_split_shares(const ModelPlan& plan, const KvCacheSpec& whole,
                                            int borrowed_pools = 0);

// The plan of one rank from the whole model's plan (see ModelPlan). Throws
// megactx::Error when the heads, the MLP, shared-expert or expert widths or
// the expert count do not divide by the group size.
ModelPlan parallel_plan(const ModelPlan& whole, const ModelConfig& config,
                        const ParallelLayout& layout);

// The whole model's plan from one rank's (`rank_plan` from parallel_plan):
// all heads, no tensor or expert split (LayerSplit, context parallelism and
// the schedule as they are). A rank reloading weights loads these shapes,
// then keeps its share (parallel_shard).
ModelPlan whole_model_plan(const ModelPlan& rank_plan);

// Rank `rank`'s rows [first, last) of a step of `rows` rows over `size`
// ranks: contiguous shares, the first rows % size one longer (context
// parallelism's row shares, data-parallel replicas' tensor slices of the MoE).
std::pair<int64_t, int64_t> share_rows(int64_t rows, int rank, int size);

// `update` describes the same network as `current` (weight updates must not
// change a shape): the same plan, vocabulary, MLP and expert sizes. Throws
// megactx::Error naming the first difference.
void check_same_architecture(const ModelConfig& current, const ModelConfig& update);

// The cache holds every pool the plan's decoder layers read and write on
// this rank (LayerSplit: its own layers'), in their shapes, on `device`;
// throws megactx::Error naming what is missing.
void check_cache_layout(const ModelPlan& plan, const PagedKvCache& cache, Device device);

}  // namespace megactx

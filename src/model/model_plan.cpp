#include "model/model_plan.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "model/architectures.h"
#include "model/rope.h"

namespace megactx {

namespace {

// What every DSA layer supports, whatever the architecture.
void check_supported(const ModelConfig& c) {
  switch (c.model_type) {
    case ModelType::GlmMoeDsa:
      check_glm_moe_dsa(c);
      break;
    case ModelType::DeepseekV32:
      check_deepseek_v32(c);
      break;
  }
  MEGACTX_CHECK(c.num_hidden_layers > 0 && c.layer_runs_indexer(0),
                "layer 0 must run its indexer (a shared layer needs an earlier full layer)");
  MEGACTX_CHECK(!c.attention_bias, "attention_bias = true is not supported");
  MEGACTX_CHECK(c.hidden_act == "silu", "hidden_act '{}' is not supported (silu)", c.hidden_act);
  MEGACTX_CHECK(c.scoring_func == "sigmoid", "scoring_func '{}' is not supported (sigmoid)",
                c.scoring_func);
  bool any_moe = c.num_nextn_predict_layers > 0 && c.mtp_layer_is_moe();
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) any_moe |= c.layer_is_moe(layer);
  if (any_moe) {
    const int64_t experts = c.n_routed_experts;
    MEGACTX_CHECK(experts > 0 && c.num_experts_per_tok > 0 && c.num_experts_per_tok <= experts,
                  "MoE: n_routed_experts {} / num_experts_per_tok {}", experts,
                  c.num_experts_per_tok);
    MEGACTX_CHECK(
        c.n_group > 0 && experts % c.n_group == 0 && c.topk_group >= 1 && c.topk_group <= c.n_group,
        "MoE: n_group {} / topk_group {} do not divide {} experts", c.n_group, c.topk_group,
        experts);
  }
}

}  // namespace

ModelPlan plan_model(const ModelConfig& config, std::optional<int64_t> index_topk_override) {
  check_supported(config);
  ModelPlan plan;
  AttentionDims& a = plan.attention;
  a.hidden = config.hidden_size;
  a.heads = config.num_attention_heads;
  a.q_lora = config.q_lora_rank.value_or(0);
  a.kv_lora = config.kv_lora_rank;
  a.nope = config.qk_nope_head_dim;
  a.rope = config.qk_rope_head_dim;
  a.qk = a.nope + a.rope;
  a.value = config.v_head_dim;
  a.entry = a.kv_lora + a.rope;
  a.index_heads = config.index_n_heads;
  a.index_dim = config.index_head_dim;
  a.index_topk = index_topk_override.value_or(config.index_topk);
  a.softmax_scale = attention_softmax_scale(config);
  a.rope_interleave = config.rope_interleave;
  a.indexer_rope_interleave = config.indexer_rope_interleave;
  MEGACTX_CHECK(a.index_topk > 0, "index_topk must be positive, got {}", a.index_topk);
  plan.rms_norm_eps = static_cast<float>(config.rms_norm_eps);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    LayerPlan l;
    l.layer = layer;
    l.runs_indexer = config.layer_runs_indexer(layer);
    l.indexer_source = l.runs_indexer ? layer : config.indexer_source_layer(layer);
    l.moe = config.layer_is_moe(layer);
    plan.layers.push_back(l);
  }
  plan.mtp.layer = config.num_hidden_layers;
  plan.mtp.runs_indexer = true;
  plan.mtp.indexer_source = config.num_hidden_layers;
  plan.mtp.moe = config.mtp_layer_is_moe();
  plan.has_mtp = config.num_nextn_predict_layers > 0;
  return plan;
}

ModelPlan parallel_plan(const ModelPlan& whole, const ModelConfig& config,
                        const ParallelLayout& layout) {
  const int rank = layout.rank, size = layout.size;
  MEGACTX_CHECK(size >= 1 && rank >= 0 && rank < size, "parallelism: rank {} outside a group of {}",
                rank, size);
  MEGACTX_CHECK(whole.tensor_parallel_size == 1 && whole.expert_parallel_size == 1 &&
                    whole.context_parallel_size == 1,
                "parallelism: the plan is already split");
  ModelPlan plan = whole;
  if (size == 1) return plan;
  // Context parallelism over the whole group, or over shares of
  // tensor-parallel ranks (the tensor rank innermost).
  const int context = !layout.context_parallel           ? 1
                      : layout.context_parallel_size > 0 ? layout.context_parallel_size
                                                         : size;
  MEGACTX_CHECK(context >= 1 && size % context == 0,
                "--context-parallel-size {} does not divide the group of {}", context, size);
  // Data-parallel attention's replicas: one per rank, or shares of
  // tensor-parallel ranks (the tensor rank innermost).
  const int replicas = !layout.data_parallel_attention ? 1
                       : layout.data_parallel_size > 0 ? layout.data_parallel_size
                                                       : size;
  MEGACTX_CHECK(replicas >= 1 && size % replicas == 0,
                "--data-parallel-size {} does not divide the group of {}", replicas, size);
  const bool replicas_of_tensor = layout.data_parallel_attention && replicas < size;
  const int tensor_size = replicas_of_tensor ? size / replicas : size / context,
            tensor_rank = rank % tensor_size;
  MEGACTX_CHECK(!layout.experts_over_group ||
                    (layout.expert_parallel && layout.context_parallel && tensor_size > 1),
                "experts over the whole group: for context shares of tensor-parallel ranks with "
                "expert parallelism (--context-parallel-size C --tensor-parallel-size T "
                "--expert-parallel-size C x T)");
  MEGACTX_CHECK(!layout.split_indexer || (!layout.data_parallel_attention && tensor_size > 1),
                "--split-indexer splits the indexer's heads over the tensor-parallel group: it "
                "needs --tensor-parallel-size 2 or more (not data-parallel attention)");
  // LayerSplit splits the caches over the tensor-parallel ranks (of each
  // context share): it needs two or more of them.
  // With data-parallel attention: over each replica's tensor-parallel ranks.
  const bool replica_tensor_ranks = layout.data_parallel_attention &&
                                    layout.data_parallel_size > 0 &&
                                    layout.data_parallel_size < size;
  MEGACTX_CHECK(!layout.layer_split ||
                    ((!layout.data_parallel_attention || replica_tensor_ranks) && tensor_size > 1),
                "--enable-layer-split: the layers' caches are split over the tensor-parallel "
                "group, not with {}",
                layout.data_parallel_attention ? "data-parallel attention of one rank per replica"
                                               : "context parallelism over the whole group");
  const auto divides = [tensor_size](int64_t value) { return value % tensor_size == 0; };
  bool dense = false, moe = false;
  for (const LayerPlan& layer : whole.layers) (layer.moe ? moe : dense) = true;
  const bool experts = layout.expert_parallel && moe;
  // The MoE dispatch: where the routed rows reach their experts' ranks by
  // the all-to-all, one rank per replica of data-parallel attention or per
  // context share.
  const bool dispatches =
      experts && (layout.data_parallel_attention || (layout.context_parallel && tensor_size == 1));
  MEGACTX_CHECK(layout.moe_dispatch == MoeDispatch::automatic || dispatches,
                "--moe-dispatch: the MoE dispatch of data-parallel attention or context "
                "parallelism over the whole group, with the experts sharded over the ranks "
                "(--expert-parallel-size {})",
                size);
  if (dispatches) plan.moe_dispatch = layout.moe_dispatch;
  // Routed experts [r * E / n, ...) on expert rank r of n; with all_to_all
  // the rows this rank holds (its own requests, or its share of a step's
  // rows) go to their experts' ranks and back, else every rank applies its
  // experts to all of its rows and the tensor-parallel sum adds them.
  const auto shard_experts = [&](int expert_rank, int expert_size, bool all_to_all) {
    MEGACTX_CHECK(config.n_routed_experts % expert_size == 0,
                  "--expert-parallel-size {}: the model's {} routed experts do not divide",
                  expert_size, config.n_routed_experts);
    plan.expert_parallel_rank = expert_rank;
    plan.expert_parallel_size = expert_size;
    plan.local_experts = config.n_routed_experts / expert_size;
    plan.first_expert = expert_rank * plan.local_experts;
    plan.expert_all_to_all = all_to_all;
  };
  if (layout.context_parallel) {
    MEGACTX_CHECK(!layout.data_parallel_attention,
                  "--context-parallel-size: not combined with data-parallel attention yet");
    plan.context_parallel_rank = rank / tensor_size;
    plan.context_parallel_size = context;
    if (tensor_size == 1) {
      // Each rank computes its share of the rows: with expert parallelism
      // they reach their experts by all-to-all, as data-parallel attention's
      // do (a step too small to split runs whole on every rank, and each
      // rank's copy of a row comes back from the experts' ranks alike).
      if (experts) shard_experts(rank, size, /*all_to_all=*/true);
      return plan;
    }
    // With tensor parallelism too, the experts are sharded over each share's
    // tensor-parallel ranks (below), whose sum adds them, or over the whole
    // group (the MoE then sums over the group: DsaModel::moe_over_shares).
    if (experts && layout.experts_over_group) {
      shard_experts(rank, size, /*all_to_all=*/false);
      plan.experts_over_shares = true;
    }
  }
  if (replicas_of_tensor) {
    MEGACTX_CHECK(experts,
                  "data-parallel attention over shares of tensor-parallel ranks: the routed "
                  "experts are sharded over the whole group (--expert-parallel-size {})",
                  size);
    plan.data_parallel_rank = rank / tensor_size;
    plan.data_parallel_size = replicas;
    shard_experts(rank, size, /*all_to_all=*/true);  // every rank's slice of its share's rows
  }
  const bool tensor = !layout.data_parallel_attention || replicas_of_tensor;
  if (tensor) {
    MEGACTX_CHECK(divides(whole.attention.heads),
                  "--tensor-parallel-size {}: the model's {} attention heads do not divide",
                  tensor_size, whole.attention.heads);
    MEGACTX_CHECK(!dense || divides(config.intermediate_size),
                  "--tensor-parallel-size {}: the MLP width {} does not divide", tensor_size,
                  config.intermediate_size);
    MEGACTX_CHECK(!moe || divides(config.n_shared_experts * config.moe_intermediate_size),
                  "--tensor-parallel-size {}: the shared experts' width {} does not divide",
                  tensor_size, config.n_shared_experts * config.moe_intermediate_size);
    MEGACTX_CHECK(!moe || experts || divides(config.moe_intermediate_size),
                  "--tensor-parallel-size {}: the expert width {} does not divide", tensor_size,
                  config.moe_intermediate_size);
    plan.attention.heads = whole.attention.heads / tensor_size;
    plan.tensor_parallel_rank = tensor_rank;
    plan.tensor_parallel_size = tensor_size;
    if (layout.layer_split) {
      plan.layer_split = true;
      plan.kv_owner = layer_split_owners(whole.layers, whole.attention, tensor_size);
    }
    if (layout.split_indexer) {
      MEGACTX_CHECK(!layout.layer_split,
                    "--split-indexer: with --enable-layer-split each layer's indexer runs on "
                    "its owner alone");
      MEGACTX_CHECK(divides(whole.attention.index_heads),
                    "--split-indexer over {} ranks: the indexer's {} heads do not divide",
                    tensor_size, whole.attention.index_heads);
      plan.indexer_split = true;
      plan.attention.index_heads = whole.attention.index_heads / tensor_size;
    }
  }
  if (experts && !plan.experts_over_shares && !replicas_of_tensor)
    shard_experts(tensor_rank, tensor_size, /*all_to_all=*/layout.data_parallel_attention);
  return plan;
}

MoeDispatch parse_moe_dispatch(const std::string& name) {
  if (name == "auto") return MoeDispatch::automatic;
  if (name == "all-to-all") return MoeDispatch::all_to_all;
  if (name == "gathered") return MoeDispatch::gathered;
  fail("--moe-dispatch {}: expected auto, all-to-all or gathered", name);
}

std::vector<int> layer_split_owners(const std::vector<LayerPlan>& layers,
                                    const AttentionDims& attention, int size) {
  MEGACTX_CHECK(size >= 1, "LayerSplit over {} ranks", size);
  const auto elements = [&](const LayerPlan& layer) {  // cache elements per token
    return attention.entry + (layer.runs_indexer ? attention.index_dim : 0);
  };
  // The larger layers (those with an indexer pool) first, each in layer order.
  std::vector<size_t> order(layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return elements(layers[a]) > elements(layers[b]); });
  std::vector<int64_t> held(static_cast<size_t>(size), 0);  // elements per token, by rank
  std::vector<int> owners(layers.size(), 0);
  for (const size_t i : order) {
    const int rank = static_cast<int>(std::min_element(held.begin(), held.end()) - held.begin());
    held[static_cast<size_t>(rank)] += elements(layers[i]);
    owners[i] = rank;
  }
  return owners;
}

bool layer_split_prefetch() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_LAYER_SPLIT_PREFETCH");
    return !(value != nullptr && value[0] == '0');
  }();
  return enabled;
}

std::vector<KvCacheSpec> layer_split_shares(const ModelPlan& plan, const KvCacheSpec& whole,
                                            int borrowed_pools) {
  if (!plan.layer_split) return {whole};
  std::vector<KvCacheSpec> shares;
  for (int rank = 0; rank < plan.tensor_parallel_size; ++rank) {
    KvCacheSpec share = layer_split_spec(plan, whole, rank);
    if (share.latent_layers.size() < whole.latent_layers.size())
      share.borrowed_latent_pools = borrowed_pools;
    shares.push_back(std::move(share));
  }
  return shares;
}

KvCacheSpec layer_split_spec(const ModelPlan& plan, const KvCacheSpec& whole, int rank) {
  if (!plan.layer_split) return whole;
  KvCacheSpec spec = whole;
  const auto owned = [&](const std::vector<int64_t>& layers) {
    std::vector<int64_t> out;
    for (const int64_t layer : layers)
      if (plan.holds_kv(layer, rank)) out.push_back(layer);
    return out;
  };
  spec.latent_layers = owned(whole.latent_layers);
  spec.indexer_layers = owned(whole.indexer_layers);
  return spec;
}

std::pair<int64_t, int64_t> share_rows(int64_t rows, int rank, int size) {
  const int64_t base = rows / size, extra = rows % size;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

ModelPlan whole_model_plan(const ModelPlan& rank_plan) {
  ModelPlan whole = rank_plan;
  whole.attention.heads *= rank_plan.tensor_parallel_size;
  if (rank_plan.indexer_split) whole.attention.index_heads *= rank_plan.tensor_parallel_size;
  whole.indexer_split = false;
  whole.tensor_parallel_rank = whole.expert_parallel_rank = whole.data_parallel_rank = 0;
  whole.tensor_parallel_size = whole.expert_parallel_size = whole.data_parallel_size = 1;
  whole.expert_all_to_all = whole.experts_over_shares = false;
  whole.first_expert = whole.local_experts = 0;
  return whole;
}

void check_same_architecture(const ModelConfig& current, const ModelConfig& update) {
  auto same = [](const char* what, auto a, auto b) {
    MEGACTX_CHECK(a == b,
                  "the new weights are for another architecture: {} is {}, the served "
                  "model's is {}",
                  what, b, a);
  };
  same("model_type", current.model_type_name, update.model_type_name);
  same("num_hidden_layers", current.num_hidden_layers, update.num_hidden_layers);
  same("hidden_size", current.hidden_size, update.hidden_size);
  same("vocab_size", current.vocab_size, update.vocab_size);
  same("num_attention_heads", current.num_attention_heads, update.num_attention_heads);
  same("q_lora_rank", current.q_lora_rank.value_or(0), update.q_lora_rank.value_or(0));
  same("kv_lora_rank", current.kv_lora_rank, update.kv_lora_rank);
  same("qk_nope_head_dim", current.qk_nope_head_dim, update.qk_nope_head_dim);
  same("qk_rope_head_dim", current.qk_rope_head_dim, update.qk_rope_head_dim);
  same("v_head_dim", current.v_head_dim, update.v_head_dim);
  same("index_n_heads", current.index_n_heads, update.index_n_heads);
  same("index_head_dim", current.index_head_dim, update.index_head_dim);
  same("intermediate_size", current.intermediate_size, update.intermediate_size);
  same("moe_intermediate_size", current.moe_intermediate_size, update.moe_intermediate_size);
  same("n_routed_experts", current.n_routed_experts, update.n_routed_experts);
  same("n_shared_experts", current.n_shared_experts, update.n_shared_experts);
  same("num_experts_per_tok", current.num_experts_per_tok, update.num_experts_per_tok);
  same("num_nextn_predict_layers", current.num_nextn_predict_layers,
       update.num_nextn_predict_layers);
  for (int64_t layer = 0; layer < current.num_hidden_layers; ++layer) {
    MEGACTX_CHECK(current.layer_runs_indexer(layer) == update.layer_runs_indexer(layer) &&
                      current.layer_is_moe(layer) == update.layer_is_moe(layer),
                  "the new weights are for another architecture: layer {} differs in its "
                  "indexer or MLP kind",
                  layer);
  }
}

void check_cache_layout(const ModelPlan& plan, const PagedKvCache& cache, Device device) {
  const KvCacheSpec& spec = cache.spec();
  const AttentionDims& a = plan.attention;
  MEGACTX_CHECK(spec.device == device, "the model runs on the {} but its KV cache is on the {}",
                device == Device::CUDA ? "GPU" : "host",
                spec.device == Device::CUDA ? "GPU" : "host");
  MEGACTX_CHECK(spec.kv_lora_rank == a.kv_lora && spec.qk_rope_head_dim == a.rope,
                "KV cache built for kv_lora {} / rope {}, model has {} / {}", spec.kv_lora_rank,
                spec.qk_rope_head_dim, a.kv_lora, a.rope);
  for (const LayerPlan& layer : plan.layers) {
    if (!plan.holds_kv(layer.layer)) continue;  // LayerSplit: another rank's layer
    MEGACTX_CHECK(cache.has_latent(layer.layer), "KV cache has no latent pool for layer {}",
                  layer.layer);
    if (layer.runs_indexer) {
      MEGACTX_CHECK(cache.has_indexer(layer.layer) && spec.index_head_dim == a.index_dim,
                    "KV cache has no indexer pool of dim {} for full layer {}", a.index_dim,
                    layer.layer);
    }
  }
}

}  // namespace megactx

#include "model/dsa_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>
#include <utility>

#include "core/error.h"
#include "core/scoped_value.h"
#include "io/checkpoint.h"
#include "model/batch_checks.h"
#include "model/expert_dispatch.h"

namespace megactx {
namespace {

// HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps, not

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

}  // namespace

// Per-forward bookkeeping: where each sequence's new tokens sit in the batch,
// their positions and RoPE tables, and the top-k that travels from a full
// layer to the shared layers after it.
struct DsaModel::Step {
  struct Sequence {
    int64_t offset = 0;  // first row of this sequence in the batch
    int64_t count = 0;   // new tokens
    int64_t start = 0;   // tokens already cached
    std::span<const int32_t> pages;
    std::vector<int32_t> topk;    // [count, index_topk] positions, increasing, tail -1
    std::vector<int64_t> counts;  // [count]
    bool has_topk = false;
    bool shared = false;  // KVShare: write nothing, attend over [0, shared_context)
    int64_t shared_context = 0;
    int64_t context() const { return shared ? shared_context : start + count; }
  };
  std::vector<Sequence> sequences;
  int64_t tokens = 0;
  int64_t page_size = 64;
  std::vector<int64_t> positions;  // [tokens]
  std::vector<float> cos, sin;     // [tokens, rope / 2]
  // Context parallelism: the whole step this one is this rank's share of
  // (null otherwise) and the share's first row in it. Every rank writes every
  // row's latent and indexer key, so that its cache holds the whole context.
  const Step* whole = nullptr;
  int64_t first_row = 0;
  // The step whose rows this rank writes into its cache.
  const Step& written() const { return whole != nullptr ? *whole : *this; }

  int64_t slot(const Sequence& s, int64_t position) const {
    return static_cast<int64_t>(s.pages[position / page_size]) * page_size + position % page_size;
  }
};

DsaModel::DsaModel(ModelConfig config, ModelPlan plan, DsaWeights weights,
                   std::unique_ptr<Backend> backend, parallel::Communicator* group)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(std::move(backend)),
      rope_(make_rope_table(config_)),
      plan_(std::move(plan)),
      group_(group) {
  const int split = std::max(
      {plan_.tensor_parallel_size * plan_.context_parallel_size, plan_.expert_parallel_size});
  MEGACTX_CHECK(split == 1 || (group_ != nullptr && group_->size() == split),
                "DsaModel: a parallel plan needs its group");
  tensor_group_ = context_group_ = group_;
  if (plan_.tensor_parallel_size > 1 && plan_.context_parallel_size > 1) {
    // Context shares of tensor-parallel ranks (ParallelLayout): the heads'
    // partial sums within a share, the rows' gathers across the shares.
    tensor_split_ = group_->split(plan_.context_parallel_rank, plan_.tensor_parallel_rank);
    context_split_ = group_->split(plan_.tensor_parallel_rank, plan_.context_parallel_rank);
    tensor_group_ = tensor_split_.get();
    context_group_ = context_split_.get();
  }
  if (plan_.tensor_parallel_size > 1 && plan_.data_parallel_size > 1) {
    // Data-parallel shares of tensor-parallel ranks: the heads' partial sums
    // within a share; the routed experts' all-to-all over the whole group.
    tensor_split_ = group_->split(plan_.data_parallel_rank, plan_.tensor_parallel_rank);
    tensor_group_ = tensor_split_.get();
  }
  if (plan_.layer_split) {
    // LayerSplit's selected entries travel on a group of their own, in a
    // thread beside the absorbed-query products (attention()).
    entry_split_ = tensor_group_->split(0, plan_.tensor_parallel_rank);
    entry_group_ = entry_split_.get();
  }
}

std::unique_ptr<PagedKvCache> DsaModel::make_kv_cache(const KvCacheSpec& spec) const {
  return std::make_unique<PagedKvCache>(
      layer_split_spec(plan_, spec, plan_.layer_split ? plan_.tensor_parallel_rank : 0));
}

std::unique_ptr<PagedKvCache> DsaModel::make_host_kv_cache(const KvCacheSpec& spec) const {
  return make_kv_cache(spec);  // the host tier holds the pages of the same pools
}

std::vector<KvCacheSpec> DsaModel::kv_cache_shares(const KvCacheSpec& whole) const {
  return layer_split_shares(plan_, whole);
}

void DsaModel::reduce_partial(float* data, int64_t count) {
  // count 0: a data-parallel share without rows this step (its every tensor
  // rank has none), which still runs the layers for the experts' all-to-all.
  if (plan_.tensor_parallel_size > 1 && count > 0)
    tensor_group_->all_reduce(data, count, parallel::ReduceOp::Sum);
}

DsaModel::Step DsaModel::share_of(const Step& whole) const {
  const auto [first, last] =
      share_rows(whole.tokens, plan_.context_parallel_rank, plan_.context_parallel_size);
  Step share;
  share.page_size = whole.page_size;
  share.whole = &whole;
  share.first_row = first;
  for (const Step::Sequence& s : whole.sequences) {
    const int64_t from = std::max(first, s.offset), to = std::min(last, s.offset + s.count);
    if (from >= to) continue;
    Step::Sequence part;
    part.offset = share.tokens;
    part.count = to - from;
    part.start = s.start + (from - s.offset);  // its first row's position
    part.pages = s.pages;
    share.tokens += part.count;
    share.sequences.push_back(std::move(part));
  }
  const int64_t half = config_.qk_rope_head_dim / 2;
  share.positions.assign(whole.positions.begin() + first, whole.positions.begin() + last);
  share.cos.assign(whole.cos.begin() + first * half, whole.cos.begin() + last * half);
  share.sin.assign(whole.sin.begin() + first * half, whole.sin.begin() + last * half);
  return share;
}

template <typename T>
std::vector<T> DsaModel::gather_rows(const T* rows, int64_t width, const Step& share) {
  const int size = plan_.context_parallel_size;
  const int64_t total = share.whole->tokens;
  const int64_t longest = share_rows(total, 0, size).second;  // rank 0's share is a longest one
  // Every rank's share padded to the longest, gathered, then packed in row order.
  std::vector<T> padded(static_cast<size_t>(longest * width), T{});
  std::copy_n(rows, share.tokens * width, padded.begin());
  std::vector<T> all(static_cast<size_t>(size * longest * width));
  context_group_->all_gather(padded.data(), all.data(),
                             longest * width * static_cast<int64_t>(sizeof(T)));
  std::vector<T> out(static_cast<size_t>(total * width));
  for (int r = 0; r < size; ++r) {
    const auto [first, last] = share_rows(total, r, size);
    std::copy_n(all.begin() + r * longest * width, (last - first) * width,
                out.begin() + first * width);
  }
  return out;
}

std::unique_ptr<DsaModel> build_dsa_model(const ModelConfig& config, WeightSource& weights,
                                          std::unique_ptr<Backend> backend,
                                          const DsaModelOptions& options) {
  DsaWeights loaded =
      load_dsa_weights(config, plan_model(config, options.index_topk_override), weights);
  ModelPlan plan = rank_model_plan(config, options);
  parallel::Communicator* group = options.group;
  if (group != nullptr && group->size() > 1) loaded = parallel_shard(loaded, plan);
  return std::make_unique<DsaModel>(config, std::move(plan), std::move(loaded), std::move(backend),
                                    group);
}

ModelPlan rank_model_plan(const ModelConfig& config, const DsaModelOptions& options) {
  ModelPlan plan = plan_model(config, options.index_topk_override);
  const parallel::Communicator* group = options.group;
  if (group == nullptr || group->size() == 1) return plan;
  return parallel_plan(plan, config,
                       {.rank = group->rank(),
                        .size = group->size(),
                        .expert_parallel = options.expert_parallel,
                        .data_parallel_attention = options.data_parallel_attention,
                        .data_parallel_size = options.data_parallel_size,
                        .context_parallel = options.context_parallel,
                        .context_parallel_size = options.context_parallel_size,
                        .experts_over_group = options.experts_over_group,
                        .moe_dispatch = options.moe_dispatch,
                        .layer_split = options.layer_split,
                        .split_indexer = options.split_indexer});
}

void DsaModel::reload_weights(const Checkpoint& checkpoint) {
  check_same_architecture(config_, checkpoint.config());
  auto source = make_checkpoint_weights(checkpoint);
  if (plan_.tensor_parallel_size == 1 && plan_.expert_parallel_size == 1) {
    weights_ = load_dsa_weights(config_, plan_, *source);  // checks every name
    return;
  }
  // A rank of a parallel group loads the whole model's shapes, then keeps its share.
  weights_ = parallel_shard(load_dsa_weights(config_, whole_model_plan(plan_), *source), plan_);
}

void DsaModel::release_weights() {
  weights_ = DsaWeights{};
}

void DsaModel::final_norm(const float* x, int64_t rows, float* out) const {
  // The norm forward() applies before lm_head (row by row there too).
  const int64_t hidden = config_.hidden_size;
  for (int64_t r = 0; r < rows; ++r) {
    backend_->rmsnorm(x + r * hidden, 1, hidden, hidden, weights_.final_norm.data<float>(),
                      plan_.rms_norm_eps, out + r * hidden, hidden);
  }
}

void DsaModel::check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const {
  MEGACTX_CHECK(!weights_.layers.empty(),
                "the model's weights are released (resume_memory_occupation brings them back)");
  check_cache_layout(plan_, cache, backend_->device());
  check_sequence_inputs(batch, cache.spec(), config_.vocab_size);
}

ForwardOutput DsaModel::forward(const ForwardBatch& batch, PagedKvCache& cache) {
  check_batch(batch, cache);
  drop_prefetch();  // one a failed forward may have left
  // The MoE dispatch of this step, the same on every rank (the MTP layer's
  // runs, which reach the experts through this model too, take the
  // all-to-all).
  const ScopedValue<int64_t> dispatch(gathered_rows_, gathered_dispatch_rows(plan_, batch));
  const int64_t hidden = config_.hidden_size;
  Step step;
  step.page_size = cache.spec().page_size;
  for (const SequenceInput& in : batch.sequences) {
    Step::Sequence s;
    s.offset = step.tokens;
    s.count = static_cast<int64_t>(in.tokens.size());
    s.start = in.start_position;
    s.pages = in.page_table;
    for (int64_t i = 0; i < s.count; ++i) step.positions.push_back(s.start + i);
    step.tokens += s.count;
    step.sequences.push_back(std::move(s));
  }
  const int64_t n = step.tokens;
  const int64_t half = config_.qk_rope_head_dim / 2;
  step.cos.resize(static_cast<size_t>(n * half));
  step.sin.resize(static_cast<size_t>(n * half));
  rope_.fill(step.positions.data(), n, step.cos.data(), step.sin.data());

  // Context parallelism splits a step's rows when every rank gets one (decode
  // steps smaller than the group run whole on every rank: the same rows, the
  // same cache writes, no collective).
  const bool split_rows = plan_.context_parallel_size > 1 && n >= plan_.context_parallel_size;
  Step share;
  if (split_rows) share = share_of(step);
  Step& run = split_rows ? share : step;
  const int64_t first_row = run.first_row;

  // x: [run.tokens, hidden] residual stream, starting from the embeddings.
  std::vector<float> x(static_cast<size_t>(run.tokens * hidden));
  int64_t row = 0;
  for (const SequenceInput& in : batch.sequences) {
    for (int32_t token : in.tokens) {
      if (row >= first_row && row < first_row + run.tokens)
        std::memcpy(x.data() + (row - first_row) * hidden,
                    weights_.embed.data<float>() + token * hidden,
                    static_cast<size_t>(hidden) * sizeof(float));
      ++row;
    }
  }
  const float eps = plan_.rms_norm_eps;
  ForwardOutput output;
  // The routed experts of every row and layer, [rows, layers, top_k] (-1 for
  // dense layers); under context parallelism each rank records its share's
  // rows and the group gathers them with the final states.
  const int64_t routed_row = config_.num_hidden_layers * config_.num_experts_per_tok;
  std::vector<int32_t> routed_share;
  if (batch.want_routed_experts) {
    output.routed_experts =
        Tensor::empty({n, config_.num_hidden_layers, config_.num_experts_per_tok}, DType::I32);
    std::fill_n(output.routed_experts.data<int32_t>(), output.routed_experts.numel(), -1);
    routed_.ids = output.routed_experts.data<int32_t>();
    if (split_rows) {
      routed_share.assign(static_cast<size_t>(run.tokens * routed_row), -1);
      routed_.ids = routed_share.data();
    }
  }
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    routed_.layer = layer;
    decoder_layer(weights_.layers[layer], layer, run, cache, x.data());
  }
  routed_.ids = nullptr;  // the MTP layer's runs record nothing
  if (split_rows) {
    x = gather_rows(x.data(), hidden, share);  // every row's final state
    if (batch.want_routed_experts) {
      const std::vector<int32_t> all = gather_rows(routed_share.data(), routed_row, share);
      std::copy(all.begin(), all.end(), output.routed_experts.data<int32_t>());
    }
  }

  if (batch.want_hidden_states) {
    output.hidden_states = Tensor::empty({n, hidden});
    std::memcpy(output.hidden_states.data<float>(), x.data(), x.size() * sizeof(float));
  }
  // Rows that want logits, sequence by sequence.
  std::vector<int64_t> rows;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const int64_t from = batch.sequences[s].logits_from < 0 ? step.sequences[s].count - 1
                                                            : batch.sequences[s].logits_from;
    for (int64_t i = from; i < step.sequences[s].count; ++i) {
      rows.push_back(step.sequences[s].offset + i);
    }
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  std::vector<float> normed(static_cast<size_t>(m * hidden));
  for (int64_t i = 0; i < m; ++i) {
    backend_->rmsnorm(x.data() + rows[i] * hidden, 1, hidden, hidden,
                      weights_.final_norm.data<float>(), eps, normed.data() + i * hidden, hidden);
  }
  output.logits = Tensor::empty({m, config_.vocab_size});
  backend_->linear(normed.data(), m, hidden, weights_.lm_head.data<float>(), config_.vocab_size,
                   output.logits.data<float>());
  return output;
}

void DsaModel::decoder_layer(const LayerWeights& w, int64_t layer, Step& step, PagedKvCache& cache,
                             float* x) {
  const int64_t n = step.tokens;
  const int64_t hidden = config_.hidden_size;
  const float eps = plan_.rms_norm_eps;
  std::vector<float> h(static_cast<size_t>(n * hidden)), branch(h.size());
  backend_->rmsnorm(x, n, hidden, hidden, w.input_norm.data<float>(), eps, h.data(), hidden);
  attention(w, layer, h.data(), step, cache, branch.data());
  reduce_partial(branch.data(), n * hidden);
  add_into(x, branch.data(), n * hidden);
  backend_->rmsnorm(x, n, hidden, hidden, w.post_norm.data<float>(), eps, h.data(), hidden);
  if (w.is_moe && plan_.experts_over_shares) {
    moe_over_shares(w.moe, h.data(), step, branch.data());  // summed over the whole group
  } else if (w.is_moe && plan_.data_parallel_size > 1 && plan_.tensor_parallel_size > 1) {
    moe_over_tensor_slices(w.moe, h.data(), n, branch.data());  // complete within the share
  } else {
    if (w.is_moe) {
      moe(w.moe, h.data(), n, branch.data());
    } else {
      mlp(w.dense, h.data(), n, branch.data());
    }
    reduce_partial(branch.data(), n * hidden);
  }
  add_into(x, branch.data(), n * hidden);
}

void DsaModel::run_layer(const LayerWeights& w, int64_t cache_layer,
                         std::span<LayerSequence> sequences, float* x, PagedKvCache& cache) {
  // A data-parallel attention rank with no rows in an MTP step still runs the
  // layer: its MoE's all-to-all meets the other ranks' (no attention runs).
  MEGACTX_CHECK(!sequences.empty() || plan_.expert_all_to_all, "run_layer: no sequences");
  MEGACTX_CHECK(cache.has_latent(cache_layer), "KV cache has no latent pool for layer {}",
                cache_layer);
  const bool shared = !sequences.empty() && sequences.front().shared;
  MEGACTX_CHECK(
      sequences.empty() || shared || (w.attention.has_indexer && cache.has_indexer(cache_layer)),
      "run_layer: layer {} needs its indexer and an indexer pool", cache_layer);
  Step step;
  step.page_size = cache.spec().page_size;
  for (const LayerSequence& in : sequences) {
    MEGACTX_CHECK(in.shared == shared, "run_layer: shared and unshared sequences mixed");
    MEGACTX_CHECK(in.count > 0 && in.start >= 0, "run_layer: bad rows {} at {}", in.count,
                  in.start);
    Step::Sequence s;
    s.offset = step.tokens;
    s.count = in.count;
    s.start = in.start;
    s.pages = in.pages;
    s.shared = in.shared;
    s.shared_context = in.shared_context;
    const int64_t last = shared ? in.shared_context : in.start + in.count;
    MEGACTX_CHECK(static_cast<int64_t>(in.pages.size()) * step.page_size >= last,
                  "run_layer: {} pages do not cover {} positions", in.pages.size(), last);
    if (shared) {
      MEGACTX_CHECK(static_cast<int64_t>(in.shared_topk.size()) == plan_.attention.index_topk &&
                        in.shared_count > 0 && in.shared_count <= in.shared_context,
                    "run_layer: shared top-k must hold {} entries, {} valid",
                    plan_.attention.index_topk, in.shared_count);
      for (int64_t i = 0; i < in.count; ++i) {
        s.topk.insert(s.topk.end(), in.shared_topk.begin(), in.shared_topk.end());
        s.counts.push_back(in.shared_count);
      }
      s.has_topk = true;
    }
    for (int64_t i = 0; i < s.count; ++i) step.positions.push_back(s.start + i);
    step.tokens += s.count;
    step.sequences.push_back(std::move(s));
  }
  const int64_t half = config_.qk_rope_head_dim / 2;
  step.cos.resize(static_cast<size_t>(step.tokens * half));
  step.sin.resize(static_cast<size_t>(step.tokens * half));
  rope_.fill(step.positions.data(), step.tokens, step.cos.data(), step.sin.data());
  decoder_layer(w, cache_layer, step, cache, x);
  if (!shared) {
    for (size_t i = 0; i < sequences.size(); ++i) {
      const Step::Sequence& s = step.sequences[i];
      const int64_t row = sequences[i].output_row >= 0 ? sequences[i].output_row : s.count - 1;
      sequences[i].last_topk.assign(s.topk.begin() + row * plan_.attention.index_topk,
                                    s.topk.begin() + (row + 1) * plan_.attention.index_topk);
      sequences[i].last_count = s.counts[row];
    }
  }
}

void DsaModel::attention(const LayerWeights& lw, int64_t layer, const float* h, Step& step,
                         PagedKvCache& cache, float* out) {
  const AttentionWeights& w = lw.attention;
  const AttentionDims& d = plan_.attention;
  const int64_t n = step.tokens, hidden = d.hidden, heads = d.heads, nope = d.nope, rope = d.rope;
  const int64_t qk = d.qk, lora = d.kv_lora, value = d.value, entry = d.entry;
  // A data-parallel attention rank without rows this step (its forward still
  // runs for the experts' all-to-all): no attention, and no collective here
  // (every layout whose attention has collectives gives every rank rows).
  if (n == 0) return;

  // q: [n, heads, nope | rope]; q_resid: [n, q_lora] (the indexer reads it too).
  std::vector<float> q(static_cast<size_t>(n * heads * qk));
  std::vector<float> q_resid;
  if (d.q_lora > 0) {
    const int64_t q_lora = d.q_lora;
    q_resid.resize(static_cast<size_t>(n * q_lora));
    backend_->linear(h, n, hidden, w.q_a.data<float>(), q_lora, q_resid.data());
    backend_->rmsnorm(q_resid.data(), n, q_lora, q_lora, w.q_a_norm.data<float>(), kLatentNormEps,
                      q_resid.data(), q_lora);
    backend_->linear(q_resid.data(), n, q_lora, w.q_b.data<float>(), heads * qk, q.data());
  } else {
    backend_->linear(h, n, hidden, w.q_b.data<float>(), heads * qk, q.data());
  }
  backend_->rope(q.data() + nope, n, heads, heads * qk, qk, rope, step.cos.data(), step.sin.data(),
                 d.rope_interleave);

  // LayerSplit: this layer's caches are on rank `owner` only (-1: on every
  // rank). Only the owner computes the new rows' latents and indexer keys
  // (nobody else would read them) and runs the indexer.
  const int owner = plan_.kv_owner_of(layer);
  const bool holds = plan_.holds_kv(layer);
  if (holds) {
    // kv: [n, c_kv (lora) | k_rope (rope)] -> normed latent and rotated key, into the cache.
    std::vector<float> kv(static_cast<size_t>(n * entry));
    backend_->linear(h, n, hidden, w.kv_a.data<float>(), entry, kv.data());
    backend_->rmsnorm(kv.data(), n, lora, entry, w.kv_a_norm.data<float>(), kLatentNormEps,
                      kv.data(), entry);
    backend_->rope(kv.data() + lora, n, 1, entry, 0, rope, step.cos.data(), step.sin.data(),
                   d.rope_interleave);
    // Context parallel: every rank's new rows into this rank's cache.
    const std::vector<float> gathered =
        step.whole != nullptr ? gather_rows(kv.data(), entry, step) : std::vector<float>{};
    const float* rows = step.whole != nullptr ? gathered.data() : kv.data();
    for (const Step::Sequence& s : step.written().sequences) {
      if (s.shared) continue;  // KVShare: nothing derived from a draft is written
      for (int64_t i = 0; i < s.count; ++i) {
        const float* e = rows + (s.offset + i) * entry;
        cache.write_latent(layer, step.slot(s, s.start + i), e, e + lora);
      }
    }
  }

  if (w.has_indexer && !step.sequences.front().shared) {
    if (holds) indexer(lw, layer, h, q_resid.data(), step, cache);
    if (owner >= 0) share_topk(step, owner);
  }

  // Sparse attention, per sequence, over latents read back from the cache
  // (prefill and decode read the same layout the same way). Only the rows
  // some query selected are decoded: decode reads top-k entries, not the
  // whole context. Sequence i's selected positions, each once, are entries
  // [first[i], first[i + 1]) of `latents` ([entries, entry]); remapped[i]
  // ([count, index_topk]) indexes them from first[i] (-1 past a row's count).
  const size_t sequences = step.sequences.size();
  std::vector<std::vector<int32_t>> selected(sequences), remapped(sequences);
  std::vector<int64_t> first(sequences + 1, 0);
  std::vector<int32_t> row_of;
  for (size_t i = 0; i < sequences; ++i) {
    const Step::Sequence& s = step.sequences[i];
    MEGACTX_CHECK(s.has_topk, "layer {}: no top-k to share (no full layer before it)", layer);
    row_of.assign(static_cast<size_t>(s.context()), -1);
    remapped[i].resize(s.topk.size());
    for (size_t k = 0; k < s.topk.size(); ++k) {
      const int32_t position = s.topk[k];
      if (position >= 0 && row_of[position] < 0) {
        row_of[position] = static_cast<int32_t>(selected[i].size());
        selected[i].push_back(position);
      }
      remapped[i][k] = position >= 0 ? row_of[position] : -1;
    }
    first[i + 1] = first[i] + static_cast<int64_t>(selected[i].size());
  }
  std::vector<float> latents(static_cast<size_t>(first.back() * entry));
  // LayerSplit: the selected entries as the owner's cache holds them, in
  // flight while the absorbed queries are computed.
  const KvCacheSpec& spec = cache.spec();
  const int64_t bytes = spec.latent_bytes_per_token();
  std::vector<std::byte> raw, fresh_raw;
  std::vector<std::pair<int64_t, int64_t>> fresh;  // (entry index, cache slot) sent now
  std::future<void> entries_sent;
  if (owner < 0) {
    for (size_t i = 0; i < sequences; ++i)
      for (size_t k = 0; k < selected[i].size(); ++k) {
        float* e = latents.data() + (first[i] + static_cast<int64_t>(k)) * entry;
        cache.read_latent(layer, step.slot(step.sequences[i], selected[i][k]), e, e + lora);
      }
  } else {
    // LayerSplit: the owner copies the selected entries as its cache holds
    // them ([entries, latent bytes per token]: 656 B each in fp8, 1152 in
    // bf16) and broadcasts them; every rank decodes the same bytes, so its
    // heads see what the replicated cache would give them. Entries the
    // previous layer's prefetch carried (the same selection, positions
    // before this step's rows) are taken from it; the rest travel now.
    raw.resize(static_cast<size_t>(first.back() * bytes));
    const bool prefetched = prefetch_.layer == layer && prefetch_.step == &step &&
                            (prefetch_.whole || prefetch_.selected == selected);
    if (prefetched && prefetch_.sent.valid()) prefetch_.sent.get();  // rethrows the group's error
    int64_t carried = 0;
    fresh.clear();
    for (size_t i = 0; i < sequences; ++i)
      for (size_t k = 0; k < selected[i].size(); ++k) {
        const int64_t index = first[i] + static_cast<int64_t>(k);
        if (prefetched && selected[i][k] < step.sequences[i].start) {
          // The whole old context by position, or the selection's old entries in order.
          const int64_t from =
              prefetch_.whole ? prefetch_.sequence_first[i] + selected[i][k] : carried;
          std::memcpy(raw.data() + index * bytes, prefetch_.raw.data() + from * bytes,
                      static_cast<size_t>(bytes));
          ++carried;
        } else {
          fresh.push_back({index, step.slot(step.sequences[i], selected[i][k])});
        }
      }
    prefetched_entries_ += carried;
    drop_prefetch();
    fresh_raw.resize(fresh.size() * static_cast<size_t>(bytes));
    if (holds) {
      for (size_t j = 0; j < fresh.size(); ++j)
        std::memcpy(fresh_raw.data() + j * static_cast<size_t>(bytes),
                    cache.latent_entry(layer, fresh[j].second), static_cast<size_t>(bytes));
    }
    // On their own group, beside the absorbed products below (no other
    // collective runs until they are back).
    if (!fresh_raw.empty())
      entries_sent = std::async(std::launch::async, [&] {
        entry_group_->broadcast(fresh_raw.data(), static_cast<int64_t>(fresh_raw.size()), owner);
      });
  }
  // Absorbed queries: q_latent[t, head] = q_nope[t, head] . W_UK[head]  -> [n, heads, lora].
  std::vector<float> q_latent(static_cast<size_t>(n * heads * lora));
  std::vector<float> q_rope(static_cast<size_t>(n * heads * rope));
  for (int64_t head = 0; head < heads; ++head) {
    backend_->linear(q.data() + head * qk, n, nope, heads * qk,
                     w.w_uk_t.data<float>() + head * lora * nope, lora,
                     q_latent.data() + head * lora, heads * lora);
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t head = 0; head < heads; ++head) {
      std::memcpy(q_rope.data() + (t * heads + head) * rope,
                  q.data() + (t * heads + head) * qk + nope,
                  static_cast<size_t>(rope) * sizeof(float));
    }
  }

  if (owner >= 0) {
    if (entries_sent.valid()) entries_sent.get();  // rethrows the group's error
    for (size_t j = 0; j < fresh.size(); ++j)
      std::memcpy(raw.data() + fresh[j].first * bytes,
                  fresh_raw.data() + j * static_cast<size_t>(bytes), static_cast<size_t>(bytes));
    for (int64_t k = 0; k < first.back(); ++k) {
      float* e = latents.data() + k * entry;
      decode_latent_entry(spec, raw.data() + k * bytes, e, e + lora);
    }
    // The next layer's old entries travel while this one's attention and
    // feed-forward run.
    prefetch_entries(layer + 1, step, selected, cache);
  }
  std::vector<float> o_latent(static_cast<size_t>(n * heads * lora));
  for (size_t i = 0; i < sequences; ++i) {
    const Step::Sequence& s = step.sequences[i];
    if (attention_probe_ && owner < 0 && step.whole == nullptr && !s.shared) {
      AttentionProbeLayer view;
      view.layer = layer;
      view.indexer_source = plan_.layer(layer).indexer_source;
      view.heads = heads;
      view.kv_lora = lora;
      view.rope = rope;
      view.scale = plan_.attention.softmax_scale;
      view.start = s.start;
      view.rows = s.count;
      view.q_latent = q_latent.data() + s.offset * heads * lora;
      view.q_rope = q_rope.data() + s.offset * heads * rope;
      view.topk = s.topk.data();
      view.counts = s.counts.data();
      view.index_topk = plan_.attention.index_topk;
      view.read_entry = [&](int64_t position, float* e) {
        cache.read_latent(layer, step.slot(s, position), e, e + lora);
      };
      attention_probe_(view);
    }
    MlaAttentionOp op;
    op.q_latent = q_latent.data() + s.offset * heads * lora;
    op.q_rope = q_rope.data() + s.offset * heads * rope;
    op.latents = latents.data() + first[i] * entry;
    op.indices = remapped[i].data();
    op.counts = s.counts.data();
    op.index_stride = plan_.attention.index_topk;
    op.queries = s.count;
    op.heads = heads;
    op.kv_lora = lora;
    op.rope = rope;
    op.scale = plan_.attention.softmax_scale;
    op.out = o_latent.data() + s.offset * heads * lora;
    backend_->mla_attention(op);
  }

  // Expand: o[t, head] = o_latent[t, head] . W_UV[head]^T -> [n, heads * value]; then o_proj.
  std::vector<float> o(static_cast<size_t>(n * heads * value));
  for (int64_t head = 0; head < heads; ++head) {
    backend_->linear(o_latent.data() + head * lora, n, lora, heads * lora,
                     w.w_uv.data<float>() + head * value * lora, value, o.data() + head * value,
                     heads * value);
  }
  backend_->linear(o.data(), n, heads * value, w.o.data<float>(), hidden, out);
}

void DsaModel::drop_prefetch() {
  if (prefetch_.sent.valid()) prefetch_.sent.get();
  prefetch_.layer = -1;
  prefetch_.step = nullptr;
}

void DsaModel::prefetch_entries(int64_t next, const Step& step,
                                const std::vector<std::vector<int32_t>>& selected,
                                PagedKvCache& cache) {
  // Only a layer of the same forward whose rows write its cache (no KVShare
  // draft rows, no context-parallel share whose old context is another
  // share's). A layer that reuses this selection (no indexer of its own)
  // gets its selected old entries; one that runs its indexer gets every old
  // entry when its selection could cover them all (each sequence's rows x
  // top-k at least its old context: prefill chunks), and nothing otherwise
  // (decode: its selection is a small part of a long context). Every rank
  // decides the same (the plan, the weights, the step and the shared
  // selection), owner or not.
  if (!layer_split_prefetch() || next >= config_.num_hidden_layers || plan_.kv_owner_of(next) < 0 ||
      step.whole != nullptr)
    return;
  const bool whole = weights_.layers[next].attention.has_indexer;
  int64_t old_entries = 0;
  for (const Step::Sequence& s : step.sequences) {
    if (s.shared) return;
    if (whole && s.count * plan_.attention.index_topk < s.start) return;
    old_entries += s.start;
  }
  if (whole && old_entries == 0) return;
  drop_prefetch();
  const int owner = plan_.kv_owner_of(next);
  const int64_t bytes = cache.spec().latent_bytes_per_token();
  std::vector<int64_t> slots;
  prefetch_.sequence_first.clear();
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const Step::Sequence& s = step.sequences[i];
    prefetch_.sequence_first.push_back(static_cast<int64_t>(slots.size()));
    if (whole) {
      for (int64_t position = 0; position < s.start; ++position)
        slots.push_back(step.slot(s, position));
    } else {
      for (const int32_t position : selected[i])
        if (position < s.start) slots.push_back(step.slot(s, position));
    }
  }
  prefetch_.layer = next;
  prefetch_.step = &step;
  prefetch_.whole = whole;
  prefetch_.selected = whole ? std::vector<std::vector<int32_t>>{} : selected;
  prefetch_.raw.resize(slots.size() * static_cast<size_t>(bytes));
  if (plan_.holds_kv(next)) {
    for (size_t j = 0; j < slots.size(); ++j)
      std::memcpy(prefetch_.raw.data() + j * static_cast<size_t>(bytes),
                  cache.latent_entry(next, slots[j]), static_cast<size_t>(bytes));
  }
  if (!prefetch_.raw.empty())
    prefetch_.sent = std::async(std::launch::async, [this, owner] {
      entry_group_->broadcast(prefetch_.raw.data(), static_cast<int64_t>(prefetch_.raw.size()),
                              owner);
    });
}

void DsaModel::indexer(const LayerWeights& lw, int64_t layer, const float* h, const float* q_resid,
                       Step& step, PagedKvCache& cache) {
  const IndexerWeights& w = lw.attention.indexer;
  const AttentionDims& d = plan_.attention;
  const int64_t n = step.tokens, hidden = d.hidden, heads = d.index_heads, dim = d.index_dim;
  const int64_t rope = d.rope, q_lora = d.q_lora;
  const bool interleaved = d.indexer_rope_interleave;
  MEGACTX_CHECK(q_lora > 0, "the DSA indexer reads the q-LoRA residual (q_lora_rank)");

  // Heads are [rope | nope] (rope first, unlike MLA).
  std::vector<float> q(static_cast<size_t>(n * heads * dim));
  backend_->linear(q_resid, n, q_lora, w.wq_b.data<float>(), heads * dim, q.data());
  backend_->rope(q.data(), n, heads, heads * dim, dim, rope, step.cos.data(), step.sin.data(),
                 interleaved);
  std::vector<float> k_raw(static_cast<size_t>(n * dim)), k(static_cast<size_t>(n * dim));
  backend_->linear(h, n, hidden, w.wk.data<float>(), dim, k_raw.data());
  backend_->layernorm(k_raw.data(), n, dim, w.k_norm_weight.data<float>(),
                      w.k_norm_bias.data<float>(), kIndexerNormEps, k.data());
  backend_->rope(k.data(), n, 1, dim, 0, rope, step.cos.data(), step.sin.data(), interleaved);
  std::vector<float> weights(static_cast<size_t>(n * heads));
  backend_->linear(h, n, hidden, w.weights_proj.data<float>(), heads, weights.data());
  // heads^-0.5 of the whole indexer's heads (this rank's share of them with indexer_split).
  const int64_t all_heads = plan_.indexer_split ? heads * plan_.tensor_parallel_size : heads;
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(all_heads));
  for (float& value : weights) value *= head_scale;

  {
    // The new keys (context parallel: every rank's) before any row reads its context.
    const std::vector<float> gathered =
        step.whole != nullptr ? gather_rows(k.data(), dim, step) : std::vector<float>{};
    const float* rows = step.whole != nullptr ? gathered.data() : k.data();
    for (const Step::Sequence& s : step.written().sequences)
      for (int64_t i = 0; i < s.count; ++i)
        cache.write_indexer_key(layer, step.slot(s, s.start + i), rows + (s.offset + i) * dim);
  }
  std::vector<float> keys;
  std::vector<int64_t> visible;
  for (Step::Sequence& s : step.sequences) {
    const int64_t context = s.context();
    keys.resize(static_cast<size_t>(context * dim));
    for (int64_t p = 0; p < context; ++p) {
      cache.read_indexer_key(layer, step.slot(s, p), keys.data() + p * dim);
    }
    visible.resize(static_cast<size_t>(s.count));
    for (int64_t i = 0; i < s.count; ++i) visible[i] = s.start + i + 1;  // causal
    s.topk.assign(static_cast<size_t>(s.count * plan_.attention.index_topk), -1);
    s.counts.assign(static_cast<size_t>(s.count), 0);
    IndexerTopkOp op;
    op.q = q.data() + s.offset * heads * dim;
    op.weights = weights.data() + s.offset * heads;
    op.keys = keys.data();
    op.visible = visible.data();
    op.queries = s.count;
    op.heads = heads;
    op.dim = dim;
    op.keys_count = context;
    op.topk = plan_.attention.index_topk;
    op.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    op.indices = s.topk.data();
    op.counts = s.counts.data();
    std::vector<float> scores;  // indexer_split: [count, context], the group's sums
    if (plan_.indexer_split) {
      // This rank's heads' scores, the group's sum, then everyone's top-k.
      scores.resize(static_cast<size_t>(s.count * context));
      op.scores_out = scores.data();
      backend_->indexer_topk(op);
      tensor_group_->all_reduce(scores.data(), static_cast<int64_t>(scores.size()),
                                parallel::ReduceOp::Sum);
      op.scores_out = nullptr;
      op.scores_in = scores.data();
    }
    backend_->indexer_topk(op);
    s.has_topk = true;
  }
}

void DsaModel::share_topk(Step& step, int owner) {
  // One broadcast: [tokens, index_topk] positions, then [tokens] counts (int32).
  const int64_t topk = plan_.attention.index_topk, n = step.tokens;
  std::vector<int32_t> words(static_cast<size_t>(n * (topk + 1)));
  const bool holds = plan_.tensor_parallel_rank == owner;
  if (holds) {
    for (const Step::Sequence& s : step.sequences) {
      std::copy(s.topk.begin(), s.topk.end(), words.begin() + s.offset * topk);
      for (int64_t i = 0; i < s.count; ++i)
        words[n * topk + s.offset + i] = static_cast<int32_t>(s.counts[i]);
    }
  }
  tensor_group_->broadcast(words.data(), static_cast<int64_t>(words.size() * sizeof(int32_t)),
                           owner);
  if (holds) return;
  for (Step::Sequence& s : step.sequences) {
    s.topk.assign(words.begin() + s.offset * topk, words.begin() + (s.offset + s.count) * topk);
    s.counts.assign(words.begin() + n * topk + s.offset,
                    words.begin() + n * topk + s.offset + s.count);
    s.has_topk = true;
  }
}

void DsaModel::mlp(const MlpWeights& w, const float* h, int64_t rows, float* out) {
  const int64_t hidden = config_.hidden_size;
  const int64_t inter = w.intermediate;
  std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter));
  std::vector<float> act(static_cast<size_t>(rows * inter));
  backend_->linear(h, rows, hidden, w.gate_up.data<float>(), 2 * inter, gate_up.data());
  backend_->silu_mul(gate_up.data(), gate_up.data() + inter, rows, inter, 2 * inter, act.data());
  backend_->linear(act.data(), rows, inter, w.down.data<float>(), hidden, out);
}

void DsaModel::moe(const MoeWeights& w, const float* h, int64_t rows, float* out) {
  moe_routed(w, h, rows, out, 0, rows);
  if (config_.n_shared_experts > 0) {
    const int64_t hidden = config_.hidden_size;
    std::vector<float> result(static_cast<size_t>(rows * hidden));
    mlp(w.shared, h, rows, result.data());
    add_into(out, result.data(), rows * hidden);
  }
}

void DsaModel::moe_over_shares(const MoeWeights& w, const float* h, const Step& step, float* out) {
  const int64_t hidden = config_.hidden_size, n = step.tokens;
  // A step split over the shares: every share's rows, gathered in row order
  // ([whole rows, hidden]); a step too small to split is the same rows on
  // every share already.
  const bool split = step.whole != nullptr;
  std::vector<float> gathered;
  if (split) gathered = gather_rows(h, hidden, step);
  const float* all = split ? gathered.data() : h;
  const int64_t total = split ? step.whole->tokens : n, first = split ? step.first_row : 0;
  // This rank's experts applied to every row (each expert is on one rank of
  // the group), its share of the shared experts to its own share's rows (on
  // one share only when every share has the same rows), then the group's sum.
  std::vector<float> sum(static_cast<size_t>(total * hidden));
  moe_routed(w, all, total, sum.data(), first, n);
  if (config_.n_shared_experts > 0 && (split || plan_.context_parallel_rank == 0)) {
    std::vector<float> result(static_cast<size_t>(n * hidden));
    mlp(w.shared, h, n, result.data());
    add_into(sum.data() + first * hidden, result.data(), n * hidden);
  }
  group_->all_reduce(sum.data(), total * hidden, parallel::ReduceOp::Sum);
  std::copy_n(sum.data() + first * hidden, n * hidden, out);
}

void DsaModel::moe_over_tensor_slices(const MoeWeights& w, const float* h, int64_t rows,
                                      float* out) {
  const int64_t hidden = config_.hidden_size, top_k = config_.num_experts_per_tok;
  const int tensor = plan_.tensor_parallel_size;
  const auto [first, last] = share_rows(rows, plan_.tensor_parallel_rank, tensor);
  const int64_t slice = last - first;
  const int64_t longest = share_rows(rows, 0, tensor).second;  // tensor rank 0's is a longest
  // This rank's slice through the routed experts (every rank of the group
  // takes part in the all-to-all, a slice of no rows too); its routing
  // recorded at its rows.
  std::vector<float> routed(static_cast<size_t>(longest * hidden), 0.0f);
  int32_t* const capture = routed_.ids;
  const int64_t layers = config_.num_hidden_layers;
  if (capture != nullptr) routed_.ids = capture + first * layers * top_k;
  moe_routed(w, h + first * hidden, slice, routed.data(), 0, slice);
  routed_.ids = capture;
  // The share's rows back from its tensor ranks' slices (padded to the longest).
  std::vector<float> all(static_cast<size_t>(tensor * longest * hidden));
  if (longest > 0)
    tensor_group_->all_gather(routed.data(), all.data(),
                              longest * hidden * static_cast<int64_t>(sizeof(float)));
  for (int r = 0; r < tensor; ++r) {
    const auto [from, to] = share_rows(rows, r, tensor);
    std::copy_n(all.begin() + r * longest * hidden, (to - from) * hidden, out + from * hidden);
  }
  if (capture != nullptr && longest > 0) {
    // The recorded routing of this layer, likewise: [rows, top_k] of the capture.
    std::vector<int32_t> mine(static_cast<size_t>(longest * top_k), 0);
    for (int64_t i = 0; i < slice; ++i)
      std::copy_n(capture + ((first + i) * layers + routed_.layer) * top_k, top_k,
                  mine.begin() + i * top_k);
    std::vector<int32_t> every(static_cast<size_t>(tensor * longest * top_k));
    tensor_group_->all_gather(mine.data(), every.data(),
                              longest * top_k * static_cast<int64_t>(sizeof(int32_t)));
    for (int r = 0; r < tensor; ++r) {
      const auto [from, to] = share_rows(rows, r, tensor);
      for (int64_t i = from; i < to; ++i)
        std::copy_n(every.begin() + (r * longest + i - from) * top_k, top_k,
                    capture + (i * layers + routed_.layer) * top_k);
    }
  }
  if (config_.n_shared_experts > 0 && rows > 0) {
    // The shared experts' width is split over the share's tensor ranks.
    std::vector<float> shared(static_cast<size_t>(rows * hidden));
    mlp(w.shared, h, rows, shared.data());
    tensor_group_->all_reduce(shared.data(), rows * hidden, parallel::ReduceOp::Sum);
    add_into(out, shared.data(), rows * hidden);
  }
}

void DsaModel::moe_routed(const MoeWeights& w, const float* h, int64_t rows, float* out,
                          int64_t record_first, int64_t record_rows) {
  const int64_t hidden = config_.hidden_size;
  const int64_t experts = config_.n_routed_experts;
  const int64_t top_k = config_.num_experts_per_tok;
  // Router in fp32: logits [rows, experts] -> ids/weights [rows, top_k].
  std::vector<float> logits(static_cast<size_t>(rows * experts));
  backend_->linear(h, rows, hidden, w.router.data<float>(), experts, logits.data());
  std::vector<int32_t> ids(static_cast<size_t>(rows * top_k));
  std::vector<float> gates(static_cast<size_t>(rows * top_k));
  RouterParams params{
      experts, config_.n_group,        config_.topk_group,
      top_k,   config_.norm_topk_prob, static_cast<float>(config_.routed_scaling_factor)};
  backend_->moe_route(logits.data(), w.bias.data<float>(), rows, params, ids.data(), gates.data());
  if (routed_.ids != nullptr) {
    const int64_t layers = config_.num_hidden_layers;
    for (int64_t r = 0; r < record_rows; ++r) {
      std::copy_n(ids.data() + (record_first + r) * top_k, top_k,
                  routed_.ids + (r * layers + routed_.layer) * top_k);
    }
  }

  std::fill(out, out + rows * hidden, 0.0f);
  std::vector<float> input, result;
  if (plan_.expert_all_to_all && gathered_rows_ > 0) {
    routed_experts_gathered(w, h, rows, ids, gates, out);
  } else if (plan_.expert_all_to_all) {
    routed_experts_all_to_all(w, h, rows, ids, gates, out);
  } else {
    // Expert parallel over tensor-parallel attention: every rank has every
    // token and applies its own experts; the group's sum completes the MoE.
    const int64_t first = plan_.local_experts > 0 ? plan_.first_expert : 0;
    const int64_t local = plan_.local_experts > 0 ? plan_.local_experts : experts;
    // Group the (token, weight) pairs by expert, then one GEMM chain per expert.
    std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(experts));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < top_k; ++j)
        assigned[ids[r * top_k + j]].push_back({r, gates[r * top_k + j]});
    }
    for (int64_t e = first; e < first + local; ++e) {
      const auto& list = assigned[e];
      if (list.empty()) continue;
      const int64_t m = static_cast<int64_t>(list.size());
      input.resize(static_cast<size_t>(m * hidden));
      result.resize(static_cast<size_t>(m * hidden));
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(input.data() + i * hidden, h + list[i].first * hidden,
                    static_cast<size_t>(hidden) * sizeof(float));
      }
      mlp(w.experts[e - first], input.data(), m, result.data());
      for (int64_t i = 0; i < m; ++i) {
        float* target = out + list[i].first * hidden;
        const float* source = result.data() + i * hidden;
        for (int64_t d = 0; d < hidden; ++d) target[d] += list[i].second * source[d];
      }
    }
  }
}

}  // namespace megactx

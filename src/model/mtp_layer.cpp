#include "model/mtp_layer.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/model_loader.h"

namespace megactx {

MtpWeights load_mtp_weights(const ModelConfig& c, WeightSource& source) {
  MEGACTX_CHECK(c.num_nextn_predict_layers > 0,
                "the model has no MTP layer (num_nextn_predict_layers = 0)");
  const int64_t L = c.num_hidden_layers;
  const int64_t H = c.hidden_size;
  const std::string prefix = fmt::format("model.layers.{}.", L);
  MtpWeights w;
  w.enorm = source.get(prefix + "enorm.weight", {H});
  w.hnorm = source.get(prefix + "hnorm.weight", {H});
  w.eh_proj = source.get(prefix + "eh_proj.weight", {H, 2 * H});
  w.head_norm = source.get(prefix + "shared_head.norm.weight", {H});
  const bool own_copies = c.model_type == ModelType::DeepseekV32;
  const std::string embed = prefix + "embed_tokens.weight";
  const std::string head = prefix + "shared_head.head.weight";
  if (own_copies || source.has(embed)) w.embed = source.get(embed, {c.vocab_size, H});
  if (own_copies || source.has(head)) w.lm_head = source.get(head, {c.vocab_size, H});
  // The MTP layer always runs its own indexer (a full layer).
  w.layer = load_layer_weights(c, source, plan_model(c).mtp);
  return w;
}

namespace {

// GLM's MTP layer reads the target's embedding and lm_head.
MtpWeights with_target_tensors(MtpWeights w, const DsaModel& target) {
  if (!w.embed.defined()) w.embed = target.weights().embed;
  if (!w.lm_head.defined()) w.lm_head = target.weights().lm_head;
  return w;
}

}  // namespace

MtpWeights load_mtp_weights(const DsaModel& target, WeightSource& source) {
  return with_target_tensors(load_mtp_weights(target.config(), source), target);
}

MtpWeights read_mtp_weights(const ModelConfig& config, const std::string& model_dir,
                            bool random_weights, uint64_t seed) {
  if (random_weights) {
    auto source = make_random_weights(seed);
    return load_mtp_weights(config, *source);
  }
  const std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(model_dir);
  auto source = make_checkpoint_weights(*checkpoint);
  return load_mtp_weights(config, *source);
}

MtpHandOff mtp_hand_off(const ModelConfig& config) {
  return config.model_type == ModelType::DeepseekV32 ? MtpHandOff::RawOutput
                                                     : MtpHandOff::NormedOutput;
}

MtpLayer::MtpLayer(const ModelConfig& config, int64_t index_topk, MtpHandOff hand_off)
    : hand_off_(hand_off),
      cache_layer_(config.num_hidden_layers),
      hidden_(config.hidden_size),
      vocab_(config.vocab_size),
      index_topk_(index_topk) {}

int64_t MtpLayer::check_rows(std::span<const Rows> sequences) const {
  MEGACTX_CHECK(!sequences.empty(), "MTP: no sequences");
  int64_t total = 0;
  for (const Rows& r : sequences) {
    MEGACTX_CHECK(
        r.count > 0 && static_cast<int64_t>(r.next_tokens.size()) == r.count && r.hidden != nullptr,
        "MTP: {} rows need as many next tokens ({}) and hidden rows", r.count,
        r.next_tokens.size());
    for (int32_t token : r.next_tokens) {
      MEGACTX_CHECK(token >= 0 && token < vocab_, "MTP: token id {} outside [0, {})", token,
                    vocab_);
    }
    if (r.shared) {
      MEGACTX_CHECK(r.shared_count >= 0 && r.shared_count <= index_topk_ &&
                        static_cast<int64_t>(r.shared_topk.size()) >= r.shared_count,
                    "MTP: shared selection of {} entries ({} given, top-k {})", r.shared_count,
                    r.shared_topk.size(), index_topk_);
      for (int64_t i = 0; i < r.shared_count; ++i) {
        MEGACTX_CHECK(r.shared_topk[i] >= 0 && r.shared_topk[i] < r.shared_context,
                      "MTP: shared position {} outside [0, {})", r.shared_topk[i],
                      r.shared_context);
      }
    }
    MEGACTX_CHECK(r.output_row >= -1 && r.output_row < r.count,
                  "MTP: output row {} of a sequence of {} rows", r.output_row, r.count);
    MEGACTX_CHECK(r.greedy_drafts >= 0 && (r.greedy_drafts == 0 || (r.target_hidden && !r.shared)),
                  "MTP: greedy drafts ({}) follow a step 0 only", r.greedy_drafts);
    total += r.count;
  }
  return total;
}

int32_t MtpLayer::Output::argmax_of(size_t i, int64_t vocab) const {
  if (!argmax.empty()) {
    MEGACTX_CHECK(i < argmax.size() && argmax[i] >= 0, "MTP: no argmax for sequence {}", i);
    return argmax[i];
  }
  MEGACTX_CHECK(logits.defined() && static_cast<int64_t>(i) < logits.dim(0),
                "MTP: greedy drafts need the step's logits");
  const float* row = logits.data<float>() + static_cast<int64_t>(i) * vocab;
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);  // lowest id on ties
}

void MtpLayer::greedy_drafts_on_host(std::span<const Rows> sequences, PagedKvCache& cache,
                                     Output& out) {
  const auto n = sequences.size();
  out.drafts.assign(n, {});
  int64_t longest = 0;
  // hand[i]: [H] the hand-off of sequence i's latest step.
  std::vector<std::vector<float>> hand(n);
  for (size_t i = 0; i < n; ++i) {
    const Rows& r = sequences[i];
    longest = std::max(longest, r.greedy_drafts);
    if (r.greedy_drafts == 0) continue;
    out.drafts[i].push_back(out.argmax_of(i, vocab_));
    const float* h = out.hand_off.data<float>() + static_cast<int64_t>(i) * hidden_;
    hand[i].assign(h, h + hidden_);
  }
  std::vector<Rows> rows;
  std::vector<size_t> owners;
  for (int64_t j = 1; j < longest; ++j) {
    rows.clear();
    owners.clear();
    for (size_t i = 0; i < n; ++i) {
      const Rows& first = sequences[i];
      if (first.greedy_drafts <= j) continue;
      Rows r;
      r.start = first.start + first.last_row() + j;
      r.count = 1;
      r.pages = first.pages;
      r.next_tokens = std::span<const int32_t>(&out.drafts[i].back(), 1);
      r.hidden = hand[i].data();
      r.target_hidden = false;
      r.shared = true;
      r.shared_context = first.start + first.last_row() + 1;
      r.shared_topk = out.last_topk[i];
      r.shared_count = out.last_count[i];
      r.want_argmax = true;  // only the next draft is read
      rows.push_back(r);
      owners.push_back(i);
    }
    const Output step = run(rows, cache);
    for (size_t o = 0; o < owners.size(); ++o) {
      const size_t i = owners[o];
      out.drafts[i].push_back(step.argmax_of(o, vocab_));
      const float* h = step.hand_off.data<float>() + static_cast<int64_t>(o) * hidden_;
      hand[i].assign(h, h + hidden_);
    }
  }
}

std::unique_ptr<MtpLayer> MtpLayer::load(DsaModel& target, const std::string& model_dir,
                                         bool random_weights, uint64_t seed) {
  return std::make_unique<CpuMtpLayer>(
      target,
      with_target_tensors(read_mtp_weights(target.config(), model_dir, random_weights, seed),
                          target),
      mtp_hand_off(target.config()));
}

CpuMtpLayer::CpuMtpLayer(DsaModel& target, MtpWeights weights, MtpHandOff hand_off)
    : MtpLayer(target.config(), target.index_topk(), hand_off),
      target_(target),
      weights_(std::move(weights)) {
  MEGACTX_CHECK(weights_.layer.attention.has_indexer, "the MTP layer needs its indexer weights");
}

MtpLayer::GroupRun group_run_shape(std::span<const MtpLayer::Rows> whole,
                                   const std::vector<int>& ranks) {
  MEGACTX_CHECK(ranks.size() == whole.size(), "MTP group run: {} ranks for {} sequences",
                ranks.size(), whole.size());
  MtpLayer::GroupRun shape;
  std::vector<int64_t> sequences;
  for (size_t s = 0; s < whole.size(); ++s) {
    const auto share = static_cast<size_t>(std::max(ranks[s], 0));
    if (share >= sequences.size()) sequences.resize(share + 1, 0);
    shape.max_sequences = std::max(shape.max_sequences, ++sequences[share]);
    if (s == 0) {
      shape.rows_per_sequence = whole[s].count;
      shape.shared = whole[s].shared;
      shape.target_hidden = whole[s].target_hidden;
    }
    if (whole[s].count != shape.rows_per_sequence) shape.rows_per_sequence = 0;
  }
  return shape;
}

MtpLayer::Output CpuMtpLayer::run(std::span<const Rows> sequences, PagedKvCache& cache) {
  Backend& backend = target_.backend();
  const int64_t H = hidden_size();
  const int64_t vocab = vocab_size();
  const float eps = target_.plan().rms_norm_eps;
  // With data-parallel attention a rank whose requests have no rows in this
  // step runs it with none (model/group_model.cpp): its decoder layer's MoE
  // still meets the other ranks' in the experts' all-to-all.
  const bool empty_share = sequences.empty() && target_.plan().expert_all_to_all;
  const int64_t total = empty_share ? 0 : check_rows(sequences);
  // cat: [total, 2H] = [enorm(embed(token_{t+1})) | hnorm(h)].
  std::vector<float> cat(static_cast<size_t>(total * 2 * H));
  std::vector<float> normed(static_cast<size_t>(H));
  int64_t row = 0;
  for (const Rows& r : sequences) {
    for (int64_t i = 0; i < r.count; ++i, ++row) {
      float* out = cat.data() + row * 2 * H;
      const float* e = weights_.embed.data<float>() + static_cast<int64_t>(r.next_tokens[i]) * H;
      backend.rmsnorm(e, 1, H, H, weights_.enorm.data<float>(), eps, out, H);
      const float* h = r.hidden + i * H;
      if (r.target_hidden) {
        // The target's hidden state after model.norm (vLLM/SGLang hand the
        // normed final state of the target model to the MTP layer).
        backend.rmsnorm(h, 1, H, H, target_.weights().final_norm.data<float>(), eps, normed.data(),
                        H);
        h = normed.data();
      }
      backend.rmsnorm(h, 1, H, H, weights_.hnorm.data<float>(), eps, out + H, H);
    }
  }
  // x: [total, H] residual stream through the decoder layer.
  std::vector<float> x(static_cast<size_t>(total * H));
  backend.linear(cat.data(), total, 2 * H, weights_.eh_proj.data<float>(), H, x.data());

  std::vector<DsaModel::LayerSequence> layer_sequences(sequences.size());
  for (size_t s = 0; s < sequences.size(); ++s) {
    const Rows& r = sequences[s];
    DsaModel::LayerSequence& l = layer_sequences[s];
    l.start = r.start;
    l.count = r.count;
    l.pages = r.pages;
    l.shared = r.shared;
    l.shared_context = r.shared_context;
    l.shared_topk = r.shared_topk;
    l.shared_count = r.shared_count;
    l.output_row = r.output_row;
  }
  target_.run_layer(weights_.layer, cache_layer(), layer_sequences, x.data(), cache);

  // The output row of each sequence: shared_head.norm, lm_head, hand-off.
  const int64_t n = static_cast<int64_t>(sequences.size());
  Output output;
  output.hand_off = Tensor::empty({n, H});
  std::vector<float> head_in(static_cast<size_t>(n * H));
  row = 0;
  for (int64_t s = 0; s < n; ++s) {
    const float* last = x.data() + (row + sequences[s].last_row()) * H;
    row += sequences[s].count;
    backend.rmsnorm(last, 1, H, H, weights_.head_norm.data<float>(), eps, head_in.data() + s * H,
                    H);
    const float* hand = hand_off() == MtpHandOff::NormedOutput ? head_in.data() + s * H : last;
    std::memcpy(output.hand_off.data<float>() + s * H, hand,
                static_cast<size_t>(H) * sizeof(float));
    output.last_topk.push_back(std::move(layer_sequences[s].last_topk));
    output.last_count.push_back(layer_sequences[s].last_count);
  }
  output.logits = Tensor::empty({n, vocab});
  backend.linear(head_in.data(), n, H, weights_.lm_head.data<float>(), vocab,
                 output.logits.data<float>());
  greedy_drafts_on_host(sequences, cache, output);
  return output;
}

std::unique_ptr<MtpLayer> DsaModel::load_mtp_layer(const Checkpoint& checkpoint) {
  // With data-parallel attention (expert_all_to_all) every rank runs its own
  // requests' MTP rows, and every run on every rank (an empty one too: the
  // group leader sends each rank its share) so that the MoE's all-to-all meets.
  auto source = make_checkpoint_weights(checkpoint);
  MtpWeights weights = load_mtp_weights(*this, *source);
  // A rank of a tensor- or expert-parallel group keeps its share of the MTP
  // layer as of every layer (its decoder layer adds the group's partial sums).
  if (plan_.tensor_parallel_size > 1 || plan_.expert_parallel_size > 1)
    weights.layer = parallel_shard_layer(weights.layer, plan_);
  return std::make_unique<CpuMtpLayer>(*this, std::move(weights), mtp_hand_off(config()));
}

}  // namespace megactx

#include "model/mtp_layer.h"

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
    total += r.count;
  }
  return total;
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

MtpLayer::Output CpuMtpLayer::run(std::span<const Rows> sequences, PagedKvCache& cache) {
  Backend& backend = target_.backend();
  const int64_t H = hidden_size();
  const int64_t vocab = vocab_size();
  const float eps = target_.plan().rms_norm_eps;
  const int64_t total = check_rows(sequences);
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
  }
  target_.run_layer(weights_.layer, cache_layer(), layer_sequences, x.data(), cache);

  // Last row of each sequence: shared_head.norm, lm_head, hand-off.
  const int64_t n = static_cast<int64_t>(sequences.size());
  Output output;
  output.hand_off = Tensor::empty({n, H});
  std::vector<float> head_in(static_cast<size_t>(n * H));
  row = 0;
  for (int64_t s = 0; s < n; ++s) {
    row += sequences[s].count;
    const float* last = x.data() + (row - 1) * H;
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
  return output;
}

std::unique_ptr<MtpLayer> DsaModel::load_mtp_layer(const Checkpoint& checkpoint) {
  auto source = make_checkpoint_weights(checkpoint);
  return std::make_unique<CpuMtpLayer>(*this, load_mtp_weights(*this, *source),
                                       mtp_hand_off(config()));
}

}  // namespace megactx

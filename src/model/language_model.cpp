#include "model/language_model.h"

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/mtp_layer.h"

namespace megactx {

std::unique_ptr<PagedKvCache> LanguageModel::make_kv_cache(const KvCacheSpec& spec) const {
  return std::make_unique<PagedKvCache>(spec);
}

std::unique_ptr<PagedKvCache> LanguageModel::make_host_kv_cache(const KvCacheSpec& spec) const {
  return std::make_unique<PagedKvCache>(spec);
}

KvPageCopy LanguageModel::kv_page_copy() const {
  return copy_kv_pages_on_host;
}

std::unique_ptr<MtpLayer> LanguageModel::load_mtp_layer(const Checkpoint&) {
  fail("speculative decoding needs a DSA model (glm_moe_dsa / deepseek_v32) with an MTP layer");
}

std::unique_ptr<MtpLayer> LanguageModel::load_mtp_layer(const std::string& model_dir) {
  return load_mtp_layer(*Checkpoint::open(model_dir));
}

void LanguageModel::reload_weights(const Checkpoint&) {
  fail("this model cannot replace its weights");
}

void LanguageModel::final_norm(const float*, int64_t, float*) const {
  fail("this model cannot report its final hidden states");
}

void LanguageModel::release_weights() {
  fail("this model cannot release its weights");
}

ForwardOutput no_rows_output(const ModelConfig& config) {
  ForwardOutput out;
  out.logits = Tensor::empty({0, config.vocab_size});
  out.hidden_states = Tensor::empty({0, config.hidden_size});
  out.routed_experts =
      Tensor::empty({0, config.num_hidden_layers, config.num_experts_per_tok}, DType::I32);
  return out;
}

}  // namespace megactx

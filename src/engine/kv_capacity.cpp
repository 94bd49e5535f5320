#include "engine/kv_capacity.h"

#include <fmt/format.h>

#include "core/error.h"

namespace megactx {

const char* kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::F32:
      return "f32";
    case KvDType::BF16:
      return "bf16";
    case KvDType::FP8:
      return "fp8";
  }
  return "?";
}

std::string KvCapacityPlan::summary() const {
  return fmt::format(
      "KV cache: {} pages x {} tokens = {} tokens max; {} latent + {} indexer pools ({}), "
      "{} B/token, {:.2f} GiB",
      spec.num_pages, spec.page_size, max_tokens, spec.latent_layers.size(),
      spec.indexer_layers.size(), kv_dtype_name(spec.dtype), bytes_per_token,
      static_cast<double>(total_bytes) / (1024.0 * 1024.0 * 1024.0));
}

KvCapacityPlan plan_kv_capacity(const ModelConfig& model, KvDType dtype, int64_t memory_bytes,
                                int64_t page_size, bool with_mtp_layer) {
  MEGACTX_CHECK(page_size > 0, "invalid KV page size {}", page_size);
  MEGACTX_CHECK(model.num_hidden_layers > 0, "model has no layers");
  MEGACTX_CHECK(static_cast<int64_t>(model.indexer_types.size()) == model.num_hidden_layers,
                "model config: indexer schedule has {} entries for {} layers",
                model.indexer_types.size(), model.num_hidden_layers);
  MEGACTX_CHECK(!with_mtp_layer || model.num_nextn_predict_layers > 0,
                "speculative decoding needs an MTP layer, the model has none");
  KvCapacityPlan plan;
  KvCacheSpec& spec = plan.spec;
  spec.page_size = page_size;
  spec.kv_lora_rank = model.kv_lora_rank;
  spec.qk_rope_head_dim = model.qk_rope_head_dim;
  spec.index_head_dim = model.index_head_dim;
  spec.dtype = dtype;
  for (int64_t layer = 0; layer < model.num_hidden_layers; ++layer) {
    spec.latent_layers.push_back(layer);
    if (model.layer_runs_indexer(layer)) spec.indexer_layers.push_back(layer);
  }
  if (with_mtp_layer) {
    // The MTP layer is decoder layer `num_hidden_layers` and runs its own indexer.
    spec.latent_layers.push_back(model.num_hidden_layers);
    spec.indexer_layers.push_back(model.num_hidden_layers);
  }
  plan.bytes_per_page = spec.bytes_per_page();
  MEGACTX_CHECK(plan.bytes_per_page > 0, "KV page size computes to 0 bytes");
  spec.num_pages = memory_bytes / plan.bytes_per_page;
  MEGACTX_CHECK(spec.num_pages > 0,
                "KV memory budget of {} bytes holds no page ({} bytes per page of {} tokens)",
                memory_bytes, plan.bytes_per_page, page_size);
  MEGACTX_CHECK(spec.num_pages <= INT32_MAX, "KV memory budget gives too many pages ({})",
                spec.num_pages);
  plan.bytes_per_token = plan.bytes_per_page / page_size;
  plan.total_bytes = spec.num_pages * plan.bytes_per_page;
  plan.max_tokens = spec.num_pages * page_size;
  return plan;
}

}  // namespace megactx

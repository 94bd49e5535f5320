#include "io/model_summary.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "io/tensor_layout.h"

namespace megactx {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Bytes per element of the unquantized tensors, from config.json's dtype.
int64_t stored_element_bytes(const ModelConfig& config) {
  if (config.torch_dtype == "float32") return 4;
  return 2;  // bfloat16 / float16 (and fp8 checkpoints keep the rest in bf16)
}

// Sums of absurd configs must fail cleanly rather than wrap around.
void add_checked(int64_t& sum, int64_t amount) {
  MEGACTX_CHECK(!__builtin_add_overflow(sum, amount, &sum),
                "config.json describes a model too large to count (over 2^63)");
}

struct Counts {
  int64_t total = 0, active = 0, embedding = 0, bytes = 0;
  int64_t routed = 0;  // all routed experts; a token runs num_experts_per_tok of them
};

Counts count(const ModelConfig& config, bool mtp) {
  Counts counts;
  for_each_expected_tensor(config, mtp, [&](std::vector<TensorSpec>& specs) {
    for (const auto& spec : specs) {
      const int64_t n = spec.numel();
      // The router's e_score_correction_bias is a buffer in HF (not in its
      // total_parameters) but it is stored, so it counts for bytes only.
      const bool buffer = spec.name.ends_with("e_score_correction_bias");
      if (buffer) {
        add_checked(counts.bytes, n * 4);
        continue;
      }
      add_checked(counts.total, n);
      if (spec.role == TensorRole::RoutedExpert) {
        // Each token runs num_experts_per_tok of the n_routed_experts.
        add_checked(counts.routed, n);
      } else if (spec.role == TensorRole::Embedding) {
        add_checked(counts.active, config.hidden_size);  // a token reads one row of the table
      } else {
        add_checked(counts.active, n);
      }
      if (spec.role == TensorRole::Embedding || spec.role == TensorRole::LmHead)
        add_checked(counts.embedding, n);
      if (spec.quantized && config.is_fp8_checkpoint()) {
        add_checked(counts.bytes, n + shape_numel(scale_shape(config, spec.shape)) * 4);
      } else {
        add_checked(counts.bytes, n * stored_element_bytes(config));
      }
    }
  });
  if (counts.routed > 0) {
    const __int128 chosen =
        static_cast<__int128>(counts.routed) * config.num_experts_per_tok / config.n_routed_experts;
    add_checked(counts.active, static_cast<int64_t>(chosen));
  }
  return counts;
}

std::vector<LayerRun> build_schedule(const ModelConfig& config) {
  std::vector<LayerRun> runs;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    LayerRun run{layer,
                 layer,
                 config.layer_is_moe(layer),
                 config.layer_runs_indexer(layer),
                 config.indexer_source_layer(layer),
                 false};
    if (!runs.empty()) {
      LayerRun& last = runs.back();
      // Full layers each start their own run unless the previous was full too.
      if (last.moe == run.moe && last.full_indexer == run.full_indexer &&
          (run.full_indexer || last.indexer_source == run.indexer_source)) {
        last.last = layer;
        continue;
      }
    }
    runs.push_back(run);
  }
  for (int64_t k = 0; k < config.num_nextn_predict_layers; ++k) {
    const int64_t layer = config.num_hidden_layers + k;
    runs.push_back({layer, layer, config.mtp_layer_is_moe(), true, layer, true});
  }
  return runs;
}

}  // namespace

ModelSummary summarize_model(const ModelConfig& config,
                             std::optional<uint64_t> memory_budget_bytes) {
  ModelSummary s;
  s.model_type = config.model_type_name;
  s.num_hidden_layers = config.num_hidden_layers;
  s.mtp_layers = config.num_nextn_predict_layers;
  s.schedule = build_schedule(config);
  s.full_indexer_layer_ids = config.full_indexer_layers();
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    (config.layer_is_moe(layer) ? s.moe_layers : s.dense_layers) += 1;

  const Counts main = count(config, false);
  const Counts mtp = count(config, true);
  s.params_total = main.total;
  s.params_active = main.active;
  s.params_embedding = main.embedding;
  s.params_mtp = mtp.total;
  s.params_mtp_active = mtp.active;
  s.weight_bytes = main.bytes + mtp.bytes;

  s.kv_latent_bytes_fp8 =
      config.kv_lora_rank + ceil_div(config.kv_lora_rank, 128) * 4 + config.qk_rope_head_dim * 2;
  s.kv_latent_bytes_bf16 = (config.kv_lora_rank + config.qk_rope_head_dim) * 2;
  s.kv_indexer_bytes_fp8 = config.index_head_dim + ceil_div(config.index_head_dim, 128) * 4;
  s.kv_indexer_bytes_bf16 = config.index_head_dim * 2;
  const auto full_layers = static_cast<int64_t>(s.full_indexer_layer_ids.size());
  s.kv_bytes_per_token_fp8 =
      s.kv_latent_bytes_fp8 * config.num_hidden_layers + s.kv_indexer_bytes_fp8 * full_layers;
  s.kv_bytes_per_token_bf16 =
      s.kv_latent_bytes_bf16 * config.num_hidden_layers + s.kv_indexer_bytes_bf16 * full_layers;
  // Each MTP layer caches its own latent and (it always runs its indexer) indexer key.
  s.kv_bytes_per_token_fp8_mtp =
      (s.kv_latent_bytes_fp8 + s.kv_indexer_bytes_fp8) * config.num_nextn_predict_layers;
  s.kv_bytes_per_token_bf16_mtp =
      (s.kv_latent_bytes_bf16 + s.kv_indexer_bytes_bf16) * config.num_nextn_predict_layers;
  s.memory_budget_bytes = memory_budget_bytes;
  return s;
}

uint64_t parse_memory_size(const std::string& text) {
  size_t position = 0;
  while (position < text.size() && std::isspace(static_cast<unsigned char>(text[position])))
    ++position;
  const size_t number_start = position;
  while (position < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[position])) || text[position] == '.'))
    ++position;
  MEGACTX_CHECK(position > number_start, "memory size '{}' does not start with a number", text);
  double value = 0;
  try {
    value = std::stod(text.substr(number_start, position - number_start));
  } catch (const std::exception&) {
    fail("memory size '{}' has an invalid number", text);
  }
  while (position < text.size() && std::isspace(static_cast<unsigned char>(text[position])))
    ++position;
  std::string unit;
  for (; position < text.size(); ++position)
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[position])));
  double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K" || unit == "KIB")
    scale = 1024.0;
  else if (unit == "M" || unit == "MIB")
    scale = std::pow(1024.0, 2);
  else if (unit == "G" || unit == "GIB")
    scale = std::pow(1024.0, 3);
  else if (unit == "T" || unit == "TIB")
    scale = std::pow(1024.0, 4);
  else if (unit == "KB")
    scale = 1e3;
  else if (unit == "MB")
    scale = 1e6;
  else if (unit == "GB")
    scale = 1e9;
  else if (unit == "TB")
    scale = 1e12;
  else
    fail("memory size '{}' has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)",
         text);
  const double bytes = value * scale;
  MEGACTX_CHECK(std::isfinite(bytes) && bytes < 1.8e19, "memory size '{}' is too large", text);
  return static_cast<uint64_t>(bytes);
}

nlohmann::json summary_to_json(const ModelSummary& s) {
  nlohmann::json schedule = nlohmann::json::array();
  for (const auto& run : s.schedule)
    schedule.push_back({{"first_layer", run.first},
                        {"last_layer", run.last},
                        {"mlp", run.moe ? "moe" : "dense"},
                        {"indexer", run.full_indexer ? "full" : "shared"},
                        {"indexer_source_layer", run.indexer_source},
                        {"mtp", run.mtp}});
  nlohmann::json j = {
      {"model_type", s.model_type},
      {"num_hidden_layers", s.num_hidden_layers},
      {"mtp_layers", s.mtp_layers},
      {"dense_layers", s.dense_layers},
      {"moe_layers", s.moe_layers},
      {"full_indexer_layers", static_cast<int64_t>(s.full_indexer_layer_ids.size())},
      {"shared_indexer_layers",
       s.num_hidden_layers - static_cast<int64_t>(s.full_indexer_layer_ids.size())},
      {"full_indexer_layer_ids", s.full_indexer_layer_ids},
      {"schedule", schedule},
      {"params_total", s.params_total},
      {"params_active", s.params_active},
      {"params_embedding", s.params_embedding},
      {"params_mtp", s.params_mtp},
      {"params_mtp_active", s.params_mtp_active},
      {"params_total_with_mtp", s.params_total + s.params_mtp},
      {"weight_bytes", s.weight_bytes},
      {"kv_bytes_per_token_fp8", s.kv_bytes_per_token_fp8},
      {"kv_bytes_per_token_bf16", s.kv_bytes_per_token_bf16},
      {"kv_bytes_per_token_fp8_mtp", s.kv_bytes_per_token_fp8_mtp},
      {"kv_bytes_per_token_bf16_mtp", s.kv_bytes_per_token_bf16_mtp},
      {"kv_bytes_per_token_fp8_with_mtp", s.kv_bytes_per_token_fp8 + s.kv_bytes_per_token_fp8_mtp},
      {"kv_bytes_per_token_bf16_with_mtp",
       s.kv_bytes_per_token_bf16 + s.kv_bytes_per_token_bf16_mtp},
      {"kv_latent_bytes_per_layer_fp8", s.kv_latent_bytes_fp8},
      {"kv_latent_bytes_per_layer_bf16", s.kv_latent_bytes_bf16},
      {"kv_indexer_bytes_per_layer_fp8", s.kv_indexer_bytes_fp8},
      {"kv_indexer_bytes_per_layer_bf16", s.kv_indexer_bytes_bf16},
  };
  if (s.memory_budget_bytes) {
    const uint64_t budget = *s.memory_budget_bytes;
    j["memory_budget_bytes"] = budget;
    j["tokens_fit_fp8"] = budget / static_cast<uint64_t>(s.kv_bytes_per_token_fp8);
    j["tokens_fit_bf16"] = budget / static_cast<uint64_t>(s.kv_bytes_per_token_bf16);
    j["tokens_fit_fp8_with_mtp"] =
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_fp8 + s.kv_bytes_per_token_fp8_mtp);
    j["tokens_fit_bf16_with_mtp"] =
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_bf16 + s.kv_bytes_per_token_bf16_mtp);
  }
  return j;
}

namespace {
std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.2f}K", n / 1e3);
  return std::to_string(n);
}
std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[unit]);
}
}  // namespace

std::string summary_to_text(const ModelSummary& s) {
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line(fmt::format("model_type            {}", s.model_type));
  line(fmt::format("layers                {} ({} dense, {} MoE) + {} MTP", s.num_hidden_layers,
                   s.dense_layers, s.moe_layers, s.mtp_layers));
  line(fmt::format("indexer               {} full, {} shared", s.full_indexer_layer_ids.size(),
                   s.num_hidden_layers - static_cast<int64_t>(s.full_indexer_layer_ids.size())));
  line("layer schedule:");
  for (const auto& run : s.schedule) {
    const std::string range = run.first == run.last ? fmt::format("{}", run.first)
                                                    : fmt::format("{}-{}", run.first, run.last);
    const std::string indexer =
        run.full_indexer ? std::string("indexer full")
                         : fmt::format("indexer shared (top-k of layer {})", run.indexer_source);
    line(fmt::format("  {:<9} {:<6} {}{}", range, run.moe ? "MoE" : "dense", indexer,
                     run.mtp ? "  [MTP]" : ""));
  }
  line(fmt::format("params total          {} ({}), active per token {} ({})", s.params_total,
                   human_count(s.params_total), s.params_active, human_count(s.params_active)));
  line(fmt::format("params MTP            {} ({}), active {} ({})", s.params_mtp,
                   human_count(s.params_mtp), s.params_mtp_active,
                   human_count(s.params_mtp_active)));
  line(fmt::format("weights               {}", human_bytes(static_cast<double>(s.weight_bytes))));
  line(fmt::format("KV bytes/token fp8    {} ({} x {} latent + {} x {} indexer; MTP adds {})",
                   s.kv_bytes_per_token_fp8, s.kv_latent_bytes_fp8, s.num_hidden_layers,
                   s.kv_indexer_bytes_fp8, s.full_indexer_layer_ids.size(),
                   s.kv_bytes_per_token_fp8_mtp));
  line(fmt::format("KV bytes/token bf16   {} ({} x {} latent + {} x {} indexer; MTP adds {})",
                   s.kv_bytes_per_token_bf16, s.kv_latent_bytes_bf16, s.num_hidden_layers,
                   s.kv_indexer_bytes_bf16, s.full_indexer_layer_ids.size(),
                   s.kv_bytes_per_token_bf16_mtp));
  if (s.memory_budget_bytes) {
    const uint64_t budget = *s.memory_budget_bytes;
    line(fmt::format(
        "tokens in {}  fp8 {}, bf16 {} (with MTP cache: fp8 {}, bf16 {})",
        human_bytes(static_cast<double>(budget)),
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_fp8),
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_bf16),
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_fp8 + s.kv_bytes_per_token_fp8_mtp),
        budget / static_cast<uint64_t>(s.kv_bytes_per_token_bf16 + s.kv_bytes_per_token_bf16_mtp)));
  }
  return out;
}

}  // namespace megactx

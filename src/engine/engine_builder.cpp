#include "engine/engine_builder.h"

#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "engine/kv_capacity.h"
#include "io/model_config.h"
#include "io/model_summary.h"
#include "model/group_model.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

// Stands in for tokenizer.json when only token ids go in and out (the test
// fixtures have none, or serve --skip-tokenizer-init): every token
// detokenizes to nothing, and text input is an error naming the fix.
class IdsOnlyTokenizer final : public Tokenizer {
 public:
  explicit IdsOnlyTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<TokenId> encode(std::string_view, bool) const override {
    fail(
        "this server has no tokenizer (no tokenizer.json, or --skip-tokenizer-init): "
        "send token ids (input_ids) instead of text");
  }
  std::string decode(const std::vector<TokenId>&, bool) const override { return {}; }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(TokenId) const override { return {}; }
  bool is_special(TokenId) const override { return false; }
  std::string token_bytes(TokenId) const override { return {}; }

 private:
  int64_t vocab_;
};

// Fails before the (long) load when even the GEMM weights cannot fit: float32
// in the parity mode, bf16 with --cuda-bf16, 1 B for native fp8 checkpoints.
void check_weights_fit(const ModelConfig& config, const EngineLoadOptions& options,
                       const DeviceMemoryInfo& before) {
  const int64_t parameters = summarize_model(config).params_total;
  const int64_t bytes_per_parameter = config.is_fp8_checkpoint() && options.load.cuda.fp8_native ? 1
                                      : options.load.cuda.bf16_weights                           ? 2
                                                                       : 4;
  // A rank of a parallel group holds at least its 1 / N of them (the split
  // weights' share plus the ones every rank holds whole).
  const int64_t ranks = options.load.group != nullptr ? options.load.group->size() : 1;
  const int64_t least_weight_bytes = parameters * bytes_per_parameter / ranks;
  double usable = static_cast<double>(before.free_bytes);
  if (options.engine.kv_memory_bytes <= 0) {
    usable =
        std::min(usable, options.gpu_memory_utilization * static_cast<double>(before.total_bytes));
  }
  MEGACTX_CHECK(static_cast<double>(least_weight_bytes) < usable,
                "the model does not fit on the device: its {} parameters need at least {} MiB "
                "per rank of {}, {:.0f} MiB are usable ({} of {} MiB free, "
                "--gpu-memory-utilization {})",
                parameters, least_weight_bytes >> 20, ranks, usable / (1 << 20),
                before.free_bytes >> 20, before.total_bytes >> 20, options.gpu_memory_utilization);
}

}  // namespace

LoadedEngine load_engine(const EngineLoadOptions& options) {
  const ModelConfig config = load_model_config(options.model_dir);
  LoadedEngine loaded;
  const bool has_tokenizer =
      std::filesystem::exists(std::filesystem::path(options.model_dir) / "tokenizer.json");
  if (options.tokenizer) {
    loaded.tokenizer = options.tokenizer;
  } else if (!options.skip_tokenizer && (has_tokenizer || !options.ids_only_without_tokenizer)) {
    loaded.tokenizer = Tokenizer::load(options.model_dir);
  } else {
    loaded.tokenizer = std::make_shared<IdsOnlyTokenizer>(config.vocab_size);
  }
  loaded.defaults = load_generation_defaults(options.model_dir, config.eos_token_ids);

  EngineConfig engine = options.engine;
  engine.kv_dtype = options.load.kv_dtype;
  engine.deterministic =
      options.load.deterministic;  // the model's kernels and the sampler's logprobs
  if (engine.model_dir.empty()) engine.model_dir = options.model_dir;
  ModelLoadOptions load = options.load;
  std::unique_ptr<LanguageModel> model;
  if (load.device == Device::CUDA) {
    MEGACTX_CHECK(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0,
                  "--gpu-memory-utilization must be in (0, 1], got {}",
                  options.gpu_memory_utilization);
    // What the load takes on the device is measured, not estimated: it covers
    // the weights in whatever precision the CUDA model keeps them.
    const DeviceMemoryInfo before = query_device_memory(load.cuda.device_ordinal);
    check_weights_fit(config, options, before);
    // The engine samples on the device (with data-parallel attention each
    // rank its own rows, engine/rank_sampler.h; steps that gather every row
    // on rank 0 copy them to the host first, group_model.cpp).
    load.cuda.logits_on_device = true;
    model = load_language_model(options.model_dir, load);
    // The MTP layer's weights are part of what the plan measures.
    if (engine.speculative_steps > 0) preload_cuda_mtp_layer(*model, options.model_dir);
    DeviceKvRequest request;
    request.memory = query_device_memory(load.cuda.device_ordinal);
    request.model_bytes = std::max<int64_t>(before.free_bytes - request.memory.free_bytes, 0);
    request.gpu_memory_utilization = options.gpu_memory_utilization;
    request.kv_memory_bytes = engine.kv_memory_bytes;
    request.options = cuda_scratch_options(load, model.get());
    const DeviceKvPlan plan = plan_device_kv(model->config(), engine, request);
    loaded.device_kv_plan = plan.summary();
    spdlog::info("{}", loaded.device_kv_plan);
    engine.kv_memory_bytes = plan.kv_bytes();
    if (plan.context_fitted) {
      spdlog::warn(
          "context length {} (the model's is {}): what the KV budget holds for one sequence; "
          "raise --kv-memory or --gpu-memory-utilization for more",
          plan.context, model->config().max_position_embeddings);
      engine.context_length = plan.context;
    }
  } else {
    model = load_language_model(options.model_dir, load);
    if (engine.kv_memory_bytes <= 0) engine.kv_memory_bytes = int64_t{2} << 30;
  }
  // Rank 0 of a parallel group: every cache and forward goes to the other ranks too.
  if (load.group != nullptr && load.group->size() > 1) {
    model = make_group_leader(std::move(model), *load.group, options.on_group_failure,
                              load.data_parallel_attention, load.data_parallel_size);
  }
  loaded.engine = Engine::create(engine, std::move(model), loaded.tokenizer, loaded.defaults);
  return loaded;
}

}  // namespace megactx

// megactx generate --model DIR (--prompt TEXT | --input-ids LIST)
//                  --max-new-tokens N [--temperature 0] [--seed S] [--ignore-eos]
//                  [--format ids|text] [--device cpu|cuda] [--kv-dtype f32|bf16|fp8]
//                  [--engine] [--cuda-bf16] [--cuda-fp8-upcast] [--no-cuda-graphs]
//                  [--cuda-fallback-attention] [--cuda-host-moe]
//                  [--speculative-steps K [--speculative-no-share]
//                   [--spec-verify rejection|target-only]]
// Decodes token by token through the KV cache; prints the new tokens
// (ids comma-separated, or detokenized text). With --speculative-steps K > 0
// the model's MTP layer drafts K tokens per target verification
// (engine/speculative_decoder.h) and the accepted length goes to stderr.
// --device cuda (or --engine on the CPU) runs the request through the serving
// Engine: device KV pools, the device sampler and the sampler's seeded draw,
// so a seeded request prints the same tokens on both devices. The plain CPU
// loop samples with its own std::mt19937_64 draw.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/command_registry.h"
#include "cli/cuda_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/kv_capacity.h"
#include "engine/speculative_decoder.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"
#include "tokenizer/tokenizer.h"

namespace megactx::cli {
namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string input_ids;
  int64_t max_new_tokens = 16;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::string format = "ids";
  std::string device = "cpu";
  std::string kv_dtype = "f32";
  bool engine = false;  // through the serving Engine (always on CUDA)
  CudaCliOptions cuda;
  SpeculativeCliOptions speculative;
};

// Stands in for tokenizer.json in the Engine when only ids are printed (the
// test fixtures have none): every token detokenizes to nothing.
class IdsOnlyTokenizer final : public Tokenizer {
 public:
  explicit IdsOnlyTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<TokenId> encode(std::string_view, bool) const override {
    fail("this model directory has no tokenizer.json");
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

// One request through the serving Engine, sized for exactly this sequence.
std::vector<int32_t> generate_with_engine(const GenerateOptions& options,
                                          std::unique_ptr<LanguageModel> model,
                                          const std::vector<int32_t>& ids, KvDType kv_dtype,
                                          std::shared_ptr<const Tokenizer> tokenizer,
                                          int64_t device_model_bytes,
                                          const CudaScratchOptions& scratch_options) {
  const ModelConfig& config = model->config();
  const auto prompt = static_cast<int64_t>(ids.size());
  EngineConfig engine_config;
  engine_config.run_thread = false;
  engine_config.kv_dtype = kv_dtype;
  engine_config.max_running_requests = 1;
  engine_config.max_prefill_tokens = std::min<int64_t>(prompt, 8192);
  engine_config.context_length = prompt + options.max_new_tokens;
  if (config.max_position_embeddings > 0) {
    engine_config.context_length =
        std::min(engine_config.context_length, config.max_position_embeddings);
  }
  engine_config.context_length = std::max(engine_config.context_length, prompt + 1);
  const int64_t steps = options.speculative.steps;
  if (steps > 0) {
    // MTP inside the Engine (the CUDA model, or --engine on the CPU).
    engine_config.speculative_steps = steps;
    engine_config.speculative_share = !options.speculative.no_share;
    engine_config.speculative_sampled_mode = parse_verify_mode(options.speculative.verify);
    engine_config.mtp_model_dir = options.model_dir;
    engine_config.context_length += steps;  // the drafts occupy positions
  }
  const KvCacheSpec spec = kv_cache_spec(config, kv_dtype, engine_config.page_size, steps > 0);
  const int64_t pages =
      (engine_config.context_length + engine_config.page_size - 1) / engine_config.page_size + 1;
  engine_config.kv_memory_bytes = pages * spec.bytes_per_page();
  if (model->device() == Device::CUDA) {
    DeviceKvRequest request;
    request.memory = query_device_memory();
    request.model_bytes = device_model_bytes;
    request.kv_memory_bytes = engine_config.kv_memory_bytes;
    request.options = scratch_options;
    std::fprintf(stderr, "%s\n", plan_device_kv(config, engine_config, request).summary().c_str());
  }
  if (!tokenizer) tokenizer = std::make_shared<IdsOnlyTokenizer>(config.vocab_size);
  GenerationDefaults defaults;  // the eos ids of config.json, as the plain loop stops
  for (const int64_t eos : config.eos_token_ids) {
    defaults.eos_token_ids.push_back(static_cast<int32_t>(eos));
  }
  auto engine =
      Engine::create(engine_config, std::move(model), std::move(tokenizer), std::move(defaults));
  GenerationRequest request;
  request.input_ids = ids;
  request.sampling.temperature = options.temperature;
  request.sampling.seed = options.seed;
  request.sampling.max_new_tokens = options.max_new_tokens;
  request.sampling.ignore_eos = options.ignore_eos;
  std::vector<int32_t> generated;
  std::string error;
  RequestUpdate last;
  engine->submit(std::move(request), [&](const RequestUpdate& update) {
    generated.insert(generated.end(), update.new_token_ids.begin(), update.new_token_ids.end());
    if (update.finish == FinishReason::Error || update.finish == FinishReason::Abort) {
      error = update.finish_detail.empty() ? "the request failed" : update.finish_detail;
    }
    last.spec_accept_token_num = update.spec_accept_token_num;
    last.spec_draft_token_num = update.spec_draft_token_num;
    last.spec_verify_ct = update.spec_verify_ct;
  });
  engine->run_until_idle();
  MEGACTX_CHECK(error.empty(), "generate: {}", error);
  if (steps > 0) {
    std::fprintf(stderr,
                 "speculative: k=%ld verifications=%ld drafted=%ld accepted=%ld "
                 "accepted_length=%.2f\n",
                 static_cast<long>(steps), static_cast<long>(last.spec_verify_ct),
                 static_cast<long>(last.spec_draft_token_num),
                 static_cast<long>(last.spec_accept_token_num),
                 last.spec_verify_ct > 0 ? 1.0 + static_cast<double>(last.spec_accept_token_num) /
                                                     static_cast<double>(last.spec_verify_ct)
                                         : 0.0);
  }
  return generated;
}

// MTP speculative decoding of one sequence.
std::vector<int32_t> generate_speculative(const GenerateOptions& options, LanguageModel& model,
                                          const std::vector<int32_t>& ids, KvDType kv_dtype) {
  auto* dsa = dynamic_cast<DsaModel*>(&model);
  MEGACTX_CHECK(dsa != nullptr, "--speculative-steps needs a DSA model");
  const std::unique_ptr<MtpLayer> mtp = MtpLayer::load(*dsa, options.model_dir);
  SpeculativeOptions spec;
  spec.steps = options.speculative.steps;
  spec.share = !options.speculative.no_share;
  spec.sampled_mode = parse_verify_mode(options.speculative.verify);
  spec.kv_dtype = kv_dtype;
  const int64_t positions =
      static_cast<int64_t>(ids.size()) + options.max_new_tokens + spec.steps + 2;
  spec.num_pages = (positions + 63) / 64 + 1;
  SpeculativeDecoder decoder(*dsa, mtp.get(), spec);
  SamplingParams params;
  params.temperature = options.temperature;
  params.max_new_tokens = options.max_new_tokens;
  params.ignore_eos = options.ignore_eos;
  params.seed = options.seed;
  std::vector<int32_t> eos;
  for (int64_t e : model.config().eos_token_ids) eos.push_back(static_cast<int32_t>(e));
  const int64_t id = decoder.add(ids, params, eos);
  decoder.run_to_completion();
  const SpeculativeStats& stats = decoder.stats(id);
  std::fprintf(stderr,
               "speculative: k=%ld verifications=%ld drafted=%ld accepted=%ld "
               "accepted_length=%.2f\n",
               static_cast<long>(spec.steps), static_cast<long>(stats.verify_count),
               static_cast<long>(stats.draft_tokens), static_cast<long>(stats.accepted_tokens),
               stats.accepted_length());
  return decoder.output(id);
}

int32_t pick(const float* logits, int64_t vocab, double temperature, std::mt19937_64& rng) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0.0) return static_cast<int32_t>(best);
  std::vector<double> weights(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    weights[i] = std::exp((static_cast<double>(logits[i]) - logits[best]) / temperature);
  }
  std::discrete_distribution<int64_t> distribution(weights.begin(), weights.end());
  return static_cast<int32_t>(distribution(rng));
}

void print_tokens(const GenerateOptions& options, Tokenizer* tokenizer,
                  const std::vector<int32_t>& generated);

int run_generate(const GenerateOptions& options) {
  MEGACTX_CHECK(options.prompt.empty() != options.input_ids.empty(),
                "give exactly one of --prompt and --input-ids");
  MEGACTX_CHECK(options.format == "ids" || options.format == "text",
                "unknown --format '{}' (ids or text)", options.format);
  MEGACTX_CHECK(options.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  MEGACTX_CHECK(options.temperature >= 0.0 && std::isfinite(options.temperature),
                "--temperature must be >= 0");
  std::shared_ptr<Tokenizer> tokenizer;
  if (!options.prompt.empty() || options.format == "text") {
    tokenizer = Tokenizer::load(options.model_dir);
  }
  std::vector<int32_t> ids;
  if (!options.prompt.empty()) {
    for (TokenId id : tokenizer->encode(options.prompt, /*add_special_tokens=*/true)) {
      ids.push_back(id);
    }
    MEGACTX_CHECK(!ids.empty(), "the prompt encodes to no tokens");
  } else {
    ids = parse_token_ids(options.input_ids);
  }
  ModelLoadOptions load;
  if (options.device == "cuda") {
    load.device = Device::CUDA;
  } else {
    MEGACTX_CHECK(options.device == "cpu", "unknown --device '{}' (cpu or cuda)", options.device);
  }
  load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  apply_cuda_options(options.cuda, load);
  MEGACTX_CHECK(options.speculative.steps >= 0 && options.speculative.steps <= 7,
                "--speculative-steps must be in [0, 7]");
  const bool use_engine = options.engine || load.device == Device::CUDA;
  if (use_engine) {
    int64_t device_model_bytes = 0;
    std::unique_ptr<LanguageModel> model;
    if (load.device == Device::CUDA) {
      const int64_t free_before = query_device_memory().free_bytes;
      load.cuda_logits_on_device = true;  // the Engine samples on the device
      model = load_language_model(options.model_dir, load);
      // The MTP layer's weights are part of what the plan measures.
      if (options.speculative.steps > 0) preload_cuda_mtp_layer(*model, options.model_dir);
      device_model_bytes = std::max<int64_t>(free_before - query_device_memory().free_bytes, 0);
    } else {
      model = load_language_model(options.model_dir, load);
    }
    const CudaScratchOptions scratch_options = cuda_scratch_options(load, model.get());
    std::vector<int32_t> generated;
    if (options.max_new_tokens > 0) {
      generated = generate_with_engine(options, std::move(model), ids, load.kv_dtype, tokenizer,
                                       device_model_bytes, scratch_options);
    }
    print_tokens(options, tokenizer.get(), generated);
    return 0;
  }
  const std::unique_ptr<LanguageModel> model = load_language_model(options.model_dir, load);
  const ModelConfig& config = model->config();
  const int64_t vocab = config.vocab_size;
  if (options.speculative.steps > 0 && options.max_new_tokens > 0) {
    const std::vector<int32_t> generated =
        generate_speculative(options, *model, ids, load.kv_dtype);
    print_tokens(options, tokenizer.get(), generated);
    return 0;
  }
  SequenceRunner runner(
      *model, load.kv_dtype,
      static_cast<int64_t>(ids.size()) + std::max<int64_t>(options.max_new_tokens, 1));
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> generated;
  if (options.max_new_tokens > 0) {
    Tensor logits = runner.feed(ids, /*all_logits=*/false);
    while (true) {
      const int32_t next = pick(logits.data<float>(), vocab, options.temperature, rng);
      generated.push_back(next);
      bool eos = false;
      for (int64_t e : config.eos_token_ids) eos |= e == next;
      if ((eos && !options.ignore_eos) ||
          static_cast<int64_t>(generated.size()) >= options.max_new_tokens) {
        break;
      }
      const int32_t token[1] = {next};
      logits = runner.feed(token, /*all_logits=*/false);
    }
  }
  print_tokens(options, tokenizer.get(), generated);
  return 0;
}

void print_tokens(const GenerateOptions& options, Tokenizer* tokenizer,
                  const std::vector<int32_t>& generated) {
  if (options.format == "ids") {
    std::string line;
    for (size_t i = 0; i < generated.size(); ++i) {
      line += (i ? "," : "") + std::to_string(generated[i]);
    }
    std::printf("%s\n", line.c_str());
  } else {
    std::vector<TokenId> tokens(generated.begin(), generated.end());
    std::printf("%s\n", tokenizer->decode(tokens).c_str());
  }
}

CommandRegistration registration{
    "generate", "Generate tokens (greedy at --temperature 0) through the KV cache",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<GenerateOptions>();
      command.add_option("--model", options->model_dir, "Hugging Face model directory")->required();
      command.add_option("--prompt", options->prompt, "prompt text (needs tokenizer.json)");
      command.add_option("--input-ids", options->input_ids, "comma-separated prompt token ids");
      command.add_option("--max-new-tokens", options->max_new_tokens)->capture_default_str();
      command.add_option("--temperature", options->temperature, "0: greedy")->capture_default_str();
      command.add_option("--seed", options->seed, "sampling seed")->capture_default_str();
      command.add_flag("--ignore-eos", options->ignore_eos, "keep going past EOS");
      command.add_option("--format", options->format, "ids|text")->capture_default_str();
      command.add_option("--device", options->device, "cpu|cuda")->capture_default_str();
      command.add_option("--kv-dtype", options->kv_dtype, "f32|bf16|fp8")->capture_default_str();
      command.add_flag("--engine", options->engine,
                       "run through the serving Engine and its sampler (always on CUDA)");
      add_cuda_options(command, options->cuda);
      add_speculative_options(command, options->speculative);
      return [options] { return run_generate(*options); };
    }};

}  // namespace
}  // namespace megactx::cli

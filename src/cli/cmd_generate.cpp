// megactx generate --model DIR (--prompt TEXT | --input-ids LIST)
//                  --max-new-tokens N [--temperature 0] [--seed S] [--ignore-eos]
//                  [--format ids|text] [--device cpu|cuda] [--kv-dtype f32|bf16|fp8]
//                  [--cuda-bf16] [--cuda-fp8-upcast] [--no-cuda-graphs]
//                  [--cuda-fallback-attention] [--cuda-host-moe]
//                  [--speculative-steps K [--speculative-no-share]
//                   [--spec-verify rejection|target-only]]
// One request through the serving Engine (engine/engine_builder.h), on either
// device, with a KV budget of exactly this sequence; prints the new tokens
// (ids comma-separated, or detokenized text). The engine's sampler and its
// seeded draw decide every token, so a seeded request prints the same tokens
// here, through `serve` and on both devices; generation stops at the eos ids
// of config.json and generation_config.json, as `serve` does. With
// --speculative-steps K > 0 the model's MTP layer drafts K tokens per
// verification and the accepted length goes to stderr.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command_registry.h"
#include "cli/cuda_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/engine_builder.h"
#include "engine/kv_capacity.h"
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
  CudaModelOptions cuda = command_line_cuda_defaults();
  SpeculativeCliOptions speculative;
  bool deterministic = false;
};

// The engine for one sequence of `prompt` + max_new_tokens (+ the drafts).
EngineLoadOptions one_sequence_engine(const GenerateOptions& options, int64_t prompt) {
  EngineLoadOptions load;
  load.model_dir = options.model_dir;
  if (options.device == "cuda") {
    load.load.device = Device::CUDA;
  } else {
    MEGACTX_CHECK(options.device == "cpu", "unknown --device '{}' (cpu or cuda)", options.device);
  }
  load.load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  apply_cuda_options(options.cuda, load.load);
  load.load.deterministic = options.deterministic;
  load.ids_only_without_tokenizer = options.format == "ids";

  const ModelConfig config = load_model_config(options.model_dir);
  EngineConfig& engine = load.engine;
  engine.run_thread = false;
  engine.max_running_requests = 1;
  engine.max_prefill_tokens = std::min<int64_t>(prompt, 8192);
  engine.context_length = prompt + options.max_new_tokens;
  if (config.max_position_embeddings > 0)
    engine.context_length = std::min(engine.context_length, config.max_position_embeddings);
  engine.context_length = std::max(engine.context_length, prompt + 1);
  apply_speculative_options(options.speculative, engine);
  if (engine.speculative_steps > 0) engine.context_length += engine.speculative_steps;
  const KvCacheSpec spec = make_kv_cache_spec(config, 0, load.load.kv_dtype, engine.page_size,
                                              engine.speculative_steps > 0);
  const int64_t pages = (engine.context_length + engine.page_size - 1) / engine.page_size + 1;
  engine.kv_memory_bytes = pages * spec.bytes_per_page();
  return load;
}

void print_tokens(const GenerateOptions& options, const Tokenizer& tokenizer,
                  const std::vector<int32_t>& generated) {
  if (options.format == "ids") {
    std::string line;
    for (size_t i = 0; i < generated.size(); ++i) {
      line += (i ? "," : "") + std::to_string(generated[i]);
    }
    std::printf("%s\n", line.c_str());
  } else {
    std::vector<TokenId> tokens(generated.begin(), generated.end());
    std::printf("%s\n", tokenizer.decode(tokens).c_str());
  }
}

int run_generate(const GenerateOptions& options) {
  MEGACTX_CHECK(options.prompt.empty() != options.input_ids.empty(),
                "give exactly one of --prompt and --input-ids");
  MEGACTX_CHECK(options.format == "ids" || options.format == "text",
                "unknown --format '{}' (ids or text)", options.format);
  MEGACTX_CHECK(options.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  MEGACTX_CHECK(options.temperature >= 0.0 && std::isfinite(options.temperature),
                "--temperature must be >= 0");
  MEGACTX_CHECK(options.speculative.steps >= 0 && options.speculative.steps <= 7,
                "--speculative-steps must be in [0, 7]");
  std::shared_ptr<const Tokenizer> tokenizer;
  std::vector<int32_t> ids;
  if (!options.prompt.empty()) {
    tokenizer = Tokenizer::load(options.model_dir);
    for (TokenId id : tokenizer->encode(options.prompt, /*add_special_tokens=*/true))
      ids.push_back(id);
    MEGACTX_CHECK(!ids.empty(), "the prompt encodes to no tokens");
  } else {
    ids = parse_token_ids(options.input_ids);
  }
  EngineLoadOptions load = one_sequence_engine(options, static_cast<int64_t>(ids.size()));
  load.tokenizer = tokenizer;
  LoadedEngine loaded = load_engine(load);
  std::vector<int32_t> generated;
  if (options.max_new_tokens > 0) {
    GenerationRequest request;
    request.input_ids = ids;
    request.sampling.temperature = options.temperature;
    request.sampling.seed = options.seed;
    request.sampling.max_new_tokens = options.max_new_tokens;
    request.sampling.ignore_eos = options.ignore_eos;
    std::string error;
    RequestUpdate last;
    loaded.engine->submit(std::move(request), [&](const RequestUpdate& update) {
      generated.insert(generated.end(), update.new_token_ids.begin(), update.new_token_ids.end());
      if (update.finish == FinishReason::Error || update.finish == FinishReason::Abort)
        error = update.finish_detail.empty() ? "the request failed" : update.finish_detail;
      last = update;
    });
    loaded.engine->run_until_idle();
    MEGACTX_CHECK(error.empty(), "generate: {}", error);
    if (options.speculative.steps > 0) {
      std::fprintf(
          stderr,
          "speculative: k=%ld verifications=%ld drafted=%ld accepted=%ld accepted_length=%.2f\n",
          static_cast<long>(options.speculative.steps), static_cast<long>(last.spec_verify_ct),
          static_cast<long>(last.spec_draft_token_num),
          static_cast<long>(last.spec_accept_token_num),
          last.spec_verify_ct > 0 ? 1.0 + static_cast<double>(last.spec_accept_token_num) /
                                              static_cast<double>(last.spec_verify_ct)
                                  : 0.0);
    }
  }
  print_tokens(options, *loaded.tokenizer, generated);
  return 0;
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
      add_cuda_options(command, options->cuda);
      command.add_flag("--deterministic", options->deterministic, kDeterministicHelp);
      add_speculative_options(command, options->speculative);
      return [options] { return run_generate(*options); };
    }};

}  // namespace
}  // namespace megactx::cli

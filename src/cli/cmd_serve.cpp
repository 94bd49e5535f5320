// megactx serve --model DIR [--host H] [--port P] [--device cpu|cuda]
//   [--kv-dtype bf16|fp8|f32] [--kv-memory 2GiB] [--host-kv-memory 16GiB]
//   [--gpu-memory-utilization 0.9] [--cuda-bf16]
//   [--cuda-fp8-upcast] [--no-cuda-graphs] [--cuda-fallback-attention] [--cuda-host-moe]
//   [--api-key K]
//   [--max-running-requests N] [--context-length N] [--served-model-name NAME]
//   [--max-request-bytes N] [--max-connections N] [--check-integrity]
//   [--speculative-steps K [--speculative-no-share] [--spec-verify rejection|target-only]]
// Loads the model, starts the engine and the HTTP server (OpenAI + SGLang
// native API), prints "megactx serving NAME at http://H:P" on stdout when
// ready, and runs until SIGINT/SIGTERM.
// --device cuda: the engine gets device KV pools and the device sampler; the
// pages come from the device's memory (engine/kv_capacity.h plan_device_kv:
// a fraction of the total, or exactly --kv-memory), planned and logged at
// start-up, where a model or budget that does not fit is an Error.
// --host-kv-memory: the prefix cache's host tier (engine/engine_config.h):
// evicted pages wait in that much host memory (pinned with --device cuda) for
// a prefix hit instead of being recomputed.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include <pthread.h>
#include <spdlog/spdlog.h>

#include "cli/command_registry.h"
#include "cli/cuda_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/kv_capacity.h"
#include "io/model_config.h"
#include "io/model_summary.h"
#include "model/model_loader.h"
#include "server/chat_setup.h"
#include "server/endpoints.h"
#include "server/http_server.h"
#include "server/server_state.h"
#include "tokenizer/tokenizer.h"

namespace megactx::cli {
namespace {

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string device = "cpu";
  std::string kv_dtype = "bf16";
  std::string kv_memory;       // empty: 2GiB on the CPU, the fraction's rest on CUDA
  std::string host_kv_memory;  // empty: no host tier
  double gpu_memory_utilization = 0.9;
  CudaCliOptions cuda;
  std::string api_key;
  int64_t max_running_requests = 256;
  int64_t max_prefill_tokens = 8192;
  int64_t context_length = 0;
  int64_t max_waiting_requests = 4096;
  std::string served_model_name;
  int io_threads = 2;
  int64_t max_request_bytes = 32ll << 20;
  int64_t max_connections = 8192;
  bool check_integrity = false;
  SpeculativeCliOptions speculative;
};

int run_serve(const ServeOptions& options) {
  // Signals go to the main thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const ModelConfig config = load_model_config(options.model_dir);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::load(options.model_dir);

  ModelLoadOptions load;
  if (options.device == "cuda")
    load.device = Device::CUDA;
  else if (options.device != "cpu")
    fail("unknown --device '{}' (cpu or cuda)", options.device);
  load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  const bool cuda = load.device == Device::CUDA;
  apply_cuda_options(options.cuda, load);
  const int64_t kv_memory = options.kv_memory.empty()
                                ? (cuda ? 0 : int64_t{2} << 30)
                                : static_cast<int64_t>(parse_memory_size(options.kv_memory));
  MEGACTX_CHECK(options.kv_memory.empty() || kv_memory > 0, "--kv-memory must be positive");

  EngineConfig engine_config;
  engine_config.kv_dtype = load.kv_dtype;
  engine_config.kv_memory_bytes = kv_memory;
  if (!options.host_kv_memory.empty()) {
    engine_config.host_kv_memory_bytes =
        static_cast<int64_t>(parse_memory_size(options.host_kv_memory));
    MEGACTX_CHECK(engine_config.host_kv_memory_bytes > 0, "--host-kv-memory must be positive");
  }
  engine_config.max_running_requests = options.max_running_requests;
  engine_config.max_prefill_tokens = options.max_prefill_tokens;
  engine_config.context_length = options.context_length;
  engine_config.speculative_steps = options.speculative.steps;
  engine_config.speculative_share = !options.speculative.no_share;
  engine_config.speculative_sampled_mode = parse_verify_mode(options.speculative.verify);
  engine_config.mtp_model_dir = options.model_dir;
  engine_config.check_integrity_every_step = options.check_integrity;

  std::unique_ptr<LanguageModel> model;
  if (cuda) {
    // What the load takes on the device is measured, not estimated: it
    // covers the weights in whatever precision the CUDA model keeps them.
    MEGACTX_CHECK(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0,
                  "--gpu-memory-utilization must be in (0, 1], got {}",
                  options.gpu_memory_utilization);
    const DeviceMemoryInfo before = query_device_memory();
    // Fail before the (long) load when even the GEMM weights cannot fit: the
    // CUDA model keeps them in float32, or bf16 with --cuda-bf16.
    const int64_t parameters = summarize_model(config).params_total;
    // fp8 checkpoints loaded natively keep their fp8 matrices at 1 B each.
    const int64_t bytes_per_parameter = config.is_fp8_checkpoint() && !options.cuda.fp8_upcast ? 1
                                        : options.cuda.bf16                                    ? 2
                                                                                               : 4;
    const int64_t least_weight_bytes = parameters * bytes_per_parameter;
    double usable = static_cast<double>(before.free_bytes);
    if (options.kv_memory.empty()) {
      usable = std::min(usable,
                        options.gpu_memory_utilization * static_cast<double>(before.total_bytes));
    }
    MEGACTX_CHECK(static_cast<double>(least_weight_bytes) < usable,
                  "the model does not fit on the device: its {} parameters need at least {} MiB, "
                  "{:.0f} MiB are usable ({} of {} MiB free, --gpu-memory-utilization {})",
                  parameters, least_weight_bytes >> 20, usable / (1 << 20), before.free_bytes >> 20,
                  before.total_bytes >> 20, options.gpu_memory_utilization);
    load.cuda_logits_on_device = true;  // the engine samples on the device
    model = load_language_model(options.model_dir, load);
    // The MTP layer's weights are part of what the plan measures.
    if (engine_config.speculative_steps > 0) preload_cuda_mtp_layer(*model, options.model_dir);
    DeviceKvRequest request;
    request.memory = query_device_memory();
    request.model_bytes = std::max<int64_t>(before.free_bytes - request.memory.free_bytes, 0);
    request.gpu_memory_utilization = options.gpu_memory_utilization;
    request.kv_memory_bytes = kv_memory;
    request.options = cuda_scratch_options(load, model.get());
    const DeviceKvPlan plan = plan_device_kv(model->config(), engine_config, request);
    spdlog::info("{}", plan.summary());
    engine_config.kv_memory_bytes = plan.kv_bytes();
  } else {
    model = load_language_model(options.model_dir, load);
  }
  GenerationDefaults defaults = load_generation_defaults(options.model_dir, config.eos_token_ids);
  auto engine = Engine::create(engine_config, std::move(model), tokenizer, defaults);

  const std::string kv_memory_text =
      !options.kv_memory.empty() ? options.kv_memory
      : cuda                     ? std::to_string(engine_config.kv_memory_bytes >> 20) + "MiB"
                                 : "2GiB";
  server::ServerConfig server_config;
  server_config.served_model_name =
      options.served_model_name.empty() ? options.model_dir : options.served_model_name;
  server_config.model_path = options.model_dir;
  server_config.api_key = options.api_key;
  server_config.max_waiting_requests = options.max_waiting_requests;
  if (defaults.temperature) server_config.default_sampling.temperature = *defaults.temperature;
  if (defaults.top_p) server_config.default_sampling.top_p = *defaults.top_p;
  if (defaults.top_k) server_config.default_sampling.top_k = *defaults.top_k;
  server_config.server_info = {
      {"device", options.device},
      {"kv_dtype", options.kv_dtype},
      {"kv_memory", kv_memory_text},
      {"host_kv_memory",
       options.host_kv_memory.empty() ? std::string("0") : options.host_kv_memory},
      {"max_running_requests", options.max_running_requests},
      {"max_prefill_tokens", options.max_prefill_tokens},
      {"speculative_steps", options.speculative.steps}};
  server::ServerState state(*engine, server_config,
                            server::load_chat_setup(options.model_dir, config.model_type_name));
  server::Router router = server::make_router(state);

  server::HttpServerOptions http;
  http.host = options.host;
  MEGACTX_CHECK(options.port >= 0 && options.port <= 65535, "--port {} is out of range",
                options.port);
  http.port = static_cast<uint16_t>(options.port);
  http.io_threads = options.io_threads;
  http.max_body_bytes = static_cast<uint64_t>(options.max_request_bytes);
  http.max_connections = options.max_connections;
  server::HttpServer server(http, [&router](const server::HttpRequest& request,
                                            std::shared_ptr<server::ResponseChannel> channel) {
    router.handle(request, std::move(channel));
  });
  server.start();
  std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  std::printf("megactx serving %s at http://%s:%u\n", server_config.served_model_name.c_str(),
              host.c_str(), server.port());
  std::fflush(stdout);
  spdlog::info("context {} tokens, KV {} pages, API key {}", engine->max_context_tokens(),
               engine->stats().kv_pages_total, options.api_key.empty() ? "off" : "on");

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("signal {}: shutting down", signal_number);
  server.stop();
  engine->abort_all();
  state.drain();
  return 0;
}

CommandRegistration registration{
    "serve", "Serve a model over HTTP (OpenAI-compatible and SGLang-native APIs)",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<ServeOptions>();
      command.add_option("--model", options->model_dir, "Hugging Face model directory")->required();
      command.add_option("--host", options->host, "Address to listen on")->capture_default_str();
      command.add_option("--port", options->port, "Port (0: any free port)")->capture_default_str();
      command.add_option("--device", options->device, "cpu|cuda")->capture_default_str();
      command.add_option("--kv-dtype", options->kv_dtype, "bf16|fp8|f32")->capture_default_str();
      command.add_option("--kv-memory", options->kv_memory,
                         "KV cache budget, e.g. 2GiB (default: 2GiB on the CPU; on CUDA what "
                         "--gpu-memory-utilization leaves)");
      command.add_option("--host-kv-memory", options->host_kv_memory,
                         "Host memory for KV pages the prefix cache evicts, e.g. 16GiB (default: "
                         "none); a later prefix hit copies them back instead of recomputing");
      command
          .add_option("--gpu-memory-utilization", options->gpu_memory_utilization,
                      "--device cuda: fraction of the device's total memory the process may use "
                      "(model, step scratch and KV pools)")
          ->capture_default_str();
      add_cuda_options(command, options->cuda);
      command.add_option("--api-key", options->api_key, "Require Authorization: Bearer KEY");
      command.add_option("--max-running-requests", options->max_running_requests)
          ->capture_default_str();
      command
          .add_option("--max-prefill-tokens", options->max_prefill_tokens,
                      "Prefill tokens per step (chunked prefill)")
          ->capture_default_str();
      command
          .add_option("--context-length", options->context_length,
                      "Longest context (0: the model's)")
          ->capture_default_str();
      command
          .add_option("--max-waiting-requests", options->max_waiting_requests,
                      "Queue limit; beyond it requests get 503")
          ->capture_default_str();
      command.add_option("--served-model-name", options->served_model_name,
                         "Model name in the OpenAI API (default: the --model path)");
      command.add_option("--io-threads", options->io_threads, "HTTP I/O threads")
          ->capture_default_str();
      command
          .add_option("--max-request-bytes", options->max_request_bytes,
                      "Larger request bodies get 413")
          ->capture_default_str();
      command
          .add_option("--max-connections", options->max_connections,
                      "Open connections beyond this get 503")
          ->capture_default_str();
      command.add_flag("--check-integrity", options->check_integrity,
                       "Check the KV pages, prefix cache and scheduler after every engine step "
                       "(slow; for soak tests and debugging: a violation is logged as an error)");
      add_speculative_options(command, options->speculative);
      return [options] { return run_serve(*options); };
    }};

}  // namespace
}  // namespace megactx::cli

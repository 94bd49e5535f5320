// megactx serve --model DIR [--host H] [--port P] [--device cpu|cuda]
//   [--kv-dtype bf16|fp8|f32] [--kv-memory 2GiB] [--host-kv-memory 16GiB]
//   [--gpu-memory-utilization 0.9] [--cuda-bf16]
//   [--cuda-fp8-upcast] [--no-cuda-graphs] [--cuda-fallback-attention] [--cuda-host-moe]
//   [--base-gpu-id N] [--gpu-id-step N] [--cuda-collectives nccl|host]
//   [--api-key K]
//   [--max-running-requests N] [--context-length N] [--index-topk N] [--served-model-name NAME]
//   [--max-request-bytes N] [--max-connections N] [--check-integrity] [--deterministic]
//   [--enable-return-routed-experts] [--enable-return-hidden-states] [--enable-memory-saver]
//   [--skip-tokenizer-init] [--load-format auto|dummy]
//   [--tensor-parallel-size N [--expert-parallel-size N]
//   [--enable-layer-split | --split-indexer |
//    --enable-dp-attention [--data-parallel-size D] [--load-balance-method M]
//    [--moe-dispatch auto|all-to-all|gathered]]]
//   [--context-parallel-size N [--expert-parallel-size N |
//                               --tensor-parallel-size T [--expert-parallel-size T | N x T]]]
//   [--speculative-steps K [--speculative-no-share] [--spec-verify rejection|target-only]]
//   [--weight-update-python PYTHON] [--weight-update-timeout S]
//   [--gateway-guard off|flag|intercept] [--gateway-rules FILE] [--gateway-judge-url self|off|URL]
//   [--gateway-judge-model M] [--gateway-judge-api-key K] [--gateway-intercept-text TEXT]
//   [--gateway-max-sessions N] [--gateway-max-memory 1GiB] [--gateway-idle-seconds S]
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
// --load-format dummy (SGLang's): random weights from the config.json in
// --model's folder (no weights read; a tokenizer.json there is used); with an fp8
// quantization_config and --device cuda, random e4m3 weights in 128 x 128
// blocks, each rank of a group making its own share: benchmarks of models
// whose checkpoints are not at hand (GLM-5.2-FP8 on 8 GPUs,
// tools/bench/multi_gpu_bench.py).
// --tensor-parallel-size N: N processes, this one and N - 1 forked workers
// (cli/serve_group.h), each with its share of the heads and MLP widths (with
// --device cuda rank r on GPU --base-gpu-id + r x --gpu-id-step, its sums over
// NCCL; the layouts below but the split indexer, the experts over every
// context share and LayerSplit beside DP attention or context parallelism,
// none of it run on a GPU yet: docs/parallel.md);
// --expert-parallel-size N (= N) shards the routed experts over them instead of their widths;
// --enable-layer-split keeps each layer's KV caches on one rank of them (model_plan.h:
// ModelPlan::kv_owner), which sends the entries a step selected to the others.
// --context-parallel-size N: N processes with the whole model, each prefill step's
// rows split over them (the new latents and indexer keys gathered into every rank's cache); with
// --expert-parallel-size N (= N) each rank holds 1 / N of the routed experts and its rows reach
// them by all-to-all; with --tensor-parallel-size T, N x T processes: N context shares of T
// tensor-parallel ranks each, the experts (--expert-parallel-size) over each share's T ranks or,
// with N x T, over the whole group (each MoE layer gathers the shares' rows).
// --enable-dp-attention (with --expert-parallel-size N; SGLang's flag, as is
// --data-parallel-size / --dp-size, which must then be N): every rank holds
// attention and the dense weights whole and runs its own requests, in its
// own KV pages (N times the requests of one process), the routed experts
// sharded and reached by all-to-all (model/group_model.h).
// One engine and HTTP front, on this process.
// --gateway-*: the agent gateway (docs/gateway.md): chat requests with an
// X-Session-Id header are recorded as trajectories, their tool calls screened.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "cli/command_registry.h"
#include "cli/cuda_options.h"
#include "cli/serve_group.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/engine_builder.h"
#include "gateway/gateway.h"
#include "io/model_config.h"
#include "io/model_summary.h"
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
  std::string kv_memory;           // empty: 2GiB on the CPU, the fraction's rest on CUDA
  std::string host_kv_memory;      // empty: no host tier
  std::string host_latent_memory;  // empty: no live host tier
  int64_t host_latent_min_tokens = 0;
  double gpu_memory_utilization = 0.9;
  CudaModelOptions cuda = command_line_cuda_defaults();
  std::string api_key;
  int64_t max_running_requests = 256;
  int64_t max_prefill_tokens = 8192;
  int64_t max_logit_rows = 0;
  int64_t context_length = 0;
  int64_t index_topk = 0;  // 0: the model's
  int64_t max_waiting_requests = 4096;
  std::string served_model_name;
  int io_threads = 2;
  int64_t max_request_bytes = 32ll << 20;
  int64_t max_connections = 8192;
  bool check_integrity = false;
  bool deterministic = false;
  bool enable_return_routed_experts = false;
  bool enable_return_hidden_states = false;
  bool enable_memory_saver = false;
  bool skip_tokenizer_init = false;
  std::string load_format = "auto";  // auto: the checkpoint; dummy: random weights
  SpeculativeCliOptions speculative;
  gateway::GatewayConfig gateway;
  std::string gateway_guard = "flag";
  std::string gateway_max_memory = "1GiB";
  int tensor_parallel_size = 1;
  int expert_parallel_size = 1;
  int context_parallel_size = 1;
  int data_parallel_size = 1;
  bool enable_layer_split = false;
  bool enable_dp_attention = false;
  std::string load_balance_method;    // --load-balance-method (DP attention; "": cache_aware)
  std::string moe_dispatch = "auto";  // --moe-dispatch (DP attention, CP with experts split)
  bool split_indexer = false;
  std::string weight_update_python = "python3";
  double weight_update_timeout = 600;
};

int run_serve(const ServeOptions& options) {
  // Signals go to the main thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EngineLoadOptions load;
  load.model_dir = options.model_dir;
  if (options.device == "cuda")
    load.load.device = Device::CUDA;
  else if (options.device != "cpu")
    fail("unknown --device '{}' (cpu or cuda)", options.device);
  load.load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  apply_cuda_options(options.cuda, load.load);
  load.load.deterministic = options.deterministic;
  MEGACTX_CHECK(options.index_topk >= 0, "--index-topk must not be negative");
  MEGACTX_CHECK(options.index_topk == 0 || options.device == "cpu",
                "--index-topk runs on the CPU only so far (the CUDA kernels are sized for the "
                "model's top-k)");
  if (options.index_topk > 0) load.load.index_topk_override = options.index_topk;
  load.gpu_memory_utilization = options.gpu_memory_utilization;
  load.skip_tokenizer = options.skip_tokenizer_init;
  MEGACTX_CHECK(options.load_format == "auto" || options.load_format == "dummy",
                "unknown --load-format '{}' (auto: the checkpoint; dummy: random weights from "
                "config.json)",
                options.load_format);
  load.load.random_weights = options.load_format == "dummy";
  // A config.json alone serves token ids (as --skip-tokenizer-init).
  load.ids_only_without_tokenizer = load.load.random_weights;
  MEGACTX_CHECK(!load.load.random_weights || options.speculative.steps == 0,
                "--speculative-steps with --load-format dummy: the MTP layer is read from the "
                "checkpoint, which a dummy load does not have");

  // The serving group, forked before any thread starts (its ranks load the
  // same model with the same options); it outlives the engine below.
  MEGACTX_CHECK(options.tensor_parallel_size >= 1, "--tensor-parallel-size must be positive");
  // Experts are sharded over the serving group: the tensor-parallel one, or
  // the context-parallel one (each rank's rows reach their experts by
  // all-to-all); with both, over each context share's tensor-parallel ranks
  // (--expert-parallel-size T) or over the whole group of C x T ranks
  // (--expert-parallel-size C x T: 1 / (C x T) of the experts per rank, every
  // share's rows gathered for them).
  const bool context_and_tensor =
      options.context_parallel_size > 1 && options.tensor_parallel_size > 1;
  const int sharding_group =
      context_and_tensor ? options.tensor_parallel_size
                         : std::max(options.tensor_parallel_size, options.context_parallel_size);
  const int whole_group = options.tensor_parallel_size * options.context_parallel_size;
  const bool experts_over_group = context_and_tensor && options.expert_parallel_size == whole_group;
  if (context_and_tensor) {
    MEGACTX_CHECK(options.expert_parallel_size == 1 ||
                      options.expert_parallel_size == sharding_group || experts_over_group,
                  "--expert-parallel-size {} must be 1, {} (the experts sharded over each context "
                  "share's tensor-parallel ranks) or {} (over the whole group)",
                  options.expert_parallel_size, sharding_group, whole_group);
  } else {
    MEGACTX_CHECK(
        options.expert_parallel_size == 1 || options.expert_parallel_size == sharding_group,
        "--expert-parallel-size {} must be 1 or {} (experts are sharded over the "
        "tensor-parallel group, else the context-parallel one)",
        options.expert_parallel_size, sharding_group);
  }
  if (options.enable_layer_split) {
    // LayerSplit is the tensor-parallel group's: what it cannot combine with
    // is refused here rather than silently left replicated.
    MEGACTX_CHECK(
        !options.enable_dp_attention || (options.data_parallel_size > 1 &&
                                         options.data_parallel_size < options.tensor_parallel_size),
        "--enable-layer-split splits the caches of one set of requests over "
        "tensor-parallel ranks: with --enable-dp-attention it needs replicas of "
        "several ranks (--data-parallel-size below --tensor-parallel-size)");
    MEGACTX_CHECK(options.tensor_parallel_size > 1,
                  "--enable-layer-split splits each layer's KV cache over the tensor-parallel "
                  "group: it needs --tensor-parallel-size 2 or more");
    MEGACTX_CHECK(options.device == "cpu" ||
                      (options.context_parallel_size == 1 && options.host_latent_memory.empty()),
                  "--enable-layer-split with --device cuda: over tensor parallelism (or each "
                  "replica's tensor ranks with --enable-dp-attention) only so far (with "
                  "--context-parallel-size or --host-latent-memory it runs on the CPU)");
  }
  DpLoadBalance load_balance = DpLoadBalance::CacheAware;             // --load-balance-method
  load.load.moe_dispatch = parse_moe_dispatch(options.moe_dispatch);  // a bad name: an Error first
  if (options.enable_dp_attention) {
    // Data-parallel attention is the tensor-parallel group's ranks each with
    // their own requests: what it cannot combine with yet is refused here.
    const int n = options.tensor_parallel_size;
    MEGACTX_CHECK(n > 1,
                  "--enable-dp-attention runs one rank per --tensor-parallel-size process: it "
                  "needs --tensor-parallel-size 2 or more");
    MEGACTX_CHECK(
        options.expert_parallel_size == n,
        "--enable-dp-attention needs --expert-parallel-size {} (= --tensor-parallel-size): "
        "the routed experts are sharded over the ranks, every other weight is whole on "
        "each",
        n);
    // --data-parallel-size D below N (SGLang's --dp-size under --tp-size):
    // D replicas of N / D tensor-parallel ranks each.
    const int replicas = options.data_parallel_size == 1 ? n : options.data_parallel_size;
    MEGACTX_CHECK(replicas >= 1 && replicas <= n && n % replicas == 0,
                  "--data-parallel-size {} must divide --tensor-parallel-size {} with "
                  "--enable-dp-attention (replicas of --tensor-parallel-size / "
                  "--data-parallel-size ranks each)",
                  options.data_parallel_size, n);
    MEGACTX_CHECK(options.context_parallel_size == 1,
                  "--enable-dp-attention is not combined with --context-parallel-size");
    // A bad method name is a start-up error before the group forks.
    if (!options.load_balance_method.empty())
      load_balance = parse_dp_load_balance(options.load_balance_method);
  } else {
    MEGACTX_CHECK(options.moe_dispatch == "auto" ||
                      (options.context_parallel_size > 1 && options.tensor_parallel_size == 1 &&
                       options.expert_parallel_size == options.context_parallel_size),
                  "--moe-dispatch chooses how the MoE layers reach experts sharded over the "
                  "ranks by all-to-all: it needs --enable-dp-attention, or "
                  "--context-parallel-size N --expert-parallel-size N");
    MEGACTX_CHECK(options.load_balance_method.empty(),
                  "--load-balance-method picks a data-parallel rank for each request: it needs "
                  "--enable-dp-attention");
    MEGACTX_CHECK(options.data_parallel_size == 1,
                  "--data-parallel-size {} needs --enable-dp-attention (replicas of the whole "
                  "model behind one front are not served)",
                  options.data_parallel_size);
  }
  // On GPUs: tensor parallelism, expert parallelism over it and
  // data-parallel attention, one process per GPU (--base-gpu-id,
  // --gpu-id-step); the other layouts are refused here, before the group
  // forks (and by the loader).
  MEGACTX_CHECK(!options.split_indexer || options.device == "cpu",
                "--split-indexer runs on the CPU only so far (the CUDA model's groups are "
                "tensor, expert and data parallel)");
  MEGACTX_CHECK(options.context_parallel_size >= 1, "--context-parallel-size must be positive");
  if (options.context_parallel_size > 1) {
    MEGACTX_CHECK(options.device == "cpu" || !experts_over_group,
                  "--context-parallel-size with the experts over the whole group "
                  "(--expert-parallel-size C x T) runs on the CPU only so far (on GPUs the "
                  "experts go over each share's tensor ranks: --expert-parallel-size T)");
  }
  load.load.expert_parallel = options.expert_parallel_size > 1;
  load.load.context_parallel = options.context_parallel_size > 1;
  // Context shares of tensor-parallel ranks: C x T processes, the tensor
  // rank innermost (ParallelLayout).
  load.load.context_parallel_size = options.context_parallel_size;
  load.load.experts_over_group = experts_over_group;
  load.load.layer_split = options.enable_layer_split;
  MEGACTX_CHECK(!options.split_indexer || options.tensor_parallel_size > 1,
                "--split-indexer splits the indexer's heads over the tensor-parallel group: it "
                "needs --tensor-parallel-size 2 or more");
  load.load.split_indexer = options.split_indexer;
  load.load.data_parallel_attention = options.enable_dp_attention;
  // Replicas of the attention: one per rank unless --data-parallel-size is below it.
  load.load.data_parallel_size = options.enable_dp_attention && options.data_parallel_size > 1
                                     ? options.data_parallel_size
                                     : 0;
  const int group_size = options.tensor_parallel_size * options.context_parallel_size;
  std::unique_ptr<ServeGroup> group;
  // A group that lost a rank cannot serve: the server shuts down (exit 1).
  static std::atomic<bool> group_failed{false};
  if (group_size > 1) {
    group = std::make_unique<ServeGroup>(group_size, options.model_dir, load.load);
    load.load.group = &group->communicator();
    load.on_group_failure = [](const std::string& reason) {
      spdlog::error("the serving group lost a rank ({}): shutting down", reason);
      group_failed = true;
      // A moment for the requests that failed with it to get their error
      // responses, then the usual shutdown (the main thread waits for SIGTERM).
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        ::kill(::getpid(), SIGTERM);
      }).detach();
    };
  }

  EngineConfig& engine_config = load.engine;
  engine_config.kv_memory_bytes =
      options.kv_memory.empty() ? 0 : static_cast<int64_t>(parse_memory_size(options.kv_memory));
  MEGACTX_CHECK(options.kv_memory.empty() || engine_config.kv_memory_bytes > 0,
                "--kv-memory must be positive");
  if (!options.host_kv_memory.empty()) {
    engine_config.host_kv_memory_bytes =
        static_cast<int64_t>(parse_memory_size(options.host_kv_memory));
    MEGACTX_CHECK(engine_config.host_kv_memory_bytes > 0, "--host-kv-memory must be positive");
  }
  if (!options.host_latent_memory.empty()) {
    engine_config.host_latent_memory_bytes =
        static_cast<int64_t>(parse_memory_size(options.host_latent_memory));
    MEGACTX_CHECK(engine_config.host_latent_memory_bytes > 0,
                  "--host-latent-memory must be positive");
  }
  MEGACTX_CHECK(options.host_latent_min_tokens >= 0,
                "--host-latent-min-tokens must be 0 or positive, got {}",
                options.host_latent_min_tokens);
  MEGACTX_CHECK(options.host_latent_min_tokens == 0 || !options.host_latent_memory.empty(),
                "--host-latent-min-tokens needs --host-latent-memory (the live host tier)");
  engine_config.host_latent_min_tokens = options.host_latent_min_tokens;
  engine_config.max_running_requests = options.max_running_requests;
  engine_config.max_prefill_tokens = options.max_prefill_tokens;
  MEGACTX_CHECK(options.max_logit_rows >= 0, "--max-logit-rows must be 0 or positive, got {}",
                options.max_logit_rows);
  engine_config.max_logit_rows = options.max_logit_rows;
  engine_config.dp_load_balance = load_balance;
  engine_config.context_length = options.context_length;
  apply_speculative_options(options.speculative, engine_config);
  engine_config.check_integrity_every_step = options.check_integrity;
  engine_config.record_routed_experts = options.enable_return_routed_experts;
  engine_config.record_hidden_states = options.enable_return_hidden_states;

  LoadedEngine loaded = load_engine(load);
  Engine& engine = *loaded.engine;
  const ModelConfig& config = engine.model_config();
  const GenerationDefaults& defaults = loaded.defaults;
  const std::string kv_memory_text =
      !options.kv_memory.empty() ? options.kv_memory
                                 : std::to_string(engine.capacity().total_bytes >> 20) + "MiB";
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
      {"host_latent_memory",
       options.host_latent_memory.empty() ? std::string("0") : options.host_latent_memory},
      {"max_running_requests", options.max_running_requests},
      {"max_prefill_tokens", options.max_prefill_tokens},
      {"max_logit_rows", step_logit_rows(engine_config)},
      {"speculative_steps", options.speculative.steps},
      {"speculative_auto", options.speculative.automatic},
      {"deterministic", options.deterministic},
      // SGLang's server argument (slime checks that it matches its --offload-rollout);
      // megactx serves /release_memory_occupation and /resume_memory_occupation either way.
      {"enable_memory_saver", options.enable_memory_saver},
      {"enable_return_routed_experts", options.enable_return_routed_experts},
      {"enable_return_hidden_states", options.enable_return_hidden_states},
      {"tensor_parallel_size", options.tensor_parallel_size},
      {"expert_parallel_size", options.expert_parallel_size},
      {"context_parallel_size", options.context_parallel_size},
      {"enable_layer_split", options.enable_layer_split},
      {"enable_dp_attention", options.enable_dp_attention},
      {"load_balance_method", dp_load_balance_name(engine_config.dp_load_balance)},
      // The experts' all-to-all or its gathered form (none without it).
      {"moe_dispatch", options.enable_dp_attention || (options.context_parallel_size > 1 &&
                                                       options.tensor_parallel_size == 1 &&
                                                       options.expert_parallel_size > 1)
                           ? options.moe_dispatch
                           : "none"},
      {"dp_size", !options.enable_dp_attention     ? 1
                  : options.data_parallel_size > 1 ? options.data_parallel_size
                                                   : options.tensor_parallel_size}};
  MEGACTX_CHECK(options.weight_update_timeout > 0, "--weight-update-timeout must be positive");
  server_config.weight_groups.python = options.weight_update_python;
  server_config.weight_groups.timeout_s = options.weight_update_timeout;
  server_config.weight_groups.ranks = group_size;
  server_config.weight_groups.cuda = load.load.device == Device::CUDA;
  server::ServerState state(engine, server_config,
                            server::load_chat_setup(options.model_dir, config.model_type_name));
  server::Router router = server::make_router(state);
  gateway::GatewayConfig gateway_config = options.gateway;
  gateway_config.mode = gateway::parse_guard_mode(options.gateway_guard);
  gateway_config.limits.max_bytes =
      static_cast<int64_t>(parse_memory_size(options.gateway_max_memory));
  MEGACTX_CHECK(gateway_config.limits.max_sessions > 0 && gateway_config.limits.max_bytes > 0,
                "--gateway-max-sessions and --gateway-max-memory must be positive");
  std::shared_ptr<gateway::Gateway> agent_gateway =
      gateway::install_gateway(state, router, std::move(gateway_config));

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
  spdlog::info("context {} tokens, KV {} pages, API key {}", engine.max_context_tokens(),
               engine.stats().kv_pages_total, options.api_key.empty() ? "off" : "on");

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("signal {}: shutting down", signal_number);
  server.stop();
  engine.abort_all();
  state.drain();
  return group_failed ? 1 : 0;
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
      command.add_option("--host-latent-memory", options->host_latent_memory,
                         "Host memory for the latent KV of running requests (the live host tier), "
                         "e.g. 64GiB (default: none): a long request's full pages move there as it "
                         "prefills and decodes, so prompts longer than the device KV fit; its "
                         "indexer keys stay in the KV budget");
      command
          .add_option("--host-latent-min-tokens", options->host_latent_min_tokens,
                      "With --host-latent-memory: only requests with at least this many tokens "
                      "(or half the device KV) move their latents to host memory")
          ->capture_default_str();
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
          .add_option("--max-logit-rows", options->max_logit_rows,
                      "Rows of logits per step (0: 4096, raised to max-running-requests x "
                      "(1 + speculative steps)); longer scoring prefills are chunked to fit")
          ->capture_default_str();
      command
          .add_option("--context-length", options->context_length,
                      "Longest context (0: the model's, or on CUDA what the KV budget holds "
                      "for one sequence where that is less)")
          ->capture_default_str();
      command
          .add_option("--index-topk", options->index_topk,
                      "Keys each query attends to, picked by the indexer (0: the model's "
                      "index_topk); the context length or more is dense attention (ablations, "
                      "retrieval checks)")
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
      command.add_flag("--deterministic", options->deterministic, kDeterministicHelp);
      command.add_flag("--enable-memory-saver", options->enable_memory_saver,
                       "Report enable_memory_saver in /get_server_info as SGLang does (slime "
                       "compares it with its --offload-rollout); memory release and resume "
                       "work with or without it");
      command.add_flag("--enable-return-routed-experts", options->enable_return_routed_experts,
                       "Record the experts every token is routed to, so that /generate requests "
                       "may ask for return_routed_experts (MoE routing replay in RL; host memory "
                       "of layers x top_k x 4 bytes per KV token)");
      command
          .add_option("--tensor-parallel-size", options->tensor_parallel_size,
                      "Processes that share the model: heads and MLP widths split (CPU)")
          ->capture_default_str();
      command
          .add_option("--expert-parallel-size", options->expert_parallel_size,
                      "1, or the tensor- or context-parallel size: routed experts sharded over "
                      "the group (with both, the tensor-parallel size or their product: over "
                      "each context share's tensor ranks or over the whole group)")
          ->capture_default_str();
      command
          .add_option("--context-parallel-size", options->context_parallel_size,
                      "Shares of every prefill step's rows, each on a process with the whole "
                      "model or on --tensor-parallel-size processes (long prompts; CPU)")
          ->capture_default_str();
      command.add_flag("--split-indexer", options->split_indexer,
                       "Split the DSA indexer's heads over the tensor-parallel group (their "
                       "scores summed by an all_reduce over the context) instead of running it "
                       "whole on every rank (CPU)");
      command.add_flag("--enable-layer-split", options->enable_layer_split,
                       "LayerSplit: each layer's KV cache on one rank of the tensor-parallel "
                       "group, which sends the entries a step selected to the others (about "
                       "1/N of the KV memory per rank, so N times the pages of --kv-memory; "
                       "CPU)");
      command.add_flag("--enable-dp-attention", options->enable_dp_attention,
                       "Data-parallel attention with --tensor-parallel-size N "
                       "--expert-parallel-size N: each rank runs attention whole for its own "
                       "requests in its own KV pages (N times the requests), the routed experts "
                       "sharded and reached by all-to-all (CPU)");
      command.add_option("--load-balance-method", options->load_balance_method,
                         "With --enable-dp-attention: how a request is pinned to a rank, among "
                         "those where it fits now: cache_aware (default: the rank caching its "
                         "longest prefix, then the fewest running requests), round_robin, "
                         "shortest_queue (fewest running requests) or minimum_tokens (fewest "
                         "tokens of running requests)");
      command
          .add_option("--moe-dispatch", options->moe_dispatch,
                      "With --enable-dp-attention (or --context-parallel-size N "
                      "--expert-parallel-size N): how the MoE layers reach the routed experts: "
                      "all-to-all (each routed row to its expert's rank, exact sizes read on "
                      "the host), gathered (every rank's rows padded to one size and gathered "
                      "by every rank: no host read, so CUDA Graphs can hold the step) or auto "
                      "(gathered in the decode steps CUDA Graphs run, else all-to-all)")
          ->capture_default_str();
      command
          .add_option("--data-parallel-size,--dp-size", options->data_parallel_size,
                      "With --enable-dp-attention: the attention replicas (default "
                      "--tensor-parallel-size, one per rank; a divisor of it below: replicas of "
                      "--tensor-parallel-size / --data-parallel-size tensor-parallel ranks)")
          ->capture_default_str();
      command
          .add_option("--load-format", options->load_format,
                      "auto: the checkpoint's weights; dummy: random weights from config.json "
                      "(benchmarks; fp8 quantization_config: random e4m3 blocks)")
          ->capture_default_str();
      command.add_flag("--skip-tokenizer-init", options->skip_tokenizer_init,
                       "Load no tokenizer (also right for a model folder without "
                       "tokenizer.json): /generate takes input_ids and returns output_ids; "
                       "text input is a 400");
      command.add_flag("--enable-return-hidden-states", options->enable_return_hidden_states,
                       "Let /generate requests ask for return_hidden_states (the final hidden "
                       "state of every token, SGLang's format; steps that run such requests copy "
                       "their hidden states to the host, and they compute their whole prompt)");
      command
          .add_option("--weight-update-python", options->weight_update_python,
                      "The Python (with the trainer's torch) that runs the torch helpers: a "
                      "rank of an RL trainer's torch.distributed group per rank of this server "
                      "(/init_weights_update_group, /update_weights_from_distributed) and the "
                      "reader of /update_weights_from_tensor's pickled tensors")
          ->capture_default_str();
      command
          .add_option("--weight-update-timeout", options->weight_update_timeout,
                      "Seconds the trainer's group may take to form, each broadcast to arrive "
                      "and a tensor payload to be read")
          ->capture_default_str();
      add_speculative_options(command, options->speculative);
      gateway::GatewayConfig& gateway = options->gateway;
      command
          .add_option("--gateway-guard", options->gateway_guard,
                      "Tool calls of gateway sessions: off, flag (screen and record) or intercept "
                      "(a confirmed hack gets a virtual tool result)")
          ->capture_default_str();
      command.add_option("--gateway-rules", gateway.rules_file,
                         "Guard rules (JSON; default: the built-in rule sets)");
      command
          .add_option("--gateway-judge-url", gateway.judge.endpoint,
                      "Judge of flagged calls: self (this engine), off, or an OpenAI-compatible "
                      "http:// base URL")
          ->capture_default_str();
      command.add_option("--gateway-judge-model", gateway.judge.model,
                         "The model name sent to the judge endpoint");
      command.add_option("--gateway-judge-api-key", gateway.judge.api_key,
                         "Bearer key of the judge endpoint");
      command
          .add_option("--gateway-judge-timeout", gateway.judge.timeout_seconds,
                      "Seconds per judge request to an endpoint")
          ->capture_default_str();
      command
          .add_option("--gateway-judge-max-tokens", gateway.judge.max_tokens,
                      "Tokens of a verdict (a cut-off one counts as not confirmed)")
          ->capture_default_str();
      command
          .add_option("--gateway-intercept-text", gateway.intercept_text,
                      "The virtual tool result of an intercepted call")
          ->capture_default_str();
      command
          .add_option("--gateway-max-intercepts", gateway.max_intercepts_per_turn,
                      "Interceptions per client request before a call goes through")
          ->capture_default_str();
      command
          .add_option("--gateway-max-sessions", gateway.limits.max_sessions,
                      "Sessions the gateway keeps (finished ones are evicted first)")
          ->capture_default_str();
      command
          .add_option("--gateway-max-memory", options->gateway_max_memory,
                      "Memory the gateway's recorded sessions may use")
          ->capture_default_str();
      command
          .add_option("--gateway-idle-seconds", gateway.limits.idle_seconds,
                      "A session idle this long counts as finished (0: never)")
          ->capture_default_str();
      return [options] { return run_serve(*options); };
    }};

}  // namespace
}  // namespace megactx::cli

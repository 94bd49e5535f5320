// The host KV tier: what a prefix hit from host memory costs against
// recomputing the prefix (the peer) and against a hit on the device pool.
//
// One request of --prompt tokens runs cold (prefill), again (device hit),
// then after another prompt has pushed its pages out of a pool that holds
// one prompt, a third time (its full pages copied back from the host tier).
// Each is timed from submit to its first token (1 new token), median of
// --repeat rounds. Beside them: the host tier's page loads alone
// (HostKvTier::load of the prompt's pages) in GB/s against one contiguous
// copy of the same bytes in the same run (host memcpy on the CPU,
// cudaMemcpy from pinned memory on CUDA): the floor.
//
//   build/bench/engine/host_tier_bench [--model models/default] [--device cpu|cuda]
//       [--prompt 2048] [--repeat 5] [--kv-dtype bf16]
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_capacity.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"
#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/cuda_model.h"
#endif

using namespace megactx;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<int32_t> prompt_of(int64_t length, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(vocab - 2)) + 1);
  }
  return ids;
}

// Submit to first token of one request, with the engine stepped here.
double time_to_first_token(Engine& engine, std::vector<int32_t> prompt, const std::string& rid,
                           int64_t* cached_tokens) {
  GenerationRequest request;
  request.rid = rid;
  request.input_ids = std::move(prompt);
  request.sampling.temperature = 0.0;
  request.sampling.max_new_tokens = 1;
  request.sampling.ignore_eos = true;
  bool done = false;
  const auto start = Clock::now();
  engine.submit(std::move(request), [&](const RequestUpdate& update) {
    if (update.finish != FinishReason::None) {
      done = true;
      *cached_tokens = update.cached_tokens;
    }
  });
  while (!done && engine.step()) {
  }
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"host KV tier: prefix hits from host memory vs recompute"};
  std::string model_dir = "models/default";
  std::string device = "cpu";
  std::string kv_dtype_name = "bf16";
  int64_t prompt_tokens = 2048;
  int repeat = 5;
  app.add_option("--model", model_dir)->capture_default_str();
  app.add_option("--device", device, "cpu|cuda")->capture_default_str();
  app.add_option("--prompt", prompt_tokens, "prompt tokens")->capture_default_str();
  app.add_option("--repeat", repeat)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-dtype", kv_dtype_name, "bf16|fp8|f32")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  ModelLoadOptions load;
  load.kv_dtype = parse_kv_dtype(kv_dtype_name);
  if (device == "cuda") {
    load.device = Device::CUDA;
    load.cuda.bf16_weights = true;
    load.cuda.logits_on_device = true;
  } else if (device != "cpu") {
    std::fprintf(stderr, "unknown --device %s\n", device.c_str());
    return 2;
  }
  auto model = load_language_model(model_dir, load);
  const ModelConfig config = model->config();
  const int64_t page_bytes =
      plan_kv_capacity(config, load.kv_dtype, int64_t{1} << 30, 64, false).bytes_per_page;
  const int64_t prompt_pages = (prompt_tokens + 63) / 64;
  EngineConfig engine_config;
  engine_config.run_thread = false;
  engine_config.kv_dtype = load.kv_dtype;
  engine_config.max_prefill_tokens = 8192;
  // The pool holds one prompt (plus a page), the host tier all of them.
  engine_config.kv_memory_bytes = (prompt_pages + 2) * page_bytes;
  engine_config.host_kv_memory_bytes = (4 * prompt_pages + 8) * page_bytes;
  engine_config.context_length = prompt_tokens + 64;
  auto engine = Engine::create(engine_config, std::move(model), Tokenizer::load(model_dir),
                               GenerationDefaults{});
  const int64_t vocab = config.vocab_size;

  std::vector<double> cold, device_hit, host_hit;
  int64_t device_cached = 0, host_cached = 0;
  for (int round = 0; round <= repeat; ++round) {  // round 0 warms up
    const std::vector<int32_t> prompt = prompt_of(prompt_tokens, vocab, 2 * round + 1);
    const std::vector<int32_t> other = prompt_of(prompt_tokens, vocab, 2 * round + 2);
    int64_t cached = 0;
    const double t_cold =
        time_to_first_token(*engine, prompt, "cold" + std::to_string(round), &cached);
    const double t_device =
        time_to_first_token(*engine, prompt, "device" + std::to_string(round), &device_cached);
    time_to_first_token(*engine, other, "other" + std::to_string(round), &cached);
    const double t_host =
        time_to_first_token(*engine, prompt, "host" + std::to_string(round), &host_cached);
    if (round == 0) continue;
    cold.push_back(t_cold);
    device_hit.push_back(t_device);
    host_hit.push_back(t_host);
  }
  const EngineStats stats = engine->stats();

  // The tier's loads alone: the prompt's pages from a tier built here,
  // against one contiguous copy of the same bytes.
  KvCacheSpec spec = make_kv_cache_spec(config, 0, load.kv_dtype, 64, false);
  spec.num_pages = prompt_pages;
  std::unique_ptr<PagedKvCache> device_pool, host_pool;
  KvPageCopy copy = copy_kv_pages_on_host;
  std::function<void()> sync = [] {};
  std::function<void()> floor_copy;
  const auto bytes = static_cast<size_t>(prompt_pages * spec.bytes_per_page());
  std::vector<std::byte> source(bytes), destination(bytes);
  std::unique_ptr<LanguageModel> stream_model;
#if MEGACTX_HAVE_CUDA
  void* device_buffer = nullptr;
  void* pinned_buffer = nullptr;
#endif
  if (load.device == Device::CPU) {
    device_pool = std::make_unique<PagedKvCache>(spec);
    host_pool = std::make_unique<PagedKvCache>(spec);
    floor_copy = [&] { std::memcpy(destination.data(), source.data(), bytes); };
  } else {
#if MEGACTX_HAVE_CUDA
    device_pool = make_cuda_kv_cache(spec);
    host_pool = make_cuda_host_kv_cache(spec);
    // The engine's copy: asynchronous, on a CUDA model's stream.
    stream_model = load_language_model(model_dir, load);
    copy = make_cuda_kv_page_copy(*stream_model);
    sync = [] { cudaDeviceSynchronize(); };
    cudaMalloc(&device_buffer, bytes);
    cudaHostAlloc(&pinned_buffer, bytes, cudaHostAllocDefault);
    floor_copy = [&] { cudaMemcpy(device_buffer, pinned_buffer, bytes, cudaMemcpyHostToDevice); };
#endif
  }
  HostKvTier tier(*device_pool, std::move(host_pool), copy);
  // Scattered host pages into scattered device pages, as a real hit lands.
  std::vector<int32_t> host_pages(static_cast<size_t>(prompt_pages));
  std::vector<int32_t> device_pages(static_cast<size_t>(prompt_pages));
  std::iota(host_pages.begin(), host_pages.end(), 0);
  for (int64_t i = 0; i < prompt_pages; ++i) {
    device_pages[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % prompt_pages);
  }
  if (std::gcd(prompt_pages, int64_t{7}) != 1)
    std::iota(device_pages.begin(), device_pages.end(), 0);
  std::vector<double> load_s, floor_s;
  for (int round = 0; round <= repeat; ++round) {
    sync();
    auto start = Clock::now();
    tier.load(host_pages, device_pages);
    sync();
    const double t_load = seconds_since(start);
    start = Clock::now();
    floor_copy();
    sync();
    const double t_floor = seconds_since(start);
    if (round == 0) continue;
    load_s.push_back(t_load);
    floor_s.push_back(t_floor);
  }
#if MEGACTX_HAVE_CUDA
  if (device_buffer != nullptr) cudaFree(device_buffer);
  if (pinned_buffer != nullptr) cudaFreeHost(pinned_buffer);
#endif

  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("# host KV tier, %s, %s KV, prompt %ld tokens (%ld pages, %.1f MiB of KV)\n\n",
              device.c_str(), kv_dtype_name.c_str(), static_cast<long>(prompt_tokens),
              static_cast<long>(prompt_pages), static_cast<double>(bytes) / (1 << 20));
  std::printf("| first token of the prompt | median ms | cached tokens |\n|---|---|---|\n");
  std::printf("| cold (prefill; the peer) | %.2f | 0 |\n", median(cold) * 1e3);
  std::printf("| hit on the device pool | %.2f | %ld |\n", median(device_hit) * 1e3,
              static_cast<long>(device_cached));
  std::printf("| hit on the host tier | %.2f | %ld |\n\n", median(host_hit) * 1e3,
              static_cast<long>(host_cached));
  std::printf("host hit vs recompute: %.1fx faster to the first token\n",
              median(cold) / median(host_hit));
  std::printf("engine: %ld pages saved to the host, %ld loaded, %ld host-hit tokens\n\n",
              static_cast<long>(stats.host_kv_saved_pages),
              static_cast<long>(stats.host_kv_loaded_pages),
              static_cast<long>(stats.prefix_cache_host_hits));
  std::printf("| copy of the prompt's pages | median ms | GB/s |\n|---|---|---|\n");
  std::printf(
      "| HostKvTier::load (%ld pools x %ld scattered pages; one copy per pool and run) | %.3f | "
      "%.1f |\n",
      static_cast<long>(spec.latent_layers.size() + spec.indexer_layers.size()),
      static_cast<long>(prompt_pages), median(load_s) * 1e3, gb / median(load_s));
  std::printf("| one contiguous copy (the floor) | %.3f | %.1f |\n", median(floor_s) * 1e3,
              gb / median(floor_s));
  return 0;
}

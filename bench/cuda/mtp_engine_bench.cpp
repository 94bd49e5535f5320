// MTP speculative decoding on the GPU through the serving Engine:
// decode tokens/s without MTP (the baseline, same binary, same prompts) and
// with k = 1, 3, 7 draft steps, and the accepted length, at batch 1 and 16,
// on the trained default model (models/default: its MTP layer was trained
// with the target, so drafts are accepted; random weights would accept almost
// nothing).
//
//   mtp_engine_bench [--model models/default] [--batches 1,16] [--steps 0,1,3,7]
//                    [--prompt 256] [--new-tokens 256] [--repeats 2] [--precision fp32,bf16]
//                    [--kv-dtype bf16] [--no-share] [--text IDS_FILE]
//
// Prompts are windows of real text (tests/default_model/passkey_8k_ids.txt,
// tokenized by the default tokenizer). Greedy, ignore_eos. Decode time runs
// from the step where every request has its first token (prefill done) to the
// last step; decode tokens/s = tokens emitted in that window / its time.
// accepted length = 1 + accepted drafts / verifications (tokens per target
// forward of a speculating request). The floor beside each row: the decode
// tok/s of steps that only read the target's GEMM weights the batch touches
// (support/decode_bytes.h) at the read-only bandwidth measured in the same run
// (support/read_bandwidth.h), one token per sequence and step: plain decoding
// cannot pass it (KV reads only lower it); MTP can, by emitting more than one
// token per weight read.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cuda/support/decode_bytes.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "engine/kv_capacity.h"
#include "model/cuda/cuda_model.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"
#include "tokenizer/tokenizer.h"

using namespace megactx;

namespace {

struct Result {
  double decode_tokens_per_s = 0;
  double accepted_length = 0;  // 0 without MTP
  int64_t generated = 0;
  double total_s = 0;
  CudaGraphStats graphs;      // of the target model (decode and verification steps)
  CudaGraphStats mtp_graphs;  // of the MTP layer (refills and draft steps)
};

Result run(const std::string& model_dir, bool bf16, KvDType kv_dtype, int64_t batch, int64_t steps,
           bool share, const std::vector<int32_t>& text, int64_t prompt_len, int64_t new_tokens) {
  ModelLoadOptions load;
  load.device = Device::CUDA;
  load.cuda.logits_on_device = true;
  load.cuda.bf16_weights = bf16;
  auto model = load_language_model(model_dir, load);
  const LanguageModel* target = model.get();  // owned by the engine below
  EngineConfig config;
  config.run_thread = false;
  config.kv_dtype = kv_dtype;
  config.max_running_requests = batch;
  config.max_prefill_tokens = 8192;
  config.speculative_steps = steps;
  config.speculative_share = share;
  config.model_dir = model_dir;
  const int64_t per_sequence = prompt_len + new_tokens + steps + 64;
  const KvCapacityPlan plan =
      plan_kv_capacity(model->config(), kv_dtype, int64_t{1} << 30, 64, steps > 0);
  config.kv_memory_bytes = (batch * ((per_sequence + 63) / 64) + 4) * plan.bytes_per_page;
  GenerationDefaults defaults = load_generation_defaults(model_dir, model->config().eos_token_ids);
  auto engine = Engine::create(config, std::move(model), Tokenizer::load(model_dir), defaults);

  std::map<std::string, RequestUpdate> last;
  std::map<std::string, int64_t> emitted;
  for (int64_t i = 0; i < batch; ++i) {
    GenerationRequest request;
    request.rid = "r" + std::to_string(i);
    const auto offset = static_cast<std::ptrdiff_t>((i * 397) % (text.size() - prompt_len));
    request.input_ids.assign(text.begin() + offset, text.begin() + offset + prompt_len);
    request.sampling.temperature = 0.0;
    request.sampling.max_new_tokens = new_tokens;
    request.sampling.ignore_eos = true;
    engine->submit(std::move(request), [&](const RequestUpdate& update) {
      emitted[update.rid] += static_cast<int64_t>(update.new_token_ids.size());
      last[update.rid] = update;
    });
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto decode_start = start;
  int64_t at_decode_start = -1;
  while (engine->step()) {
    if (at_decode_start < 0 && static_cast<int64_t>(emitted.size()) == batch &&
        std::all_of(emitted.begin(), emitted.end(), [](const auto& e) { return e.second > 0; })) {
      decode_start = Clock::now();
      at_decode_start = 0;
      for (const auto& [rid, n] : emitted) at_decode_start += n;
    }
  }
  const auto end = Clock::now();
  Result result;
  result.graphs = cuda_graph_stats(*target);
  result.mtp_graphs = cuda_graph_stats(*target, /*mtp=*/true);
  int64_t verify = 0, accepted = 0;
  for (const auto& [rid, update] : last) {
    MEGACTX_CHECK(update.finish == FinishReason::Length, "request {} did not finish by length",
                  rid);
    result.generated += update.completion_tokens;
    verify += update.spec_verify_ct;
    accepted += update.spec_accept_token_num;
  }
  if (at_decode_start < 0) at_decode_start = result.generated;  // nothing left to decode
  const double decode_s = std::chrono::duration<double>(end - decode_start).count();
  result.decode_tokens_per_s = static_cast<double>(result.generated - at_decode_start) / decode_s;
  result.total_s = std::chrono::duration<double>(end - start).count();
  if (verify > 0) result.accepted_length = 1.0 + static_cast<double>(accepted) / verify;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = "models/default", text_path = "tests/default_model/passkey_8k_ids.txt",
              kv_text = "bf16";
  std::vector<int64_t> batches = {1, 16}, steps = {0, 1, 3, 7};
  std::vector<std::string> precisions = {"fp32", "bf16"};
  int64_t prompt_len = 256, new_tokens = 256, repeats = 2;
  bool no_share = false;
  CLI::App app{"MTP speculative decoding through the Engine on the GPU"};
  app.add_option("--model", model_dir)->capture_default_str();
  app.add_option("--text", text_path, "comma-separated prompt ids")->capture_default_str();
  app.add_option("--batches", batches)->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "speculative steps k (0: no MTP)")
      ->delimiter(',')
      ->check(CLI::Range(0, 7));
  app.add_option("--precision", precisions)->delimiter(',')->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--kv-dtype", kv_text)->capture_default_str();
  app.add_option("--prompt", prompt_len)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--new-tokens", new_tokens)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--repeats", repeats, "best of")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--no-share", no_share, "draft steps without IndexShare/KVShare");
  CLI11_PARSE(app, argc, argv);
  const bool share = !no_share;
  try {
    std::ifstream file(text_path);
    std::stringstream ids;
    ids << file.rdbuf();
    std::string ids_text = ids.str();
    while (!ids_text.empty() && std::isspace(static_cast<unsigned char>(ids_text.back())))
      ids_text.pop_back();
    const std::vector<int32_t> text = parse_token_ids(ids_text);
    MEGACTX_CHECK(static_cast<int64_t>(text.size()) > prompt_len + 1,
                  "the prompt text {} has {} tokens (run from the repository root or pass --text)",
                  text_path, text.size());
    const KvDType kv_dtype = parse_kv_dtype(kv_text);
    const ModelConfig config = load_model_config(model_dir);
    const cuda::ReadBandwidth read = cuda::measure_read_bandwidth();
    std::printf(
        "# MTP speculative decoding on the GPU: %s, prompt %ld, %ld new tokens, %s KV, "
        "IndexShare+KVShare %s, greedy\n\n",
        model_dir.c_str(), static_cast<long>(prompt_len), static_cast<long>(new_tokens),
        kv_text.c_str(), share ? "on" : "off");
    std::printf(
        "read-only bandwidth %.0f GB/s (D2D copy %.0f GB/s, read + write), measured here: the "
        "floor column is one token per sequence and step reading only the GEMM weights at it\n\n",
        read.read_gbs, read.copy_gbs);
    std::printf(
        "| precision | batch | k | decode tok/s | vs k=0 | weight-read floor tok/s | of floor | "
        "accepted length | wall s | target graph replays / eager / invalidations | MTP graph "
        "replays / eager / invalidations |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& precision : precisions) {
      for (const int64_t batch : batches) {
        double baseline = 0;
        const double floor_tok_s =
            static_cast<double>(batch) * read.read_gbs * 1e9 /
            bench::step_weight_bytes(config, batch, bench::weight_bytes_of(precision));
        for (const int64_t k : steps) {
          // Best of `repeats` runs (the first run of a process pays cuBLAS and
          // allocator warm-up).
          Result r;
          for (int64_t i = 0; i < repeats; ++i) {
            const Result once = run(model_dir, precision == "bf16", kv_dtype, batch, k, share, text,
                                    prompt_len, new_tokens);
            if (once.decode_tokens_per_s > r.decode_tokens_per_s) r = once;
          }
          if (k == 0) baseline = r.decode_tokens_per_s;
          const std::string accepted =
              k == 0 ? std::string("-") : fmt::format("{:.2f}", r.accepted_length);
          std::printf(
              "| %s | %ld | %ld | %.0f | %s | %.0f | %.1f%% | %s | %.2f | %ld / %ld / %ld | %ld / "
              "%ld / %ld |\n",
              precision.c_str(), static_cast<long>(batch), static_cast<long>(k),
              r.decode_tokens_per_s,
              baseline > 0 ? fmt::format("{:.2f}x", r.decode_tokens_per_s / baseline).c_str() : "-",
              floor_tok_s, 100.0 * r.decode_tokens_per_s / floor_tok_s, accepted.c_str(), r.total_s,
              static_cast<long>(r.graphs.replays), static_cast<long>(r.graphs.eager_steps),
              static_cast<long>(r.graphs.invalidations), static_cast<long>(r.mtp_graphs.replays),
              static_cast<long>(r.mtp_graphs.eager_steps),
              static_cast<long>(r.mtp_graphs.invalidations));
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mtp_engine_bench: %s\n", error.what());
    return 1;
  }
}

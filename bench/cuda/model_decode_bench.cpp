// Decode throughput of the whole CUDA model (model/cuda/cuda_model.h) on a
// GLM-shaped random-weight model (bench/cuda/configs/glm_1b.json: 1.19B
// parameters, 502M active per token), in the fp32 parity mode, the bf16
// mode and with native fp8 weights, at several batch sizes. Each batch
// decodes `steps` tokens per sequence after a prefill of `context` random
// tokens.
//
//   model_decode_bench --config bench/cuda/configs/glm_1b.json
//                      [--context 1024] [--steps 16] [--batches 1,16,64]
//                      [--precision fp32,bf16,fp8] [--kv-dtype bf16|fp8|f32]
//                      [--attention fast,fallback] [--fallback-attention]
//                      [--graphs on,off]
//
// --precision: "fp32" and "bf16" upload one float32 host model (random
// weights, seed 1) in float32 or bf16; "fp8" builds the model as an fp8
// checkpoint ships it (make_cuda_dsa_model_random_fp8: e4m3 projection and
// expert matrices with one float32 scale per 128x128 block, lm_head and the
// indexer's weights_proj in bf16, the rest as the bf16 mode keeps it); its
// experts are stacked at load and decode on the grouped device MoE, so its
// decode steps are CUDA Graphs too (the table and a note say when not).
// --attention picks the DSA attention path (CudaModelOptions::fast_attention):
// "fast" (the fp8 DSA kernels: indexer, radix top-k, sparse MLA; used
// only with --kv-dtype fp8, other caches always take the fallback) and/or
// "fallback" (the fp32 kernels); --fallback-attention is --attention fallback.
// Default: fast, and with --kv-dtype fp8 both, fast first.
// --graphs: decode steps replayed as CUDA Graphs (CudaModelOptions::cuda_graphs,
// "on") and/or launched kernel by kernel ("off"); default both. A row says
// "on (not used)" when no step replayed a graph (e.g. an uncapturable MoE).
//
// Printed beside each result: the bytes one decode step must read at least
// (the GEMM weights the batch touches -- expected distinct experts for
// uniform routing; 4 B per element in fp32, 2 in bf16, 1 + 4 / (128 x 128)
// for fp8 matrices -- plus each sequence's selected latent entries,
// min(context, index_topk) per layer, and its indexer keys, every key per
// full layer) and
// the GB/s that implies, against the read-only bandwidth measured in the same
// run (bench/cuda/support/read_bandwidth.h): the floor of a step is bytes /
// read bandwidth.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include "bench/cuda/support/decode_bytes.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/cuda/cuda_model.h"
#include "model/dsa_model.h"
#include "model/model_loader.h"

using namespace megactx;

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) out.push_back(item);
  return out;
}

// config.json of `path` (a file, or a model directory).
ModelConfig read_config(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return load_model_config(path);
  std::ifstream file(path);
  MEGACTX_CHECK(file.good(), "cannot read config file '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  return parse_model_config(text.str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = "bench/cuda/configs/glm_1b.json";
  int64_t context = 1024, steps = 16;
  std::string batches_text = "1,16,64", precisions_text = "fp32,bf16", kv_text = "bf16";
  std::string attention_text;  // empty: the default (see the header comment)
  std::string graphs_text = "on,off";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--fallback-attention") {
      attention_text = "fallback";
      --i;  // no value
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--config")
      config_path = value;
    else if (flag == "--context")
      context = std::stoll(value);
    else if (flag == "--steps")
      steps = std::stoll(value);
    else if (flag == "--batches")
      batches_text = value;
    else if (flag == "--precision")
      precisions_text = value;
    else if (flag == "--kv-dtype")
      kv_text = value;
    else if (flag == "--attention")
      attention_text = value;
    else if (flag == "--graphs")
      graphs_text = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    cudaDeviceProp prop{};
    MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const cuda::ReadBandwidth floor = cuda::measure_read_bandwidth();
    const double read_gbs = floor.read_gbs;
    const KvDType kv_dtype = parse_kv_dtype(kv_text);
    if (attention_text.empty())
      attention_text = kv_dtype == KvDType::FP8 ? "fast,fallback" : "fast";
    const std::vector<std::string> attentions = split(attention_text);
    for (const std::string& attention : attentions)
      MEGACTX_CHECK(attention == "fast" || attention == "fallback",
                    "--attention takes fast and/or fallback, got '{}'", attention);
    std::printf("# Whole-model decode, %s, %s\n\n", config_path.c_str(), prop.name);
    std::printf(
        "read-only bandwidth: %.0f GB/s (streaming reduction over %.0f GiB), the floor below; "
        "device-to-device copy %.0f GB/s (read + write)\n",
        read_gbs, static_cast<double>(floor.bytes) / (1 << 30), floor.copy_gbs);
    std::printf("context %lld tokens per sequence, %lld decode steps timed, KV %s\n\n",
                static_cast<long long>(context), static_cast<long long>(steps), kv_text.c_str());
    std::printf(
        "| precision | attention | graphs | batch | step ms | tokens/s | weights+KV read / step | "
        "GB/s | of read bw | floor ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
    const std::vector<std::string> graph_modes = split(graphs_text);
    for (const std::string& mode : graph_modes)
      MEGACTX_CHECK(mode == "on" || mode == "off", "--graphs takes on and/or off, got '{}'", mode);
    const std::vector<std::string> precisions = split(precisions_text);
    for (const std::string& precision : precisions)
      MEGACTX_CHECK(precision == "bf16" || precision == "fp32" || precision == "fp8",
                    "--precision takes fp32, bf16 and/or fp8, got '{}'", precision);
    // One float32 host model (random weights, seed 1), uploaded once per
    // precision x attention path; fp8 builds its own from the config.
    std::unique_ptr<LanguageModel> host;
    if (std::any_of(precisions.begin(), precisions.end(),
                    [](const std::string& p) { return p != "fp8"; })) {
      ModelLoadOptions host_load;
      host_load.random_weights = true;
      host_load.seed = 1;
      host_load.kv_dtype = kv_dtype;
      host = load_language_model(config_path, host_load);
    }
    const ModelConfig file_config = read_config(config_path);
    bool fp8_without_graphs = false;
    std::string fp8_weights_line;  // printed after the table
    for (const std::string& precision : precisions)
      for (const std::string& attention : attentions)
        for (const std::string& graphs : graph_modes) {
          CudaModelOptions options;
          options.bf16_weights = precision != "fp32";
          options.logits_on_device = true;
          options.fast_attention = attention == "fast";
          options.cuda_graphs = graphs == "on";
          // Other caches always run the fallback: one row says so.
          if (kv_dtype != KvDType::FP8 && attention == "fallback" &&
              std::find(attentions.begin(), attentions.end(), "fast") != attentions.end())
            continue;
          const std::string attention_label =
              kv_dtype == KvDType::FP8 ? attention : "fallback (KV " + kv_text + ")";
          const bool fp8 = precision == "fp8";
          auto model = fp8 ? make_cuda_dsa_model_random_fp8(file_config, /*seed=*/1, options)
                           : make_cuda_dsa_model(static_cast<const DsaModel&>(*host), options);
          const ModelConfig& config = model->config();
          const int64_t index_topk =
              fp8 ? config.index_topk : static_cast<const DsaModel&>(*host).index_topk();
          if (fp8 && fp8_weights_line.empty()) {
            const CudaWeightBytes held = cuda_weight_bytes(*model);
            char line[256];
            std::snprintf(line, sizeof(line),
                          "fp8 model: %.1f MiB of weights on the device, %.1f MiB of them e4m3 + "
                          "scales for %lld fp8 parameters.\n",
                          static_cast<double>(held.total) / 1048576.0,
                          static_cast<double>(held.fp8_matrices) / 1048576.0,
                          static_cast<long long>(held.fp8_parameters));
            fp8_weights_line = line;
          }
          std::mt19937 rng(3);
          std::uniform_int_distribution<int32_t> token(2,
                                                       static_cast<int32_t>(config.vocab_size - 1));
          for (const std::string& batch_text : split(batches_text)) {
            const int64_t batch = std::stoll(batch_text);
            const int64_t pages_per_sequence = (context + steps + 4 + 63) / 64;
            KvCacheSpec spec = make_kv_cache_spec(config, batch * pages_per_sequence, kv_dtype);
            auto cache = make_cuda_kv_cache(spec);
            std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
            for (int64_t s = 0; s < batch; ++s) {
              for (int64_t p = 0; p < pages_per_sequence; ++p) {
                tables[static_cast<size_t>(s)].push_back(
                    static_cast<int32_t>(s * pages_per_sequence + p));
              }
              std::vector<int32_t> prompt(static_cast<size_t>(context));
              for (int32_t& id : prompt) id = token(rng);
              ForwardBatch prefill;
              prefill.sequences.push_back({prompt, 0, tables[static_cast<size_t>(s)], -1});
              model->forward(prefill, *cache);
            }
            std::vector<int32_t> next(static_cast<size_t>(batch));
            auto decode = [&](int64_t position) {
              ForwardBatch step;
              for (int64_t s = 0; s < batch; ++s) {
                next[static_cast<size_t>(s)] = token(rng);
                step.sequences.push_back(
                    {std::span<const int32_t>(&next[static_cast<size_t>(s)], 1), position,
                     tables[static_cast<size_t>(s)], -1});
              }
              // A forward returning device logits does not synchronise (the
              // engine's sampler runs on its stream); wait as reading the
              // sampled ids would.
              model->forward(step, *cache);
              MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
            };
            decode(context);
            decode(context + 1);
            // Only the timed steps are profiled under `ncu --profile-from-start off`
            // (tools/bench/ncu_kernel_summary.py); no effect otherwise.
            MEGACTX_CUDA_CHECK(cudaProfilerStart());
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < steps; ++i) decode(context + 2 + i);
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            MEGACTX_CUDA_CHECK(cudaProfilerStop());
            const double step_s = seconds / static_cast<double>(steps);
            int64_t full_layers = 0;
            for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
              full_layers += config.layer_runs_indexer(layer) ? 1 : 0;
            const double kv_bytes =
                static_cast<double>(batch) *
                (static_cast<double>(std::min(context, index_topk)) *
                     static_cast<double>(spec.latent_bytes_per_token() * config.num_hidden_layers) +
                 static_cast<double>(context) *
                     static_cast<double>(spec.indexer_bytes_per_token() * full_layers));
            const double bytes =
                bench::step_weight_bytes(config, batch, bench::weight_bytes_of(precision)) +
                kv_bytes;
            const CudaGraphStats graph_stats = cuda_graph_stats(*model);
            const char* graphs_label =
                graphs == "off" ? "off" : (graph_stats.replays > 0 ? "on" : "on (not used)");
            if (fp8 && graphs == "on" && graph_stats.replays == 0) fp8_without_graphs = true;
            std::printf("| %s | %s | %s | %lld | %.2f | %.0f | %.2f GB | %.0f | %.1f%% | %.2f |\n",
                        precision.c_str(), attention_label.c_str(), graphs_label,
                        static_cast<long long>(batch), step_s * 1e3,
                        static_cast<double>(batch) / step_s, bytes / 1e9, bytes / step_s / 1e9,
                        100.0 * bytes / step_s / 1e9 / read_gbs, bytes / (read_gbs * 1e9) * 1e3);
            std::fflush(stdout);
          }
        }
    std::printf(
        "\nGB/s counts bytes read once per step; \"of read bw\" compares with the read-only "
        "bandwidth measured above. The floor is that read at that bandwidth.\n");
    std::printf("%s", fp8_weights_line.c_str());
    if (fp8_without_graphs) {
      std::printf(
          "fp8 rows with graphs \"on (not used)\": no decode step was captured as a CUDA Graph; "
          "an MoE layer took the host MoE dispatch (CudaDsaModel::moe_on_device declined its fp8 "
          "experts), which reads the expert ids back per layer.\n");
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "model_decode_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}

// CPU forward-pass benchmark (not a test): prefill and decode tokens/s of a
// random-weight GLM-shaped model, with achieved GFLOP/s beside the machine's
// measured sgemm rate (the practical ceiling of every GEMM here).
//
//   build-*/bench/cpu/bench_cpu_forward [--config bench/cpu/glm_100m.json]
//       [--prompt 512] [--decode 32] [--kv-dtype bf16]
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/dense_ops.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace {

using namespace megactx;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct TokenCost {
  double flops = 0.0;         // 2 x multiply-adds: every GEMM and attention product
  double weight_bytes = 0.0;  // fp32 weights one token touches (decode streams them all)
};

// One token at `position`, attending min(topk, position + 1) tokens.
TokenCost token_cost(const ModelConfig& c, int64_t position, int64_t topk) {
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.num_attention_heads);
  const double q_lora = static_cast<double>(c.q_lora_rank.value_or(0));
  const double qk = static_cast<double>(c.qk_head_dim());
  const double lora = static_cast<double>(c.kv_lora_rank);
  const double rope = static_cast<double>(c.qk_rope_head_dim);
  const double nope = static_cast<double>(c.qk_nope_head_dim);
  const double v = static_cast<double>(c.v_head_dim);
  const double visible = static_cast<double>(position + 1);
  const double selected = static_cast<double>(std::min<int64_t>(topk, position + 1));
  double macs = h * static_cast<double>(c.vocab_size);  // lm_head
  double attention_macs = 0.0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    macs += h * q_lora + q_lora * heads * qk + h * (lora + rope);    // q_a, q_b, kv_a
    macs += heads * nope * lora + heads * v * lora + heads * v * h;  // absorb, expand, o_proj
    attention_macs += heads * selected * (2 * lora + rope);          // scores + weighted sum
    if (c.layer_runs_indexer(layer)) {
      const double ih = static_cast<double>(c.index_n_heads);
      const double id = static_cast<double>(c.index_head_dim);
      macs += q_lora * ih * id + h * id + h * ih;
      attention_macs += ih * id * visible;
    }
    if (c.layer_is_moe(layer)) {
      const double experts = static_cast<double>(c.num_experts_per_tok + c.n_shared_experts);
      macs += h * static_cast<double>(c.n_routed_experts) +
              experts * 3 * h * static_cast<double>(c.moe_intermediate_size);
    } else {
      macs += 3 * h * static_cast<double>(c.intermediate_size);
    }
  }
  return {2 * (macs + attention_macs), 4 * macs};
}

// Streaming read rate of one large buffer (GB/s), the decode ceiling.
double measure_read_gbps() {
  std::vector<float> buffer(64 << 20, 1.0f);                                    // 256 MiB
  double sum = cblas_sasum(static_cast<int>(buffer.size()), buffer.data(), 1);  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int repeat = 0; repeat < 4; ++repeat) {
    sum += cblas_sasum(static_cast<int>(buffer.size()), buffer.data(), 1);
  }
  const double seconds = seconds_since(start);
  if (sum < 0) std::printf("%f", sum);
  return 4.0 * static_cast<double>(buffer.size()) * 4.0 / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = std::string(MEGACTX_BENCH_SOURCE_DIR) + "/glm_100m.json";
  int64_t prompt = 512, decode = 32;
  std::string kv = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--config")
      config_path = argv[i + 1];
    else if (flag == "--prompt")
      prompt = std::stoll(argv[i + 1]);
    else if (flag == "--decode")
      decode = std::stoll(argv[i + 1]);
    else if (flag == "--kv-dtype")
      kv = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  try {
    const double peak = cpu::measure_sgemm_gflops(1024, 8);
    const double read_gbps = measure_read_gbps();
    ModelLoadOptions options;
    options.random_weights = true;
    options.seed = 1;
    auto start = std::chrono::steady_clock::now();
    auto model = load_language_model(config_path, options);
    const double load_seconds = seconds_since(start);
    const ModelConfig& c = model->config();
    const int64_t topk = c.index_topk;

    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (int64_t i = 0; i < prompt; ++i)
      ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    SequenceRunner runner(*model, parse_kv_dtype(kv), prompt + decode);
    start = std::chrono::steady_clock::now();
    Tensor logits = runner.feed(ids, false);
    const double prefill_seconds = seconds_since(start);
    double prefill_flops = 0.0;
    for (int64_t p = 0; p < prompt; ++p) prefill_flops += token_cost(c, p, topk).flops;

    double decode_flops = 0.0, decode_bytes = 0.0;
    start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < decode; ++step) {
      const float* row = logits.data<float>();
      int32_t next = 0;
      for (int64_t i = 1; i < c.vocab_size; ++i)
        if (row[i] > row[next]) next = static_cast<int32_t>(i);
      const int32_t token[1] = {next};
      const TokenCost cost = token_cost(c, prompt + step, topk);
      decode_flops += cost.flops;
      decode_bytes += cost.weight_bytes;
      logits = runner.feed(token, false);
    }
    const double decode_seconds = seconds_since(start);

    std::printf(
        "model: %s, %lld layers, hidden %lld, random weights (load %.1f s), KV %s, %d threads\n",
        config_path.c_str(), static_cast<long long>(c.num_hidden_layers),
        static_cast<long long>(c.hidden_size), load_seconds, kv.c_str(),
        ThreadPool::global().size());
    std::printf("sgemm 1024^3: %.1f GFLOP/s; streaming read (sasum): %.1f GB/s\n", peak, read_gbps);
    std::printf(
        "| phase | tokens | seconds | tokens/s | GFLOP/s | sgemm GFLOP/s | of sgemm | weight "
        "GB/s | read GB/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| prefill | %lld | %.3f | %.1f | %.1f | %.1f | %.0f%% | - | - |\n",
                static_cast<long long>(prompt), prefill_seconds, prompt / prefill_seconds,
                prefill_flops / prefill_seconds / 1e9, peak,
                100.0 * prefill_flops / prefill_seconds / 1e9 / peak);
    std::printf(
        "| decode (after %lld) | %lld | %.3f | %.1f | %.1f | %.1f | %.0f%% | %.1f | %.1f |\n",
        static_cast<long long>(prompt), static_cast<long long>(decode), decode_seconds,
        decode / decode_seconds, decode_flops / decode_seconds / 1e9, peak,
        100.0 * decode_flops / decode_seconds / 1e9 / peak, decode_bytes / decode_seconds / 1e9,
        read_gbps);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}

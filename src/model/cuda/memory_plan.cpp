#include "model/cuda/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/cuda/decode_graph_plan.h"
#include "model/cuda/fast_attention_plan.h"

#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#endif

namespace megactx {
namespace {

// Bounds of kernels/cuda/moe/grouped_moe.{h,cpp}, repeated because this file
// is plain C++ (memory_plan_check compares with grouped_moe_layout in CUDA
// builds).
constexpr int64_t kMoeMaxRows = 256;
constexpr int64_t kMoeMaxPairs = 4096;
constexpr int64_t kMoeTileRowsFloat = 16;  // float32 (bf16 tiles of 32 have fewer tiles)
constexpr int64_t kMoeTileRowsFp8 = 32;
constexpr int64_t kMoePlanMaxThreads = 512;
constexpr int64_t kMoePlanSharedLimit = 48 * 1024;

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// Floats (or int32) per new token, buffer by buffer of CudaDsaModel::Scratch
// (apart from the indexer scores and the logits rows), in two parts: the
// buffers of the whole step's rows, and those of one row block of the
// attention core and the feed-forward (CudaModelOptions::row_block).
int64_t step_row_words(const ModelConfig& config, int64_t index_topk) {
  const int64_t hidden = config.hidden_size;
  const int64_t entry = config.kv_lora_rank + config.qk_rope_head_dim;
  const int64_t q_lora = config.q_lora_rank.value_or(0);
  int64_t per_token = 0;
  per_token += 3 * hidden;                          // x, h, branch
  per_token += (q_lora + entry + 127) / 128 * 128;  // q_resid, kv (fp8 stacks: whole blocks)
  per_token += config.index_n_heads * config.index_head_dim;      // indexer q
  per_token += 2 * config.index_head_dim + config.index_n_heads;  // k_raw, k, weights
  per_token += index_topk + 1;                                    // top-k, counts
  per_token += 8 + config.qk_rope_head_dim;  // ids, positions, paging, cos, sin
  return per_token;
}

int64_t block_row_words(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t heads = config.num_attention_heads;
  const int64_t qk = config.qk_nope_head_dim + config.qk_rope_head_dim;
  const int64_t lora = config.kv_lora_rank;
  const int64_t inter =
      std::max(config.intermediate_size,
               config.moe_intermediate_size * std::max<int64_t>(config.n_shared_experts, 1));
  const int64_t top_k = config.num_experts_per_tok;
  int64_t per_token = 0;
  per_token += heads * qk;                                    // q
  per_token += 2 * heads * lora + heads * config.v_head_dim;  // q_latent, o_latent, o
  per_token += 3 * inter;                                     // gate_up, act
  per_token += config.n_routed_experts + 4 * top_k;           // router logits, ids, gates, dispatch
  per_token += 3 * hidden;                                    // expert in / out, moe out
  return per_token;
}

bool has_moe_layers(const ModelConfig& config) {
  if (config.n_routed_experts <= 0) return false;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.layer_is_moe(layer)) return true;
  }
  return false;
}

// grouped_moe_supported (the bounds do not depend on the experts' kind).
bool device_moe_serves(const ModelConfig& config, int64_t rows) {
  const int64_t experts = config.n_routed_experts;
  const int64_t top_k = config.num_experts_per_tok;
  const int64_t pairs = rows * top_k;
  if (rows < 1 || experts < 1 || top_k < 1 || top_k > experts) return false;
  if (config.hidden_size < 1 || config.moe_intermediate_size < 1) return false;
  if (rows > kMoeMaxRows || pairs > kMoeMaxPairs) return false;
  if (config.hidden_size % 8 != 0 || config.moe_intermediate_size % 8 != 0) return false;
  const int64_t threads = std::min((pairs + 31) / 32 * 32, kMoePlanMaxThreads);
  return (5 + threads / 32) * experts * 4 <= kMoePlanSharedLimit;
}

// The padded bucket the largest decode graph runs: {rows, context}, or {0, 0}
// when no decode step runs as a graph.
std::pair<int64_t, int64_t> largest_graph(const ModelConfig& config,
                                          const CudaMemoryRequest& request) {
  const CudaScratchOptions& o = request.options;
  const int64_t per_sequence = o.decode_tokens_per_sequence;
  if (!o.cuda_graphs || per_sequence < 1 || per_sequence > kMaxGraphTokensPerSequence) {
    return {0, 0};
  }
  const std::vector<int64_t> buckets = decode_batch_buckets(o.cuda_graph_max_batch);
  const int64_t sequences = o.decode_sequences > 0
                                ? std::min(o.decode_sequences, o.cuda_graph_max_batch)
                                : o.cuda_graph_max_batch;
  const bool moe = has_moe_layers(config);
  // A step is captured only when every MoE layer runs on the device for its
  // rows (CudaDsaModel::ffn_capturable): the largest such bucket.
  for (auto bucket = buckets.rbegin(); bucket != buckets.rend(); ++bucket) {
    if (*bucket > batch_bucket(buckets, sequences)) continue;
    const int64_t rows = *bucket * per_sequence;
    if (!moe || (o.device_moe && device_moe_serves(config, rows))) {
      return {rows, context_bucket(request.max_context)};
    }
  }
  return {0, 0};
}

}  // namespace

int64_t cuda_step_scratch_bytes(const ModelConfig& config, int64_t tokens, int64_t max_context,
                                int64_t logit_rows, int64_t index_topk, int64_t row_block) {
  int64_t bytes = step_row_words(config, index_topk) * tokens * 4;
  bytes += block_row_words(config) * (row_block > 0 ? std::min(tokens, row_block) : tokens) * 4;
  bytes += tokens * max_context * 4;                                   // indexer scores
  bytes += logit_rows * (config.hidden_size + config.vocab_size) * 4;  // normed rows, logits
  return bytes;
}

int64_t cuda_gathered_dispatch_bytes(const ModelConfig& config, bool pair_outputs) {
  if (!has_moe_layers(config)) return 0;
  const int64_t rows = kMoeMaxRows, hidden = config.hidden_size;
  const int64_t words = rows * config.num_experts_per_tok;
  // x, mine [rows, H]; partial (summed) and received [rows, H] or, pair by
  // pair, [rows, top_k, H]; routing 2 x words twice, local ids and gates
  // words each.
  const int64_t returned = pair_outputs ? words * hidden : rows * hidden;
  return (2 * rows * hidden + 2 * returned) * 4 + 6 * words * 4;
}

int64_t cuda_device_moe_scratch_bytes(const ModelConfig& config, int64_t rows, bool fp8_experts) {
  if (!has_moe_layers(config)) return 0;
  // The largest call the grouped path takes (buffers grow to it and stay).
  int64_t largest = std::min(rows, kMoeMaxRows);
  while (largest > 0 && !device_moe_serves(config, largest)) --largest;
  if (largest == 0) return 0;
  const int64_t experts = config.n_routed_experts;
  const int64_t pairs = largest * config.num_experts_per_tok;
  // GroupedMoeLayout: tile_count [1], tiles [max_tiles, 3], pair_of [pairs],
  // counts [E], offsets [E + 1]; max_tiles = min(E, pairs) + pairs / tile rows.
  const int64_t tile_rows = fp8_experts ? kMoeTileRowsFp8 : kMoeTileRowsFloat;
  const int64_t max_tiles = std::min(experts, pairs) + pairs / tile_rows;
  const int64_t plan_ints = 1 + 3 * max_tiles + pairs + experts + experts + 1;
  const int64_t hidden = config.hidden_size, inter = config.moe_intermediate_size;
  const int64_t act_floats = pairs * inter;
  const int64_t pair_out_floats = pairs * hidden;
  int64_t bytes = 4 * (plan_ints + act_floats + pair_out_floats);
  if (fp8_experts) {
    // x_q [rows, H] e4m3, x_scale [rows, H / 128], act_q [pairs, I] e4m3,
    // act_scale [pairs, I / 128]: each 16-byte aligned.
    const auto aligned = [](int64_t n) { return (n + 15) / 16 * 16; };
    bytes += aligned(largest * hidden) + aligned(4 * largest * ((hidden + 127) / 128)) +
             aligned(pairs * inter) + aligned(4 * pairs * ((inter + 127) / 128));
  }
  return bytes;
}

int64_t cuda_gemm_input_bytes(const ModelConfig& config, int64_t rows, bool bf16, bool fp8,
                              int64_t row_block, int64_t logit_rows) {
  const int64_t hidden = config.hidden_size, q_lora = config.q_lora_rank.value_or(0);
  const int64_t inter =
      std::max(config.intermediate_size,
               config.moe_intermediate_size * std::max<int64_t>(config.n_shared_experts, 1));
  // Inputs of the whole step's rows (h into q_a, kv_a and the indexer; q_resid
  // into wq_b), of a row block (o into o_proj, the MLP activations, gathered
  // expert rows, q_resid blocks into q_b; 2 x hidden for the MTP layer's
  // eh_proj) and of the logits rows (lm_head).
  const int64_t block = row_block > 0 ? std::min(rows, row_block) : rows;
  const int64_t block_in =
      std::max({hidden, q_lora, config.num_attention_heads * config.v_head_dim, inter,
                config.num_nextn_predict_layers > 0 ? 2 * hidden : int64_t{0}});
  const int64_t widest = std::max({rows * std::max(hidden, q_lora), block * block_in,
                                   std::min(rows, std::max<int64_t>(logit_rows, 1)) * hidden});
  int64_t bytes = 0;
  // The last input Blas converted (inputs without a copy of their own), and
  // the copies the model writes beside h, q_resid (whole step) and the MLP
  // activations (a block).
  if (bf16) bytes += (widest + rows * (hidden + q_lora) + block * inter) * 2;
  // The last input quantised to e4m3, with its 1x128 group scales.
  if (fp8) bytes += widest + ((widest + 127) / 128) * 4;
  return bytes;
}

CudaScratchBreakdown cuda_scratch_breakdown(const ModelConfig& config,
                                            const CudaMemoryRequest& request) {
  const CudaScratchOptions& o = request.options;
  CudaScratchBreakdown parts;
  const auto [graph_rows, graph_context] = largest_graph(config, request);
  parts.graph_rows = graph_rows;
  parts.graph_context = graph_context;
  const int64_t tokens = std::max(request.max_step_tokens, graph_rows);
  const int64_t context = std::max(request.max_context, graph_context);
  const int64_t logit_rows = std::max(std::max<int64_t>(request.max_logit_rows, 1), graph_rows);
  // Buffer by buffer the larger of the eager step and the graph bucket: the
  // per-token buffers and the logits rows at the most rows, the scores
  // [tokens, context] at the larger product.
  const bool fast =
      cuda_fast_attention_used(config, request.kv.dtype, request.kv.page_size, o.fast_attention);
  int64_t score_floats =
      std::max(request.max_step_tokens * request.max_context, graph_rows * graph_context);
  // The fast path keeps scores only for the steps small enough for the
  // two-kernel indexer; larger ones run the fused indexer + top-k.
  if (fast) {
    score_floats = std::max(
        cuda_fast_attention_score_floats(config, request.index_topk, request.max_step_tokens,
                                         request.max_context),
        cuda_fast_attention_score_floats(config, request.index_topk, graph_rows, graph_context));
  }
  const int64_t block = o.row_block > 0 ? std::min(tokens, o.row_block) : tokens;
  parts.step = step_row_words(config, request.index_topk) * tokens * 4 +
               block_row_words(config) * block * 4 + 4 * score_floats +
               logit_rows * (config.hidden_size + config.vocab_size) * 4;
  if (fast) {
    parts.fast_attention = cuda_fast_attention_scratch_bytes(
        config, tokens, context, request.index_topk, o.multiprocessors, o.row_block);
    if (o.offload_tokens > 0) {
      // The union staging serves eager steps only (never a graph capture).
      parts.fast_attention += cuda_offload_staging_bytes(
          request.index_topk, static_cast<int64_t>(request.kv.latent_layers.size()),
          static_cast<int64_t>(request.kv.indexer_layers.size()), o.offload_tokens,
          request.max_step_tokens, block);
    }
  }
  if (o.device_moe) {
    parts.device_moe = cuda_device_moe_scratch_bytes(config, tokens, o.fp8_gemm_inputs);
    if (o.gathered_dispatch_ranks > 1 && graph_rows > 0) {
      // Graph steps take the gathered dispatch: one grouped call over every
      // rank's rows (up to the grouped path's bound).
      parts.device_moe =
          std::max(parts.device_moe,
                   cuda_device_moe_scratch_bytes(config, o.gathered_dispatch_ranks * graph_rows,
                                                 o.fp8_gemm_inputs)) +
          cuda_gathered_dispatch_bytes(config, o.gathered_dispatch_pairs);
    }
  }
  if (graph_rows > 0) {
    DecodeGraphKey key;
    key.tokens_per_sequence = o.decode_tokens_per_sequence;
    key.sequences = graph_rows / key.tokens_per_sequence;
    key.context = graph_context;
    const DecodeInputLayout layout(key, config.qk_rope_head_dim / 2, request.kv.page_size);
    parts.graph_inputs = layout.capacity_words * 4;  // DecodeGraphCache::inputs()
    parts.pinned_host = layout.capacity_words * 4;   // DecodeGraphCache::staging()
  }
  parts.gemm_inputs = cuda_gemm_input_bytes(config, tokens, o.bf16_gemm_inputs, o.fp8_gemm_inputs,
                                            o.row_block, logit_rows);
  parts.cublas_workspace = request.weights_include_workspace ? 0 : kCudaCublasWorkspaceBytes;
  return parts;
}

std::string CudaScratchBreakdown::summary() const {
  std::string text = fmt::format("step {:.1f} MiB", mib(step));
  text += fast_attention > 0 ? fmt::format(" + fast attention {:.1f} MiB", mib(fast_attention))
                             : std::string(" + fast attention 0 (fallback kernels)");
  text += device_moe > 0 ? fmt::format(" + device MoE {:.1f} MiB", mib(device_moe))
                         : std::string(" + device MoE 0 (host dispatch)");
  if (graph_rows > 0) {
    text += fmt::format(" + graph inputs {:.1f} MiB (CUDA graphs up to {} rows, context {})",
                        mib(graph_inputs), graph_rows, graph_context);
  } else {
    text += " (no CUDA graphs)";
  }
  if (gemm_inputs > 0) text += fmt::format(" + GEMM inputs {:.1f} MiB", mib(gemm_inputs));
  if (cublas_workspace > 0) {
    text += fmt::format(" + cuBLAS workspace {:.0f} MiB", mib(cublas_workspace));
  }
  if (pinned_host > 0) text += fmt::format("; {:.1f} MiB pinned host staging", mib(pinned_host));
  return text;
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& config, const CudaMemoryRequest& request) {
  MEGACTX_CHECK(request.budget_bytes > 0 && request.max_step_tokens > 0 &&
                    request.max_context > 0 && request.index_topk > 0,
                "CUDA memory plan: budget, step tokens, context and index_topk must be positive");
  MEGACTX_CHECK(request.kv.page_size > 0, "CUDA memory plan: invalid KV page size {}",
                request.kv.page_size);
  CudaMemoryPlan plan;
  plan.weight_bytes = request.weight_bytes;
  plan.scratch = cuda_scratch_breakdown(config, request);
  plan.scratch_bytes = plan.scratch.device_total();
  plan.kv_bytes_per_page = request.kv.bytes_per_page();
  const int64_t fixed = plan.weight_bytes + plan.scratch_bytes;
  MEGACTX_CHECK(fixed < request.budget_bytes,
                "CUDA model does not fit: weights {} MiB + step scratch {} MiB ({} tokens, context "
                "{}: {}) exceed the {} MiB budget",
                plan.weight_bytes >> 20, plan.scratch_bytes >> 20, request.max_step_tokens,
                request.max_context, plan.scratch.summary(), request.budget_bytes >> 20);
  MEGACTX_CHECK(plan.kv_bytes_per_page > 0, "CUDA memory plan: KV spec has no pools");
  plan.kv_pages = (request.budget_bytes - fixed) / plan.kv_bytes_per_page;
  const int64_t context_pages =
      (request.max_context + request.kv.page_size - 1) / request.kv.page_size;
  // With the live host tier a sequence's full pages move to host memory as it
  // grows: the device holds what the tier does not, plus the two pages the
  // engine keeps (the partial page and the next), and at least a few pages
  // for chunks of prefill (the scheduler shrinks a lone chunk to the room).
  const int64_t offload_pages = request.options.offload_tokens / request.kv.page_size;
  const int64_t pages_needed =
      offload_pages > 0 ? std::max<int64_t>(context_pages + 2 - offload_pages, 4) : context_pages;
  MEGACTX_CHECK(
      plan.kv_pages >= pages_needed,
      "CUDA model: {} MiB left after weights and scratch hold {} KV pages, one sequence "
      "of {} tokens needs {}{}; lower --context-length, or raise --kv-memory or "
      "--gpu-memory-utilization",
      (request.budget_bytes - fixed) >> 20, plan.kv_pages, request.max_context, pages_needed,
      offload_pages > 0 ? fmt::format(" beside {} pages of the live host tier", offload_pages)
                        : std::string{});
  return plan;
}

DeviceMemoryInfo query_device_memory(int device_ordinal) {
#if MEGACTX_HAVE_CUDA
  int devices = 0;
  MEGACTX_CUDA_CHECK(cudaGetDeviceCount(&devices));
  MEGACTX_CHECK(device_ordinal >= 0 && device_ordinal < devices,
                "CUDA device {} requested, {} present", device_ordinal, devices);
  MEGACTX_CUDA_CHECK(cudaSetDevice(device_ordinal));
  MEGACTX_CUDA_CHECK(cudaFree(nullptr));  // creates the context before measuring
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
#else
  fail("device {}: this build has no CUDA backend (configure with -DMEGACTX_CUDA=ON)",
       device_ordinal);
#endif
}

int64_t query_device_multiprocessors(int device_ordinal) {
#if MEGACTX_HAVE_CUDA
  int count = 0;
  MEGACTX_CUDA_CHECK(
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_ordinal));
  return count;
#else
  fail("device {}: this build has no CUDA backend (configure with -DMEGACTX_CUDA=ON)",
       device_ordinal);
#endif
}

}  // namespace megactx

// Benchmark of the million-token kernels on a GLM-5.2-shaped attention stack
// (64 heads, kv_lora 512, rope 64, indexer 32 x 128, top-k 2048, 78 layers,
// IndexShare freq 4 / offset 3: 21 full layers) with a synthesised fp8 KV
// cache at 8K..1M tokens. Every number is printed beside the ceilings measured
// in the same run (read-only bandwidth, cuBLAS bf16 GEMM).
//
//   dsa_attention_bench [--quick] [--min-context N] [--max-context N] [--prefill-only]
//                       [--decode-section 1|2|3]
//
// --prefill-only: only section 4 (prefill throughput of the indexer + top-k
// and of sparse MLA). --decode-section S: only decode section S (1 top-k,
// 2 sparse MLA with its split sweep, 3 the attention side), no prefill: what
// a profiler (ncu --kernel-name ...) runs, with --min-context / --max-context
// picking the contexts.
//
// Times are medians of CUDA-graph replays (events); a graph holds the kernel
// for every layer that has its own cache (21 or 78 distinct pools), so
// nothing is served from L2 that would not be in a real decode step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/support/attention_stack.h"
#include "bench/cuda/support/device_alloc.h"
#include "bench/cuda/support/gemm_ceiling.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "bench/cuda/support/stream_timing.h"
#include "bench/cuda/support/synthetic_cache.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/sparse_mla/sparse_mla.h"
#include "kernels/cuda/topk/topk.h"

using namespace megactx::cuda;

namespace {

constexpr int kLayers = 78, kHeads = 64, kIndexHeads = 32, kTopK = 2048;
constexpr int kFreq = 4, kOffset = 3;

// Median time in ms of `body` captured once into a CUDA graph and replayed.
double graph_median_ms(cudaStream_t stream, const std::function<void()>& body, int reps) {
  body();  // outside capture: first-launch set-up (function attributes)
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MEGACTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  MEGACTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MEGACTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  MEGACTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // a second warm-up: the graph's first replay
  const double ms = stream_median_ms(
      stream, [&] { MEGACTX_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, reps);
  MEGACTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MEGACTX_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms;
}

struct Ceilings {
  double read_gbs = 0;     // bytes / s of a streaming read-only reduction: the byte floor
  double copy_gbs = 0;     // (read + write) bytes / s, device-to-device (reference only)
  double bf16_tflops = 0;  // cuBLAS bf16 GEMM 8192^3
};

Ceilings measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  const ReadBandwidth read = measure_read_bandwidth(size_t{8} << 30, 10, stream);
  c.read_gbs = read.read_gbs;
  c.copy_gbs = read.copy_gbs;

  c.bf16_tflops = measure_bf16_gemm_tflops(10, stream);
  return c;
}

// Everything a decode step reads: 78 latent pools, 78 indexer pools (the
// all-full comparison needs them; IndexShare uses 21), per-layer queries.
struct Stack {
  int64_t max_tokens = 0;
  std::vector<uint8_t*> latent, indexer;
  std::vector<bool> share_schedule, all_full;
  // Per layer, for up to kMaxRows query rows:
  static constexpr int kMaxRows = 128;
  static constexpr int kMaxSelectRows = 1024;  // prefill chunks of the top-k workspace
  std::vector<uint16_t*> q, out;
  std::vector<float*> lse, indexer_weights;
  std::vector<uint8_t*> indexer_q;
  // One request spanning max_tokens over shuffled pages; extra rows reuse it.
  int32_t* block_table = nullptr;
  int block_table_stride = 0;
  int32_t* row_request = nullptr;
  int32_t* row_visible = nullptr;
  // Workspace
  float* scores = nullptr;
  int64_t score_stride = 0;
  uint32_t* histogram = nullptr;
  int32_t* row_state = nullptr;
  int32_t* slots = nullptr;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int max_splits = 64;
};

Stack build_stack(int64_t max_tokens, cudaStream_t stream) {
  Stack s;
  s.max_tokens = max_tokens;
  const int64_t pages = (max_tokens + 63) / 64;
  const int64_t slots = pages * 64;
  s.share_schedule = index_share_schedule(kLayers, kFreq, kOffset);
  s.all_full.assign(kLayers, true);
  for (int l = 0; l < kLayers; ++l) {
    s.latent.push_back(device_alloc<uint8_t>(size_t(slots) * kLatentBytes));
    fill_synthetic_latent_pool(s.latent.back(), slots, 100 + l, stream);
    s.indexer.push_back(device_alloc<uint8_t>(size_t(slots) * kIndexerKeyBytes));
    fill_synthetic_indexer_pool(s.indexer.back(), slots, 200 + l, stream);
    s.q.push_back(
        device_alloc<uint16_t>(size_t(Stack::kMaxRows) * kHeads * 2 * 576));  // room for 128 heads
    fill_random_bf16(s.q.back(), int64_t(Stack::kMaxRows) * kHeads * 2 * 576, 1.f, 300 + l, stream);
    s.out.push_back(device_alloc<uint16_t>(size_t(Stack::kMaxRows) * kHeads * 2 * 512));
    s.lse.push_back(device_alloc<float>(size_t(Stack::kMaxRows) * kHeads * 2));
    s.indexer_q.push_back(device_alloc<uint8_t>(size_t(Stack::kMaxRows) * kIndexHeads * 128));
    fill_random_fp8(s.indexer_q.back(), int64_t(Stack::kMaxRows) * kIndexHeads * 128, 400 + l,
                    stream);
    s.indexer_weights.push_back(device_alloc<float>(size_t(Stack::kMaxRows) * kIndexHeads));
    fill_random_f32(s.indexer_weights.back(), int64_t(Stack::kMaxRows) * kIndexHeads, -1e-3f, 1e-3f,
                    500 + l, stream);
  }
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  s.block_table_stride = static_cast<int>(pages);
  s.block_table = device_alloc<int32_t>(pages);
  MEGACTX_CUDA_CHECK(cudaMemcpy(s.block_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
  s.row_request = device_alloc<int32_t>(Stack::kMaxRows);
  MEGACTX_CUDA_CHECK(cudaMemset(s.row_request, 0, Stack::kMaxRows * 4));
  s.row_visible = device_alloc<int32_t>(Stack::kMaxRows);
  s.score_stride = slots;
  s.scores = device_alloc<float>(size_t(8) * slots);  // up to 8 indexer rows
  s.histogram = device_alloc<uint32_t>(size_t(Stack::kMaxSelectRows) * kTopkHistogramBins);
  s.row_state = device_alloc<int32_t>(size_t(Stack::kMaxSelectRows) * kTopkRowState);
  MEGACTX_CUDA_CHECK(
      cudaMemset(s.histogram, 0, size_t(Stack::kMaxSelectRows) * kTopkHistogramBins * 4));
  MEGACTX_CUDA_CHECK(cudaMemset(s.row_state, 0, size_t(Stack::kMaxSelectRows) * kTopkRowState * 4));
  s.slots = device_alloc<int32_t>(size_t(Stack::kMaxRows) * kTopK);
  s.partial_out =
      device_alloc<float>(size_t(Stack::kMaxRows) * 2 * kHeads * 512 * 4);  // rows*splits <= 512
  s.partial_lse = device_alloc<float>(size_t(Stack::kMaxRows) * 2 * kHeads * 4);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return s;
}

void set_rows_visible(Stack& s, int rows, int64_t context) {
  std::vector<int32_t> visible(rows);
  for (int r = 0; r < rows; ++r) visible[r] = static_cast<int32_t>(context - rows + 1 + r);
  MEGACTX_CUDA_CHECK(cudaMemcpy(s.row_visible, visible.data(), rows * 4, cudaMemcpyHostToDevice));
}

IndexerScoreParams score_params(const Stack& s, int layer, int rows, int64_t context) {
  IndexerScoreParams p;
  p.queries = s.indexer_q[layer];
  p.weights = s.indexer_weights[layer];
  p.key_pool = s.indexer[layer];
  p.block_table = s.block_table;
  p.block_table_stride = s.block_table_stride;
  p.row_request = s.row_request;
  p.row_visible = s.row_visible;
  p.scores = s.scores;
  p.score_stride = s.score_stride;
  p.rows = rows;
  p.heads = kIndexHeads;
  p.rows_per_group = rows;
  p.max_visible = static_cast<int>(context);
  return p;
}

// "12.3", or "-" for a case a kernel does not serve (0).
std::string one_decimal_or_dash(double value) {
  if (value <= 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

TopkParams topk_params(const Stack& s, int rows, int64_t context, TopkPath path = TopkPath::Auto) {
  TopkParams p;
  p.path = path;
  p.scores = s.scores;
  p.score_stride = s.score_stride;
  p.row_visible = s.row_visible;
  p.row_request = s.row_request;
  p.block_table = s.block_table;
  p.block_table_stride = s.block_table_stride;
  p.rows = rows;
  p.top_k = kTopK;
  p.max_visible = static_cast<int>(context);
  p.out_slots = s.slots;
  p.histogram = s.histogram;
  p.row_state = s.row_state;
  return p;
}

// Sparse MLA over layer `layer`'s queries, pool and outputs of the stack, on
// its slots (filled by the caller), with `splits` splits into its partial buffers.
SparseMlaParams mla_params(const Stack& s, int layer, int rows, int heads, int splits) {
  SparseMlaParams p;
  p.q = s.q[layer];
  p.slots = s.slots;
  p.kv_pool = s.latent[layer];
  p.out = s.out[layer];
  p.lse = s.lse[layer];
  p.partial_out = s.partial_out;
  p.partial_lse = s.partial_lse;
  p.rows = rows;
  p.heads = heads;
  p.top_k = kTopK;
  p.num_splits = splits;
  p.softmax_scale = 1.f / std::sqrt(256.f);
  return p;
}

void print_rule() {
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, prefill_only = false;
  int64_t min_context = 0, max_context = 1 << 20;
  int decode_section = 0;  // 0: every section
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--prefill-only")) prefill_only = true;
    if (!std::strcmp(argv[i], "--max-context") && i + 1 < argc) max_context = std::atoll(argv[++i]);
    if (!std::strcmp(argv[i], "--min-context") && i + 1 < argc) min_context = std::atoll(argv[++i]);
    if (!std::strcmp(argv[i], "--decode-section") && i + 1 < argc)
      decode_section = std::atoi(argv[++i]);
  }
  const int reps = quick ? 5 : 15;
  try {
    cudaStream_t stream;
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaDeviceProp props{};
    MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    const Ceilings ceil = measure_ceilings(stream);
    std::printf("# DSA attention benchmark (%s, %d SMs)\n\n", props.name,
                props.multiProcessorCount);
    std::printf(
        "ceilings measured in this run: read-only %.0f GB/s (the byte floors below), D2D copy "
        "%.0f GB/s (read+write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n",
        ceil.read_gbs, ceil.copy_gbs, ceil.bf16_tflops);
    const double bw = ceil.read_gbs * 1e9;  // bytes/s

    std::vector<int64_t> contexts;
    for (int64_t c : {8192LL, 32768LL, 131072LL, 524288LL, 1048576LL})
      if (c >= min_context && c <= max_context) contexts.push_back(c);
    if (contexts.empty()) {
      std::fprintf(stderr, "no context of 8K, 32K, 128K, 512K, 1M within the limits\n");
      return 2;
    }
    auto runs = [&](int section) { return decode_section == 0 || decode_section == section; };
    Stack s = build_stack(contexts.back(), stream);
    std::vector<int> full_layers;
    for (int l = 0; l < kLayers; ++l)
      if (s.share_schedule[l]) full_layers.push_back(l);

    if (!prefill_only) {  // sections 1-3: decode
      // ---- 1. Indexer + top-k, decode ------------------------------------------------
      if (runs(1)) {
        std::printf(
            "\n## Indexer + top-k decode (batch 1, per layer, %zu layers' caches rotated)\n\n",
            full_layers.size());
        std::printf(
            "| context | q tokens | score us | score us (cp.async) | top-k us | top-k us: passes / "
            "cluster kernel | both us | key bytes MB | byte floor us | both / floor | score "
            "TFLOP/s "
            "| key GB/s |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int64_t context : contexts)
          for (int tokens : {1, 2}) {
            set_rows_visible(s, tokens, context);
            const double n = double(full_layers.size());
            const double score_ms =
                graph_median_ms(
                    stream,
                    [&] {
                      for (int l : full_layers)
                        indexer_scores(score_params(s, l, tokens, context), stream);
                    },
                    reps) /
                n;
            const double score_cp_async_ms = graph_median_ms(
                                                 stream,
                                                 [&] {
                                                   for (int l : full_layers) {
                                                     IndexerScoreParams params =
                                                         score_params(s, l, tokens, context);
                                                     params.bulk_copies = false;
                                                     indexer_scores(params, stream);
                                                   }
                                                 },
                                                 reps) /
                                             n;
            const double topk_ms = graph_median_ms(
                                       stream,
                                       [&] {
                                         for (size_t i = 0; i < full_layers.size(); ++i)
                                           radix_topk(topk_params(s, tokens, context), stream);
                                       },
                                       reps) /
                                   n;
            // Each kernel family forced (the default above is topk_path_chosen's).
            auto topk_path_us = [&](TopkPath path) {
              TopkParams params = topk_params(s, tokens, context, path);
              if (path == TopkPath::Cluster && !topk_cluster_serves(params)) return 0.0;
              return graph_median_ms(
                         stream,
                         [&] {
                           for (size_t i = 0; i < full_layers.size(); ++i)
                             radix_topk(params, stream);
                         },
                         reps) /
                     n * 1e3;
            };
            const double passes_us = topk_path_us(TopkPath::Passes);
            const double cluster_us = topk_path_us(TopkPath::Cluster);
            const double both_ms =
                graph_median_ms(
                    stream,
                    [&] {
                      for (int l : full_layers) {
                        indexer_scores(score_params(s, l, tokens, context), stream);
                        radix_topk(topk_params(s, tokens, context), stream);
                      }
                    },
                    reps) /
                n;
            const double key_bytes = double(context) * kIndexerKeyBytes;
            const double floor_us = key_bytes / bw * 1e6;
            const double flops = 2.0 * kIndexHeads * 128 * double(context) * tokens;
            std::printf(
                "| %lldK | %d | %.1f | %.1f | %.1f | %.1f / %s | %.1f | %.1f | %.1f | %.2fx | "
                "%.0f | %.0f |\n",
                (long long)(context / 1024), tokens, score_ms * 1e3, score_cp_async_ms * 1e3,
                topk_ms * 1e3, passes_us, one_decimal_or_dash(cluster_us).c_str(), both_ms * 1e3,
                key_bytes / 1e6, floor_us, both_ms * 1e3 / floor_us,
                flops / (score_ms * 1e-3) / 1e12, key_bytes / (score_ms * 1e-3) / 1e9);
          }
      }
      // ---- 2. Sparse MLA decode --------------------------------------------------------
      if (runs(2)) {
        std::printf(
            "\n## Sparse MLA decode (top-k 2048, random slots over %lldK tokens, %d layers "
            "rotated)\n\n",
            (long long)(contexts.back() / 1024), kLayers);
        std::printf(
            "| batch x tokens | heads | splits | us/layer | bytes MB | FLOP G | TFLOP/s | GB/s | "
            "byte "
            "floor us | FLOP floor us | time / max(floor) |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
        struct MlaShape {
          int batch, tokens, heads;
        };
        // The general kernel, then for the few-row shapes the cluster kernel
        // ("splits" ends in "c": that many CTAs of a cluster, merged in DSMEM).
        for (MlaShape shape : {MlaShape{64, 2, 64}, MlaShape{64, 2, 128}, MlaShape{1, 1, 64},
                               MlaShape{1, 2, 64}, MlaShape{4, 1, 64}, MlaShape{16, 2, 64}})
          for (int kernel = 0; kernel < 3; ++kernel) {
            // 0: the general kernel; 1: the cluster kernel; 2: the cluster
            // kernel with early inputs (the slots and entries do not change
            // inside the graph: each launch's predecessor is a sparse MLA).
            const bool cluster = kernel > 0, early = kernel == 2;
            const int rows = shape.batch * shape.tokens;
            const int cluster_splits = sparse_mla_cluster_splits(rows, shape.heads, kTopK);
            if (cluster && cluster_splits == 0) continue;
            fill_random_slots(s.slots, int64_t(rows) * kTopK, s.max_tokens, 900 + rows, stream);
            const int splits = cluster ? cluster_splits
                                       : std::min(sparse_mla_splits(rows, shape.heads, kTopK,
                                                                    props.multiProcessorCount),
                                                  (2 * Stack::kMaxRows) / rows);
            auto params_for = [&](int layer) {
              SparseMlaParams p = mla_params(s, layer, rows, shape.heads, splits);
              p.cluster_merge = cluster;
              p.inputs_ready_at_launch = early;
              return p;
            };
            const double ms = graph_median_ms(
                                  stream,
                                  [&] {
                                    for (int l = 0; l < kLayers; ++l)
                                      sparse_mla_attention(params_for(l), stream);
                                  },
                                  reps) /
                              kLayers;
            const double bytes =
                double(rows) * kTopK * kLatentBytes + double(rows) * shape.heads * (576 + 512) * 2;
            const double flops = 2.0 * rows * shape.heads * double(kTopK) * (576 + 512);
            const double byte_floor = bytes / bw * 1e6,
                         flop_floor = flops / (ceil.bf16_tflops * 1e12) * 1e6;
            std::printf(
                "| %dx%d | %d | %d%s | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f | %.1f | %.2fx |\n",
                shape.batch, shape.tokens, shape.heads, splits,
                early     ? "c early"
                : cluster ? "c"
                          : "",
                ms * 1e3, bytes / 1e6, flops / 1e9, flops / (ms * 1e-3) / 1e12,
                bytes / (ms * 1e-3) / 1e9, byte_floor, flop_floor,
                ms * 1e3 / std::max(byte_floor, flop_floor));
          }

        // ---- 2b. The wgmma kernel's split count at decode row counts ---------------------
        // The wgmma kernel splits in whole 64-key stages, and a split also loads its 72 KB
        // of queries: sparse_mla_splits is fitted to this sweep.
        std::printf(
            "\n## Sparse MLA decode on the wgmma kernel: us per layer by split count (top-k %d, "
            "64 heads, %d layers rotated; * = the count the policy asks for)\n\n",
            kTopK, kLayers);
        const std::vector<int> sweep = {1, 2, 4, 8, 16, 32};
        std::printf("| batch x tokens |");
        for (int splits : sweep) std::printf(" %d |", splits);
        std::printf("\n|---|");
        for (size_t i = 0; i < sweep.size(); ++i) std::printf("---|");
        std::printf("\n");
        struct SweepShape {
          int batch, tokens;
        };
        for (SweepShape shape :
             {SweepShape{4, 1}, SweepShape{8, 1}, SweepShape{16, 1}, SweepShape{16, 2},
              SweepShape{32, 4}, SweepShape{64, 1}, SweepShape{64, 2}}) {
          const int rows = shape.batch * shape.tokens;
          fill_random_slots(s.slots, int64_t(rows) * kTopK, s.max_tokens, 700 + rows, stream);
          const int asked = sparse_mla_splits(rows, kHeads, kTopK, props.multiProcessorCount);
          std::printf("| %dx%d |", shape.batch, shape.tokens);
          for (int splits : sweep) {
            if (rows * splits > 4 * Stack::kMaxRows) {  // the partial buffers hold 512 at 64 heads
              std::printf(" - |");
              continue;
            }
            auto params_for = [&](int layer) { return mla_params(s, layer, rows, kHeads, splits); };
            const double ms = graph_median_ms(
                                  stream,
                                  [&] {
                                    for (int l = 0; l < kLayers; ++l)
                                      detail::launch_sparse_mla_prefill(params_for(l), stream);
                                  },
                                  reps) /
                              kLayers;
            std::printf(" %.1f%s |", ms * 1e3, splits == asked ? "*" : "");
          }
          std::printf("\n");
        }
      }
      // ---- 3. Decode step, attention side: IndexShare vs indexer on every layer ----------
      if (runs(3)) {
        std::printf(
            "\n## Decode step, attention side (batch 1, 1 token, 78 layers; projections "
            "excluded)\n\n");
        std::printf(
            "| context | IndexShare ms | all-full ms | speed-up | IndexShare byte floor ms | ratio "
            "| "
            "GLM-5.2 GFLOP/token all-full | IndexShare | FLOP ratio |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|\n");
        for (int64_t context : contexts) {
          set_rows_visible(s, 1, context);
          AttentionStackShape shape;
          shape.rows = 1;
          shape.rows_per_group = 1;
          shape.heads = kHeads;
          shape.index_heads = kIndexHeads;
          shape.top_k = kTopK;
          // As the model plans a decode step: the cluster kernel where it applies.
          const int cluster_splits = sparse_mla_cluster_splits(1, kHeads, kTopK);
          shape.cluster_merge = cluster_splits > 0;
          shape.early_inputs = sparse_mla_early_inputs_enabled();  // A/B: the environment
          shape.num_splits = shape.cluster_merge
                                 ? cluster_splits
                                 : sparse_mla_splits(1, kHeads, kTopK, props.multiProcessorCount);
          shape.softmax_scale = 1.f / std::sqrt(256.f);
          shape.block_table = s.block_table;
          shape.block_table_stride = s.block_table_stride;
          shape.row_request = s.row_request;
          shape.row_visible = s.row_visible;
          shape.max_visible = static_cast<int>(context);
          AttentionStackWorkspace workspace{s.scores, s.score_stride, s.histogram,  s.row_state,
                                            s.slots,  s.partial_out,  s.partial_lse};
          std::vector<AttentionLayerBuffers> layers(kLayers);
          for (int l = 0; l < kLayers; ++l)
            layers[l] = {s.indexer_q[l], s.indexer_weights[l], s.indexer[l],
                         s.q[l],         s.latent[l],          s.out[l],
                         s.lse[l]};
          auto shared_layers = layers;
          for (int l = 0; l < kLayers; ++l)
            if (!s.share_schedule[l])
              shared_layers[l].indexer_pool = shared_layers[l].indexer_queries = nullptr,
              shared_layers[l].indexer_weights = nullptr;
          const double share_ms = graph_median_ms(
              stream,
              [&] {
                run_attention_stack(shape, s.share_schedule, shared_layers, workspace, stream);
              },
              reps);
          const double full_ms = graph_median_ms(
              stream, [&] { run_attention_stack(shape, s.all_full, layers, workspace, stream); },
              reps);
          const double share_bytes = double(full_layers.size()) * context * kIndexerKeyBytes +
                                     double(kLayers) * kTopK * kLatentBytes;
          const double floor_ms = share_bytes / bw * 1e3;
          // Whole-model per-token FLOPs of the real GLM-5.2: ~80 GFLOP of weights
          // (40B active parameters) + sparse attention + indexer scoring.
          const double weights = 80e9;
          const double attention = double(kLayers) * 2.0 * kHeads * kTopK * (576 + 512);
          const double indexer_layer = 2.0 * kIndexHeads * 128 * double(context);
          const double all_full = weights + attention + kLayers * indexer_layer;
          const double shared = weights + attention + double(full_layers.size()) * indexer_layer;
          std::printf("| %lldK | %.3f | %.3f | %.2fx | %.3f | %.2fx | %.0f | %.0f | %.2fx |\n",
                      (long long)(context / 1024), share_ms, full_ms, full_ms / share_ms, floor_ms,
                      share_ms / floor_ms, all_full / 1e9, shared / 1e9, all_full / shared);
        }
      }
    }

    // ---- 4. Prefill throughput ----------------------------------------------------------
    if (decode_section != 0) return 0;
    std::printf("\n## Prefill, one layer (causal, every prompt token gets its own top-k 2048)\n\n");
    std::printf(
        "| prompt | two-kernel indexer+top-k ms | tokens/s | indexer TFLOP/s | sparse MLA ms | "
        "tokens/s | MLA "
        "TFLOP/s | general kernel ms | its TFLOP/s | f16-ring layout ms | its TFLOP/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    // Sparse MLA over `rows` rows of kTopK slots each, chunks of 256 rows (the
    // per-layer q/out buffers hold 128 rows x 128 heads); `general`: the
    // mma.sync kernel that served prefill before the wgmma one (the A/B of
    // the same rows and slots).
    const int mla_chunk = 2 * Stack::kMaxRows;
    // Which kernel time_mla runs: the policy's (the wgmma prefill kernel),
    // the general mma.sync one, or the wgmma kernel's f16-ring layout (the
    // policy's layout for decode's splits, before the fp8-ring layout took
    // one split).
    enum class Mla { kPolicy, kGeneral, kF16Ring };
    auto time_mla = [&](const int32_t* slots, int64_t rows, Mla kernel) {
      return stream_median_ms(
          stream,
          [&] {
            for (int64_t row0 = 0; row0 < rows; row0 += mla_chunk) {
              SparseMlaParams p;
              p.q = s.q[0];
              p.slots = slots + row0 * kTopK;
              p.kv_pool = s.latent[0];
              p.out = s.out[0];
              p.lse = s.lse[0];
              p.rows = mla_chunk;
              p.heads = kHeads;
              p.top_k = kTopK;
              p.num_splits = 1;
              p.softmax_scale = 1.f / std::sqrt(256.f);
              if (kernel == Mla::kGeneral)
                detail::launch_sparse_mla(p, stream);
              else if (kernel == Mla::kF16Ring)
                detail::launch_sparse_mla_prefill_f16ring(p, stream);
              else
                sparse_mla_attention(p, stream);
            }
          },
          quick ? 1 : 2);
    };
    auto mla_flops = [](int64_t rows) { return 2.0 * double(rows) * kHeads * kTopK * (576 + 512); };
    // The sparse MLA's gather floor beside each row: the same selected entries
    // read alone (printed under the table).
    std::vector<std::string> gather_lines;
    auto gather_line = [&](const char* what, const int32_t* slots, int64_t rows, double mla_ms) {
      const size_t count = size_t(rows) * kTopK;
      const double ms =
          measure_gather_read_ms(s.latent[0], kLatentBytes, slots, count, quick ? 1 : 3, stream);
      char line[256];
      std::snprintf(line, sizeof line,
                    "- %s: the selected entries read alone %.2f ms (%.0f GB/s of entries); the "
                    "sparse MLA %.2f ms = %.2fx that",
                    what, ms, double(count) * kLatentBytes / (ms * 1e-3) / 1e9, mla_ms,
                    mla_ms / ms);
      gather_lines.push_back(line);
    };
    for (int64_t prompt : {32768LL, 131072LL}) {
      if (prompt > s.max_tokens || (quick && prompt > 32768)) continue;
      // Indexer: groups of 8 prompt rows; a chunk of rows shares the scores
      // workspace [chunk_rows, prompt] (8M floats), then is selected.
      const int64_t fit = (8 * s.score_stride) / prompt / 8 * 8;
      const int chunk_rows = static_cast<int>(std::min<int64_t>(Stack::kMaxSelectRows, fit));
      std::vector<int32_t> visible(prompt);
      for (int64_t p = 0; p < prompt; ++p) visible[p] = static_cast<int32_t>(p + 1);
      int32_t* all_visible = device_alloc<int32_t>(prompt);
      int32_t* all_request = device_alloc<int32_t>(prompt);
      MEGACTX_CUDA_CHECK(
          cudaMemcpy(all_visible, visible.data(), prompt * 4, cudaMemcpyHostToDevice));
      MEGACTX_CUDA_CHECK(cudaMemset(all_request, 0, prompt * 4));
      uint8_t* prompt_q = device_alloc<uint8_t>(size_t(prompt) * kIndexHeads * 128);
      float* prompt_w = device_alloc<float>(size_t(prompt) * kIndexHeads);
      fill_random_fp8(prompt_q, int64_t(prompt) * kIndexHeads * 128, 11, stream);
      fill_random_f32(prompt_w, int64_t(prompt) * kIndexHeads, -1e-3f, 1e-3f, 12, stream);
      int32_t* prompt_slots = device_alloc<int32_t>(size_t(prompt) * kTopK);
      const double indexer_ms = stream_median_ms(
          stream,
          [&] {
            for (int64_t row0 = 0; row0 < prompt; row0 += chunk_rows) {
              IndexerScoreParams p = score_params(s, 0, chunk_rows, row0 + chunk_rows);
              p.queries = prompt_q + row0 * kIndexHeads * 128;
              p.weights = prompt_w + row0 * kIndexHeads;
              p.row_request = all_request + row0;
              p.row_visible = all_visible + row0;
              p.rows_per_group = 8;
              p.score_stride = prompt;
              indexer_scores(p, stream);
              TopkParams t = topk_params(s, chunk_rows, row0 + chunk_rows);
              t.row_visible = all_visible + row0;
              t.row_request = all_request + row0;
              t.out_slots = prompt_slots + row0 * kTopK;
              t.score_stride = prompt;
              radix_topk(t, stream);
            }
          },
          quick ? 1 : 2);
      const double indexer_flops = 2.0 * kIndexHeads * 128 * (double(prompt) * (prompt + 1) / 2);
      // Sparse MLA: every prompt row over 2048 random slots of the prompt.
      fill_random_slots(prompt_slots, int64_t(prompt) * kTopK, prompt, 13, stream);
      const double mla_ms = time_mla(prompt_slots, prompt, Mla::kPolicy);
      gather_line(prompt == 32768 ? "32K prompt" : "128K prompt", prompt_slots, prompt, mla_ms);
      const double general_ms = time_mla(prompt_slots, prompt, Mla::kGeneral);
      const double f16ring_ms = time_mla(prompt_slots, prompt, Mla::kF16Ring);
      std::printf(
          "| %lldK | %.1f | %.0f | %.0f | %.1f | %.0f | %.0f | %.1f | %.0f | %.1f | %.0f |\n",
          (long long)(prompt / 1024), indexer_ms, prompt / (indexer_ms * 1e-3),
          indexer_flops / (indexer_ms * 1e-3) / 1e12, mla_ms, prompt / (mla_ms * 1e-3),
          mla_flops(prompt) / (mla_ms * 1e-3) / 1e12, general_ms,
          mla_flops(prompt) / (general_ms * 1e-3) / 1e12, f16ring_ms,
          mla_flops(prompt) / (f16ring_ms * 1e-3) / 1e12);
      MEGACTX_CUDA_CHECK(cudaFree(all_visible));
      MEGACTX_CUDA_CHECK(cudaFree(all_request));
      MEGACTX_CUDA_CHECK(cudaFree(prompt_q));
      MEGACTX_CUDA_CHECK(cudaFree(prompt_w));
      MEGACTX_CUDA_CHECK(cudaFree(prompt_slots));
    }
    // The sparse MLA alone over a million-token pool: a prefill chunk's 16K
    // rows with slots spread over all of it, the regime of a 1M-token prompt
    // whose gathers miss L2 (the prompt rows above gather from at most 128K).
    if (s.max_tokens >= 1048576 && !quick) {
      constexpr int64_t kRows = 16384;
      int32_t* slots = device_alloc<int32_t>(size_t(kRows) * kTopK);
      fill_random_slots(slots, kRows * kTopK, s.max_tokens, 14, stream);
      const double mla_ms = time_mla(slots, kRows, Mla::kPolicy);
      gather_line("16K rows over a 1M pool", slots, kRows, mla_ms);
      const double f16ring_ms = time_mla(slots, kRows, Mla::kF16Ring);
      std::printf(
          "| 16K rows over a 1M pool (sparse MLA only) | - | - | - | %.1f | %.0f | %.0f | - | - "
          "| %.1f | %.0f |\n",
          mla_ms, kRows / (mla_ms * 1e-3), mla_flops(kRows) / (mla_ms * 1e-3) / 1e12, f16ring_ms,
          mla_flops(kRows) / (f16ring_ms * 1e-3) / 1e12);
      MEGACTX_CUDA_CHECK(cudaFree(slots));
    }
    if (!gather_lines.empty()) {
      std::printf("\nGather floor (read-only stream %.0f GB/s):\n\n", ceil.read_gbs);
      for (const std::string& line : gather_lines) std::printf("%s\n", line.c_str());
    }
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    print_rule();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dsa_attention_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}

// Indexer prefill: the fused indexer + top-k (kernels/cuda/indexer_topk)
// against the two-kernel path it replaces for prefill (indexer_scores in
// groups of 8 rows over a scores workspace of 8M floats + radix_topk), on a
// GLM-5.2 indexer (32 heads x 128, top-k 2048; DeepSeek's 64 heads once) and a
// synthesised fp8 key cache of one request over shuffled pages.
//
//   indexer_prefill_bench [--quick] [--fp8-ceiling TFLOPS] [--case SUBSTRING] [--fused-only]
//                         [--check-pages N]
//
// --check-pages sets the default kernel's compaction-check interval
// (FusedIndexerTopkParams::check_pages).
// --case runs only the cases whose name contains SUBSTRING, --fused-only
// times only the default fused kernel, none of its variants or the two-kernel
// path (both for ncu and quick A/B runs).
// "fused wgmma" is the default kernel (free-running warpgroups, the head sum
// on the tensor cores in bf16), "fp32 head sum" the same kernel summing heads
// with fp32 FMAs on the CUDA cores, "ping-pong" that one with the two
// warpgroups taking turns issuing their MMAs; "oldest page first" the default
// kernel streaming each tile's pages in increasing position.
// Cases: whole causal prompts of 32K and 128K in 16K-row chunks (as the
// engine's --max-prefill-tokens 16384 sends them), the last 2048 rows of a
// 1M-token prompt, one 16K-row chunk at 512K (a middle chunk of a 1M prefill), scores that rise
// with the position (every key enters the candidate buffers), and a decode-like batch (256 one-row
// requests). FLOPs are the useful ones: 2 x heads x 128 x sum of visible keys. Times are medians of
// stream launches after a warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "bench/cuda/support/device_alloc.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "bench/cuda/support/stream_timing.h"
#include "bench/cuda/support/synthetic_cache.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"
#include "kernels/cuda/topk/topk.h"

using namespace megactx::cuda;

namespace {

constexpr int kTopK = 2048;
constexpr int64_t kChunkRows = 16384;               // fused: rows per call (a prefill chunk)
constexpr int64_t kScoreFloats = int64_t{8} << 20;  // two-kernel path: scores workspace

// One request's key cache over shuffled pages, and `rows` query rows: row i
// at position first_position + i (visible first_position + i + 1), or, with
// `decode_rows`, every row its own request sharing that page table.
struct Problem {
  int heads = 32;
  int64_t keys = 0;  // cache length
  int64_t rows = 0;
  int64_t first_position = 0;
  bool decode_rows = false;
  bool rising = false;  // identical keys, scale rising with the position
  uint8_t* pool = nullptr;
  int32_t* page_table = nullptr;  // [rows or 1, pages] (decode: one copy per row)
  int pages = 0;
  uint8_t* queries = nullptr;
  float* weights = nullptr;
  int32_t *row_table = nullptr, *row_visible = nullptr, *row_request = nullptr;
  int32_t* out = nullptr;  // [rows, top_k]
  double visible_sum = 0;

  void build(cudaStream_t stream, uint32_t seed) {
    pages = static_cast<int>((keys + 63) / 64);
    const int64_t slots = int64_t{pages} * 64;
    pool = device_alloc<uint8_t>(size_t(slots) * kIndexerKeyBytes);
    std::vector<int32_t> table(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    if (rising) {
      // Same e4m3 bytes everywhere, scale 1e-3 * (1 + 1e-6 * position).
      std::vector<uint8_t> host(size_t(slots) * kIndexerKeyBytes, 0x38);  // e4m3 1.0
      for (int64_t p = 0; p < keys; ++p) {
        const int64_t slot = int64_t{table[p / 64]} * 64 + p % 64;
        const float scale = 1e-3f * (1.f + 1e-6f * static_cast<float>(p));
        std::memcpy(host.data() + slot * kIndexerKeyBytes + kIndexerHeadDim, &scale, 4);
      }
      MEGACTX_CUDA_CHECK(cudaMemcpy(pool, host.data(), host.size(), cudaMemcpyHostToDevice));
    } else {
      fill_synthetic_indexer_pool(pool, slots, seed, stream);
    }
    const int64_t copies = decode_rows ? rows : 1;
    std::vector<int32_t> tables;
    for (int64_t c = 0; c < copies; ++c) tables.insert(tables.end(), table.begin(), table.end());
    page_table = device_alloc<int32_t>(tables.size());
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(page_table, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    queries = device_alloc<uint8_t>(size_t(rows) * heads * kIndexerHeadDim);
    weights = device_alloc<float>(size_t(rows) * heads);
    if (rising) {
      MEGACTX_CUDA_CHECK(cudaMemset(queries, 0x38, size_t(rows) * heads * kIndexerHeadDim));
      fill_random_f32(weights, rows * heads, 1e-3f, 2e-3f, seed + 2, stream);
    } else {
      fill_random_fp8(queries, rows * heads * kIndexerHeadDim, seed + 1, stream);
      fill_random_f32(weights, rows * heads, -1e-3f, 1e-3f, seed + 2, stream);
    }
    std::vector<int32_t> offsets(rows), visible(rows), request(rows);
    visible_sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      offsets[r] = decode_rows ? static_cast<int32_t>(r * pages) : 0;
      request[r] = decode_rows ? static_cast<int32_t>(r) : 0;
      visible[r] = static_cast<int32_t>(decode_rows ? keys : first_position + r + 1);
      visible_sum += visible[r];
    }
    row_table = device_alloc<int32_t>(rows);
    row_visible = device_alloc<int32_t>(rows);
    row_request = device_alloc<int32_t>(rows);
    MEGACTX_CUDA_CHECK(cudaMemcpy(row_table, offsets.data(), rows * 4, cudaMemcpyHostToDevice));
    MEGACTX_CUDA_CHECK(cudaMemcpy(row_visible, visible.data(), rows * 4, cudaMemcpyHostToDevice));
    MEGACTX_CUDA_CHECK(cudaMemcpy(row_request, request.data(), rows * 4, cudaMemcpyHostToDevice));
    out = device_alloc<int32_t>(size_t(rows) * kTopK);
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  void release() {
    for (void* p : {static_cast<void*>(pool), static_cast<void*>(page_table),
                    static_cast<void*>(queries), static_cast<void*>(weights),
                    static_cast<void*>(row_table), static_cast<void*>(row_visible),
                    static_cast<void*>(row_request), static_cast<void*>(out)})
      MEGACTX_CUDA_CHECK(cudaFree(p));
  }
  double flops() const { return 2.0 * heads * kIndexerHeadDim * visible_sum; }
  int max_visible() const { return static_cast<int>(decode_rows ? keys : first_position + rows); }
};

struct Workspaces {
  uint8_t* fused = nullptr;
  size_t fused_bytes = 0;
  float* scores = nullptr;
  uint32_t* histogram = nullptr;
  int32_t* state = nullptr;
  int64_t select_rows = 1024;
};

int g_check_pages = 0;  // --check-pages: the default kernel's (variants: 0)

void run_fused(const Problem& p, Workspaces& w, bool wgmma, cudaStream_t stream,
               bool ping_pong = false, bool tensor_head_sum = true, int consumer_warpgroups = 0,
               bool newest_first = true) {
  for (int64_t row0 = 0; row0 < p.rows; row0 += kChunkRows) {
    FusedIndexerTopkParams f;
    f.queries = p.queries + row0 * p.heads * kIndexerHeadDim;
    f.weights = p.weights + row0 * p.heads;
    f.key_pool = p.pool;
    f.page_tables = p.page_table;
    f.row_table = p.row_table + row0;
    f.row_visible = p.row_visible + row0;
    f.rows = static_cast<int>(std::min(kChunkRows, p.rows - row0));
    f.heads = p.heads;
    f.top_k = kTopK;
    f.max_visible = p.max_visible();
    f.out = p.out + row0 * kTopK;
    f.workspace = w.fused;
    f.workspace_bytes = w.fused_bytes;
    f.wgmma = wgmma;
    f.ping_pong = ping_pong;
    f.tensor_head_sum = tensor_head_sum;
    f.consumer_warpgroups = consumer_warpgroups;
    f.newest_first = newest_first;
    if (wgmma && tensor_head_sum && consumer_warpgroups != 2) f.check_pages = g_check_pages;
    fused_indexer_topk(f, stream);
  }
}

// Chunks of rows whose scores [chunk, max_visible] fit the 8M-float workspace.
void run_two_kernel(const Problem& p, Workspaces& w, cudaStream_t stream) {
  const int64_t stride = p.max_visible();
  const int group = p.decode_rows ? 1 : 8;
  const int64_t fit = std::max<int64_t>(group, kScoreFloats / stride / group * group);
  const int64_t chunk = std::min<int64_t>({fit, w.select_rows, p.rows});
  for (int64_t row0 = 0; row0 < p.rows; row0 += chunk) {
    const int rows = static_cast<int>(std::min(chunk, p.rows - row0));
    const int max_visible =
        p.decode_rows ? p.max_visible() : static_cast<int>(p.first_position + row0 + rows);
    IndexerScoreParams s;
    s.queries = p.queries + row0 * p.heads * kIndexerHeadDim;
    s.weights = p.weights + row0 * p.heads;
    s.key_pool = p.pool;
    s.block_table = p.page_table;
    s.block_table_stride = p.pages;
    s.row_request = p.row_request + row0;
    s.row_visible = p.row_visible + row0;
    s.scores = w.scores;
    s.score_stride = stride;
    s.rows = rows;
    s.heads = p.heads;
    s.rows_per_group = rows % group == 0 ? group : 1;
    s.max_visible = max_visible;
    indexer_scores(s, stream);
    TopkParams t;
    t.scores = w.scores;
    t.score_stride = stride;
    t.row_visible = p.row_visible + row0;
    t.rows = rows;
    t.top_k = kTopK;
    t.max_visible = max_visible;
    t.out_slots = p.out + row0 * kTopK;  // positions mode
    t.histogram = w.histogram;
    t.row_state = w.state;
    radix_topk(t, stream);
  }
}

// Mean |fused ∩ two-kernel| / k over `sample` rows spread over the problem.
double agreement(const Problem& p, Workspaces& w, cudaStream_t stream, int sample) {
  std::vector<int32_t> fused(size_t(p.rows) * kTopK), old(fused.size());
  run_fused(p, w, true, stream);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  MEGACTX_CUDA_CHECK(cudaMemcpy(fused.data(), p.out, fused.size() * 4, cudaMemcpyDeviceToHost));
  run_two_kernel(p, w, stream);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  MEGACTX_CUDA_CHECK(cudaMemcpy(old.data(), p.out, old.size() * 4, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int i = 0; i < sample; ++i) {
    const int64_t row = p.rows - 1 - (p.rows - 1) * i / std::max(1, sample - 1);
    const std::unordered_set<int32_t> set(old.begin() + row * kTopK,
                                          old.begin() + (row + 1) * kTopK);
    int common = 0;
    for (int j = 0; j < kTopK; ++j) common += set.count(fused[row * kTopK + j]) ? 1 : 0;
    sum += double(common) / kTopK;
  }
  return sum / sample;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  double fp8_ceiling = 1350;  // torch._scaled_mm 8192^3 on this GPU (docs/benchmarks.md)
  std::string only;
  bool fused_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fused-only")) fused_only = true;
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--fp8-ceiling") && i + 1 < argc) fp8_ceiling = std::atof(argv[++i]);
    if (!std::strcmp(argv[i], "--check-pages") && i + 1 < argc)
      g_check_pages = std::atoi(argv[++i]);
  }
  try {
    cudaStream_t stream;
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaDeviceProp props{};
    MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    const ReadBandwidth read = measure_read_bandwidth(size_t{8} << 30, 10, stream);
    std::printf("# Indexer prefill: fused indexer + top-k vs two kernels (%s, %d SMs)\n\n",
                props.name, props.multiProcessorCount);
    std::printf(
        "ceilings: read-only %.0f GB/s and D2D copy %.0f GB/s (read + write) measured here; fp8 "
        "GEMM %.0f TFLOP/s (given)\n\n",
        read.read_gbs, read.copy_gbs, fp8_ceiling);

    Workspaces w;
    const int ctas = fused_indexer_topk_default_ctas();
    w.fused_bytes = fused_indexer_topk_workspace_bytes(kChunkRows, ctas);
    w.fused = device_alloc<uint8_t>(w.fused_bytes);
    w.scores = device_alloc<float>(kScoreFloats);
    w.histogram = device_alloc<uint32_t>(size_t(w.select_rows) * kTopkHistogramBins);
    w.state = device_alloc<int32_t>(size_t(w.select_rows) * kTopkRowState);
    MEGACTX_CUDA_CHECK(cudaMemset(w.histogram, 0, size_t(w.select_rows) * kTopkHistogramBins * 4));
    MEGACTX_CUDA_CHECK(cudaMemset(w.state, 0, size_t(w.select_rows) * kTopkRowState * 4));
    std::printf("fused workspace %.1f MiB for %lld-row chunks on %d CTAs\n\n",
                w.fused_bytes / 1048576.0, static_cast<long long>(kChunkRows), ctas);

    std::printf(
        "| case | heads | rows x keys | fused wgmma ms | TFLOP/s | of fp8 ceiling | oldest page "
        "first ms | TFLOP/s | two warpgroups ms | TFLOP/s | ping-pong ms | fp32 head sum ms | "
        "TFLOP/s | fused mma.sync ms | two-kernel ms | TFLOP/s | speed-up | set agreement |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    struct Case {
      const char* name;
      int heads;
      int64_t keys, rows, first;
      bool decode, rising, compare, mma;
    };
    std::vector<Case> cases = {
        {"32K prompt", 32, 32768, 32768, 0, false, false, true, true},
        {"128K prompt", 32, 131072, 131072, 0, false, false, true, false},
        {"1M prompt, last 2048 rows", 32, 1048576, 2048, 1048576 - 2048, false, false, true, false},
        {"16K-row chunk at 512K", 32, 524288, 16384, 524288 - 16384, false, false, false, false},
        {"32K prompt, rising scores", 32, 32768, 32768, 0, false, true, false, false},
        {"32K prompt, DeepSeek heads", 64, 32768, 32768, 0, false, false, true, false},
        {"decode 256 x 1 row, 128K", 32, 131072, 256, 0, true, false, true, false},
    };
    for (const Case& c : cases) {
      if (quick && c.keys > 32768) continue;
      if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
      const bool mma = c.mma && !fused_only, compare = c.compare && !fused_only;
      Problem p;
      p.heads = c.heads;
      p.keys = c.keys;
      p.rows = c.rows;
      p.first_position = c.first;
      p.decode_rows = c.decode;
      p.rising = c.rising;
      p.build(stream, 7 + static_cast<uint32_t>(c.keys % 97));
      const int reps = c.keys >= 131072 ? 3 : 5;
      const double fused_ms = stream_median_ms(
          stream, [&] { run_fused(p, w, true, stream); }, reps);
      // The default kernel's variants (not with --fused-only: 0, printed as 0).
      auto variant_ms = [&](auto&& run) {
        return fused_only ? 0.0 : stream_median_ms(stream, run, reps);
      };
      const double oldest_ms =
          variant_ms([&] { run_fused(p, w, true, stream, false, true, 0, false); });
      const double two_wg_ms = variant_ms([&] { run_fused(p, w, true, stream, false, true, 2); });
      const double pong_ms = variant_ms([&] { run_fused(p, w, true, stream, true, false); });
      const double fp32_sum_ms = variant_ms([&] { run_fused(p, w, true, stream, false, false); });
      auto rate = [&](double ms) { return ms > 0 ? p.flops() / (ms * 1e-3) / 1e12 : 0.0; };
      const double mma_ms = mma ? stream_median_ms(
                                      stream, [&] { run_fused(p, w, false, stream); }, reps)
                                : 0;
      const double old_ms =
          compare ? stream_median_ms(
                        stream, [&] { run_two_kernel(p, w, stream); }, c.keys >= 131072 ? 1 : 3)
                  : 0;
      const double agree = compare ? agreement(p, w, stream, 64) : 0;
      const double tflops = p.flops() / (fused_ms * 1e-3) / 1e12;
      char mma_text[32] = "", old_text[32] = "", old_rate[32] = "", speed[32] = "",
           agree_text[32] = "";
      if (mma) std::snprintf(mma_text, sizeof mma_text, "%.2f", mma_ms);
      if (compare) {
        std::snprintf(old_text, sizeof old_text, "%.2f", old_ms);
        std::snprintf(old_rate, sizeof old_rate, "%.0f", p.flops() / (old_ms * 1e-3) / 1e12);
        std::snprintf(speed, sizeof speed, "%.2fx", old_ms / fused_ms);
        std::snprintf(agree_text, sizeof agree_text, "%.4f", agree);
      }
      std::printf(
          "| %s | %d | %lld x %lld | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.2f | %.0f | %.2f | "
          "%.2f "
          "| %.0f | %s | %s | %s | %s | %s |\n",
          c.name, c.heads, static_cast<long long>(c.rows), static_cast<long long>(c.keys), fused_ms,
          tflops, 100.0 * tflops / fp8_ceiling, oldest_ms, rate(oldest_ms), two_wg_ms,
          rate(two_wg_ms), pong_ms, fp32_sum_ms, rate(fp32_sum_ms), mma_text, old_text, old_rate,
          speed, agree_text);
      std::fflush(stdout);
      p.release();
    }
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "indexer_prefill_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}

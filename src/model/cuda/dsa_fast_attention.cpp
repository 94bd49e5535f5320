// CudaDsaModel: the DSA indexer and sparse MLA on the fp8 DSA kernels
// (kernels/cuda/{indexer,topk,sparse_mla}) instead of the fp32 fallback, for
// FP8 caches of 64-token pages with kv_lora 512, rope 64 and index dim 128
// (the GLM-5.x / DeepSeek-V3.2 shapes those kernels are written for).
//
// What differs from the fallback (and why the results are close, not equal):
// - indexer queries are rounded to bf16, then quantised to e4m3 per (token,
//   head) with the scale folded into the head weights; scores come from fp8
//   tensor cores. Heads are zero-padded to 32 or 64 (ReLU(0) * 0 adds nothing).
// - top-k is the radix select in positions mode: the same set up to ties and
//   rounding at the threshold, in unspecified order (attention sums over it).
//   Steps whose scores [rows, context] would pass kCudaIndexerScoresCap
//   (prefill chunks over long contexts) score and select in one fused kernel
//   (kernels/cuda/indexer_topk) that keeps a streaming top-k per row instead
//   of the scores; MEGACTX_CUDA_FUSED_INDEXER=1 takes it for every step it
//   serves (the tests compare both). Its sum over heads runs on the tensor
//   cores in bf16; MEGACTX_CUDA_INDEXER_FP32_HEAD_SUM=1 sums in fp32 on the
//   CUDA cores (for comparisons).
// - sparse MLA rounds q to bf16 ([q_latent | q_pe], heads zero-padded to a
//   multiple of 64), attends on bf16 tensor cores and returns bf16.
// step.topk keeps positions (shared-indexer layers, the MTP layer and the CPU
// semantics use positions); each attention call maps them to slots.
// Everything here launches on stream_: no host sync, no allocation once the
// scratch has grown to the step's size (CUDA-graph capturable).
#if MEGACTX_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.h"
#include "kernels/cuda/dsa_fallback/position_topk.h"
#include "kernels/cuda/dsa_glue/dsa_fast_inputs.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"
#include "kernels/cuda/kv_copy/offload_union.h"
#include "kernels/cuda/kv_copy/stage_offload.h"
#include "kernels/cuda/sparse_mla/sparse_mla.h"
#include "kernels/cuda/topk/topk.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/cuda/fast_attention_plan.h"

namespace megactx::cuda {
namespace {

// Grows `buffer` to `count` elements of T; a buffer that had to grow is zeroed
// (the radix top-k workspace must be zero before its first use and is left
// zero by every call).
template <typename T>
T* zeroed_workspace(DeviceBuffer& buffer, int64_t count, cudaStream_t stream) {
  const size_t before = buffer.bytes();
  T* data = buffer.get<T>(count);
  if (buffer.bytes() != before)
    MEGACTX_CUDA_CHECK(cudaMemsetAsync(data, 0, buffer.bytes(), stream));
  return data;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// MEGACTX_OFFLOAD_STAGING=0: offload pages' entries read straight from host
// memory by the attention kernels at every step (A/B runs, tests).
bool offload_staging_enabled() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_STAGING");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// MEGACTX_OFFLOAD_HOT=0: staged offload entries are not kept across steps
// (every selected one copied every step; A/B runs, tests).
bool offload_hot_enabled() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_HOT");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// MEGACTX_OFFLOAD_HOT_LINES=N: a smaller hot cache (tests: collisions);
// read once per model, at its first use.
int64_t offload_hot_lines() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_HOT_LINES");
  const int64_t lines = value != nullptr ? std::atoll(value) : 0;
  return lines > 0 && lines < kOffloadHotLines ? lines : kOffloadHotLines;
}

// MEGACTX_OFFLOAD_LINE_MAP=modulo: the hot cache's lines without the
// per-cycle rotation (stage_offload.h; A/B runs); read once per model.
OffloadLineMap offload_line_map() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_LINE_MAP");
  if (value == nullptr || std::strcmp(value, "rotated") == 0) return OffloadLineMap::kRotated;
  MEGACTX_CHECK(std::strcmp(value, "modulo") == 0,
                "MEGACTX_OFFLOAD_LINE_MAP must be rotated or modulo, got {}", value);
  return OffloadLineMap::kModulo;
}

// MEGACTX_OFFLOAD_SIDE_STREAM=0: every layer copies its hot-cache misses on
// the compute stream right before its attention (A/B runs, tests).
bool offload_side_stream_enabled() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_SIDE_STREAM");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// MEGACTX_OFFLOAD_FILL_BLOCKS=N: the side stream's fills in at most N
// blocks of 8 warps (0: one warp per entry; A/B runs). 32 blocks keep 1,024
// entries (670 KB) in flight, past what the bus needs to run at its rate.
int offload_fill_blocks() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_FILL_BLOCKS");
  return value != nullptr ? std::max(0, std::atoi(value)) : kOffloadFillBlocks;
}

// MEGACTX_OFFLOAD_UNION_ROWS=N: the union staging of large steps holds at
// most N rows (0: none, their offload entries read over the bus per row;
// tests: a union larger than the staging); read once per model.
int64_t offload_union_rows() {
  const char* value = std::getenv("MEGACTX_OFFLOAD_UNION_ROWS");
  return value != nullptr ? std::max<int64_t>(0, std::atoll(value)) : kOffloadUnionRows;
}

// A hot cache group's tables at rest: tags -1 (empty), claims past every
// entry index (0x7f7f7f7f), hits 0.
void reset_offload_tables(int32_t* tables, int64_t count, cudaStream_t stream) {
  const auto lines = static_cast<size_t>(count);
  MEGACTX_CUDA_CHECK(cudaMemsetAsync(tables, 0xff, lines * 4, stream));
  MEGACTX_CUDA_CHECK(cudaMemsetAsync(tables + lines, 0x7f, lines * 4, stream));
  MEGACTX_CUDA_CHECK(cudaMemsetAsync(tables + 2 * lines, 0, lines * 4, stream));
}

// MEGACTX_CUDA_FUSED_INDEXER=1: the fused indexer + top-k for every step it
// serves, not only those past the scores cap (read per call: tests switch it).
bool fused_indexer_forced() {
  const char* value = std::getenv("MEGACTX_CUDA_FUSED_INDEXER");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// MEGACTX_CUDA_INDEXER_FP32_HEAD_SUM=1: the fused indexer sums heads in fp32
// on the CUDA cores instead of bf16 on the tensor cores (read per call).
bool fp32_head_sum_forced() {
  const char* value = std::getenv("MEGACTX_CUDA_INDEXER_FP32_HEAD_SUM");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// MEGACTX_CUDA_INDEXER_WARPGROUPS=2: the fused indexer's two-warpgroup layout
// with the tensor-core head sum (A/B runs; the default is four).
int indexer_warpgroups_forced() {
  const char* value = std::getenv("MEGACTX_CUDA_INDEXER_WARPGROUPS");
  return value != nullptr && std::strcmp(value, "2") == 0 ? 2 : 0;
}

// MEGACTX_CUDA_INDEXER_OLDEST_FIRST=1: the fused indexer streams each tile's
// key pages oldest first instead of newest first (A/B runs; read per call).
bool indexer_oldest_first_forced() {
  const char* value = std::getenv("MEGACTX_CUDA_INDEXER_OLDEST_FIRST");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// MEGACTX_CUDA_INDEXER_CHECK_PAGES=1 or 4: how often (in key pages) the fused
// indexer looks for candidate buffers to compact (A/B runs; read per call).
int indexer_check_pages_forced() {
  const char* value = std::getenv("MEGACTX_CUDA_INDEXER_CHECK_PAGES");
  if (value == nullptr) return 0;
  const int pages = std::atoi(value);
  return pages == 1 || pages == 4 ? pages : 0;
}

}  // namespace

bool CudaDsaModel::use_fast_attention(const Step& step) const {
  return options_.fast_attention && step.latent.dtype == CacheDType::FP8 &&
         step.rows.page_size == kPageTokens && cuda_fast_attention_shapes(config_) &&
         index_topk_ <= std::numeric_limits<int32_t>::max() / 2;
}

int64_t CudaDsaModel::fast_scratch_bytes() const {
  const FastScratch& fs = fast_scratch_;
  size_t total = 0;
  for (const DeviceBuffer* buffer :
       {&fs.tables, &fs.visible, &fs.row_ids, &fs.iq_fp8, &fs.iw_folded, &fs.topk_histogram,
        &fs.topk_state, &fs.slots, &fs.q_bf16, &fs.out_bf16, &fs.lse, &fs.partial_out,
        &fs.partial_lse, &fs.fused, &fs.staged_slots, &fs.staging, &fs.offload_copy,
        &fs.absorb_q_bf16})
    total += buffer->bytes();
  return static_cast<int64_t>(total);
}

CudaDsaModel::Selection CudaDsaModel::last_selection(int64_t tokens) const {
  MEGACTX_CHECK(tokens >= 0 &&
                    static_cast<size_t>(tokens * index_topk_) * 4 <= scratch_.topk.bytes() &&
                    static_cast<size_t>(tokens) * 4 <= scratch_.counts.bytes(),
                "last_selection: no forward of {} tokens ran", tokens);
  Selection out;
  out.tokens = tokens;
  out.top_k = index_topk_;
  out.positions.resize(static_cast<size_t>(tokens * index_topk_));
  out.counts.resize(static_cast<size_t>(tokens));
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (tokens > 0) {
    MEGACTX_CUDA_CHECK(cudaMemcpy(out.positions.data(), scratch_.topk.as<int32_t>(),
                                  out.positions.size() * 4, cudaMemcpyDeviceToHost));
    MEGACTX_CUDA_CHECK(cudaMemcpy(out.counts.data(), scratch_.counts.as<int32_t>(),
                                  out.counts.size() * 4, cudaMemcpyDeviceToHost));
  }
  return out;
}

void CudaDsaModel::fast_indexer(const float* q, const float* weights, float weight_scale,
                                int64_t layer, Step& step, PagedKvCache& cache) {
  FastScratch& fs = fast_scratch_;
  const int64_t n = step.tokens;
  const int64_t heads = config_.index_n_heads;
  const int64_t padded = heads <= 32 ? 32 : 64;  // the head counts indexer_scores supports
  const int64_t dim = kIndexerHeadDim;
  // The deterministic mode never fuses: the fused kernel sums heads in another
  // order and places ties by atomics, and it is chosen by the step's size.
  const bool fused = !options_.batch_invariant &&
                     (cuda_fused_indexer_chosen(config_, index_topk_, n, step.max_context) ||
                      (fused_indexer_forced() && cuda_fused_indexer_serves(config_, index_topk_)));

  // Per-token block tables, causal lengths and selection counts: once per step
  // (every full layer of the step reads the same ones). The fused path reads
  // the step's paging directly and writes the counts itself.
  if (step.token_tables == nullptr && !fused) {
    TokenTablesParams t;
    t.rows = step.rows;
    t.tokens = n;
    t.table_stride = std::max<int64_t>(1, (step.max_context + kPageTokens - 1) / kPageTokens);
    t.top_k = index_topk_;
    t.tables = fs.tables.get<int32_t>(n * t.table_stride);
    t.visible = fs.visible.get<int32_t>(n);
    t.row_ids = fs.row_ids.get<int32_t>(n);
    t.counts = step.counts;
    build_token_tables(t, stream_);
    step.token_tables = t.tables;
    step.row_visible = t.visible;
    step.row_ids = t.row_ids;
    step.table_stride = t.table_stride;
  }

  // fp32 [n, heads, 128] -> e4m3 [n, padded, 128] (each value rounded to
  // bf16 first, as pad_indexer_queries would) with folded weights, one launch.
  QuantizeIndexerParams quantize;
  quantize.queries_f32 = q;
  quantize.head_weights_f32 = weights;
  quantize.source_heads = static_cast<int>(heads);
  quantize.head_weight_scale = weight_scale;
  quantize.queries_fp8 = fs.iq_fp8.get<uint8_t>(n * padded * dim);
  quantize.weights = fs.iw_folded.get<float>(n * padded);
  quantize.rows = static_cast<int>(n);
  quantize.heads = static_cast<int>(padded);
  quantize.softmax_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  quantize_indexer_queries(quantize, stream_);

  if (fused) {
    // Positions of the top-k into step.topk [n, index_topk] and step.counts
    // [n], no scores: rows of one sequence share its page table.
    if (fast_multiprocessors_ == 0) {
      int device = 0;
      MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
      MEGACTX_CUDA_CHECK(
          cudaDeviceGetAttribute(&fast_multiprocessors_, cudaDevAttrMultiProcessorCount, device));
    }
    FusedIndexerTopkParams select;
    select.queries = quantize.queries_fp8;
    select.weights = quantize.weights;
    select.key_pool = static_cast<const uint8_t*>(cache.indexer_pool(layer).raw());
    select.page_tables = step.rows.page_tables;
    select.row_table = step.rows.table_offset;
    select.row_positions = step.rows.positions;
    select.rows = static_cast<int>(n);
    select.heads = static_cast<int>(padded);
    select.top_k = static_cast<int>(index_topk_);
    select.max_visible = static_cast<int>(step.max_context);
    select.out = step.topk;
    select.out_counts = step.counts;
    select.ctas = fast_multiprocessors_;
    select.tensor_head_sum = !fp32_head_sum_forced();
    if (select.tensor_head_sum) select.consumer_warpgroups = indexer_warpgroups_forced();
    select.newest_first = !indexer_oldest_first_forced();
    if (select.tensor_head_sum && select.consumer_warpgroups != 2)
      select.check_pages = indexer_check_pages_forced();
    select.workspace_bytes = fused_indexer_topk_workspace_bytes(n, select.ctas);
    select.workspace = fs.fused.get<uint8_t>(static_cast<int64_t>(select.workspace_bytes));
    fused_indexer_topk(select, stream_);
    return;
  }

  if (options_.batch_invariant) {
    invariant_indexer_topk(quantize.queries_fp8, quantize.weights, layer, step, cache);
    return;
  }
  // scores [n, max_context]: row t filled for p < position_t + 1.
  float* scores = scratch_.scores.get<float>(n * step.max_context);
  indexer_scores(
      indexer_score_rows(quantize.queries_fp8, quantize.weights, layer, step, cache, 0, n, scores),
      stream_);

  // Positions of the top-k into step.topk [n, index_topk], -1 past counts.
  // The histogram is only used by rows longer than kTopkSmallRow.
  const int64_t workspace_rows = step.max_context > kTopkSmallRow ? n : 1;
  TopkParams select;
  select.scores = scores;
  select.score_stride = step.max_context;
  select.row_visible = step.row_visible;
  select.block_table = nullptr;  // positions mode
  select.rows = static_cast<int>(n);
  select.top_k = static_cast<int>(index_topk_);
  select.max_visible = static_cast<int>(step.max_context);
  select.out_slots = step.topk;
  select.histogram =
      zeroed_workspace<uint32_t>(fs.topk_histogram, workspace_rows * kTopkHistogramBins, stream_);
  select.row_state = zeroed_workspace<int32_t>(fs.topk_state, n * kTopkRowState, stream_);
  radix_topk(select, stream_);
}

// indexer_scores of step rows [first, first + rows) into scores [rows,
// max_context] (the queries, weights and token tables of the whole step).
IndexerScoreParams CudaDsaModel::indexer_score_rows(const uint8_t* queries_fp8,
                                                    const float* weights, int64_t layer,
                                                    const Step& step, PagedKvCache& cache,
                                                    int64_t first, int64_t rows,
                                                    float* scores) const {
  const int64_t padded = config_.index_n_heads <= 32 ? 32 : 64;  // as fast_indexer pads
  IndexerScoreParams score;
  score.queries = queries_fp8 + first * padded * kIndexerHeadDim;
  score.weights = weights + first * padded;
  score.key_pool = static_cast<const uint8_t*>(cache.indexer_pool(layer).raw());
  score.block_table = step.token_tables + first * step.table_stride;
  score.block_table_stride = static_cast<int>(step.table_stride);
  score.row_request = step.row_ids + first;
  score.row_visible = step.row_visible + first;
  score.scores = scores;
  score.score_stride = step.max_context;
  score.rows = static_cast<int>(rows);
  score.heads = static_cast<int>(padded);
  score.rows_per_group = 1;
  score.max_visible = static_cast<int>(step.max_context);
  return score;
}

// The deterministic mode's selection: the same per-row scores as the
// two-kernel path, then position_topk (exact; ties to the lower position;
// increasing order, which sparse MLA sums in) instead of radix_topk (whose
// slots and ties follow atomics). Rows go in chunks that keep the scores
// within kCudaIndexerScoresCap (the memory plan's bound); each row's result
// does not depend on its chunk.
void CudaDsaModel::invariant_indexer_topk(const uint8_t* queries_fp8, const float* weights,
                                          int64_t layer, Step& step, PagedKvCache& cache) {
  const int64_t n = step.tokens;
  const int64_t chunk =
      std::max<int64_t>(1, kCudaIndexerScoresCap / std::max<int64_t>(step.max_context, 1));
  float* scores = scratch_.scores.get<float>(std::min(n, chunk) * step.max_context);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    indexer_scores(indexer_score_rows(queries_fp8, weights, layer, step, cache, r0, rows, scores),
                   stream_);
    PositionTopkParams select;
    select.scores = scores;
    select.score_stride = step.max_context;
    select.positions = step.rows.positions + r0;
    select.rows = rows;
    select.topk = index_topk_;
    select.max_context = step.max_context;
    select.indices = step.topk + r0 * index_topk_;
    select.counts = step.counts + r0;
    position_topk(select, stream_);
  }
}

int64_t CudaDsaModel::selection_top_k(const Step& step) const {
  // Selections hold at most min(index_topk, longest context) positions: sparse
  // MLA walks only that many columns (max_context is part of a decode graph's
  // key, so this stays fixed within a captured graph).
  return std::max<int64_t>(1, std::min(index_topk_, step.max_context));
}

PositionsToSlotsParams CudaDsaModel::positions_to_slots_params(const Step& step, int64_t top_k,
                                                               int32_t* slots) const {
  PositionsToSlotsParams map;
  map.selected = step.topk;
  map.counts = step.counts;
  map.rows = step.rows;
  map.tokens = step.tokens;
  map.selected_stride = index_topk_;
  map.top_k = top_k;
  map.slots = slots;
  return map;
}

CudaDsaModel::SlotsKey CudaDsaModel::selection_key(const Step& step, int64_t top_k,
                                                   const int32_t* slots) const {
  return {selection_epoch_,
          step.topk,
          step.counts,
          step.rows.page_tables,
          step.rows.table_offset,
          step.rows.positions,
          step.tokens,
          top_k,
          slots};
}

CudaDsaModel::LayerSlots CudaDsaModel::layer_slots(const Step& step) {
  FastScratch& fs = fast_scratch_;
  const int64_t n = step.tokens;
  const int64_t top_k = selection_top_k(step);
  // step.topk positions -> physical slots [n, top_k] (-1 past counts), once
  // per selection: the IndexShare layers after a full one (same step, no
  // indexer run since) find its slots in place (SlotsKey). Inside a captured
  // CUDA Graph the same launches replay, so the reuse holds there too.
  const PositionsToSlotsParams map =
      positions_to_slots_params(step, top_k, fs.slots.get<int32_t>(n * top_k));
  const SlotsKey slots_key = selection_key(step, top_k, map.slots);
  const bool new_selection = !(fs.slots_key == slots_key);
  if (new_selection) {
    positions_to_slots(map, stream_);
    fs.slots_key = slots_key;
  }
  return {map.slots, top_k, new_selection};
}

void CudaDsaModel::map_slots_after_indexer(int64_t layer, const Step& step, PagedKvCache& cache) {
  if (!use_fast_attention(step) || row_block(step.tokens) < step.tokens) return;
  if (cache.spec().offload_pages == 0) {
    // Early inputs: the attention may read its slots before its grid-
    // dependency wait, so their mapping must not be the launch right before it
    // (with the query pack folded into the attention it would be).
    if (sparse_mla_early_inputs_enabled()) layer_slots(step);
    return;
  }
  // The full layer's slots and hot-line assignment right after its indexer:
  // the side stream's copies of its own misses then run beside this layer's
  // query projections instead of before its attention.
  stage_offload(layer, step.tokens, layer_slots(step), cache, /*assign_only=*/true);
}

std::optional<StageOffloadParams> CudaDsaModel::stage_offload(int64_t layer, int64_t n,
                                                              const LayerSlots& selected,
                                                              PagedKvCache& cache,
                                                              bool assign_only) {
  FastScratch& fs = fast_scratch_;
  const int64_t top_k = selected.top_k;
  const bool new_selection = selected.new_selection;
  const int64_t pool_slots = cache.spec().num_pages * cache.spec().page_size;
  const int64_t entries = n * top_k;
  if (!offload_staging_enabled() || entries > kOffloadStagingRows * index_topk_)
    return std::nullopt;
  StageOffloadParams stage;
  stage.slots = selected.slots;
  stage.staged_slots = fs.staged_slots.get<int32_t>(entries);
  stage.entries = entries;
  stage.pool_slots = pool_slots;
  stage.offload_pool = static_cast<const uint8_t*>(cache.offload_latent_pool(layer).raw());
  stage.staging = fs.staging.get<uint8_t>(entries * kLatentBytes);
  stage.entry_bytes = kLatentBytes;
  stage.counters = offload_read_counters();
  if (offload_hot_enabled()) {
    if (offload_hot_.lines == 0) {
      offload_hot_.lines = offload_hot_lines();
      offload_hot_.line_map = offload_line_map();
    }
    stage.line_map = offload_hot_.line_map;
    const int64_t lines = offload_hot_.lines;
    if (new_selection) offload_hot_.group = layer;
    DeviceBuffer& table = offload_hot_.tables[offload_hot_.group];
    const bool fresh = table.bytes() == 0;
    int32_t* tables = table.get<int32_t>(3 * lines);
    if (fresh) reset_offload_tables(tables, lines, stream_);
    stage.lines = lines;
    stage.tags = tables;
    stage.claims = tables + lines;
    stage.hits = tables + 2 * lines;
    stage.copy = fs.offload_copy.get<uint8_t>(entries);
    stage.hot_pool = offload_hot_.entries[layer].get<uint8_t>(lines * kLatentBytes);
  }
  if (new_selection) {
    // One step counted per forward: at the model's first full layer.
    stage.count_step = layer == first_indexer_layer();
    join_offload_fills();  // none are left here; a guard for odd layer orders
    assign_offload_entries(stage, stream_);
    if (stage.lines > 0 && offload_side_stream_enabled()) fill_offload_lines(stage, layer, cache);
  }
  if (assign_only) return stage;
  if (offload_hot_.pending.erase(layer) > 0) {
    // This layer's hot lines were filled on the side stream since the
    // assignment; only its staging rows are copied here.
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, offload_hot_.filled.at(layer), 0));
    stage.copies = OffloadCopies::kRows;
  }
  stage_offload_entries(stage, stream_);
  return stage;
}

bool CudaDsaModel::stage_offload_union(int64_t layer, const Step& step, PagedKvCache& cache) {
  OffloadUnion& u = offload_union_;
  u.layer = -1;
  const int64_t offload_slots = cache.spec().offload_pages * cache.spec().page_size;
  const int64_t n = step.tokens;
  const int64_t top_k = selection_top_k(step);
  // Decode-sized steps: stage_offload (the same bound).
  if (offload_slots == 0 || !offload_staging_enabled() || !use_fast_attention(step) ||
      n * top_k <= kOffloadStagingRows * index_topk_)
    return false;
  // Not inside a CUDA Graph capture (a verification step of many rows): its
  // host-side key check and first allocations cannot be captured; such a
  // step reads its offload entries from host memory (correct, slower).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MEGACTX_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;
  timer_.mark("attn offload staging", stream_);
  if (u.capacity < 0 || u.offload_slots != offload_slots) {
    // First use, or a new cache: marks at rest (zero) for its slots.
    u.capacity = std::min(offload_slots, offload_union_rows());
    u.offload_slots = offload_slots;
    u.assigned = SlotsKey{};
    if (u.capacity > 0) {
      u.scan_bytes = offload_union_scan_bytes(offload_slots);
      u.scan.ensure(u.scan_bytes);
      u.positions.get<int32_t>(offload_slots);
      u.list.get<int32_t>(u.capacity);
      u.rows.get<uint8_t>(u.capacity * kLatentBytes);
      u.marks = DeviceBuffer(static_cast<size_t>(offload_slots) * 4);
      MEGACTX_CUDA_CHECK(cudaMemsetAsync(u.marks.as<void>(), 0, u.marks.bytes(), stream_));
    }
  }
  if (u.capacity == 0) return false;
  OffloadUnionParams params;
  params.pool_slots = cache.spec().num_pages * cache.spec().page_size;
  params.offload_slots = offload_slots;
  params.capacity = u.capacity;
  params.marks = u.marks.as<int32_t>();
  params.positions = u.positions.as<int32_t>();
  params.list = u.list.as<int32_t>();
  params.scan_storage = u.scan.as<void>();
  params.scan_bytes = u.scan_bytes;
  const SlotsKey key = selection_key(step, top_k, nullptr);
  if (!(u.assigned == key)) {
    // A new selection (a full layer's indexer ran): every row block's slots
    // marked (the blocks' slots through the staged-slots buffer, one block
    // at a time), then listed.
    u.assigned = key;
    const int64_t block = row_block(n);
    for (int64_t first = 0; first < n; first += block) {
      const int64_t rows = std::min(block, n - first);
      const Step part =
          rows == n ? step : step.rows_of(first, rows, config_.qk_rope_head_dim / 2, index_topk_);
      const PositionsToSlotsParams map =
          positions_to_slots_params(part, top_k, u.staged_slots.get<int32_t>(rows * top_k));
      positions_to_slots(map, stream_);
      OffloadUnionParams mark = params;
      mark.slots = map.slots;
      mark.entries = rows * top_k;
      mark_offload_union(mark, stream_);
    }
    list_offload_union(params, stream_);
  }
  OffloadUnionCopyParams copy;
  copy.list = u.list.as<int32_t>();
  copy.count = u.positions.as<int32_t>() + (offload_slots - 1);
  copy.capacity = u.capacity;
  copy.offload_pool = static_cast<const uint8_t*>(cache.offload_latent_pool(layer).raw());
  copy.staging = u.rows.as<uint8_t>();
  copy.entry_bytes = kLatentBytes;
  copy_offload_union(copy, stream_);
  u.layer = layer;
  return true;
}

void CudaDsaModel::fast_sparse_mla(const float* q_latent, const float* q, const uint16_t* q16,
                                   int64_t layer, const Step& step, PagedKvCache& cache,
                                   float* o_latent) {
  FastScratch& fs = fast_scratch_;
  const int64_t n = step.tokens;
  const int64_t heads = plan_.attention.heads;  // this rank's (tensor parallel)
  const int64_t padded = round_up(heads, kSparseMlaHeadBlock);
  const int64_t qk = config_.qk_nope_head_dim + config_.qk_rope_head_dim;
  if (fast_multiprocessors_ == 0) {
    int device = 0;
    MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
    MEGACTX_CUDA_CHECK(
        cudaDeviceGetAttribute(&fast_multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  }

  const LayerSlots selected = layer_slots(step);
  const int64_t top_k = selected.top_k;

  // q = bf16 [q_latent | q_pe] per head: [n, padded, 576].
  MlaQueryPackParams pack;
  pack.q_latent = q_latent;
  if (q16 != nullptr) {  // unrotated bf16: the pack rotates
    pack.q_rope_bf16 = q16 + config_.qk_nope_head_dim;
    pack.cos = step.cos;
    pack.sin = step.sin;
    pack.interleaved = plan_.attention.rope_interleave;
  } else {
    pack.q_rope = q + config_.qk_nope_head_dim;
  }
  pack.rope_row_stride = heads * qk;
  pack.rope_head_stride = qk;
  pack.tokens = n;
  pack.heads = heads;
  pack.padded_heads = padded;
  pack.lora = kLatentRank;
  pack.rope = kLatentRope;
  pack.q = fs.q_bf16.get<uint16_t>(n * padded * kSparseMlaQueryDim);
  // Split-K merges change the rounding, and the split count follows the row
  // count: one split in the deterministic mode. Few rows (decode at small
  // batches): the cluster kernel, its splits merged in distributed shared memory.
  const int active_heads = static_cast<int>(round_up(heads, kSparseMlaClusterHeads));
  const int cluster_splits =
      options_.batch_invariant
          ? 0
          : sparse_mla_cluster_splits(static_cast<int>(n), active_heads, static_cast<int>(top_k));
  // Early inputs: the slots (the top-k of this or an earlier layer, mapped
  // to slots by layer_slots) and the entries (the latent write) come from
  // kernels at least two launches back, so the cluster kernel may load them
  // before its grid-dependency wait. Not with the host tier's staging or a
  // LayerSplit borrow (below), whose kernels run right before the attention.
  bool early = sparse_mla_early_inputs_enabled() && cache.spec().offload_pages == 0;
  // With early inputs the cluster kernel also turns Q's rope columns itself
  // when W_UK's bf16 product wrote the latent ones and no head is padding (the
  // pack would zero those): no pack launch, so W_UK's product is the launch
  // before the attention. Not when layer_slots mapped the slots just now
  // (map_slots_after_indexer usually does it earlier): the pack keeps that
  // mapping two launches back.
  const bool rope_in_kernel = early && !selected.new_selection && cluster_splits > 0 &&
                              pack.q_latent == nullptr && pack.q_rope_bf16 != nullptr &&
                              pack.interleaved && heads % kSparseMlaClusterHeads == 0 &&
                              config_.qk_nope_head_dim % 8 == 0 && qk % 8 == 0;
  if (!rope_in_kernel) pack_mla_queries(pack, stream_);

  SparseMlaParams attend;
  attend.q = pack.q;
  if (rope_in_kernel) {
    attend.q_rope_bf16 = pack.q_rope_bf16;
    attend.rope_row_stride = pack.rope_row_stride;
    attend.rope_head_stride = pack.rope_head_stride;
    attend.rope_cos = pack.cos;
    attend.rope_sin = pack.sin;
  }
  attend.slots = selected.slots;
  if (const std::optional<BorrowedEntries> borrowed = borrowed_entries(layer)) {
    // LayerSplit, a layer this rank does not hold: the owner's entries of
    // this step's selection, dense.
    attend.kv_pool = borrowed->rows;
    attend.slots = borrowed->slots;
    early = false;
  } else {
    attend.kv_pool = static_cast<const uint8_t*>(latent_pool_of(cache, layer));
  }
  if (cache.spec().offload_pages > 0) {
    // The live host tier: the selected entries of offload pages are staged in
    // device memory before the attention reads them, kept across steps in the
    // hot cache of the selection's group (the assignment once per selection:
    // the IndexShare layers after a full one reuse its staged slots; the
    // copy per layer), or, for steps that select more than the staging
    // holds, read from host memory by the attention kernel itself.
    timer_.mark("attn offload staging", stream_);
    attend.offload_pool = static_cast<const uint8_t*>(cache.offload_latent_pool(layer).raw());
    attend.pool_slots = cache.spec().num_pages * cache.spec().page_size;
    if (offload_union_.layer == layer) {
      // The step's union is in the staging (stage_offload_union): this
      // block's slots to its rows; entries past its capacity are read from
      // the host pool (staging_slots on).
      OffloadUnion& u = offload_union_;
      OffloadUnionParams rewrite;
      rewrite.slots = selected.slots;
      rewrite.entries = n * top_k;
      rewrite.staged_slots = u.staged_slots.get<int32_t>(rewrite.entries);
      rewrite.pool_slots = attend.pool_slots;
      rewrite.offload_slots = u.offload_slots;
      rewrite.capacity = u.capacity;
      rewrite.positions = u.positions.as<int32_t>();
      rewrite_offload_union(rewrite, stream_);
      attend.slots = rewrite.staged_slots;
      attend.staging_pool = attend.offload_pool;
      attend.staging_slots = attend.pool_slots + u.capacity;
      attend.offload_pool = u.rows.as<uint8_t>();
    } else if (const std::optional<StageOffloadParams> stage =
                   stage_offload(layer, n, selected, cache, /*assign_only=*/false)) {
      attend.slots = stage->staged_slots;
      if (stage->lines > 0) {
        attend.offload_pool = stage->hot_pool;
        attend.staging_pool = stage->staging;
        attend.staging_slots = stage->pool_slots + stage->lines;
      } else {
        attend.offload_pool = stage->staging;
      }
    }
    timer_.mark("attn sparse MLA", stream_);
  }
  attend.rows = static_cast<int>(n);
  attend.heads = static_cast<int>(padded);
  attend.top_k = static_cast<int>(top_k);
  attend.cluster_merge = cluster_splits > 0;
  attend.inputs_ready_at_launch = early;
  attend.active_heads = active_heads;  // the cluster kernel and the split merge skip the padding
  attend.num_splits =
      attend.cluster_merge ? cluster_splits
      : options_.batch_invariant
          ? 1
          : sparse_mla_splits(attend.rows, attend.heads, attend.top_k, fast_multiprocessors_);
  attend.fixed_kernel = options_.batch_invariant;
  attend.softmax_scale = softmax_scale_;
  attend.out = fs.out_bf16.get<uint16_t>(n * padded * kLatentRank);
  attend.lse = fs.lse.get<float>(n * padded);
  if (attend.num_splits > 1 && !attend.cluster_merge) {
    attend.partial_out = fs.partial_out.get<float>(n * attend.num_splits * padded * kLatentRank);
    attend.partial_lse = fs.partial_lse.get<float>(n * attend.num_splits * padded);
  }
  sparse_mla_attention(attend, stream_);
  if (o_latent == nullptr) return;  // w_uv_bf16 reads attend.out

  // bf16 [n, padded, 512] -> fp32 o_latent [n, heads, 512] for W_UV.
  MlaOutputUnpackParams unpack;
  unpack.attention = attend.out;
  unpack.tokens = n;
  unpack.heads = heads;
  unpack.padded_heads = padded;
  unpack.lora = kLatentRank;
  unpack.out = o_latent;
  unpack_mla_output(unpack, stream_);
}

bool CudaDsaModel::bf16_absorbed(int64_t rows) const {
  // MEGACTX_CUDA_BF16_ABSORBED_MIN_ROWS=N overrides the option (A/B runs
  // through serve; 0: never; read once).
  static const std::optional<int64_t> forced = []() -> std::optional<int64_t> {
    const char* value = std::getenv("MEGACTX_CUDA_BF16_ABSORBED_MIN_ROWS");
    if (value == nullptr || *value == '\0') return std::nullopt;
    const int64_t rows = std::atoll(value);
    return rows > 0 ? rows : std::numeric_limits<int64_t>::max();
  }();
  const int64_t min_rows = forced.value_or(options_.bf16_absorbed_min_rows);
  return options_.bf16_weights && !options_.batch_invariant && rows >= min_rows;
}

bool CudaDsaModel::bf16_activations(int64_t rows, const DeviceMatrix& writer) const {
  static const bool off = [] {
    const char* value = std::getenv("MEGACTX_CUDA_BF16_ACTIVATIONS");
    return value != nullptr && value[0] == '0';
  }();
  return !off && options_.bf16_activations && bf16_absorbed(rows) && (writer.bf16 || writer.fp8());
}

uint16_t* CudaDsaModel::absorb_bf16(int64_t rows) {
  // One size for every user (q_b's bf16 q or W_UK's bf16 q_nope, then W_UV's
  // bf16 o), so the grow-only buffer never reallocates (and synchronises)
  // between them.
  const int64_t per_head =
      std::max(config_.qk_nope_head_dim + config_.qk_rope_head_dim, config_.v_head_dim);
  return fast_scratch_.absorb_q_bf16.get<uint16_t>(rows * plan_.attention.heads * per_head);
}

void CudaDsaModel::w_uk_bf16(const DeviceLayer& w, const uint16_t* q16, int64_t rows,
                             int64_t head_stride) {
  FastScratch& fs = fast_scratch_;
  const int64_t heads = plan_.attention.heads;
  const int64_t padded = round_up(heads, kSparseMlaHeadBlock);
  const int64_t nope = config_.qk_nope_head_dim;
  // Into the packed queries [rows, padded, lora + rope]: head h's latent
  // columns; fast_sparse_mla's pack adds the rope columns and zero padded heads.
  uint16_t* packed = fs.q_bf16.get<uint16_t>(rows * padded * kSparseMlaQueryDim);
  blas_->linear_batched_bf16(q16, rows, nope, heads * head_stride, head_stride, w.w_uk_t_bf16,
                             kLatentRank, kLatentRank * nope, packed, padded * kSparseMlaQueryDim,
                             kSparseMlaQueryDim, heads,
                             /*y_f32=*/false);
}

void CudaDsaModel::w_uv_bf16(const DeviceLayer& w, int64_t rows, float* o, float* out) {
  FastScratch& fs = fast_scratch_;
  const int64_t heads = plan_.attention.heads;
  const int64_t padded = round_up(heads, kSparseMlaHeadBlock);
  const int64_t value = config_.v_head_dim, hidden = config_.hidden_size;
  const DeviceMatrix& o_proj = w.o;
  // bf16 o_proj weights: W_UV writes o in bf16 ([rows, heads * value], in
  // absorb_q_bf16: W_UK's input is dead by now) and o_proj reads it as it is,
  // instead of an fp32 o that the bf16 linear would round again.
  const bool bf16_o = o_proj.bf16 && !o_proj.fp8();
  void* y = bf16_o ? static_cast<void*>(absorb_bf16(rows)) : static_cast<void*>(o);
  blas_->linear_batched_bf16(fs.out_bf16.as<uint16_t>(), rows, kLatentRank, padded * kLatentRank,
                             kLatentRank, w.w_uv_bf16, value, value * kLatentRank, y, heads * value,
                             value, heads, /*y_f32=*/!bf16_o);
  if (bf16_o) {
    blas_->linear_bf16(y, rows, heads * value, heads * value, o_proj.data, hidden, out, hidden,
                       /*y_f32=*/true);
  } else {
    blas_->linear(o, rows, heads * value, o_proj, hidden, out);
  }
}

void CudaDsaModel::invalidate_offload_lines(std::span<const int32_t> pages,
                                            const PagedKvCache& cache) const {
  if (offload_hot_.tables.empty() || pages.empty()) return;
  InvalidateOffloadParams params;
  params.lines = offload_hot_.lines;
  params.pool_slots = cache.spec().num_pages * cache.spec().page_size;
  params.page_size = cache.spec().page_size;
  params.line_map = offload_hot_.line_map;
  for (size_t first = 0; first < pages.size(); first += kInvalidatePagesPerLaunch) {
    params.count =
        static_cast<int>(std::min<size_t>(kInvalidatePagesPerLaunch, pages.size() - first));
    std::copy_n(pages.begin() + static_cast<std::ptrdiff_t>(first), params.count, params.pages);
    for (auto& [group, table] : offload_hot_.tables) {
      params.tags = table.as<int32_t>();
      ::megactx::cuda::invalidate_offload_lines(params, stream_);
    }
  }
}

int64_t CudaDsaModel::first_indexer_layer() const {
  for (const LayerPlan& l : plan_.layers)
    if (l.runs_indexer) return l.layer;
  return -1;
}

void CudaDsaModel::fill_offload_lines(const StageOffloadParams& assigned, int64_t layer,
                                      PagedKvCache& cache) {
  // The layers that attend through this selection: the full layer and the
  // IndexShare layers after it (a layer outside the plan, the MTP layer, alone).
  std::vector<int64_t> group = {layer};
  if (layer < std::ssize(plan_.layers) && plan_.layers[layer].runs_indexer) {
    for (int64_t l = layer + 1; l < std::ssize(plan_.layers); ++l)
      if (!plan_.layers[l].runs_indexer && plan_.layers[l].indexer_source == layer)
        group.push_back(l);
  }
  OffloadHot& hot = offload_hot_;
  if (hot.side == nullptr) {
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&hot.side, cudaStreamNonBlocking));
    MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&hot.assigned, cudaEventDisableTiming));
  }
  // Every layer's misses start once the assignment is done and run beside
  // the compute stream's work until that layer's attention waits for them.
  MEGACTX_CUDA_CHECK(cudaEventRecord(hot.assigned, stream_));
  MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(hot.side, hot.assigned, 0));
  for (const int64_t l : group) {
    StageOffloadParams fill = assigned;
    fill.copies = OffloadCopies::kLines;
    fill.max_blocks = offload_fill_blocks();
    fill.offload_pool = static_cast<const uint8_t*>(cache.offload_latent_pool(l).raw());
    fill.hot_pool = hot.entries[l].get<uint8_t>(hot.lines * kLatentBytes);
    stage_offload_entries(fill, hot.side);
    auto [event, created] = hot.filled.try_emplace(l, nullptr);
    if (created)
      MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&event->second, cudaEventDisableTiming));
    MEGACTX_CUDA_CHECK(cudaEventRecord(event->second, hot.side));
    hot.pending.insert(l);
  }
}

void CudaDsaModel::join_offload_fills() {
  // A captured graph must end with the side stream joined back.
  for (const int64_t l : offload_hot_.pending)
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, offload_hot_.filled.at(l), 0));
  offload_hot_.pending.clear();
}

OffloadReadCounters* CudaDsaModel::offload_read_counters() {
  // Allocated at the first step over offload pages: an eager one (graphs are
  // captured only for keys seen before), and never regrown.
  if (offload_hot_.counters.bytes() == 0) {
    offload_hot_.counters.get<OffloadReadCounters>(1);
    MEGACTX_CUDA_CHECK(
        cudaMemsetAsync(offload_hot_.counters.as<void>(), 0, sizeof(OffloadReadCounters), stream_));
  }
  return offload_hot_.counters.as<OffloadReadCounters>();
}

void CudaDsaModel::read_back_offload_counters() {
  if (offload_hot_.counters.bytes() == 0) return;
  // Read by offload_read_stats after the caller's next wait on the stream.
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(offload_hot_.readback.get<OffloadReadCounters>(1),
                                     offload_hot_.counters.as<void>(), sizeof(OffloadReadCounters),
                                     cudaMemcpyDeviceToHost, stream_));
}

OffloadReadStats CudaDsaModel::offload_read_stats() const {
  OffloadReadStats stats;
  if (offload_hot_.counters.bytes() == 0) return stats;
  const auto* counters = offload_hot_.readback.get<OffloadReadCounters>(1);
  stats.selected_entries = static_cast<int64_t>(counters->selected);
  stats.hot_hits = static_cast<int64_t>(counters->hot_hits);
  stats.copied_bytes = static_cast<int64_t>(counters->copied_entries) * kLatentBytes;
  stats.read_steps = static_cast<int64_t>(counters->steps);
  return stats;
}

void CudaDsaModel::reset_offload_hot() const {
  for (auto& [group, table] : offload_hot_.tables)
    reset_offload_tables(table.as<int32_t>(), offload_hot_.lines, stream_);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA

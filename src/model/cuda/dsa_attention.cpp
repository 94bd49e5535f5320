// CudaDsaModel: MLA attention with the DSA indexer, as DsaModel::attention /
// DsaModel::indexer, on device buffers (fp32 parity path).
#if MEGACTX_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx::cuda {
namespace {

// HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps; the
// indexer's key LayerNorm uses 1e-6 too (as dsa_model.cpp).

// MEGACTX_CUDA_STACKED_QKV_A=0: q_a and kv_a as two GEMMs on their views of
// the stacked weight (A/B runs; read once).
bool stacked_qkv_a() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_CUDA_STACKED_QKV_A");
    return !(value != nullptr && value[0] == '0');
  }();
  return on;
}

}  // namespace

void CudaDsaModel::attention(const DeviceLayer& w, int64_t layer, const float* h, Step& step,
                             PagedKvCache& cache, float* out, int64_t own_first, int64_t own_last) {
  Scratch& sc = scratch_;
  const AttentionDims& d = plan_.attention;
  const int64_t n = step.tokens, hidden = d.hidden, heads = d.heads, nope = d.nope, rope = d.rope;
  const int64_t qk = d.qk, lora = d.kv_lora, value = d.value, entry = d.entry, q_lora = d.q_lora;

  timer_.mark("attn q_a | kv_a", stream_);
  // h (shared by decoder_layer) feeds q_a, kv_a and the indexer's wk /
  // weights_proj; q_resid feeds q_b and wq_b: the bf16 linears read the copies
  // their norms wrote (Blas::share_input) instead of converting them each.
  // q_resid: [n, q_lora] (the indexer reads it too), row stride q_stride.
  // With the stacked q_a | kv_a weight one GEMM writes [n, q_lora | entry]
  // (in the q_resid buffer, which the memory plan sizes for both; fp8 stacks
  // add zero columns up to whole 128-blocks, w.qkv_a_rows): q_resid and kv
  // are its column ranges.
  float* q_resid = nullptr;
  float* kv = nullptr;
  int64_t q_stride = q_lora, kv_stride = entry;
  if (q_lora > 0 && w.qkv_a && stacked_qkv_a()) {
    q_stride = kv_stride = w.qkv_a_rows;
    q_resid = sc.q_resid.get<float>(n * q_stride);
    blas_->linear(h, n, hidden, w.qkv_a, q_stride, q_resid);
    kv = q_resid + q_lora;
  } else if (q_lora > 0) {
    q_resid = sc.q_resid.get<float>(n * q_lora);
    blas_->linear(h, n, hidden, w.q_a, q_lora, q_resid);
  }
  timer_.mark("attn q_a norm", stream_);
  if (q_lora > 0) {
    void* q_resid_bf16 = gemm_input_copy(sc.q_resid_bf16, n * q_lora);
    // q_b's (and the indexer's wq_b's) e4m3 input, when they are fp8 (fp8_copy).
    const Fp8Copy q_resid_fp8 =
        fp8_copy(sc.q_resid_fp8, sc.q_resid_fp8_scales, n, q_lora, w.q_b.fp8());
    // In place; only the bf16 copy when every reader is a bf16 linear.
    const bool f32 = reads_f32_q_resid(w);
    rmsnorm(q_resid, n, q_lora, q_stride, w.q_a_norm, kLatentNormEps, f32 ? q_resid : nullptr,
            q_stride, stream_, q_resid_bf16, q_resid_fp8);
    blas_->share_input(q_resid, n, q_lora, q_stride, q_resid_bf16, f32);
    blas_->share_fp8_input(q_resid, n, q_lora, q_stride, q_resid_fp8.q, q_resid_fp8.scale_rows,
                           q_resid_fp8.scale_groups);
  }

  // kv: [n, c_kv | k_rope] -> normed latent and rotated key, into the cache.
  // Shared MTP draft rows (KVShare) need no key: they leave the cache as
  // step 0 wrote it and attend through step 0's selection (with the stacked
  // weight their kv columns are computed and left unused).
  // LayerSplit: only the layer's owner holds its pools and writes them
  // (share_layer_kv then hands them to the others).
  timer_.mark("attn latent write", stream_);
  const bool owner = plan_.holds_kv(layer);
  if (!step.shared && owner && plan_.layer_split) before_layer_split_write(layer);
  if (!step.shared && owner) {
    if (kv == nullptr) {
      kv = sc.kv.get<float>(n * entry);
      blas_->linear(h, n, hidden, w.kv_a, entry, kv);
    }
    LatentWriteParams latent;
    latent.kv = kv;
    latent.stride = kv_stride;
    latent.tokens = n;
    latent.lora = lora;
    latent.rope = rope;
    latent.norm_weight = w.kv_a_norm;
    latent.eps = kLatentNormEps;
    latent.cos = step.cos;
    latent.sin = step.sin;
    latent.interleaved = d.rope_interleave;
    latent.pool = cache.latent_pool(layer).raw();
    latent.layout = step.latent;
    latent.rows = step.rows;
    if (fused_latent_write()) {
      norm_rope_write_latent(latent, stream_);
    } else {
      detail::norm_rope_write_latent_separately(latent, stream_);
    }
  }

  const bool runs_indexer = w.has_indexer && !step.shared;
  if (runs_indexer && owner) {
    timer_.mark("indexer proj + cache", stream_);
    indexer(w, layer, h, q_resid, q_stride, step, cache, own_first, own_last);
    map_slots_after_indexer(layer, step, cache);
  }
  if (plan_.layer_split && !step.shared) share_layer_kv(layer, runs_indexer, step, cache);

  // The attention core, in blocks of row_block(n) rows: every row's key is in
  // the cache and its selection in step.topk, so a block needs nothing of the
  // others, and its activations below are [block, ...] whatever n is. This
  // rank's rows only (context parallelism: its share).
  const int64_t block = row_block(own_last - own_first);
  // The live host tier, large steps: the union of the step's selected
  // offload entries into device rows, for all of its blocks at once.
  stage_offload_union(layer, step, cache);
  float* q = sc.q.get<float>(block * heads * qk);  // [block, heads, nope | rope]
  float* q_latent = sc.q_latent.get<float>(block * heads * lora);
  float* o_latent = sc.o_latent.get<float>(block * heads * lora);
  float* o = sc.o.get<float>(block * heads * value);
  for (int64_t first = own_first; first < own_last; first += block) {
    const int64_t rows = std::min(block, own_last - first);
    const Step part = rows == n ? step : step.rows_of(first, rows, rope / 2, index_topk_);
    timer_.mark("attn q_b", stream_);
    const bool fast = use_fast_attention(part);
    const bool bf16_products = fast && bf16_absorbed(rows) && w.w_uk_t_bf16 != nullptr;
    // The bf16 absorbed products with bf16 q_b weights take q in bf16 straight
    // from the GEMM ([rows, heads, nope | rope], unrotated: the query pack
    // rotates the rope columns), instead of an fp32 q rotated, then converted.
    const bool bf16_q = bf16_products && bf16_activations(rows, w.q_b);
    const float* q_input = q_resid != nullptr ? q_resid + first * q_stride : h + first * hidden;
    const int64_t q_in = q_resid != nullptr ? q_lora : hidden;
    const int64_t q_input_stride = q_resid != nullptr ? q_stride : hidden;
    uint16_t* q16 = nullptr;
    if (bf16_q) {
      q16 = absorb_bf16(rows);
      blas_->linear_to_bf16(q_input, rows, q_in, q_input_stride, w.q_b, heads * qk, q16,
                            heads * qk);
    } else {
      blas_->linear(q_input, rows, q_in, q_input_stride, w.q_b, heads * qk, q, heads * qk);
      cuda::rope(q + nope, rows, heads, heads * qk, qk, rope, part.cos, part.sin, d.rope_interleave,
                 stream_);
    }
    timer_.mark("attn absorb W_UK", stream_);
    // Absorbed queries, per head: q_latent[t, head] = q_nope[t, head] . W_UK[head]
    // (w_uk_t [heads, lora, nope]) -> [rows, heads, lora]; in bf16 straight
    // into the fast path's packed queries (bf16_absorbed).
    if (bf16_q) {
      w_uk_bf16(w, q16, rows, qk);
    } else if (bf16_products) {
      // q_nope [rows * heads, nope] in bf16 (the rope columns stay behind).
      q16 = absorb_bf16(rows);
      float_to_bf16_rows(q, rows * heads, nope, qk, q16, stream_);
      w_uk_bf16(w, q16, rows, nope);
    } else {
      blas_->linear_batched(q, rows, nope, heads * qk, qk, w.w_uk_t, lora, lora * nope, q_latent,
                            heads * lora, lora, heads);
    }

    // Sparse attention over the selected positions, read from the paged pool.
    if (fast) {  // fp8 DSA kernels: model/cuda/dsa_fast_attention.cpp
      timer_.mark("attn sparse MLA", stream_);
      fast_sparse_mla(bf16_products ? nullptr : q_latent, bf16_q ? nullptr : q,
                      bf16_q ? q16 : nullptr, layer, part, cache,
                      bf16_products ? nullptr : o_latent);
    } else {
      MlaFallbackParams p;
      p.q_latent = q_latent;
      p.q_rope = q + nope;
      p.rope_row_stride = heads * qk;
      p.rope_head_stride = qk;
      p.pool = latent_pool_of(cache, layer);
      p.layout = part.latent;
      p.rows = part.rows;
      p.indices = part.topk;
      p.counts = part.counts;
      p.index_stride = index_topk_;
      p.tokens = rows;
      p.heads = heads;
      p.kv_lora = lora;
      p.rope = rope;
      p.scale = softmax_scale_;
      p.out = o_latent;
      timer_.mark("attn sparse MLA", stream_);
      mla_attention_fallback(p, stream_);
    }
    timer_.mark("attn W_UV + o_proj", stream_);
    // Expand per head with W_UV ([heads, value, lora]) -> [rows, heads * value]; then o_proj.
    if (bf16_products) {
      w_uv_bf16(w, rows, o, out + first * hidden);
    } else {
      blas_->linear_batched(o_latent, rows, lora, heads * lora, lora, w.w_uv, value, value * lora,
                            o, heads * value, value, heads);
      blas_->linear(o, rows, heads * value, w.o, hidden, out + first * hidden);
    }
  }
  if (q_resid != nullptr) blas_->unshare_input(q_resid);
}

void CudaDsaModel::indexer(const DeviceLayer& w, int64_t layer, const float* h,
                           const float* q_resid, int64_t q_resid_stride, Step& step,
                           PagedKvCache& cache, int64_t own_first, int64_t own_last) {
  Scratch& sc = scratch_;
  ++selection_epoch_;  // step.topk is written below
  const AttentionDims& d = plan_.attention;
  const int64_t n = step.tokens, hidden = d.hidden, heads = d.index_heads, dim = d.index_dim;
  const int64_t rope = d.rope, q_lora = d.q_lora;  // prepare_device checked the q-LoRA
  const bool interleaved = d.indexer_rope_interleave;

  // This rank's rows score (context parallelism: its share); every row's key
  // goes into the cache.
  const int64_t own = own_last - own_first;
  // The scoring rows' step: the step itself (its lazily built row tables
  // stay with it), or this rank's rows of it.
  Step share;
  if (own != n) share = step.rows_of(own_first, own, rope / 2, index_topk_);
  Step& part = own == n ? step : share;
  // Heads are [rope | nope] (rope first, unlike MLA).
  float* q = sc.iq.get<float>(own * heads * dim);
  blas_->linear(q_resid + own_first * q_resid_stride, own, q_lora, q_resid_stride, w.wq_b,
                heads * dim, q, heads * dim);
  cuda::rope(q, own, heads, heads * dim, dim, rope, part.cos, part.sin, interleaved, stream_);
  // The key: LayerNorm, RoPE on its first `rope` values, into the cache (one
  // launch, or the three with MEGACTX_FUSED_LATENT_WRITE=0).
  float* k_raw = sc.k_raw.get<float>(n * dim);
  float* k = sc.k.get<float>(n * dim);
  blas_->linear(h, n, hidden, w.wk, dim, k_raw);
  IndexerKeyWriteParams key;
  key.k_raw = k_raw;
  key.k = k;
  key.tokens = n;
  key.dim = dim;
  key.rope = rope;
  key.norm_weight = w.k_norm_weight;
  key.norm_bias = w.k_norm_bias;
  key.eps = kIndexerNormEps;
  key.cos = step.cos;
  key.sin = step.sin;
  key.interleaved = interleaved;
  key.pool = cache.indexer_pool(layer).raw();
  key.layout = step.indexer;
  key.rows = step.rows;
  if (fused_latent_write()) {
    norm_rope_write_indexer_key(key, stream_);
  } else {
    detail::norm_rope_write_indexer_key_separately(key, stream_);
  }
  // weights [n, heads] = weights_proj(h) * heads^-0.5; the fast path's
  // quantisation applies the factor itself (one launch fewer).
  float* weights = sc.iw.get<float>(own * heads);
  blas_->linear(h + own_first * hidden, own, hidden, w.weights_proj, heads, weights);
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  if (use_fast_attention(part)) {  // fp8 DSA kernels: model/cuda/dsa_fast_attention.cpp
    timer_.mark("indexer scores + top-k", stream_);
    fast_indexer(q, weights, head_scale, layer, part, cache);
    return;
  }
  scale(weights, head_scale, own * heads, stream_);

  IndexerFallbackParams p;
  p.q = q;
  p.weights = weights;
  p.pool = cache.indexer_pool(layer).raw();
  p.layout = part.indexer;
  p.rows = part.rows;
  p.tokens = own;
  p.heads = heads;
  p.dim = dim;
  p.topk = index_topk_;
  p.max_context = part.max_context;
  p.scale = 1.0f / std::sqrt(static_cast<float>(dim));
  p.scores = sc.scores.get<float>(own * part.max_context);
  p.indices = part.topk;
  p.counts = part.counts;
  timer_.mark("indexer scores + top-k", stream_);
  indexer_topk_fallback(p, stream_);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA

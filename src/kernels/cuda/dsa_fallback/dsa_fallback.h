// The exact-parity (fp32 compute) DSA path of the CUDA model: cache writes in
// the F32/BF16/FP8 layouts of cache/kv_cache.h, the fp32 indexer with its top-k,
// and sparse MLA reading the selected latents straight from the paged pool.
// The fast fp8 path is kernels/cuda/{indexer,topk,sparse_mla}.
//
// Paging: every new token t of the batch knows its sequence's page table as
// `page_tables + table_offset[t]` (int32 pages); position p of that sequence
// lives at slot = table[p / page_size] * page_size + p % page_size.
//
// Padding rows (a decode step padded to a CUDA-graph batch bucket,
// model/cuda/decode_graph.h) have position -1: they write no cache entry,
// see no key (counts 0, indices -1) and attend to nothing (output 0).
// Their table_offset is 0 and never used to address the pool.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class CacheDType : uint8_t { F32, BF16, FP8 };

// One pool's per-token entry: `width` values. F32/BF16: plain. FP8: the first
// `fp8_count` values as e4m3 codes, then one fp32 scale per 128 of them
// (amax / 448, 1 for a zero group), then the rest as bf16 (the latent's rope
// part; nothing for indexer keys).
struct CacheLayout {
  CacheDType dtype = CacheDType::F32;
  int64_t width = 0;
  int64_t fp8_count = 0;
  // constexpr: callable from device code (--expt-relaxed-constexpr).
  constexpr int64_t bytes() const {
    if (dtype == CacheDType::F32) return width * 4;
    if (dtype == CacheDType::BF16) return width * 2;
    return fp8_count + 4 * ((fp8_count + 127) / 128) + 2 * (width - fp8_count);
  }
};

struct PagedRows {
  const int32_t* page_tables = nullptr;   // concatenated page tables of the batch
  const int32_t* table_offset = nullptr;  // [tokens] first page of token t's table
  const int32_t* positions = nullptr;     // [tokens] position of token t in its sequence
  int64_t page_size = 64;
};

// pool entry of token t's slot <- values[t, 0:layout.width) (row stride `stride`).
// FP8 entries whose size is a multiple of 4 bytes are written a warp per
// 128-value group (others, and MEGACTX_CUDA_PLAIN_FALLBACK=1, a thread per
// group): the same bytes either way.
void write_cache_rows(void* pool, const CacheLayout& layout, const PagedRows& rows, int64_t tokens,
                      const float* values, int64_t stride, cudaStream_t stream);

// A layer's new latent rows into its cache in one launch: kv [tokens, lora |
// rope] (row stride `stride`) gets c_kv = rmsnorm(c_kv) * norm_weight and its
// rope part turned by (cos, sin) [tokens, rope / 2] in place, then each row is
// written to its slot as write_cache_rows writes it. The operations of
// rmsnorm + rope + write_cache_rows in their order, so the same bits
// (detail::norm_rope_write_latent_separately runs those three).
struct LatentWriteParams {
  float* kv = nullptr;
  int64_t stride = 0, tokens = 0, lora = 0, rope = 0;
  const float* norm_weight = nullptr;
  float eps = 0.0f;
  const float* cos = nullptr;
  const float* sin = nullptr;
  bool interleaved = false;
  void* pool = nullptr;
  CacheLayout layout;  // width == lora + rope
  PagedRows rows;
};
void norm_rope_write_latent(const LatentWriteParams& p, cudaStream_t stream);
// Whether the CUDA model writes its latent rows with the one launch above
// (else the three; DsaFallback.FusedLatentWriteEqualsTheThreeLaunches): two
// launches fewer per layer. MEGACTX_FUSED_LATENT_WRITE=0 picks the three
// (A/B runs); fused_latent_write() reads both.
inline constexpr bool kFusedLatentWrite = true;
bool fused_latent_write();

// The indexer's new keys into its cache in one launch, as the latent rows
// above: k [tokens, dim] (dense) <- LayerNorm(k_raw) * weight + bias, its
// first `rope` values turned by (cos, sin) [tokens, rope / 2] (the indexer's
// heads are [rope | nope]), then each row written to its slot as
// write_cache_rows writes it. k may be k_raw. The operations of layernorm +
// rope + write_cache_rows in their order, so the same bits
// (detail::norm_rope_write_indexer_key_separately runs those three); two
// launches fewer per full indexer layer. fused_latent_write() picks it too.
struct IndexerKeyWriteParams {
  const float* k_raw = nullptr;
  float* k = nullptr;
  int64_t tokens = 0, dim = 0, rope = 0;
  const float* norm_weight = nullptr;
  const float* norm_bias = nullptr;
  float eps = 0.0f;
  const float* cos = nullptr;
  const float* sin = nullptr;
  bool interleaved = false;
  void* pool = nullptr;
  CacheLayout layout;  // width == dim
  PagedRows rows;
};
void norm_rope_write_indexer_key(const IndexerKeyWriteParams& p, cudaStream_t stream);

// scores[t, p] for p < positions[t] + 1 (causal), = sum_h weights[t,h] *
// relu(scale * q[t,h,:] . key[p]); keys read from the indexer pool. Then
// indices[t, 0:topk) = the top-k positions (ties to the lower position) in
// increasing order, -1 after counts[t] (position_topk.h). scores: scratch
// [tokens, max_context].
struct IndexerFallbackParams {
  const float* q = nullptr;        // [tokens, heads, dim]
  const float* weights = nullptr;  // [tokens, heads]
  const void* pool = nullptr;
  CacheLayout layout;  // width == dim
  PagedRows rows;
  int64_t tokens = 0, heads = 0, dim = 0, topk = 0, max_context = 0;
  float scale = 1.0f;
  float* scores = nullptr;     // [tokens, max_context] scratch
  int32_t* indices = nullptr;  // [tokens, topk] out
  int32_t* counts = nullptr;   // [tokens] out
};
void indexer_topk_fallback(const IndexerFallbackParams& p, cudaStream_t stream);

// out[t, h, :] = softmax_j(scale * (q_latent . c_kv_j + q_rope . k_rope_j)) c_kv_j
// over the positions indices[t, 0:counts[t]) of token t's sequence.
// kv_lora <= 512 and rope <= 64 (per-lane registers of the kernel).
struct MlaFallbackParams {
  const float* q_latent = nullptr;  // [tokens, heads, kv_lora]
  const float* q_rope =
      nullptr;  // token t head h at q_rope + t*rope_row_stride + h*rope_head_stride
  int64_t rope_row_stride = 0, rope_head_stride = 0;
  const void* pool = nullptr;  // latent pool, entries [kv_lora | rope]
  CacheLayout layout;          // width == kv_lora + rope
  PagedRows rows;
  const int32_t* indices = nullptr;  // [tokens, index_stride]
  const int32_t* counts = nullptr;   // [tokens]
  int64_t index_stride = 0, tokens = 0, heads = 0, kv_lora = 0, rope = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [tokens, heads, kv_lora]
};
void mla_attention_fallback(const MlaFallbackParams& p, cudaStream_t stream);

// The plain kernels behind the fast ones above (tests compare them): the first
// reads every key value once per head, the second one key after another per
// warp, one head per block. The fast indexer scorer equals the plain one bit for
// bit and serves index dims 16/32/64/128; the tiled sparse MLA (a different
// summation order, fp32 throughout) serves kv_lora <= 512 wherever its shared
// memory fits the device. Other shapes run the plain kernels, and so does every
// launch under MEGACTX_CUDA_PLAIN_FALLBACK=1 (to measure the two in one build).
namespace detail {
// Only the scores (p.scores) of indexer_topk_fallback; plain: the plain kernel.
void indexer_scores_fallback(const IndexerFallbackParams& p, bool plain, cudaStream_t stream);
void mla_attention_fallback_plain(const MlaFallbackParams& p, cudaStream_t stream);
// norm_rope_write_latent as three launches (rmsnorm, rope, write_cache_rows).
void norm_rope_write_latent_separately(const LatentWriteParams& p, cudaStream_t stream);
// norm_rope_write_indexer_key as three launches (layernorm, rope, write_cache_rows).
void norm_rope_write_indexer_key_separately(const IndexerKeyWriteParams& p, cudaStream_t stream);
}  // namespace detail

}  // namespace megactx::cuda

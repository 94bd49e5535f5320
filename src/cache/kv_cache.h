// PagedKvCache: the device memory of the two caches a DSA model keeps, in
// pages of `page_size` (64) tokens. A token's physical place is its *slot*:
// slot = page * page_size + offset_in_page.
//
//  * The latent cache: one entry per token for every attention layer (and the
//    MTP layer): [c_kv (kv_lora_rank) | k_rope (qk_rope_head_dim)], never the
//    expanded K/V.
//  * The indexer-key cache: one key (index_head_dim) per token, only for layers
//    that run an indexer (full layers and the MTP layer). Shared (IndexShare)
//    layers get no indexer pool at all.
//
// Per-token byte layouts (per layer):
//   latent  F32 : (kv_lora + rope) x f32                       = 2304 B for 512+64
//           BF16: (kv_lora + rope) x bf16                      = 1152 B
//           FP8 : kv_lora x e4m3 | kv_lora/128 x f32 scale | rope x bf16 = 656 B
//   indexer F32 : index_head_dim x f32                          = 512 B for 128
//           BF16: index_head_dim x bf16                         = 256 B
//           FP8 : index_head_dim x e4m3 | 1 x f32 scale         = 132 B
// FP8 scales are amax / 448 per 128-element group (1 when the group is zero);
// the rope part stays bf16 because RoPE'd keys need the precision.
//
// Storage: pools[layer_slot] is one array [num_pages * page_size, bytes_per_token].
// Prefill and decode read the same layout the same way, so scoring a sequence
// by prefill and by decode gives the same logprobs.
//
// The live host tier (offload pages): pages [num_pages, num_pages +
// offload_pages) keep their indexer keys in the indexer pools with every
// other page's (those pools hold total_pages()), and their latent entries in
// separate offload pools [offload_pages * page_size, latent bytes] in host
// memory (pinned for a device model). The indexer reads every key of a
// context, a decode step only its top-k latents: a long running request's
// latents can wait in host memory (Scheduler::offload_pages moves them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace megactx {

enum class KvDType : uint8_t { F32, BF16, FP8 };

struct KvCacheSpec {
  int64_t num_pages = 0;
  int64_t page_size = 64;
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t index_head_dim = 0;
  std::vector<int64_t>
      latent_layers;  // layer ids with a latent pool (MTP layer = num_hidden_layers)
  std::vector<int64_t> indexer_layers;  // layer ids with an indexer-key pool
  KvDType dtype = KvDType::BF16;
  Device device = Device::CPU;
  // Pages whose latents live in host memory (the live host tier; 0: none).
  int64_t offload_pages = 0;
  // Latent pools of one layer that a rank keeps beside its own for what
  // another rank sends it (LayerSplit on GPUs: the owner's pool of the layer
  // being computed, model/cuda/dsa_layer_split.cpp). Counted in
  // bytes_per_page so the page plan leaves room for them; the cache does not
  // allocate them.
  int64_t borrowed_latent_pools = 0;

  int64_t total_pages() const { return num_pages + offload_pages; }
  int64_t latent_bytes_per_token() const;
  int64_t indexer_bytes_per_token() const;
  // Bytes for one page across every pool (borrowed ones included).
  int64_t bytes_per_page() const;
  // An offload page's bytes: its indexer keys on the pools' device, its
  // latents in host memory.
  int64_t indexer_bytes_per_page() const;
  int64_t latent_bytes_per_page() const;
};

class PagedKvCache {
 public:
  // Host storage; the CUDA backend allocates device storage through its own
  // factory and hands the pointers in with from_storage().
  explicit PagedKvCache(KvCacheSpec spec);
  // indexer_pools hold spec.total_pages(), latent_pools spec.num_pages and
  // offload_latent_pools (host memory) spec.offload_pages pages.
  PagedKvCache(KvCacheSpec spec, std::vector<Tensor> latent_pools,
               std::vector<Tensor> indexer_pools, std::vector<Tensor> offload_latent_pools = {});

  const KvCacheSpec& spec() const { return spec_; }
  bool has_latent(int64_t layer) const;
  bool has_indexer(int64_t layer) const;

  // Raw entries (host pointers only when spec().device == CPU; an offload
  // page's latent entries are always host pointers).
  std::byte* latent_entry(int64_t layer, int64_t slot);
  std::byte* indexer_entry(int64_t layer, int64_t slot);
  const Tensor& latent_pool(int64_t layer) const;
  const Tensor& indexer_pool(int64_t layer) const;
  // [offload_pages * page_size, latent bytes] in host memory.
  const Tensor& offload_latent_pool(int64_t layer) const;
  // The first byte of page `page`'s entries in a pool (page copies).
  const std::byte* latent_page(int64_t layer, int64_t page) const;
  const std::byte* indexer_page(int64_t layer, int64_t page) const;
  bool is_offload_page(int64_t page) const { return page >= spec_.num_pages; }

  // Host encode/decode of one token (CPU backend and tests).
  void write_latent(int64_t layer, int64_t slot, const float* c_kv, const float* k_rope);
  void read_latent(int64_t layer, int64_t slot, float* c_kv, float* k_rope) const;
  void write_indexer_key(int64_t layer, int64_t slot, const float* key);
  void read_indexer_key(int64_t layer, int64_t slot, float* key) const;

  // Copies page `source` to page `destination` in every pool (host pools).
  void copy_page(int64_t source, int64_t destination);

 private:
  KvCacheSpec spec_;
  std::vector<int64_t> latent_index_;   // layer -> pool index or -1
  std::vector<int64_t> indexer_index_;  // layer -> pool index or -1
  std::vector<Tensor> latent_pools_;
  std::vector<Tensor> indexer_pools_;
  std::vector<Tensor> offload_latent_pools_;
};

// One latent entry in `spec`'s layout (latent_bytes_per_token() bytes, as
// latent_entry() holds them) decoded into c_kv [kv_lora_rank] and k_rope
// [qk_rope_head_dim]: what read_latent does, for an entry copied out of a
// pool (LayerSplit sends the owner's entries to the group in this form).
void decode_latent_entry(const KvCacheSpec& spec, const std::byte* entry, float* c_kv,
                         float* k_rope);

}  // namespace megactx

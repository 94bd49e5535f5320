#include "cache/host_kv_tier.h"

#include <cstring>

#include "core/error.h"

namespace megactx {

void check_kv_page_copy(const PagedKvCache& from, std::span<const int32_t> from_pages,
                        const PagedKvCache& to, std::span<const int32_t> to_pages) {
  const KvCacheSpec& a = from.spec();
  const KvCacheSpec& b = to.spec();
  MEGACTX_CHECK(a.page_size == b.page_size && a.kv_lora_rank == b.kv_lora_rank &&
                    a.qk_rope_head_dim == b.qk_rope_head_dim &&
                    a.index_head_dim == b.index_head_dim && a.dtype == b.dtype &&
                    a.latent_layers == b.latent_layers && a.indexer_layers == b.indexer_layers,
                "KV page copy between caches of different layouts");
  MEGACTX_CHECK(from_pages.size() == to_pages.size(), "KV page copy of {} pages into {}",
                from_pages.size(), to_pages.size());
  for (size_t i = 0; i < from_pages.size(); ++i) {
    MEGACTX_CHECK(from_pages[i] >= 0 && from_pages[i] < a.total_pages() && to_pages[i] >= 0 &&
                      to_pages[i] < b.total_pages(),
                  "KV page copy {} -> {} outside [0, {}) / [0, {})", from_pages[i], to_pages[i],
                  a.total_pages(), b.total_pages());
  }
}

void for_each_page_run(const PagedKvCache& from, std::span<const int32_t> from_pages,
                       PagedKvCache& to, std::span<const int32_t> to_pages,
                       const std::function<void(const std::byte* source, std::byte* destination,
                                                size_t bytes)>& copy) {
  check_kv_page_copy(from, from_pages, to, to_pages);
  const int64_t page_size = from.spec().page_size;
  // A run: pages consecutive in memory on both sides (an offload page's
  // latents are in another pool than a device page's).
  using PageAddress = const std::byte* (PagedKvCache::*)(int64_t, int64_t) const;
  auto pool = [&](int64_t layer, PageAddress address, int64_t bytes_per_token) {
    const int64_t page_bytes = page_size * bytes_per_token;
    for (size_t i = 0; i < from_pages.size();) {
      const std::byte* source = (from.*address)(layer, from_pages[i]);
      const std::byte* destination = (to.*address)(layer, to_pages[i]);
      size_t run = 1;
      while (i + run < from_pages.size() &&
             (from.*address)(layer, from_pages[i + run]) ==
                 source + static_cast<int64_t>(run) * page_bytes &&
             (to.*address)(layer, to_pages[i + run]) ==
                 destination + static_cast<int64_t>(run) * page_bytes) {
        ++run;
      }
      copy(source, const_cast<std::byte*>(destination), static_cast<size_t>(page_bytes) * run);
      i += run;
    }
  };
  for (const int64_t layer : from.spec().latent_layers) {
    pool(layer, &PagedKvCache::latent_page, from.spec().latent_bytes_per_token());
  }
  for (const int64_t layer : from.spec().indexer_layers) {
    pool(layer, &PagedKvCache::indexer_page, from.spec().indexer_bytes_per_token());
  }
}

void copy_kv_pages_on_host(const PagedKvCache& from, std::span<const int32_t> from_pages,
                           PagedKvCache& to, std::span<const int32_t> to_pages) {
  MEGACTX_CHECK(from.spec().device == Device::CPU && to.spec().device == Device::CPU,
                "copy_kv_pages_on_host needs host pools on both sides");
  for_each_page_run(from, from_pages, to, to_pages,
                    [](const std::byte* source, std::byte* destination, size_t bytes) {
                      std::memcpy(destination, source, bytes);
                    });
}

HostKvTier::HostKvTier(PagedKvCache& device, std::unique_ptr<PagedKvCache> host, KvPageCopy copy,
                       int ranks)
    : device_(device),
      host_(std::move(host)),
      allocator_(host_ ? host_->spec().num_pages * ranks : 0, 0, ranks),
      copy_(std::move(copy)) {
  MEGACTX_CHECK(host_ != nullptr && host_->spec().device == Device::CPU,
                "host KV tier: its pools must be in host memory");
  MEGACTX_CHECK(host_->spec().num_pages > 0, "host KV tier: no pages");
  MEGACTX_CHECK(copy_ != nullptr, "host KV tier: no page copy");
  check_kv_page_copy(device_, {}, *host_, {});
}

void HostKvTier::save(std::span<const int32_t> device_pages, std::span<const int32_t> host_pages) {
  if (device_pages.empty()) return;
  copy_(device_, device_pages, *host_, host_pages);
  saved_pages_ += static_cast<int64_t>(device_pages.size());
}

void HostKvTier::load(std::span<const int32_t> host_pages, std::span<const int32_t> device_pages) {
  if (host_pages.empty()) return;
  copy_(*host_, host_pages, device_, device_pages);
  loaded_pages_ += static_cast<int64_t>(host_pages.size());
}

}  // namespace megactx

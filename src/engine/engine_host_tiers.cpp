// The engine's two host-memory tiers (engine.h): the host KV tier, where
// the prefix cache's evicted pages wait in host memory and come back on a
// hit, and the live host tier, where a running request's full pages move so
// that its latents are read from host memory while it decodes. Here: creating
// the host KV tier, sizing the live tier's offload pages, and the moves of a
// step (per data-parallel rank where the model has several).
#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"

namespace megactx {

void Engine::create_host_tier() {
  MEGACTX_CHECK(config_.enable_prefix_cache, "a host KV tier needs the prefix cache");
  KvCacheSpec spec = capacity_.spec;
  spec.device = Device::CPU;
  spec.offload_pages = 0;
  // Each rank's host tier holds the pools of its device cache (LayerSplit:
  // its own layers'), so the largest rank's share bounds the pages; with
  // data-parallel attention each rank's tier holds pages of its own requests
  // (numbered in one space, as the device pages).
  const int64_t bytes_per_page = capacity_.bytes_per_page;
  const int ranks = capacity_.data_parallel_ranks;
  spec.num_pages = config_.host_kv_memory_bytes / bytes_per_page;
  MEGACTX_CHECK(spec.num_pages > 0,
                "host KV memory of {} bytes holds no page ({} bytes per page of {} tokens)",
                config_.host_kv_memory_bytes, bytes_per_page, spec.page_size);
  // Pinned pools and copies on the model's stream for a device model.
  KvPageCopy copy = model_->kv_page_copy();
  if (routed_) copy = routed_->wrap(std::move(copy), *cache_);  // routing moves with its pages
  const int64_t per_rank = spec.num_pages;
  spec.num_pages *= ranks;
  host_tier_ = std::make_unique<HostKvTier>(*cache_, model_->make_host_kv_cache(spec),
                                            std::move(copy), ranks);
  spdlog::info("host KV tier: {} pages ({} tokens, {} MiB of host memory){}", per_rank,
               per_rank * spec.page_size, (per_rank * bytes_per_page) >> 20,
               ranks > 1 ? fmt::format(" on each of {} data-parallel ranks", ranks) : "");
}

void Engine::plan_offload_pages() {
  KvCacheSpec& spec = capacity_.spec;
  // Every rank's pools (LayerSplit: each its own layers', else the whole
  // model's): each rank holds the offload pages' latents of its pools in its
  // host memory and their indexer keys beside its device pools, so the pages
  // are what fits every rank's budgets. With data-parallel attention the
  // budgets are each rank's for its own requests' pages (as --kv-memory and
  // --host-kv-memory are), numbered in one space (cache/rank_pages.h).
  const int ranks = capacity_.data_parallel_ranks;
  const std::vector<KvCacheSpec> pools =
      capacity_.shares.empty() ? std::vector<KvCacheSpec>{spec} : capacity_.shares;
  int64_t latent_bytes = 0;  // per offload page, the largest rank's
  for (const KvCacheSpec& rank : pools)
    latent_bytes = std::max(latent_bytes, rank.latent_bytes_per_page());
  spec.offload_pages = config_.host_latent_memory_bytes / latent_bytes;
  MEGACTX_CHECK(spec.offload_pages > 0,
                "host latent memory of {} bytes holds no page ({} bytes of latents per page of {} "
                "tokens)",
                config_.host_latent_memory_bytes, latent_bytes, spec.page_size);
  MEGACTX_CHECK(config_.host_latent_min_tokens >= 0, "host_latent_min_tokens must be >= 0, got {}",
                config_.host_latent_min_tokens);
  // Their indexer keys live beside the pools, out of the same budget.
  int64_t device_pages = capacity_.pages_per_rank, indexer_bytes = 0, total_bytes = 0;
  for (const KvCacheSpec& rank : pools) {
    const int64_t page = rank.bytes_per_page(),
                  keys = spec.offload_pages * rank.indexer_bytes_per_page();
    device_pages =
        std::min(device_pages, config_.kv_memory_bytes / page - (keys + page - 1) / page);
    indexer_bytes = std::max(indexer_bytes, keys);
  }
  MEGACTX_CHECK(device_pages > 0,
                "the live host tier's {} pages need {} MiB of indexer keys beside the KV pools: "
                "more than the KV budget of {} MiB (lower --host-latent-memory)",
                spec.offload_pages, indexer_bytes >> 20, capacity_.total_bytes >> 20);
  for (const KvCacheSpec& rank : pools)
    total_bytes = std::max(total_bytes, device_pages * rank.bytes_per_page() +
                                            spec.offload_pages * rank.indexer_bytes_per_page());
  const int64_t offload_per_rank = spec.offload_pages;
  spec.num_pages = device_pages * ranks;
  spec.offload_pages = offload_per_rank * ranks;
  for (KvCacheSpec& share : capacity_.shares) {
    share.num_pages = device_pages;
    share.offload_pages = offload_per_rank;
  }
  capacity_.pages_per_rank = device_pages;
  capacity_.max_tokens = device_pages * spec.page_size;
  capacity_.total_bytes = total_bytes;
  spdlog::info(
      "live host tier: {} offload pages ({} tokens; {} MiB of latents in host memory, {} MiB of "
      "indexer keys beside the pools{})",
      offload_per_rank, offload_per_rank * spec.page_size, (offload_per_rank * latent_bytes) >> 20,
      indexer_bytes >> 20,
      pools.size() > 1 ? ", on the largest rank"
      : ranks > 1      ? fmt::format(", on each of {} data-parallel ranks", ranks)
                       : "");
}

void Engine::offload_latents() {
  if (capacity_.spec.offload_pages == 0) return;
  // Every move of the step in one copy: between offload_pages() releasing a
  // device page and the copy below nothing allocates one.
  std::vector<int32_t> from, to;
  const auto record = [&](std::span<const int32_t> device, std::span<const int32_t> offload) {
    from.insert(from.end(), device.begin(), device.end());
    to.insert(to.end(), offload.begin(), offload.end());
  };
  // A request moves once its context reaches host_latent_min_tokens, or half
  // the device pages, whichever comes first: one that outgrows the device
  // pages while alone must be moving by then (prompts too, chunk by chunk).
  // With data-parallel attention every figure is its rank's: its device
  // pages, its free offload pages, its parked requests.
  const int64_t device_tokens = capacity_.pages_per_rank * capacity_.spec.page_size;
  const int64_t threshold = std::min(config_.host_latent_min_tokens, device_tokens / 2);
  offloaded_by_rank_.resize(static_cast<size_t>(scheduler_->ranks()), 0);
  for (RequestState* request : scheduler_->running()) {
    if (static_cast<int64_t>(request->tokens.size()) < threshold) continue;
    const int64_t wanted = scheduler_->offloadable_pages(*request);
    if (wanted == 0) continue;
    const int rank = request->dp_rank;
    const int64_t missing = wanted - allocator_->num_free_offload(rank);
    // Parked requests give their offload pages up only to one that must
    // move: the device pages are short, or it cannot finish on them.
    const int64_t longest =
        request->prompt_len +
        std::clamp<int64_t>(request->request.sampling.max_new_tokens, 0, max_total_tokens_);
    if (missing > 0 && (scheduler_->available_pages(rank) < wanted || longest > device_tokens)) {
      scheduler_->drop_parked(missing, rank);
    }
    offloaded_by_rank_[static_cast<size_t>(rank)] +=
        scheduler_->offload_pages(*request, std::numeric_limits<int64_t>::max(), record);
  }
  if (from.empty()) return;
  offload_copy_(*cache_, from, *cache_, to);
}

}  // namespace megactx

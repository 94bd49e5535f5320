#include "engine/kv_capacity.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/model_loader.h"

namespace megactx {

const char* kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::F32:
      return "f32";
    case KvDType::BF16:
      return "bf16";
    case KvDType::FP8:
      return "fp8";
  }
  return "?";
}

std::string KvCapacityPlan::summary() const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string line = fmt::format(
      "KV cache: {} pages x {} tokens = {} tokens max; {} latent + {} indexer pools ({})",
      spec.num_pages, spec.page_size, max_tokens, spec.latent_layers.size(),
      spec.indexer_layers.size(), kv_dtype_name(spec.dtype));
  if (data_parallel_ranks > 1) {
    line += fmt::format(
        " over {} data-parallel ranks ({} pages = {} tokens of their own requests each), {} "
        "B/token, {:.2f} GiB per rank",
        data_parallel_ranks, pages_per_rank, pages_per_rank * spec.page_size, bytes_per_token,
        static_cast<double>(total_bytes) / kGiB);
    if (shares.size() <= 1) return line;
    line +=
        fmt::format("; each replica's pools split over its {} ranks (LayerSplit):", shares.size());
    for (size_t rank = 0; rank < shares.size(); ++rank)
      line += fmt::format("{} rank {} {} latent + {} indexer pools", rank ? ";" : "", rank,
                          shares[rank].latent_layers.size(), shares[rank].indexer_layers.size());
    return line;
  }
  if (shares.size() <= 1) {
    return line + fmt::format(", {} B/token, {:.2f} GiB", bytes_per_token,
                              static_cast<double>(total_bytes) / kGiB);
  }
  // LayerSplit: what each rank holds against the replicated pools.
  const int64_t whole = spec.bytes_per_page();
  line += fmt::format(" split over {} ranks (LayerSplit):", shares.size());
  for (size_t rank = 0; rank < shares.size(); ++rank) {
    const KvCacheSpec& share = shares[rank];
    line += fmt::format("{} rank {} {} latent + {} indexer pools{}, {} B/token", rank ? ";" : "",
                        rank, share.latent_layers.size(), share.indexer_layers.size(),
                        share.borrowed_latent_pools > 0
                            ? fmt::format(" + {} borrowed", share.borrowed_latent_pools)
                            : std::string(),
                        share.bytes_per_page() / spec.page_size);
  }
  line += fmt::format(
      "; {:.2f} GiB on the largest rank, where every rank would hold {} B/token, {:.2f} GiB "
      "replicated ({:.2f}x)",
      static_cast<double>(total_bytes) / kGiB, whole / spec.page_size,
      static_cast<double>(spec.num_pages * whole) / kGiB,
      static_cast<double>(whole) / static_cast<double>(bytes_per_page));
  return line;
}

KvCapacityPlan plan_kv_capacity(const ModelConfig& model, KvDType dtype, int64_t memory_bytes,
                                int64_t page_size, bool with_mtp_layer, const KvCacheShares& shares,
                                int data_parallel_ranks) {
  KvCapacityPlan plan;
  plan.spec = make_kv_cache_spec(model, 0, dtype, page_size, with_mtp_layer);
  KvCacheSpec& spec = plan.spec;
  plan.bytes_per_page = spec.bytes_per_page();
  if (shares) {
    plan.shares = shares(spec);
    if (plan.shares.size() > 1) {
      plan.bytes_per_page = 0;
      for (const KvCacheSpec& share : plan.shares)
        plan.bytes_per_page = std::max(plan.bytes_per_page, share.bytes_per_page());
    } else {
      plan.shares.clear();
    }
  }
  MEGACTX_CHECK(plan.bytes_per_page > 0, "KV page size computes to 0 bytes");
  spec.num_pages = memory_bytes / plan.bytes_per_page;
  MEGACTX_CHECK(spec.num_pages > 0,
                "KV memory budget of {} bytes holds no page ({} bytes per page of {} tokens)",
                memory_bytes, plan.bytes_per_page, page_size);
  MEGACTX_CHECK(spec.num_pages <= INT32_MAX, "KV memory budget gives too many pages ({})",
                spec.num_pages);
  plan.bytes_per_token = plan.bytes_per_page / page_size;
  plan.total_bytes = spec.num_pages * plan.bytes_per_page;
  plan.max_tokens = spec.num_pages * page_size;
  plan.pages_per_rank = spec.num_pages;
  // LayerSplit with data-parallel attention: each replica's ranks split the
  // replica's pools (the shares), every replica the same.
  MEGACTX_CHECK(data_parallel_ranks >= 1 && spec.num_pages * data_parallel_ranks <= INT32_MAX,
                "KV pages: {} per rank over {} data-parallel ranks", spec.num_pages,
                data_parallel_ranks);
  plan.data_parallel_ranks = data_parallel_ranks;
  spec.num_pages *= data_parallel_ranks;
  for (KvCacheSpec& share : plan.shares) share.num_pages = spec.num_pages;
  return plan;
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / kMiB;
}

}  // namespace

int64_t device_reserve_bytes(const KvCacheSpec& spec) {
  // 256 MiB for cuBLAS's own allocations (its fixed 32 MiB workspace is in
  // the measured model bytes), the sampler's buffers, the MTP layer's scratch
  // and cudaMalloc's rounding of the ~50 scratch buffers; cudaMalloc rounds
  // every pool up to 2 MiB.
  const auto pools = static_cast<int64_t>(spec.latent_layers.size() + spec.indexer_layers.size());
  return (int64_t{256} << 20) + pools * (int64_t{2} << 20);
}

std::string DeviceKvPlan::summary() const {
  return fmt::format(
      "CUDA memory plan: {:.0f} MiB = model {:.0f} MiB (weights + the 32 MiB cuBLAS workspace, "
      "measured) + scratch {:.0f} MiB ({} tokens, context {}: {}) + reserve {:.0f} MiB + KV "
      "{:.0f} MiB ({} pages of {} B); device {:.0f} MiB, {:.0f} MiB free after the model",
      mib(budget_bytes), mib(memory.weight_bytes), mib(memory.scratch_bytes), max_step_tokens,
      context, memory.scratch.summary(), mib(reserve_bytes), mib(kv_bytes()), memory.kv_pages,
      memory.kv_bytes_per_page, mib(device.total_bytes), mib(device.free_bytes));
}

DeviceKvPlan plan_device_kv(const ModelConfig& model, const EngineConfig& engine,
                            const DeviceKvRequest& request) {
  const DeviceMemoryInfo& device = request.memory;
  MEGACTX_CHECK(device.total_bytes > 0 && device.free_bytes >= 0 && request.model_bytes >= 0,
                "device memory: total {} B, free {} B, model {} B", device.total_bytes,
                device.free_bytes, request.model_bytes);
  MEGACTX_CHECK(request.gpu_memory_utilization > 0.0 && request.gpu_memory_utilization <= 1.0,
                "--gpu-memory-utilization must be in (0, 1], got {}",
                request.gpu_memory_utilization);
  MEGACTX_CHECK(request.kv_memory_bytes >= 0, "--kv-memory must be positive");
  MEGACTX_CHECK(engine.max_prefill_tokens > 0 && engine.max_running_requests > 0,
                "max_prefill_tokens and max_running_requests must be positive");
  DeviceKvPlan plan;
  plan.device = device;
  plan.context = engine.context_length > 0 ? engine.context_length : model.max_position_embeddings;
  MEGACTX_CHECK(
      plan.context > 0,
      "the model gives no context length (max_position_embeddings): set --context-length");
  plan.max_step_tokens = engine.max_prefill_tokens + engine.max_running_requests;
  CudaMemoryRequest memory;
  memory.weight_bytes = request.model_bytes;
  memory.max_step_tokens = plan.max_step_tokens;
  memory.max_context = plan.context;
  memory.max_logit_rows = step_logit_rows(engine);  // the scheduler keeps every step within it
  memory.index_topk = std::max<int64_t>(model.index_topk, 1);
  memory.kv =
      make_kv_cache_spec(model, 0, engine.kv_dtype, engine.page_size, engine.speculative_steps > 0);
  memory.options = request.options;
  // Decode steps: one token per running request, 1 + k with MTP verification.
  memory.options.decode_sequences = engine.max_running_requests;
  memory.options.decode_tokens_per_sequence = 1 + std::max<int64_t>(engine.speculative_steps, 0);
  if (engine.host_latent_memory_bytes > 0) {
    memory.options.offload_tokens =
        engine.host_latent_memory_bytes / memory.kv.latent_bytes_per_page() * memory.kv.page_size;
  }
  memory.weights_include_workspace = true;
  plan.reserve_bytes = device_reserve_bytes(memory.kv);
  if (request.kv_memory_bytes <= 0) {
    memory.budget_bytes = static_cast<int64_t>(request.gpu_memory_utilization *
                                               static_cast<double>(device.total_bytes)) -
                          plan.reserve_bytes;
    MEGACTX_CHECK(memory.budget_bytes > 0,
                  "--gpu-memory-utilization {} of {:.0f} MiB leaves nothing after the {:.0f} MiB "
                  "reserve",
                  request.gpu_memory_utilization, mib(device.total_bytes), mib(plan.reserve_bytes));
  }
  if (engine.context_length <= 0 && memory.options.offload_tokens == 0) {
    // The context is the model's max_position_embeddings, a default rather
    // than a request: where the KV budget cannot hold one sequence of it,
    // the context shrinks to what the pages hold, as SGLang and llama.cpp
    // fit their default context to memory (with the fraction, a shorter
    // context also needs less step scratch, so a few rounds settle it). An
    // explicit --context-length that does not fit stays an error
    // (plan_cuda_memory).
    for (int round = 0; round < 4; ++round) {
      const int64_t room = request.kv_memory_bytes > 0
                               ? request.kv_memory_bytes
                               : memory.budget_bytes - memory.weight_bytes -
                                     cuda_scratch_breakdown(model, memory).device_total();
      const int64_t pages = room > 0 ? room / memory.kv.bytes_per_page() : 0;
      const int64_t fits = pages * memory.kv.page_size;
      if (pages <= 0 || fits >= memory.max_context) break;
      memory.max_context = fits;
    }
    plan.context_fitted = memory.max_context < plan.context;
    plan.context = memory.max_context;
  }
  if (request.kv_memory_bytes > 0) {
    // Exactly the asked KV budget beside the model and the scratch.
    memory.budget_bytes = request.model_bytes +
                          cuda_scratch_breakdown(model, memory).device_total() +
                          request.kv_memory_bytes;
  }
  plan.memory = plan_cuda_memory(model, memory);
  plan.budget_bytes =
      plan.memory.weight_bytes + plan.memory.scratch_bytes + plan.reserve_bytes + plan.kv_bytes();
  // The model is already on the device; the rest must be free now.
  const int64_t still_needed = plan.memory.scratch_bytes + plan.reserve_bytes + plan.kv_bytes();
  MEGACTX_CHECK(
      still_needed <= device.free_bytes,
      "CUDA memory: scratch {:.0f} MiB + reserve {:.0f} MiB + KV {:.0f} MiB need "
      "{:.0f} MiB, the device has {:.0f} MiB free after loading the model ({:.0f} MiB "
      "total, other processes hold {:.0f} MiB): lower --gpu-memory-utilization, "
      "--kv-memory, --max-prefill-tokens or --context-length",
      mib(plan.memory.scratch_bytes), mib(plan.reserve_bytes), mib(plan.kv_bytes()),
      mib(still_needed), mib(device.free_bytes), mib(device.total_bytes),
      mib(std::max<int64_t>(device.total_bytes - device.free_bytes - request.model_bytes, 0)));
  MEGACTX_CHECK(plan.memory.kv_pages <= INT32_MAX, "KV memory budget gives too many pages ({})",
                plan.memory.kv_pages);
  return plan;
}

}  // namespace megactx

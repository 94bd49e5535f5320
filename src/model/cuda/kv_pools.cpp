// Device KV pools for the CUDA model, pinned pools of its host KV tier and
// the page copies between them, host copies of device tensors.
#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/kv_copy/page_runs.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/cuda/cuda_model.h"

namespace megactx {
namespace {

Tensor device_zeros(int64_t rows, int64_t bytes_per_row) {
  const size_t bytes = static_cast<size_t>(rows * bytes_per_row);
  void* data = nullptr;
  if (bytes > 0) {
    const cudaError_t status = cudaMalloc(&data, bytes);
    if (status != cudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      cudaGetLastError();  // clear the sticky-free allocation error
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail(
          "KV cache: cannot allocate a {} MiB pool on the device ({} MiB free): lower the page "
          "count or the KV dtype",
          bytes >> 20, free_bytes >> 20);
    }
    MEGACTX_CUDA_CHECK(cudaMemset(data, 0, bytes));
  }
  return Tensor::adopt(data, {rows, bytes_per_row}, DType::U8, Device::CUDA, [](void* pointer) {
    if (pointer != nullptr) cudaFree(pointer);
  });
}

Tensor pinned_zeros(int64_t rows, int64_t bytes_per_row) {
  const size_t bytes = static_cast<size_t>(rows * bytes_per_row);
  void* data = nullptr;
  if (bytes > 0) {
    if (cudaHostAlloc(&data, bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      fail(
          "cannot pin {} MiB of host memory for KV pages: lower --host-kv-memory or "
          "--host-latent-memory",
          bytes >> 20);
    }
    std::memset(data, 0, bytes);
  }
  return Tensor::adopt(data, {rows, bytes_per_row}, DType::U8, Device::CPU, [](void* pointer) {
    if (pointer != nullptr) cudaFreeHost(pointer);
  });
}

// `spec`'s pools, each from zeros(rows, bytes_per_row); the offload pages'
// latent pools (the live host tier) pinned in host memory.
std::unique_ptr<PagedKvCache> pools_of(KvCacheSpec spec, Device device,
                                       Tensor (*zeros)(int64_t, int64_t)) {
  MEGACTX_CHECK(spec.num_pages >= 0 && spec.offload_pages >= 0 && spec.page_size > 0,
                "KV cache: bad num_pages {} / offload_pages {} / page_size {}", spec.num_pages,
                spec.offload_pages, spec.page_size);
  spec.device = device;
  const int64_t slots = spec.num_pages * spec.page_size;
  const int64_t offload_slots = spec.offload_pages * spec.page_size;
  std::vector<Tensor> latent, indexer, offload;
  for (size_t i = 0; i < spec.latent_layers.size(); ++i) {
    latent.push_back(zeros(slots, spec.latent_bytes_per_token()));
    if (offload_slots > 0)
      offload.push_back(pinned_zeros(offload_slots, spec.latent_bytes_per_token()));
  }
  for (size_t i = 0; i < spec.indexer_layers.size(); ++i) {
    indexer.push_back(zeros(slots + offload_slots, spec.indexer_bytes_per_token()));
  }
  return std::make_unique<PagedKvCache>(std::move(spec), std::move(latent), std::move(indexer),
                                        std::move(offload));
}

}  // namespace

std::unique_ptr<PagedKvCache> make_cuda_kv_cache(KvCacheSpec spec) {
  return pools_of(std::move(spec), Device::CUDA, device_zeros);
}

std::unique_ptr<PagedKvCache> make_cuda_host_kv_cache(KvCacheSpec spec) {
  spec.offload_pages = 0;
  // spec.device stays CPU: host memory, pinned so that copies run asynchronously.
  return pools_of(std::move(spec), Device::CPU, pinned_zeros);
}

KvPageCopy make_cuda_kv_page_copy(const LanguageModel& model) {
  auto stream = static_cast<cudaStream_t>(cuda_model_stream(model));
  // Moves to offload pages (the live host tier: a copy within the pools)
  // rewrite entries the model's hot cache may hold.
  const auto* dsa = dynamic_cast<const cuda::CudaDsaModel*>(&model);
  if (cuda::kKvPageCopyKernel) {
    // Every pool's runs in one launch (kernels/cuda/kv_copy/page_runs.h).
    auto copier = std::make_shared<cuda::PageRunCopier>();
    return [stream, copier, dsa](const PagedKvCache& from, std::span<const int32_t> from_pages,
                                 PagedKvCache& to, std::span<const int32_t> to_pages) {
      std::vector<cuda::CopyRun> runs;
      for_each_page_run(from, from_pages, to, to_pages,
                        [&runs](const std::byte* source, std::byte* destination, size_t bytes) {
                          runs.push_back({source, destination, static_cast<int64_t>(bytes)});
                        });
      copier->copy(runs, stream);
      if (dsa != nullptr && &from == &to) dsa->invalidate_offload_lines(to_pages, to);
    };
  }
  return [stream, dsa](const PagedKvCache& from, std::span<const int32_t> from_pages,
                       PagedKvCache& to, std::span<const int32_t> to_pages) {
    for_each_page_run(from, from_pages, to, to_pages,
                      [stream](const std::byte* source, std::byte* destination, size_t bytes) {
                        // cudaMemcpyDefault: unified addressing tells device from pinned host.
                        MEGACTX_CUDA_CHECK(
                            cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
                      });
    if (dsa != nullptr && &from == &to) dsa->invalidate_offload_lines(to_pages, to);
  };
}

Tensor to_host(const Tensor& tensor) {
  if (tensor.device() == Device::CPU) return tensor;
  // The model's stream does not synchronise with the legacy stream, and a
  // forward that returns device logits does not wait for its own work.
  MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
  Tensor host = Tensor::empty(tensor.shape(), tensor.dtype());
  if (tensor.nbytes() > 0) {
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(host.raw(), tensor.raw(), tensor.nbytes(), cudaMemcpyDeviceToHost));
  }
  return host;
}

}  // namespace megactx
#endif  // MEGACTX_HAVE_CUDA

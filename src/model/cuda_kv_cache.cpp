// Device KV pools for the CUDA model, pinned pools of its host KV tier and
// the page copies between them, host copies of device tensors.
#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstring>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/cuda_model.h"

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

}  // namespace

std::unique_ptr<PagedKvCache> make_cuda_kv_cache(KvCacheSpec spec) {
  MEGACTX_CHECK(spec.num_pages >= 0 && spec.page_size > 0,
                "KV cache: bad num_pages {} / page_size {}", spec.num_pages, spec.page_size);
  spec.device = Device::CUDA;
  const int64_t slots = spec.num_pages * spec.page_size;
  std::vector<Tensor> latent, indexer;
  for (size_t i = 0; i < spec.latent_layers.size(); ++i) {
    latent.push_back(device_zeros(slots, spec.latent_bytes_per_token()));
  }
  for (size_t i = 0; i < spec.indexer_layers.size(); ++i) {
    indexer.push_back(device_zeros(slots, spec.indexer_bytes_per_token()));
  }
  return std::make_unique<PagedKvCache>(std::move(spec), std::move(latent), std::move(indexer));
}

namespace {

Tensor pinned_zeros(int64_t rows, int64_t bytes_per_row) {
  const size_t bytes = static_cast<size_t>(rows * bytes_per_row);
  void* data = nullptr;
  if (bytes > 0) {
    if (cudaHostAlloc(&data, bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      fail("host KV tier: cannot pin {} MiB of host memory: lower --host-kv-memory", bytes >> 20);
    }
    std::memset(data, 0, bytes);
  }
  return Tensor::adopt(data, {rows, bytes_per_row}, DType::U8, Device::CPU, [](void* pointer) {
    if (pointer != nullptr) cudaFreeHost(pointer);
  });
}

}  // namespace

std::unique_ptr<PagedKvCache> make_cuda_host_kv_cache(KvCacheSpec spec) {
  MEGACTX_CHECK(spec.num_pages >= 0 && spec.page_size > 0,
                "host KV tier: bad num_pages {} / page_size {}", spec.num_pages, spec.page_size);
  spec.device = Device::CPU;
  const int64_t slots = spec.num_pages * spec.page_size;
  std::vector<Tensor> latent, indexer;
  for (size_t i = 0; i < spec.latent_layers.size(); ++i) {
    latent.push_back(pinned_zeros(slots, spec.latent_bytes_per_token()));
  }
  for (size_t i = 0; i < spec.indexer_layers.size(); ++i) {
    indexer.push_back(pinned_zeros(slots, spec.indexer_bytes_per_token()));
  }
  return std::make_unique<PagedKvCache>(std::move(spec), std::move(latent), std::move(indexer));
}

KvPageCopy make_cuda_kv_page_copy(const LanguageModel& model) {
  auto stream = static_cast<cudaStream_t>(cuda_model_stream(model));
  return [stream](const PagedKvCache& from, std::span<const int32_t> from_pages, PagedKvCache& to,
                  std::span<const int32_t> to_pages) {
    check_kv_page_copy(from, from_pages, to, to_pages);
    const int64_t page_size = from.spec().page_size;
    auto copy_pool = [&](const Tensor& source, const Tensor& destination, int64_t bytes_per_token) {
      const int64_t page_bytes = page_size * bytes_per_token;
      for (size_t i = 0; i < from_pages.size();) {
        size_t run = 1;
        while (i + run < from_pages.size() &&
               from_pages[i + run] == from_pages[i] + static_cast<int32_t>(run) &&
               to_pages[i + run] == to_pages[i] + static_cast<int32_t>(run)) {
          ++run;
        }
        // cudaMemcpyDefault: unified addressing tells device from pinned host.
        MEGACTX_CUDA_CHECK(cudaMemcpyAsync(destination.data<std::byte>() + to_pages[i] * page_bytes,
                                           source.data<std::byte>() + from_pages[i] * page_bytes,
                                           static_cast<size_t>(page_bytes) * run, cudaMemcpyDefault,
                                           stream));
        i += run;
      }
    };
    for (const int64_t layer : from.spec().latent_layers) {
      copy_pool(from.latent_pool(layer), to.latent_pool(layer),
                from.spec().latent_bytes_per_token());
    }
    for (const int64_t layer : from.spec().indexer_layers) {
      copy_pool(from.indexer_pool(layer), to.indexer_pool(layer),
                from.spec().indexer_bytes_per_token());
    }
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

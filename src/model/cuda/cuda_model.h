// The CUDA model: the DsaModel forward pass (model/dsa_model.h) on device
// buffers, over a PagedKvCache whose pools live on the GPU.
//
// Why a separate LanguageModel rather than a CUDA Backend: DsaModel keeps its
// activations, top-k lists and MoE dispatch in host std::vectors and reads
// the cache through host encode/decode, so a Backend taking device pointers
// would not be enough; the CUDA model mirrors DsaModel's structure (same
// layer order, same tensors) with device scratch, cuBLAS and the kernels of
// kernels/cuda/ (elementwise, dsa_fallback, dsa_glue, gemm, moe, ...).
//
// The precision modes, attention paths, device MoE, CUDA Graph decode and the
// MTP layer on the device are described at CudaModelOptions below; what each
// achieves, and what is missing, is in docs/benchmarks.md. This header is
// plain C++; the functions exist only in builds with MEGACTX_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cache/host_kv_tier.h"
#include "cache/kv_cache.h"
#include "io/checkpoint.h"
#include "model/cuda/options.h"
#include "model/dsa_model.h"
#include "model/language_model.h"
#include "model/mtp_layer.h"

namespace megactx {

// An Error for a model that is not a CUDA model. `mtp`: the MTP layer's runs
// (refills and draft steps) instead of the target's forwards.
CudaGraphStats cuda_graph_stats(const LanguageModel& model, bool mtp = false);

// Uploads `host`'s weights (float32) and builds the CUDA model with the same
// config, index_topk and RoPE tables; `host` may be destroyed afterwards.
std::unique_ptr<LanguageModel> make_cuda_dsa_model(const DsaModel& host,
                                                   const CudaModelOptions& options = {});

// The MTP layer of `model` (a make_cuda_dsa_model model) on the GPU, from the
// checkpoint at `model_dir` (random weights from `seed` when
// `random_weights`); its weights are uploaded once into `model`, which must
// outlive the returned layer. It runs over a device cache built from
// make_kv_cache_spec(..., /*with_mtp_layer=*/true).
std::unique_ptr<MtpLayer> make_cuda_mtp_layer(LanguageModel& model, const std::string& model_dir,
                                              bool random_weights = false, uint64_t seed = 0);
// The same from an open checkpoint (weight reloads: the served checkpoint
// with the updated tensors in front).
std::unique_ptr<MtpLayer> make_cuda_mtp_layer(LanguageModel& model, const Checkpoint& checkpoint);

// Pinned host pools of `spec`'s layout for the engine's host KV tier
// (spec.device stays CPU: the CPU may read them; copies to and from the
// device run asynchronously).
std::unique_ptr<PagedKvCache> make_cuda_host_kv_cache(KvCacheSpec spec);
// The KvPageCopy between `model`'s device pools and pinned host pools:
// cudaMemcpyAsync on the model's stream, one per pool and run of consecutive
// pages, so a page saved before its device page is reused and loaded before
// the forward that reads it, with no host synchronisation.
KvPageCopy make_cuda_kv_page_copy(const LanguageModel& model);

// The cudaStream_t (as void*) every forward of a CUDA model runs on; a
// forward that returns device logits does not synchronise, so their consumer
// must run on this stream (the engine's CudaSampler does) or synchronise.
void* cuda_model_stream(const LanguageModel& model);

// The fp8-native load: builds the CUDA model straight from `checkpoint`
// without a host DsaModel, tensor by tensor (CudaWeights' checkpoint
// constructor): e4m3 weights with 128x128 weight_scale_inv blocks stay fp8 on
// the device and run the block-scaled fp8 GEMM with activations quantised to
// e4m3 per 1x128 group (as HF's and DeepSeek's fp8 inference do: up to 2^-4
// relative rounding per input element, 3 mantissa bits); other matrices bf16
// (options.bf16_weights) or float32. `model_options` supplies
// index_topk_override and the parallel group and layout (a rank reads its
// share of every tensor: model/cuda/checkpoint_shares.h). Works for non-fp8
// checkpoints too (no fp8 matrices).
std::unique_ptr<LanguageModel> make_cuda_dsa_model_from_checkpoint(
    const Checkpoint& checkpoint, const CudaModelOptions& options,
    const DsaModelOptions& model_options = {});
// The same with random weights shaped as an fp8 checkpoint ships them
// (make_random_fp8_matrices in model/cuda/checkpoint_matrix.h): benchmarks of the
// fp8 path without a checkpoint. `dequantized`: the same weights' values in
// float32 (or bf16) matrices, the reference of the fp8 GEMMs' rounding.
std::unique_ptr<LanguageModel> make_cuda_dsa_model_random_fp8(
    const ModelConfig& config, uint64_t seed, const CudaModelOptions& options,
    const DsaModelOptions& model_options = {}, bool dequantized = false);

// What a CUDA model keeps on the device for its weights: all of them, the GEMM
// matrices, and of those the fp8 ones (e4m3 bytes + scales) with their
// parameter count. An Error for a model that is not a CUDA model.
struct CudaWeightBytes {
  int64_t total = 0;
  int64_t matrices = 0;
  int64_t fp8_matrices = 0;
  int64_t fp8_parameters = 0;
};
CudaWeightBytes cuda_weight_bytes(const LanguageModel& model);

// A PagedKvCache with zeroed device pools (spec.device is set to CUDA); a
// clear Error when the pools do not fit in device memory.
std::unique_ptr<PagedKvCache> make_cuda_kv_cache(KvCacheSpec spec);

// Host copy of a float32 tensor that may live on the device (tests, CLI).
Tensor to_host(const Tensor& tensor);

}  // namespace megactx

// Building a LanguageModel from a Hugging Face model directory (or from a
// config.json with random weights, for benchmarks), and the KV cache spec
// that fits it. The serving engine calls these.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cache/kv_cache.h"
#include "model/cuda/memory_plan.h"
#include "model/cuda/options.h"
#include "model/language_model.h"
#include "model/model_plan.h"

#include "parallel/communicator.h"

namespace megactx {

struct ModelLoadOptions {
  Device device = Device::CPU;
  // "cpu" (OpenBLAS + thread pool) or "reference" (plain loops, the oracle).
  std::string cpu_backend = "cpu";
  // The deterministic mode (--deterministic): batch-invariant kernels, so that
  // a token's logits are bit-identical whatever else shares its forward (decode
  // batch, prefill chunk, MTP verification, prefix-cache hit). CPU: the GEMMs
  // of kernels/cpu/batch_invariant_linear.h; CUDA: CudaModelOptions::batch_invariant.
  bool deterministic = false;
  // The KV dtype the caller intends to use (a hint; the cache decides).
  KvDType kv_dtype = KvDType::BF16;
  // Random weights from `model_dir`'s config.json (model_dir may also name the
  // config file itself); nothing else is read.
  bool random_weights = false;
  uint64_t seed = 0;
  // Tests: replaces config.index_topk (>= the context length attends densely).
  std::optional<int64_t> index_topk_override;
  // --device cuda: the CUDA model's switches (precision mode, logits on the
  // device, native fp8 checkpoints, CUDA Graphs, the fp8 DSA path, the device
  // MoE), exactly as CudaDsaModel reads them; batch_invariant follows
  // `deterministic` above. With random_weights and a config whose
  // quantization_config is fp8, cuda.fp8_native gives random fp8 weights
  // (benchmarks). The CLI sets fp8_native; tests of the exact-parity fp32
  // mode leave it off.
  CudaModelOptions cuda;
  // This process's parallel group (a Communicator the caller owns and keeps
  // alive) and how the model is spread over it (model_plan.h: ModelPlan):
  // tensor-parallel attention and MLPs unless data_parallel_attention, routed
  // experts sharded when expert_parallel; every step's rows split over the
  // group when context_parallel (model_plan.h). With --device cuda only
  // tensor parallelism and expert parallelism over it so far, rank r on GPU
  // device_ordinal + r x gpu_id_step, each rank reading its share of the
  // checkpoint (model/cuda/checkpoint_shares.h), the collectives on NCCL or
  // host memory (CudaModelOptions::group, collectives); null: the whole model.
  parallel::Communicator* group = nullptr;
  bool expert_parallel = false;
  bool data_parallel_attention = false;
  // With data_parallel_attention: the attention replicas (0: one per rank;
  // fewer: shares of tensor-parallel ranks, ModelPlan::data_parallel_rank).
  int data_parallel_size = 0;
  bool context_parallel = false;
  // With context_parallel: the group is this many context shares of
  // tensor-parallel ranks (0: context parallelism over the whole group).
  int context_parallel_size = 0;
  // The indexer's heads split over the tensor-parallel group, their scores
  // summed (ModelPlan::indexer_split); else it is whole on every rank.
  bool split_indexer = false;
  // With expert_parallel over context shares of tensor-parallel ranks: the
  // experts sharded over the whole group (ModelPlan::experts_over_shares)
  // instead of over each share's tensor-parallel ranks.
  bool experts_over_group = false;
  // Data-parallel attention's MoE dispatch (ModelPlan::moe_dispatch, --moe-dispatch).
  MoeDispatch moe_dispatch = MoeDispatch::automatic;
  // LayerSplit over the tensor-parallel group: each decoder layer's KV
  // caches on one rank (model_plan.h: ModelPlan::kv_owner); make_kv_cache
  // then allocates this rank's layers only.
  bool layer_split = false;
};

std::unique_ptr<LanguageModel> load_language_model(const std::string& model_dir,
                                                   const ModelLoadOptions& options);

// What `options` make a CUDA model allocate per step, for the device memory
// plan (fast attention, device MoE, CUDA graphs, GEMM input copies; the SMs
// of the device when this build has CUDA, else the H200's 132). `model`, the
// model loaded with `options`, tells whether it holds fp8 weights; without
// it, cuda_fp8_native counts as if it did.
CudaScratchOptions cuda_scratch_options(const ModelLoadOptions& options,
                                        const LanguageModel* model = nullptr);

// --device cuda with MTP speculation: uploads the MTP layer's weights into the
// CUDA `model` now, so that a device memory plan measured afterwards counts
// them (the Engine's CUDA MTP layer then reuses them). No-op for a CPU model
// or a config without an MTP layer.
void preload_cuda_mtp_layer(LanguageModel& model, const std::string& model_dir);

// The one description of the KV pools of a model: a latent pool for every
// decoder layer, an indexer pool for the layers that run an indexer, and with
// `with_mtp_layer` both for the MTP layer (decoder layer num_hidden_layers).
KvCacheSpec make_kv_cache_spec(const ModelConfig& config, int64_t num_pages, KvDType dtype,
                               int64_t page_size = 64, bool with_mtp_layer = false);

// "f32" | "bf16" | "fp8"; anything else is an Error.
KvDType parse_kv_dtype(const std::string& name);

}  // namespace megactx

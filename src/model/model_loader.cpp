#include "model/model_loader.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/logging.h"
#include "io/checkpoint.h"
#include "model/cuda/cuda_model.h"

namespace megactx {
namespace {

std::unique_ptr<Backend> make_backend(const ModelLoadOptions& options) {
  if (options.device == Device::CUDA) {
    // The CUDA model is built from a host DsaModel (checks, weights); its
    // backend is never called, the plain loops cost nothing to construct.
    return make_reference_backend();
  }
  if (options.cpu_backend == "cpu") return make_cpu_backend(options.deterministic);
  if (options.cpu_backend == "reference") return make_reference_backend();
  fail("unknown CPU backend '{}' (cpu or reference)", options.cpu_backend);
}

// The model's top-k override, group and layout (both load paths).
DsaModelOptions dsa_model_options(const ModelLoadOptions& options) {
  DsaModelOptions model_options;
  model_options.index_topk_override = options.index_topk_override;
  model_options.group = options.group;
  model_options.expert_parallel = options.expert_parallel;
  model_options.data_parallel_attention = options.data_parallel_attention;
  model_options.data_parallel_size = options.data_parallel_size;
  model_options.context_parallel = options.context_parallel;
  model_options.context_parallel_size = options.context_parallel_size;
  model_options.experts_over_group = options.experts_over_group;
  model_options.moe_dispatch = options.moe_dispatch;
  model_options.split_indexer = options.split_indexer;
  model_options.layer_split = options.layer_split;
  return model_options;
}

std::unique_ptr<LanguageModel> build_host(const ModelConfig& config, WeightSource& weights,
                                          const ModelLoadOptions& options) {
  return build_dsa_model(config, weights, make_backend(options), dsa_model_options(options));
}

#if MEGACTX_HAVE_CUDA
// The CUDA model's options from the load options (both load paths): the
// CLI's switches as they are, the deterministic mode's kernels.
CudaModelOptions cuda_model_options(const ModelLoadOptions& options) {
  CudaModelOptions cuda_options = options.cuda;
  cuda_options.batch_invariant = options.deterministic;
  // One GPU per rank of a group: rank r on device device_ordinal + r *
  // gpu_id_step (0: the whole group on one GPU, CudaModelOptions).
  cuda_options.group = options.group;
  if (options.group != nullptr)
    cuda_options.device_ordinal += options.group->rank() * cuda_options.gpu_id_step;
  return cuda_options;
}
#endif

// --device cuda: the host model uploads its float32 weights to the CUDA model
// and is freed.
std::unique_ptr<LanguageModel> build(const ModelConfig& config, WeightSource& weights,
                                     const ModelLoadOptions& options) {
  // LayerSplit on GPUs: the host shares drop the kv_a and indexer weights of
  // the layers another rank owns, which the CUDA upload does not take yet.
  MEGACTX_CHECK(options.device != Device::CUDA || !options.layer_split,
                "LayerSplit on GPUs loads each rank's share straight from the checkpoint: not "
                "with --cuda-fp8-upcast or random float weights");
  std::unique_ptr<LanguageModel> host = build_host(config, weights, options);
  if (options.device != Device::CUDA) return host;
#if MEGACTX_HAVE_CUDA
  const CudaModelOptions cuda_options = cuda_model_options(options);
  return make_cuda_dsa_model(static_cast<const DsaModel&>(*host), cuda_options);
#else
  fail("--device cuda: this build has no CUDA backend (configure with -DMEGACTX_CUDA=ON)");
#endif
}

// --device cuda: the CUDA model reads the checkpoint itself (e4m3 weights
// stay fp8 on the device, the others become float32 or bf16); no float32
// host model is built. Without a checkpoint (random weights of an fp8
// config): random fp8 weights.
std::unique_ptr<LanguageModel> load_cuda_from_checkpoint(const Checkpoint* checkpoint,
                                                         const ModelConfig& config,
                                                         const ModelLoadOptions& options) {
#if MEGACTX_HAVE_CUDA
  const CudaModelOptions cuda_options = cuda_model_options(options);
  DsaModelOptions model_options = dsa_model_options(options);
  auto model =
      checkpoint != nullptr
          ? make_cuda_dsa_model_from_checkpoint(*checkpoint, cuda_options, model_options)
          : make_cuda_dsa_model_random_fp8(config, options.seed, cuda_options, model_options);
  const CudaWeightBytes bytes = cuda_weight_bytes(*model);
  if (bytes.fp8_parameters == 0) {
    spdlog::info("CUDA model from the checkpoint: {:.1f} MiB of weights on the device ({})",
                 bytes.total / 1048576.0, options.cuda.bf16_weights ? "bf16/f32" : "f32");
    return model;
  }
  spdlog::info(
      "CUDA model: fp8 weights native: {:.1f} MiB of weights on the device ({:.1f} MiB e4m3 + "
      "scales for {} fp8 parameters, {:.2f} B each; {:.1f} MiB other {} tensors)",
      bytes.total / 1048576.0, bytes.fp8_matrices / 1048576.0, bytes.fp8_parameters,
      static_cast<double>(bytes.fp8_matrices) / static_cast<double>(bytes.fp8_parameters),
      (bytes.total - bytes.fp8_matrices) / 1048576.0,
      options.cuda.bf16_weights ? "bf16/f32" : "f32");
  return model;
#else
  (void)checkpoint;
  (void)config;
  (void)options;
  fail("--device cuda: this build has no CUDA backend (configure with -DMEGACTX_CUDA=ON)");
#endif
}

}  // namespace

std::unique_ptr<LanguageModel> load_language_model(const std::string& model_dir,
                                                   const ModelLoadOptions& options) {
  // A group on GPUs: tensor parallelism, expert parallelism over it,
  // data-parallel attention and context parallelism over the whole group only
  // so far; each rank reads its share of the checkpoint
  // (checkpoint_shares.h), e4m3 weights kept native.
  const bool gpu_group =
      options.device == Device::CUDA && options.group != nullptr && options.group->size() > 1;
  MEGACTX_CHECK(
      !gpu_group || (!options.experts_over_group && !options.split_indexer &&
                     (!options.layer_split || !options.context_parallel)),
      "--device cuda with a group of {}: only tensor parallelism (with LayerSplit), expert "
      "parallelism over it, data-parallel attention (with LayerSplit inside replicas of tensor "
      "ranks) and context parallelism run on GPUs so far (the experts over every context "
      "share's ranks, LayerSplit with context parallelism and the split indexer run on the CPU)",
      options.group ? options.group->size() : 1);
  if (options.random_weights) {
    ModelConfig config;
    if (std::filesystem::is_regular_file(model_dir)) {
      std::ifstream file(model_dir);
      MEGACTX_CHECK(file.good(), "cannot read config file '{}'", model_dir);
      std::stringstream text;
      text << file.rdbuf();
      config = parse_model_config(text.str());
    } else {
      config = load_model_config(model_dir);
    }
    if (options.device == Device::CUDA && options.cuda.fp8_native && config.is_fp8_checkpoint()) {
      return load_cuda_from_checkpoint(nullptr, config, options);
    }
    auto weights = make_random_weights(options.seed);
    return build(config, *weights, options);
  }
  const std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(model_dir);
  // --device cuda reads the checkpoint tensor by tensor (no float32 host
  // model: a bf16 checkpoint would need twice its size in host memory);
  // only --cuda-fp8-upcast of an fp8 checkpoint dequantises on the host.
  if (options.device == Device::CUDA &&
      options.cuda.reads_checkpoint(checkpoint->config().is_fp8_checkpoint())) {
    return load_cuda_from_checkpoint(checkpoint.get(), checkpoint->config(), options);
  }
  auto weights = make_checkpoint_weights(*checkpoint);
  // The weights are float32 copies, so the checkpoint can close afterwards.
  return build(checkpoint->config(), *weights, options);
}

CudaScratchOptions cuda_scratch_options(const ModelLoadOptions& options,
                                        const LanguageModel* model) {
  CudaScratchOptions scratch;
  scratch.bf16_gemm_inputs = options.cuda.bf16_weights;
  scratch.fp8_gemm_inputs = options.cuda.fp8_native;
  scratch.cuda_graph_max_batch = options.cuda.cuda_graph_max_batch;
  scratch.row_block = options.cuda.row_block;
#if MEGACTX_HAVE_CUDA
  if (options.device == Device::CUDA) {
    scratch.multiprocessors = query_device_multiprocessors(options.cuda.device_ordinal);
  }
  if (model != nullptr && model->device() == Device::CUDA) {
    scratch.fp8_gemm_inputs = cuda_weight_bytes(*model).fp8_parameters > 0;
  }
#endif
  scratch.fast_attention = options.cuda.fast_attention;
  scratch.device_moe = options.cuda.device_moe;
  scratch.cuda_graphs = options.cuda.cuda_graphs;
  // The layouts whose experts are reached by all-to-all, unless kept so.
  if (options.group != nullptr && options.group->size() > 1 && options.expert_parallel &&
      (options.data_parallel_attention ||
       (options.context_parallel && (options.context_parallel_size == 0 ||
                                     options.context_parallel_size == options.group->size()))) &&
      options.moe_dispatch != MoeDispatch::all_to_all)
    scratch.gathered_dispatch_ranks = options.group->size();
  scratch.gathered_dispatch_pairs = options.deterministic;
#if !MEGACTX_HAVE_CUDA
  (void)model;
#endif
  return scratch;
}

void preload_cuda_mtp_layer([[maybe_unused]] LanguageModel& model,
                            [[maybe_unused]] const std::string& model_dir) {
  if (model.device() != Device::CUDA || model.config().num_nextn_predict_layers <= 0) return;
#if MEGACTX_HAVE_CUDA
  make_cuda_mtp_layer(model, model_dir);  // the weights stay in `model`
#endif
}

KvCacheSpec make_kv_cache_spec(const ModelConfig& config, int64_t num_pages, KvDType dtype,
                               int64_t page_size, bool with_mtp_layer) {
  MEGACTX_CHECK(page_size > 0, "invalid KV page size {}", page_size);
  MEGACTX_CHECK(config.num_hidden_layers > 0, "model has no layers");
  MEGACTX_CHECK(static_cast<int64_t>(config.indexer_types.size()) == config.num_hidden_layers,
                "model config: indexer schedule has {} entries for {} layers",
                config.indexer_types.size(), config.num_hidden_layers);
  MEGACTX_CHECK(!with_mtp_layer || config.num_nextn_predict_layers > 0,
                "speculative decoding needs an MTP layer, the model has none");
  KvCacheSpec spec;
  spec.num_pages = num_pages;
  spec.page_size = page_size;
  spec.kv_lora_rank = config.kv_lora_rank;
  spec.qk_rope_head_dim = config.qk_rope_head_dim;
  spec.index_head_dim = config.index_head_dim;
  spec.dtype = dtype;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    spec.latent_layers.push_back(layer);
    if (config.layer_runs_indexer(layer)) spec.indexer_layers.push_back(layer);
  }
  if (with_mtp_layer) {
    // The MTP layer is decoder layer `num_hidden_layers` and runs its own indexer.
    spec.latent_layers.push_back(config.num_hidden_layers);
    spec.indexer_layers.push_back(config.num_hidden_layers);
  }
  return spec;
}

KvDType parse_kv_dtype(const std::string& name) {
  if (name == "f32") return KvDType::F32;
  if (name == "bf16") return KvDType::BF16;
  if (name == "fp8") return KvDType::FP8;
  fail("unknown KV dtype '{}' (f32, bf16 or fp8)", name);
}

}  // namespace megactx

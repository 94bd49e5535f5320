// CudaDsaModel: construction, batch checks, the forward driver and the
// decoder layer; attention in model/cuda/dsa_attention.cpp, MLP/MoE in
// model/cuda/dsa_ffn.cpp. Mirrors DsaModel (dsa_model.cpp) step for step.
#if MEGACTX_HAVE_CUDA
#include "model/cuda/cuda_dsa_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/scoped_value.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "model/batch_checks.h"
#include "model/expert_dispatch.h"
#include "parallel/host_staged_communicator.h"
#include "parallel/nccl_communicator.h"

namespace megactx {
namespace cuda {

void CudaDsaModel::prepare_device(const ModelConfig& config, int64_t index_topk,
                                  const CudaModelOptions& options) {
  int devices = 0;
  MEGACTX_CUDA_CHECK(cudaGetDeviceCount(&devices));
  MEGACTX_CHECK(options.device_ordinal >= 0 && options.device_ordinal < devices,
                "CUDA model: device {} requested, {} present", options.device_ordinal, devices);
  MEGACTX_CUDA_CHECK(cudaSetDevice(options.device_ordinal));
  MEGACTX_CHECK(
      config.n_group >= 1 && config.n_group <= 64 && config.n_routed_experts % config.n_group == 0,
      "CUDA model: n_group {} unsupported for {} experts", config.n_group, config.n_routed_experts);
  // The fp32 fallback kernels stage a row of top-k logits / indices and one
  // token's indexer queries in (static-size) shared memory.
  constexpr int64_t kSharedBytes = 48 * 1024;
  MEGACTX_CHECK(index_topk > 0 && index_topk * 4 <= kSharedBytes,
                "CUDA model: index_topk {} too large for the fp32 attention path", index_topk);
  MEGACTX_CHECK(config.index_n_heads * config.index_head_dim * 4 <= kSharedBytes,
                "CUDA model: indexer {} heads x {} dims too large for the fp32 indexer path",
                config.index_n_heads, config.index_head_dim);
  MEGACTX_CHECK(config.kv_lora_rank <= 512 && config.qk_rope_head_dim <= 64,
                "CUDA model: kv_lora {} / rope {} exceed the attention path's 512 / 64",
                config.kv_lora_rank, config.qk_rope_head_dim);
  MEGACTX_CHECK(config.q_lora_rank.has_value(),
                "CUDA model: DSA layers need q_lora_rank (the indexer reads the q-LoRA residual)");
}

CudaDsaModel::CudaDsaModel(ModelConfig config, int64_t index_topk,
                           std::unique_ptr<CudaWeights> weights, const CudaModelOptions& options,
                           std::optional<ModelPlan> plan)
    : config_(std::move(config)),
      options_(options),
      plan_(plan ? std::move(*plan) : plan_model(config_, index_topk)),
      index_topk_(index_topk),
      rope_(make_rope_table(config_)),
      softmax_scale_(attention_softmax_scale(config_)) {
  prepare_device(config_, index_topk_, options);
  MEGACTX_CHECK(weights != nullptr &&
                    static_cast<int64_t>(weights->layers.size()) == config_.num_hidden_layers,
                "CUDA model: weights for {} layers, the config has {}",
                weights ? weights->layers.size() : 0, config_.num_hidden_layers);
  // Of the parallel layouts tensor parallelism, expert parallelism over it
  // (each rank its experts for every row, summed with the rest),
  // data-parallel attention (the expert all-to-all,
  // dsa_expert_all_to_all.cpp; replicas of one rank or of tensor ranks) and
  // context parallelism over the whole group (dsa_context_parallel.cpp; its
  // experts whole or by all-to-all; or over context shares of tensor ranks)
  // and LayerSplit over tensor parallelism (dsa_layer_split.cpp; also inside
  // each replica of tensor ranks of data-parallel attention, over the
  // replica's group) run on the GPU so far: the experts over every share's
  // ranks, LayerSplit with context parallelism and the split indexer run on
  // the CPU (dsa_model.cpp).
  MEGACTX_CHECK(
      !plan_.experts_over_shares && !plan_.indexer_split &&
          (!plan_.layer_split || plan_.context_parallel_size == 1),
      "CUDA model: of the parallel layouts only tensor parallelism (with LayerSplit), "
      "expert parallelism over it, data-parallel attention (with LayerSplit inside replicas of "
      "tensor ranks) and context parallelism run on the GPU so far (the experts over every "
      "context share's ranks, LayerSplit with context parallelism and the split indexer run "
      "on the CPU)");
  // The group's size, as the host model's (dsa_model.cpp): tensor ranks (of
  // every data-parallel replica or context share) or expert ranks, whichever
  // is more.
  const int ranks =
      std::max(plan_.tensor_parallel_size * plan_.data_parallel_size * plan_.context_parallel_size,
               plan_.expert_parallel_size);
  MEGACTX_CHECK(options.gpu_id_step >= 0, "CUDA model: gpu_id_step {} (must be >= 0)",
                options.gpu_id_step);
  MEGACTX_CHECK(ranks == 1 || (options.group != nullptr && options.group->size() == ranks),
                "CUDA model: a parallel plan over {} ranks needs its group", ranks);
  MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  upload(rope_inv_freq_, rope_.inv_freq, stream_);  // rope_tables' frequencies, once
  if (options.group != nullptr && options.collectives == CudaModelOptions::Collectives::host) {
    // Every collective waits for the stream: no graph could hold one.
    group_ = parallel::make_host_staged_communicator(*options.group, stream_);
    options_.cuda_graphs = false;
  } else if (options.group != nullptr) {
    parallel::NcclCommunicatorOptions nccl;
    nccl.rank = options.group->rank();
    nccl.size = options.group->size();
    nccl.device = options.device_ordinal;
    nccl.stream = stream_;
    nccl.bootstrap = options.group->size() > 1 ? options.group : nullptr;
    nccl.ranks_share_device = options.gpu_id_step == 0;
    group_ = parallel::make_nccl_communicator(nccl);
    if (nccl.ranks_share_device && nccl.size > 1 && options_.cuda_graphs) {
      // Ranks of one GPU (a test layout: each its own process, NCCL between
      // them over loopback sockets) hang in their first captured decode
      // step (CudaModelGroup over NCCL, one H200: the eager steps pass);
      // why is open (docs/parallel.md). They run eagerly.
      spdlog::warn("CUDA model: NCCL ranks sharing one GPU run without CUDA Graphs");
      options_.cuda_graphs = false;
    }
  }
  // The CPU group is only NCCL's bootstrap, or the host collectives' carrier
  // (through group_).
  options_.group = nullptr;
  tensor_group_ = context_group_ = group_.get();
  if (group_ != nullptr && plan_.tensor_parallel_size > 1 && plan_.data_parallel_size > 1) {
    // Data-parallel replicas of tensor-parallel ranks: the heads' partial
    // sums within a replica, the experts' all-to-all over the whole group.
    tensor_split_ = group_->split(plan_.data_parallel_rank, plan_.tensor_parallel_rank);
    tensor_group_ = tensor_split_.get();
  }
  if (group_ != nullptr && plan_.tensor_parallel_size > 1 && plan_.context_parallel_size > 1) {
    // Context shares of tensor-parallel ranks (as the host model): the
    // heads' partial sums within a share, the rows' gathers across shares.
    tensor_split_ = group_->split(plan_.context_parallel_rank, plan_.tensor_parallel_rank);
    context_split_ = group_->split(plan_.tensor_parallel_rank, plan_.context_parallel_rank);
    tensor_group_ = tensor_split_.get();
    context_group_ = context_split_.get();
  }
  blas_ = std::make_unique<Blas>(stream_);
  blas_->set_batch_invariant(options.batch_invariant);
  // Not in the fp32 mode (exact parity): fp8_native is the CLI's default even
  // for a checkpoint without fp8 weights.
  blas_->set_batched_tf32(options.bf16_weights ||
                          (options.fp8_native && config_.is_fp8_checkpoint()));
  // One fixed cuBLAS workspace for eager launches and captured graphs alike
  // (the same algorithm choices either way; no workspace per capture).
  // 32 MiB: cuBLAS's own default on Hopper.
  blas_->set_workspace(cublas_workspace_.get<uint8_t>(kCublasWorkspaceBytes),
                       kCublasWorkspaceBytes);
  weights_ = std::move(weights);
  graph_buckets_ = decode_batch_buckets(options.cuda_graph_max_batch);
}

CudaDsaModel::~CudaDsaModel() {
  if (timer_.enabled()) {
    std::fprintf(stderr, "%swall time of those forwards (host, incl. bookkeeping): %.3f ms\n",
                 timer_.report().c_str(), forward_wall_ms_);
  }
  split_entries_.group.reset();
  if (split_entries_.side != nullptr) {
    cudaStreamSynchronize(split_entries_.side);
    cudaStreamDestroy(split_entries_.side);
    for (cudaEvent_t event :
         {split_entries_.gathered[0], split_entries_.gathered[1], split_entries_.received[0],
          split_entries_.received[1], split_entries_.prefetched[0], split_entries_.prefetched[1]})
      if (event != nullptr) cudaEventDestroy(event);
  }
  context_split_.reset();
  tensor_split_.reset();
  group_.reset();  // NCCL synchronises the stream it was given: before it goes
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (offload_hot_.side != nullptr) {
    cudaStreamSynchronize(offload_hot_.side);
    cudaStreamDestroy(offload_hot_.side);
    cudaEventDestroy(offload_hot_.assigned);
    for (auto& [layer, event] : offload_hot_.filled) cudaEventDestroy(event);
  }
}

void CudaDsaModel::check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const {
  MEGACTX_CHECK(weights_ != nullptr,
                "the model's weights are released (resume_memory_occupation brings them back)");
  check_cache_layout(plan_, cache, Device::CUDA);
  // A rank of data-parallel attention may have no sequences in a step.
  MEGACTX_CHECK(!batch.sequences.empty() || plan_.expert_all_to_all, "forward: empty batch");
  check_sequence_inputs(batch, cache.spec(), config_.vocab_size);
}

ForwardOutput CudaDsaModel::forward(const ForwardBatch& batch, PagedKvCache& cache) {
  std::optional<DecodeGraphKey> key = graph_key(batch, cache);
  // The MoE dispatch of this step (data-parallel attention, context
  // parallelism with the experts split), decided from what every rank knows
  // alike (model/expert_dispatch.h): gathered over the graph bucket's rows
  // (their longest context share) in a step that runs as a graph (on this
  // rank or not: a failed capture runs eagerly with the same collectives),
  // gathered over the longest share when asked for on every step, else the
  // all-to-all. (The MTP layer's runs decide their own: run_mtp.)
  int64_t gathered = key ? graph_gathered_rows(key->rows()) : 0;
  if (gathered == 0 && plan_.expert_all_to_all && weights_ != nullptr) {
    const int64_t rows = gathered_dispatch_rows(plan_, batch);
    bool served = rows > 0;
    for (const DeviceLayer& w : weights_->layers)
      served = served && (!w.is_moe || gathered_on_device(w, rows));
    if (served) gathered = rows;
  }
  const ScopedValue<int64_t> dispatch(gathered_rows_, gathered);
  // A rank of data-parallel attention without rows in an eager step still
  // serves the other ranks' experts.
  if (batch.sequences.empty() && plan_.expert_all_to_all && !key) return forward_no_rows();
  const auto wall_start = std::chrono::steady_clock::now();
  bool decode_step = true;
  for (const SequenceInput& in : batch.sequences) decode_step &= in.tokens.size() == 1;
  timer_.begin_forward(decode_step);
  timer_.mark("host prep + uploads", stream_);
  check_batch(batch, cache);
  // A key whose capture failed runs unpadded until the graphs are next
  // dropped (then its capture is tried again).
  if (key && graphs_.failed(*key)) key.reset();
  if (!key && batch.sequences.empty()) return forward_no_rows();
  ForwardOutput output = key ? forward_graph(batch, cache, *key) : forward_eager(batch, cache);
  read_back_offload_counters();
  timer_.collect(stream_);
  if (timer_.active())
    forward_wall_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start)
            .count();
  return output;
}

ForwardOutput CudaDsaModel::forward_eager(const ForwardBatch& batch, PagedKvCache& cache) {
  const int64_t hidden = config_.hidden_size;
  Scratch& sc = scratch_;

  // Host bookkeeping, uploaded once: tokens, positions, paging, RoPE tables,
  // and the rows that want logits.
  std::vector<int32_t> ids, positions, table_offset, page_tables, logit_rows;
  Step step;
  ++selection_epoch_;
  int64_t offset = 0;
  for (const SequenceInput& in : batch.sequences) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int32_t table = static_cast<int32_t>(page_tables.size());
    const int64_t pages =
        (in.start_position + n + cache.spec().page_size - 1) / cache.spec().page_size;
    page_tables.insert(page_tables.end(), in.page_table.begin(), in.page_table.begin() + pages);
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(in.tokens[i]);
      positions.push_back(static_cast<int32_t>(in.start_position + i));
      table_offset.push_back(table);
    }
    const int64_t from = in.logits_from < 0 ? n - 1 : in.logits_from;
    for (int64_t i = from; i < n; ++i) logit_rows.push_back(static_cast<int32_t>(offset + i));
    step.max_context = std::max(step.max_context, in.start_position + n);
    offset += n;
  }
  step.tokens = offset;
  if (plan_.layer_split) {  // what share_layer_kv sends (LayerSplit only)
    for (const int32_t page : page_tables)
      step.pages_in_use = std::max<int64_t>(step.pages_in_use, int64_t{page} + 1);
    // The new rows' cache slots (the pool form sends them after the owner
    // writes them).
    const int64_t page_size = cache.spec().page_size;
    std::vector<int32_t> new_slots(positions.size());
    for (size_t t = 0; t < positions.size(); ++t)
      new_slots[t] = static_cast<int32_t>(
          int64_t{page_tables[static_cast<size_t>(table_offset[t] + positions[t] / page_size)]} *
              page_size +
          positions[t] % page_size);
    begin_layer_split_step(new_slots);
  }
  const int64_t n = step.tokens;
  const int64_t half = config_.qk_rope_head_dim / 2;

  const CacheLayouts layouts = cache_layouts(cache.spec());
  step.latent = layouts.latent;
  step.indexer = layouts.indexer;
  step.rows.page_size = cache.spec().page_size;
  step.rows.page_tables = upload(sc.page_tables, page_tables, stream_);
  step.rows.table_offset = upload(sc.table_offset, table_offset, stream_);
  step.rows.positions = upload(sc.positions, positions, stream_);
  // RoPE tables from the uploaded positions, on the device (the host's
  // double cos / sin took ~20 ms per 16K-row chunk, the GPU idle meanwhile).
  float* cos = sc.cos.get<float>(n * half);
  float* sin = sc.sin.get<float>(n * half);
  rope_tables(step.rows.positions, n, rope_inv_freq_.as<float>(), half, rope_.attention_factor, cos,
              sin, stream_);
  step.cos = cos;
  step.sin = sin;
  const int32_t* d_ids = upload(sc.ids, ids, stream_);
  const int32_t* d_logit_rows = upload(sc.logit_rows, logit_rows, stream_);
  step.topk = sc.topk.get<int32_t>(n * index_topk_);
  step.counts = sc.counts.get<int32_t>(n);

  ForwardOutput output;
  const int64_t m = static_cast<int64_t>(logit_rows.size());
  const int64_t vocab = config_.vocab_size;
  float* logits = nullptr;
  if (options_.logits_on_device) {
    // The caller owns the returned tensor (a pooled buffer).
    output.logits = logits_pool_.take({m, vocab});
    logits = static_cast<float*>(output.logits.raw());
  } else {
    logits = sc.logits.get<float>(m * vocab);
  }
  if (batch.want_routed_experts) begin_routed_capture(n);
  run_layers(step, d_ids, d_logit_rows, m, cache, logits);
  if (batch.want_routed_experts) output.routed_experts = routed_experts_to_host(n);

  if (batch.want_hidden_states) {
    output.hidden_states = Tensor::empty({n, hidden});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(output.hidden_states.raw(), sc.x.as<float>(),
                                       static_cast<size_t>(n * hidden) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
  }
  if (!options_.logits_on_device) {
    output.logits = Tensor::empty({m, vocab});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(output.logits.raw(), logits,
                                       static_cast<size_t>(m * vocab) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
  }
  finish_forward(batch);
  return output;
}

void CudaDsaModel::begin_routed_capture(int64_t rows) {
  const int64_t count = rows * config_.num_hidden_layers * config_.num_experts_per_tok;
  routed_ids_ = scratch_.routed.get<int32_t>(count);
  // -1 at the dense layers (bytes 0xff).
  MEGACTX_CUDA_CHECK(
      cudaMemsetAsync(routed_ids_, 0xff, static_cast<size_t>(count) * sizeof(int32_t), stream_));
}

Tensor CudaDsaModel::routed_experts_to_host(int64_t rows) {
  Tensor out =
      Tensor::empty({rows, config_.num_hidden_layers, config_.num_experts_per_tok}, DType::I32);
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(out.raw(), scratch_.routed.as<int32_t>(), out.nbytes(),
                                     cudaMemcpyDeviceToHost, stream_));
  routed_ids_ = nullptr;  // finish_forward syncs before the caller reads it
  return out;
}

void CudaDsaModel::finish_forward(const ForwardBatch& batch) {
  // Host outputs (hidden states, host logits, routed experts) and the phase
  // timer need the stream finished; device logits do not: their consumer (the
  // CudaSampler on this stream, or to_host) is ordered after the forward.
  if (batch.want_hidden_states || batch.want_routed_experts || !options_.logits_on_device ||
      timer_.active()) {
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void CudaDsaModel::run_layers(Step& step, const int32_t* ids, const int32_t* logit_rows,
                              int64_t logit_count, PagedKvCache& cache, float* logits) {
  const int64_t n = step.tokens;
  const int64_t hidden = config_.hidden_size;
  Scratch& sc = scratch_;
  // x: [n, hidden] residual stream, from the embeddings.
  float* x = sc.x.get<float>(n * hidden);
  blas_->clear_shared_inputs();  // nothing shared outlives a forward that threw
  timer_.mark("embed", stream_);
  embed_gather(weights_->embed, ids, n, hidden, x, stream_);
  // Each layer's last residual add runs fused with the next layer's input norm.
  const int64_t layers = config_.num_hidden_layers;
  for (int64_t layer = 0; layer < layers; ++layer) {
    routed_layer_ = layer;
    decoder_layer(weights_->layers[layer], layer, step, cache, x, /*input_normed=*/layer > 0,
                  layer + 1 < layers ? weights_->layers[layer + 1].input_norm : nullptr);
  }
  join_offload_fills();     // the live host tier's side stream, back before the end
  join_layer_split_side();  // LayerSplit's side stream likewise
  timer_.mark("final norm + lm_head", stream_);
  const int64_t m = logit_count;
  float* normed = sc.normed.get<float>(m * hidden);
  gather_rows(x, logit_rows, m, hidden, normed, stream_);
  rmsnorm(normed, m, hidden, hidden, weights_->final_norm, plan_.rms_norm_eps, normed, hidden,
          stream_);
  blas_->linear(normed, m, hidden, weights_->lm_head, config_.vocab_size, logits);
}

CudaDsaModel::Step CudaDsaModel::Step::rows_of(int64_t first, int64_t count, int64_t rope_half,
                                               int64_t index_stride) const {
  Step part = *this;
  part.tokens = count;
  part.rows.table_offset += first;
  part.rows.positions += first;
  part.cos += first * rope_half;
  part.sin += first * rope_half;
  part.topk += first * index_stride;
  part.counts += first;
  part.token_tables = nullptr;
  part.row_visible = nullptr;
  part.row_ids = nullptr;
  part.table_stride = 0;
  return part;
}

void CudaDsaModel::reduce_partial(float* data, int64_t count) {
  if (group_ == nullptr) return;
  // Data-parallel attention: a rank's outputs are whole (its own rows), or
  // with replicas of tensor ranks summed within the replica (whose ranks all
  // have the same rows: none, in a step without any, which still runs the
  // layers for the experts' all-to-all).
  // Context parallelism: the branches are gathered whole, nothing to sum.
  if (!plan_.expert_all_to_all && plan_.context_parallel_size == 1)
    group_->all_reduce(data, count, parallel::ReduceOp::Sum);
  else if (plan_.tensor_parallel_size > 1 && count > 0)
    tensor_group_->all_reduce(data, count, parallel::ReduceOp::Sum);
}

void* CudaDsaModel::gemm_input_copy(DeviceBuffer& buffer, int64_t count) {
  return options_.bf16_weights ? buffer.get<uint16_t>(count) : nullptr;
}

namespace {
// A bf16 matrix that the bf16 linears read (not an fp8 one).
bool bf16_only(const DeviceMatrix& m) {
  return m.bf16 && !m.fp8();
}
}  // namespace

bool CudaDsaModel::reads_f32_norm(const DeviceLayer& w, bool attention) const {
  // Only bf16 linears (outside the deterministic mode) read the bf16 copy
  // alone; fp8 and float32 weights quantise / read the float32 values, and so
  // does the MoE's router.
  if (!options_.bf16_weights || options_.batch_invariant) return true;
  if (attention) {
    const bool q = plan_.attention.q_lora > 0 ? bf16_only(w.q_a) : bf16_only(w.q_b);
    const bool indexer = !w.has_indexer || (bf16_only(w.wk) && bf16_only(w.weights_proj));
    return !(q && bf16_only(w.kv_a) && indexer);
  }
  return w.is_moe || !bf16_only(w.dense.gate_up);
}

bool CudaDsaModel::reads_f32_q_resid(const DeviceLayer& w) const {
  if (!options_.bf16_weights || options_.batch_invariant) return true;
  return !(bf16_only(w.q_b) && (!w.has_indexer || bf16_only(w.wq_b)));
}

bool CudaDsaModel::reads_fp8_norm(const DeviceLayer& w, bool attention) {
  if (attention) return w.qkv_a ? w.qkv_a.fp8() : (w.q_a ? w.q_a.fp8() : w.q_b.fp8());
  return !w.is_moe && w.dense.gate_up.fp8();
}

Fp8Copy CudaDsaModel::fp8_copy(DeviceBuffer& codes, DeviceBuffer& scales, int64_t n, int64_t width,
                               bool fp8_readers, bool norm) {
  static const int forced = [] {  // -1: not set
    const char* value = std::getenv("MEGACTX_CUDA_FP8_NORM_COPY");
    if (value == nullptr || *value == '\0') return -1;
    return value[0] == '1' ? 1 : 0;
  }();
  const bool enabled = forced < 0 ? options_.fp8_norm_copy : forced == 1;
  if (!enabled || !fp8_readers || n > kFp8NormCopyMaxRows || (norm && width > kFp8CopyMaxWidth))
    return {};
  const int64_t groups = (width + 127) / 128;
  Fp8Copy copy;
  copy.q = codes.get<uint8_t>(n * width);
  float* both = scales.get<float>(2 * n * groups);
  copy.scale_rows = both;
  copy.scale_groups = both + n * groups;
  return copy;
}

Fp8Copy CudaDsaModel::h_fp8_copy(int64_t n, bool fp8_readers) {
  return fp8_copy(scratch_.h_fp8, scratch_.h_fp8_scales, n, config_.hidden_size, fp8_readers);
}

void CudaDsaModel::decoder_layer(const DeviceLayer& w, int64_t layer, Step& step,
                                 PagedKvCache& cache, float* x, bool input_normed,
                                 const float* next_norm) {
  const int64_t n = step.tokens;
  const int64_t hidden = config_.hidden_size;
  const float eps = plan_.rms_norm_eps;
  float* h = scratch_.h.get<float>(n * hidden);
  void* h_bf16 = gemm_input_copy(scratch_.h_bf16, n * hidden);
  float* branch = scratch_.branch.get<float>(n * hidden);
  timer_.mark("norms + residual", stream_);
  // The norms write h in float32 only where something reads it so (the
  // previous layer's last norm is this one's input norm: its choice is
  // this layer's attention's: reads_f32_norm).
  const bool attention_f32 = reads_f32_norm(w, /*attention=*/true);
  // The e4m3 copy of h for fp8 linears: written by this norm, or by the
  // previous layer's fused one (input_normed), which decides by this layer's weights too.
  const Fp8Copy attention_fp8 = h_fp8_copy(n, reads_fp8_norm(w, /*attention=*/true));
  if (!input_normed)
    rmsnorm(x, n, hidden, hidden, w.input_norm, eps, attention_f32 ? h : nullptr, hidden, stream_,
            h_bf16, attention_fp8);
  blas_->share_input(h, n, hidden, hidden, h_bf16, attention_f32);
  blas_->share_fp8_input(h, n, hidden, hidden, attention_fp8.q, attention_fp8.scale_rows,
                         attention_fp8.scale_groups);
  // Context parallelism: this rank's share of the rows (every row's latent
  // and key still go into its cache); the others' outputs gathered after.
  const auto [own_first, own_last] = context_rows(n);
  const int64_t own = own_last - own_first;
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(float));
  attention(w, layer, h, step, cache, branch, own_first, own_last);
  if (own < n) gather_context_rows(branch, row_bytes, row_bytes, n, own_first, own_last);
  reduce_partial(branch, n * hidden);  // tensor parallel: each rank's heads' share of o_proj
  timer_.mark("norms + residual", stream_);
  const bool mlp_f32 = reads_f32_norm(w, /*attention=*/false);
  const Fp8Copy mlp_fp8 = h_fp8_copy(n, reads_fp8_norm(w, /*attention=*/false));
  add_rmsnorm(x, branch, n, hidden, w.post_norm, eps, mlp_f32 ? h : nullptr, stream_, h_bf16,
              mlp_fp8);
  blas_->share_input(h, n, hidden, hidden, h_bf16, mlp_f32);
  blas_->share_fp8_input(h, n, hidden, hidden, mlp_fp8.q, mlp_fp8.scale_rows, mlp_fp8.scale_groups);
  // The feed-forward in blocks of row_block(n) rows, as attention's core: its
  // activations are [block, ...] whatever n is. This rank's rows.
  const int64_t block = row_block(own);
  const int64_t routed_row_words = config_.num_hidden_layers * config_.num_experts_per_tok;
  int32_t* const routed = routed_ids_;
  // Data-parallel attention: one expert all-to-all per MoE layer over all
  // the rows, since every rank must make the same collectives whatever its
  // row count.
  const bool one_call = w.is_moe && plan_.expert_all_to_all;
  if (one_call) {
    if (routed != nullptr) routed_ids_ = routed + own_first * routed_row_words;
    data_parallel_moe(w, h + own_first * hidden, own, branch + own_first * hidden);
  }
  for (int64_t first = own_first; first < own_last && !one_call; first += block) {
    const int64_t rows = std::min(block, own_last - first);
    if (w.is_moe) {
      // The routed-expert capture of these rows starts at row `first`.
      if (routed != nullptr) routed_ids_ = routed + first * routed_row_words;
      moe(w, h + first * hidden, rows, branch + first * hidden);
    } else {
      timer_.mark("dense mlp", stream_);
      mlp(w.dense, h + first * hidden, rows, branch + first * hidden);
    }
  }
  routed_ids_ = routed;
  if (own < n) {
    gather_context_rows(branch, row_bytes, row_bytes, n, own_first, own_last);
    if (w.is_moe && routed != nullptr) {
      // The routing record of this layer: [n, top_k] of the capture rows.
      const int64_t top_k = config_.num_experts_per_tok;
      gather_context_rows(routed + layer * top_k, top_k * static_cast<int64_t>(sizeof(int32_t)),
                          routed_row_words * static_cast<int64_t>(sizeof(int32_t)), n, own_first,
                          own_last);
    }
  }
  // Tensor parallel: each rank's share of every MLP's width. Not after
  // moe_over_tensor_slices (the slices gathered, the shared expert summed
  // within the replica), as DsaModel::decoder_layer.
  if (!(w.is_moe && moe_over_slices())) reduce_partial(branch, n * hidden);
  timer_.mark("norms + residual", stream_);
  if (next_norm != nullptr) {
    // The next layer's input norm, read by its attention.
    const DeviceLayer& next = weights_->layers[layer + 1];
    const bool next_f32 = reads_f32_norm(next, /*attention=*/true);
    add_rmsnorm(x, branch, n, hidden, next_norm, eps, next_f32 ? h : nullptr, stream_, h_bf16,
                h_fp8_copy(n, reads_fp8_norm(next, /*attention=*/true)));
  } else {
    add_into(x, branch, n * hidden, stream_);
    blas_->unshare_input(h);
  }
}

}  // namespace cuda

std::unique_ptr<LanguageModel> make_cuda_dsa_model(const DsaModel& host,
                                                   const CudaModelOptions& options) {
  cuda::CudaDsaModel::prepare_device(host.config(), host.index_topk(), options);
  auto weights = std::make_unique<cuda::CudaWeights>(host.weights(), options.bf16_weights);
  return std::make_unique<cuda::CudaDsaModel>(host.config(), host.index_topk(), std::move(weights),
                                              options, host.plan());
}

}  // namespace megactx
#endif  // MEGACTX_HAVE_CUDA

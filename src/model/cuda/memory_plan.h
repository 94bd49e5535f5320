// Device memory plan of the CUDA model, from a budget: the weights, the
// scratch of the largest step (tokens x context, the CUDA-graph decode bucket
// included), the fast attention path's and the device MoE's workspaces, the
// fixed cuBLAS workspace, and what is left for KV pages. Plain C++ (no CUDA):
// the engine asks it before allocating, and start-up fails with a clear Error
// when the model does not fit.
#pragma once

#include <cstdint>
#include <string>

#include "cache/kv_cache.h"
#include "io/model_config.h"

namespace megactx {

// The CudaModelOptions (model/cuda/cuda_model.h) that change what a step
// allocates, and the decode steps the engine can send.
struct CudaScratchOptions {
  // CudaModelOptions::fast_attention: its workspaces count only where the fast
  // path runs (cuda_fast_attention_used: FP8 KV of 64-token pages, shapes).
  bool fast_attention = true;
  // CudaModelOptions::device_moe: the grouped MoE's plan, activations and
  // per-pair outputs for up to kGroupedMoeMaxRows rows.
  bool device_moe = true;
  // CudaModelOptions::cuda_graphs / cuda_graph_max_batch: decode steps padded
  // to a batch bucket and a power-of-two context bucket.
  bool cuda_graphs = true;
  int64_t cuda_graph_max_batch = 256;
  // Most sequences of one decode step (the engine's max_running_requests; 0:
  // cuda_graph_max_batch) and the tokens each brings (1, or 1 + k with MTP
  // verification of k drafts; graphs take up to 8).
  int64_t decode_sequences = 0;
  int64_t decode_tokens_per_sequence = 1;
  // SMs of the device (the fast path's split-K partials); 132 on the H200.
  int64_t multiprocessors = 132;
  // Blas's grow-only GEMM input copies (kernels/cuda/gemm/gemm.h): bf16
  // weights round each input to bf16 [rows, in]; fp8 weights quantise it to
  // e4m3 [rows, in] with float32 scales [rows, in / 128]. The fp32 parity
  // mode has neither. fp8_gemm_inputs also means fp8 experts (the device
  // MoE's quantised inputs).
  bool bf16_gemm_inputs = false;
  bool fp8_gemm_inputs = false;
  // CudaModelOptions::row_block: rows per block of the attention core and the
  // feed-forward (their buffers are that many rows, not the step's); 0: the
  // whole step.
  int64_t row_block = 0;
  // The live host tier (EngineConfig::host_latent_memory_bytes): its offload
  // slots (offload pages x page size; 0: no tier), for the fast path's
  // staging of offload-page entries (cuda_offload_staging_bytes), and the
  // fewer device pages one sequence of the whole context needs beside them.
  int64_t offload_tokens = 0;
  // The ranks of the gathered MoE dispatch (model/expert_dispatch.h;
  // data-parallel attention or context parallelism with the experts reached
  // by all-to-all; 0: none): its grouped calls run over every rank's rows,
  // so the device MoE's workspace counts the grouped path's largest call,
  // and its own buffers (cuda_gathered_dispatch_bytes) count too.
  int64_t gathered_dispatch_ranks = 0;
  // The deterministic mode's gathered dispatch sends every pair's expert
  // output back ([rows, top_k, H] instead of [rows, H]).
  bool gathered_dispatch_pairs = false;
};

struct CudaMemoryRequest {
  int64_t budget_bytes = 0;     // device memory the model may use in all
  int64_t weight_bytes = 0;     // as uploaded (fp32 parity mode: 4 B per parameter)
  int64_t max_step_tokens = 0;  // most new tokens in one forward (all sequences)
  int64_t max_context = 0;      // longest sequence (start + new tokens)
  int64_t max_logit_rows = 0;   // most rows that want logits in one forward
  int64_t index_topk = 0;
  KvCacheSpec kv;  // layers, dims, dtype, page_size (num_pages ignored)
  CudaScratchOptions options;
  // weight_bytes was measured around the model's construction, which already
  // allocated the fixed cuBLAS workspace: not counted a second time.
  bool weights_include_workspace = false;
};

// The parts of the plan besides weights and KV pages, in bytes.
struct CudaScratchBreakdown {
  // CudaDsaModel::Scratch: activations, indexer scores [tokens, context]
  // (on the fast path at most kCudaIndexerScoresCap floats: larger steps run
  // the fused indexer + top-k, see model/cuda/fast_attention_plan.h),
  // normed rows and logits, sized by the larger of the largest eager step and
  // the padded CUDA-graph bucket (buffer by buffer: they grow independently).
  int64_t step = 0;
  int64_t fast_attention = 0;    // CudaDsaModel::FastScratch (0: fallback kernels)
  int64_t device_moe = 0;        // moe_plan + moe_act + moe_pair_out (0: host dispatch)
  int64_t graph_inputs = 0;      // the packed-input device block of the largest bucket
  int64_t gemm_inputs = 0;       // Blas's bf16 / e4m3 input copies at the most rows
  int64_t cublas_workspace = 0;  // 32 MiB (0 when inside the measured weight bytes)
  int64_t pinned_host = 0;       // HOST page-locked staging of the packed inputs
  int64_t graph_rows = 0;        // the padded bucket: rows (0: no graphs) ...
  int64_t graph_context = 0;     // ... and its context bucket
  int64_t device_total() const {
    return step + fast_attention + device_moe + graph_inputs + gemm_inputs + cublas_workspace;
  }
  std::string summary() const;  // "step X MiB + fast attention Y MiB + ..."
};

struct CudaMemoryPlan {
  int64_t weight_bytes = 0;
  int64_t scratch_bytes = 0;  // scratch.device_total()
  CudaScratchBreakdown scratch;
  int64_t kv_bytes_per_page = 0;
  int64_t kv_pages = 0;  // pages that fit in what is left
};

// The cuBLAS workspace every CUDA model allocates at construction
// (CudaDsaModel::kCublasWorkspaceBytes).
inline constexpr int64_t kCudaCublasWorkspaceBytes = int64_t{32} << 20;

// Bytes of CudaDsaModel's step scratch (model/cuda/cuda_dsa_model.h) for `tokens` new
// tokens over contexts up to `max_context`, `logit_rows` of them wanting logits,
// the attention core and feed-forward in blocks of `row_block` rows.
int64_t cuda_step_scratch_bytes(const ModelConfig& config, int64_t tokens, int64_t max_context,
                                int64_t logit_rows, int64_t index_topk, int64_t row_block = 0);

// The gathered MoE dispatch's buffers beside the grouped MoE's
// (CudaDsaModel::moe_gathered) at its largest: every rank's rows of one
// grouped call (the grouped path's row bound) as gathered rows, partial sums
// and received partials [rows, H] float32, a rank's padded rows, and the
// routing words (ids and gates, this rank's and every rank's, and the local
// ids and gates); with `pair_outputs` (the deterministic mode) the received
// and summed buffers are [rows, top_k, H]. 0 without MoE layers.
int64_t cuda_gathered_dispatch_bytes(const ModelConfig& config, bool pair_outputs = false);

// The grouped device MoE's workspaces (kernels/cuda/moe/grouped_moe.h
// grouped_moe_layout: plan ints, [pairs, I] activations, [rows, top_k, H]
// outputs; with `fp8_experts` the e4m3 inputs and activations with their
// scales) for calls of up to `rows` rows; 0 for models without routed
// experts or shapes the grouped path does not serve. The plan is sized for
// the smallest tile of the experts' kind (the most tiles).
int64_t cuda_device_moe_scratch_bytes(const ModelConfig& config, int64_t rows,
                                      bool fp8_experts = false);

// Blas's GEMM input copies for steps of up to `rows` rows: the last input it
// converted to bf16 [rows, in] and/or quantised to e4m3 [rows, in] + scales
// [rows, ceil(in / 128)], for the widest of the whole step's inputs (hidden,
// q_lora), a row block's (heads x v_head_dim, the MLPs' intermediates, 2 x
// hidden for the MTP layer's eh_proj) and the logits rows' (hidden); with
// bf16 also the copies the model writes beside its GEMM inputs
// (CudaDsaModel::gemm_input_copy): bf16 [rows, hidden], [rows, q_lora] and
// [block, the widest MLP intermediate].
int64_t cuda_gemm_input_bytes(const ModelConfig& config, int64_t rows, bool bf16, bool fp8,
                              int64_t row_block = 0, int64_t logit_rows = 0);

// Every part of the scratch of `request` (see CudaScratchBreakdown).
CudaScratchBreakdown cuda_scratch_breakdown(const ModelConfig& config,
                                            const CudaMemoryRequest& request);

// Throws megactx::Error naming the numbers when weights + scratch exceed the
// budget or no page of max_context fits.
CudaMemoryPlan plan_cuda_memory(const ModelConfig& config, const CudaMemoryRequest& request);

struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// cudaMemGetInfo of `device_ordinal` (its context is created first, so two
// calls around a model load differ by what the load allocated). An Error in
// builds without CUDA or when the device is missing.
DeviceMemoryInfo query_device_memory(int device_ordinal = 0);

// The SM count of `device_ordinal` (the fast path's split-K plan); an Error
// in builds without CUDA.
int64_t query_device_multiprocessors(int device_ordinal = 0);

}  // namespace megactx

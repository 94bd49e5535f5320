// The switches of the CUDA model, one struct from the command line
// (cli/cuda_options.h) through ModelLoadOptions to CudaDsaModel. Plain C++.
#pragma once

#include <cstdint>
#include <limits>

namespace megactx {

namespace parallel {
class Communicator;
}

struct CudaModelOptions {
  // ForwardOutput::logits on the device (for a device sampler) or copied to
  // the host (the CPU sampler and the CLI today).
  bool logits_on_device = false;
  // The bf16 mode: the GEMM weights (projections, experts, lm_head) are kept
  // in bf16 and each GEMM rounds its float32 input to bf16 and accumulates in
  // float32 on tensor cores; norms, RoPE, attention, routing and the residual
  // stream stay float32. false: the fp32 exact-parity mode.
  bool bf16_weights = false;
  // With an FP8 KV cache of 64-token pages and the GLM-5.x / DeepSeek-V3.2
  // attention shapes (kv_lora 512, rope 64, index dim 128): the indexer, top-k
  // and sparse MLA run on the fp8 DSA kernels (bf16 queries, fp8 indexer
  // queries; close to, not equal to, the fp32 path). false, or any other cache
  // or shape: the fp32 fallback kernels.
  bool fast_attention = true;
  // MoE layers of up to kGroupedMoeMaxRows rows (decode, MTP verification)
  // route and run their experts on the device with no host synchronisation
  // (kernels/cuda/moe, graph-capturable); larger batches, fp8 experts or
  // false: the host dispatch (expert ids read back, one GEMM chain per used
  // expert).
  bool device_moe = true;
  // Decode steps (every sequence 1 new token, or the same 1 + k for MTP
  // verification) padded to a batch-size bucket and replayed as CUDA Graphs
  // (model/cuda/decode_graph.h), when the whole step is capturable (MoE
  // layers only on the device MoE path; the phase timer off). false (CLI
  // --no-cuda-graphs): every step launches its kernels one by one.
  bool cuda_graphs = true;
  // The largest bucket; batches of more sequences run without a graph.
  int64_t cuda_graph_max_batch = 256;
  // An fp8 checkpoint's e4m3 matrices kept as shipped
  // (make_cuda_dsa_model_from_checkpoint); false: dequantised into float32
  // on the host first. A weight reload takes the same path.
  bool fp8_native = false;
  // The deterministic mode (ModelLoadOptions::deterministic): every GEMM on
  // the batch-invariant kernel (kernels/cuda/gemm/batch_invariant_gemm.h) and
  // only kernels whose per-row result does not depend on the other rows of
  // the batch, so that decode, prefill, chunked prefill and MTP verification
  // give a token bit-identical logits.
  bool batch_invariant = false;
  // Rows per block of a step's attention core (q_b, the absorbed W_UK / W_UV,
  // sparse MLA, o_proj) and feed-forward: a longer step (a prefill chunk) runs
  // them block after block, so their activations hold [row_block, ...] rather
  // than [step rows, ...] (at 1024, a 16K-token chunk of GLM-5.2 needs ~11 GB
  // less). The indexer, the KV writes and the norms run on the whole step.
  // The memory plan counts the same (CudaScratchOptions::row_block). 0: the
  // whole step is one block. Blocks change nothing but rounding
  // (CudaModel.RowBlocksMatchCpuModel; in the batch-invariant mode the blocked
  // step is bit-identical to the whole one: CudaFastAttention.RowBlocksMatchTheWholeStep).
  int64_t row_block = 1024;
  // The bf16 mode, fast attention: attention blocks of at least this many
  // rows run the absorbed per-head products on bf16 tensor cores with bf16
  // outputs where the next kernel reads bf16: W_UK writes the latent half of
  // the sparse MLA's packed bf16 queries, W_UV reads the sparse MLA's bf16
  // output (instead of float32 TF32 products and the pack / unpack copies).
  // 1: every block, decode included, since the weights' bf16 copies are made
  // once at load (DeviceLayer::w_uk_t_bf16; until then a per-step copy made
  // 512 the threshold). Measured on the H200 through serve (GLM-5.2 attention
  // config): TTFT 2.50 -> 2.28 s at 128K, 32.4 -> 30.8 s at 1M; decode
  // (model_decode_bench, with the norms' weights loaded early) 1.64 -> 1.34
  // ms at batch 1. Logits within the bf16 mode's 2e-2 of the TF32 products
  // (CudaFastAttention.Bf16AbsorbedProductsMatchTheTf32Ones).
  // MEGACTX_CUDA_BF16_ABSORBED_MIN_ROWS overrides it (A/B runs through serve;
  // 0 turns the bf16 products off).
  int64_t bf16_absorbed_min_rows = 1;
  // Blocks of that size also keep two activations in bf16 from the GEMM that
  // writes them, as the next GEMM reads them anyway: the attention's q (q_b
  // writes bf16; W_UK reads its nope columns in place, the query pack rotates
  // its rope columns) and the dense MLP's gate / up (silu_mul reads bf16 and
  // writes only the bf16 input of down). Instead of float32 outputs rounded
  // by a conversion after. bf16 or fp8 weights (fp8: the block-scaled GEMM
  // writes bf16; the MLP takes it only when down is bf16 too).
  // MEGACTX_CUDA_BF16_ACTIVATIONS=0 turns it off (A/B runs through serve).
  bool bf16_activations = true;
  // The norms (and the MLP's silu_mul) that feed fp8 linears also write the
  // e4m3 codes and scales those linears read (Blas::share_fp8_input), in
  // steps of up to CudaDsaModel::kFp8NormCopyMaxRows rows, instead of one
  // quantisation launch per linear; the same bits either way
  // (CudaFp8Model.NormCopyGivesBitIdenticalLogits, passed on an H100): 1.5-2.5%
  // faster decode on an H100 at batches 1-32 of glm_1b, neutral on the H200
  // (docs/benchmarks.md).
  // MEGACTX_CUDA_FP8_NORM_COPY=1 or =0 overrides it (A/B runs through serve).
  bool fp8_norm_copy = true;
  int device_ordinal = 0;
  // Tensor parallelism on GPUs (model_plan.h): this process's CPU group, one
  // rank per GPU. The model joins an NCCL communicator of the same ranks on
  // its own stream (the group carries NCCL's unique id) and adds up the
  // attention and feed-forward partial sums through it, also inside captured
  // graphs. A group of one rank runs the same calls (a one-rank NCCL
  // communicator). Not owned; outlives the model. Null: no collectives.
  parallel::Communicator* group = nullptr;
  // Rank r of a group runs on device device_ordinal + r * gpu_id_step
  // (SGLang's --base-gpu-id / --gpu-id-step; the loader applies it). 0 puts
  // the whole group on one GPU: a test set-up, so that a machine with one GPU
  // runs the parallel layouts' code with several ranks (NCCL then needs
  // NcclCommunicatorOptions::ranks_share_device, or host collectives).
  int gpu_id_step = 1;
  // How a group's partial sums travel: NCCL on the model's stream (also
  // inside captured graphs), or `host`: through host memory over the CPU
  // group (parallel/host_staged_communicator.h: every collective waits for
  // the stream, so the model runs without CUDA Graphs). Host collectives are
  // for tests on one GPU where NCCL cannot form the group.
  enum class Collectives { nccl, host };
  Collectives collectives = Collectives::nccl;

  // Whether a CUDA model is built (and reloaded) straight from a checkpoint:
  // always, but for an fp8 checkpoint whose e4m3 matrices are to be
  // dequantised on the host first (fp8_native off).
  bool reads_checkpoint(bool fp8_checkpoint) const { return fp8_native || !fp8_checkpoint; }
};

}  // namespace megactx

// The CUDA model switches `generate`, `logits` and `serve` share (each an
// Error without --device cuda), and how they set ModelLoadOptions:
//   [--cuda-bf16] [--cuda-fp8-upcast] [--no-cuda-graphs]
//   [--cuda-fallback-attention] [--cuda-host-moe]
#pragma once

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "model/model_loader.h"

namespace megactx::cli {

// --deterministic (serve, generate; CPU and CUDA): ModelLoadOptions::deterministic.
inline constexpr const char* kDeterministicHelp =
    "Batch-invariant kernels: a token's logprob is bit-identical whether it was sampled in "
    "decode, scored by prefill, in another batch, chunk or after a prefix hit, or verified by "
    "MTP (RL rollouts equal to scoring; slower GEMMs)";

struct CudaCliOptions {
  bool bf16 = false;
  bool fp8_upcast = false;
  bool no_graphs = false;
  bool fallback_attention = false;
  bool host_moe = false;
};

// `with_bf16`: whether the command offers --cuda-bf16 (logits does not).
inline void add_cuda_options(CLI::App& command, CudaCliOptions& options, bool with_bf16 = true) {
  if (with_bf16) {
    command.add_flag("--cuda-bf16", options.bf16,
                     "--device cuda: GEMM weights in bf16 with fp32 accumulation (default: the "
                     "fp32 parity mode)");
  }
  command.add_flag(
      "--cuda-fp8-upcast", options.fp8_upcast,
      "--device cuda with an fp8 checkpoint: dequantise the weights into a float32 host model "
      "and upload that (the exact-parity path) instead of keeping e4m3 weights native");
  command.add_flag("--no-cuda-graphs", options.no_graphs,
                   "--device cuda: launch every decode step kernel by kernel instead of "
                   "replaying it as a CUDA Graph over batch-size buckets");
  command.add_flag("--cuda-fallback-attention", options.fallback_attention,
                   "--device cuda: DSA attention on the fp32 fallback kernels even where the "
                   "fp8 fast path applies (FP8 KV cache of 64-token pages)");
  command.add_flag("--cuda-host-moe", options.host_moe,
                   "--device cuda: MoE experts dispatched from the host (expert ids read "
                   "back per layer; no CUDA Graphs) instead of the device MoE");
}

// Sets `load`'s CUDA fields (load.device already parsed).
inline void apply_cuda_options(const CudaCliOptions& options, ModelLoadOptions& load) {
  const bool cuda = load.device == Device::CUDA;
  MEGACTX_CHECK(cuda || !options.bf16, "--cuda-bf16 needs --device cuda");
  MEGACTX_CHECK(cuda || !options.no_graphs, "--no-cuda-graphs needs --device cuda");
  MEGACTX_CHECK(cuda || !options.fallback_attention,
                "--cuda-fallback-attention needs --device cuda");
  MEGACTX_CHECK(cuda || !options.host_moe, "--cuda-host-moe needs --device cuda");
  load.cuda.bf16_weights = options.bf16;
  load.cuda.fp8_native = !options.fp8_upcast;
  load.cuda.cuda_graphs = !options.no_graphs;
  load.cuda.fast_attention = !options.fallback_attention;
  load.cuda.device_moe = !options.host_moe;
}

}  // namespace megactx::cli

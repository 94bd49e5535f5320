// The CUDA model switches `generate`, `logits` and `serve` share (each an
// Error without --device cuda), and how they set ModelLoadOptions:
//   [--cuda-bf16] [--cuda-fp8-upcast] [--no-cuda-graphs]
//   [--cuda-fallback-attention] [--cuda-host-moe]
//   [--base-gpu-id N] [--gpu-id-step N] [--cuda-collectives nccl|host]
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

// The command line's starting point: the library's defaults (CudaModelOptions)
// but native fp8 weights, the serving choice (the library keeps the float32
// upcast, the exact-parity path, unless asked).
inline CudaModelOptions command_line_cuda_defaults() {
  CudaModelOptions options;
  options.fp8_native = true;
  return options;
}

// Binds the switches onto `options` (start it from command_line_cuda_defaults());
// each negative flag turns its CudaModelOptions field off.
// `with_bf16`: whether the command offers --cuda-bf16 (logits does not).
inline void add_cuda_options(CLI::App& command, CudaModelOptions& options, bool with_bf16 = true) {
  if (with_bf16) {
    command.add_flag("--cuda-bf16", options.bf16_weights,
                     "--device cuda: GEMM weights in bf16 with fp32 accumulation (default: the "
                     "fp32 parity mode)");
  }
  command.add_flag_callback(
      "--cuda-fp8-upcast", [&options] { options.fp8_native = false; },
      "--device cuda with an fp8 checkpoint: dequantise the weights into a float32 host model "
      "and upload that (the exact-parity path) instead of keeping e4m3 weights native");
  command.add_flag_callback(
      "--no-cuda-graphs", [&options] { options.cuda_graphs = false; },
      "--device cuda: launch every decode step kernel by kernel instead of replaying it as a "
      "CUDA Graph over batch-size buckets");
  command.add_flag_callback(
      "--cuda-fallback-attention", [&options] { options.fast_attention = false; },
      "--device cuda: DSA attention on the fp32 fallback kernels even where the fp8 fast path "
      "applies (FP8 KV cache of 64-token pages)");
  command.add_flag_callback(
      "--cuda-host-moe", [&options] { options.device_moe = false; },
      "--device cuda: MoE experts dispatched from the host (expert ids read back per layer; no "
      "CUDA Graphs) instead of the device MoE");
  command
      .add_option("--base-gpu-id", options.device_ordinal,
                  "--device cuda: the GPU of this process (rank 0 of a parallel group)")
      ->check(CLI::NonNegativeNumber);
  command
      .add_option("--gpu-id-step", options.gpu_id_step,
                  "--device cuda with a parallel group: rank r runs on GPU --base-gpu-id + r x "
                  "this; 0 puts every rank on one GPU (a test set-up: NCCL's ranks then meet over "
                  "loopback sockets, or use --cuda-collectives host)")
      ->check(CLI::NonNegativeNumber);
  command
      .add_option_function<std::string>(
          "--cuda-collectives",
          [&options](const std::string& kind) {
            options.collectives = kind == "host" ? CudaModelOptions::Collectives::host
                                                 : CudaModelOptions::Collectives::nccl;
          },
          "--device cuda with a parallel group: `nccl` (default; also inside CUDA Graphs) or "
          "`host`: partial sums through host memory over the CPU group (no CUDA Graphs; for "
          "tests with several ranks on one GPU)")
      ->check(CLI::IsMember({"nccl", "host"}));
}

// Sets load.cuda from the parsed switches (load.device already parsed); the
// fields the command line has no flag for (logits on the device, the
// deterministic mode's kernels) are set by whoever loads the model.
inline void apply_cuda_options(const CudaModelOptions& given, ModelLoadOptions& load) {
  if (load.device != Device::CUDA) {
    const CudaModelOptions defaults = command_line_cuda_defaults();
    MEGACTX_CHECK(given.bf16_weights == defaults.bf16_weights, "--cuda-bf16 needs --device cuda");
    MEGACTX_CHECK(given.cuda_graphs == defaults.cuda_graphs,
                  "--no-cuda-graphs needs --device cuda");
    MEGACTX_CHECK(given.fast_attention == defaults.fast_attention,
                  "--cuda-fallback-attention needs --device cuda");
    MEGACTX_CHECK(given.device_moe == defaults.device_moe, "--cuda-host-moe needs --device cuda");
    MEGACTX_CHECK(given.device_ordinal == defaults.device_ordinal,
                  "--base-gpu-id needs --device cuda");
    MEGACTX_CHECK(given.gpu_id_step == defaults.gpu_id_step, "--gpu-id-step needs --device cuda");
    MEGACTX_CHECK(given.collectives == defaults.collectives,
                  "--cuda-collectives needs --device cuda");
  }
  load.cuda = given;
}

}  // namespace megactx::cli

// The MTP speculative decoding options `serve` and `generate` share:
//   --speculative-steps K (0: off, 1..7) [--speculative-disable-batch-size N]
//   [--speculative-auto] [--speculative-no-share]
//   [--spec-verify rejection|target-only]
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "engine/engine_config.h"
#include "engine/rejection_sampler.h"

namespace megactx::cli {

struct SpeculativeCliOptions {
  int64_t steps = 0;
  int64_t disable_batch_size = 0;
  bool automatic = false;  // speculation per batch from measured speed
  bool no_share = false;  // draft steps without IndexShare/KVShare (ablation)
  std::string verify = "rejection";
};

inline void add_speculative_options(CLI::App& command, SpeculativeCliOptions& options) {
  command
      .add_option("--speculative-steps", options.steps,
                  "MTP draft tokens per verification (0: off, 1..7)")
      ->capture_default_str();
  command
      .add_option("--speculative-disable-batch-size", options.disable_batch_size,
                  "no drafts in a step that decodes at least this many requests (0: always "
                  "draft): where the target's decode is cheap per token, a verification "
                  "costs more than it saves")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command.add_flag("--speculative-auto", options.automatic,
                   "draft only at the decode batch sizes where drafting steps have measured "
                   "more tokens/s than plain ones (each way is measured, the slower one again "
                   "now and then)");
  command.add_flag("--speculative-no-share,--no-mtp-share", options.no_share,
                   "MTP draft steps without IndexShare/KVShare (ablation)");
  command
      .add_option("--spec-verify", options.verify,
                  "rejection|target-only (sampled requests; greedy ones are exact)")
      ->capture_default_str();
}

// The engine's MTP settings from the options (the checkpoint's directory is
// the model's: engine_builder.h).
inline void apply_speculative_options(const SpeculativeCliOptions& options, EngineConfig& engine) {
  engine.speculative_steps = options.steps;
  engine.speculative_share = !options.no_share;
  engine.speculative_disable_batch_size = options.disable_batch_size;
  engine.speculative_auto = options.automatic;
  engine.speculative_sampled_mode = parse_verify_mode(options.verify);
}

}  // namespace megactx::cli

// The MTP speculative decoding options `serve` and `generate` share:
//   --speculative-steps K (0: off, 1..7) [--speculative-no-share]
//   [--spec-verify rejection|target-only]
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace megactx::cli {

struct SpeculativeCliOptions {
  int64_t steps = 0;
  bool no_share = false;  // draft steps without IndexShare/KVShare (ablation)
  std::string verify = "rejection";
};

inline void add_speculative_options(CLI::App& command, SpeculativeCliOptions& options) {
  command
      .add_option("--speculative-steps", options.steps,
                  "MTP draft tokens per verification (0: off, 1..7)")
      ->capture_default_str();
  command.add_flag("--speculative-no-share,--no-mtp-share", options.no_share,
                   "MTP draft steps without IndexShare/KVShare (ablation)");
  command
      .add_option("--spec-verify", options.verify,
                  "rejection|target-only (sampled requests; greedy ones are exact)")
      ->capture_default_str();
}

}  // namespace megactx::cli

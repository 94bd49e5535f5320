// Host wall time of the Engine's step phases (schedule, MTP drafts, grammar
// masks, forward, sampling + verification, MTP refill, commit), summed over the Engine's
// life and printed to stderr when it ends, over every step and over the pure
// decode steps alone (no prefill chunk: the steady state of generation). On
// with MEGACTX_ENGINE_TIMES=1; off, a phase costs one branch. The forward
// phase includes the device work when the model synchronises before it
// returns; otherwise the wait shows in the first phase that reads its outputs.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace megactx {

class EnginePhaseTimes {
 public:
  // GrammarMasks: the structured-output masks of the rows that sample this
  // step (drafted rows make theirs in Drafts; accepting a sampled token
  // stays in Apply).
  enum Phase { Schedule, Drafts, GrammarMasks, Forward, Collect, Refill, Apply, kPhases };

  EnginePhaseTimes() {
    const char* flag = std::getenv("MEGACTX_ENGINE_TIMES");
    enabled_ = flag != nullptr && std::string(flag) == "1";
  }
  ~EnginePhaseTimes() {
    if (!enabled_ || steps_ == 0) return;
    print("every step", ms_, steps_);
    if (decode_steps_ > 0) print("pure decode steps", decode_ms_, decode_steps_);
  }
  // Times from construction to destruction into `phase`.
  class Scope {
   public:
    Scope(EnginePhaseTimes& times, Phase phase) : times_(times), phase_(phase) {
      if (times_.enabled_) start_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (!times_.enabled_) return;
      times_.step_ms_[phase_] +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
              .count();
    }

   private:
    EnginePhaseTimes& times_;
    Phase phase_;
    std::chrono::steady_clock::time_point start_;
  };

  // Ends a step: its phase times join the totals; `ran` is false for a step
  // that scheduled nothing (its scheduling time counts, the step does not),
  // `pure_decode` for one without prefill chunks.
  void end_step(bool ran, bool pure_decode) {
    if (!enabled_) return;
    for (int p = 0; p < kPhases; ++p) {
      ms_[p] += step_ms_[p];
      if (ran && pure_decode) decode_ms_[p] += step_ms_[p];
      step_ms_[p] = 0;
    }
    steps_ += ran;
    decode_steps_ += ran && pure_decode;
  }

 private:
  static void print(const char* what, const std::array<double, kPhases>& ms, int64_t steps) {
    static constexpr const char* kNames[kPhases] = {
        "schedule",   "mtp drafts",    "grammar masks", "forward", "sampling + verification",
        "mtp refill", "commit + apply"};
    double total = 0;
    for (double value : ms) total += value;
    std::fprintf(stderr, "engine phase times over %lld steps, %s (host wall, ms per step):\n",
                 static_cast<long long>(steps), what);
    for (int p = 0; p < kPhases; ++p) {
      std::fprintf(stderr, "  %-24s %8.3f  (%4.1f%%)\n", kNames[p], ms[p] / steps,
                   total > 0 ? 100.0 * ms[p] / total : 0.0);
    }
    std::fprintf(stderr, "  %-24s %8.3f\n", "step", total / steps);
  }

  bool enabled_ = false;
  int64_t steps_ = 0, decode_steps_ = 0;
  std::array<double, kPhases> step_ms_{}, ms_{}, decode_ms_{};
};

}  // namespace megactx

// Host wall time of the Engine's step phases (schedule, MTP drafts, grammar
// masks, forward, sampling + verification, MTP refill, commit), summed over the Engine's
// life and printed to stderr when it ends. On with MEGACTX_ENGINE_TIMES=1;
// off, a phase costs one branch. The forward phase includes the device work
// (the model synchronises before it returns).
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
    static constexpr const char* kNames[kPhases] = {
        "schedule", "mtp drafts", "grammar masks", "forward", "sampling + verification",
        "mtp refill", "commit + apply"};
    double total = 0;
    for (double ms : ms_) total += ms;
    std::fprintf(stderr, "engine phase times over %lld steps (host wall, ms per step):\n",
                 static_cast<long long>(steps_));
    for (int p = 0; p < kPhases; ++p) {
      std::fprintf(stderr, "  %-24s %8.3f  (%4.1f%%)\n", kNames[p], ms_[p] / steps_,
                   total > 0 ? 100.0 * ms_[p] / total : 0.0);
    }
  }

  // Times from construction to destruction into `phase`.
  class Scope {
   public:
    Scope(EnginePhaseTimes& times, Phase phase) : times_(times), phase_(phase) {
      if (times_.enabled_) start_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (!times_.enabled_) return;
      times_.ms_[phase_] +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
              .count();
    }

   private:
    EnginePhaseTimes& times_;
    Phase phase_;
    std::chrono::steady_clock::time_point start_;
  };

  void count_step() { ++steps_; }

 private:
  bool enabled_ = false;
  int64_t steps_ = 0;
  std::array<double, kPhases> ms_{};
};

}  // namespace megactx

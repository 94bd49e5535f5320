// What the GPU tests of parallel groups share: the GPU count without touching
// CUDA (a forked child cannot use a CUDA context its parent made, so the
// parent asks nvidia-smi), and one model's logits over a prefill in two
// chunks and greedy decode steps.
#pragma once

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "model/cuda/cuda_model.h"
#include "model/model_loader.h"

namespace megactx::testing {

inline int gpus_by_nvidia_smi() {
  FILE* pipe = ::popen("nvidia-smi -L 2>/dev/null", "r");
  if (pipe == nullptr) return 0;
  int count = 0;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr)
    if (std::string(line).rfind("GPU ", 0) == 0) ++count;
  ::pclose(pipe);
  return count;
}

// Prefill of the fixture's prompt in two chunks, then `steps` decode steps
// (CUDA graphs from the second, where the model captures them): every logit,
// in order. Step i feeds forced[i] where given, else the previous step's
// greedy token (two models whose logits differ by rounding can pick
// different tokens at a near tie, and then compare different sequences).
inline std::vector<float> prefill_and_decode_logits(LanguageModel& model, const HfFixture& f,
                                                    int64_t steps, KvDType kv_dtype = KvDType::F32,
                                                    std::span<const int32_t> forced = {}) {
  const int64_t prompt = static_cast<int64_t>(f.input_ids.size());
  const int64_t pages = (prompt + steps + 63) / 64 + 1;
  // The model's own cache: a LayerSplit rank holds its layers' pools only.
  auto cache = model.make_kv_cache(make_kv_cache_spec(model.config(), pages, kv_dtype));
  std::vector<int32_t> table;
  for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(p));
  std::vector<float> out;
  auto step = [&](std::span<const int32_t> tokens, int64_t start) {
    ForwardBatch batch;
    batch.sequences.push_back({tokens, start, table, 0});
    const Tensor logits = model.to_host(model.forward(batch, *cache).logits);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    return argmax(logits.data<float>() + logits.numel() - f.vocab, f.vocab);
  };
  const int64_t half = prompt / 2;
  step(std::span<const int32_t>(f.input_ids.data(), static_cast<size_t>(half)), 0);
  int32_t next =
      step(std::span<const int32_t>(f.input_ids.data() + half, static_cast<size_t>(prompt - half)),
           half);
  for (int64_t i = 0; i < steps; ++i) {
    if (i < static_cast<int64_t>(forced.size())) next = forced[static_cast<size_t>(i)];
    const std::vector<int32_t> token = {next};
    next = step(token, prompt + i);
  }
  return out;
}

// The relative error of each `vocab`-wide row of `got` against `expected`,
// on one line: where a mismatch starts (the first prefill chunk's rows, a
// later chunk's, a decode step's) tells a wrong weight (every row off) from
// a rounding that flipped a near-tied choice (rows off from some point on).
inline void print_row_errors(const char* what, const std::vector<float>& got,
                             const std::vector<float>& expected, int64_t vocab) {
  std::printf("%s, relative error per row:", what);
  for (size_t begin = 0; begin + static_cast<size_t>(vocab) <= got.size();
       begin += static_cast<size_t>(vocab)) {
    std::printf(" %.2g", relative_error(got.data() + begin, expected.data() + begin,
                                        static_cast<size_t>(vocab)));
  }
  std::printf("\n");
}

// Whether a group's reduced-precision logits (`got`: bf16 or fp8 GEMMs)
// match one process's (`plain`, the same precision). The ranks' partial
// sums reorder float32 additions, and a reordered sum can round to another
// bf16 or e4m3 value at the next GEMM's input: a near-tied choice after it
// (a sigmoid expert, an indexer key) can then move the logits by as much as
// the precision itself does (HF's own bf16 moves the random fixtures' by
// 0.34-0.44: bf16_sensitivity.json). So: within `bound` of one process, or,
// where such a flip happened, no farther from the float32 `reference` (the
// same weights' values, float32 GEMMs) than one process is (x 1.5). A rank
// with wrong weights is far from both: every row off (print_row_errors).
inline bool reduced_precision_matches(const char* what, const std::vector<float>& got,
                                      const std::vector<float>& plain,
                                      const std::vector<float>& reference, int64_t vocab,
                                      double bound) {
  if (got.size() != plain.size() || got.size() != reference.size()) {
    std::fprintf(stderr, "%s: %zu logits, one process %zu, the reference %zu\n", what, got.size(),
                 plain.size(), reference.size());
    return false;
  }
  const double to_plain = relative_error(got.data(), plain.data(), got.size());
  const double got_to_reference = relative_error(got.data(), reference.data(), got.size());
  const double plain_to_reference = relative_error(plain.data(), reference.data(), got.size());
  const bool close = to_plain <= bound;
  const bool as_accurate = got_to_reference <= 1.5 * plain_to_reference + 1e-6;
  std::printf(
      "%s: relative error %.3g against one process (bound %.0g)%s; against float32 %.3g, one "
      "process %.3g%s\n",
      what, to_plain, bound, close ? "" : ", over it", got_to_reference, plain_to_reference,
      close ? "" : (as_accurate ? " (as accurate: a rounding flip)" : " (LESS accurate)"));
  if (!close) {
    print_row_errors("  against one process", got, plain, vocab);
    print_row_errors("  one process against float32", plain, reference, vocab);
  }
  return close || as_accurate;
}

}  // namespace megactx::testing

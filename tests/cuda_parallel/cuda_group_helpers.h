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

// Prefill of the fixture's prompt in two chunks, then `steps` greedy decode
// steps (CUDA graphs from the second, where the model captures them): every
// logit, in order.
inline std::vector<float> prefill_and_decode_logits(LanguageModel& model, const HfFixture& f,
                                                    int64_t steps,
                                                    KvDType kv_dtype = KvDType::F32) {
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
    const std::vector<int32_t> token = {next};
    next = step(token, prompt + i);
  }
  return out;
}

}  // namespace megactx::testing

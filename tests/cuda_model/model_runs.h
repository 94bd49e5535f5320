// Runs of a model over one sequence, shared by the tests of this folder: the
// logits of every token (chunked prefill, pages in reverse order) and a
// greedy continuation, on a CPU or a CUDA model (device caches for the latter).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../model/hf_fixture.h"
#include "cache/kv_cache.h"
#include "model/cuda/cuda_model.h"
#include "model/language_model.h"
#include "model/model_loader.h"

namespace megactx::testing {

inline std::unique_ptr<PagedKvCache> cache_for(const LanguageModel& model, KvDType dtype,
                                               int64_t pages) {
  KvCacheSpec spec = make_kv_cache_spec(model.config(), pages, dtype);
  if (model.device() == Device::CUDA) return make_cuda_kv_cache(spec);
  return std::make_unique<PagedKvCache>(spec);
}

// Feeds `ids` in chunks of `chunk` (0: all at once) to one sequence whose
// pages are in reverse order; returns the logits of every token [n, V].
inline std::vector<float> run_sequence(LanguageModel& model, const std::vector<int32_t>& ids,
                                       KvDType dtype, int64_t chunk) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t pages = (n + 63) / 64 + 1;
  auto cache = cache_for(model, dtype, pages);
  std::vector<int32_t> table;
  for (int64_t p = pages - 1; p >= 0; --p) table.push_back(static_cast<int32_t>(p));
  const int64_t step = chunk > 0 ? chunk : n;
  std::vector<float> out;
  for (int64_t start = 0; start < n; start += step) {
    const int64_t count = std::min(step, n - start);
    SequenceInput in;
    in.tokens = std::span<const int32_t>(ids.data() + start, static_cast<size_t>(count));
    in.start_position = start;
    in.page_table = table;
    in.logits_from = 0;
    ForwardBatch batch;
    batch.sequences.push_back(in);
    const Tensor logits = to_host(model.forward(batch, *cache).logits);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

inline std::vector<int32_t> prompt_and_greedy(const HfFixture& f) {
  std::vector<int32_t> ids = f.input_ids;
  ids.insert(ids.end(), f.greedy_ids.begin(), f.greedy_ids.end());
  return ids;
}

// Greedy continuation of `prompt` (prefill, then one token per forward).
inline std::vector<int32_t> greedy_ids(LanguageModel& model, const std::vector<int32_t>& prompt,
                                       int64_t count, int64_t vocab, KvDType dtype = KvDType::F32) {
  const int64_t total = static_cast<int64_t>(prompt.size()) + count;
  const int64_t pages = (total + 63) / 64 + 1;
  auto cache = cache_for(model, dtype, pages);
  std::vector<int32_t> table;
  for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(p));
  std::vector<int32_t> generated, next = prompt;
  int64_t start = 0;
  while (static_cast<int64_t>(generated.size()) < count) {
    ForwardBatch batch;
    batch.sequences.push_back({next, start, table, -1});
    const Tensor logits = to_host(model.forward(batch, *cache).logits);
    start += static_cast<int64_t>(next.size());
    generated.push_back(argmax(logits.data<float>(), vocab));
    next = {generated.back()};
  }
  return generated;
}

}  // namespace megactx::testing

// SequenceRunner: one sequence through a LanguageModel with its own host KV
// cache (pages 0..n-1), for the CLI, tests and benchmarks. The serving engine
// manages pages itself and calls LanguageModel::forward directly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "model/language_model.h"

namespace megactx {

class SequenceRunner {
 public:
  // Room for `max_tokens` positions; `page_order` (optional) permutes the
  // physical pages so tests exercise the page table.
  SequenceRunner(LanguageModel& model, KvDType dtype, int64_t max_tokens,
                 std::vector<int32_t> page_order = {});

  // Appends `tokens` (in chunks of at most `chunk` tokens; 0 = one forward)
  // and returns float32 logits [rows, vocab]: every new token when
  // `all_logits`, else the last one only.
  Tensor feed(std::span<const int32_t> tokens, bool all_logits, int64_t chunk = 0);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  PagedKvCache& cache() { return *cache_; }

 private:
  LanguageModel& model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<int32_t> pages_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
};

// "1,2,3" -> {1, 2, 3}; anything else (empty, non-numbers, out of int32) is an Error.
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace megactx

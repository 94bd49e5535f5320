#include "model/batch_checks.h"

#include "core/error.h"

namespace megactx {

void check_sequence_inputs(const ForwardBatch& batch, const KvCacheSpec& spec, int64_t vocab_size) {
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceInput& in = batch.sequences[s];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    MEGACTX_CHECK(n > 0, "sequence {}: no new tokens", s);
    MEGACTX_CHECK(in.start_position >= 0, "sequence {}: negative start_position", s);
    const int64_t pages_needed = (in.start_position + n + spec.page_size - 1) / spec.page_size;
    MEGACTX_CHECK(static_cast<int64_t>(in.page_table.size()) >= pages_needed,
                  "sequence {}: {} pages given, positions [0, {}) need {}", s, in.page_table.size(),
                  in.start_position + n, pages_needed);
    for (int64_t p = 0; p < pages_needed; ++p) {
      MEGACTX_CHECK(in.page_table[p] >= 0 && in.page_table[p] < spec.total_pages(),
                    "sequence {}: page {} outside the cache's {} pages", s, in.page_table[p],
                    spec.total_pages());
    }
    // New entries are written to device pages: offload pages (the live host
    // tier, kv_cache.h) hold only full pages, written before they moved.
    for (int64_t p = in.start_position / spec.page_size; p < pages_needed; ++p) {
      MEGACTX_CHECK(in.page_table[p] < spec.num_pages,
                    "sequence {}: new tokens on offload page {} (offload pages are read only)", s,
                    in.page_table[p]);
    }
    MEGACTX_CHECK(in.logits_from >= -1 && in.logits_from < n,
                  "sequence {}: logits_from {} outside [-1, {})", s, in.logits_from, n);
    for (int32_t token : in.tokens) {
      MEGACTX_CHECK(token >= 0 && token < vocab_size, "sequence {}: token id {} outside [0, {})", s,
                    token, vocab_size);
    }
  }
}

}  // namespace megactx

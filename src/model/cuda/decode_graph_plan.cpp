#include "model/cuda/decode_graph_plan.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megactx {

std::vector<int64_t> decode_batch_buckets(int64_t max_batch) {
  MEGACTX_CHECK(max_batch >= 1, "CUDA graph batch buckets: max batch {} < 1", max_batch);
  std::vector<int64_t> buckets;
  int64_t bucket = 1;
  bool three_halves = true;
  while (bucket < max_batch) {
    buckets.push_back(bucket);
    if (bucket < 8) {
      bucket *= 2;
    } else if (bucket < 32) {
      bucket += 8;
    } else {
      // 32 -> 48 -> 64 -> 96 -> 128 -> 192 -> 256 ...
      bucket = three_halves ? bucket * 3 / 2 : bucket * 4 / 3;
      three_halves = !three_halves;
    }
  }
  buckets.push_back(max_batch);
  return buckets;
}

int64_t batch_bucket(const std::vector<int64_t>& buckets, int64_t sequences) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), sequences);
  return it == buckets.end() ? 0 : *it;
}

int64_t context_bucket(int64_t max_context) {
  int64_t bucket = 256;
  while (bucket < max_context) bucket *= 2;
  return bucket;
}

DecodeInputLayout::DecodeInputLayout(const DecodeGraphKey& key, int64_t rope_half,
                                     int64_t page_size)
    : rows(key.rows()), half(rope_half), max_pages((key.context + page_size - 1) / page_size) {
  ids = 0;
  positions = ids + rows;
  table_offset = positions + rows;
  logit_rows = table_offset + rows;
  cos = logit_rows + rows;
  sin = cos + rows * half;
  page_tables = sin + rows * half;
  capacity_words = page_tables + key.sequences * max_pages;
}

PackedDecodeInputs pack_decode_inputs(const ForwardBatch& batch, const DecodeGraphKey& key,
                                      const DecodeInputLayout& layout, int64_t page_size,
                                      int32_t* words, int64_t* rope_positions) {
  const int64_t per_sequence = key.tokens_per_sequence;
  const int64_t real_sequences = static_cast<int64_t>(batch.sequences.size());
  MEGACTX_CHECK(real_sequences <= key.sequences && layout.rows == key.rows(),
                "decode graph: {} sequences do not fit a bucket of {}", real_sequences,
                key.sequences);
  PackedDecodeInputs packed;
  int64_t pages_used = 0;
  for (int64_t s = 0; s < real_sequences; ++s) {
    const SequenceInput& in = batch.sequences[static_cast<size_t>(s)];
    const int64_t pages = (in.start_position + per_sequence + page_size - 1) / page_size;
    MEGACTX_CHECK(static_cast<int64_t>(in.tokens.size()) == per_sequence &&
                      in.start_position + per_sequence <= key.context &&
                      pages <= layout.max_pages &&
                      static_cast<int64_t>(in.page_table.size()) >= pages,
                  "decode graph: sequence {} ({} tokens at {}) does not fit the key ({} per "
                  "sequence, context {})",
                  s, in.tokens.size(), in.start_position, per_sequence, key.context);
    std::memcpy(words + layout.page_tables + pages_used, in.page_table.data(),
                static_cast<size_t>(pages) * sizeof(int32_t));
    for (int64_t i = 0; i < per_sequence; ++i) {
      const int64_t row = s * per_sequence + i;
      words[layout.ids + row] = in.tokens[static_cast<size_t>(i)];
      words[layout.positions + row] = static_cast<int32_t>(in.start_position + i);
      words[layout.table_offset + row] = static_cast<int32_t>(pages_used);
      rope_positions[row] = in.start_position + i;
    }
    const int64_t from = in.logits_from < 0 ? per_sequence - 1 : in.logits_from;
    for (int64_t i = from; i < per_sequence; ++i) {
      words[layout.logit_rows + packed.logit_count++] = static_cast<int32_t>(s * per_sequence + i);
    }
    pages_used += pages;
  }
  packed.real_rows = real_sequences * per_sequence;
  for (int64_t row = packed.real_rows; row < layout.rows; ++row) {
    words[layout.ids + row] = 0;
    words[layout.positions + row] = -1;
    words[layout.table_offset + row] = 0;
    rope_positions[row] = 0;
  }
  // The graph's lm_head runs over every row gathered; padding repeats row 0.
  for (int64_t i = packed.logit_count; i < layout.rows; ++i) words[layout.logit_rows + i] = 0;
  packed.upload_words = layout.page_tables + pages_used;
  return packed;
}

}  // namespace megactx

// The host side of CUDA-graph decode (model/cuda/decode_graph.h), plain C++
// so it is tested on any machine: the batch-size and context buckets a step
// is padded to, the key a captured graph is specific to, and the packed
// per-step inputs the graph reads from one fixed device block.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "model/language_model.h"

namespace megactx {

// Batch buckets up to `max_batch` (itself always the last one): 1, 2, 4, 8,
// then steps of 8 to 32, then alternately x1.5 and x4/3 (48, 64, 96, 128, ...).
// An Error for max_batch < 1.
std::vector<int64_t> decode_batch_buckets(int64_t max_batch);
// The smallest bucket >= `sequences`; 0 when it is larger than every bucket.
int64_t batch_bucket(const std::vector<int64_t>& buckets, int64_t sequences);
// The context bucket: the power of two >= max(max_context, 256) (the fallback
// indexer's grid has one block row per 256 positions).
int64_t context_bucket(int64_t max_context);

// Tokens per sequence a graph step may have: 1 + k for an MTP verification of
// up to 7 drafts; more per sequence is prefill, run eagerly.
constexpr int64_t kMaxGraphTokensPerSequence = 8;

// What a captured graph is specific to: its kernel grids, scratch sizes and
// baked-in pointers.
struct DecodeGraphKey {
  int64_t sequences = 0;            // padded batch (a bucket)
  int64_t tokens_per_sequence = 1;  // 1: decode; 1 + k: MTP verification
  int64_t context = 0;              // context bucket
  int kv_dtype = 0;                 // KV entry layouts of the pools
  uint64_t cache = 0;               // the pools' addresses and page size (baked in)
  // MTP layer runs (their own DecodeGraphCache): step 0 or a shared draft
  // step, and the greedy drafts chained after a step 0.
  bool mtp_shared = false;
  int64_t mtp_drafts = 0;
  // The step records the routed experts (ForwardBatch::want_routed_experts).
  bool routed_experts = false;
  auto operator<=>(const DecodeGraphKey&) const = default;
  int64_t rows() const { return sequences * tokens_per_sequence; }
};

// The packed per-step inputs, 4-byte words, in this order:
//   ids [rows] int32, positions [rows] int32, table_offset [rows] int32,
//   logit_rows [rows] int32, cos [rows, half] f32, sin [rows, half] f32,
//   page_tables [<= sequences * max_pages] int32 (each sequence's table once).
struct DecodeInputLayout {
  DecodeInputLayout(const DecodeGraphKey& key, int64_t rope_half, int64_t page_size);
  int64_t rows = 0, half = 0, max_pages = 0;
  int64_t ids = 0, positions = 0, table_offset = 0, logit_rows = 0, cos = 0, sin = 0,
          page_tables = 0;
  int64_t capacity_words = 0;  // page_tables + sequences * max_pages
};

struct PackedDecodeInputs {
  int64_t real_rows = 0;     // rows of real tokens (the first ones)
  int64_t logit_count = 0;   // logit rows listed first in logit_rows
  int64_t upload_words = 0;  // words [0, upload_words) hold the step (the rest is unused)
};

// Writes `batch` (every sequence key.tokens_per_sequence new tokens, at most
// key.sequences sequences, contexts within key.context) into `words`
// [layout.capacity_words] except cos/sin, and each row's position into
// `rope_positions` [rows] (0 for padding rows, whose cos/sin must still be
// finite). Rows are sequence-major; padding sequences come last with token 0,
// position -1 and table offset 0. Logit rows list the real rows that want
// logits (SequenceInput::logits_from) in batch order, then row 0 repeated.
// An Error when the batch does not fit the key.
PackedDecodeInputs pack_decode_inputs(const ForwardBatch& batch, const DecodeGraphKey& key,
                                      const DecodeInputLayout& layout, int64_t page_size,
                                      int32_t* words, int64_t* rope_positions);

}  // namespace megactx

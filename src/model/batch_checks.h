// Validation of a ForwardBatch against a KV cache, shared by every
// LanguageModel implementation (CPU DsaModel, CudaDsaModel) so that bad input
// gives the same error whatever the backend.
#pragma once

#include <cstdint>

#include "cache/kv_cache.h"
#include "model/language_model.h"

namespace megactx {

// Each sequence: new tokens present and inside [0, vocab_size), a
// non-negative start, a page table covering its positions with pages inside the
// cache, logits_from within [-1, n). Throws megactx::Error naming the sequence.
void check_sequence_inputs(const ForwardBatch& batch, const KvCacheSpec& spec, int64_t vocab_size);

}  // namespace megactx

#include "model/sequence_runner.h"

#include <charconv>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "model/model_loader.h"
#if MEGACTX_HAVE_CUDA
#include "model/cuda/cuda_model.h"
#endif

namespace megactx {

SequenceRunner::SequenceRunner(LanguageModel& model, KvDType dtype, int64_t max_tokens,
                               std::vector<int32_t> page_order)
    : model_(model) {
  MEGACTX_CHECK(max_tokens > 0, "SequenceRunner: max_tokens must be positive");
  KvCacheSpec spec = make_kv_cache_spec(model.config(), 0, dtype);
  const int64_t num_pages = (max_tokens + spec.page_size - 1) / spec.page_size;
  spec.num_pages = num_pages;
  capacity_ = num_pages * spec.page_size;
  if (page_order.empty()) {
    pages_.resize(static_cast<size_t>(num_pages));
    std::iota(pages_.begin(), pages_.end(), 0);
  } else {
    MEGACTX_CHECK(static_cast<int64_t>(page_order.size()) == num_pages,
                  "SequenceRunner: {} pages in page_order, {} needed", page_order.size(),
                  num_pages);
    pages_ = std::move(page_order);
  }
#if MEGACTX_HAVE_CUDA
  // The CUDA model reads and writes device pools.
  cache_ = model.device() == Device::CUDA ? make_cuda_kv_cache(spec) : model.make_kv_cache(spec);
#else
  cache_ = model.make_kv_cache(spec);  // a rank under LayerSplit: its layers' pools only
#endif
}

Tensor SequenceRunner::feed(std::span<const int32_t> tokens, bool all_logits, int64_t chunk) {
  MEGACTX_CHECK(!tokens.empty(), "no tokens to feed");
  MEGACTX_CHECK(length_ + static_cast<int64_t>(tokens.size()) <= capacity_,
                "sequence of {} tokens exceeds the cache's {} positions",
                length_ + static_cast<int64_t>(tokens.size()), capacity_);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t step = chunk > 0 ? chunk : total;
  const int64_t vocab = model_.config().vocab_size;
  Tensor result = Tensor::empty({all_logits ? total : 1, vocab});
  for (int64_t begin = 0; begin < total; begin += step) {
    const int64_t count = std::min(step, total - begin);
    const bool last_chunk = begin + count == total;
    SequenceInput input;
    input.tokens = tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
    input.start_position = length_;
    input.page_table = pages_;
    input.logits_from = all_logits ? 0 : -1;
    ForwardBatch batch;
    batch.sequences.push_back(input);
    const ForwardOutput output = model_.forward(batch, *cache_);
    length_ += count;
    if (all_logits) {
      std::memcpy(result.data<float>() + begin * vocab, output.logits.data<float>(),
                  output.logits.nbytes());
    } else if (last_chunk) {
      std::memcpy(result.data<float>(), output.logits.data<float>(), output.logits.nbytes());
    }
  }
  return result;
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t position = 0;
  while (position <= text.size()) {
    const size_t comma = std::min(text.find(',', position), text.size());
    std::string item = text.substr(position, comma - position);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    MEGACTX_CHECK(!item.empty() && error == std::errc() && end == item.data() + item.size(),
                  "bad token id '{}' in '{}' (expected comma-separated integers)", item, text);
    MEGACTX_CHECK(value >= 0, "negative token id {} in '{}'", value, text);
    ids.push_back(value);
    position = comma + 1;
  }
  return ids;
}

}  // namespace megactx

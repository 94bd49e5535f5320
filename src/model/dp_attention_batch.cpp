#include "model/dp_attention_batch.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace megactx {
namespace {

int64_t logits_rows(const SequenceInput& in) {
  return in.logits_rows();
}

int64_t token_rows(const SequenceInput& in) {
  return static_cast<int64_t>(in.tokens.size());
}

// One output of the step gathered on rank 0 (gather_sequence_rows) with the
// rows of each of `whole`'s sequences given by `rows_of`.
template <class RowsOf>
Tensor gather_rows(const ForwardBatch& whole, const std::vector<int>& ranks, const Tensor& own,
                   Shape row_shape, DType dtype, RowsOf rows_of, parallel::Communicator& group) {
  std::vector<int64_t> rows;
  rows.reserve(whole.sequences.size());
  for (const SequenceInput& in : whole.sequences) rows.push_back(rows_of(in));
  return gather_sequence_rows(rows, ranks, own, std::move(row_shape), dtype, group);
}

}  // namespace

Tensor gather_sequence_rows(std::span<const int64_t> sequence_rows, const std::vector<int>& ranks,
                            const Tensor& own, Shape row_shape, DType dtype,
                            parallel::Communicator& group) {
  const int size = group.size();
  MEGACTX_CHECK(sequence_rows.size() == ranks.size(),
                "data-parallel attention: {} row counts for {} sequences", sequence_rows.size(),
                ranks.size());
  int64_t row_elements = 1;
  for (const int64_t dim : row_shape) row_elements *= dim;
  const int64_t row_bytes = row_elements * static_cast<int64_t>(dtype_size(dtype));
  std::vector<int64_t> rows(static_cast<size_t>(size), 0);
  int64_t total = 0;
  for (size_t s = 0; s < sequence_rows.size(); ++s) {
    rows[static_cast<size_t>(ranks[s])] += sequence_rows[s];
    total += sequence_rows[s];
  }
  const int me = group.rank();
  MEGACTX_CHECK(own.numel() == rows[static_cast<size_t>(me)] * row_elements,
                "data-parallel attention: rank {} computed {} elements for {} rows", me,
                own.numel(), rows[static_cast<size_t>(me)]);
  std::vector<int64_t> send(static_cast<size_t>(size), 0), receive(send.size(), 0);
  send[0] = rows[static_cast<size_t>(me)] * row_bytes;
  if (me == 0)
    for (int q = 0; q < size; ++q) receive[static_cast<size_t>(q)] = rows[q] * row_bytes;
  std::vector<uint8_t> in(static_cast<size_t>(me == 0 ? total * row_bytes : 0));
  group.all_to_all(own.numel() > 0 ? own.raw() : nullptr, send, in.data(), receive);
  if (me != 0) return {};
  // Rank q's rows start at the sum of the earlier ranks' rows.
  std::vector<int64_t> next(static_cast<size_t>(size), 0);
  for (int q = 1; q < size; ++q) next[q] = next[q - 1] + rows[q - 1];
  Shape shape = {total};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  Tensor out = Tensor::empty(shape, dtype);
  auto* target = static_cast<uint8_t*>(out.raw());
  int64_t at = 0;
  for (size_t s = 0; s < sequence_rows.size(); ++s) {
    const int64_t n = sequence_rows[s];
    int64_t& from = next[static_cast<size_t>(ranks[s])];
    if (n > 0)
      std::memcpy(target + at * row_bytes, in.data() + from * row_bytes,
                  static_cast<size_t>(n * row_bytes));
    from += n;
    at += n;
  }
  return out;
}

int page_table_rank(std::span<const int32_t> pages, const RankPages& layout, size_t sequence) {
  MEGACTX_CHECK(layout.device_per_rank > 0, "data-parallel attention: no KV pages per rank");
  MEGACTX_CHECK(!pages.empty(), "data-parallel attention: sequence {} has no pages", sequence);
  MEGACTX_CHECK(layout.contains(pages[0]),
                "data-parallel attention: sequence {} has page {} outside the {} pages of {} "
                "ranks",
                sequence, pages[0], layout.total(), layout.ranks);
  const int rank = layout.rank_of(pages[0]);
  for (const int32_t page : pages)
    MEGACTX_CHECK(layout.contains(page) && layout.rank_of(page) == rank,
                  "data-parallel attention: sequence {} has pages {} and {} of different "
                  "ranks ({} device and {} offload pages each, {} ranks)",
                  sequence, pages[0], page, layout.device_per_rank, layout.offload_per_rank,
                  layout.ranks);
  return rank;
}

std::vector<int> sequence_ranks(const ForwardBatch& batch, const RankPages& layout) {
  std::vector<int> out;
  out.reserve(batch.sequences.size());
  for (size_t s = 0; s < batch.sequences.size(); ++s)
    out.push_back(page_table_rank(batch.sequences[s].page_table, layout, s));
  return out;
}

ForwardBatch::DataParallelStep data_parallel_step(const ForwardBatch& whole,
                                                  const std::vector<int>& ranks) {
  MEGACTX_CHECK(ranks.size() == whole.sequences.size(),
                "data-parallel attention: {} ranks for {} sequences", ranks.size(),
                whole.sequences.size());
  ForwardBatch::DataParallelStep step;
  std::vector<int64_t> sequences, rows;
  for (size_t s = 0; s < ranks.size(); ++s) {
    const auto share = static_cast<size_t>(std::max(ranks[s], 0));
    if (share >= sequences.size()) {
      sequences.resize(share + 1, 0);
      rows.resize(share + 1, 0);
    }
    const auto tokens = static_cast<int64_t>(whole.sequences[s].tokens.size());
    step.max_sequences = std::max(step.max_sequences, ++sequences[share]);
    step.max_rows = std::max(step.max_rows, rows[share] += tokens);
    if (s == 0) step.tokens_per_sequence = tokens;
    if (tokens != step.tokens_per_sequence) step.tokens_per_sequence = 0;
  }
  return step;
}

void rank_share(const ForwardBatch& whole, const std::vector<int>& ranks, int rank,
                const RankPages& layout, RankBatch& out) {
  out.batch = ForwardBatch{};
  out.batch.want_hidden_states = whole.want_hidden_states;
  out.batch.want_routed_experts = whole.want_routed_experts;
  out.batch.dp_step = data_parallel_step(whole, ranks);
  out.pages.clear();
  for (size_t s = 0; s < whole.sequences.size(); ++s)
    if (ranks[s] == rank) out.pages.emplace_back();  // sized first: the spans point into it
  size_t next = 0;
  for (size_t s = 0; s < whole.sequences.size(); ++s) {
    if (ranks[s] != rank) continue;
    const SequenceInput& in = whole.sequences[s];
    std::vector<int32_t>& pages = out.pages[next++];
    for (const int32_t page : in.page_table) pages.push_back(layout.local(page));
    SequenceInput local = in;
    local.page_table = pages;
    out.batch.sequences.push_back(local);
  }
}

RankPagePairs rank_page_pairs(std::span<const int32_t> from_pages,
                              std::span<const int32_t> to_pages, const RankPages& from_layout,
                              const RankPages& to_layout, int rank) {
  MEGACTX_CHECK(from_pages.size() == to_pages.size() && from_layout.device_per_rank > 0 &&
                    to_layout.device_per_rank > 0 && from_layout.ranks == to_layout.ranks,
                "data-parallel attention: a copy of {} pages to {}", from_pages.size(),
                to_pages.size());
  RankPagePairs out;
  for (size_t i = 0; i < from_pages.size(); ++i) {
    const bool known = from_layout.contains(from_pages[i]) && to_layout.contains(to_pages[i]);
    const int owner = known ? from_layout.rank_of(from_pages[i]) : -1;
    MEGACTX_CHECK(known && to_layout.rank_of(to_pages[i]) == owner,
                  "data-parallel attention: a copy of page {} to page {} crosses ranks ({} + {} "
                  "and {} + {} pages per rank, {} ranks)",
                  from_pages[i], to_pages[i], from_layout.device_per_rank,
                  from_layout.offload_per_rank, to_layout.device_per_rank,
                  to_layout.offload_per_rank, from_layout.ranks);
    if (owner != rank) continue;
    out.from.push_back(from_layout.local(from_pages[i]));
    out.to.push_back(to_layout.local(to_pages[i]));
  }
  return out;
}

ForwardOutput gather_to_leader(const ForwardBatch& whole, const std::vector<int>& ranks,
                               const ForwardOutput& own, const ModelConfig& config,
                               parallel::Communicator& group) {
  ForwardOutput out;
  if (!whole.logits_at_ranks)
    out.logits =
        gather_rows(whole, ranks, own.logits, {config.vocab_size}, DType::F32, logits_rows, group);
  if (whole.want_hidden_states)
    out.hidden_states = gather_rows(whole, ranks, own.hidden_states, {config.hidden_size},
                                    DType::F32, token_rows, group);
  if (whole.want_routed_experts)
    out.routed_experts = gather_rows(whole, ranks, own.routed_experts,
                                     {config.num_hidden_layers, config.num_experts_per_tok},
                                     DType::I32, token_rows, group);
  return out;
}

}  // namespace megactx

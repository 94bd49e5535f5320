// DsaModel's two MoE dispatches of data-parallel attention and context
// parallelism with the experts split (ModelPlan::expert_all_to_all;
// model/expert_dispatch.h): the all-to-all of the routed pairs and the
// gathered dispatch, as the CUDA model's dsa_expert_all_to_all.cpp and
// dsa_expert_gathered.cpp.
#include <algorithm>
#include <cstring>
#include <vector>

#include "model/dsa_model.h"
#include "model/expert_dispatch.h"

namespace megactx {

void DsaModel::routed_experts_all_to_all(const MoeWeights& w, const float* h, int64_t rows,
                                         const std::vector<int32_t>& ids,
                                         const std::vector<float>& gates, float* out) {
  const int64_t hidden = config_.hidden_size, top_k = config_.num_experts_per_tok;
  const int64_t per_rank = plan_.local_experts;
  const int size = group_->size();
  // This rank's pairs (row * top_k + j) by the rank that owns their expert.
  const ExpertSends sends =
      plan_expert_sends(std::span<const int32_t>(ids.data(), static_cast<size_t>(rows * top_k)),
                        top_k, config_.n_routed_experts, size);
  // Pair counts both ways (one int64 to and from every rank).
  std::vector<int64_t> recv_pairs(static_cast<size_t>(size));
  const std::vector<int64_t> one_count(static_cast<size_t>(size), sizeof(int64_t));
  group_->all_to_all(sends.pairs.data(), one_count, recv_pairs.data(), one_count);
  int64_t received = 0;
  for (const int64_t c : recv_pairs) received += c;
  const auto sent = static_cast<int64_t>(sends.rows.size());
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(float));
  const std::vector<int64_t> send_rows = byte_counts(sends.pairs, row_bytes);
  const std::vector<int64_t> recv_rows = byte_counts(recv_pairs, row_bytes);
  // Dispatch: each pair's hidden row and its expert's index on the owner.
  std::vector<float> rows_out(static_cast<size_t>(sent * hidden)),
      rows_in(static_cast<size_t>(received * hidden));
  std::vector<int32_t> experts_in(static_cast<size_t>(received));
  for (int64_t at = 0; at < sent; ++at)
    std::memcpy(rows_out.data() + at * hidden, h + sends.rows[at] * hidden,
                static_cast<size_t>(hidden) * sizeof(float));
  group_->all_to_all(rows_out.data(), send_rows, rows_in.data(), recv_rows);
  group_->all_to_all(sends.experts.data(), byte_counts(sends.pairs, sizeof(int32_t)),
                     experts_in.data(), byte_counts(recv_pairs, sizeof(int32_t)));
  // This rank's experts over the rows sent to it, one GEMM chain per expert.
  const ExpertGroups groups = group_by_expert(experts_in, per_rank);
  std::vector<float> results(rows_in.size()), input, result;
  for (int64_t e = 0; e < per_rank; ++e) {
    const int64_t first = groups.starts[e], m = groups.starts[e + 1] - first;
    if (m == 0) continue;
    input.resize(static_cast<size_t>(m * hidden));
    result.resize(input.size());
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(input.data() + i * hidden, rows_in.data() + groups.order[first + i] * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
    mlp(w.experts[e], input.data(), m, result.data());
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(results.data() + groups.order[first + i] * hidden, result.data() + i * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
  }
  // Combine: the results go back the way their rows came, in the same order.
  group_->all_to_all(results.data(), recv_rows, rows_out.data(), send_rows);
  for (int64_t at = 0; at < sent; ++at) {
    const int32_t pair = sends.pair_of[at];
    float* target = out + (pair / top_k) * hidden;
    const float* source = rows_out.data() + at * hidden;
    for (int64_t d = 0; d < hidden; ++d) target[d] += gates[pair] * source[d];
  }
}

void DsaModel::routed_experts_gathered(const MoeWeights& w, const float* h, int64_t rows,
                                       const std::vector<int32_t>& ids,
                                       const std::vector<float>& gates, float* out) {
  const int64_t hidden = config_.hidden_size, top_k = config_.num_experts_per_tok;
  const int64_t padded = gathered_rows_;
  const int size = group_->size();
  MEGACTX_CHECK(rows <= padded, "gathered MoE dispatch: {} rows past the step's {}", rows, padded);
  // 1. This rank's rows and routing padded to `padded` rows (padding: zero
  // rows, expert -1), gathered from every rank: x [size * padded, H] and
  // routing [size * padded, top_k].
  std::vector<float> mine(static_cast<size_t>(padded * hidden), 0.0f);
  std::copy_n(h, rows * hidden, mine.begin());
  std::vector<int32_t> my_ids(static_cast<size_t>(padded * top_k), -1);
  std::vector<float> my_gates(my_ids.size(), 0.0f);
  std::copy_n(ids.begin(), rows * top_k, my_ids.begin());
  std::copy_n(gates.begin(), rows * top_k, my_gates.begin());
  const int64_t all_rows = size * padded;
  std::vector<float> x(static_cast<size_t>(all_rows * hidden));
  std::vector<int32_t> all_ids(static_cast<size_t>(all_rows * top_k));
  std::vector<float> all_gates(all_ids.size());
  const auto word = static_cast<int64_t>(sizeof(float));
  group_->all_gather(mine.data(), x.data(), padded * hidden * word);
  group_->all_gather(my_ids.data(), all_ids.data(), padded * top_k * word);
  group_->all_gather(my_gates.data(), all_gates.data(), padded * top_k * word);
  // 2. This rank's experts over every gathered row: partial [size * padded,
  // H], each row's local slots gate-weighted in slot order.
  const int64_t first = plan_.first_expert, local = plan_.local_experts;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> assigned(static_cast<size_t>(local));
  for (int64_t r = 0; r < all_rows; ++r) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = all_ids[r * top_k + j] - first;
      if (e >= 0 && e < local) assigned[e].push_back({r, j});
    }
  }
  std::vector<float> results(static_cast<size_t>(all_rows * top_k * hidden), 0.0f);
  std::vector<float> input, result;
  for (int64_t e = 0; e < local; ++e) {
    const auto& list = assigned[e];
    if (list.empty()) continue;
    const auto m = static_cast<int64_t>(list.size());
    input.resize(static_cast<size_t>(m * hidden));
    result.resize(input.size());
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(x.data() + list[i].first * hidden, hidden, input.data() + i * hidden);
    mlp(w.experts[e], input.data(), m, result.data());
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(result.data() + i * hidden, hidden,
                  results.data() + (list[i].first * top_k + list[i].second) * hidden);
  }
  std::vector<float> partial(static_cast<size_t>(all_rows * hidden), 0.0f);
  for (int64_t r = 0; r < all_rows; ++r) {
    float* target = partial.data() + r * hidden;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = all_ids[r * top_k + j] - first;
      if (e < 0 || e >= local) continue;
      const float gate = all_gates[r * top_k + j];
      const float* source = results.data() + (r * top_k + j) * hidden;
      for (int64_t d = 0; d < hidden; ++d) target[d] += gate * source[d];
    }
  }
  // 3. Rank q's rows' partials to rank q, from every rank, summed in rank order.
  const std::vector<int64_t> chunk(static_cast<size_t>(size), padded * hidden * word);
  std::vector<float> received(partial.size());
  group_->all_to_all(partial.data(), chunk, received.data(), chunk);
  for (int q = 0; q < size; ++q) {
    const float* source = received.data() + q * padded * hidden;
    for (int64_t i = 0; i < rows * hidden; ++i) out[i] += source[i];
  }
}

}  // namespace megactx

// IndexShare end to end at the kernel level: a decode step over a layer
// schedule where shared layers skip the indexer, own no indexer cache, and
// attend over the slots of the most recent full layer.
#include "bench/cuda/support/attention_stack.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/topk/topk.h"

namespace megactx::test {
namespace {

constexpr int kQueryDim = reference::kLatentRankDim + reference::kLatentRopeDim;
constexpr int kRank = reference::kLatentRankDim;

TEST(AttentionStack, GlmScheduleHasTwentyOneFullLayers) {
  const auto full = cuda::index_share_schedule(78, 4, 3);
  std::vector<int> layers;
  for (int i = 0; i < 78; ++i)
    if (full[i]) layers.push_back(i);
  ASSERT_EQ(layers.size(), 21u);
  EXPECT_EQ(std::vector<int>(layers.begin(), layers.begin() + 5),
            (std::vector<int>{0, 1, 2, 6, 10}));
  EXPECT_EQ(layers.back(), 74);
  const auto every = cuda::index_share_schedule(61, 1, 0);
  EXPECT_EQ(std::count(every.begin(), every.end(), true), 61);
}

TEST(AttentionStack, SharedLayersReuseTheFullLayersSlots) {
  std::mt19937 rng(81);
  const int layers = 8, tokens = 2, heads = 64, index_heads = 32, top_k = 256;
  const std::vector<int64_t> lengths = {3000, 2100};
  const auto full = cuda::index_share_schedule(layers, 4, 3);  // full: 0 1 2 6
  const PagedLayout layout = make_paged_layout(lengths, rng);
  const int64_t num_slots = layout.num_pages * 64;
  std::vector<int32_t> row_request, row_visible;
  for (size_t r = 0; r < lengths.size(); ++r)
    for (int t = 0; t < tokens; ++t) {
      row_request.push_back(static_cast<int32_t>(r));
      row_visible.push_back(static_cast<int32_t>(lengths[r] - tokens + 1 + t));
    }
  const int rows = static_cast<int>(row_request.size());
  const int max_visible = 3000;

  struct HostLayer {
    std::vector<uint8_t> indexer_pool, indexer_q8, latent_pool;
    std::vector<float> indexer_q, indexer_weights, q_values;
    std::vector<uint16_t> q;
  };
  std::vector<HostLayer> host(layers);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int l = 0; l < layers; ++l) {
    HostLayer& h = host[l];
    if (full[l]) {
      h.indexer_pool = random_indexer_pool(layout.num_pages, rng);
      random_fp8_queries(static_cast<size_t>(rows) * index_heads * 128, rng, h.indexer_q8,
                         h.indexer_q);
      h.indexer_weights.resize(static_cast<size_t>(rows) * index_heads);
      for (float& w : h.indexer_weights) w = normal(rng) * 1e-3f;
    }
    h.latent_pool = random_latent_pool(num_slots, rng);
    h.q.resize(static_cast<size_t>(rows) * heads * kQueryDim);
    h.q_values.resize(h.q.size());
    for (size_t i = 0; i < h.q.size(); ++i) {
      h.q[i] = float_to_bf16(normal(rng));
      h.q_values[i] = bf16_to_float(h.q[i]);
    }
  }

  struct DeviceLayer {
    DeviceBuffer<uint8_t> indexer_pool, indexer_q8, latent_pool;
    DeviceBuffer<float> indexer_weights, lse;
    DeviceBuffer<uint16_t> q, out;
  };
  std::vector<DeviceLayer> device(layers);
  std::vector<cuda::AttentionLayerBuffers> buffers(layers);
  for (int l = 0; l < layers; ++l) {
    if (full[l]) {  // shared layers get no indexer cache at all
      device[l].indexer_pool = DeviceBuffer<uint8_t>(host[l].indexer_pool);
      device[l].indexer_q8 = DeviceBuffer<uint8_t>(host[l].indexer_q8);
      device[l].indexer_weights = DeviceBuffer<float>(host[l].indexer_weights);
      buffers[l].indexer_pool = device[l].indexer_pool.get();
      buffers[l].indexer_queries = device[l].indexer_q8.get();
      buffers[l].indexer_weights = device[l].indexer_weights.get();
    }
    device[l].latent_pool = DeviceBuffer<uint8_t>(host[l].latent_pool);
    device[l].q = DeviceBuffer<uint16_t>(host[l].q);
    device[l].out = DeviceBuffer<uint16_t>(static_cast<size_t>(rows) * heads * kRank);
    device[l].lse = DeviceBuffer<float>(static_cast<size_t>(rows) * heads);
    buffers[l].latent_pool = device[l].latent_pool.get();
    buffers[l].q = device[l].q.get();
    buffers[l].out = device[l].out.get();
    buffers[l].lse = device[l].lse.get();
  }
  DeviceBuffer<int32_t> table(layout.block_table), request(row_request), visible(row_visible);
  DeviceBuffer<float> scores(static_cast<size_t>(rows) * max_visible);
  DeviceBuffer<uint32_t> histogram(static_cast<size_t>(rows) * cuda::kTopkHistogramBins);
  DeviceBuffer<int32_t> state(static_cast<size_t>(rows) * cuda::kTopkRowState),
      slots(static_cast<size_t>(rows) * top_k);
  histogram.fill_bytes(0);
  state.fill_bytes(0);
  const int splits = 3;
  DeviceBuffer<float> partial_out(static_cast<size_t>(rows) * splits * heads * kRank);
  DeviceBuffer<float> partial_lse(static_cast<size_t>(rows) * splits * heads);

  cuda::AttentionStackShape shape;
  shape.rows = rows;
  shape.rows_per_group = tokens;
  shape.heads = heads;
  shape.index_heads = index_heads;
  shape.top_k = top_k;
  shape.num_splits = splits;
  shape.softmax_scale = 1.f / std::sqrt(256.f);
  shape.block_table = table.get();
  shape.block_table_stride = layout.block_table_stride;
  shape.row_request = request.get();
  shape.row_visible = visible.get();
  shape.max_visible = max_visible;
  cuda::AttentionStackWorkspace workspace;
  workspace.scores = scores.get();
  workspace.score_stride = max_visible;
  workspace.histogram = histogram.get();
  workspace.row_state = state.get();
  workspace.slots = slots.get();
  workspace.partial_out = partial_out.get();
  workspace.partial_lse = partial_lse.get();

  const int indexer_runs = cuda::run_attention_stack(shape, full, buffers, workspace, nullptr);
  EXPECT_EQ(indexer_runs, 4);

  // Reference: the indexer of each full layer picks slots; shared layers reuse them.
  std::vector<std::vector<int32_t>> current(rows);
  std::vector<float> expected_out(static_cast<size_t>(heads) * kRank), expected_lse(heads);
  for (int l = 0; l < layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    if (full[l])
      for (int row = 0; row < rows; ++row) {
        const int32_t* row_table =
            layout.block_table.data() + row_request[row] * layout.block_table_stride;
        std::vector<float> row_scores(row_visible[row]);
        reference::indexer_scores_reference(
            host[l].indexer_q.data() + static_cast<size_t>(row) * index_heads * 128,
            host[l].indexer_weights.data() + static_cast<size_t>(row) * index_heads, index_heads,
            host[l].indexer_pool.data(), row_table, row_visible[row], row_scores.data());
        current[row] =
            reference::topk_slots_reference(row_scores.data(), row_visible[row], top_k, row_table);
      }
    const auto out = device[l].out.download();
    const auto lse = device[l].lse.download();
    for (int row = 0; row < rows; ++row) {
      reference::sparse_mla_reference(
          host[l].q_values.data() + static_cast<size_t>(row) * heads * kQueryDim, heads,
          current[row].data(), top_k, host[l].latent_pool.data(), shape.softmax_scale,
          expected_out.data(), expected_lse.data());
      for (int h = 0; h < heads; ++h) {
        ASSERT_NEAR(lse[static_cast<size_t>(row) * heads + h], expected_lse[h], 2e-2)
            << "row " << row;
        double error = 0, norm = 0;
        for (int i = 0; i < kRank; ++i) {
          const double got = bf16_to_float(out[(static_cast<size_t>(row) * heads + h) * kRank + i]);
          const double want = expected_out[static_cast<size_t>(h) * kRank + i];
          error += (got - want) * (got - want);
          norm += want * want;
        }
        ASSERT_LT(std::sqrt(error / norm), 2e-2) << "row " << row << " head " << h;
      }
    }
  }

  // A full layer without its indexer cache, or a schedule starting shared, is an error.
  auto broken = buffers;
  broken[6].indexer_pool = nullptr;
  EXPECT_THROW(cuda::run_attention_stack(shape, full, broken, workspace, nullptr), Error);
  auto shared_first = full;
  shared_first[0] = false;
  EXPECT_THROW(cuda::run_attention_stack(shape, shared_first, buffers, workspace, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test

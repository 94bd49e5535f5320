// The indexer-recall evaluation (model/indexer_recall.h): its dense attention
// probabilities against the reference MLA attention, its recall and mass
// bookkeeping on crafted selections, and the probe through a real model.
#include "model/indexer_recall.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "hf_fixture.h"
#include "kernels/reference/sparse_attention.h"
#include "model/dsa_model.h"
#include "model/sequence_runner.h"

namespace megactx {
namespace {
using testing::HfFixture;
using testing::load_fixture;
using testing::relative_error;

// A synthetic view: `rows` new rows after `start` cached positions, random
// queries and entries, heads 3, kv_lora 8, rope 4.
struct Synthetic {
  int64_t heads = 3, lora = 8, rope = 4, start = 40, rows = 3, topk = 8;
  std::vector<float> q_latent, q_rope, entries;
  std::vector<int32_t> selection;
  std::vector<int64_t> counts;
  AttentionProbeLayer view;

  Synthetic() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t context = start + rows, entry = lora + rope;
    q_latent.resize(rows * heads * lora);
    q_rope.resize(rows * heads * rope);
    entries.resize(context * entry);
    for (float& x : q_latent) x = normal(rng);
    for (float& x : q_rope) x = normal(rng);
    for (float& x : entries) x = normal(rng);
    selection.assign(rows * topk, -1);
    counts.assign(rows, topk);
    view.layer = 2;
    view.indexer_source = 1;
    view.heads = heads;
    view.kv_lora = lora;
    view.rope = rope;
    view.scale = 0.3f;
    view.start = start;
    view.rows = rows;
    view.q_latent = q_latent.data();
    view.q_rope = q_rope.data();
    view.topk = selection.data();
    view.counts = counts.data();
    view.index_topk = topk;
    view.read_entry = [this, entry](int64_t p, float* e) {
      std::copy_n(entries.data() + p * entry, entry, e);
    };
  }

  // Row `row`'s positions by head-averaged dense mass, most first.
  std::vector<int32_t> by_mass(int64_t row, std::vector<double>* mass) {
    const int64_t visible = start + row + 1;
    const std::vector<float> p = dense_attention_probabilities(view, row, entries.data());
    mass->assign(visible, 0.0);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < visible; ++i) (*mass)[i] += p[h * visible + i] / double(heads);
    std::vector<int32_t> order(visible);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return (*mass)[a] > (*mass)[b]; });
    return order;
  }
};

TEST(IndexerRecall, ProbabilitiesGiveTheReferenceAttention) {
  // softmax(scores) . c_kv over every visible position is what the reference
  // MLA attention computes when every position is selected.
  Synthetic s;
  for (int64_t row = 0; row < s.rows; ++row) {
    const int64_t visible = s.start + row + 1, entry = s.lora + s.rope;
    const std::vector<float> p = dense_attention_probabilities(s.view, row, s.entries.data());
    std::vector<int32_t> all(visible);
    std::iota(all.begin(), all.end(), 0);
    std::vector<float> want(s.heads * s.lora);
    reference::mla_attention(s.q_latent.data() + row * s.heads * s.lora,
                             s.q_rope.data() + row * s.heads * s.rope, s.heads, s.lora, s.rope,
                             s.entries.data(), all.data(), visible, s.view.scale, want.data());
    for (int64_t h = 0; h < s.heads; ++h) {
      double total = 0.0;
      for (int64_t i = 0; i < visible; ++i) total += p[h * visible + i];
      EXPECT_NEAR(total, 1.0, 1e-5);
      for (int64_t j = 0; j < s.lora; ++j) {
        double got = 0.0;
        for (int64_t i = 0; i < visible; ++i) got += p[h * visible + i] * s.entries[i * entry + j];
        EXPECT_NEAR(got, want[h * s.lora + j], 1e-4) << "head " << h << " dim " << j;
      }
    }
  }
}

TEST(IndexerRecall, CountsHitsAndMassOfTheSelection) {
  Synthetic s;
  // Row 0: the dense top-k itself; row 1: the k positions of least mass;
  // row 2: half of each.
  std::vector<double> expected_mass(s.rows, 0.0);
  std::vector<double> expected_recall = {1.0, 0.0, 0.5};
  for (int64_t row = 0; row < s.rows; ++row) {
    std::vector<double> mass;
    const std::vector<int32_t> order = s.by_mass(row, &mass);
    for (int64_t i = 0; i < s.topk; ++i) {
      const int32_t p = row == 0   ? order[i]
                        : row == 1 ? order[order.size() - 1 - i]
                                   : (i % 2 == 0 ? order[i / 2] : order[order.size() - 1 - i / 2]);
      s.selection[row * s.topk + i] = p;
      expected_mass[row] += mass[p];
    }
  }
  for (int64_t row = 0; row < s.rows; ++row) {
    IndexerRecall recall(s.start + row);  // rows row.. of the view
    recall.observe(s.view);
    const std::vector<IndexerRecall::Layer> layers = recall.layers();
    ASSERT_EQ(layers.size(), 1u);
    EXPECT_EQ(layers[0].layer, 2);
    EXPECT_EQ(layers[0].indexer_source, 1);
    EXPECT_EQ(layers[0].rows, s.rows - row);
    if (row == s.rows - 1) {
      EXPECT_NEAR(layers[0].recall, expected_recall[row], 1e-9);
      EXPECT_NEAR(layers[0].mass, expected_mass[row], 1e-6);
    }
  }
  IndexerRecall all(0);
  all.observe(s.view);
  const std::vector<IndexerRecall::Layer> layers = all.layers();
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].rows, s.rows);
  EXPECT_NEAR(layers[0].recall, 0.5, 1e-9);
  EXPECT_NEAR(layers[0].mass, (expected_mass[0] + expected_mass[1] + expected_mass[2]) / 3, 1e-6);
}

TEST(IndexerRecall, ProbeThroughTheModelChangesNoLogit) {
  // The HF fixture (top-k 16, shared layers): the probe sees every layer with
  // its indexer source and the prompt's rows, and the logits stay HF's.
  const HfFixture f = load_fixture("glm_pattern");
  const auto model = load_language_model(f.dir, {});
  auto* dsa = dynamic_cast<DsaModel*>(model.get());
  ASSERT_NE(dsa, nullptr);
  const int64_t length = static_cast<int64_t>(f.input_ids.size());
  ASSERT_GT(length, dsa->index_topk() + 1);
  IndexerRecall recall(0);
  std::vector<int64_t> seen;
  dsa->set_attention_probe([&](const AttentionProbeLayer& view) {
    EXPECT_EQ(view.start, 0);
    EXPECT_EQ(view.rows, length);
    EXPECT_EQ(view.indexer_source, dsa->plan().layer(view.layer).indexer_source);
    seen.push_back(view.layer);
    recall.observe(view);
  });
  SequenceRunner runner(*model, KvDType::F32, length);
  const Tensor logits = runner.feed(f.input_ids, /*all_logits=*/true);
  dsa->set_attention_probe({});
  EXPECT_LE(relative_error(logits.data<float>(), f.prefill_logits.data(), f.prefill_logits.size()),
            1e-4);
  ASSERT_EQ(static_cast<int64_t>(seen.size()), model->config().num_hidden_layers);
  const std::vector<IndexerRecall::Layer> layers = recall.layers();
  ASSERT_EQ(static_cast<int64_t>(layers.size()), model->config().num_hidden_layers);
  for (const IndexerRecall::Layer& layer : layers) {
    EXPECT_EQ(layer.rows, length - dsa->index_topk());  // rows seeing more than top-k keys
    EXPECT_GE(layer.recall, 0.0);
    EXPECT_LE(layer.recall, 1.0);
    EXPECT_GT(layer.mass, 0.0);
    EXPECT_LE(layer.mass, 1.0 + 1e-6);
  }
}

}  // namespace
}  // namespace megactx

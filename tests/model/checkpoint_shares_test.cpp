// A rank's share read straight from a checkpoint (model/cuda/checkpoint_shares.h)
// against the host path's cut of the whole float32 model (parallel_shard,
// dsa_weights.h): the same values for every cut tensor of every layer, each
// rank of 2, tensor parallel and with the experts split, on an fp8 checkpoint
// (whose small shares fall across the 128 x 128 scale blocks: float32 values)
// and a bf16 one. On random fp8 matrices: a cut on the blocks stays e4m3 with
// its scale rows / columns cut alike; one across them comes back as float32;
// another rank's expert and the split indexer are refused.
#include "model/cuda/checkpoint_shares.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "hf_fixture.h"
#include "io/checkpoint.h"
#include "model/dsa_weights.h"
#include "model/weight_source.h"

namespace megactx::testing {
namespace {

// Largest |a - b| over two float32 tensors of one shape (infinity when the
// shapes differ).
double max_difference(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  return worst;
}

// [top; bottom] rows of two float32 matrices.
Tensor stacked(const Tensor& top, const Tensor& bottom) {
  Tensor out = Tensor::empty({top.dim(0) + bottom.dim(0), top.dim(1)});
  std::memcpy(out.data<float>(), top.data<float>(), top.nbytes());
  std::memcpy(out.data<float>() + top.numel(), bottom.data<float>(), bottom.nbytes());
  return out;
}

// Every cut of one rank: the share source's values (dequantised) against
// parallel_shard's.
void expect_rank_share(const std::string& fixture, int rank, bool experts) {
  SCOPED_TRACE(fixture + " rank " + std::to_string(rank) + (experts ? " experts split" : ""));
  const auto checkpoint = Checkpoint::open(fixture_dir(fixture));
  const ModelConfig& c = checkpoint->config();
  const ModelPlan whole_plan = plan_model(c);
  const ModelPlan plan =
      parallel_plan(whole_plan, c, {.rank = rank, .size = 2, .expert_parallel = experts});
  auto weights = make_checkpoint_weights(*checkpoint);
  const DsaWeights host = parallel_shard(load_dsa_weights(c, whole_plan, *weights), plan);
  auto matrices = make_checkpoint_matrices(*checkpoint);
  auto share = make_share_matrices(*matrices, c, plan);
  const auto read = [&](const std::string& name, int64_t rows, int64_t cols) {
    return dequantize(share->matrix(name, {rows, cols}));
  };
  const AttentionDims& d = plan.attention;  // the rank's heads
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& w = host.layers[static_cast<size_t>(l)];
    const std::string a = "model.layers." + std::to_string(l) + ".self_attn.";
    const int64_t q_in = c.q_lora_rank ? *c.q_lora_rank : c.hidden_size;
    EXPECT_EQ(max_difference(read(a + (c.q_lora_rank ? "q_b_proj.weight" : "q_proj.weight"),
                                  d.heads * d.qk, q_in),
                             w.attention.q_b),
              0.0);
    EXPECT_EQ(
        max_difference(read(a + "o_proj.weight", c.hidden_size, d.heads * d.value), w.attention.o),
        0.0);
    // kv_b_proj's rows of the rank's heads: W_UK^T and W_UV as the loaders
    // build them.
    const int64_t nope = c.qk_nope_head_dim, value = c.v_head_dim, lora = c.kv_lora_rank;
    const Tensor kv_b =
        share->float_tensor(a + "kv_b_proj.weight", {d.heads * (nope + value), lora});
    double uk = 0, uv = 0;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* block = kv_b.data<float>() + h * (nope + value) * lora;
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t k = 0; k < lora; ++k)
          uk = std::max(uk, static_cast<double>(std::abs(
                                block[i * lora + k] -
                                w.attention.w_uk_t.data<float>()[(h * lora + k) * nope + i])));
      for (int64_t i = 0; i < value * lora; ++i)
        uv = std::max(uv, static_cast<double>(
                              std::abs(block[nope * lora + i] -
                                       w.attention.w_uv.data<float>()[h * value * lora + i])));
    }
    EXPECT_EQ(uk, 0.0);
    EXPECT_EQ(uv, 0.0);
    const std::string m = "model.layers." + std::to_string(l) + ".mlp.";
    const auto expect_mlp = [&](const std::string& prefix, const MlpWeights& want) {
      const int64_t width = want.intermediate;
      const Tensor gate_up = stacked(read(prefix + "gate_proj.weight", width, c.hidden_size),
                                     read(prefix + "up_proj.weight", width, c.hidden_size));
      EXPECT_EQ(max_difference(gate_up, want.gate_up), 0.0) << prefix;
      EXPECT_EQ(max_difference(read(prefix + "down_proj.weight", c.hidden_size, width), want.down),
                0.0)
          << prefix;
    };
    if (!w.is_moe) {
      expect_mlp(m, w.dense);
      continue;
    }
    if (c.n_shared_experts > 0) expect_mlp(m + "shared_experts.", w.moe.shared);
    const int64_t first = experts ? plan.first_expert : 0;
    for (size_t e = 0; e < w.moe.experts.size(); ++e)
      expect_mlp(m + "experts." + std::to_string(first + static_cast<int64_t>(e)) + ".",
                 w.moe.experts[e]);
  }
}

TEST(CheckpointShares, EveryCutEqualsTheHostModelsShare) {
  for (const char* fixture : {"glm_fp8", "glm_schedule"})
    for (int rank = 0; rank < 2; ++rank)
      for (const bool experts : {false, true}) expect_rank_share(fixture, rank, experts);
}

// A hand-made rank plan over random fp8 matrices (names and shapes as a
// loader asks for them).
ModelPlan rank_plan(int rank, int size) {
  ModelPlan plan;
  plan.tensor_parallel_rank = rank;
  plan.tensor_parallel_size = size;
  return plan;
}

TEST(CheckpointShares, Fp8CutsOnTheScaleBlocksStayFp8) {
  ModelConfig config;
  config.num_hidden_layers = 1;
  auto whole = make_random_fp8_matrices(11);
  auto source = make_random_fp8_matrices(11);
  auto share = make_share_matrices(*source, config, rank_plan(1, 2));
  // q_b [512, 384] -> rank 1's rows 256 .. 511: two whole 128-row blocks.
  const std::string q_b = "model.layers.0.self_attn.q_b_proj.weight";
  const CheckpointMatrix rows = share->matrix(q_b, {256, 384});
  ASSERT_TRUE(rows.fp8());
  EXPECT_EQ(rows.scales.shape(), (Shape{2, 3}));
  const Tensor all_rows = dequantize(whole->matrix(q_b, {512, 384}));
  EXPECT_EQ(max_difference(dequantize(rows), all_rows.slice_rows(256, 512).clone()), 0.0);
  // o_proj [256, 512] -> rank 1's columns 256 .. 511 (scale columns 2 .. 3).
  const std::string o = "model.layers.0.self_attn.o_proj.weight";
  const CheckpointMatrix columns = share->matrix(o, {256, 256});
  ASSERT_TRUE(columns.fp8());
  EXPECT_EQ(columns.scales.shape(), (Shape{2, 2}));
  const Tensor all_columns = dequantize(whole->matrix(o, {256, 512}));
  Tensor want = Tensor::empty({256, 256});
  for (int64_t r = 0; r < 256; ++r)
    std::memcpy(want.data<float>() + r * 256, all_columns.data<float>() + r * 512 + 256,
                256 * sizeof(float));
  EXPECT_EQ(max_difference(dequantize(columns), want), 0.0);
  // A dense MLP's gate [384, 256] -> rank 1's rows 192 .. 383: across a
  // block, so float32 values, the whole matrix's.
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  const CheckpointMatrix across = share->matrix(gate, {192, 256});
  EXPECT_FALSE(across.fp8());
  EXPECT_EQ(
      max_difference(across.values,
                     dequantize(whole->matrix(gate, {384, 256})).slice_rows(192, 384).clone()),
      0.0);
  // The router and the norms come whole.
  EXPECT_EQ(share->matrix("model.layers.0.mlp.gate.weight", {8, 256}).rows(), 8);
}

TEST(CheckpointShares, RefusesAnotherRanksExpertAndTheSplitIndexer) {
  ModelConfig config;
  config.num_hidden_layers = 1;
  auto source = make_random_fp8_matrices(5);
  ModelPlan plan = rank_plan(0, 2);
  plan.expert_parallel_size = 2;
  plan.first_expert = 0;
  plan.local_experts = 4;
  auto share = make_share_matrices(*source, config, plan);
  EXPECT_TRUE(share->matrix("model.layers.0.mlp.experts.3.down_proj.weight", {128, 128}).fp8());
  try {
    share->matrix("model.layers.0.mlp.experts.4.down_proj.weight", {128, 128});
    ADD_FAILURE() << "another rank's expert was read";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("another rank's expert"), std::string::npos)
        << error.what();
  }
  plan.indexer_split = true;
  EXPECT_THROW(make_share_matrices(*source, config, plan), Error);
}

}  // namespace
}  // namespace megactx::testing

// RoPE tables against values computed independently (Python float64 from the
// formulas of HF's _compute_default_rope_parameters / _compute_yarn_parameters
// and yarn_apply_mscale), for the DeepSeek-V3.2 YaRN setting and for YaRN
// without mscale fields.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/rope.h"

namespace megactx {
namespace {

ModelConfig yarn_config(int64_t rope_dim, double factor, int64_t original, double mscale,
                        double mscale_all_dim) {
  ModelConfig c;
  c.qk_rope_head_dim = rope_dim;
  c.qk_nope_head_dim = 128;
  c.rope.rope_type = "yarn";
  c.rope.rope_theta = 10000.0;
  c.rope.factor = factor;
  c.rope.original_max_position_embeddings = original;
  c.rope.mscale = mscale;
  c.rope.mscale_all_dim = mscale_all_dim;
  return c;
}

TEST(Rope, DeepseekV32YarnFrequenciesAndScales) {
  // factor 40, original 4096, mscale = mscale_all_dim = 1 (the released config).
  const RopeTable table = make_rope_table(yarn_config(64, 40.0, 4096, 1.0, 1.0));
  ASSERT_EQ(table.inv_freq.size(), 32u);
  const double expected[] = {1.0,
                             0.1,
                             0.0055,
                             0.00041499039849078964,
                             3.33380358040831e-05,
                             2.5e-05,
                             3.33380358040831e-06};
  const int index[] = {0, 8, 16, 21, 23, 24, 31};
  for (int i = 0; i < 7; ++i) {
    EXPECT_NEAR(table.inv_freq[index[i]], expected[i], expected[i] * 1e-5) << index[i];
  }
  EXPECT_FLOAT_EQ(table.attention_factor, 1.0f);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(attention_softmax_scale(yarn_config(64, 40.0, 4096, 1.0, 1.0)),
              m * m / std::sqrt(192.0), 1e-7);
}

TEST(Rope, YarnWithoutMscaleFieldsScalesCosSinOnly) {
  ModelConfig c = yarn_config(16, 4.0, 32, 1.0, 0.0);  // parse defaults when absent
  const RopeTable table = make_rope_table(c);
  const double expected[] = {1.0,    0.19764235376052372,   0.025,   0.007905694150420948,
                             0.0025, 0.0007905694150420947, 0.00025, 7.905694150420948e-05};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(table.inv_freq[i], expected[i], expected[i] * 1e-5);
  EXPECT_NEAR(table.attention_factor, 1.138629436111989, 1e-6);
  EXPECT_NEAR(attention_softmax_scale(c), 1.0 / std::sqrt(144.0), 1e-8);
  // cos/sin carry the attention factor.
  const int64_t position = 3;
  std::vector<float> cos(8), sin(8);
  table.fill(&position, 1, cos.data(), sin.data());
  EXPECT_NEAR(cos[1], std::cos(3 * 0.19764235376052372) * 1.138629436111989, 1e-5);
  EXPECT_NEAR(sin[1], std::sin(3 * 0.19764235376052372) * 1.138629436111989, 1e-5);
}

TEST(Rope, DefaultFrequencies) {
  ModelConfig c;
  c.qk_rope_head_dim = 64;
  c.qk_nope_head_dim = 192;
  c.rope.rope_theta = 8e6;
  const RopeTable table = make_rope_table(c);
  for (int i = 0; i < 32; ++i) {
    const double expected = std::pow(8e6, -2.0 * i / 64.0);
    EXPECT_NEAR(table.inv_freq[i], expected, expected * 1e-5);
  }
  EXPECT_FLOAT_EQ(table.attention_factor, 1.0f);
  EXPECT_NEAR(attention_softmax_scale(c), 1.0 / 16.0, 1e-9);
}

}  // namespace
}  // namespace megactx

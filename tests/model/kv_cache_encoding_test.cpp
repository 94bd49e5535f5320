// PagedKvCache per-token encodings (kv_cache.h): sizes of the documented
// layouts, exact F32 round trips, BF16 = round-to-nearest-even, FP8 e4m3 with
// per-128 fp32 scales (amax / 448) within e4m3's relative step, page copies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "core/dtype.h"
#include "core/error.h"

namespace megactx {
namespace {

KvCacheSpec spec_of(KvDType dtype, int64_t lora = 512, int64_t rope = 64, int64_t index = 128) {
  KvCacheSpec spec;
  spec.num_pages = 3;
  spec.kv_lora_rank = lora;
  spec.qk_rope_head_dim = rope;
  spec.index_head_dim = index;
  spec.latent_layers = {0, 1, 2};
  spec.indexer_layers = {0, 2};
  spec.dtype = dtype;
  return spec;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = normal(rng);
  return values;
}

TEST(KvCacheLayout, BytesPerTokenMatchTheDocumentedLayouts) {
  EXPECT_EQ(spec_of(KvDType::F32).latent_bytes_per_token(), 2304);
  EXPECT_EQ(spec_of(KvDType::BF16).latent_bytes_per_token(), 1152);
  EXPECT_EQ(spec_of(KvDType::FP8).latent_bytes_per_token(), 656);
  EXPECT_EQ(spec_of(KvDType::F32).indexer_bytes_per_token(), 512);
  EXPECT_EQ(spec_of(KvDType::BF16).indexer_bytes_per_token(), 256);
  EXPECT_EQ(spec_of(KvDType::FP8).indexer_bytes_per_token(), 132);
  EXPECT_EQ(spec_of(KvDType::FP8).bytes_per_page(), 64 * (3 * 656 + 2 * 132));
  PagedKvCache cache(spec_of(KvDType::FP8));
  EXPECT_TRUE(cache.has_indexer(2));
  EXPECT_FALSE(cache.has_indexer(1));  // a shared layer has no indexer pool
  EXPECT_EQ(cache.latent_pool(1).dim(0), 3 * 64);
}

TEST(KvCacheLayout, F32RoundTripIsExactAndBf16Rounds) {
  for (KvDType dtype : {KvDType::F32, KvDType::BF16}) {
    PagedKvCache cache(spec_of(dtype));
    const auto c = random_values(512, 1), r = random_values(64, 2), k = random_values(128, 3);
    cache.write_latent(1, 70, c.data(), r.data());
    cache.write_indexer_key(2, 191, k.data());
    std::vector<float> c2(512), r2(64), k2(128);
    cache.read_latent(1, 70, c2.data(), r2.data());
    cache.read_indexer_key(2, 191, k2.data());
    for (int i = 0; i < 512; ++i) {
      const float expected = dtype == KvDType::F32 ? c[i] : bf16_to_float(float_to_bf16(c[i]));
      ASSERT_EQ(c2[i], expected);
    }
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(r2[i], dtype == KvDType::F32 ? r[i] : bf16_to_float(float_to_bf16(r[i])));
    }
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(k2[i], dtype == KvDType::F32 ? k[i] : bf16_to_float(float_to_bf16(k[i])));
    }
  }
}

TEST(KvCacheLayout, Fp8GroupsScaleByAmaxAndKeepRopeInBf16) {
  PagedKvCache cache(spec_of(KvDType::FP8));
  auto c = random_values(512, 4);
  for (int i = 128; i < 256; ++i) c[i] = 0.0f;      // an all-zero group: scale 1
  for (int i = 256; i < 384; ++i) c[i] *= 1000.0f;  // a large group
  const auto r = random_values(64, 5);
  cache.write_latent(0, 5, c.data(), r.data());
  std::vector<float> c2(512), r2(64);
  cache.read_latent(0, 5, c2.data(), r2.data());
  const std::byte* entry = cache.latent_entry(0, 5);
  for (int g = 0; g < 4; ++g) {
    float amax = 0.0f;
    for (int i = g * 128; i < (g + 1) * 128; ++i) amax = std::max(amax, std::fabs(c[i]));
    float scale;
    std::memcpy(&scale, entry + 512 + 4 * g, 4);
    EXPECT_FLOAT_EQ(scale, amax > 0 ? amax / 448.0f : 1.0f) << "group " << g;
    for (int i = g * 128; i < (g + 1) * 128; ++i) {
      // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 (normal range), plus
      // an absolute floor for values in e4m3's subnormal range.
      ASSERT_LE(std::fabs(c2[i] - c[i]), std::fabs(c[i]) / 16.0f + scale * 0.002f) << i;
    }
  }
  for (int i = 0; i < 64; ++i) ASSERT_EQ(r2[i], bf16_to_float(float_to_bf16(r[i])));
  const auto k = random_values(128, 6);
  cache.write_indexer_key(0, 7, k.data());
  std::vector<float> k2(128);
  cache.read_indexer_key(0, 7, k2.data());
  float amax = 0.0f;
  for (float v : k) amax = std::max(amax, std::fabs(v));
  for (int i = 0; i < 128; ++i)
    ASSERT_LE(std::fabs(k2[i] - k[i]), std::fabs(k[i]) / 16.0f + amax / 448.0f * 0.002f);
}

TEST(KvCacheLayout, CopyPageCopiesEveryPoolAndBadAccessIsAnError) {
  PagedKvCache cache(spec_of(KvDType::BF16, 32, 8, 16));
  const auto c = random_values(32, 7), r = random_values(8, 8), k = random_values(16, 9);
  cache.write_latent(2, 64 + 3, c.data(), r.data());
  cache.write_indexer_key(2, 64 + 3, k.data());
  cache.copy_page(1, 2);
  std::vector<float> c2(32), r2(8), k2(16);
  cache.read_latent(2, 128 + 3, c2.data(), r2.data());
  cache.read_indexer_key(2, 128 + 3, k2.data());
  for (int i = 0; i < 32; ++i) ASSERT_EQ(c2[i], bf16_to_float(float_to_bf16(c[i])));
  for (int i = 0; i < 16; ++i) ASSERT_EQ(k2[i], bf16_to_float(float_to_bf16(k[i])));
  EXPECT_THROW(cache.write_latent(0, 3 * 64, c.data(), r.data()), Error);
  EXPECT_THROW(cache.write_indexer_key(1, 0, k.data()), Error);  // no indexer pool
  EXPECT_THROW(cache.copy_page(0, 3), Error);
  KvCacheSpec twice = spec_of(KvDType::F32);
  twice.latent_layers = {0, 0};
  EXPECT_THROW(PagedKvCache{twice}, Error);
}

}  // namespace
}  // namespace megactx

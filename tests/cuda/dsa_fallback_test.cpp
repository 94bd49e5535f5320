// The fp32 fallback DSA kernels (kernels/cuda/dsa_fallback/dsa_fallback.h): the
// fast indexer scorer (keys read once into registers) against the plain kernel
// bit for bit, the tiled sparse MLA (entries gathered into shared memory 64 keys
// at a time, 4 heads per block) against the plain kernel within fp32 rounding,
// and all of them against a double-precision host computation of the contract,
// on F32, BF16 and FP8 pools of random entries over shuffled pages: every index
// dim the fast scorer serves, shapes left to the plain kernels, ragged rows,
// padding rows, empty selections, partial tiles and selections of 2048 keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dsa_test_support.h"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"

namespace megactx::test {
namespace {

using cuda::CacheDType;
using cuda::CacheLayout;

const char* name(CacheDType dtype) {
  return dtype == CacheDType::F32 ? "f32" : dtype == CacheDType::BF16 ? "bf16" : "fp8";
}

// A pool of `slots` random entries in `layout`, and each entry's values as the
// kernels decode them ([slots, width] floats).
struct Pool {
  CacheLayout layout;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Pool random_pool(CacheLayout layout, int64_t slots, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  Pool pool;
  pool.layout = layout;
  pool.bytes.assign(static_cast<size_t>(slots * layout.bytes()), 0);
  pool.values.assign(static_cast<size_t>(slots * layout.width), 0.f);
  for (int64_t slot = 0; slot < slots; ++slot) {
    uint8_t* entry = pool.bytes.data() + slot * layout.bytes();
    float* value = pool.values.data() + slot * layout.width;
    const float spread = 0.25f + static_cast<float>(rng() % 100) / 25.f;
    for (int64_t i = 0; i < layout.width; ++i) value[i] = normal(rng) * spread;
    if (layout.dtype == CacheDType::F32) {
      std::memcpy(entry, value, static_cast<size_t>(layout.width) * 4);
    } else if (layout.dtype == CacheDType::BF16) {
      for (int64_t i = 0; i < layout.width; ++i) {
        const uint16_t bits = float_to_bf16(value[i]);
        std::memcpy(entry + 2 * i, &bits, 2);
        value[i] = bf16_to_float(bits);
      }
    } else {
      const int64_t groups = (layout.fp8_count + 127) / 128;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * 128, end = std::min<int64_t>(begin + 128, layout.fp8_count);
        float amax = 0.f;
        for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(value[i]));
        const float scale = amax > 0.f ? amax / 448.f : 1.f;
        for (int64_t i = begin; i < end; ++i) {
          entry[i] = float_to_fp8_e4m3(value[i] / scale);
          value[i] = fp8_e4m3_to_float(entry[i]) * scale;
        }
        std::memcpy(entry + layout.fp8_count + 4 * g, &scale, 4);
      }
      uint8_t* tail = entry + layout.fp8_count + 4 * groups;
      for (int64_t i = layout.fp8_count; i < layout.width; ++i) {
        const uint16_t bits = float_to_bf16(value[i]);
        std::memcpy(tail + 2 * (i - layout.fp8_count), &bits, 2);
        value[i] = bf16_to_float(bits);
      }
    }
  }
  return pool;
}

// Rows of one launch: row t belongs to sequence seq[t] (its own shuffled pages)
// at position positions[t] (-1: a padding row).
struct Rows {
  std::vector<int32_t> positions, table_offset, tables;
  int64_t slots = 0, max_context = 0;
  int64_t slot(int64_t t, int64_t position) const {
    return static_cast<int64_t>(tables[table_offset[t] + position / 64]) * 64 + position % 64;
  }
};

Rows make_rows(const std::vector<int32_t>& positions, std::mt19937& rng) {
  Rows rows;
  rows.positions = positions;
  int64_t pages = 0;
  for (int32_t p : positions) {
    rows.table_offset.push_back(static_cast<int32_t>(pages));
    pages += p < 0 ? 1 : (p + 64) / 64;
    rows.max_context = std::max<int64_t>(rows.max_context, p + 1);
  }
  rows.tables.resize(static_cast<size_t>(pages));
  std::iota(rows.tables.begin(), rows.tables.end(), 0);
  std::shuffle(rows.tables.begin(), rows.tables.end(), rng);
  rows.slots = (pages + 2) * 64;
  return rows;
}

std::vector<float> normal_values(size_t count, std::mt19937& rng, float sigma = 1.f) {
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// RoPE tables [count] of random angles: the cos and the sin.
struct RopeTables {
  std::vector<float> cos, sin;
};
RopeTables random_rope_tables(size_t count, std::mt19937& rng) {
  const std::vector<float> angles = normal_values(count, rng);
  RopeTables t{std::vector<float>(count), std::vector<float>(count)};
  for (size_t i = 0; i < count; ++i) {
    t.cos[i] = std::cos(angles[i]);
    t.sin[i] = std::sin(angles[i]);
  }
  return t;
}

struct IndexerCase {
  CacheDType dtype;
  int64_t dim, heads;
};

void check_indexer_scores(const IndexerCase& c, uint32_t seed) {
  SCOPED_TRACE(std::string(name(c.dtype)) + " dim " + std::to_string(c.dim) + " heads " +
               std::to_string(c.heads));
  std::mt19937 rng(seed);
  const Rows rows = make_rows({0, 63, 64, -1, 300, 1000, 2047, 4099, 5}, rng);
  const int64_t tokens = static_cast<int64_t>(rows.positions.size());
  const CacheLayout layout{c.dtype, c.dim, c.dtype == CacheDType::FP8 ? c.dim : 0};
  const Pool pool = random_pool(layout, rows.slots, rng);
  const std::vector<float> q = normal_values(static_cast<size_t>(tokens * c.heads * c.dim), rng);
  const std::vector<float> w = normal_values(static_cast<size_t>(tokens * c.heads), rng);
  DeviceBuffer<uint8_t> d_pool(pool.bytes);
  DeviceBuffer<float> d_q(q), d_w(w), fast(tokens * rows.max_context),
      plain(tokens * rows.max_context);
  DeviceBuffer<int32_t> d_tables(rows.tables), d_offsets(rows.table_offset),
      d_positions(rows.positions);
  cuda::IndexerFallbackParams p;
  p.q = d_q.get();
  p.weights = d_w.get();
  p.pool = d_pool.get();
  p.layout = layout;
  p.rows = {d_tables.get(), d_offsets.get(), d_positions.get(), 64};
  p.tokens = tokens;
  p.heads = c.heads;
  p.dim = c.dim;
  p.max_context = rows.max_context;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.dim));
  fast.fill_bytes(0xff);
  plain.fill_bytes(0x7f);
  p.scores = fast.get();
  cuda::detail::indexer_scores_fallback(p, /*plain=*/false, nullptr);
  p.scores = plain.get();
  cuda::detail::indexer_scores_fallback(p, /*plain=*/true, nullptr);
  const std::vector<float> got = fast.download(), want = plain.download();
  int64_t differ = 0;
  double worst = 0.0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t pos = 0; pos <= rows.positions[t]; ++pos) {
      const float a = got[t * rows.max_context + pos], b = want[t * rows.max_context + pos];
      differ += std::memcmp(&a, &b, 4) != 0;
      const float* key = pool.values.data() + rows.slot(t, pos) * c.dim;
      double score = 0.0, magnitude = 0.0;
      for (int64_t h = 0; h < c.heads; ++h) {
        double dot = 0.0;
        for (int64_t d = 0; d < c.dim; ++d)
          dot += static_cast<double>(q[(t * c.heads + h) * c.dim + d]) * key[d];
        dot *= p.scale;
        if (dot > 0.0) score += w[t * c.heads + h] * dot;
        magnitude += std::fabs(w[t * c.heads + h] * dot);
      }
      worst = std::max(worst, std::fabs(a - score) / std::max(1.0, magnitude));
    }
  EXPECT_EQ(differ, 0) << "scores that differ from the plain kernel's bits";
  EXPECT_LT(worst, 1e-5) << "largest score error against double precision";
}

TEST(DsaFallback, IndexerScoresEqualThePlainKernelBitForBit) {
  uint32_t seed = 1;
  for (CacheDType dtype : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8})
    for (const auto& [dim, heads] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 16}, {32, 8}, {64, 4}, {64, 3}, {128, 32}, {128, 1}, {24, 5}, {8, 2}})
      check_indexer_scores({dtype, dim, heads}, seed++);
}

struct MlaCase {
  CacheDType dtype;
  int64_t kv_lora, rope, heads, index_stride;
};

void check_mla(const MlaCase& c, uint32_t seed) {
  SCOPED_TRACE(std::string(name(c.dtype)) + " kv_lora " + std::to_string(c.kv_lora) + " rope " +
               std::to_string(c.rope) + " heads " + std::to_string(c.heads) + " top-k " +
               std::to_string(c.index_stride));
  std::mt19937 rng(seed);
  const Rows rows = make_rows({4500, 0, -1, 2100, 70, 9, 3000, 4095}, rng);
  const int64_t tokens = static_cast<int64_t>(rows.positions.size());
  const int64_t width = c.kv_lora + c.rope;
  const CacheLayout layout{c.dtype, width, c.dtype == CacheDType::FP8 ? c.kv_lora : 0};
  const Pool pool = random_pool(layout, rows.slots, rng);
  // Each row selects distinct visible positions in random order; counts vary
  // (0 for the padding row, fewer than top-k for short rows, some rows short
  // on purpose), -1 after the count.
  std::vector<int32_t> indices(static_cast<size_t>(tokens * c.index_stride), -1), counts(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t visible = rows.positions[t] + 1;
    std::vector<int32_t> all(static_cast<size_t>(visible));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    int64_t count = std::min<int64_t>(visible, c.index_stride);
    if (t == 3) count = std::min<int64_t>(count, 13);  // fewer keys than 2 per warp
    counts[t] = static_cast<int32_t>(count);
    std::copy_n(all.begin(), count, indices.begin() + t * c.index_stride);
  }
  const std::vector<float> q_latent =
      normal_values(static_cast<size_t>(tokens * c.heads * c.kv_lora), rng, 0.1f);
  // q_rope inside a wider row, as the model passes it (q [n, heads, nope | rope]).
  const int64_t head_stride = c.rope + 16, row_stride = c.heads * head_stride;
  const std::vector<float> q_rope =
      normal_values(static_cast<size_t>(tokens * row_stride), rng, 0.1f);
  DeviceBuffer<uint8_t> d_pool(pool.bytes);
  DeviceBuffer<float> d_ql(q_latent), d_qr(q_rope), fast(tokens * c.heads * c.kv_lora),
      plain(tokens * c.heads * c.kv_lora);
  DeviceBuffer<int32_t> d_tables(rows.tables), d_offsets(rows.table_offset),
      d_positions(rows.positions), d_indices(indices), d_counts(counts);
  cuda::MlaFallbackParams p;
  p.q_latent = d_ql.get();
  p.q_rope = d_qr.get() + 16;
  p.rope_row_stride = row_stride;
  p.rope_head_stride = head_stride;
  p.pool = d_pool.get();
  p.layout = layout;
  p.rows = {d_tables.get(), d_offsets.get(), d_positions.get(), 64};
  p.indices = d_indices.get();
  p.counts = d_counts.get();
  p.index_stride = c.index_stride;
  p.tokens = tokens;
  p.heads = c.heads;
  p.kv_lora = c.kv_lora;
  p.rope = c.rope;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.kv_lora + c.rope));
  fast.fill_bytes(0xff);
  plain.fill_bytes(0x7f);
  p.out = fast.get();
  cuda::mla_attention_fallback(p, nullptr);
  p.out = plain.get();
  cuda::detail::mla_attention_fallback_plain(p, nullptr);
  const std::vector<float> got = fast.download(), want = plain.download();
  double worst = 0.0, worst_plain = 0.0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < c.heads; ++h) {
      const float* out = got.data() + (t * c.heads + h) * c.kv_lora;
      const float* plain_out = want.data() + (t * c.heads + h) * c.kv_lora;
      if (counts[t] == 0) {
        for (int64_t d = 0; d < c.kv_lora; ++d) EXPECT_EQ(out[d], 0.f);
        continue;
      }
      std::vector<double> logits(static_cast<size_t>(counts[t]));
      double most = -1e300;
      for (int64_t j = 0; j < counts[t]; ++j) {
        const float* entry =
            pool.values.data() + rows.slot(t, indices[t * c.index_stride + j]) * width;
        double dot = 0.0;
        for (int64_t d = 0; d < c.kv_lora; ++d)
          dot += static_cast<double>(q_latent[(t * c.heads + h) * c.kv_lora + d]) * entry[d];
        for (int64_t d = 0; d < c.rope; ++d)
          dot += static_cast<double>(q_rope[t * row_stride + h * head_stride + 16 + d]) *
                 entry[c.kv_lora + d];
        logits[j] = dot * p.scale;
        most = std::max(most, logits[j]);
      }
      double denominator = 0.0;
      std::vector<double> expect(static_cast<size_t>(c.kv_lora), 0.0);
      for (int64_t j = 0; j < counts[t]; ++j) {
        const float* entry =
            pool.values.data() + rows.slot(t, indices[t * c.index_stride + j]) * width;
        const double weight = std::exp(logits[j] - most);
        denominator += weight;
        for (int64_t d = 0; d < c.kv_lora; ++d) expect[d] += weight * entry[d];
      }
      for (int64_t d = 0; d < c.kv_lora; ++d) {
        worst = std::max(worst, std::fabs(out[d] - expect[d] / denominator));
        worst_plain = std::max(worst_plain, std::fabs(plain_out[d] - expect[d] / denominator));
      }
    }
  EXPECT_LT(worst, 1e-4) << "largest output error against double precision";
  EXPECT_LT(worst_plain, 1e-4) << "largest error of the plain kernel against double precision";
}

TEST(DsaFallback, TiledSparseMlaMatchesDoublePrecisionAndThePlainKernel) {
  uint32_t seed = 100;
  for (CacheDType dtype : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8})
    for (const MlaCase& c : std::vector<MlaCase>{{dtype, 128, 32, 8, 128},
                                                 {dtype, 128, 32, 3, 2048},
                                                 {dtype, 32, 8, 4, 16},
                                                 {dtype, 32, 8, 13, 300},
                                                 {dtype, 64, 64, 5, 64},
                                                 {dtype, 256, 16, 2, 512},
                                                 {dtype, 512, 64, 3, 2048},
                                                 {dtype, 48, 8, 2, 64},
                                                 {dtype, 16, 4, 2, 4}})
      check_mla(c, seed++);
}

TEST(DsaFallback, FusedLatentWriteEqualsTheThreeLaunches) {
  // norm_rope_write_latent against rmsnorm + rope + write_cache_rows on the same
  // rows: the same normed and turned rows, the same pool bytes; F32, BF16 and
  // FP8 pools, interleaved and half-split RoPE, GLM-5's and the default model's
  // widths, a padding row that writes nothing.
  struct Shape {
    int64_t lora, rope;
  };
  uint32_t seed = 300;
  for (CacheDType dtype : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8})
    for (const Shape shape : {Shape{512, 64}, Shape{128, 32}, Shape{32, 8}})
      for (const bool interleaved : {true, false}) {
        SCOPED_TRACE(std::string(name(dtype)) + " lora " + std::to_string(shape.lora) +
                     (interleaved ? " interleaved" : " halves"));
        std::mt19937 rng(seed++);
        const Rows rows = make_rows({0, 70, -1, 200, 5}, rng);
        const int64_t tokens = static_cast<int64_t>(rows.positions.size());
        const int64_t width = shape.lora + shape.rope;
        const CacheLayout layout{dtype, width, dtype == CacheDType::FP8 ? shape.lora : 0};
        const Pool pool = random_pool(layout, rows.slots, rng);
        const std::vector<float> kv = normal_values(static_cast<size_t>(tokens * width), rng, 2.f);
        std::vector<float> weight = normal_values(static_cast<size_t>(shape.lora), rng);
        const RopeTables turns =
            random_rope_tables(static_cast<size_t>(tokens * shape.rope / 2), rng);
        DeviceBuffer<uint8_t> fused_pool(pool.bytes), separate_pool(pool.bytes);
        DeviceBuffer<float> fused_kv(kv), separate_kv(kv), d_weight(weight), d_cos(turns.cos),
            d_sin(turns.sin);
        DeviceBuffer<int32_t> d_tables(rows.tables), d_offsets(rows.table_offset),
            d_positions(rows.positions);
        cuda::LatentWriteParams p;
        p.stride = width;
        p.tokens = tokens;
        p.lora = shape.lora;
        p.rope = shape.rope;
        p.norm_weight = d_weight.get();
        p.eps = 1e-6f;
        p.cos = d_cos.get();
        p.sin = d_sin.get();
        p.interleaved = interleaved;
        p.layout = layout;
        p.rows = {d_tables.get(), d_offsets.get(), d_positions.get(), 64};
        p.kv = fused_kv.get();
        p.pool = fused_pool.get();
        cuda::norm_rope_write_latent(p, nullptr);
        p.kv = separate_kv.get();
        p.pool = separate_pool.get();
        cuda::detail::norm_rope_write_latent_separately(p, nullptr);
        const std::vector<float> a = fused_kv.download(), b = separate_kv.download();
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rows differ";
        EXPECT_EQ(fused_pool.download(), separate_pool.download()) << "pool bytes differ";
      }
}

TEST(DsaFallback, FusedIndexerKeyWriteEqualsTheThreeLaunches) {
  // norm_rope_write_indexer_key against layernorm + rope + write_cache_rows:
  // the same keys, the same pool bytes; F32, BF16 and FP8 pools (the FP8
  // indexer entry is all e4m3: 128 codes and a scale), interleaved and
  // half-split RoPE on the first `rope` values, GLM-5's and a small model's
  // widths, in place and into another buffer, a padding row that writes nothing.
  struct Shape {
    int64_t dim, rope;
  };
  uint32_t seed = 400;
  for (CacheDType dtype : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8})
    for (const Shape shape : {Shape{128, 64}, Shape{64, 32}})
      for (const bool interleaved : {true, false})
        for (const bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(name(dtype)) + " dim " + std::to_string(shape.dim) +
                       (interleaved ? " interleaved" : " halves") + (in_place ? " in place" : ""));
          std::mt19937 rng(seed++);
          const Rows rows = make_rows({0, 70, -1, 200, 5}, rng);
          const int64_t tokens = static_cast<int64_t>(rows.positions.size());
          const CacheLayout layout{dtype, shape.dim, dtype == CacheDType::FP8 ? shape.dim : 0};
          const Pool pool = random_pool(layout, rows.slots, rng);
          const std::vector<float> k_raw =
              normal_values(static_cast<size_t>(tokens * shape.dim), rng, 2.f);
          const std::vector<float> weight = normal_values(static_cast<size_t>(shape.dim), rng);
          const std::vector<float> bias = normal_values(static_cast<size_t>(shape.dim), rng);
          const RopeTables turns =
              random_rope_tables(static_cast<size_t>(tokens * shape.rope / 2), rng);
          DeviceBuffer<uint8_t> fused_pool(pool.bytes), separate_pool(pool.bytes);
          DeviceBuffer<float> fused_raw(k_raw), separate_raw(k_raw), fused_k(k_raw.size()),
              separate_k(k_raw.size()), d_weight(weight), d_bias(bias), d_cos(turns.cos),
              d_sin(turns.sin);
          DeviceBuffer<int32_t> d_tables(rows.tables), d_offsets(rows.table_offset),
              d_positions(rows.positions);
          cuda::IndexerKeyWriteParams p;
          p.tokens = tokens;
          p.dim = shape.dim;
          p.rope = shape.rope;
          p.norm_weight = d_weight.get();
          p.norm_bias = d_bias.get();
          p.eps = 1e-6f;
          p.cos = d_cos.get();
          p.sin = d_sin.get();
          p.interleaved = interleaved;
          p.layout = layout;
          p.rows = {d_tables.get(), d_offsets.get(), d_positions.get(), 64};
          p.k_raw = fused_raw.get();
          p.k = in_place ? fused_raw.get() : fused_k.get();
          p.pool = fused_pool.get();
          cuda::norm_rope_write_indexer_key(p, nullptr);
          const std::vector<float> a = (in_place ? fused_raw : fused_k).download();
          p.k_raw = separate_raw.get();
          p.k = in_place ? separate_raw.get() : separate_k.get();
          p.pool = separate_pool.get();
          cuda::detail::norm_rope_write_indexer_key_separately(p, nullptr);
          const std::vector<float> b = (in_place ? separate_raw : separate_k).download();
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "keys differ";
          EXPECT_EQ(fused_pool.download(), separate_pool.download()) << "pool bytes differ";
        }
}

}  // namespace
}  // namespace megactx::test

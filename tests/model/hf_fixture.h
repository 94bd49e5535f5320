// Loads a tests/fixtures/hf/<name> fixture (made by tools/fixtures/make_hf_fixtures.py
// from HF transformers) and runs megactx models over the PagedKvCache.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace megactx::testing {

inline std::string fixture_dir(const std::string& name) {
  return std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
}

struct HfFixture {
  std::string dir;
  nlohmann::json meta;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> greedy_ids;
  std::vector<float> prefill_logits;  // [T, V]
  std::vector<float> decode_logits;   // [N, V]
  std::vector<float> dense_logits;    // [T, V] or empty
  int64_t vocab = 0;
};

inline std::vector<float> read_f32(const std::string& path, size_t count) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  std::vector<float> values(count);
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 4));
  EXPECT_EQ(file.gcount(), static_cast<std::streamsize>(count * 4)) << path;
  return values;
}

inline HfFixture load_fixture(const std::string& name) {
  HfFixture f;
  f.dir = fixture_dir(name);
  std::ifstream file(f.dir + "/reference.json");
  f.meta = nlohmann::json::parse(file);
  f.input_ids = f.meta["input_ids"].get<std::vector<int32_t>>();
  f.greedy_ids = f.meta["greedy_ids"].get<std::vector<int32_t>>();
  auto shape = f.meta["prefill_logits"]["shape"].get<std::vector<int64_t>>();
  f.vocab = shape[1];
  f.prefill_logits = read_f32(f.dir + "/prefill_logits.f32", shape[0] * shape[1]);
  auto dshape = f.meta["decode_logits"]["shape"].get<std::vector<int64_t>>();
  f.decode_logits = read_f32(f.dir + "/decode_logits.f32", dshape[0] * dshape[1]);
  if (f.meta.contains("dense_logits")) {
    f.dense_logits = read_f32(f.dir + "/dense_logits.f32", shape[0] * shape[1]);
  }
  return f;
}

// max |a - b| / max |b|
inline double relative_error(const float* a, const float* b, size_t count) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < count; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

inline int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Share of the rows of two [rows, vocab] logits whose argmax agree.
inline double argmax_agreement(const float* a, const float* b, int64_t rows, int64_t vocab) {
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r)
    agree += argmax(a + r * vocab, vocab) == argmax(b + r * vocab, vocab);
  return static_cast<double>(agree) / static_cast<double>(rows);
}

// Per row of two [rows, vocab] logits: max |a - b| / max |b| of that row,
// sorted ascending (quantiles of how far each position moved).
inline std::vector<double> sorted_row_errors(const float* a, const float* b, int64_t rows,
                                             int64_t vocab) {
  std::vector<double> errors;
  for (int64_t r = 0; r < rows; ++r) {
    double diff = 0.0, scale = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[r * vocab + v]) - b[r * vocab + v]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[r * vocab + v])));
    }
    errors.push_back(diff / scale);
  }
  std::sort(errors.begin(), errors.end());
  return errors;
}

// The q-quantile (0..1) of sorted values.
inline double quantile(const std::vector<double>& sorted, double q) {
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5)];
}

// The first `count` ids of the passkey prompt of tests/default_model (the
// HF tokenizer's ids of the shipped model's chat prompt).
inline std::vector<int32_t> default_model_prompt(size_t count) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/default_model/passkey_8k_ids.txt");
  std::vector<int32_t> ids;
  for (std::string id; ids.size() < count && std::getline(file, id, ',');)
    ids.push_back(std::stoi(id));
  EXPECT_EQ(ids.size(), count) << "tests/default_model/passkey_8k_ids.txt";
  return ids;
}

// One sequence in a cache whose pages are deliberately not in order.
struct Session {
  std::unique_ptr<LanguageModel> model;
  std::unique_ptr<PagedKvCache> cache;
  std::vector<int32_t> pages;
  std::vector<int32_t> tokens;  // everything fed so far

  Session(const std::string& dir, KvDType dtype, ModelLoadOptions options = {}) {
    model = load_language_model(dir, options);
    const int64_t num_pages = 6;
    cache = std::make_unique<PagedKvCache>(make_kv_cache_spec(model->config(), num_pages, dtype));
    pages = {4, 1, 5, 0, 3, 2};
  }

  // Feeds `chunk` and returns logits for every new token ([chunk, V]).
  std::vector<float> feed(const std::vector<int32_t>& chunk) {
    SequenceInput in;
    in.tokens = chunk;
    in.start_position = static_cast<int64_t>(tokens.size());
    in.page_table = pages;
    in.logits_from = 0;
    ForwardBatch batch;
    batch.sequences.push_back(in);
    ForwardOutput out = model->forward(batch, *cache);
    tokens.insert(tokens.end(), chunk.begin(), chunk.end());
    const float* data = out.logits.data<float>();
    return std::vector<float>(data, data + out.logits.numel());
  }
};

}  // namespace megactx::testing

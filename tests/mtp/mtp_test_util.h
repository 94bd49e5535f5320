// Shared helpers of the MTP tests: the default model (models/default, which
// ships an MTP layer) and prompts cut from real tokenized text.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/speculative_decoder.h"
#include "model/dsa_model.h"
#include "model/model_loader.h"
#include "model/mtp_layer.h"
#include "model/sequence_runner.h"

namespace megactx::testing {

inline std::string default_model_dir() {
  return std::string(MEGACTX_SOURCE_DIR) + "/models/default";
}

struct LoadedModel {
  std::unique_ptr<LanguageModel> model;
  DsaModel* dsa = nullptr;
  std::unique_ptr<MtpLayer> mtp;
};

inline LoadedModel load_with_mtp(const std::string& dir) {
  LoadedModel m;
  ModelLoadOptions options;
  m.model = load_language_model(dir, options);
  m.dsa = dynamic_cast<DsaModel*>(m.model.get());
  EXPECT_NE(m.dsa, nullptr);
  m.mtp = MtpLayer::load(*m.dsa, dir);
  return m;
}

// The passkey prompt's token ids (real text through the default tokenizer).
inline std::vector<int32_t> text_tokens() {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/default_model/passkey_8k_ids.txt");
  std::stringstream text;
  text << file.rdbuf();
  std::string ids = text.str();
  while (!ids.empty() && (ids.back() == '\n' || ids.back() == ' ')) ids.pop_back();
  return parse_token_ids(ids);
}

// Greedy decoding without speculation, one token per forward (SequenceRunner).
inline std::vector<int32_t> plain_greedy(LanguageModel& model, const std::vector<int32_t>& prompt,
                                         int64_t new_tokens) {
  SequenceRunner runner(model, KvDType::F32, static_cast<int64_t>(prompt.size()) + new_tokens + 8);
  Tensor logits = runner.feed(prompt, false);
  std::vector<int32_t> out;
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const float* row = logits.data<float>();
    int32_t best = 0;
    for (int64_t v = 1; v < vocab; ++v) {
      if (row[v] > row[best]) best = static_cast<int32_t>(v);
    }
    out.push_back(best);
    if (i + 1 < new_tokens) logits = runner.feed(std::vector<int32_t>{best}, false);
  }
  return out;
}

}  // namespace megactx::testing

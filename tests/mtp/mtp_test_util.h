// Shared helpers of the MTP tests: the default model (models/default, which
// ships an MTP layer) and prompts cut from real tokenized text.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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
  m.mtp = m.model->load_mtp_layer(dir);
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

}  // namespace megactx::testing

#include "tokenizer/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/bounded_json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace megactx {
namespace {

using json = nlohmann::json;

// Decoders that keep bytes as the ByteLevel decoder does; the rest are refused.
bool parse_decoder(const json& spec, int depth = 0) {
  if (spec.is_null()) return false;
  if (depth > 32) fail("tokenizer.json: decoder Sequences nest too deeply");
  const std::string type = json_string(spec, "type", "decoder");
  if (type == "ByteLevel") return true;
  if (type == "Sequence") {
    bool byte_level = false;
    for (const auto& step : json_array(spec, "decoders", "Sequence decoder"))
      byte_level = parse_decoder(step, depth + 1) || byte_level;
    return byte_level;
  }
  fail("tokenizer.json: unsupported decoder type '{}'", type);
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& text) {
  json root;
  try {
    root = parse_json(text);
  } catch (const json::exception& error) {
    fail("tokenizer.json is not valid JSON: {}", error.what());
  }
  if (!root.is_object()) fail("tokenizer.json: the top level is not an object");
  model_ = std::make_unique<BpeModel>(json_object(root, "model", "tokenizer.json"));
  normalizer_ = make_normalizer(root.value("normalizer", json()));
  pre_tokenizer_ = make_pre_tokenizer(root.value("pre_tokenizer", json()));
  post_processor_ = make_post_processor(root.value("post_processor", json()));
  byte_level_decoder_ = parse_decoder(root.value("decoder", json()));

  end_id_ = model_->end_id();
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array()) fail("tokenizer.json: added_tokens is not an array");
    for (const auto& spec : root["added_tokens"]) {
      AddedToken token = parse_added_token(spec);
      if (added_by_id_.count(token.id)) continue;  // first definition of an id wins
      end_id_ = std::max(end_id_, token.id + 1);
      added_by_id_[token.id] = added_tokens_.size();
      added_by_content_.emplace(token.content, token.id);
      added_tokens_.push_back(std::move(token));
    }
  }
  // Ids the post-processor adds must exist, or encode would emit ids no
  // embedding row has.
  for (const auto* ids : {&post_processor_.prefix, &post_processor_.suffix})
    for (TokenId id : *ids)
      if (id >= end_id_)
        fail("tokenizer.json: post_processor adds id {}, outside the vocabulary [0, {})", id,
             end_id_);
  // HF matches special tokens first, then the others, each in file order.
  for (bool special : {true, false}) {
    for (const auto& token : added_tokens_) {
      if (token.special != special) continue;
      if (!token.normalized) {
        raw_matcher_.add(token, token.content);
      } else {
        std::string pattern = token.content;
        if (normalizer_) normalizer_->normalize(pattern);
        normalized_matcher_.add(token, std::move(pattern));
      }
    }
  }
  raw_matcher_.finalize();
  normalized_matcher_.finalize();
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json_text) {
  return std::make_unique<HfTokenizer>(tokenizer_json_text);
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  // A path to the file itself is accepted too.
  std::error_code error;
  const std::string path = std::filesystem::is_regular_file(model_dir, error)
                               ? model_dir
                               : model_dir + "/tokenizer.json";
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open {}", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  try {
    return from_json(buffer.str());
  } catch (const Error& error) {
    fail("{}: {}", path, error.what());
  }
}

const AddedToken* HfTokenizer::added(TokenId id) const {
  auto it = added_by_id_.find(id);
  return it == added_by_id_.end() ? nullptr : &added_tokens_[it->second];
}

std::vector<TokenId> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // HF takes only valid str; invalid bytes become U+FFFD first (from_utf8_lossy).
  std::string sanitized;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::sanitize(text);
    text = sanitized;
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = post_processor_.prefix;

  std::vector<TextSegment> raw_segments;
  raw_matcher_.split(text, raw_segments);
  for (const auto& segment : raw_segments) {
    if (segment.token >= 0) {
      ids.push_back(segment.token);
      continue;
    }
    const std::string_view part = text.substr(segment.begin, segment.end - segment.begin);
    if (part.empty()) continue;
    if (!normalizer_) {
      encode_normalized(part, ids);
    } else {
      std::string normalized(part);
      normalizer_->normalize(normalized);
      encode_normalized(normalized, ids);
    }
  }
  if (add_special_tokens)
    ids.insert(ids.end(), post_processor_.suffix.begin(), post_processor_.suffix.end());
  return ids;
}

void HfTokenizer::encode_normalized(std::string_view text, std::vector<TokenId>& ids) const {
  if (normalized_matcher_.empty()) {
    encode_model(text, ids);
    return;
  }
  std::vector<TextSegment> segments;
  normalized_matcher_.split(text, segments);
  for (const auto& segment : segments) {
    if (segment.token >= 0) {
      ids.push_back(segment.token);
    } else if (segment.end > segment.begin) {
      encode_model(text.substr(segment.begin, segment.end - segment.begin), ids);
    }
  }
}

void HfTokenizer::encode_model(std::string_view text, std::vector<TokenId>& ids) const {
  const bool raw_bytes = pre_tokenizer_.output_raw_bytes;
  auto encode_piece = [&](std::string_view piece) { model_->encode(piece, raw_bytes, ids); };
  if (pre_tokenizer_.root) {
    pre_tokenizer_.root->split(text, encode_piece);
  } else {
    encode_piece(text);
  }
}

std::string HfTokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  std::string out;
  if (byte_level_decoder_) {
    std::string bytes;
    for (TokenId id : ids) {
      if (skip_special_tokens && is_special(id)) continue;
      bytes += token_bytes(id);
    }
    return utf8::is_valid(bytes) ? bytes : utf8::sanitize(bytes);
  }
  // No decoder: HF joins the token strings with spaces.
  bool first = true;
  for (TokenId id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    const std::string token = id_to_token(id);
    if (token.empty() && !added(id) && !model_->id_to_token(id)) continue;
    if (!first) out += ' ';
    out += token;
    first = false;
  }
  return out;
}

std::optional<TokenId> HfTokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

std::string HfTokenizer::id_to_token(TokenId id) const {
  if (const AddedToken* token = added(id)) return token->content;
  const std::string* token = model_->id_to_token(id);
  return token ? *token : std::string();
}

bool HfTokenizer::is_special(TokenId id) const {
  const AddedToken* token = added(id);
  return token != nullptr && token->special;
}

std::string HfTokenizer::token_bytes(TokenId id) const {
  const std::string token = id_to_token(id);
  if (!byte_level_decoder_) return token;
  // Tokens spelled outside the byte alphabet (e.g. "<｜User｜>") keep their bytes.
  if (auto bytes = ByteLevelAlphabet::get().decode(token)) return *bytes;
  return token;
}

}  // namespace megactx

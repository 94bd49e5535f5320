// The BPE model of tokenizer.json: vocabulary, ranked merges, and the merge
// loop that turns one pre-tokenized piece into ids. Merging always applies the
// lowest-ranked adjacent pair (leftmost on ties), via a priority queue, so long
// pieces (runs of CJK, long numbers) stay O(n log n). Results of frequent
// pieces are cached.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.h"

namespace megactx {

// Heterogeneous-lookup hash so maps keyed by std::string accept string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using StringIdMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  void reserve(size_t count);
  void insert(TokenId left, TokenId right, Merge merge);  // first insert wins
  const Merge* find(TokenId left, TokenId right) const;
  size_t size() const { return size_; }

 private:
  static uint64_t key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }
  // Key and value side by side: one cache line per probe even for 150K merges.
  struct Entry {
    uint64_t key;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Entry> entries_;
  int shift_ = 64;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // Parses the "model" object (type BPE); throws megactx::Error when malformed.
  explicit BpeModel(const nlohmann::json& model);

  // Appends the ids of one piece. With raw_bytes the piece holds raw bytes that
  // stand for their byte-level characters (ByteLevel pre-tokenizer last);
  // otherwise it is spelled in the vocabulary's own characters.
  void encode(std::string_view piece, bool raw_bytes, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string* id_to_token(TokenId id) const;  // null when no such id
  TokenId end_id() const { return static_cast<TokenId>(id_to_token_.size()); }  // max id + 1
  size_t merge_count() const { return merges_.size(); }

 private:
  void merge_word(std::string_view piece, bool raw_bytes, std::vector<TokenId>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  MergeTable merges_;
  TokenId byte_ids_[256];  // id of each byte's byte-level character, -1 if absent
  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  // Short pieces are cached per thread (bpe.cpp); longer ones up to
  // kCacheMaxPieceBytes here, shared, until kCacheCapacity entries.
  uint64_t serial_ = 0;  // tells this model's entries in the per-thread cache apart
  static constexpr size_t kCacheCapacity = 1 << 17;
  static constexpr size_t kCacheMaxPieceBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_;
};

}  // namespace megactx

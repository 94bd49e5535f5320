#include "tokenizer/bpe.h"

#define XXH_INLINE_ALL  // header-only: megactx_tokenizer needs no xxhash link
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace megactx {

size_t StringHash::operator()(std::string_view s) const {
  return XXH3_64bits(s.data(), s.size());
}

void MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  shift_ = 60;
  while (capacity < count * 2) {
    capacity *= 2;
    --shift_;
  }
  entries_.assign(capacity, Entry{kEmpty, Merge{0, 0}});
  size_ = 0;
}

void MergeTable::insert(TokenId left, TokenId right, Merge merge) {
  if ((size_ + 1) * 2 > entries_.size()) {  // grow: rehash everything
    std::vector<Entry> old = std::move(entries_);
    reserve(std::max<size_t>(16, old.size()));
    for (const Entry& e : old)
      if (e.key != kEmpty)
        insert(static_cast<TokenId>(e.key >> 32), static_cast<TokenId>(e.key & 0xFFFFFFFFu),
               e.merge);
  }
  const uint64_t k = key(left, right);
  const size_t mask = entries_.size() - 1;
  for (size_t i = slot(k);; i = (i + 1) & mask) {
    if (entries_[i].key == k) return;
    if (entries_[i].key == kEmpty) {
      entries_[i] = Entry{k, merge};
      ++size_;
      return;
    }
  }
}

const MergeTable::Merge* MergeTable::find(TokenId left, TokenId right) const {
  if (entries_.empty()) return nullptr;
  const uint64_t k = key(left, right);
  const size_t mask = entries_.size() - 1;
  for (size_t i = slot(k);; i = (i + 1) & mask) {
    if (entries_[i].key == k) return &entries_[i].merge;
    if (entries_[i].key == kEmpty) return nullptr;
  }
}

namespace {

using json = nlohmann::json;

// A merge is "a b" (legacy) or ["a", "b"] (tokenizers >= 0.20).
std::pair<std::string, std::string> parse_merge(const json& merge, size_t index) {
  if (merge.is_string()) {
    const auto& text = merge.get_ref<const std::string&>();
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
      fail("tokenizer.json: merge {} '{}' is not two tokens separated by one space", index, text);
    return {text.substr(0, space), text.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  fail("tokenizer.json: merge {} is neither \"a b\" nor [\"a\", \"b\"]", index);
}

struct Symbol {
  TokenId id;
  int prev;
  int next;
  uint32_t length;  // bytes of the piece it covers; 0 once merged away
};

struct Candidate {
  int32_t rank;
  int position;
  TokenId merged;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : position > other.position;
  }
};

}  // namespace

namespace {

// Per-thread, direct-mapped cache of short pieces: no lock, one probe, inline
// storage. Slots carry the owning model's serial so models never mix.
struct ShortPieceSlot {
  uint64_t hash = 0;
  uint64_t model = 0;  // 0: empty
  uint8_t key_length = 0;
  uint8_t id_count = 0;
  char key[22];
  TokenId ids[8];
};
constexpr size_t kShortPieceSlots = 4096;
constexpr size_t kShortPieceMaxBytes = sizeof(ShortPieceSlot::key);
constexpr size_t kShortPieceMaxIds = sizeof(ShortPieceSlot::ids) / sizeof(TokenId);

ShortPieceSlot* short_piece_cache() {
  thread_local std::unique_ptr<ShortPieceSlot[]> slots(new ShortPieceSlot[kShortPieceSlots]);
  return slots.get();
}

std::atomic<uint64_t> next_model_serial{1};

}  // namespace

BpeModel::BpeModel(const json& model) {
  const std::string type = model.is_object() && model.contains("type") && model["type"].is_string()
                               ? model["type"].get<std::string>()
                               : "BPE";
  if (type != "BPE") fail("tokenizer.json: unsupported model type '{}' (only BPE)", type);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail("tokenizer.json: BPE '{}' is not supported", key);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    fail("tokenizer.json: BPE dropout is not supported for inference");

  const json& vocab = json_object(model, "vocab", "model");
  vocab_.reserve(vocab.size());
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer())
      fail("tokenizer.json: vocab id of '{}' is not an integer", token);
    const int64_t id = value.get<int64_t>();
    // Ids are dense in real files; a bound keeps a bad file from allocating gigabytes.
    if (id < 0 || id >= static_cast<int64_t>(16 * vocab.size() + 65536))
      fail("tokenizer.json: vocab id {} of '{}' is out of range", id, token);
    vocab_[token] = static_cast<TokenId>(id);
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(id + 1);
      has_id_.resize(id + 1, false);
    }
    id_to_token_[id] = token;
    has_id_[id] = true;
  }

  const json& merges = json_array(model, "merges", "model");
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto [left, right] = parse_merge(merges[i], i);
    const auto a = token_to_id(left), b = token_to_id(right), merged = token_to_id(left + right);
    if (!a || !b) fail("tokenizer.json: merge {} uses a token missing from the vocab", i);
    if (!merged)
      fail("tokenizer.json: merge {} makes '{}{}', missing from the vocab", i, left, right);
    merges_.insert(*a, *b, {static_cast<int32_t>(i), *merged});
  }

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    unk_id_ = token_to_id(model["unk_token"].get<std::string>());
    if (!unk_id_) fail("tokenizer.json: unk_token is not in the vocab");
  }
  fuse_unk_ = json_bool(model, "fuse_unk", false);
  byte_fallback_ = json_bool(model, "byte_fallback", false);
  ignore_merges_ = json_bool(model, "ignore_merges", false);
  serial_ = next_model_serial.fetch_add(1);

  const auto& alphabet = ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b)
    byte_ids_[b] = token_to_id(alphabet.symbol(static_cast<unsigned char>(b))).value_or(-1);
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::encode(std::string_view piece, bool raw_bytes, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  // One byte (spaces, punctuation, newlines): its byte-level symbol is the token.
  if (piece.size() == 1 && raw_bytes && byte_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t hash = XXH3_64bits(piece.data(), piece.size());
  // Level 1: this thread's short-piece cache.
  ShortPieceSlot* slot = nullptr;
  if (piece.size() <= kShortPieceMaxBytes) {
    slot = &short_piece_cache()[hash & (kShortPieceSlots - 1)];
    if (slot->model == serial_ && slot->hash == hash && slot->key_length == piece.size() &&
        std::memcmp(slot->key, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), slot->ids, slot->ids + slot->id_count);
      return;
    }
  }
  // Level 2: the shared cache, for pieces too long for level 1.
  const bool shared = slot == nullptr && piece.size() <= kCacheMaxPieceBytes;
  if (shared) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(piece, raw_bytes, out);
  const size_t count = out.size() - first;
  if (slot != nullptr && count <= kShortPieceMaxIds) {
    slot->model = serial_;
    slot->hash = hash;
    slot->key_length = static_cast<uint8_t>(piece.size());
    slot->id_count = static_cast<uint8_t>(count);
    std::memcpy(slot->key, piece.data(), piece.size());
    std::copy(out.begin() + first, out.end(), slot->ids);
  } else if (shared || slot != nullptr) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity)
      cache_.emplace(std::string(piece), std::vector<TokenId>(out.begin() + first, out.end()));
  }
}

void BpeModel::merge_word(std::string_view piece, bool raw_bytes, std::vector<TokenId>& out) const {
  std::string mapped;  // the piece in vocabulary characters, built only when needed
  if (raw_bytes && (ignore_merges_ || byte_fallback_))
    ByteLevelAlphabet::get().encode(piece, mapped);
  const std::string_view word = raw_bytes && !mapped.empty() ? std::string_view(mapped) : piece;
  if (ignore_merges_) {
    if (auto id = token_to_id(raw_bytes ? std::string_view(mapped) : piece)) {
      out.push_back(*id);
      return;
    }
  }

  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto push = [&](TokenId id, uint32_t length) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, -1, length});
  };
  auto push_unknown = [&](uint32_t length) {
    if (!unk_id_) return;  // HF drops characters it cannot spell when there is no unk
    if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_id_) {
      symbols.back().length += length;
      return;
    }
    push(*unk_id_, length);
  };

  if (raw_bytes && !byte_fallback_) {
    for (char ch : piece) {
      const TokenId id = byte_ids_[static_cast<unsigned char>(ch)];
      if (id >= 0) {
        push(id, 1);
      } else {
        push_unknown(1);
      }
    }
  } else {
    size_t pos = 0;
    while (pos < word.size()) {
      size_t length = utf8::sequence_length(word, pos);
      if (length == 0) length = 1;  // cannot happen for sanitized input
      const std::string_view character = word.substr(pos, length);
      if (auto id = token_to_id(character)) {
        push(*id, static_cast<uint32_t>(length));
      } else if (byte_fallback_) {
        // <0xAB> tokens for each byte, or unk if any of them is missing.
        std::vector<TokenId> bytes;
        for (char ch : character) {
          char name[8];
          std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(ch));
          if (auto byte_id = token_to_id(name)) bytes.push_back(*byte_id);
        }
        if (bytes.size() == character.size()) {
          for (TokenId id : bytes) push(id, 1);
        } else {
          push_unknown(static_cast<uint32_t>(length));
        }
      } else {
        push_unknown(static_cast<uint32_t>(length));
      }
      pos += length;
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) symbols[i].next = static_cast<int>(i + 1);

  // Min-heap of candidate merges on (rank, position), kept across calls.
  thread_local std::vector<Candidate> queue;
  queue.clear();
  const auto later = std::greater<>();
  auto push_candidate = [&](const Candidate& c) {
    queue.push_back(c);
    std::push_heap(queue.begin(), queue.end(), later);
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const auto* merge = merges_.find(symbols[i].id, symbols[i + 1].id))
      queue.push_back({merge->rank, static_cast<int>(i), merge->merged});
  std::make_heap(queue.begin(), queue.end(), later);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.position];
    if (left.length == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale candidate: one side changed since it was queued.
    const auto* merge = merges_.find(left.id, right.id);
    if (merge == nullptr || merge->merged != top.merged) continue;
    left.id = top.merged;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.position;
    if (left.prev >= 0)
      if (const auto* m = merges_.find(symbols[left.prev].id, left.id))
        push_candidate({m->rank, left.prev, m->merged});
    if (left.next >= 0)
      if (const auto* m = merges_.find(left.id, symbols[left.next].id))
        push_candidate({m->rank, top.position, m->merged});
  }
  for (int i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace megactx

#include "cache/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace megactx {

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::vector<int32_t> tokens;  // [page_size] ids of this page (empty for the root)
  int32_t page = -1;
  int64_t depth = 0;  // pages from the root to this node, itself included
  uint64_t hash = 0;  // of `tokens`, the key in the parent's children
  int64_t lock = 0;   // requests whose path runs through this node
  uint64_t last_access = 0;
  std::unordered_multimap<uint64_t, Node*> children;
  size_t slot = 0;  // index in PrefixCache::nodes_
  uint64_t id = 0;  // stable key in PrefixCache::lru_
  bool in_lru = false;
};

namespace {

uint64_t hash_page(std::span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size_bytes());
}

}  // namespace

PrefixCache::PrefixCache(PageAllocator& allocator, int64_t page_size)
    : allocator_(allocator), page_size_(page_size), root_(new Node) {
  MEGACTX_CHECK(page_size > 0, "invalid page size {}", page_size);
}

PrefixCache::~PrefixCache() {
  delete root_;
}

int64_t PrefixCache::depth(const Node* node) {
  return node->depth;
}

std::vector<int32_t> PrefixCache::path_pages(const Node* node) const {
  std::vector<int32_t> pages(static_cast<size_t>(node->depth));
  for (; node != root_; node = node->parent)
    pages[static_cast<size_t>(node->depth - 1)] = node->page;
  return pages;
}

PrefixCache::Node* PrefixCache::find_child(Node* parent, std::span<const int32_t> page_tokens,
                                           uint64_t hash) const {
  auto [begin, end] = parent->children.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    if (std::equal(page_tokens.begin(), page_tokens.end(), it->second->tokens.begin())) {
      return it->second;
    }
  }
  return nullptr;
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens) {
  Match result;
  Node* node = root_;
  const uint64_t now = ++clock_;
  const int64_t max_pages = static_cast<int64_t>(tokens.size()) / page_size_;
  for (int64_t i = 0; i < max_pages; ++i) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), page_size_);
    Node* child = find_child(node, page_tokens, hash_page(page_tokens));
    if (child == nullptr) break;
    touch(child, now);
    allocator_.add_ref(child->page);
    result.pages.push_back(child->page);
    node = child;
  }
  lock(node);
  result.node = node;
  result.tokens = static_cast<int64_t>(result.pages.size()) * page_size_;
  queried_tokens_ += static_cast<int64_t>(tokens.size());
  hit_tokens_ += result.tokens;
  return result;
}

PrefixCache::Node* PrefixCache::insert(Node* node, std::span<const int32_t> tokens,
                                       std::vector<int32_t>& pages, int64_t num_full_pages) {
  MEGACTX_CHECK(static_cast<int64_t>(tokens.size()) >= num_full_pages * page_size_ &&
                    static_cast<int64_t>(pages.size()) >= num_full_pages,
                "prefix cache insert of {} pages with {} tokens and {} pages", num_full_pages,
                tokens.size(), pages.size());
  Node* start = node;
  const uint64_t now = ++clock_;
  for (int64_t i = node->depth; i < num_full_pages; ++i) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), page_size_);
    const uint64_t hash = hash_page(page_tokens);
    int32_t& page = pages[static_cast<size_t>(i)];
    Node* child = find_child(node, page_tokens, hash);
    if (child != nullptr) {
      if (child->page != page) {
        // Computed twice (two requests prefilled the same prefix at once):
        // keep the tree's copy, give the caller's back.
        allocator_.add_ref(child->page);
        allocator_.release(page);
        page = child->page;
      }
    } else {
      auto owned = std::make_unique<Node>();
      child = owned.get();
      child->parent = node;
      child->tokens.assign(page_tokens.begin(), page_tokens.end());
      child->page = page;
      child->depth = node->depth + 1;
      child->hash = hash;
      child->slot = nodes_.size();
      child->id = next_id_++;
      by_id_.emplace(child->id, child);
      nodes_.push_back(std::move(owned));
      node->children.emplace(hash, child);
      update_lru(node);  // no longer a leaf
      allocator_.add_ref(page);
      ++num_nodes_;
    }
    touch(child, now);
    node = child;
  }
  if (node != start) {
    lock(node);
    unlock(start);
  }
  return node;
}

void PrefixCache::touch(Node* node, uint64_t now) {
  if (node->in_lru) {
    lru_.erase({node->last_access, node->id});
    node->in_lru = false;
  }
  node->last_access = now;
  update_lru(node);
}

void PrefixCache::update_lru(Node* node) {
  if (node == root_) return;
  const bool candidate = node->lock == 0 && node->children.empty();
  if (candidate == node->in_lru) return;
  if (candidate) {
    lru_.emplace(node->last_access, node->id);
  } else {
    lru_.erase({node->last_access, node->id});
  }
  node->in_lru = candidate;
}

void PrefixCache::lock(Node* node) {
  for (; node != root_; node = node->parent) {
    if (node->lock++ == 0) {
      ++locked_nodes_;
      update_lru(node);
    }
  }
}

void PrefixCache::unlock(Node* node) {
  for (; node != root_; node = node->parent) {
    MEGACTX_CHECK(node->lock > 0, "prefix cache: unlock of an unlocked node");
    if (--node->lock == 0) {
      --locked_nodes_;
      update_lru(node);
    }
  }
}

void PrefixCache::remove_leaf(Node* node) {
  Node* parent = node->parent;
  auto [begin, end] = parent->children.equal_range(node->hash);
  for (auto it = begin; it != end; ++it) {
    if (it->second == node) {
      parent->children.erase(it);
      break;
    }
  }
  allocator_.release(node->page);
  if (node->in_lru) lru_.erase({node->last_access, node->id});
  by_id_.erase(node->id);
  // Swap-remove from the node list.
  const size_t slot = node->slot;
  if (slot + 1 != nodes_.size()) {
    std::swap(nodes_[slot], nodes_.back());
    nodes_[slot]->slot = slot;
  }
  nodes_.pop_back();
  --num_nodes_;
}

int64_t PrefixCache::evict(int64_t pages) {
  int64_t freed = 0;
  while (freed < pages && !lru_.empty()) {
    Node* node = by_id_.at(lru_.begin()->second);
    Node* parent = node->parent;
    remove_leaf(node);
    ++freed;
    update_lru(parent);  // may have become an unlocked leaf
  }
  return freed;
}

void PrefixCache::check_integrity(
    std::vector<int32_t>& holders,
    const std::unordered_map<const Node*, int64_t>& request_locks) const {
  MEGACTX_CHECK(static_cast<int64_t>(nodes_.size()) == num_nodes_,
                "integrity: prefix cache counts {} nodes but holds {}", num_nodes_, nodes_.size());
  MEGACTX_CHECK(root_->lock == 0 && root_->depth == 0, "integrity: prefix cache root changed");
  // Expected locks: requests at a node lock it and every ancestor.
  std::unordered_map<const Node*, int64_t> expected;
  for (const auto& [node, count] : request_locks) {
    for (const Node* n = node; n != root_; n = n->parent) expected[n] += count;
  }
  std::vector<char> page_seen(holders.size(), 0);
  int64_t locked = 0;
  for (size_t slot = 0; slot < nodes_.size(); ++slot) {
    const Node* node = nodes_[slot].get();
    MEGACTX_CHECK(node->slot == slot, "integrity: prefix cache node slot mismatch");
    MEGACTX_CHECK(node->page >= 0 && node->page < static_cast<int32_t>(holders.size()),
                  "integrity: prefix cache node holds page {} out of range", node->page);
    MEGACTX_CHECK(!page_seen[static_cast<size_t>(node->page)],
                  "integrity: KV page {} in two prefix cache nodes", node->page);
    page_seen[static_cast<size_t>(node->page)] = 1;
    ++holders[static_cast<size_t>(node->page)];
    const Node* parent = node->parent;
    MEGACTX_CHECK(parent != nullptr && node->depth == parent->depth + 1,
                  "integrity: prefix cache node depth {} under parent depth {}", node->depth,
                  parent ? parent->depth : -1);
    MEGACTX_CHECK(static_cast<int64_t>(node->tokens.size()) == page_size_ &&
                      node->hash == hash_page(node->tokens),
                  "integrity: prefix cache node tokens do not match their key");
    bool linked = false;
    auto [begin, end] = parent->children.equal_range(node->hash);
    for (auto it = begin; it != end; ++it) linked |= it->second == node;
    MEGACTX_CHECK(linked, "integrity: prefix cache node missing from its parent");
    auto it = expected.find(node);
    const int64_t want = it == expected.end() ? 0 : it->second;
    MEGACTX_CHECK(node->lock == want, "integrity: prefix cache node (page {}) lock {} but {} users",
                  node->page, node->lock, want);
    if (node->lock > 0) ++locked;
  }
  MEGACTX_CHECK(locked == locked_nodes_, "integrity: prefix cache counts {} locked nodes, found {}",
                locked_nodes_, locked);
  // The LRU set holds exactly the unlocked leaves, keyed by their last access.
  size_t leaves = 0;
  for (const auto& node : nodes_) {
    const bool candidate = node->lock == 0 && node->children.empty();
    MEGACTX_CHECK(
        candidate == node->in_lru && (!candidate || lru_.contains({node->last_access, node->id})),
        "integrity: prefix cache LRU entry of page {} is wrong", node->page);
    leaves += candidate;
  }
  MEGACTX_CHECK(leaves == lru_.size() && by_id_.size() == nodes_.size(),
                "integrity: prefix cache LRU holds {} entries for {} evictable leaves", lru_.size(),
                leaves);
}

}  // namespace megactx

#include "cache/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace megactx {

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::vector<int32_t> tokens;  // [page_size] ids of this page (empty for the root)
  int32_t page = -1;            // device page (-1: only on the host)
  int32_t host_page = -1;       // host tier page (-1: none)
  int64_t device_children = 0;  // children with a device page
  int64_t depth = 0;            // pages from the root to this node, itself included
  uint64_t hash = 0;            // of `tokens`, the key in the parent's children
  int64_t lock = 0;             // requests whose path runs through this node
  uint64_t last_access = 0;
  std::unordered_multimap<uint64_t, Node*> children;
  size_t slot = 0;  // index in PrefixCache::nodes_
  uint64_t id = 0;  // stable key in PrefixCache::lru_ / host_lru_
  bool in_lru = false;
  bool in_host_lru = false;
  // Computed under weights that were replaced since (retire()): never matched
  // and never shared again; dropped once no request holds it.
  bool stale = false;
};

namespace {

uint64_t hash_page(std::span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size_bytes());
}

// An unlocked leaf of the device subtree: the device tier may evict it.
bool device_candidate(const PrefixCache::Node* node) {
  return node->page >= 0 && node->lock == 0 && node->device_children == 0;
}

// A host page the host tier may drop: a backup of an unlocked device node, or
// an (always unlocked) host-only leaf.
bool host_candidate(const PrefixCache::Node* node) {
  return node->host_page >= 0 && node->lock == 0 && (node->page >= 0 || node->children.empty());
}

}  // namespace

PrefixCache::PrefixCache(PageAllocator& allocator, int64_t page_size, HostKvTier* host_tier,
                         int rank)
    : allocator_(allocator),
      page_size_(page_size),
      host_tier_(host_tier),
      rank_(rank),
      root_(new Node) {
  MEGACTX_CHECK(page_size > 0, "invalid page size {}", page_size);
  MEGACTX_CHECK(rank >= 0 && rank < allocator.ranks() &&
                    (host_tier == nullptr || host_tier->allocator().ranks() == allocator.ranks()),
                "prefix cache of rank {} over {} ranks{}", rank, allocator.ranks(),
                host_tier != nullptr ? " with a host tier" : "");
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
    if (!it->second->stale &&
        std::equal(page_tokens.begin(), page_tokens.end(), it->second->tokens.begin())) {
      return it->second;
    }
  }
  return nullptr;
}

int64_t PrefixCache::cached_prefix_tokens(std::span<const int32_t> tokens) const {
  const Node* cursor = root_;
  int64_t pages = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()) / page_size_; ++i) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), page_size_);
    cursor = find_child(const_cast<Node*>(cursor), page_tokens, hash_page(page_tokens));
    if (cursor == nullptr) break;
    ++pages;
  }
  return pages * page_size_;
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens) {
  Match result;
  Node* node = root_;  // deepest matched node with a device page
  Node* cursor = root_;
  std::vector<Node*> on_host;  // the matched nodes past `node`, host-only
  const uint64_t now = ++clock_;
  const int64_t max_pages = static_cast<int64_t>(tokens.size()) / page_size_;
  for (int64_t i = 0; i < max_pages; ++i) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), page_size_);
    Node* child = find_child(cursor, page_tokens, hash_page(page_tokens));
    if (child == nullptr) break;
    cursor = child;
    MEGACTX_CHECK(on_host.empty() || child->page < 0,
                  "prefix cache: a device page below a host-only one");
    if (child->page < 0) {
      on_host.push_back(child);
      continue;
    }
    touch(child, now);
    allocator_.add_ref(child->page);
    result.pages.push_back(child->page);
    node = child;
  }
  if (!on_host.empty()) {
    // The whole matched path stays locked while device pages are found for
    // its host part, so evictions for them take other pages.
    lock(on_host.back());
    for (Node* host_node : on_host) {
      if (!load_from_host(host_node)) break;
      touch(host_node, now);
      allocator_.add_ref(host_node->page);
      result.pages.push_back(host_node->page);
      host_hit_tokens_ += page_size_;
      node = host_node;
    }
    lock(node);
    unlock(on_host.back());
  } else {
    lock(node);
  }
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
  MEGACTX_CHECK(node == root_ || node->page >= 0, "prefix cache insert below a host-only node");
  Node* start = node;
  const uint64_t now = ++clock_;
  for (int64_t i = node->depth; i < num_full_pages; ++i) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), page_size_);
    const uint64_t hash = hash_page(page_tokens);
    int32_t& page = pages[static_cast<size_t>(i)];
    Node* child = find_child(node, page_tokens, hash);
    if (child != nullptr && child->page < 0) {
      // A page the host tier holds, computed again: the caller's copy
      // becomes its device page (the host copy stays a valid backup).
      child->page = page;
      allocator_.add_ref(page);
      ++device_nodes_;
      ++node->device_children;
      update_lru(node);
    } else if (child != nullptr) {
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
      ++node->device_children;
      update_lru(node);  // no longer a leaf
      allocator_.add_ref(page);
      ++num_nodes_;
      ++device_nodes_;
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
  if (node->in_host_lru) {
    host_lru_.erase({node->last_access, node->id});
    node->in_host_lru = false;
  }
  node->last_access = now;
  update_lru(node);
}

void PrefixCache::update_lru(Node* node) {
  if (node == root_) return;
  const bool candidate = device_candidate(node);
  if (candidate != node->in_lru) {
    if (candidate) {
      lru_.emplace(node->last_access, node->id);
    } else {
      lru_.erase({node->last_access, node->id});
    }
    node->in_lru = candidate;
  }
  const bool host = host_candidate(node);
  if (host != node->in_host_lru) {
    if (host) {
      host_lru_.emplace(node->last_access, node->id);
    } else {
      host_lru_.erase({node->last_access, node->id});
    }
    node->in_host_lru = host;
  }
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
  MEGACTX_CHECK(node->children.empty() && node->lock == 0,
                "prefix cache: removal of a node with children or users");
  Node* parent = node->parent;
  auto [begin, end] = parent->children.equal_range(node->hash);
  for (auto it = begin; it != end; ++it) {
    if (it->second == node) {
      parent->children.erase(it);
      break;
    }
  }
  if (node->page >= 0) {
    allocator_.release(node->page);
    --device_nodes_;
    --parent->device_children;
  }
  if (node->host_page >= 0) {
    host_tier_->allocator().release(node->host_page);
    --host_nodes_;
  }
  if (node->in_lru) lru_.erase({node->last_access, node->id});
  if (node->in_host_lru) host_lru_.erase({node->last_access, node->id});
  by_id_.erase(node->id);
  // Swap-remove from the node list.
  const size_t slot = node->slot;
  if (slot + 1 != nodes_.size()) {
    std::swap(nodes_[slot], nodes_.back());
    nodes_[slot]->slot = slot;
  }
  nodes_.pop_back();
  --num_nodes_;
  update_lru(parent);  // may have become a candidate of either tier
}

void PrefixCache::remove_subtree(Node* node) {
  // Iteratively, leaf first: a long host-only chain must not recurse deeply.
  std::vector<Node*> stack{node};
  while (!stack.empty()) {
    Node* top = stack.back();
    if (top->children.empty()) {
      stack.pop_back();
      remove_leaf(top);
    } else {
      stack.push_back(top->children.begin()->second);
    }
  }
}

bool PrefixCache::save_to_host(Node* node) {
  if (node->host_page < 0) {
    std::optional<int32_t> host_page = host_tier_->allocator().allocate(rank_);
    if (!host_page && evict_host(1) == 1) host_page = host_tier_->allocator().allocate(rank_);
    if (!host_page) return false;
    // Copied before the device page is released, so before anything reuses it.
    const int32_t device_pages[] = {node->page};
    const int32_t host_pages[] = {*host_page};
    host_tier_->save(device_pages, host_pages);
    node->host_page = *host_page;
    ++host_nodes_;
  }
  allocator_.release(node->page);
  node->page = -1;
  --device_nodes_;
  --node->parent->device_children;
  update_lru(node);
  update_lru(node->parent);
  return true;
}

int64_t PrefixCache::evict(int64_t pages) {
  int64_t freed = 0;
  while (freed < pages && !lru_.empty()) {
    Node* node = by_id_.at(lru_.begin()->second);
    if (host_tier_ == nullptr || !save_to_host(node)) {
      // Its subtree below is host-only (it is a device leaf), so it goes too.
      remove_subtree(node);
    }
    ++freed;
  }
  return freed;
}

int64_t PrefixCache::evict_host(int64_t pages) {
  int64_t freed = 0;
  while (freed < pages && !host_lru_.empty()) {
    Node* node = by_id_.at(host_lru_.begin()->second);
    if (node->page >= 0) {
      // The device still holds it: drop the backup only.
      host_tier_->allocator().release(node->host_page);
      node->host_page = -1;
      --host_nodes_;
      update_lru(node);
    } else {
      remove_leaf(node);
    }
    ++freed;
  }
  return freed;
}

bool PrefixCache::load_from_host(Node* node) {
  std::optional<int32_t> page = allocator_.allocate(rank_);
  if (!page && evict(1) == 1) page = allocator_.allocate(rank_);
  if (!page) return false;
  const int32_t host_pages[] = {node->host_page};
  const int32_t device_pages[] = {*page};
  host_tier_->load(host_pages, device_pages);
  node->page = *page;  // the allocation's reference is the tree's
  ++device_nodes_;
  ++node->parent->device_children;
  update_lru(node);
  update_lru(node->parent);
  return true;
}

void PrefixCache::flush() {
  // Every unlocked node hangs in a subtree whose root's parent is locked (or
  // the root); locked nodes stay.
  std::vector<Node*> tops;
  for (const auto& node : nodes_) {
    if (node->lock == 0 && (node->parent == root_ || node->parent->lock > 0)) {
      tops.push_back(node.get());
    }
  }
  for (Node* top : tops) remove_subtree(top);
}

void PrefixCache::retire() {
  flush();
  for (const auto& node : nodes_) node->stale = true;
}

void PrefixCache::check_integrity(std::vector<int32_t>& holders,
                                  const std::unordered_map<const Node*, int64_t>& request_locks,
                                  std::vector<int32_t>* tier_holders) const {
  MEGACTX_CHECK(static_cast<int64_t>(nodes_.size()) == num_nodes_,
                "integrity: prefix cache counts {} nodes but holds {}", num_nodes_, nodes_.size());
  MEGACTX_CHECK(root_->lock == 0 && root_->depth == 0, "integrity: prefix cache root changed");
  // Expected locks: requests at a node lock it and every ancestor.
  std::unordered_map<const Node*, int64_t> expected;
  for (const auto& [node, count] : request_locks) {
    for (const Node* n = node; n != root_; n = n->parent) expected[n] += count;
  }
  std::vector<char> page_seen(holders.size(), 0);
  const int64_t host_pages = host_tier_ ? host_tier_->num_pages() : 0;
  std::vector<int32_t> host_holders(static_cast<size_t>(host_pages), 0);
  int64_t locked = 0, on_device = 0, on_host = 0;
  std::unordered_map<const Node*, int64_t> device_children;
  for (size_t slot = 0; slot < nodes_.size(); ++slot) {
    const Node* node = nodes_[slot].get();
    MEGACTX_CHECK(node->slot == slot, "integrity: prefix cache node slot mismatch");
    MEGACTX_CHECK(node->page >= 0 || node->host_page >= 0,
                  "integrity: prefix cache node with neither a device nor a host page");
    if (node->page >= 0) {
      MEGACTX_CHECK(node->page < static_cast<int32_t>(holders.size()),
                    "integrity: prefix cache node holds page {} out of range", node->page);
      MEGACTX_CHECK(!page_seen[static_cast<size_t>(node->page)],
                    "integrity: KV page {} in two prefix cache nodes", node->page);
      page_seen[static_cast<size_t>(node->page)] = 1;
      ++holders[static_cast<size_t>(node->page)];
      ++on_device;
      ++device_children[node->parent];
      MEGACTX_CHECK(node->parent == root_ || node->parent->page >= 0,
                    "integrity: device page {} below a host-only node", node->page);
    }
    if (node->host_page >= 0) {
      MEGACTX_CHECK(node->host_page < host_pages,
                    "integrity: prefix cache node holds host page {} out of range [0, {})",
                    node->host_page, host_pages);
      MEGACTX_CHECK(++host_holders[static_cast<size_t>(node->host_page)] == 1,
                    "integrity: host KV page {} in two prefix cache nodes", node->host_page);
      ++on_host;
    }
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
    MEGACTX_CHECK(node->lock == 0 || node->page >= 0,
                  "integrity: a locked prefix cache node has no device page");
    if (node->lock > 0) ++locked;
  }
  MEGACTX_CHECK(locked == locked_nodes_, "integrity: prefix cache counts {} locked nodes, found {}",
                locked_nodes_, locked);
  MEGACTX_CHECK(on_device == device_nodes_ && on_host == host_nodes_,
                "integrity: prefix cache counts {} device / {} host pages, found {} / {}",
                device_nodes_, host_nodes_, on_device, on_host);
  MEGACTX_CHECK(host_tier_ != nullptr || on_host == 0,
                "integrity: host pages in a prefix cache without a host tier");
  // Both LRU sets hold exactly their candidates, keyed by their last access.
  size_t leaves = 0, host_candidates = 0;
  for (const auto& node : nodes_) {
    const int64_t children = device_children.contains(node.get()) ? device_children[node.get()] : 0;
    MEGACTX_CHECK(node->device_children == children,
                  "integrity: prefix cache node counts {} device children, has {}",
                  node->device_children, children);
    const bool candidate = device_candidate(node.get());
    MEGACTX_CHECK(
        candidate == node->in_lru && (!candidate || lru_.contains({node->last_access, node->id})),
        "integrity: prefix cache LRU entry of page {} is wrong", node->page);
    leaves += candidate;
    const bool host = host_candidate(node.get());
    MEGACTX_CHECK(
        host == node->in_host_lru && (!host || host_lru_.contains({node->last_access, node->id})),
        "integrity: prefix cache host LRU entry of host page {} is wrong", node->host_page);
    host_candidates += host;
  }
  MEGACTX_CHECK(leaves == lru_.size() && host_candidates == host_lru_.size() &&
                    by_id_.size() == nodes_.size(),
                "integrity: prefix cache LRU holds {} / {} entries for {} / {} candidates",
                lru_.size(), host_lru_.size(), leaves, host_candidates);
  MEGACTX_CHECK(
      root_->device_children == (device_children.contains(root_) ? device_children[root_] : 0),
      "integrity: prefix cache root counts {} device children", root_->device_children);
  if (host_tier_ == nullptr) return;
  if (tier_holders == nullptr) {
    host_tier_->allocator().check_integrity(host_holders);
    return;
  }
  tier_holders->resize(host_holders.size(), 0);
  for (size_t page = 0; page < host_holders.size(); ++page)
    (*tier_holders)[page] += host_holders[page];
}

}  // namespace megactx

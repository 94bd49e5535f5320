// PrefixCache: a radix tree over full KV pages of token ids. Every node is one
// page: the `page_size` token ids it holds and the physical page whose latent
// and indexer entries (all layers) were computed for exactly that prefix. A
// request that starts with cached pages reuses them instead of recomputing.
//
// Ownership: the tree holds one allocator reference per node; a request that
// uses a node holds its own page reference and *locks* the path from the root
// to its deepest node (locks count requests). Unlocked nodes can only have
// unlocked descendants, so all of them can be evicted leaf first; eviction
// picks the least recently used unlocked leaf.
//
// Partial pages are never shared, so no copy-on-write is needed.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/page_allocator.h"

namespace megactx {

class PrefixCache {
 public:
  struct Node;

  struct Match {
    std::vector<int32_t> pages;  // one per matched page, referenced for the caller
    Node* node = nullptr;        // deepest matched node, locked for the caller (root when none)
    int64_t tokens = 0;          // pages.size() * page_size
  };

  PrefixCache(PageAllocator& allocator, int64_t page_size);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  Node* root() const { return root_; }
  int64_t page_size() const { return page_size_; }

  // Longest cached prefix of whole pages of `tokens` (at most tokens.size()
  // / page_size pages). The caller owns the returned page references and the
  // lock on match.node; give both back with unlock() and allocator releases.
  // Counts tokens.size() as queried and the match as hits.
  Match match(std::span<const int32_t> tokens);

  // Adds the first `num_full_pages` pages of a sequence (`tokens` holds at
  // least num_full_pages * page_size ids, `pages` is its page table) below
  // `node`, the deepest node the caller has locked (which covers the first
  // depth(node) pages). Pages the tree already holds under another id replace
  // the caller's (its reference moves to the tree's page). Returns the new
  // deepest node, locked for the caller instead of `node`.
  Node* insert(Node* node, std::span<const int32_t> tokens, std::vector<int32_t>& pages,
               int64_t num_full_pages);

  void lock(Node* node);
  void unlock(Node* node);
  static int64_t depth(const Node* node);
  // Pages on the path from the root to `node`, root side first.
  std::vector<int32_t> path_pages(const Node* node) const;

  // Frees up to `pages` unlocked pages, least recently used leaves first.
  // Returns how many were freed.
  int64_t evict(int64_t pages);
  // Frees every unlocked page.
  void flush() { evict(num_nodes_); }

  int64_t cached_pages() const { return num_nodes_; }
  int64_t evictable_pages() const { return num_nodes_ - locked_nodes_; }
  int64_t queried_tokens() const { return queried_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }

  // Adds the tree's references to `holders[page]` and throws megactx::Error
  // on a broken invariant: a node's lock count must equal the number of
  // requests whose deepest node (`request_locks`: node -> requests) lies in
  // its subtree; parent/child links, depths and hashes must agree; a page
  // must appear in one node only.
  void check_integrity(std::vector<int32_t>& holders,
                       const std::unordered_map<const Node*, int64_t>& request_locks) const;

 private:
  Node* find_child(Node* parent, std::span<const int32_t> page_tokens, uint64_t hash) const;
  void remove_leaf(Node* node);
  // Marks a node used now (it leaves the LRU set: its caller locks it next).
  void touch(Node* node, uint64_t now);
  // Keeps `lru_` equal to the set of unlocked leaves.
  void update_lru(Node* node);

  PageAllocator& allocator_;
  int64_t page_size_;
  Node* root_;
  std::vector<std::unique_ptr<Node>> nodes_;  // every node but the root; Node::slot indexes it
  int64_t num_nodes_ = 0;
  int64_t locked_nodes_ = 0;
  uint64_t clock_ = 0;  // logical time for LRU
  // Unlocked leaves by (last access, node id): the eviction candidates, so
  // eviction costs O(log n) per page instead of a scan of the tree.
  std::set<std::pair<uint64_t, uint64_t>> lru_;
  std::unordered_map<uint64_t, Node*> by_id_;
  uint64_t next_id_ = 0;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace megactx

// PrefixCache: a radix tree over full KV pages of token ids. Every node is one
// page: the `page_size` token ids it holds and the physical page whose latent
// and indexer entries (all layers) were computed for exactly that prefix. A
// request that starts with cached pages reuses them instead of recomputing.
//
// Ownership: the tree holds one allocator reference per device page; a
// request that uses a node holds its own page reference and *locks* the path
// from the root to its deepest node (locks count requests). Unlocked nodes can
// only have unlocked descendants, so all of them can be evicted leaf first;
// eviction picks the least recently used unlocked leaf.
//
// With a HostKvTier (host_kv_tier.h) a node's page may also, or only, live in
// host memory: eviction copies a device page to a host page and keeps the node
// (host-only); a match that reaches host-only nodes copies them back into
// fresh device pages. The device-resident nodes form a subtree at the root
// (a device node's parent is on the device too), locked nodes are on the
// device, and the host tier evicts its own least recently used pages: host
// copies of device nodes, or host-only leaves (dropped from the tree).
//
// Partial pages are never shared, so no copy-on-write is needed.
//
// Data-parallel attention: one PrefixCache per rank, over that rank's range
// of the allocator's pages (page_allocator.h); a tree never holds another
// rank's page, since the pages of a sequence live where its rows run.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/host_kv_tier.h"
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

  // `host_tier` (optional) must outlive the cache. `rank`: the allocator's
  // data-parallel rank whose pages this tree holds (no host tier with
  // several ranks).
  PrefixCache(PageAllocator& allocator, int64_t page_size, HostKvTier* host_tier = nullptr,
              int rank = 0);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  Node* root() const { return root_; }
  int64_t page_size() const { return page_size_; }

  // Longest cached prefix of whole pages of `tokens` (at most tokens.size()
  // / page_size pages). The caller owns the returned page references and the
  // lock on match.node; give both back with unlock() and allocator releases.
  // Host-only pages of the prefix are copied back into device pages (free
  // ones, or ones evicted for them) while there are any; the match ends where
  // none can be had. Counts tokens.size() as queried and the match as hits.
  Match match(std::span<const int32_t> tokens);
  // The tokens match() would find now, on the device or in the host tier,
  // without taking or counting anything (data-parallel attention: which rank
  // holds a prefix).
  int64_t cached_prefix_tokens(std::span<const int32_t> tokens) const;

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

  // Frees up to `pages` unlocked device pages, least recently used leaves of
  // the device subtree first; with a host tier their contents move to host
  // pages first (while the tier has or can free one). Returns how many
  // device pages were freed.
  int64_t evict(int64_t pages);
  // Drops every unlocked node, from both tiers.
  void flush();
  // After a weight update: flush(), and the nodes running requests still
  // lock are never matched or shared again (their KV is of the old weights);
  // they go when their requests let them go.
  void retire();

  int64_t cached_pages() const { return device_nodes_; }     // device pages held by the tree
  int64_t host_cached_pages() const { return host_nodes_; }  // host pages held by the tree
  int64_t evictable_pages() const { return device_nodes_ - locked_nodes_; }
  int64_t queried_tokens() const { return queried_tokens_; }
  // Hit tokens from either tier, and of them those copied back from the host.
  int64_t hit_tokens() const { return hit_tokens_; }
  int64_t host_hit_tokens() const { return host_hit_tokens_; }

  // Adds the tree's references to `holders[page]` and throws megactx::Error
  // on a broken invariant: a node's lock count must equal the number of
  // requests whose deepest node (`request_locks`: node -> requests) lies in
  // its subtree; parent/child links, depths and hashes must agree; a page
  // must appear in one node only; the device nodes form a subtree at the
  // root holding every lock; the host tier's pages are the host-resident
  // nodes', each once. `tier_holders` (data-parallel attention: the trees of
  // every rank share one tier): this tree's host pages are counted there and
  // the caller checks the tier's allocator once.
  void check_integrity(std::vector<int32_t>& holders,
                       const std::unordered_map<const Node*, int64_t>& request_locks,
                       std::vector<int32_t>* tier_holders = nullptr) const;
  HostKvTier* host_tier() const { return host_tier_; }

 private:
  Node* find_child(Node* parent, std::span<const int32_t> page_tokens, uint64_t hash) const;
  // Removes a node without children, releasing its device and host pages.
  void remove_leaf(Node* node);
  // Removes `node` and its subtree (unlocked), leaf first.
  void remove_subtree(Node* node);
  // Moves an evicted device leaf to the host tier (false: no host page).
  bool save_to_host(Node* node);
  // Frees up to `pages` host pages, least recently used first.
  int64_t evict_host(int64_t pages);
  // Gives a host-only node of a match a device page and copies it back.
  bool load_from_host(Node* node);
  // Marks a node used now.
  void touch(Node* node, uint64_t now);
  // Keeps `lru_` equal to the unlocked leaves of the device subtree and
  // `host_lru_` to the host pages the tier may drop.
  void update_lru(Node* node);

  PageAllocator& allocator_;
  int64_t page_size_;
  HostKvTier* host_tier_;
  int rank_;
  Node* root_;
  std::vector<std::unique_ptr<Node>> nodes_;  // every node but the root; Node::slot indexes it
  int64_t num_nodes_ = 0;
  int64_t device_nodes_ = 0;  // nodes with a device page
  int64_t host_nodes_ = 0;    // nodes with a host page
  int64_t locked_nodes_ = 0;
  uint64_t clock_ = 0;  // logical time for LRU
  // Unlocked leaves by (last access, node id): the eviction candidates, so
  // eviction costs O(log n) per page instead of a scan of the tree.
  std::set<std::pair<uint64_t, uint64_t>> lru_;
  std::set<std::pair<uint64_t, uint64_t>> host_lru_;
  std::unordered_map<uint64_t, Node*> by_id_;
  uint64_t next_id_ = 0;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t host_hit_tokens_ = 0;
};

}  // namespace megactx

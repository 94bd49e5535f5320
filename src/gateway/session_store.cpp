#include "gateway/session_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "server/api_error.h"
#include "server/endpoints.h"

namespace megactx::gateway {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SessionStore::SessionStore(StoreLimits limits) : limits_(limits) {}

bool SessionStore::evictable(const StoredSession& stored, int64_t now) const {
  if (stored.in_flight.load() > 0) return false;
  if (stored.finished.load()) return true;
  const int64_t idle_ns = limits_.idle_seconds * 1'000'000'000;
  return limits_.idle_seconds > 0 && now - stored.last_active.load() >= idle_ns;
}

bool SessionStore::make_room(size_t bytes, int64_t sessions) {
  auto fits = [&] {
    return static_cast<int64_t>(sessions_.size()) + sessions <= limits_.max_sessions &&
           static_cast<int64_t>(total_bytes_ + bytes) <= limits_.max_bytes;
  };
  if (fits()) return true;
  const int64_t now = now_ns();
  // Candidates, the longest finished (or idle) first.
  std::vector<std::pair<int64_t, std::string>> candidates;
  for (const auto& [id, stored] : sessions_) {
    if (!evictable(*stored, now)) continue;
    const int64_t since =
        stored->finished.load() ? stored->finished_at.load() : stored->last_active.load();
    candidates.emplace_back(since, id);
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [since, id] : candidates) {
    if (fits()) break;
    total_bytes_ -= bytes_[id];
    bytes_.erase(id);
    sessions_.erase(id);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    ++evicted_;
  }
  return fits();
}

std::shared_ptr<StoredSession> SessionStore::open(const std::string& id,
                                                  const std::string& parent_id,
                                                  const std::string& rollout_id) {
  std::lock_guard lock(mutex_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    std::shared_ptr<StoredSession> stored = it->second;
    std::lock_guard session_lock(stored->mutex);
    const Session& session = stored->session;
    if (!parent_id.empty() && parent_id != session.parent_id)
      throw server::ApiError(400,
                             fmt::format("session '{}' has parent session '{}', not '{}'", id,
                                         session.parent_id, parent_id),
                             "X-Parent-Session-Id");
    if (!rollout_id.empty() && rollout_id != session.rollout_id)
      throw server::ApiError(400,
                             fmt::format("session '{}' belongs to rollout '{}', not '{}'", id,
                                         session.rollout_id, rollout_id),
                             "X-Rollout-Id");
    stored->last_active = now_ns();
    stored->in_flight += 1;
    if (stored->finished.exchange(false))
      stored->session.finished = false;  // a late turn reopens it
    return stored;
  }
  auto stored = std::make_shared<StoredSession>();
  Session& session = stored->session;
  session.id = id;
  session.parent_id = parent_id;
  session.rollout_id = rollout_id;
  if (session.rollout_id.empty() && !parent_id.empty()) {
    auto parent = sessions_.find(parent_id);
    if (parent != sessions_.end()) {
      std::lock_guard parent_lock(parent->second->mutex);
      session.rollout_id = parent->second->session.rollout_id;
    }
  }
  if (session.rollout_id.empty()) session.rollout_id = parent_id.empty() ? id : parent_id;
  session.created = server::unix_time_seconds();
  session.bytes = session.estimated_bytes();
  if (!make_room(session.bytes, 1)) {
    ++rejected_;
    throw server::ApiError(
        503, fmt::format("the gateway's session store is full ({} sessions, {} bytes; limits {} "
                         "and {}): collect and finish or delete sessions (POST /gateway/finish, "
                         "POST /gateway/delete)",
                         sessions_.size(), total_bytes_, limits_.max_sessions, limits_.max_bytes));
  }
  stored->last_active = now_ns();
  stored->in_flight += 1;
  sessions_[id] = stored;
  bytes_[id] = session.bytes;
  total_bytes_ += session.bytes;
  order_.push_back(id);
  return stored;
}

std::shared_ptr<StoredSession> SessionStore::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

void SessionStore::reserve(size_t extra) {
  std::lock_guard lock(mutex_);
  if (make_room(extra, 0)) return;
  ++rejected_;
  throw server::ApiError(
      503, fmt::format("the gateway's session store is full ({} bytes, limit {}): collect and "
                       "finish or delete sessions (POST /gateway/finish, POST /gateway/delete)",
                       total_bytes_, limits_.max_bytes));
}

void SessionStore::update_size(const std::shared_ptr<StoredSession>& stored) {
  size_t bytes = 0;
  std::string id;
  {
    std::lock_guard session_lock(stored->mutex);
    stored->session.bytes = stored->session.estimated_bytes();
    bytes = stored->session.bytes;
    id = stored->session.id;
  }
  stored->last_active = now_ns();
  std::lock_guard lock(mutex_);
  auto it = bytes_.find(id);
  if (it == bytes_.end()) return;  // deleted meanwhile
  total_bytes_ = total_bytes_ - it->second + bytes;
  it->second = bytes;
  make_room(0, 0);
}

std::vector<std::shared_ptr<StoredSession>> SessionStore::select(
    const std::string& rollout_id, const std::string& session_id) const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<StoredSession>> out;
  for (const std::string& id : order_) {
    const std::shared_ptr<StoredSession>& stored = sessions_.at(id);
    if (!session_id.empty()) {
      if (id == session_id) out.push_back(stored);
      continue;
    }
    std::lock_guard session_lock(stored->mutex);
    if (stored->session.rollout_id == rollout_id) out.push_back(stored);
  }
  return out;
}

std::vector<std::shared_ptr<StoredSession>> SessionStore::all() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<StoredSession>> out;
  for (const std::string& id : order_) out.push_back(sessions_.at(id));
  return out;
}

int64_t SessionStore::finish(const std::string& rollout_id, const std::string& session_id) {
  const auto selected = select(rollout_id, session_id);
  for (const auto& stored : selected) {
    {
      std::lock_guard session_lock(stored->mutex);
      stored->session.finished = true;
    }
    if (!stored->finished.exchange(true)) stored->finished_at = now_ns();
  }
  return static_cast<int64_t>(selected.size());
}

int64_t SessionStore::remove(const std::string& rollout_id, const std::string& session_id) {
  const auto selected = select(rollout_id, session_id);
  std::lock_guard lock(mutex_);
  int64_t removed = 0;
  for (const auto& stored : selected) {
    std::string id;
    {
      std::lock_guard session_lock(stored->mutex);
      id = stored->session.id;
    }
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second != stored) continue;
    total_bytes_ -= bytes_[id];
    bytes_.erase(id);
    sessions_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    ++removed;
  }
  return removed;
}

StoreStats SessionStore::stats() const {
  std::lock_guard lock(mutex_);
  return {static_cast<int64_t>(sessions_.size()), static_cast<int64_t>(total_bytes_), evicted_,
          rejected_};
}

}  // namespace megactx::gateway

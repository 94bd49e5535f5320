#include "engine/stop_strings.h"

#include <algorithm>

namespace megactx {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output)
    : include_(include_stop_in_output) {
  for (auto& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text) {
  Result result;
  if (stops_.empty()) {
    result.text = std::string(text);
    return result;
  }
  std::string buffer = std::move(held_);
  held_.clear();
  buffer.append(text);
  // The earliest match wins (on a tie, the longer stop string).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& stop : stops_) {
    const size_t at = buffer.find(stop);
    if (at == std::string::npos) continue;
    if (at < best || (at == best && stop.size() > best_stop->size())) {
      best = at;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    result.stopped = true;
    result.matched = *best_stop;
    result.text = buffer.substr(0, include_ ? best + best_stop->size() : best);
    return result;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, buffer.size());
    for (size_t length = longest; length > hold; --length) {
      if (buffer.compare(buffer.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  held_ = buffer.substr(buffer.size() - hold);
  buffer.resize(buffer.size() - hold);
  result.text = std::move(buffer);
  return result;
}

std::string StopStringMatcher::flush() {
  std::string text = std::move(held_);
  held_.clear();
  return text;
}

}  // namespace megactx

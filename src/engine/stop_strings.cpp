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

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";

// Length of the UTF-8 sequence a lead byte starts, 0 when it cannot lead.
size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether bytes [1, n) of a sequence are valid continuations (with the
// overlong/surrogate/range limits on the second byte).
bool valid_continuation(const unsigned char* s, size_t available) {
  const unsigned char lead = s[0];
  for (size_t i = 1; i < available; ++i) {
    unsigned char low = 0x80, high = 0xBF;
    if (i == 1) {
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    }
    if (s[i] < low || s[i] > high) return false;
  }
  return true;
}

}  // namespace

std::string Utf8Assembler::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  while (i < n) {
    const size_t length = sequence_length(s[i]);
    if (length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    const size_t available = std::min(length, n - i);
    if (!valid_continuation(s + i, available)) {
      // Replace the lead byte alone; resynchronize at the next byte.
      out += kReplacement;
      ++i;
      continue;
    }
    if (available < length) break;  // unfinished: wait for more bytes
    out.append(pending_, i, length);
    i += length;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::flush() {
  std::string out;
  if (!pending_.empty()) out = kReplacement;
  pending_.clear();
  return out;
}

}  // namespace megactx

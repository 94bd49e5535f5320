// StopStringMatcher: finds stop strings in streamed text, including ones split
// across tokens. Text that could still be the start of a stop string is held
// back until the next token decides it; a match trims the output at the stop
// string (or after it with include_stop_str_in_output).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace megactx {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output);

  struct Result {
    std::string text;  // safe to emit now
    bool stopped = false;
    std::string matched;  // the stop string that matched
  };
  // Feeds newly decoded text.
  Result push(std::string_view text);
  // The held-back text, when generation ends for another reason.
  std::string flush();
  bool active() const { return !stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string held_;
};

}  // namespace megactx

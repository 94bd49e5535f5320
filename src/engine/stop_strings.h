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

// Turns token bytes into complete UTF-8 text: bytes of an unfinished
// character are held until it completes; bytes that can never form a valid
// character become U+FFFD (as HF's byte-level decode does).
class Utf8Assembler {
 public:
  std::string push(std::string_view bytes);
  std::string flush();  // held bytes as U+FFFD

 private:
  std::string pending_;
};

}  // namespace megactx

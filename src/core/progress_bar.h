// A one-line progress bar on stderr, drawn only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace megactx {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total);
  ~ProgressBar();
  void advance(uint64_t amount);
  void finish();

 private:
  void draw(bool force);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace megactx

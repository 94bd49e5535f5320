#include "core/progress_bar.h"

#include <unistd.h>

#include <cstdio>

namespace megactx {

ProgressBar::ProgressBar(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(uint64_t amount) {
  done_ += amount;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  done_ = total_;
  draw(true);
  std::fputc('\n', stderr);
}

void ProgressBar::draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 40;
  const double fraction = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%%", label_.c_str(), filled,
               "########################################", kWidth - filled, "", fraction * 100.0);
  std::fflush(stderr);
}

}  // namespace megactx

// A variable set for one scope and put back after it (also when the scope
// is left by an exception): per-call state a member keeps for the functions
// one call reaches, e.g. a forward's MoE dispatch.
#pragma once

#include <utility>

namespace megactx {

template <typename T>
class ScopedValue {
 public:
  ScopedValue(T& target, T value) : target_(target), saved_(std::exchange(target, value)) {}
  ~ScopedValue() { target_ = std::move(saved_); }
  ScopedValue(const ScopedValue&) = delete;
  ScopedValue& operator=(const ScopedValue&) = delete;

 private:
  T& target_;
  T saved_;
};

}  // namespace megactx

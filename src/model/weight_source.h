// WeightSource: where the model's float32 weights come from. A checkpoint
// (bf16 / f16 / f32 / fp8 e4m3 with 128x128 `weight_scale_inv` blocks, all
// converted to float32 on load) or deterministic random values for
// benchmarks. Every weight is asked for by name and shape.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"

namespace megactx {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A float32 host tensor of exactly `shape`; throws Error naming the tensor
  // when it is missing or has another shape.
  virtual Tensor get(const std::string& name, const Shape& shape) = 0;
  virtual bool has(const std::string& name) const = 0;
  // Throws Error listing tensors the model never asked for, except names
  // starting with one of `ignored_prefixes` (the MTP layer).
  virtual void check_all_used(const std::vector<std::string>& ignored_prefixes) const = 0;
};

std::unique_ptr<WeightSource> make_checkpoint_weights(const Checkpoint& checkpoint);
// Matrices ~ N(0, 1/fan_in), norm weights 1, biases 0: activations stay O(1).
std::unique_ptr<WeightSource> make_random_weights(uint64_t seed);

}  // namespace megactx

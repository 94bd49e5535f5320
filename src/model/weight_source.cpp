#include "model/weight_source.h"

#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"

namespace megactx {
namespace {

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {
    const QuantizationConfig& q = checkpoint.config().quantization;
    if (q.weight_block_size.size() == 2) {
      block_rows_ = q.weight_block_size[0];
      block_cols_ = q.weight_block_size[1];
    }
  }

  Tensor get(const std::string& name, const Shape& shape) override {
    Tensor tensor = checkpoint_.get_float(name, shape).to_float();
    const std::string scale_name = name + "_scale_inv";
    if (shape.size() == 2 && checkpoint_.has(scale_name)) {
      dequantize(tensor, scale_name);
    } else {
      MEGACTX_CHECK(checkpoint_.dtype_of(name) != DType::F8_E4M3,
                    "tensor '{}' is fp8 but '{}' is missing", name, scale_name);
    }
    return tensor;
  }

  bool has(const std::string& name) const override { return checkpoint_.has(name); }

  void check_all_used(const std::vector<std::string>& ignored_prefixes) const override {
    std::vector<std::string> unexpected;
    for (const std::string& name : checkpoint_.unrequested()) {
      bool ignored = false;
      for (const std::string& prefix : ignored_prefixes) ignored |= name.starts_with(prefix);
      if (!ignored) unexpected.push_back(name);
    }
    if (unexpected.empty()) return;
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 8; ++i) list += (i ? ", " : "") + unexpected[i];
    fail("checkpoint {}: {} unexpected tensor(s) the model does not use: {}{}",
         checkpoint_.directory(), unexpected.size(), list, unexpected.size() > 8 ? ", ..." : "");
  }

 private:
  // w[r, c] *= scale_inv[r / block_rows, c / block_cols]
  void dequantize(Tensor& tensor, const std::string& scale_name) {
    const int64_t rows = tensor.dim(0);
    const int64_t cols = tensor.dim(1);
    const int64_t block_rows = (rows + block_rows_ - 1) / block_rows_;
    const int64_t block_cols = (cols + block_cols_ - 1) / block_cols_;
    const Tensor scales = checkpoint_.get_float(scale_name, {block_rows, block_cols}).to_float();
    float* w = tensor.data<float>();
    const float* s = scales.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        w[r * cols + c] *= s[(r / block_rows_) * block_cols + c / block_cols_];
      }
    }
  }

  const Checkpoint& checkpoint_;
  int64_t block_rows_ = 128;
  int64_t block_cols_ = 128;
};

// splitmix64: a stateless hash, so each tensor's values depend only on the
// seed, its name and the element index (parallel fill, reproducible).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class RandomWeights final : public WeightSource {
 public:
  explicit RandomWeights(uint64_t seed) : seed_(seed) {}

  Tensor get(const std::string& name, const Shape& shape) override {
    Tensor tensor = Tensor::empty(shape, DType::F32);
    float* data = tensor.data<float>();
    const int64_t count = tensor.numel();
    const bool is_norm =
        shape.size() == 1 && name.find("norm") != std::string::npos && !name.ends_with("bias");
    if (shape.size() == 1) {
      for (int64_t i = 0; i < count; ++i) data[i] = is_norm ? 1.0f : 0.0f;
      return tensor;
    }
    const bool embedding = name.ends_with("embed_tokens.weight");
    const float std_dev = embedding ? 1.0f : 1.0f / std::sqrt(static_cast<float>(shape.back()));
    uint64_t key = seed_;
    for (char c : name) key = mix(key ^ static_cast<uint8_t>(c));
    ThreadPool::global().parallel_for(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        // Irwin-Hall: the sum of four 16-bit uniforms, rescaled to unit
        // variance, is close enough to normal for benchmark weights and far
        // cheaper than Box-Muller.
        const uint64_t bits = mix(key + static_cast<uint64_t>(i));
        double sum = 0.0;
        for (int part = 0; part < 4; ++part)
          sum += static_cast<double>((bits >> (16 * part)) & 0xffff);
        const double normal = (sum / 65535.0 - 2.0) * std::sqrt(3.0);
        data[i] = static_cast<float>(normal) * std_dev;
      }
    });
    return tensor;
  }

  bool has(const std::string& name) const override { return !name.ends_with("_scale_inv"); }
  void check_all_used(const std::vector<std::string>&) const override {}

 private:
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<WeightSource> make_checkpoint_weights(const Checkpoint& checkpoint) {
  return std::make_unique<CheckpointWeights>(checkpoint);
}

std::unique_ptr<WeightSource> make_random_weights(uint64_t seed) {
  return std::make_unique<RandomWeights>(seed);
}

}  // namespace megactx

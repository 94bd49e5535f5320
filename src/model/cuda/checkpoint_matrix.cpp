#include "model/cuda/checkpoint_matrix.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "model/weight_source.h"

namespace megactx {
namespace {

int64_t blocks(int64_t extent) {
  return (extent + kFp8WeightBlock - 1) / kFp8WeightBlock;
}

void check_block_size(const Checkpoint& checkpoint, const std::string& name) {
  const std::vector<int64_t>& block = checkpoint.config().quantization.weight_block_size;
  MEGACTX_CHECK(block.empty() || (block.size() == 2 && block[0] == kFp8WeightBlock &&
                                  block[1] == kFp8WeightBlock),
                "tensor '{}': fp8 weights computed natively need 128x128 weight_block_size, the "
                "checkpoint declares {} values",
                name,
                block.size() == 2 ? fmt::format("{}x{}", block[0], block[1])
                                  : fmt::format("{}", block.size()));
}

}  // namespace

int64_t fp8_block_scale_row(int64_t row, int64_t scale_split) {
  if (scale_split > 0 && row >= scale_split)
    return blocks(scale_split) + (row - scale_split) / kFp8WeightBlock;
  return row / kFp8WeightBlock;
}

CheckpointMatrix read_checkpoint_matrix(const Checkpoint& checkpoint, const std::string& name,
                                        const Shape& shape) {
  MEGACTX_CHECK(shape.size() == 2, "tensor '{}': a weight matrix needs 2 dims", name);
  CheckpointMatrix matrix;
  const std::string scale_name = name + "_scale_inv";
  MEGACTX_CHECK(checkpoint.has(name), "checkpoint {}: tensor '{}' is missing",
                checkpoint.directory(), name);
  if (checkpoint.dtype_of(name) != DType::F8_E4M3) {
    MEGACTX_CHECK(!checkpoint.has(scale_name),
                  "tensor '{}' is {} but has a '{}' (block scales belong to fp8 weights)", name,
                  dtype_name(checkpoint.dtype_of(name)), scale_name);
    matrix.values = checkpoint.get_float(name, shape).to_float();
    return matrix;
  }
  check_block_size(checkpoint, name);
  MEGACTX_CHECK(checkpoint.has(scale_name), "tensor '{}' is fp8 but '{}' is missing", name,
                scale_name);
  const Shape scale_shape = {blocks(shape[0]), blocks(shape[1])};
  const Shape found = checkpoint.shape_of(scale_name);
  MEGACTX_CHECK(found == scale_shape,
                "'{}' has shape [{}], expected [{}, {}] (128x128 blocks of [{}, {}])", scale_name,
                fmt::join(found, ", "), scale_shape[0], scale_shape[1], shape[0], shape[1]);
  matrix.values = checkpoint.get(name, shape, DType::F8_E4M3);
  matrix.scales = checkpoint.get_float(scale_name, scale_shape).to_float();
  const float* scales = matrix.scales.data<float>();
  for (int64_t i = 0; i < matrix.scales.numel(); ++i) {
    MEGACTX_CHECK(std::isfinite(scales[i]), "'{}' holds a non-finite scale ({}) at block {}",
                  scale_name, scales[i], i);
  }
  return matrix;
}

CheckpointMatrix stack_rows(const CheckpointMatrix& top, const CheckpointMatrix& bottom) {
  MEGACTX_CHECK(top.cols() == bottom.cols(), "stack_rows: {} vs {} columns", top.cols(),
                bottom.cols());
  CheckpointMatrix stacked;
  const int64_t rows = top.rows() + bottom.rows();
  if (top.fp8() && bottom.fp8()) {
    stacked.values = Tensor::empty({rows, top.cols()}, DType::F8_E4M3);
    std::memcpy(stacked.values.raw(), top.values.raw(), top.values.nbytes());
    std::memcpy(static_cast<char*>(stacked.values.raw()) + top.values.nbytes(), bottom.values.raw(),
                bottom.values.nbytes());
    // Scale rows of top keep their place; bottom's follow. A bottom row b sits
    // at stacked row top.rows() + b and reads scale row blocks(top) + b / 128:
    // scale_split = top.rows() says exactly that.
    MEGACTX_CHECK(top.scale_split == 0 && bottom.scale_split == 0,
                  "stack_rows: inputs are already stacked");
    const int64_t scale_cols = top.scales.dim(1);
    stacked.scales = Tensor::empty({top.scales.dim(0) + bottom.scales.dim(0), scale_cols});
    std::memcpy(stacked.scales.raw(), top.scales.raw(), top.scales.nbytes());
    std::memcpy(static_cast<char*>(stacked.scales.raw()) + top.scales.nbytes(), bottom.scales.raw(),
                bottom.scales.nbytes());
    stacked.scale_split = top.rows();
    return stacked;
  }
  const Tensor a = dequantize(top), b = dequantize(bottom);
  stacked.values = Tensor::empty({rows, top.cols()});
  std::memcpy(stacked.values.raw(), a.raw(), a.nbytes());
  std::memcpy(static_cast<char*>(stacked.values.raw()) + a.nbytes(), b.raw(), b.nbytes());
  return stacked;
}

CheckpointMatrix pad_rows(const CheckpointMatrix& matrix, int64_t rows) {
  MEGACTX_CHECK(matrix.fp8() && rows >= matrix.rows(), "pad_rows: fp8 matrices, {} -> {} rows",
                matrix.rows(), rows);
  // The padding's scale rows are those of the last rows: no new scale row.
  MEGACTX_CHECK(fp8_block_scale_row(rows - 1, matrix.scale_split) ==
                    fp8_block_scale_row(matrix.rows() - 1, matrix.scale_split),
                "pad_rows: {} -> {} rows leaves the last 128-row block", matrix.rows(), rows);
  CheckpointMatrix padded;
  padded.values = Tensor::empty({rows, matrix.cols()}, DType::F8_E4M3);
  std::memset(padded.values.raw(), 0, padded.values.nbytes());  // e4m3 +0
  std::memcpy(padded.values.raw(), matrix.values.raw(), matrix.values.nbytes());
  padded.scales = matrix.scales;
  padded.scale_split = matrix.scale_split;
  return padded;
}

Tensor dequantize(const CheckpointMatrix& matrix) {
  if (!matrix.fp8()) return matrix.values.clone();
  const int64_t rows = matrix.rows(), cols = matrix.cols();
  const int64_t scale_cols = matrix.scales.dim(1);
  Tensor out = Tensor::empty({rows, cols});
  const auto* bits = static_cast<const uint8_t*>(matrix.values.raw());
  const float* scales = matrix.scales.data<float>();
  float* values = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scales + fp8_block_scale_row(r, matrix.scale_split) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) {
      values[r * cols + c] = fp8_e4m3_to_float(bits[r * cols + c]) * scale_row[c / kFp8WeightBlock];
    }
  }
  return out;
}

Tensor read_checkpoint_float(const Checkpoint& checkpoint, const std::string& name,
                             const Shape& shape) {
  if (shape.size() == 2 && checkpoint.has(name) && checkpoint.dtype_of(name) == DType::F8_E4M3) {
    return dequantize(read_checkpoint_matrix(checkpoint, name, shape));
  }
  MEGACTX_CHECK(!checkpoint.has(name) || checkpoint.dtype_of(name) != DType::F8_E4M3,
                "tensor '{}' is fp8 but is not a matrix", name);
  return checkpoint.get_float(name, shape).to_float();
}

CheckpointMatrix quantize_blocks(const Tensor& values) {
  Fp8Blocks blocks = quantize_fp8_blocks(values);
  CheckpointMatrix matrix;
  matrix.values = std::move(blocks.codes);
  matrix.scales = std::move(blocks.scales);
  return matrix;
}

namespace {

class CheckpointMatrices final : public MatrixSource {
 public:
  explicit CheckpointMatrices(const Checkpoint& checkpoint)
      : checkpoint_(checkpoint), unused_(make_checkpoint_weights(checkpoint)) {}
  bool has(const std::string& name) const override { return checkpoint_.has(name); }
  CheckpointMatrix matrix(const std::string& name, const Shape& shape) override {
    return read_checkpoint_matrix(checkpoint_, name, shape);
  }
  Tensor float_tensor(const std::string& name, const Shape& shape) override {
    return read_checkpoint_float(checkpoint_, name, shape);
  }
  void check_all_used(const std::vector<std::string>& ignored_prefixes) const override {
    // The checkpoint tracks what was read; WeightSource words the report.
    unused_->check_all_used(ignored_prefixes);
  }

 private:
  const Checkpoint& checkpoint_;
  std::unique_ptr<WeightSource> unused_;
};

class RandomFp8Matrices final : public MatrixSource {
 public:
  explicit RandomFp8Matrices(uint64_t seed) : values_(make_random_weights(seed)) {}
  bool has(const std::string& name) const override { return values_->has(name); }
  CheckpointMatrix matrix(const std::string& name, const Shape& shape) override {
    const Tensor values = values_->get(name, shape);
    // What fp8 checkpoints keep in bf16.
    if (name == "lm_head.weight" || name.ends_with("weights_proj.weight")) return {values, {}, 0};
    return quantize_blocks(values);
  }
  Tensor float_tensor(const std::string& name, const Shape& shape) override {
    return values_->get(name, shape);
  }
  void check_all_used(const std::vector<std::string>&) const override {}

 private:
  std::unique_ptr<WeightSource> values_;
};

// Another source's matrices with their e4m3 values dequantised to float32.
class DequantizedMatrices final : public MatrixSource {
 public:
  explicit DequantizedMatrices(std::unique_ptr<MatrixSource> source) : source_(std::move(source)) {}
  bool has(const std::string& name) const override { return source_->has(name); }
  CheckpointMatrix matrix(const std::string& name, const Shape& shape) override {
    const CheckpointMatrix m = source_->matrix(name, shape);
    return m.fp8() ? CheckpointMatrix{dequantize(m), {}, 0} : m;
  }
  Tensor float_tensor(const std::string& name, const Shape& shape) override {
    return source_->float_tensor(name, shape);
  }
  void check_all_used(const std::vector<std::string>& ignored) const override {
    source_->check_all_used(ignored);
  }

 private:
  std::unique_ptr<MatrixSource> source_;
};

}  // namespace

std::unique_ptr<MatrixSource> make_checkpoint_matrices(const Checkpoint& checkpoint) {
  return std::make_unique<CheckpointMatrices>(checkpoint);
}

std::unique_ptr<MatrixSource> make_random_fp8_matrices(uint64_t seed, bool dequantized) {
  auto source = std::make_unique<RandomFp8Matrices>(seed);
  if (!dequantized) return source;
  return std::make_unique<DequantizedMatrices>(std::move(source));
}

}  // namespace megactx

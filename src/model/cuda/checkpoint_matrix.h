// GEMM weights read from a checkpoint as the fp8-native CUDA load keeps them:
// e4m3 bytes with their 128x128 `weight_scale_inv` blocks exactly as shipped
// (GLM-5.x-FP8, DeepSeek-V3.2), anything else as float32. The host side of
// make_cuda_dsa_model_from_checkpoint (model/cuda/cuda_model.h), plain C++ so the
// validation runs (and is tested) on machines without a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fp8_blocks.h"
#include "core/tensor.h"
#include "io/checkpoint.h"

namespace megactx {

struct CheckpointMatrix {
  // fp8: F8_E4M3 [out, in] (a zero-copy view of the checkpoint, or owned when
  // stacked); otherwise float32 [out, in].
  Tensor values;
  // fp8 only: float32 [scale rows, ceil(in / 128)]; weight row r uses scale
  // row r / 128, or, at and past scale_split (> 0, two stacked matrices),
  // ceil(scale_split / 128) + (r - scale_split) / 128.
  Tensor scales;
  int64_t scale_split = 0;
  bool fp8() const { return scales.defined() && scales.numel() > 0; }
  int64_t rows() const { return values.dim(0); }
  int64_t cols() const { return values.dim(1); }
};

// Scale row of weight row `row` (the rule above; the device uses the same).
int64_t fp8_block_scale_row(int64_t row, int64_t scale_split);

// `name` of exactly `shape` [out, in]. An F8_E4M3 tensor needs
// `name + "_scale_inv"` of shape [ceil(out / 128), ceil(in / 128)] with
// finite values, in a checkpoint whose quantization_config.weight_block_size
// is 128 x 128 (or absent); any other floating dtype comes back as float32.
// Errors name the tensor and what was wrong.
CheckpointMatrix read_checkpoint_matrix(const Checkpoint& checkpoint, const std::string& name,
                                        const Shape& shape);

// `top` rows then `bottom` rows (the MLP's gate_proj then up_proj), same
// column count: fp8 stays fp8 (bytes and scale rows stacked, scale_split =
// top's rows); if either is not fp8 both are stacked as float32.
CheckpointMatrix stack_rows(const CheckpointMatrix& top, const CheckpointMatrix& bottom);

// An fp8 matrix whose rows after scale_split (all of them when 0) end in a
// partial 128-row block, padded with zero rows (e4m3 +0) to `rows`, which
// must stay within that last block: the scale grid is unchanged. Why: the
// stacked q_a | kv_a (2048 + 576 rows) then is whole 128-row blocks, which
// cuBLASLt takes in one GEMM (else its last 64 rows run as a second GEMM
// with a second quantisation of the input).
CheckpointMatrix pad_rows(const CheckpointMatrix& matrix, int64_t rows);

// float32 [out, in]: values times their block scales (fp8), else a copy.
Tensor dequantize(const CheckpointMatrix& matrix);

// A float32 host tensor of `shape` (norms, router, embedding, kv_b_proj): any
// floating dtype, fp8 dequantised with its block scales.
Tensor read_checkpoint_float(const Checkpoint& checkpoint, const std::string& name,
                             const Shape& shape);

// Where the fp8-native load reads its tensors: a checkpoint, or random fp8
// weights for benchmarks. Weights are asked for by name and shape.
class MatrixSource {
 public:
  virtual ~MatrixSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // A GEMM weight [out, in] (read_checkpoint_matrix's rules).
  virtual CheckpointMatrix matrix(const std::string& name, const Shape& shape) = 0;
  // A float32 tensor (read_checkpoint_float's rules).
  virtual Tensor float_tensor(const std::string& name, const Shape& shape) = 0;
  // An Error listing tensors never read, except names starting with one of
  // `ignored_prefixes` (the MTP layers).
  virtual void check_all_used(const std::vector<std::string>& ignored_prefixes) const = 0;
};

// The checkpoint's tensors (it must outlive the source).
std::unique_ptr<MatrixSource> make_checkpoint_matrices(const Checkpoint& checkpoint);

// Random weights shaped as an fp8 checkpoint ships them (DeepSeek-V3 / GLM-5
// FP8): every projection and expert matrix e4m3 with one scale per 128x128
// block (values ~ N(0, 1/fan_in) quantised with scale = block amax / 448);
// lm_head, router and indexer weights_proj float32, norms 1, biases 0, the
// embedding N(0, 1) (make_random_weights' values). For benchmarks.
// `dequantized`: the same e4m3 values as float32 matrices (the reference
// that measures what the fp8 GEMMs' rounding moves).
std::unique_ptr<MatrixSource> make_random_fp8_matrices(uint64_t seed, bool dequantized = false);

// float32 [out, in] -> e4m3 codes with one scale per 128x128 block
// (quantize_fp8_blocks in core/fp8_blocks.h), as fp8 checkpoints are made.
CheckpointMatrix quantize_blocks(const Tensor& values);

}  // namespace megactx

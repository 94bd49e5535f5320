#include "core/fp8_blocks.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace megactx {

Fp8Blocks quantize_fp8_blocks(const Tensor& values) {
  MEGACTX_CHECK(values.rank() == 2 && values.dtype() == DType::F32,
                "quantize_fp8_blocks: a float32 matrix is needed");
  const int64_t rows = values.dim(0), cols = values.dim(1);
  const int64_t block_rows = (rows + kFp8WeightBlock - 1) / kFp8WeightBlock;
  const int64_t block_cols = (cols + kFp8WeightBlock - 1) / kFp8WeightBlock;
  Fp8Blocks out{Tensor::empty({rows, cols}, DType::F8_E4M3),
                Tensor::empty({block_rows, block_cols}, DType::F32)};
  const float* v = values.data<float>();
  auto* codes = static_cast<uint8_t*>(out.codes.raw());
  float* scales = out.scales.data<float>();
  // One task per 128-row band of blocks (blocks never share rows across bands).
  ThreadPool::global().parallel_for(block_rows, [&](int64_t begin, int64_t end) {
    for (int64_t br = begin; br < end; ++br) {
      const int64_t r0 = br * kFp8WeightBlock, r1 = std::min(rows, r0 + kFp8WeightBlock);
      for (int64_t bc = 0; bc < block_cols; ++bc) {
        const int64_t c0 = bc * kFp8WeightBlock, c1 = std::min(cols, c0 + kFp8WeightBlock);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(v[r * cols + c]));
        const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
        scales[br * block_cols + bc] = scale;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            codes[r * cols + c] = float_to_fp8_e4m3(v[r * cols + c] / scale);
      }
    }
  });
  return out;
}

}  // namespace megactx

// Launch shapes for row-structured element-wise kernels: threadIdx.y /
// blockIdx.y walk the rows (grid-stride past the grid), threadIdx.x /
// blockIdx.x the columns of a row. No division per element: an int64 divide /
// modulo per element to split a flat index into (row, column) cost more than
// the bytes at a prefill chunk's sizes (the query pack iterated 38M elements
// per 1024-row block); a warp per row would leave a decode step's one row to
// 32 threads; a block per row would idle most of its threads on short rows
// (65536 rows of 48 float4s in the W_UK input's conversion). Only for .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct RowLaunch {
  dim3 grid, block;
};

// 256-thread blocks: as many threads along x as a row has columns (a
// multiple of 32, at most 256), the rest of the block along y (rows).
inline RowLaunch row_launch(int64_t rows, int64_t columns) {
  int64_t bx = (columns + 31) / 32 * 32;
  bx = bx < 32 ? 32 : bx > 256 ? 256 : bx;
  while (256 % bx != 0) bx += 32;  // 96 -> 128, 160 -> 256, ...
  const int64_t by = 256 / bx;
  const int64_t gx = (columns + bx - 1) / bx, gy = (rows + by - 1) / by;
  return {dim3(static_cast<unsigned>(gx < 1       ? 1
                                     : gx > 65535 ? 65535
                                                  : gx),
               static_cast<unsigned>(gy < 1       ? 1
                                     : gy > 65535 ? 65535
                                                  : gy)),
          dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by))};
}

// The loops of a row_launch kernel:
//   for (ROW_LAUNCH_ROWS(r, rows)) for (ROW_LAUNCH_COLUMNS(c, columns)) ...
#define ROW_LAUNCH_ROWS(r, rows)                              \
  int64_t r = blockIdx.y * int64_t{blockDim.y} + threadIdx.y; \
  r < (rows);                                                 \
  r += int64_t{gridDim.y} * blockDim.y
#define ROW_LAUNCH_COLUMNS(c, columns)                        \
  int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; \
  c < (columns);                                              \
  c += int64_t{gridDim.x} * blockDim.x

}  // namespace megactx::cuda

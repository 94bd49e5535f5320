#include "kernels/cpu/batch_invariant_linear.h"

#include <algorithm>

#include "core/thread_pool.h"

namespace megactx::cpu {
namespace {

constexpr int kLanes = 8;  // partial sums per dot product
constexpr int kOutputs = 4;  // outputs per x row load (shares the loads of x)
constexpr int64_t kOutputBlock = 32;  // weight rows kept in cache across x rows

inline float combine(const float* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// kOutputs dot products of x with w[0..kOutputs), each with exactly the
// arithmetic of batch_invariant_dot (the compiler may vectorize across lanes,
// never reassociate: no -ffast-math, and the file is built with
// -ffp-contract=off so that no path fuses a multiply-add another does not).
inline void dot4(const float* x, const float* const* w, int64_t n, float* out) {
  float s[kOutputs][kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t k = 0; k < body; k += kLanes) {
    for (int o = 0; o < kOutputs; ++o) {
      for (int l = 0; l < kLanes; ++l) s[o][l] += x[k + l] * w[o][k + l];
    }
  }
  for (int o = 0; o < kOutputs; ++o) {
    float total = combine(s[o]);
    for (int64_t k = body; k < n; ++k) total += x[k] * w[o][k];
    out[o] = total;
  }
}

}  // namespace

float batch_invariant_dot(const float* a, const float* b, int64_t n) {
  float s[kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t k = 0; k < body; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) s[l] += a[k + l] * b[k + l];
  }
  float total = combine(s);
  for (int64_t k = body; k < n; ++k) total += a[k] * b[k];
  return total;
}

void linear_batch_invariant(const float* x, int64_t rows, int64_t in, int64_t x_stride,
                            const float* w, int64_t out, float* y, int64_t y_stride) {
  if (rows == 0 || out == 0) return;
  // Output blocks over the pool (the split never changes an element's sum).
  const int64_t blocks = (out + kOutputBlock - 1) / kOutputBlock;
  ThreadPool::global().parallel_for(blocks, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t o0 = block * kOutputBlock, o1 = std::min(out, o0 + kOutputBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * x_stride;
        float* yr = y + r * y_stride;
        int64_t o = o0;
        for (; o + kOutputs <= o1; o += kOutputs) {
          const float* ws[kOutputs] = {w + o * in, w + (o + 1) * in, w + (o + 2) * in,
                                       w + (o + 3) * in};
          dot4(xr, ws, in, yr + o);
        }
        for (; o < o1; ++o) yr[o] = batch_invariant_dot(xr, w + o * in, in);
      }
    }
  });
}

}  // namespace megactx::cpu

// Exact top-k of the fp32 fallback indexer (dsa_fallback.h): for every row t,
// indices[t, 0:count) = the `topk` positions p < visible_t with the largest
// scores[t, p], ties broken by the lower position, written in increasing
// position order; indices[t, count:topk) = -1 and counts[t] = count =
// min(topk, visible_t). visible_t = positions[t] + 1 (at most max_context), so
// a padding row (position -1) gets count 0 and only -1.
//
// Algorithm (one CTA per row, no workspace): a radix select on the
// order-preserving uint32 image of the scores (digits of 11, 11 and 10 bits,
// stopping early once the k-th key's whole bin is taken) finds the threshold
// prefix; positions above it are all taken, positions equal to it in position
// order until k. A block-wide scan of (above, equal) counts in position order
// then gives every taken position its output slot, so the order comes free.
// With max_context <= kPositionTopkSharedRow the row's keys live in shared
// memory (one global read); beyond that every pass streams the row from
// global memory (L2), slower but unbounded (rows of 1M keys work).
//
// Graph-capturable: the launch depends only on rows and max_context (a
// decode graph's context bucket); rows past their visible length cost
// nothing; no allocation, no host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

inline constexpr int64_t kPositionTopkSharedRow = 49152;  // keys in shared memory (192 KiB)
inline constexpr int64_t kPositionTopkTile = 2048;  // positions per step of the ordered collect

struct PositionTopkParams {
  const float* scores = nullptr;       // [rows, score_stride]; row t reads p < visible_t
  int64_t score_stride = 0;            // >= max_context
  const int32_t* positions = nullptr;  // [rows] last visible position; -1: padding row
  int64_t rows = 0, topk = 0, max_context = 0;
  int32_t* indices = nullptr;  // [rows, topk] out
  int32_t* counts = nullptr;   // [rows] out
};

// How a launch runs (host-side, testable without a GPU).
struct PositionTopkPlan {
  bool keys_in_shared = false;  // the row's keys held in shared memory
  int64_t shared_bytes = 0;     // dynamic shared memory of the launch
};
PositionTopkPlan plan_position_topk(int64_t max_context);

// Validates (megactx::Error) and launches on `stream`.
void position_topk(const PositionTopkParams& params, cudaStream_t stream);

// The checks position_topk makes (megactx::Error naming `what`); also the
// benchmark's former quadratic kernel (bench/cuda/support/position_topk_quadratic.h).
void check_position_topk(const PositionTopkParams& params, const char* what);

namespace detail {
void launch_position_topk(const PositionTopkParams& params, cudaStream_t stream);
}  // namespace detail

}  // namespace megactx::cuda

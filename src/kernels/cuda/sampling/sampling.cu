// Device sampler; see sampling.h. One block per row; thread t owns the
// contiguous ids [t * chunk, (t + 1) * chunk), so "in id order" questions are
// a block prefix over per-thread counts. Every filter keeps a prefix of the
// order (prob desc, id asc) -- top_k and top_p -- or a value threshold
// (min_p), so the kept set is found by bisection over the probabilities'
// float bits (monotonic for p >= 0) instead of a sort.
#include <cfloat>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/sampling/sampling.h"

namespace megactx::cuda {
namespace {

constexpr int kBlock = 512;
constexpr int kWarps = kBlock / 32;

__device__ bool better(float va, int32_t ia, float vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

struct Shared {
  double sums[kWarps];
  float best_v[kWarps];
  int32_t best_i[kWarps];
  long long counts[kBlock];
  double result_d;
  long long result_c;
  float result_v;
  int32_t result_i;
};

__device__ double block_sum(double value, Shared& s) {
  for (int off = 16; off > 0; off /= 2) value += __shfl_xor_sync(0xffffffffu, value, off);
  if (threadIdx.x % 32 == 0) s.sums[threadIdx.x / 32] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += s.sums[w];
    s.result_d = total;
  }
  __syncthreads();
  const double total = s.result_d;
  __syncthreads();
  return total;
}

// Block-wide best (value desc, id asc); every thread gets it.
__device__ void block_best(float& v, int32_t& id, Shared& s) {
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, off);
    if (better(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
  if (threadIdx.x % 32 == 0) {
    s.best_v[threadIdx.x / 32] = v;
    s.best_i[threadIdx.x / 32] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bv = s.best_v[0];
    int32_t bi = s.best_i[0];
    for (int w = 1; w < kWarps; ++w) {
      if (better(s.best_v[w], s.best_i[w], bv, bi)) {
        bv = s.best_v[w];
        bi = s.best_i[w];
      }
    }
    s.result_v = bv;
    s.result_i = bi;
  }
  __syncthreads();
  v = s.result_v;
  id = s.result_i;
  __syncthreads();
}

// Per-thread counts -> this thread's exclusive prefix and the block total.
__device__ long long block_prefix(long long count, long long& total, Shared& s) {
  s.counts[threadIdx.x] = count;
  __syncthreads();
  long long before = 0;
  for (unsigned t = 0; t < threadIdx.x; ++t) before += s.counts[t];
  if (threadIdx.x == kBlock - 1) s.result_c = before + count;
  __syncthreads();
  total = s.result_c;
  __syncthreads();
  return before;
}

struct Row {
  const float* logits;
  const uint32_t* mask;    // null: every token allowed
  int64_t begin, end;      // this thread's ids
  float max_logit, inv_t;  // max_logit: of the allowed tokens
  __device__ bool allowed(int64_t i) const {
    return mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1u) != 0;
  }
  __device__ float prob(int64_t i) const {
    return allowed(i) ? expf((logits[i] - max_logit) * inv_t) : 0.0f;
  }
  __device__ uint32_t bits(int64_t i) const { return __float_as_uint(prob(i)); }
};

// The kept prefix of (prob desc, id asc): bits > cut_bits, or == cut_bits and id <= cut_id.
struct Cut {
  uint32_t bits = 0;
  int64_t id = INT64_MAX;
  __device__ bool keeps(uint32_t b, int64_t i) const { return b > bits || (b == bits && i <= id); }
};

// The id of the m-th (1-based) element in id order with bits == b within `cut`.
__device__ int64_t mth_tie(const Row& r, uint32_t b, const Cut& cut, long long m, Shared& s) {
  long long mine = 0;
  for (int64_t i = r.begin; i < r.end; ++i) mine += (r.bits(i) == b && cut.keeps(b, i)) ? 1 : 0;
  long long total = 0;
  const long long before = block_prefix(mine, total, s);
  if (before < m && m <= before + mine) {
    long long seen = before;
    for (int64_t i = r.begin; i < r.end; ++i) {
      if (r.bits(i) == b && cut.keeps(b, i) && ++seen == m) {
        s.result_c = i;
        break;
      }
    }
  }
  __syncthreads();
  const int64_t id = s.result_c;
  __syncthreads();
  return id;
}

__global__ void sample_kernel(const float* logits, int64_t vocab, const SampleRowParams* rows,
                              const uint32_t* masks, SampleOut* outs) {
  grid_dependency_wait();
  grid_dependency_trigger();
  __shared__ Shared s;
  const SampleRowParams p = rows[blockIdx.x];
  SampleOut& out = outs[blockIdx.x];
  Row r;
  r.logits = logits + p.logits_row * vocab;
  r.mask = p.mask_offset >= 0 ? masks + p.mask_offset : nullptr;
  const int64_t chunk = (vocab + kBlock - 1) / kBlock;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * chunk;
  r.begin = first < vocab ? first : vocab;
  r.end = r.begin + chunk < vocab ? r.begin + chunk : vocab;

  // Argmax and log-sum-exp of the unmodified logits.
  float best_v = -FLT_MAX;
  int32_t best_i = INT32_MAX;
  for (int64_t i = r.begin; i < r.end; ++i) {
    if (better(r.logits[i], static_cast<int32_t>(i), best_v, best_i)) {
      best_v = r.logits[i];
      best_i = static_cast<int32_t>(i);
    }
  }
  block_best(best_v, best_i, s);
  double local = 0.0;
  for (int64_t i = r.begin; i < r.end; ++i) local += exp(static_cast<double>(r.logits[i]) - best_v);
  const double log_z = best_v + log(block_sum(local, s));

  // The best allowed token: the greedy pick, and the scale of the
  // probabilities (the CPU's max over the masked logits).
  float top_v = best_v;
  int32_t top_i = best_i;
  if (r.mask != nullptr) {
    top_v = -FLT_MAX;
    top_i = INT32_MAX;
    for (int64_t i = r.begin; i < r.end; ++i) {
      if (r.allowed(i) && better(r.logits[i], static_cast<int32_t>(i), top_v, top_i)) {
        top_v = r.logits[i];
        top_i = static_cast<int32_t>(i);
      }
    }
    block_best(top_v, top_i, s);
  }
  r.max_logit = top_v;

  int32_t token = top_i;
  const bool greedy = p.temperature < 1e-5f || p.top_k == 1;
  if (!greedy) {
    r.inv_t = static_cast<float>(1.0 / p.temperature);
    Cut cut;  // keeps everything
    if (p.top_k > 0 && p.top_k < vocab) {
      // Largest bits b with count(bits >= b) >= k, then the tie cut in id order.
      uint32_t lo = 0, hi = 0x7f800000u;
      while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        double c = 0.0;
        for (int64_t i = r.begin; i < r.end; ++i) c += r.bits(i) >= mid ? 1.0 : 0.0;
        if (block_sum(c, s) >= p.top_k)
          lo = mid;
        else
          hi = mid - 1;
      }
      double gt = 0.0;
      for (int64_t i = r.begin; i < r.end; ++i) gt += r.bits(i) > lo ? 1.0 : 0.0;
      const long long above = static_cast<long long>(block_sum(gt, s));
      cut.bits = lo;
      cut.id = mth_tie(r, lo, Cut{}, p.top_k - above, s);
    }
    if (p.top_p < 1.0f) {
      double kept = 0.0;
      for (int64_t i = r.begin; i < r.end; ++i) kept += cut.keeps(r.bits(i), i) ? r.prob(i) : 0.0;
      const double budget = static_cast<double>(p.top_p) * block_sum(kept, s);
      // Smallest b whose kept mass strictly above b fits the budget.
      uint32_t lo = 0, hi = 0x7f800000u;
      while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        double m = 0.0;
        for (int64_t i = r.begin; i < r.end; ++i) {
          const uint32_t b = r.bits(i);
          m += (b > mid && cut.keeps(b, i)) ? r.prob(i) : 0.0;
        }
        if (block_sum(m, s) <= budget)
          hi = mid;
        else
          lo = mid + 1;
      }
      double above = 0.0, ties = 0.0;
      for (int64_t i = r.begin; i < r.end; ++i) {
        const uint32_t b = r.bits(i);
        if (!cut.keeps(b, i)) continue;
        if (b > lo) above += r.prob(i);
        if (b == lo) ties += 1.0;
      }
      const double mass_above = block_sum(above, s);
      const long long group = static_cast<long long>(block_sum(ties, s));
      const double v = __uint_as_float(lo);
      if (group > 0 && v > 0.0) {
        // Tie j (0-based, id order) is kept while mass_above + j * v <= budget.
        long long m = static_cast<long long>((budget - mass_above) / v) + 1;
        m = m < group ? m : group;
        const int64_t id = mth_tie(r, lo, cut, m, s);
        cut.bits = lo;
        cut.id = id;
      }
    }
    // min_p relative to p_max = 1 (the max logit's unnormalised probability).
    const float floor_p = p.min_p > 0.0f ? p.min_p : 0.0f;
    double kept = 0.0;
    for (int64_t i = r.begin; i < r.end; ++i) {
      const float q = r.prob(i);
      kept += (cut.keeps(__float_as_uint(q), i) && q >= floor_p) ? q : 0.0;
    }
    const double target = p.uniform * block_sum(kept, s);
    // Inverse CDF in id order: per-thread masses, block prefix, then the crossing.
    double before = 0.0;
    __shared__ double masses[kBlock];
    masses[threadIdx.x] = kept;
    __syncthreads();
    for (unsigned t = 0; t < threadIdx.x; ++t) before += masses[t];
    __shared__ int32_t chosen, last_kept;
    if (threadIdx.x == 0) {
      chosen = -1;
      last_kept = top_i;
    }
    __syncthreads();
    double cumulative = before;
    int32_t last_here = -1;
    for (int64_t i = r.begin; i < r.end; ++i) {
      const float q = r.prob(i);
      if (!(cut.keeps(__float_as_uint(q), i) && q >= floor_p) || q <= 0.0f) continue;
      last_here = static_cast<int32_t>(i);
      cumulative += q;
      if (cumulative > target) {
        atomicMin(reinterpret_cast<unsigned*>(&chosen), static_cast<unsigned>(i));
        break;
      }
    }
    if (last_here >= 0) atomicMax(&last_kept, last_here);
    __syncthreads();
    // chosen == -1 reads as UINT_MAX under atomicMin: none crossed (rounding) -> last kept.
    token = chosen >= 0 ? chosen : last_kept;
  }

  // Top alternatives by logit (value desc, id asc), best first.
  const int n = p.top_logprobs < kMaxTopLogprobs ? p.top_logprobs : kMaxTopLogprobs;
  float prev_v = FLT_MAX;
  int32_t prev_i = -1;
  for (int j = 0; j < n; ++j) {
    float v = -FLT_MAX;
    int32_t id = INT32_MAX;
    for (int64_t i = r.begin; i < r.end; ++i) {
      const float x = r.logits[i];
      if (better(prev_v, prev_i, x, static_cast<int32_t>(i)) &&
          better(x, static_cast<int32_t>(i), v, id)) {
        v = x;
        id = static_cast<int32_t>(i);
      }
    }
    block_best(v, id, s);
    if (threadIdx.x == 0) {
      out.top_ids[j] = id;
      out.top_logprobs[j] = static_cast<float>(v - log_z);
    }
    prev_v = v;
    prev_i = id;
  }
  if (threadIdx.x == 0) {
    out.token = token;
    out.logprob = static_cast<float>(r.logits[token] - log_z);
  }
}

}  // namespace

void sample_rows(const float* logits, int64_t vocab, const SampleRowParams* rows, int64_t count,
                 const uint32_t* masks, SampleOut* out, cudaStream_t stream) {
  if (count == 0) return;
  launch_kernel(sample_kernel, static_cast<unsigned>(count), kBlock, 0, stream, logits, vocab, rows,
                masks, out);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda

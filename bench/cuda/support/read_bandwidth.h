// The read floor every GPU benchmark divides by: the bandwidth of a
// streaming read-only reduction over a buffer much larger than L2 (what a
// decode step does with weights and KV: read once, write almost nothing).
// A device-to-device copy reads and writes; half its rate (~2.1 TB/s on the
// H200) is not the read floor (~4.4 TB/s), so benchmarks measure this instead.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megactx::cuda {

struct ReadBandwidth {
  double read_gbs = 0;  // bytes read / s, median of the timed runs
  double copy_gbs = 0;  // the copy's (read + write) bytes / s, for reference
  size_t bytes = 0;     // the buffer read
};

// Reads `bytes` (rounded down to 16-byte vectors) `runs` times after one
// warm-up, each run one kernel of 16-byte loads in a grid-stride loop whose
// sum is written per block (so the loads cannot be dropped); also times a
// cudaMemcpyAsync of half the buffer onto the other half. Allocates and
// frees the buffer; an Error when it does not fit.
ReadBandwidth measure_read_bandwidth(size_t bytes = size_t{8} << 30, int runs = 10,
                                     cudaStream_t stream = nullptr);

// The gather floor of a sparse attention kernel: milliseconds (median of
// `runs` after one warm-up) to read `count` entries of `entry_bytes` (a
// multiple of 16) at pool + slots[i] * entry_bytes (slots < 0 skipped), in the
// slots' order, with 16-byte loads that keep the entries in L2 as the kernels'
// gathers do, and nothing computed: what the same selections cost in reads alone.
double measure_gather_read_ms(const void* pool, size_t entry_bytes, const int32_t* slots,
                              size_t count, int runs = 3, cudaStream_t stream = nullptr);

}  // namespace megactx::cuda

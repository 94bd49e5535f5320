// Synthesised fp8 caches for benchmarks: valid entries (no NaN codes, finite
// positive scales) from a counter hash, written on the device at copy speed,
// so a 1M-token, 78-layer cache needs no prefill.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// pool [num_slots, 132]: random e4m3 keys, scales in [1e-3, 1e-2].
void fill_synthetic_indexer_pool(uint8_t* pool, int64_t num_slots, uint32_t seed,
                                 cudaStream_t stream);
// pool [num_slots, 656]: random e4m3 latents, scales in [1e-3, 1e-2], bf16 rope in [-1, 1].
void fill_synthetic_latent_pool(uint8_t* pool, int64_t num_slots, uint32_t seed,
                                cudaStream_t stream);
// values [count] bf16 uniform in [-amplitude, amplitude].
void fill_random_bf16(uint16_t* values, int64_t count, float amplitude, uint32_t seed,
                      cudaStream_t stream);
// values [count] e4m3 without NaN codes.
void fill_random_fp8(uint8_t* values, int64_t count, uint32_t seed, cudaStream_t stream);
// values [count] fp32 uniform in [low, high].
void fill_random_f32(float* values, int64_t count, float low, float high, uint32_t seed,
                     cudaStream_t stream);
// slots [count] uniform in [0, num_slots).
void fill_random_slots(int32_t* slots, int64_t count, int64_t num_slots, uint32_t seed,
                       cudaStream_t stream);

}  // namespace megactx::cuda

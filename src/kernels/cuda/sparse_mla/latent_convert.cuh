// The f16 staging conversions both sparse MLA kernels apply when they bring
// queries and latent entries into shared memory (operands of f16 mma.sync),
// and where an entry is. Only for .cu files.
#pragma once

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

// The 656-byte entry of `slot` (>= 0): in the layer's device pool, past
// pool_slots in its offload pool (host memory, staging or hot entries), past
// staging_slots in the step's staging rows (SparseMlaParams).
template <typename Params>
__device__ __forceinline__ const uint8_t* latent_entry(const Params& p, int32_t slot) {
  const int64_t s = slot;
  if (s < p.pool_slots) return p.kv_pool + s * kLatentBytes;
  if (s < p.staging_slots) return p.offload_pool + (s - p.pool_slots) * kLatentBytes;
  return p.staging_pool + (s - p.staging_slots) * kLatentBytes;
}

// latent_entry() without branches, for gathers that resolve many slots per
// thread: each pool's base with its first slot folded in (modular address
// arithmetic), picked by two 32-bit compares and selects.
struct LatentAddressing {
  uint64_t device_base, offload_base, staging_base;
  int32_t pool_slots, staging_slots;

  template <typename Params>
  __device__ explicit LatentAddressing(const Params& p)
      : device_base(reinterpret_cast<uint64_t>(p.kv_pool)),
        offload_base(reinterpret_cast<uint64_t>(p.offload_pool) -
                     static_cast<uint64_t>(p.pool_slots) * kLatentBytes),
        staging_base(reinterpret_cast<uint64_t>(p.staging_pool) -
                     static_cast<uint64_t>(p.staging_slots) * kLatentBytes),
        pool_slots(static_cast<int32_t>(p.pool_slots < INT32_MAX ? p.pool_slots : INT32_MAX)),
        staging_slots(
            static_cast<int32_t>(p.staging_slots < INT32_MAX ? p.staging_slots : INT32_MAX)) {}

  // The entry of `slot` (>= 0).
  __device__ __forceinline__ const uint8_t* operator()(int32_t slot) const {
    const uint64_t base =
        slot < pool_slots ? device_base : (slot < staging_slots ? offload_base : staging_base);
    return reinterpret_cast<const uint8_t*>(base + static_cast<uint64_t>(slot) * kLatentBytes);
  }
};

// LatentAddressing for a launch without a host tier (pool_slots past every
// slot): one multiply-add per entry instead of two compares and the selects
// of 64-bit bases, which a gather that resolves ~24 addresses per warp and
// stage pays on its critical chain.
struct DeviceLatentAddressing {
  uint64_t device_base;

  template <typename Params>
  __device__ explicit DeviceLatentAddressing(const Params& p)
      : device_base(reinterpret_cast<uint64_t>(p.kv_pool)) {}

  __device__ __forceinline__ const uint8_t* operator()(int32_t slot) const {
    return reinterpret_cast<const uint8_t*>(device_base +
                                            static_cast<uint64_t>(slot) * kLatentBytes);
  }
};

// Cache-entry words at `address` where `load`, else zeros: one predicated
// load each. A plain load and a select would make the warp wait for the data
// at the select, where the gathers want it only later, at the conversion.
// The entries are read once per CTA: no L1 allocation. (The prefill kernel
// gained 11-22% with them; the decode cluster kernel, whose 16 entries per
// warp were already in flight at once behind branches, lost 0.4 us: it
// keeps its plain loads.)
__device__ __forceinline__ uint4 load_or_zero(const uint8_t* address, bool load) {
  uint4 v;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address), "r"(static_cast<int>(load)));
  return v;
}
__device__ __forceinline__ float load_or_zero_f32(const uint8_t* address, bool load) {
  float v;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b32 %0, 0;\n"
      "@p ld.global.nc.L1::no_allocate.f32 %0, [%1];\n}\n"
      : "=f"(v)
      : "l"(address), "r"(static_cast<int>(load)));
  return v;
}

// `bytes` (a multiple of 16, the address 16-byte aligned) from global memory
// into L2 without waiting: one bulk prefetch (sm_90).
__device__ __forceinline__ void prefetch_l2_bulk(const uint8_t* address, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(address), "r"(bytes)
               : "memory");
}

// 8 bf16 (one 16-byte word) times `factor` -> 8 f16 at `destination` (16-byte
// aligned): the product is exact in fp32 (factor a power of two or 1), then
// one f16 rounding.
__device__ __forceinline__ void store_bf16x8_as_half(uint4 bf16, float factor,
                                                     __half* destination) {
  const uint32_t words[4] = {bf16.x, bf16.y, bf16.z, bf16.w};
  uint32_t packed[4];
#pragma unroll
  for (int w = 0; w < 4; ++w)
    packed[w] = pack_half2(__uint_as_float(words[w] << 16) * factor,
                           __uint_as_float(words[w] & 0xffff0000u) * factor);
  *reinterpret_cast<uint4*>(destination) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// 16 e4m3 (one 16-byte word) times the group's `scale` -> 16 f16, the first
// 8 at `low` and the last 8 at `high` (each 16-byte aligned: two units of a
// swizzled tile, or adjacent): exact conversion, one f16 rounding.
__device__ __forceinline__ void store_e4m3x16_as_half(uint4 bytes, __half2 scale, void* low,
                                                      void* high) {
  const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  uint32_t packed[8];
#pragma unroll
  for (int w = 0; w < 4; ++w)
    e4m3x4_scaled_to_half2(words[w], scale, packed[2 * w], packed[2 * w + 1]);
  *reinterpret_cast<uint4*>(low) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  *reinterpret_cast<uint4*>(high) = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// The same into 16 consecutive f16 at `destination`.
__device__ __forceinline__ void store_e4m3x16_as_half(uint4 bytes, __half2 scale,
                                                      __half* destination) {
  store_e4m3x16_as_half(bytes, scale, destination, destination + 8);
}

}  // namespace megactx::cuda

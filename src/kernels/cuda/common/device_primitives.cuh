// Small device-side building blocks shared by the DSA kernels (indexer, top-k,
// sparse MLA): asynchronous copies, tensor-core fragments, fp8 conversion and
// the order-preserving float -> uint32 map used by radix selection, an integer hash.
// Only for .cu files (sm_90a).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace megactx::cuda {

// ---- L2 prefetch -------------------------------------------------------------
// Asks L2 for the whole 16-byte units inside [p, p + bytes): bulk prefetches of
// at most 32 KB each, nothing to wait for, no registers held. A hint: the
// data is loaded again by the caller. Decode kernels issue it for their
// weights before grid_dependency_wait (launch.cuh), so the stream from DRAM
// overlaps the tail of the kernel before them.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uintptr_t begin = (address + 15) & ~uintptr_t{15};
  const uintptr_t end = (address + static_cast<uintptr_t>(bytes)) & ~uintptr_t{15};
  constexpr uintptr_t kChunk = 32 * 1024;
  for (; begin < end; begin += kChunk) {
    const auto size = static_cast<uint32_t>(end - begin < kChunk ? end - begin : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(begin), "r"(size) : "memory");
  }
}

// ---- integer hash (MurmurHash3's 64-bit finaliser, high bits kept) ---------
__device__ __forceinline__ uint32_t hash_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// ---- cp.async (16-byte global -> shared, bypassing L1) ----------------------
__device__ __forceinline__ void cp_async_16(void* shared_destination, const void* global_source) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global_source));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// ---- Bulk copies (TMA engine, 1-D, no tensor map) completing on an mbarrier ----
// One request moves a whole contiguous block (a multiple of 16 bytes), so few
// requests keep many bytes in flight (cp.async needs one per 16 bytes).
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
               "r"(arrivals));
}
// Makes initialised barriers visible to the copy engine (then __syncthreads).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
}
// Arrives once and announces `bytes` more bytes of transactions for this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, unsigned bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)),
      "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(void* destination, const void* source,
                                                    unsigned bytes, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_address(destination)),
      "l"(source), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
}
// This CTA's shared memory -> another CTA's of the cluster (both addresses in
// the shared::cluster window, from mapa), completing on the receiver's
// mbarrier. Completion is seen only by the receiver: the sender must not exit
// before it knows the copy has read its source (a cluster barrier).
__device__ __forceinline__ void bulk_copy_to_cluster(unsigned destination, unsigned source,
                                                     unsigned bytes, unsigned barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(destination),
      "r"(source), "r"(bytes), "r"(barrier)
      : "memory");
}
// Spins until the barrier's phase with parity `phase` has completed; a copy
// that never lands traps (a launch error) instead of hanging the GPU. The
// poll counter and the trap live inside the asm: as C++ (a 64-bit counter and
// __trap()) they cost warp-specialised kernels a stack frame and spills
// around every wait (a sparse MLA layout's consumers spilled 2.7 KB of
// accumulators; the fused indexer's four-warpgroup layout 100 bytes).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, unsigned phase) {
  asm volatile(
      "{\n .reg .pred ready;\n .reg .u32 polls;\n mov.u32 polls, 0;\n"
      " mbarrier_wait_loop:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
      " @ready bra mbarrier_wait_done;\n"
      " add.u32 polls, polls, 1;\n"
      " setp.gt.u32 ready, polls, 67108864;\n"
      " @ready trap;\n"
      " bra mbarrier_wait_loop;\n"
      " mbarrier_wait_done:\n}\n" ::"r"(shared_address(barrier)),
      "r"(phase)
      : "memory");
}

// ---- Tensor-core MMA (mma.sync, fp32 accumulate) -----------------------------
// D[16x8] += A[16x32] * B[32x8], e4m3 operands. Fragment layout (g = lane/4,
// t = lane%4): a0 (row g, k 4t..4t+3), a1 (row g+8, same k), a2 (row g,
// k 16+4t..), a3 (row g+8, k 16+4t..); b0 (k 4t.., col g), b1 (k 16+4t.., col g);
// c0,c1 (row g, cols 2t,2t+1), c2,c3 (row g+8, cols 2t,2t+1).
__device__ __forceinline__ void mma_e4m3_16x8x32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D[16x8] += A[16x16] * B[16x8], bf16 operands (same fragment roles, pairs of
// bf16 per register: a0 (row g, k 2t,2t+1), a1 (row g+8), a2 (row g, k 2t+8..),
// a3 (row g+8, k 2t+8..); b0 (k 2t,2t+1, col g), b1 (k 2t+8.., col g)).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Same shape with f16 operands (e4m3 converts to f16 exactly, in one instruction).
__device__ __forceinline__ void mma_f16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory; lane l supplies the address of row
// (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* shared_row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// Same, each matrix transposed on the way (rows of memory become columns).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* shared_row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// ---- fp8 e4m3 ---------------------------------------------------------------
__device__ __forceinline__ float e4m3_to_float(uint8_t bits) {
  __nv_fp8_e4m3 value;
  value.__x = bits;
  return static_cast<float>(value);
}
// Four packed e4m3 (little-endian in a word) -> four floats.
__device__ __forceinline__ void e4m3x4_to_float(uint32_t word, float (&out)[4]) {
  const __half2_raw low =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw high =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&low));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&high));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}
// Four packed e4m3 times `scale` -> two f16 pairs (exact conversion, one f16 rounding).
__device__ __forceinline__ void e4m3x4_scaled_to_half2(uint32_t word, __half2 scale, uint32_t& low,
                                                       uint32_t& high) {
  const __half2_raw a =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw b =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&a), scale);
  const __half2 y = __hmul2(*reinterpret_cast<const __half2*>(&b), scale);
  low = *reinterpret_cast<const uint32_t*>(&x);
  high = *reinterpret_cast<const uint32_t*>(&y);
}
__device__ __forceinline__ uint32_t pack_half2(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ uint8_t float_to_e4m3(float value) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
}

// bf16 bits of x, round to nearest even, in integer arithmetic (NaN ->
// 0x7fc0): the glue kernels' rounding (CUDA 13.0 mis-stored the low byte of a
// __nv_bfloat16 there: docs/benchmarks.md), shared so that a fused kernel
// rounds as the pair of kernels it replaces.
__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// ---- Radix order ---------------------------------------------------------------
// Monotone map: a > b as floats  <=>  ordered(a) > ordered(b) as unsigned.
__device__ __forceinline__ uint32_t float_to_ordered(float value) {
  const uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace megactx::cuda

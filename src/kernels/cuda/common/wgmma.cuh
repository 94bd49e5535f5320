// Hopper warpgroup MMA (wgmma, sm_90a) plumbing shared by the kernels that use
// it (the fused indexer + top-k, the sparse MLA prefill kernel): fences and
// commit groups, shared-memory matrix descriptors, register reallocation
// between warpgroups, named barriers and plain mbarrier arrivals. The MMA
// instructions themselves live beside the kernel that uses each shape. Only
// for .cu files.
#pragma once

#include <cstdint>

namespace megactx::cuda {

// ---- wgmma ---------------------------------------------------------------------
// Orders register writes (A fragments, accumulators) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Waits until at most `Pending` committed groups are still running.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Keeps the compiler from moving reads of an accumulator across wgmma_wait_all
// (the asm statements above name no registers).
__device__ __forceinline__ void fence_operand(float& value) {
  asm volatile("" : "+f"(value)::"memory");
}

// Shared-memory descriptor of a K-major operand tile in the 128-byte swizzle
// layout: rows of 128 bytes, 8-row atoms of 1024 bytes (stride byte offset),
// 16-byte chunk c of row r stored at chunk c ^ (r % 8); the tile 1024-byte
// aligned. `address` may point 32 * s bytes into the first row (k-step s).
__device__ __forceinline__ uint64_t swizzle128_descriptor(uint32_t address) {
  uint64_t descriptor = (address & 0x3ffffu) >> 4;  // start address >> 4, bits 0-13
  descriptor |= uint64_t{1} << 16;                  // leading byte offset (unused when swizzled)
  descriptor |= uint64_t{1024 >> 4} << 32;          // stride byte offset: one 8-row atom
  descriptor |= uint64_t{1} << 62;                  // layout: 128-byte swizzle
  return descriptor;
}

// Shared-memory descriptor of an MN-major operand (B with imm-trans-b = 1, 16-bit
// types) in the 128-byte swizzle layout: 64 consecutive N elements per
// 128-byte row, 8-row atoms of 1024 bytes along K; `n_stride` bytes between
// the tiles of the next 64 N elements (leading byte offset) and 1024 between
// 8-row K groups (stride byte offset).
__device__ __forceinline__ uint64_t swizzle128_mn_descriptor(uint32_t address, uint32_t n_stride) {
  uint64_t descriptor = (address & 0x3ffffu) >> 4;
  descriptor |= uint64_t{(n_stride >> 4) & 0x3fffu} << 16;
  descriptor |= uint64_t{1024 >> 4} << 32;
  descriptor |= uint64_t{1} << 62;
  return descriptor;
}

// The two 32-bit words of the descriptors above, for kernels that step a
// tile's start address by adding (offset >> 4) to the low word in uniform
// registers: shared memory lies below 256 KiB, so the 14-bit address field
// never carries into the leading byte offset.
inline constexpr uint32_t kSwizzle128DescriptorHigh = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t swizzle128_descriptor_low(uint32_t address) {
  return ((address & 0x3ffffu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint32_t swizzle128_mn_descriptor_low(uint32_t address,
                                                                 uint32_t n_stride) {
  return ((address & 0x3ffffu) >> 4) | (((n_stride >> 4) & 0x3fffu) << 16);
}
__device__ __forceinline__ uint64_t descriptor_from_words(uint32_t low, uint32_t high) {
  return (uint64_t{high} << 32) | low;
}

// ---- Registers ----------------------------------------------------------------
// Moves registers between warpgroups (sm_90a); takes effect only when the kernel
// has a register cap at entry (__launch_bounds__(threads, 1)).
template <int Registers>
__device__ __forceinline__ void set_max_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void set_max_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// ---- Barriers -----------------------------------------------------------------
// Named barrier `id` (1..15) over `threads` threads (a multiple of 32), in
// its non-aligned form (`barrier.sync`), which any thread may reach on its own
// path. The aligned `bar.sync` (= `barrier.sync.aligned`) requires every thread
// of the CTA that reaches the barrier to do so at the same instruction,
// converged; warp-specialised kernels reach a shared barrier from different
// code (producer and consumers, one instantiation per warpgroup), and with
// `bar.sync` there the fused indexer + top-k lost candidates about one run in
// six (synccheck: "divergent threads in block"); __syncwarp before `bar.sync`
// did not cure it.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the barrier completes when
// `threads` threads have arrived or synced).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The aligned form, for a barrier that every participating thread reaches at
// this one instruction with its warp converged (the fused indexer's barriers
// within a warpgroup: the non-aligned form made that kernel 11% slower).
__device__ __forceinline__ void named_barrier_aligned(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// One plain arrival (no transaction bytes) on an mbarrier in shared memory.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(barrier));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(address) : "memory");
}
// Generic-proxy writes to shared memory (st.shared) become visible to the
// async proxy (wgmma operand reads, bulk copies) after this and a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace megactx::cuda

// Hopper warpgroup MMA (wgmma, sm_90a) plumbing shared by the kernels that use
// it (the fused indexer + top-k, the sparse MLA prefill kernel): fences and
// commit groups, shared-memory matrix descriptors, register reallocation
// between warpgroups, named barriers and plain mbarrier arrivals. The MMA
// instructions themselves live beside the kernel that uses each shape. Only
// for .cu files.
#pragma once

#include <cstdint>

// ---- Accumulator operands -----------------------------------------------------
// The accumulator registers of a wgmma asm statement whose operands start with
// an accumulator array `d` of N floats: the "{%0, ..., %N-1}" text and the N
// "+f"(d[i]) operands (the instruction's other operands are numbered from N).
#define MEGACTX_WGMMA_D8_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define MEGACTX_WGMMA_D8(d)                                                           \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]), \
      "+f"((d)[6]), "+f"((d)[7])
#define MEGACTX_WGMMA_D16_TEXT \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MEGACTX_WGMMA_D16(d)                                                                \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),       \
      "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]), \
      "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15])
#define MEGACTX_WGMMA_D32_TEXT                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MEGACTX_WGMMA_D32(d)                                                                    \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),           \
      "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]),     \
      "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]), \
      "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]), \
      "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]), \
      "+f"((d)[30]), "+f"((d)[31])
#define MEGACTX_WGMMA_D64_TEXT                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define MEGACTX_WGMMA_D64(d)                                                                    \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),           \
      "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]),     \
      "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]), \
      "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]), \
      "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]), \
      "+f"((d)[30]), "+f"((d)[31]), "+f"((d)[32]), "+f"((d)[33]), "+f"((d)[34]), "+f"((d)[35]), \
      "+f"((d)[36]), "+f"((d)[37]), "+f"((d)[38]), "+f"((d)[39]), "+f"((d)[40]), "+f"((d)[41]), \
      "+f"((d)[42]), "+f"((d)[43]), "+f"((d)[44]), "+f"((d)[45]), "+f"((d)[46]), "+f"((d)[47]), \
      "+f"((d)[48]), "+f"((d)[49]), "+f"((d)[50]), "+f"((d)[51]), "+f"((d)[52]), "+f"((d)[53]), \
      "+f"((d)[54]), "+f"((d)[55]), "+f"((d)[56]), "+f"((d)[57]), "+f"((d)[58]), "+f"((d)[59]), \
      "+f"((d)[60]), "+f"((d)[61]), "+f"((d)[62]), "+f"((d)[63])
#define MEGACTX_WGMMA_D128_TEXT                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127}"
#define MEGACTX_WGMMA_D128(d)                                                                     \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),             \
      "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]),       \
      "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]),   \
      "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]),   \
      "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]),   \
      "+f"((d)[30]), "+f"((d)[31]), "+f"((d)[32]), "+f"((d)[33]), "+f"((d)[34]), "+f"((d)[35]),   \
      "+f"((d)[36]), "+f"((d)[37]), "+f"((d)[38]), "+f"((d)[39]), "+f"((d)[40]), "+f"((d)[41]),   \
      "+f"((d)[42]), "+f"((d)[43]), "+f"((d)[44]), "+f"((d)[45]), "+f"((d)[46]), "+f"((d)[47]),   \
      "+f"((d)[48]), "+f"((d)[49]), "+f"((d)[50]), "+f"((d)[51]), "+f"((d)[52]), "+f"((d)[53]),   \
      "+f"((d)[54]), "+f"((d)[55]), "+f"((d)[56]), "+f"((d)[57]), "+f"((d)[58]), "+f"((d)[59]),   \
      "+f"((d)[60]), "+f"((d)[61]), "+f"((d)[62]), "+f"((d)[63]), "+f"((d)[64]), "+f"((d)[65]),   \
      "+f"((d)[66]), "+f"((d)[67]), "+f"((d)[68]), "+f"((d)[69]), "+f"((d)[70]), "+f"((d)[71]),   \
      "+f"((d)[72]), "+f"((d)[73]), "+f"((d)[74]), "+f"((d)[75]), "+f"((d)[76]), "+f"((d)[77]),   \
      "+f"((d)[78]), "+f"((d)[79]), "+f"((d)[80]), "+f"((d)[81]), "+f"((d)[82]), "+f"((d)[83]),   \
      "+f"((d)[84]), "+f"((d)[85]), "+f"((d)[86]), "+f"((d)[87]), "+f"((d)[88]), "+f"((d)[89]),   \
      "+f"((d)[90]), "+f"((d)[91]), "+f"((d)[92]), "+f"((d)[93]), "+f"((d)[94]), "+f"((d)[95]),   \
      "+f"((d)[96]), "+f"((d)[97]), "+f"((d)[98]), "+f"((d)[99]), "+f"((d)[100]), "+f"((d)[101]), \
      "+f"((d)[102]), "+f"((d)[103]), "+f"((d)[104]), "+f"((d)[105]), "+f"((d)[106]),             \
      "+f"((d)[107]), "+f"((d)[108]), "+f"((d)[109]), "+f"((d)[110]), "+f"((d)[111]),             \
      "+f"((d)[112]), "+f"((d)[113]), "+f"((d)[114]), "+f"((d)[115]), "+f"((d)[116]),             \
      "+f"((d)[117]), "+f"((d)[118]), "+f"((d)[119]), "+f"((d)[120]), "+f"((d)[121]),             \
      "+f"((d)[122]), "+f"((d)[123]), "+f"((d)[124]), "+f"((d)[125]), "+f"((d)[126]),             \
      "+f"((d)[127])

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

// The ceiling of the fp8-ring sparse MLA prefill layout
// (src/kernels/cuda/sparse_mla/sparse_mla_prefill_fp8ring.cu): the K ring kept
// in fp8 (the pool's 656-byte entries, so a producer fills it with cp.async and
// no registers) and converted by the consumers straight into wgmma A fragments
// (docs/benchmarks.md, twenty-eighth session). This probe times only the
// consumers' MMA loops, with the kernel's own fragment builders: two
// warpgroups, one CTA per query row, per bunch of 128 keys (two 64-key blocks)
// consumer c
//
//   S^T_c[64 keys][64 heads] = K_c . Q^T   36 x wgmma m64n64k16, A = K_c from
//       registers (a 4-byte load of e4m3 per row and k-step, converted and
//       scaled; the rope dims from bf16), B = Q [64 heads][576] f16 in shared
//       memory, K-major (the committed kernel's Q tile)
//   P^T_c = exp2(S^T_c - 8) written to shared memory [64 keys][64 heads] f16
//       (MN-major for the next MMA), both consumers behind one barrier
//   O^T_c[256 dims][64 heads] += V^T . P^T over both blocks
//       4 dim tiles x 8 key steps of wgmma m64n64k16, A = V^T from registers
//       (a 2-byte load of two adjacent dims per key, converted, keys paired with
//       prmt, scaled by each key's group scale), B = P^T
//
// over a ring that is never refilled (no producer, no row max: the kernel's
// softmax adds a vote per bunch and is not timed here). The key order inside a
// 16-key step is permuted (slot 2t + e <-> key t + 4e..) so that the 2-byte
// loads of a warp hit 32 distinct banks at the 656-byte pitch; what the
// numbers mean does not depend on the values, so the probe checks none.
//
//   sparse_mla_fragment_probe [--rows N] [--bunches N]
//
// Prints TFLOP/s of the whole consumer loop, of the scores alone and of the
// output alone (2 x 64 heads x 1088 x keys per row, as dsa_attention_bench
// counts) and their share of cuBLAS's bf16 GEMM measured in the same run
// (the f16 wgmma rate). On an H100 (docs/benchmarks.md, twenty-ninth session):
// 576 TFLOP/s with the group scales hoisted (504 with a scale load per
// fragment); the f16-ring layout's consumers with a stubbed producer ran at
// 421-434, the whole fp8-ring kernel at 369-378 over a 32K prompt.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/cuda/support/gemm_ceiling.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/sparse_mla/fp8_fragments.cuh"

using namespace megactx::cuda;

namespace {

constexpr int kHeads = 64, kDim = 576, kLatent = 512;
constexpr int kEntry = 656, kScaleOffset = 512, kRopeOffset = 528;
constexpr int kBlockKeys = 64;
constexpr int kThreads = 256;

// Shared memory from a 1024-byte aligned base.
constexpr int kQOffset = 0;                               // [9][64 heads][128 B] f16, swizzled
constexpr int kQChunkBytes = kHeads * 128;                // 8192
constexpr int kRingOffset = kQOffset + 9 * kQChunkBytes;  // [2 blocks][64 keys][656 B]
constexpr int kPOffset = kRingOffset + 2 * kBlockKeys * kEntry + 512;  // 1024-aligned below
constexpr int kPBytes = kBlockKeys * 128;                              // [64 keys][64 heads] f16
constexpr int kSharedBytes = kPOffset + 2 * kPBytes + 2048;

// kParts: 1 scores, 2 output, 3 both.
template <int kParts>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(int bunches, float* sink) {
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  const int tid = static_cast<int>(threadIdx.x);
  const int c = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  uint8_t* ring = shared + kRingOffset;
  uint8_t* p_tiles = shared + ((kPOffset + 1023) / 1024) * 1024;

  // Deterministic contents: e4m3 bytes of small magnitude, scales 2^-4, rope
  // bf16 0.5; Q f16 0.25 (values do not matter to the timing, NaNs might).
  for (int i = tid; i < 9 * kQChunkBytes / 4; i += kThreads)
    reinterpret_cast<uint32_t*>(shared + kQOffset)[i] = 0x34003400u;
  for (int i = tid; i < 2 * kBlockKeys * kEntry / 4; i += kThreads) {
    const int byte = (4 * i) % kEntry;
    uint32_t word = 0x30303030u ^ static_cast<uint32_t>(i * 0x01010101u & 0x07070707u);
    if (byte >= kScaleOffset && byte < kRopeOffset) word = __float_as_uint(0.0625f);
    if (byte >= kRopeOffset) word = 0x3f003f00u;
    reinterpret_cast<uint32_t*>(ring)[i] = word;
  }
  fence_proxy_async_shared();
  __syncthreads();

  const uint32_t q_address = shared_address(shared + kQOffset);
  const uint32_t p_address = shared_address(p_tiles);
  float s[32];
  float o[128];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  // The kernel's own fragment builders (fp8_fragments.cuh): score rows 16w + g
  // and + 8 of block c; output dims 256c + 64m + 16w + 2g (+ 1) of keys t + 4e
  // of key step ks (block ks / 4).
  const uint8_t* key_row0 = ring + c * kBlockKeys * kEntry + (16 * warp + g) * kEntry;
  const uint8_t* key_row1 = key_row0 + 8 * kEntry;
  const ScoreScales score_scales = entry_score_scales(key_row0, key_row1);
  auto score_fragment = [&](int ks, uint32_t(&a)[4]) {
    entry_score_fragment(key_row0, key_row1, ks, t, score_scales, a);
  };
  // Built in order, key step ks-major as in the kernel: the step's scales of
  // both groups, loaded at m = 0, serve its four fragments.
  OutputScales output_scales;
  auto output_fragment = [&](int m, int ks, uint32_t(&a)[4]) {
    const uint8_t* keys = ring + ((ks / 4) * kBlockKeys + 16 * (ks % 4) + t) * kEntry;
    if (m == 0) output_scales = entry_output_scales(keys, 2 * c);
    entry_output_fragment(keys, 256 * c + 64 * m + 16 * warp + 2 * g, output_scales.pair[m / 2], a);
  };

  for (int bunch = 0; bunch < bunches; ++bunch) {
    if constexpr (kParts & 1) {
      uint32_t a[3][4];
      score_fragment(0, a[0]);
      score_fragment(1, a[1]);
#pragma unroll
      for (int ks = 0; ks < 36; ++ks) {
        wgmma_fence();
        const uint32_t q_low =
            swizzle128_descriptor_low(q_address) + (((ks / 4) * kQChunkBytes + (ks % 4) * 32) >> 4);
        wgmma_m64n64k16_rs<0>(s, a[ks % 3], descriptor_from_words(q_low, kSwizzle128DescriptorHigh),
                              ks > 0);
        wgmma_commit();
        if (ks + 2 < 36) {
          wgmma_wait<1>();
          score_fragment(ks + 2, a[(ks + 2) % 3]);
        }
      }
      wgmma_wait_all();
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(s[i]);
      // P^T_c [64 keys][64 heads] f16, MN-major, 128-byte swizzle: thread
      // values (key 16w + g + 8r, heads 8j + 2t, + 1).
      uint8_t* p_tile = p_tiles + c * kPBytes;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = 16 * warp + g + 8 * r;
          *reinterpret_cast<uint32_t*>(p_tile + key * 128 + ((j ^ (key & 7)) << 4) + 4 * t) =
              pack_half2(exp2f(s[4 * j + 2 * r] - 8.f), exp2f(s[4 * j + 2 * r + 1] - 8.f));
        }
      fence_proxy_async_shared();
    }
    named_barrier(1, kThreads);
    if constexpr (kParts & 2) {
      uint32_t a[3][4];
      output_fragment(0, 0, a[0]);
      output_fragment(1, 0, a[1]);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int m = i % 4, ks = i / 4;
        wgmma_fence();
        const uint32_t p_low =
            swizzle128_mn_descriptor_low(p_address + (ks / 4) * kPBytes, kPBytes) +
            (((ks % 4) * 16 * 128) >> 4);
        wgmma_m64n64k16_rs<1>(o + 32 * m, a[i % 3],
                              descriptor_from_words(p_low, kSwizzle128DescriptorHigh), 1);
        wgmma_commit();
        if (i + 2 < 32) {
          wgmma_wait<1>();
          output_fragment((i + 2) % 4, (i + 2) / 4, a[(i + 2) % 3]);
        }
      }
      wgmma_wait_all();
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(o[i]);
    }
    named_barrier(1, kThreads);
  }
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) total += o[i];
#pragma unroll
  for (int i = 0; i < 32; ++i) total += s[i];
  if (total == 12345.f) sink[blockIdx.x * kThreads + tid] = total;  // keeps the work alive
}

template <int kParts>
double time_ms(int rows, int bunches, float* sink) {
  MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
      probe_kernel<kParts>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  cudaEvent_t start, stop;
  MEGACTX_CUDA_CHECK(cudaEventCreate(&start));
  MEGACTX_CUDA_CHECK(cudaEventCreate(&stop));
  probe_kernel<kParts><<<rows, kThreads, kSharedBytes>>>(bunches, sink);  // warm-up
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    MEGACTX_CUDA_CHECK(cudaEventRecord(start));
    probe_kernel<kParts><<<rows, kThreads, kSharedBytes>>>(bunches, sink);
    MEGACTX_CUDA_CHECK(cudaEventRecord(stop));
    MEGACTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = ms < best ? ms : best;
  }
  MEGACTX_CUDA_CHECK(cudaEventDestroy(start));
  MEGACTX_CUDA_CHECK(cudaEventDestroy(stop));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 16384, bunches = 16;  // a 16K-row chunk, top-k 2048
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) rows = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--bunches") && i + 1 < argc) bunches = std::atoi(argv[++i]);
  }
  try {
    cudaDeviceProp prop{};
    MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    float* sink = nullptr;
    MEGACTX_CUDA_CHECK(cudaMalloc(&sink, size_t(rows) * kThreads * sizeof(float)));
    const double keys = double(rows) * bunches * 2 * kBlockKeys;
    const double score_flops = 2.0 * kHeads * kDim * keys;
    const double output_flops = 2.0 * kHeads * kLatent * keys;
    const double both = time_ms<3>(rows, bunches, sink);
    const double scores = time_ms<1>(rows, bunches, sink);
    const double output = time_ms<2>(rows, bunches, sink);
    std::printf("# sparse MLA fragment probe (%s, %d SMs): %d rows x %d keys, 64 heads\n\n",
                prop.name, prop.multiProcessorCount, rows, bunches * 2 * kBlockKeys);
    const double ceiling = measure_bf16_gemm_tflops();
    std::printf("ceiling measured in this run: cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n\n", ceiling);
    std::printf("| part | ms | TFLOP/s | of the ceiling |\n|---|---|---|---|\n");
    const auto row = [&](const char* name, double ms, double flops) {
      const double tflops = flops / (ms * 1e-3) / 1e12;
      std::printf("| %s | %.2f | %.0f | %.0f%% |\n", name, ms, tflops,
                  ceiling > 0 ? 100.0 * tflops / ceiling : 0.0);
    };
    row("scores + output (the consumer loop)", both, score_flops + output_flops);
    row("scores alone (S^T = K Q^T, K converted)", scores, score_flops);
    row("output alone (O^T = V^T P^T, V converted)", output, output_flops);
    MEGACTX_CUDA_CHECK(cudaFree(sink));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sparse_mla_fragment_probe: %s\n", error.what());
    return 1;
  }
  return 0;
}

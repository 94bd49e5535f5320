// Byte layouts of the fp8 DSA caches as the CUDA kernels read them (the same
// layouts as cache/kv_cache.h). Plain constants: safe in .cu and .cpp files.
#pragma once

namespace megactx::cuda {

inline constexpr int kPageTokens = 64;  // tokens per page; slot = page * 64 + offset

// Indexer key, per token: 128 e4m3 | fp32 scale.
inline constexpr int kIndexerHeadDim = 128;
inline constexpr int kIndexerKeyBytes = 132;

// Latent entry, per token: 512 e4m3 | 4 fp32 scales (one per 128) | 64 bf16 rope.
inline constexpr int kLatentRank = 512;
inline constexpr int kLatentRope = 64;
inline constexpr int kLatentGroup = 128;
inline constexpr int kLatentScaleOffset = kLatentRank;                                    // 512
inline constexpr int kLatentRopeOffset = kLatentRank + 4 * (kLatentRank / kLatentGroup);  // 528
inline constexpr int kLatentBytes = kLatentRopeOffset + 2 * kLatentRope;                  // 656

}  // namespace megactx::cuda

// The device steps of the gathered MoE dispatch of data-parallel attention
// (model/expert_dispatch.h): after every rank's rows and routing are
// gathered, the routing made local to this rank's experts; after the
// partial sums come back, each rank's chunk added up. Grids depend on the
// sizes only (never on the routing), so CUDA Graphs hold them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// routing [ranks, 2, pairs_per_rank] 4-byte words, one block per rank: its
// rows' expert ids (int32, global, -1 for padding) then their gates
// (float32), each [rows, top_k] (pairs_per_rank = rows x top_k). Writes
// local_ids [ranks * pairs_per_rank] (id - first_expert when the id is one
// of this rank's local_experts, else -1, which the grouped MoE leaves out)
// and gates [ranks * pairs_per_rank].
void localize_gathered_routing(const int32_t* routing, int64_t ranks, int64_t pairs_per_rank,
                               int64_t first_expert, int64_t local_experts, int32_t* local_ids,
                               float* gates, cudaStream_t stream);

// out[i] = chunks[0][i] + chunks[1][i] + ... + chunks[ranks - 1][i] (+ shared[i]
// last when shared is not null), i < count; chunk q starts at chunks + q *
// chunk_floats (count <= chunk_floats). The sum in rank order, so the result
// does not depend on scheduling.
void sum_rank_chunks(const float* chunks, int64_t ranks, int64_t chunk_floats, int64_t count,
                     const float* shared, float* out, cudaStream_t stream);

}  // namespace megactx::cuda

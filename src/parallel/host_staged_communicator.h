// The Communicator on device buffers, carried through host memory by a CPU
// group: each call waits for its CUDA stream, copies the device data to the
// host, runs the CPU group's collective, and copies the result back.
//
// Why it exists: NCCL refuses two ranks on one GPU ("Duplicate GPU
// detected"), so on a machine with one GPU the CUDA model's parallel layouts
// (ranks' weight shares, partial sums, expert dispatch) could only run as a
// group of one rank. With this communicator a group of several processes on
// one GPU (CudaModelOptions::gpu_id_step = 0, collectives = host) runs the
// same model code as a group on several GPUs, so its parity with one process
// can be tested where only one GPU is lent. It synchronises the stream at
// every call, so a model on it runs without CUDA Graphs; it is for tests and
// development, never for speed.
#pragma once

#include <memory>

#include "parallel/communicator.h"

namespace megactx::parallel {

// `host_group` (not owned, outlives the result) is the same ranks' CPU
// communicator; `stream` the cudaStream_t the data is ordered on (null: the
// default stream). split() splits the host group and stages the same way.
std::unique_ptr<Communicator> make_host_staged_communicator(Communicator& host_group, void* stream);

}  // namespace megactx::parallel

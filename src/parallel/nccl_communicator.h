// The Communicator over NCCL, for ranks on GPUs (one process per GPU): the
// same collectives as the CPU communicator, on device memory.
//
// Semantics that differ from the CPU communicator: every call is enqueued on
// the communicator's CUDA stream and returns before it has run (work queued on
// that stream afterwards sees the result; NCCL's own order is the call
// order), and barrier() waits for the stream. A rank that never arrives
// blocks NCCL (it has no timeout of its own); the CPU group that carried the
// unique id has one.
//
// NCCL is loaded at run time (dlopen), so that megactx builds where only the
// CUDA toolkit is installed (NCCL is not part of it): from
// NcclCommunicatorOptions::library, else $MEGACTX_NCCL_LIBRARY, else
// libnccl.so.2 on the loader's path (on the GPU machine, the copy PyTorch's
// nvidia-nccl wheel brings; scripts/gpu-check.sh finds it).
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace megactx::parallel {

struct NcclCommunicatorOptions {
  int rank = 0;
  int size = 1;
  int device = 0;          // this rank's CUDA device
  void* stream = nullptr;  // the cudaStream_t the collectives go on (null: the default stream)
  // A group of the same ranks (the CPU communicator) that carries NCCL's
  // unique id from rank 0 to the others; may be null when size is 1.
  Communicator* bootstrap = nullptr;
  std::string library;  // "" : $MEGACTX_NCCL_LIBRARY, else libnccl.so.2
  // Several ranks of the group on one GPU (CudaModelOptions::gpu_id_step 0,
  // for tests where one GPU is lent). NCCL refuses two ranks on one device of
  // one host ("Duplicate GPU detected"), so each rank names itself a host of
  // its own (NCCL_HOSTID, set per rank) and the ranks
  // then meet over NCCL's socket transport on the loopback interface
  // (NCCL_SOCKET_IFNAME=lo and NCCL_IB_DISABLE=1, unless set): slow, but the
  // same collectives.
  bool ranks_share_device = false;
};

// Joins the group (collective over the bootstrap group); megactx::Error when
// NCCL cannot be loaded or the group does not form.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclCommunicatorOptions& options);

// Communicator::split of an NCCL group whose collectives go on `stream` (a
// cudaStream_t) instead of the group's: collectives that overlap the group's
// own (LayerSplit's entries on a side stream). Null when `group` is not an
// NCCL communicator (host-staged collectives: the caller uses the group).
std::unique_ptr<Communicator> split_nccl_on_stream(Communicator& group, int color, int key,
                                                   void* stream);

// Whether NCCL loads from `library` (as above when empty) and reports a
// version; `why` gets the reason when not, or the version when it does.
bool nccl_available(const std::string& library = "", std::string* why = nullptr);

}  // namespace megactx::parallel

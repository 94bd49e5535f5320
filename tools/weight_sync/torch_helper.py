"""torch on behalf of `megactx serve`: the two SGLang weight transports whose formats are torch's.

1. NCCL weight updates (/init_weights_update_group, /update_weights_from_distributed,
   /destroy_weights_update_group): the trainer creates a torch.distributed group through a TCP
   rendezvous and broadcasts each tensor from its rank 0 to the engine's ranks. The rendezvous
   store's wire format, its key layout and the collectives' handshakes change between torch
   versions, so megactx does not re-implement them: the server starts this script (mode
   "group") once per rank it holds, and the script joins exactly as SGLang's engine does
   (`init_custom_process_group`: the tcp:// rendezvous, a PrefixStore named by the group, then
   torch's own process-group constructor), with the backend the trainer names (nccl on GPUs,
   gloo on CPUs).
2. Tensor updates (/update_weights_from_tensor): the trainer pickles its tensors with torch's
   multiprocessing reductions (a CUDA tensor travels as an IPC handle, SGLang's patch naming
   the device by UUID; a host tensor as a shared-memory file), base64 in JSON. Mode "tensors"
   opens them, as SGLang's model runner does (LocalSerializedTensor, the "flattened_bucket"
   format), from an allowlist of classes only: a payload that names anything else is refused,
   never run.

The server runs this file with the trainer's interpreter (`serve --weight-update-python`,
default python3) and compiles it into its binary; it is never read from disk.

Protocol (the server is the only peer):
  argv[1]  JSON {"mode": "group" | "tensors", "device": "cpu" or a CUDA ordinal, "timeout_s",
                 group: "master_address", "master_port", "rank", "world_size", "group_name",
                 "backend", "send_bytes"}
  stdout   one JSON line per answer: {"ok": true, ...} or {"ok": false, "error": "..."}; after a
           successful answer that lists "bytes", every tensor's bytes follow, in order,
           row-major (nothing else ever goes to stdout: fd 1 is re-pointed at stderr).
  stdin    one JSON command per line:
           group:   {"cmd": "receive", "tensors": [{"dtype": "bfloat16", "shape": [4, 8]}, ...],
                     "flattened": false}
                    dist.broadcast of each tensor from group rank 0, in order (flattened: one
                    broadcast of all their bytes as one uint8 tensor);
           tensors: {"cmd": "load", "payload": "<base64>", "load_format": null | "direct" |
                    "flattened_bucket", "rank": 0} -> {"ok", "names", "dtypes", "shapes",
                    "bytes"} and the bytes;
           both:    {"cmd": "destroy"} leaves (the group) and exits. End of input: exits.
The script dies with the server (PR_SET_PDEATHSIG), so a killed server leaves no helper behind.
Importing it runs nothing: tests take init_custom_process_group from here for the trainer's side.
"""
import base64
import io
import json
import os
import pickle
import sys
from datetime import timedelta

PROTOCOL = None  # main(): the server's end of the pipe


def answer(fields):
    PROTOCOL.write((json.dumps(fields) + "\n").encode())
    PROTOCOL.flush()


def send_tensors(torch, tensors, fields):
    """The answer with each tensor's byte count, then the bytes themselves."""
    answer(dict(fields, ok=True, bytes=[t.numel() * t.element_size() for t in tensors]))
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
        PROTOCOL.write(memoryview(flat.numpy()))
    PROTOCOL.flush()


def die_with_parent():
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the server died before prctl took effect
            sys.exit(1)
    except (OSError, AttributeError):
        pass  # not Linux: the helper exits at the end of its input instead


# ---------------------------------------------------------------- mode "group"

def init_custom_process_group(address, port, world_size, rank, group_name, backend, timeout_s):
    """What SGLang's init_custom_process_group does (slime copies it for the trainer's side), for
    torch 1.13 to 2.x: a tcp:// rendezvous, a PrefixStore named by the group, then torch's own
    process-group constructor; the group registered so that dist.broadcast takes it."""
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    timeout = timedelta(seconds=float(timeout_s))
    url = "tcp://{}:{}".format(address, port)
    store, rank, world_size = next(rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(group_name, store)
    parameters = inspect.signature(c10d._new_process_group_helper).parameters
    options = {"backend_options" if "backend_options" in parameters else "pg_options": None}
    made = c10d._new_process_group_helper(world_size, rank, [], backend, store,
                                          group_name=group_name, timeout=timeout, **options)
    group = made[0] if isinstance(made, tuple) else made
    ranks = {i: i for i in range(world_size)}
    if hasattr(c10d, "_world"):
        c10d._world.pg_group_ranks[group] = ranks
    else:
        c10d._pg_group_ranks[group] = ranks
    return group


def join(config):
    import torch
    import torch.distributed as dist

    if config["device"] != "cpu" and config["backend"] == "nccl":
        torch.cuda.set_device(int(config["device"]))
    group = init_custom_process_group(config["master_address"], config["master_port"],
                                      config["world_size"], config["rank"], config["group_name"],
                                      config["backend"], config["timeout_s"])
    return torch, dist, group


def _numel(shape):
    count = 1
    for size in shape:
        count *= int(size)
    return count


def serve_group(config):
    try:
        torch, dist, group = join(config)
    except Exception as error:  # noqa: BLE001 - every failure is an answer to the server
        answer({"ok": False, "error": "joining the group failed: {}: {}".format(
            type(error).__name__, error)})
        return 1
    # gloo broadcasts host tensors (the server copies them to its GPU either way).
    on_host = config["device"] == "cpu" or config["backend"] == "gloo"
    device = "cpu" if on_host else "cuda:{}".format(config["device"])
    answer({"ok": True, "torch": torch.__version__, "backend": config["backend"]})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "destroy":
            try:
                dist.destroy_process_group(group)
            finally:
                answer({"ok": True})
            return 0
        received = []
        try:
            specs = []
            for spec in command["tensors"]:
                dtype = getattr(torch, spec["dtype"], None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError("torch {} has no dtype {}".format(torch.__version__,
                                                                       spec["dtype"]))
                specs.append((dtype, spec["shape"]))
            if command.get("flattened"):
                # SGLang's flattened_bucket: one broadcast of every tensor's bytes, in order,
                # as one uint8 tensor (FlattenedTensorBucket's layout).
                sizes = [torch.empty(0, dtype=dtype).element_size() * _numel(shape)
                         for dtype, shape in specs]
                flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
                dist.broadcast(flat, src=0, group=group)
                offset = 0
                for (dtype, shape), size in zip(specs, sizes):
                    received.append(flat[offset:offset + size].view(dtype).reshape(shape))
                    offset += size
            else:
                for dtype, shape in specs:
                    tensor = torch.empty(shape, dtype=dtype, device=device)
                    dist.broadcast(tensor, src=0, group=group)
                    received.append(tensor)
        except Exception as error:  # noqa: BLE001
            answer({"ok": False, "error": "receiving tensor {} of {} failed: {}: {}".format(
                len(received) + 1, len(command["tensors"]), type(error).__name__, error)})
            continue
        if config["send_bytes"]:
            send_tensors(torch, received, {})
        else:
            answer({"ok": True})
    return 0


# ---------------------------------------------------------------- mode "tensors"

class LocalSerializedTensor:
    """SGLang's: one serialized tensor per rank of the engine (values[rank])."""

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else state[1] or {})


class FlattenedTensorMetadata:
    """SGLang's: where a named tensor lies in a flattened bucket."""

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else state[1] or {})


# The only globals a payload may name. torch's own rebuild functions and types,
# the builtins pickle uses for containers, and SGLang's two payload classes
# (read into the stand-ins above, whatever SGLang module they were pickled from).
SGLANG_CLASSES = {"LocalSerializedTensor": LocalSerializedTensor,
                  "FlattenedTensorMetadata": FlattenedTensorMetadata}
ALLOWED_BUILTINS = {("builtins", n) for n in ("list", "dict", "tuple", "set", "frozenset",
                                              "bytearray", "slice", "int", "float", "str",
                                              "bytes", "bool", "complex")}
ALLOWED_GLOBALS = ALLOWED_BUILTINS | {("collections", "OrderedDict"),
                                      ("types", "SimpleNamespace"),
                                      ("copyreg", "_reconstructor"),
                                      ("torch.serialization", "_get_layout"),
                                      ("torch", "Size"), ("torch", "device"),
                                      ("torch", "dtype"), ("torch", "Tensor")}
ALLOWED_TORCH_MODULES = ("torch.multiprocessing.reductions", "torch._utils", "torch.storage",
                         "torch._tensor", "torch.nn.parameter")


class PayloadUnpickler(pickle.Unpickler):
    def __init__(self, data, torch):
        super().__init__(io.BytesIO(data))
        self.torch = torch

    def find_class(self, module, name):
        if module.startswith("sglang.") and name in SGLANG_CLASSES:
            return SGLANG_CLASSES[name]
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module in ALLOWED_TORCH_MODULES and not name.startswith("__"):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(self.torch, name, None), self.torch.dtype):
            return getattr(self.torch, name)  # torch.bfloat16 and friends
        if module in ("torch", "torch.cuda") and name.endswith("Storage"):
            return super().find_class(module, name)
        if module.startswith("multiprocessing"):
            raise pickle.UnpicklingError(
                "the payload shares a host tensor by file descriptor ({}.{}: torch's default "
                "strategy, which reaches only the trainer's own children): call "
                "torch.multiprocessing.set_sharing_strategy('file_system') before serializing, "
                "or send CUDA tensors".format(module, name))
        raise pickle.UnpicklingError("the payload names {}.{}, which megactx does not open (only "
                                     "torch tensors and SGLang's weight-update classes)"
                                     .format(module, name))


def patch_cuda_rebuild(torch):
    """SGLang's trainers name a CUDA tensor's device by UUID (their patch of torch's
    reductions, for processes that see the GPUs in other orders): map it back to an ordinal."""
    from torch.multiprocessing import reductions
    original = reductions.rebuild_cuda_tensor
    device_argument = 6  # rebuild_cuda_tensor(tensor_cls, size, stride, offset, storage_cls,
    #                       dtype, storage_device, ...)

    def rebuild(*args):
        device = args[device_argument]
        if isinstance(device, str):
            for ordinal in range(torch.cuda.device_count()):
                if str(torch.cuda.get_device_properties(ordinal).uuid) == device:
                    device = ordinal
                    break
            else:
                raise ValueError("no GPU here has the UUID " + device)
        return original(*args[:device_argument], device, *args[device_argument + 1:])

    reductions.rebuild_cuda_tensor = rebuild


def load_payload(torch, command):
    """A payload -> [(name, tensor)] as SGLang's update_weights_from_tensor reads it."""
    def deserialize(data):
        if isinstance(data, str):
            data = base64.b64decode(data)
        return PayloadUnpickler(data, torch).load()

    rank = int(command.get("rank", 0))
    loaded = deserialize(command["payload"])
    if command.get("load_format") == "flattened_bucket":
        if not isinstance(loaded, dict) or "flattened_tensor" not in loaded:
            raise ValueError("a flattened_bucket payload is a dict with 'flattened_tensor' and "
                             "'metadata'")
        flat = loaded["flattened_tensor"]
        named = []
        for meta in loaded["metadata"]:
            fields = meta.__dict__ if hasattr(meta, "__dict__") else meta
            part = flat[fields["start_idx"]:fields["end_idx"]]
            if flat.dtype == torch.uint8 and fields["dtype"] != torch.uint8:
                part = part.view(fields["dtype"])  # byte offsets (mixed dtypes)
            named.append((fields["name"], part.reshape(fields["shape"])))
        return named
    if not isinstance(loaded, (list, tuple)):
        raise ValueError("the payload holds {}, not a list of (name, tensor)".format(
            type(loaded).__name__))
    named = []
    for item in loaded:
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str):
            raise ValueError("the payload's entries must be (name, tensor) pairs")
        name, tensor = item
        if isinstance(tensor, LocalSerializedTensor):
            tensor = deserialize(tensor.values[rank])
        if not isinstance(tensor, torch.Tensor):
            raise ValueError("{} is a {}, not a tensor".format(name, type(tensor).__name__))
        named.append((name, tensor))
    return named


def serve_tensors(config):
    try:
        import torch
        import torch.multiprocessing  # noqa: F401 - registers the rebuild functions
        if torch.cuda.is_available():
            patch_cuda_rebuild(torch)
    except Exception as error:  # noqa: BLE001
        answer({"ok": False, "error": "starting torch failed: {}: {}".format(
            type(error).__name__, error)})
        return 1
    answer({"ok": True, "torch": torch.__version__})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "destroy":
            answer({"ok": True})
            return 0
        try:
            named = load_payload(torch, command)
            names = [name for name, _ in named]
            tensors = [tensor for _, tensor in named]
            fields = {"names": names,
                      "dtypes": [str(t.dtype).replace("torch.", "") for t in tensors],
                      "shapes": [list(t.shape) for t in tensors]}
        except Exception as error:  # noqa: BLE001
            answer({"ok": False, "error": "opening the tensors failed: {}: {}".format(
                type(error).__name__, error)})
            continue
        send_tensors(torch, tensors, fields)
        # The server has the bytes: let go of the trainer's memory now (a colocated trainer
        # wants it back, and a CUDA producer must not exit while this process holds it).
        del named, tensors
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
    return 0


def main():
    global PROTOCOL
    PROTOCOL = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # torch and NCCL log to stdout at times: never into the protocol
    die_with_parent()
    config = json.loads(sys.argv[1])
    if config.get("mode", "group") == "tensors":
        return serve_tensors(config)
    return serve_group(config)


if __name__ == "__main__":
    sys.exit(main())

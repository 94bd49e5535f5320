"""One rank of an RL trainer's torch.distributed group, on behalf of `megactx serve`.

SGLang's NCCL weight updates (/init_weights_update_group, /update_weights_from_distributed,
/destroy_weights_update_group) have the trainer create a torch.distributed group through a TCP
rendezvous and broadcast each tensor from its rank 0 to the engine's ranks. The rendezvous
store's wire format, its key layout and the collectives' own handshakes are torch's and change
between torch versions, so megactx does not re-implement them: the server starts this script
with the trainer's interpreter (`serve --weight-update-python`, default python3) once per rank
it holds in the group, and the script joins the group exactly as SGLang's engine does
(`init_custom_process_group`: the tcp:// rendezvous, a PrefixStore named by the group, then
torch's own process-group constructor), with the backend the trainer names (nccl on GPUs, gloo
on CPUs). The server compiles this file into its binary; it is never read from disk.

Protocol (the server is the only peer):
  argv[1]  JSON {"master_address", "master_port", "rank", "world_size", "group_name", "backend",
                 "timeout_s", "device" ("cpu" or a CUDA ordinal), "send_bytes"}
  stdout   one JSON line per answer: {"ok": true, ...} or {"ok": false, "error": "..."}; after a
           successful "receive" of a member with send_bytes, every tensor's bytes follow, in
           order, row-major (nothing else ever goes to stdout: fd 1 is re-pointed at stderr).
  stdin    one JSON command per line:
           {"cmd": "receive", "tensors": [{"dtype": "bfloat16", "shape": [4, 8]}, ...]}
               dist.broadcast of each tensor from group rank 0, in order;
           {"cmd": "destroy"} leaves the group and exits. End of input: exits.
The script dies with the server (PR_SET_PDEATHSIG), so a killed server leaves no member behind.
"""
import json
import os
import sys
from datetime import timedelta

PROTOCOL = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)  # torch and NCCL log to stdout at times: never into the protocol


def answer(fields):
    PROTOCOL.write((json.dumps(fields) + "\n").encode())
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
        pass  # not Linux: the member exits at the end of its input instead


def join(config):
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    if config["device"] != "cpu" and config["backend"] == "nccl":
        torch.cuda.set_device(int(config["device"]))
    timeout = timedelta(seconds=float(config["timeout_s"]))
    url = "tcp://{}:{}".format(config["master_address"], config["master_port"])
    store, rank, world_size = next(rendezvous(url, config["rank"], config["world_size"],
                                              timeout=timeout))
    store.set_timeout(timeout)
    # What SGLang's init_custom_process_group does, so that the trainer's side (the same
    # function in slime and SGLang) finds this rank's keys.
    store = dist.PrefixStore(config["group_name"], store)
    import inspect
    parameters = inspect.signature(c10d._new_process_group_helper).parameters
    options = {"backend_options" if "backend_options" in parameters else "pg_options": None}
    made = c10d._new_process_group_helper(world_size, rank, [], config["backend"], store,
                                          group_name=config["group_name"], timeout=timeout,
                                          **options)
    group = made[0] if isinstance(made, tuple) else made
    ranks = {i: i for i in range(world_size)}
    if hasattr(c10d, "_world"):
        c10d._world.pg_group_ranks[group] = ranks
    else:
        c10d._pg_group_ranks[group] = ranks
    return torch, dist, group


def main():
    die_with_parent()
    config = json.loads(sys.argv[1])
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
            for spec in command["tensors"]:
                dtype = getattr(torch, spec["dtype"], None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError("torch {} has no dtype {}".format(torch.__version__,
                                                                       spec["dtype"]))
                tensor = torch.empty(spec["shape"], dtype=dtype, device=device)
                dist.broadcast(tensor, src=0, group=group)
                received.append(tensor)
        except Exception as error:  # noqa: BLE001
            answer({"ok": False, "error": "receiving tensor {} of {} failed: {}: {}".format(
                len(received) + 1, len(command["tensors"]), type(error).__name__, error)})
            continue
        if not config["send_bytes"]:
            answer({"ok": True})
            continue
        answer({"ok": True, "bytes": [t.numel() * t.element_size() for t in received]})
        for tensor in received:
            if tensor.numel() == 0:
                continue
            flat = tensor.detach().reshape(-1).view(torch.uint8).cpu()
            PROTOCOL.write(memoryview(flat.numpy()))
        PROTOCOL.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The trainer's side of SGLang's NCCL weight updates, as slime and SGLang write it.

The trainer makes a torch.distributed group with a tcp:// rendezvous on its own address, a
PrefixStore named by the group and torch's process-group constructor (SGLang's
`init_custom_process_group`, which slime copies), as rank 0 of 1 + the engine's ranks, while
the engine joins through /init_weights_update_group; each /update_weights_from_distributed
then announces names, dtypes and shapes, and the trainer broadcasts the tensors from rank 0 in
that order. The HTTP call and the collective must overlap: the request is sent first
(http.client returns once it is written) and its answer read after the collective, so no
thread waits on the GIL while torch blocks in C++.
"""
import http.client
import inspect
import json
import socket
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.rendezvous import rendezvous


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(server_url, route, body):
    """Writes a POST request and returns the connection; answer() reads its answer."""
    url = urlparse(server_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    connection.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
    return connection


def answer(connection):
    response = connection.getresponse()
    status, text = response.status, response.read().decode()
    connection.close()
    return status, json.loads(text)


def init_custom_process_group(address, port, world_size, rank, group_name, backend, timeout_s):
    """SGLang's init_custom_process_group (python/sglang/srt/utils), for torch 1.13 to 2.x."""
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous("tcp://{}:{}".format(address, port), rank,
                                              world_size, timeout=timeout))
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


class TrainerGroup:
    """Rank 0 of a weight-update group with one engine (its ranks from rank_offset 1)."""

    def __init__(self, server_url, group_name, engine_ranks=1, backend="gloo", timeout_s=60):
        self.url = server_url
        self.name = group_name
        port = free_port()
        connection = send(server_url, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 1 + engine_ranks, "group_name": group_name, "backend": backend})
        self.group = init_custom_process_group("127.0.0.1", port, 1 + engine_ranks, 0,
                                               group_name, backend, timeout_s)
        self.status, self.answer = answer(connection)

    def update(self, tensors, broadcast=True, flattened=False, **fields):
        """One /update_weights_from_distributed call: {name: tensor}, broadcast in order, or
        (flattened) SGLang's flattened_bucket: one broadcast of all their bytes as uint8."""
        body = {"names": list(tensors),
                "dtypes": [str(t.dtype).replace("torch.", "") for t in tensors.values()],
                "shapes": [list(t.shape) for t in tensors.values()],
                "group_name": self.name}
        body.update(fields)
        if flattened:
            body["load_format"] = "flattened_bucket"
        connection = send(self.url, "/update_weights_from_distributed", body)
        if broadcast and flattened:
            flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8)
                              for t in tensors.values()])
            dist.broadcast(flat, src=0, group=self.group)
        elif broadcast:
            for tensor in tensors.values():
                dist.broadcast(tensor.contiguous(), src=0, group=self.group)
        return answer(connection)

    def destroy(self):
        status, body = answer(send(self.url, "/destroy_weights_update_group",
                                   {"group_name": self.name}))
        dist.destroy_process_group(self.group)
        return status, body

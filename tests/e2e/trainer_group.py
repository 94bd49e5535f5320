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
import json
import os
import socket
import sys
from urllib.parse import urlparse

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "weight_sync"))
from torch_helper import init_custom_process_group  # noqa: E402  (the server's side uses it too)


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

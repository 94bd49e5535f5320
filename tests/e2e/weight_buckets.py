"""Weight buckets as an RL trainer hands them to `megactx serve`: a safetensors file written
from raw tensors (stdlib only: the safetensors package is not a dependency), sent to
/update_weights_from_safetensors as the request body or as a file (in /dev/shm when the machine
has it). Shared by trainer_loop_test.py and fp8_weight_update_test.py.
"""
import json
import os
import struct
import tempfile

import requests


def safetensors_bytes(tensors):
    """{name: (dtype name, shape, raw little-endian bytes)} -> the bytes of a safetensors file
    (8-byte header length, JSON header padded to 8 bytes, then the data in header order)."""
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def buckets_of(tensors, limit):
    """Splits {name: tensor} into dicts of at most `limit` bytes each (slime-style buckets; a
    tensor larger than `limit` is a bucket of its own)."""
    buckets, current, size = [], {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def shm_dir():
    """Where a colocated trainer hands buckets over: /dev/shm when the machine has it."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()


def update_body(server, data, **query):
    """update_weights_from_safetensors with the safetensors bytes `data` as the request body."""
    params = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items()}
    return requests.post(server.url + "/update_weights_from_safetensors", params=params,
                         data=data, timeout=300,
                         headers={"Content-Type": "application/octet-stream"})


def update_file(server, data, directory=None, **fields):
    """update_weights_from_safetensors with `data` written to a file (removed afterwards)."""
    handle, path = tempfile.mkstemp(suffix=".safetensors", prefix="megactx-bucket-",
                                    dir=directory or shm_dir())
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        return requests.post(server.url + "/update_weights_from_safetensors",
                             json=dict(fields, path=path), timeout=300)
    finally:
        os.remove(path)

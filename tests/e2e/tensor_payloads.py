"""What SGLang's trainers send to /update_weights_from_tensor, made here without SGLang.

SGLang's MultiprocessingSerializer is torch's ForkingPickler (tensors reduced by
torch.multiprocessing: a CUDA tensor as an IPC handle, a host tensor as a shared-memory file
under the file_system strategy) in base64. The payload is a list of (name, tensor) pairs (verl
wraps each tensor in a LocalSerializedTensor holding one serialized tensor per engine rank) or,
with load_format "flattened_bucket" (slime), {"flattened_tensor": uint8 tensor, "metadata":
[FlattenedTensorMetadata]}. The two SGLang classes are defined here under SGLang's module names,
so the pickles name exactly what SGLang's would.
"""
import base64
import dataclasses
import io
import sys
import types
from multiprocessing.reduction import ForkingPickler
from typing import List

import torch
import torch.multiprocessing

# Host tensors reach another process only as shared-memory files.
torch.multiprocessing.set_sharing_strategy("file_system")


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    return sys.modules[name]


@dataclasses.dataclass
class LocalSerializedTensor:
    values: List[bytes]


@dataclasses.dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


for cls, module in ((LocalSerializedTensor, "sglang.srt.model_executor.model_runner"),
                    (FlattenedTensorMetadata, "sglang.srt.weight_sync.tensor_bucket")):
    cls.__module__ = module
    setattr(_module(module), cls.__name__, cls)


def pickled(obj):
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return buffer.getvalue()


def serialize(obj):
    """MultiprocessingSerializer.serialize(obj, output_str=True)."""
    return base64.b64encode(pickled(obj)).decode()


def named_payload(tensors, local=False):
    """[(name, tensor)], or verl's [(name, LocalSerializedTensor([rank 0's tensor]))]."""
    if local:
        return serialize([(name, LocalSerializedTensor([pickled(t)])) for name, t in tensors.items()])
    return serialize(list(tensors.items()))


def flattened_payload(tensors):
    """slime's flattened bucket: every tensor's bytes in one uint8 tensor, byte offsets.
    Returns (payload, the flattened tensor): keep the tensor until the server answered (the
    payload only names its memory)."""
    parts, metadata, offset = [], [], 0
    for name, tensor in tensors.items():
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
        metadata.append(FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, offset,
                                                offset + flat.numel(), tensor.numel()))
        parts.append(flat)
        offset += flat.numel()
    flattened = torch.cat(parts)
    return serialize({"flattened_tensor": flattened, "metadata": metadata}), flattened

"""Weight-sync time through `megactx serve`, every transport in one run.

A trainer's whole-model push (the checkpoint's tensors as float32, split into buckets of
`--bucket-mib`; the last bucket commits and names a new weight_version) timed end to end from
the trainer's side, for each transport an RL trainer may use:

  disk         an HF folder written by the trainer, then /update_weights_from_disk
  body         /update_weights_from_safetensors with each bucket as the request body
  shm          the same with each bucket as a /dev/shm file
  distributed  SGLang's NCCL transport: a torch.distributed group (gloo on the CPU, --backend
               nccl on GPUs), /update_weights_from_distributed per bucket, tensors broadcast
  tensor       SGLang's tensor transport: slime's flattened buckets of torch-pickled tensors
               (shared-memory files; CUDA IPC handles with --cuda-tensors)

It reports the best and median push of `--rounds`, the bytes per second, the same buckets
staged without a commit (the transfer alone; the commit reloads the model from the staged
tensors), and, as the peer in the same run, a plain memory copy of the same bytes in this
process (what any transport that moves the bytes once at least costs).

  python3 tools/bench/weight_update_bench.py --megactx build/megactx --model models/default \\
      --rounds 3 [-- --device cuda --cuda-bf16]

Needs torch (Debian's python3-torch on the CPU). Arguments after `--` go to `megactx serve`.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))

import requests  # noqa: E402
import torch  # noqa: E402

from megactx_server import MegactxServer  # noqa: E402
import tensor_payloads  # noqa: E402
from trainer_group import TrainerGroup  # noqa: E402
import weight_buckets  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_checkpoint(model):
    """{name: float32 tensor} of every floating tensor in the model's safetensors files."""
    tensors = {}
    files = [f for f in sorted(os.listdir(model)) if f.endswith(".safetensors")]
    for name in files:
        raw = open(os.path.join(model, name), "rb").read()
        size = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + size])
        for key, entry in header.items():
            if key == "__metadata__" or entry["dtype"] not in DTYPES:
                continue
            begin, end = entry["data_offsets"]
            data = bytearray(raw[8 + size + begin:8 + size + end])
            tensor = torch.frombuffer(data, dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"])
            tensors[key] = tensor.to(torch.float32)
    return tensors


def as_raw(bucket):
    return {name: ("F32", list(t.shape), t.contiguous().numpy().tobytes())
            for name, t in bucket.items()}


def push(server, transport, tensors, buckets, version, model, scratch, group, cuda,
         commit=True):
    def check(response):
        assert response.status_code == 200, response.text
        return response.json()

    if transport == "disk":
        folder = os.path.join(scratch, version)
        os.makedirs(folder)
        for name in os.listdir(model):
            if not name.endswith(".safetensors") and not name.endswith(".index.json"):
                path = os.path.join(model, name)
                if os.path.isfile(path):
                    shutil.copy(path, folder)
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(weight_buckets.safetensors_bytes(as_raw(tensors)))
        check(requests.post(server.url + "/update_weights_from_disk",
                            json={"model_path": folder, "weight_version": version}))
        shutil.rmtree(folder)
        return
    for index, bucket in enumerate(buckets):
        last = commit and index == len(buckets) - 1
        fields = {"commit": last}
        if last:
            fields["weight_version"] = version
        if transport == "body":
            check(weight_buckets.update_body(server, weight_buckets.safetensors_bytes(
                as_raw(bucket)), **fields))
        elif transport == "shm":
            check(weight_buckets.update_file(server, weight_buckets.safetensors_bytes(
                as_raw(bucket)), **fields))
        elif transport == "distributed":
            status, answer = group.update(bucket, **fields)
            assert status == 200, answer
        elif transport == "tensor":
            if cuda:
                bucket = {name: t.cuda() for name, t in bucket.items()}
            payload, keep = tensor_payloads.flattened_payload(bucket)
            check(requests.post(server.url + "/update_weights_from_tensor", json=dict(
                fields, serialized_named_tensors=[payload], load_format="flattened_bucket")))
            del keep


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--transports", default="disk,body,shm,distributed,tensor")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--cuda-tensors", action="store_true",
                        help="the tensor transport sends CUDA tensors (IPC handles)")
    args, rest = parser.parse_known_args()
    serve_args = [a for a in rest if a != "--"]
    tensors = read_checkpoint(args.model)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    buckets = weight_buckets.buckets_of(tensors, args.bucket_mib << 20)
    # The peer: one copy of the same bytes in this process, best of five.
    copies = []
    for _ in range(5):
        start = time.perf_counter()
        for t in tensors.values():
            t.clone()
        copies.append(time.perf_counter() - start)
    copy_s = min(copies)
    print("{} tensors, {:.1f} MiB as float32, {} buckets of at most {} MiB".format(
        len(tensors), total / 2**20, len(buckets), args.bucket_mib))
    print("| transport | best push s | median push s | GB/s (best) | staged only s (best) | "
          "copy peer GB/s |")
    print("|---|---|---|---|---|---|")
    transports = args.transports.split(",")
    with tempfile.TemporaryDirectory(prefix="megactx-wbench-") as scratch, \
            MegactxServer(args.megactx, args.model, "--weight-update-python", sys.executable,
                          # a bucket as a request body: room for the largest one
                          "--max-request-bytes", str((args.bucket_mib + 16) << 20),
                          *serve_args, name="bench") as server:
        group = None
        if "distributed" in transports:
            group = TrainerGroup(server.url, "bench", backend=args.backend)
            assert group.status == 200, group.answer
        for transport in transports:
            times = []
            for round_ in range(args.rounds):
                version = "{}-{}".format(transport, round_)
                start = time.perf_counter()
                push(server, transport, tensors, buckets, version, args.model, scratch, group,
                     args.cuda_tensors)
                times.append(time.perf_counter() - start)
                got = requests.get(server.url + "/get_weight_version").json()["weight_version"]
                assert got == version, (got, version)
            # The same buckets staged without the commit (the transfer alone: the
            # commit's reload of the model is the rest); the next push commits them.
            staged = []
            if transport != "disk":
                for round_ in range(args.rounds):
                    start = time.perf_counter()
                    push(server, transport, tensors, buckets, "", args.model, scratch, group,
                         args.cuda_tensors, commit=False)
                    staged.append(time.perf_counter() - start)
            print("| {} | {:.3f} | {:.3f} | {:.2f} | {} | {:.2f} |".format(
                transport, min(times), statistics.median(times), total / min(times) / 1e9,
                "{:.3f}".format(min(staged)) if staged else "-", total / copy_s / 1e9))
        if group is not None:
            group.destroy()


if __name__ == "__main__":
    main()

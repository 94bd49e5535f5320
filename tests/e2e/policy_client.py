"""The HTTP calls an RL trainer makes to a policy server, as the trainer loop
(trainer_loop_test.py) makes them: scoring, tokenizing, loads, metrics, and weight buckets as
safetensors (torch tensors written by weight_buckets.py)."""
import json
import time

import requests
import torch

import weight_buckets

_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int32: "I32"}


def safetensors_bytes(tensors):
    """{name: torch tensor} -> the bytes of a safetensors file (weight_buckets.py)."""
    raw = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        data = (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()
        raw[name] = (_DTYPE_NAMES[tensor.dtype], list(tensor.shape), data.tobytes())
    return weight_buckets.safetensors_bytes(raw)



def post(server, route, payload=None, **kwargs):
    return requests.post(server.url + route, json=payload, timeout=300, **kwargs)


def get(server, route):
    return requests.get(server.url + route, timeout=60)


def chat_ids(server, messages, add_generation_prompt=True):
    response = post(server, "/tokenize", {"messages": messages,
                                          "add_generation_prompt": add_generation_prompt})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def score(server, sequences, start=0, **fields):
    """Teacher/policy scoring: prefill only, logprobs from `start` on; one batch."""
    payload = {"input_ids": sequences, "return_logprob": True, "logprob_start_len": start,
               "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}
    payload.update(fields)
    response = post(server, "/generate", payload)
    assert response.status_code == 200, response.text
    return response.json()


def scored_logprobs(item):
    """input_token_logprobs of a scoring answer (logprob_start_len 0) without the first
    position, which has no logprob."""
    entries = item["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None
    return [entry[0] for entry in entries[1:]]


def max_difference(a, b):
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def update_body(server, tensors, **query):
    """update_weights_from_safetensors with the bucket as the request body."""
    return weight_buckets.update_body(server, safetensors_bytes(tensors), **query)


def update_file(server, tensors, directory, **fields):
    """update_weights_from_safetensors with the bucket as a file (in /dev/shm)."""
    return weight_buckets.update_file(server, safetensors_bytes(tensors), directory, **fields)


def sse_items(response):
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def loads(server):
    response = get(server, "/v1/loads")
    assert response.status_code == 200, response.text
    return response.json()


def generated_tokens(server):
    """megactx_generation_tokens_total of /metrics: every token the server streamed out."""
    for line in get(server, "/metrics").text.splitlines():
        if line.startswith("megactx_generation_tokens_total "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics has no megactx_generation_tokens_total")


def wait_until_idle(server, limit=600):
    """What slime does after abort_all: poll /v1/loads until num_reqs is 0."""
    for _ in range(limit):
        state = loads(server)
        if state["num_reqs"] == 0:
            return state
        time.sleep(0.1)
    raise AssertionError("the server never became idle: {}".format(state))

#!/usr/bin/env python3
"""The web UI's HTTP calls answered alike by a CPU and a CUDA server.

The page (web/src) is a client of the server's API and nothing else: it loads
/ and its assets, lists /v1/models, shows /ui/model and polls /ui/stats,
tokenizes through /tokenize (the long-document mode and the rendered-prompt
view), and streams /v1/chat/completions with the bodies settings.jsx and
long_document.jsx build. The browser test (web_ui.test.mjs) drives the page
against a CPU server; the GPU machine has no browser. This script sends the
page's own requests to `megactx serve` on the CPU and with `--device cuda`
(fp32 mode, greedy) and checks that the CUDA server answers as the page needs
and as the CPU server does: the same assets, model list and model card
structure, the same tokenization, the same streamed text, reasoning, tool
calls, finish reasons and usage, logprobs within 1e-3, and a prefix-cache hit
on the long document's second question. Without --cuda both servers run on
the CPU (the check of the script itself, in CTest).

  python3 tests/web/web_api_devices_test.py --megactx build/megactx [--cuda]
"""
import argparse
import http.client
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402

MODEL = os.path.join(ROOT, "models", "default")
failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message, flush=True)
    if not condition:
        failures.append(message)


def request(url, method, path, body=None):
    host = url.split("//", 1)[1]
    connection = http.client.HTTPConnection(host, timeout=300)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    connection.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = connection.getresponse()
    data = response.read()
    content_type = response.getheader("Content-Type", "")
    connection.close()
    return response.status, content_type, data


def get_json(url, path):
    status, _, data = request(url, "GET", path)
    return status, json.loads(data) if status == 200 else None


def stream_chat(url, body):
    """The chat stream as api.js reads it: every data event until [DONE]."""
    status, _, data = request(url, "POST", "/v1/chat/completions", dict(body, stream=True))
    if status != 200:
        return status, []
    events = []
    for line in data.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return status, events


def summary(events):
    """What the chat view shows of a stream (chat_state.js applyChunk)."""
    out = {"content": "", "reasoning": "", "tool_calls": [], "finish": None, "usage": None,
           "logprobs": [], "tokens": []}
    for event in events:
        if event.get("usage"):
            out["usage"] = event["usage"]
        for choice in event.get("choices", []):
            delta = choice.get("delta", {})
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                # Call ids are drawn per response: the index, name and arguments are the call.
                out["tool_calls"].append({k: v for k, v in call.items() if k != "id"})
            if choice.get("finish_reason"):
                out["finish"] = choice["finish_reason"]
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                out["logprobs"].append(entry["logprob"])
                out["tokens"].append(entry["token"])
    return out


def keys(value):
    """The structure of a JSON value: dict keys and element structures, no numbers."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [keys(v) for v in value[:1]]
    return type(value).__name__


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

# The bodies settings.jsx chatRequest and long_document.jsx build.
CHATS = {
    "chat, logprobs": {
        "messages": [{"role": "user", "content": "Hello! What can you do?"}],
        "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": 24,
        "chat_template_kwargs": {"enable_thinking": False}, "logprobs": True, "top_logprobs": 3},
    "chat, thinking": {
        "messages": [{"role": "user", "content": "What is two plus two?"}],
        "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": 32,
        "chat_template_kwargs": {"enable_thinking": True}},
    "chat, tools": {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": 48,
        "chat_template_kwargs": {"enable_thinking": False}, "tools": [WEATHER_TOOL]},
    "chat, stop and seed": {
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": 24,
        "seed": 7, "stop": ["five"], "chat_template_kwargs": {"enable_thinking": False}},
}


def collect(url):
    """Every answer the page's calls get from one server."""
    out = {}
    status, content_type, index = request(url, "GET", "/")
    out["index"] = (status, content_type.split(";")[0])
    assets = sorted(set(re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', index.decode())))
    out["assets"] = [(path, *request(url, "GET", path)[:2]) for path in assets]
    out["models"] = get_json(url, "/v1/models")
    out["model card"] = get_json(url, "/ui/model")
    out["stats"] = get_json(url, "/ui/stats")
    text = request(url, "GET", "/samples/passkey-8k.txt")[2].decode()[:6000]
    out["tokenize prompt"] = request(url, "POST", "/tokenize", {
        "prompt": text, "add_special_tokens": False, "return_tokens": False})[2]
    out["tokenize chat"] = request(url, "POST", "/tokenize", {
        "messages": CHATS["chat, tools"]["messages"], "tools": [WEATHER_TOOL],
        "chat_template_kwargs": {"enable_thinking": False}, "return_token_strs": True})[2]
    for name, body in CHATS.items():
        out[name] = stream_chat(url, body)
    # Long-document mode: the document and two questions; the second reuses the prefix.
    for question in ("What is the pass key?", "Who wrote the text?"):
        out["document: " + question] = stream_chat(url, {
            "messages": [{"role": "user", "content": f"{text}\n\n{question}"}],
            "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": 16,
            "chat_template_kwargs": {"enable_thinking": False}})
    return out


def compare(cpu, other, label):
    check(cpu["index"] == other["index"] and other["index"] == (200, "text/html"),
          f"{label}: / is the page ({other['index']})")
    check(len(other["assets"]) > 0 and
          [(a[0], a[1]) for a in other["assets"]] == [(a[0], a[1]) for a in cpu["assets"]] and
          all(a[1] == 200 for a in other["assets"]),
          f"{label}: the page's {len(other['assets'])} assets load")
    def models(answer):  # without the creation times
        status, body = answer
        return status, [{k: v for k, v in m.items() if k != "created"}
                        for m in (body or {}).get("data", [])]
    check(models(other["models"]) == models(cpu["models"]) and models(other["models"])[1],
          f"{label}: /v1/models")
    check(other["model card"][0] == 200 and keys(other["model card"][1]) == keys(cpu["model card"][1]),
          f"{label}: /ui/model has the card's fields")
    card, cpu_card = other["model card"][1] or {}, cpu["model card"][1] or {}
    for field in ("layers", "schedule", "indexer", "kv_bytes_per_token"):
        if field in cpu_card:
            check(card.get(field) == cpu_card.get(field), f"{label}: /ui/model {field}")
    check(other["stats"][0] == 200 and keys(other["stats"][1]) == keys(cpu["stats"][1]),
          f"{label}: /ui/stats has the dashboard's fields")
    check(other["tokenize prompt"] == cpu["tokenize prompt"], f"{label}: /tokenize of a document")
    check(other["tokenize chat"] == cpu["tokenize chat"], f"{label}: /tokenize of a chat with tools")
    for name in list(CHATS) + [k for k in cpu if k.startswith("document: ")]:
        status, events = other[name]
        want_status, want_events = cpu[name]
        got, want = summary(events), summary(want_events)
        check(status == 200 == want_status and got["finish"] is not None,
              f"{label}: {name}: streamed, finish {got['finish']}")
        check(got["content"] == want["content"] and got["reasoning"] == want["reasoning"],
              f"{label}: {name}: the same text ({len(got['content'])} + {len(got['reasoning'])} "
              f"chars of reasoning)")
        check(json.dumps(got["tool_calls"], sort_keys=True) ==
              json.dumps(want["tool_calls"], sort_keys=True), f"{label}: {name}: tool calls")
        check(got["finish"] == want["finish"], f"{label}: {name}: finish reason")
        usage, want_usage = got["usage"] or {}, want["usage"] or {}
        check(usage.get("prompt_tokens") == want_usage.get("prompt_tokens") and
              usage.get("completion_tokens") == want_usage.get("completion_tokens"),
              f"{label}: {name}: usage {usage.get('prompt_tokens')} + "
              f"{usage.get('completion_tokens')}")
        if want["logprobs"]:
            worst = max((abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"])),
                        default=float("inf"))
            check(got["tokens"] == want["tokens"] and worst <= 1e-3,
                  f"{label}: {name}: logprobs of {len(got['tokens'])} tokens, max diff {worst:.2g}")
    second = summary(other["document: Who wrote the text?"][1])["usage"] or {}
    cached = (second.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    check(cached > 0, f"{label}: the long document's second question reuses {cached} cached tokens")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--cuda", action="store_true", help="the second server on the GPU")
    args = parser.parse_args()
    # f32 KV on both: the comparison is of the same fp32 math on two devices (with
    # the default bf16 KV, rounding flips put logprobs ~2e-3 apart on the H200).
    with MegactxServer(args.megactx, MODEL, "--kv-dtype", "f32", kv_memory="512MiB") as server:
        cpu = collect(server.url)
    extra = ["--device", "cuda"] if args.cuda else []
    with MegactxServer(args.megactx, MODEL, "--kv-dtype", "f32", *extra,
                       kv_memory="512MiB") as server:
        other = collect(server.url)
    compare(cpu, other, "cuda" if args.cuda else "cpu (script check)")
    if failures:
        print(f"{len(failures)} failures", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What the serving tests need from a default-model candidate, through `megactx serve` itself: on
the held-out prompts of tools/data/prepare.py (gen_prompts.jsonl.xz: chat, tools, arithmetic and
letters prompts that end at `<|assistant|>`), greedy, does a tool prompt's answer call one of the
prompt's own tools (`<tool_call>name`), and does every answer end (finish_reason "stop": one of
generation_config.json's stop tokens) within --max-tokens?

The end-to-end tests (tests/e2e: the gateway's agent loop, structured output, robustness) assume
both; training for retrieval can cost them. Run this on a candidate before copying it over
models/default (it checks the trained phrasing; the tests' own prompts are checked by the tests).

    python3 tools/eval/behaviour_serve_eval.py --megactx build/megactx --model models/default \\
        --prompts tests/default_model/behaviour_prompts.jsonl [--per-kind 16] [--min-share 0.9] \\
        [--json out.json] [-- --device cuda]

(tests/default_model/behaviour_prompts.jsonl is prepare.py's gen_prompts.jsonl.xz, uncompressed.)
With --min-share F the exit status is 1 when some kind's share of ended answers, or of tool calls,
is below F (CTest default_model_behaviour).
"""
import argparse
import json
import lzma
import os
import re
import sys

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402

TOOL_NAME = re.compile(r'"name":\s*"([^"]+)"')
TOOL_CALL = re.compile(r"<tool_call>\s*([^\s<]+)")


def read_prompts(path, per_kind):
    """The first per_kind prompts of each kind, in file order: [{"kind", "prompt"}]."""
    opener = lzma.open if path.endswith(".xz") else open
    taken, rows = {}, []
    with opener(path, "rt", encoding="utf-8") as source:
        for line in source:
            row = json.loads(line)
            if taken.get(row["kind"], 0) < per_kind:
                taken[row["kind"]] = taken.get(row["kind"], 0) + 1
                rows.append(row)
    return rows


def judge(row, answer, finish):
    """Per prompt: whether it stopped and, for a tool prompt, whether it called a declared tool."""
    result = {"kind": row["kind"], "stopped": finish == "stop", "answer": answer[:240]}
    if row["kind"] == "tools":
        called = TOOL_CALL.search(answer)
        result["tool_call"] = bool(called and called.group(1) in TOOL_NAME.findall(row["prompt"]))
    return result


def summarise(results):
    """Per kind: prompts, stops and (tools) correct calls."""
    kinds = {}
    for result in results:
        entry = kinds.setdefault(result["kind"], {"prompts": 0, "stopped": 0})
        entry["prompts"] += 1
        entry["stopped"] += result["stopped"]
        if "tool_call" in result:
            entry["tool_calls"] = entry.get("tool_calls", 0) + result["tool_call"]
    return kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    parser.add_argument("--prompts", required=True, help="gen_prompts.jsonl[.xz] of prepare.py")
    parser.add_argument("--per-kind", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-memory", default="1GiB")
    parser.add_argument("--json", default="")
    parser.add_argument("--min-share", type=float, default=0.0,
                        help="exit 1 when a kind's ended or tool-call share is below this")
    parser.add_argument("serve_args", nargs="*", help="after --: passed to megactx serve")
    args = parser.parse_args()
    rows = read_prompts(args.prompts, args.per_kind)
    if not rows:
        sys.exit("no prompts in " + args.prompts)
    results = []
    with MegactxServer(args.megactx, args.model, *args.serve_args, kv_memory=args.kv_memory,
                       name="behaviour") as server:
        for row in rows:
            response = requests.post(server.url + "/v1/completions", timeout=600, json={
                "model": "behaviour", "prompt": row["prompt"], "max_tokens": args.max_tokens,
                "temperature": 0, "skip_special_tokens": False})
            response.raise_for_status()
            choice = response.json()["choices"][0]
            result = judge(row, choice["text"], choice["finish_reason"])
            results.append(result)
            print("{:<10} {:<4} {}{!r}".format(
                row["kind"], "stop" if result["stopped"] else "len",
                "" if "tool_call" not in result else ("call " if result["tool_call"] else "none "),
                result["answer"][:100]), flush=True)
    kinds = summarise(results)
    print("\n| kind | prompts | ended (stop) | called one of its tools |")
    print("|---|---|---|---|")
    for kind, entry in kinds.items():
        print("| {} | {} | {} | {} |".format(kind, entry["prompts"], entry["stopped"],
                                             entry.get("tool_calls", "-")))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"model": args.model, "serve_args": args.serve_args, "kinds": kinds,
                       "results": results}, out, indent=1)
    short = [f"{kind} {name} {entry[name]}/{entry['prompts']}" for kind, entry in kinds.items()
             for name in ("stopped", "tool_calls")
             if name in entry and entry[name] < args.min_share * entry["prompts"]]
    if short:
        sys.exit("below --min-share {}: {}".format(args.min_share, ", ".join(short)))


if __name__ == "__main__":
    main()

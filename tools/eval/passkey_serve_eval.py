#!/usr/bin/env python3
"""Passkey retrieval through `megactx serve` itself: accuracy by prompt length and key depth,
with a heat map.

Each prompt is filler text (Debian package descriptions: this machine's /var/lib/dpkg/status by
default, or --filler FILE: one paragraph per blank-line-separated block, or a dpkg status file) with the sentence
"The pass key is K." inserted at a depth (the fraction of the filler's tokens before it), then the
question the default model was trained to answer ("Which pass key was hidden in the text?"), sent
as one user message to /v1/chat/completions (thinking off, greedy). A prompt passes when the first
number in the answer is K. Paragraph lengths are counted with the server's own /tokenize, so the
prompt lengths are the model's tokens (the answer's usage.prompt_tokens is reported too).

    python3 tools/eval/passkey_serve_eval.py --megactx build/megactx --model models/default \\
        --lengths 1024,2048,4096 --depths 0.1,0.3,0.5,0.7,0.9 --json out.json --plot out.svg \\
        -- --device cpu

Arguments after `--` go to `megactx serve` (e.g. --device cuda --kv-dtype fp8). `--keys N` (N > 1)
asks multi-key prompts instead: N facts "The secret number of NAME is K." (the training's multi-key
format), the asked one at the cell's depth and the others at random depths, and the question
"What is the secret number of NAME?"; an answer giving another fact's number is counted apart.
"""
import argparse
import json
import os
import random
import re
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
import synth  # noqa: E402  (the names of the training's multi-key facts)

QUESTION = "\n\nWhich pass key was hidden in the text?"


def dpkg_paragraphs(path="/var/lib/dpkg/status"):
    """The Description fields of a dpkg status file, one paragraph each (continuation lines
    joined, '.' lines dropped)."""
    paragraphs, current = [], None
    with open(path, encoding="utf-8", errors="replace") as status:
        for line in status:
            if line.startswith("Description:"):
                if current:
                    paragraphs.append(" ".join(current))
                current = [line[len("Description:"):].strip()]
            elif current is not None and line.startswith(" "):
                text = line.strip()
                if text and text != ".":
                    current.append(text)
            elif current is not None:
                paragraphs.append(" ".join(current))
                current = None
    if current:
        paragraphs.append(" ".join(current))
    return [p for p in paragraphs if len(p) > 40]


def file_paragraphs(path):
    """A --filler file's paragraphs: blank-line-separated blocks, or, for a copy of a dpkg status
    file (stanzas of "Package:" fields; another machine's /var/lib/dpkg/status carried along), its
    Description fields as dpkg_paragraphs reads them, so both give the same prompts."""
    with open(path, encoding="utf-8", errors="replace") as source:
        text = source.read()
    if text.startswith("Package: ") and "\nDescription: " in text:
        return dpkg_paragraphs(path)
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def token_count(url, text):
    response = requests.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False,
                                                       "return_tokens": False}, timeout=120)
    response.raise_for_status()
    return response.json()["count"]


def build_prompt(paragraphs, counts, length, depth, key, rng, others=0):
    """Paragraphs in a shuffled order up to `length` tokens, the key sentence after the
    paragraph that ends at `depth` of them. A pool shorter than the length is walked again in a
    new order as often as it takes (the filler repeats; the key sentence stays unique).

    others > 0 (multi-key): the asked sentence is "The secret number of NAME is KEY." and `others`
    more of that form, other names and numbers, go after paragraphs at random depths; the question
    asks for NAME's number (the training's multi-key format, tools/data/synth.py). Returns the
    prompt, the asked sentence's actual depth and the other sentences' numbers."""
    chosen, total = [], 0
    while total <= 0.98 * length:
        order = list(range(len(paragraphs)))
        rng.shuffle(order)
        added = False
        for i in order:
            if total + counts[i] > length:
                continue
            chosen.append(i)
            total += counts[i]
            added = True
            if total > 0.98 * length:
                break
        if not added:  # no paragraph fits the rest
            break
    at, before = 0, 0
    while at < len(chosen) and before + counts[chosen[at]] <= depth * total:
        before += counts[chosen[at]]
        at += 1
    parts = [paragraphs[i] for i in chosen]
    if not others:
        parts.insert(at, f"The pass key is {key}.")
        return "\n".join(parts) + QUESTION, before / max(total, 1), []
    names = rng.sample(synth.NAMES, others + 1)
    other_keys = []
    while len(other_keys) < others:
        candidate = rng.randrange(10000, 100000)
        if candidate != key and candidate not in other_keys:
            other_keys.append(candidate)
    # Insert from the back so the earlier positions (and the asked one's) stay where they were.
    fact = "The secret number of {} is {}."
    inserts = [(at, fact.format(names[0], key))]
    inserts += [(rng.randint(0, len(parts)), fact.format(name, number))
                for name, number in zip(names[1:], other_keys)]
    for position, sentence in sorted(inserts, key=lambda item: item[0], reverse=True):
        parts.insert(position, sentence)
    question = f"\n\nWhat is the secret number of {names[0]}?"
    return "\n".join(parts) + question, before / max(total, 1), other_keys


def heat_map(path, rows, lengths, depths, title):
    """Accuracy by length (columns) and depth (rows) as an SVG grid, no plotting library."""
    cell_w, cell_h, left, top = 90, 36, 90, 60
    width = max(left + cell_w * len(lengths) + 40, 8 * len(title) + 40)  # room for the title
    height = top + cell_h * len(depths) + 70
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">{title}</text>']
    for c, length in enumerate(lengths):
        x = left + c * cell_w
        out.append(f'<text x="{x + cell_w / 2}" y="{top + cell_h * len(depths) + 20}" '
                   f'text-anchor="middle">{length // 1024}K</text>' if length >= 1024 else
                   f'<text x="{x + cell_w / 2}" y="{top + cell_h * len(depths) + 20}" '
                   f'text-anchor="middle">{length}</text>')
        for r, depth in enumerate(depths):
            cell = [row for row in rows if row["length"] == length and row["depth"] == depth]
            y = top + r * cell_h
            if not cell:
                out.append(f'<rect x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" '
                           'fill="#eeeeee" stroke="white"/>')
                continue
            accuracy = sum(row["correct"] for row in cell) / len(cell)
            # red (0) -> green (1)
            red, green = int(220 * (1 - accuracy) + 30), int(180 * accuracy + 40)
            out.append(f'<rect x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" '
                       f'fill="rgb({red},{green},70)" stroke="white"/>')
            out.append(f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 4}" text-anchor="middle" '
                       f'fill="white">{sum(row["correct"] for row in cell)}/{len(cell)}</text>')
    for r, depth in enumerate(depths):
        out.append(f'<text x="{left - 8}" y="{top + r * cell_h + cell_h / 2 + 4}" '
                   f'text-anchor="end">depth {depth:g}</text>')
    out.append(f'<text x="{left + cell_w * len(lengths) / 2}" y="{height - 18}" '
               'text-anchor="middle">prompt length (tokens)</text>')
    out.append("</svg>")
    with open(path, "w") as svg:
        svg.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    parser.add_argument("--lengths", default="1024,2048,4096", help="prompt lengths in tokens")
    parser.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    parser.add_argument("--per-cell", type=int, default=1, help="prompts per length and depth")
    parser.add_argument("--keys", type=int, default=1,
                        help="facts per prompt: 1, the pass key; N > 1, N 'secret number of NAME' "
                             "facts and a question about the one at the cell's depth")
    parser.add_argument("--filler", default="", help="paragraphs file (default: dpkg status)")
    parser.add_argument("--kv-memory", default="2GiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="")
    parser.add_argument("--plot", default="")
    parser.add_argument("--title", default="Passkey retrieval through megactx serve")
    parser.add_argument("serve_args", nargs="*", help="after --: passed to megactx serve")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    if not 1 <= args.keys <= len(synth.NAMES):
        sys.exit(f"--keys must be 1 to {len(synth.NAMES)}, got {args.keys}")
    paragraphs = file_paragraphs(args.filler) if args.filler else dpkg_paragraphs()
    if not paragraphs:
        sys.exit("no filler paragraphs (give --filler FILE)")
    context = max(lengths) + 256
    rows = []
    with MegactxServer(args.megactx, args.model, "--context-length", str(context),
                       *args.serve_args, kv_memory=args.kv_memory, name="passkey") as server:
        counts = [token_count(server.url, p + "\n") for p in paragraphs]
        print(f"{len(paragraphs)} filler paragraphs, {sum(counts):,} tokens", flush=True)
        if sum(counts) < max(lengths):
            print(f"the filler repeats in prompts longer than {sum(counts):,} tokens", flush=True)
        rng = random.Random(args.seed)
        for length in lengths:
            for depth in depths:
                for _ in range(args.per_cell):
                    key = rng.randrange(10000, 100000)
                    prompt, actual_depth, other_keys = build_prompt(
                        paragraphs, counts, length, depth, key, rng, others=args.keys - 1)
                    started = time.time()
                    response = requests.post(server.url + "/v1/chat/completions", timeout=3600, json={
                        "model": "passkey", "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": 16, "temperature": 0,
                        "chat_template_kwargs": {"enable_thinking": False}})
                    response.raise_for_status()
                    body = response.json()
                    answer = body["choices"][0]["message"].get("content") or ""
                    found = re.search(r"\d+", answer)
                    number = int(found.group()) if found else None
                    row = {"length": length, "depth": depth, "key_depth": round(actual_depth, 3),
                           "prompt_tokens": body["usage"]["prompt_tokens"], "key": key,
                           "keys": args.keys, "answer": answer.strip(), "correct": number == key,
                           "gave_another_key": number in other_keys,
                           "seconds": round(time.time() - started, 2)}
                    rows.append(row)
                    print(f"{row['prompt_tokens']:>8} tokens, depth {actual_depth:.2f}: "
                          f"{'ok  ' if row['correct'] else 'miss'} {key} -> {row['answer']!r} "
                          f"({row['seconds']} s){' another fact' if row['gave_another_key'] else ''}",
                          flush=True)
    print("\n| length | mean prompt tokens | " + " | ".join(f"depth {d:g}" for d in depths) +
          " | all |")
    print("|---|---|" + "---|" * (len(depths) + 1))
    for length in lengths:
        cells = []
        for depth in depths:
            cell = [r for r in rows if r["length"] == length and r["depth"] == depth]
            cells.append(f"{sum(r['correct'] for r in cell)}/{len(cell)}")
        line = [r for r in rows if r["length"] == length]
        mean = sum(r["prompt_tokens"] for r in line) / max(len(line), 1)
        print(f"| {length} | {mean:,.0f} | " + " | ".join(cells) +
              f" | {sum(r['correct'] for r in line)}/{len(line)} |")
    if args.keys > 1:
        print(f"\n{args.keys} facts per prompt; answers naming another fact's number: "
              f"{sum(r['gave_another_key'] for r in rows)} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"serve_args": args.serve_args, "rows": rows}, out, indent=1)
    if args.plot:
        heat_map(args.plot, rows, lengths, depths, args.title)


if __name__ == "__main__":
    main()

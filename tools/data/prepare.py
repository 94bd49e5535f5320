#!/usr/bin/python3
"""Builds the training and evaluation data of the default model on the CPU machine.

Usage (Debian's python3 with python3-jinja2; packages fortunes fortunes-min wordnet-base and
apt's Translation-en index, see tools/train/README.md):

    /usr/bin/python3 tools/data/prepare.py --out .train-data

Writes (xz-compressed JSON lines, one document per line, {"kind", "text"}):
  train.jsonl.xz      plain English documents + chat documents rendered through
                      models/default/chat_template.jinja (no end-of-text token: the packer adds it)
  val.jsonl.xz        the same mix from held-out sources and another seed
  passkey_eval.jsonl.xz  prompts for the passkey evaluation: {"tokens", "prompt", "answer", "key"}
  gen_prompts.jsonl.xz   chat prompts for the MTP acceptance evaluation
and tests/default_model/passkey_8k.json (the prompt of the C++ end-to-end test)."""
import argparse
import json
import lzma
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sources  # noqa: E402
import synth  # noqa: E402
from render import ChatRenderer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, "models", "default", "chat_template.jinja")
SPECIAL = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>",
           "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
           "</arg_value>", "<tool_response>", "</tool_response>"]
# Characters per token of the trained tokenizer on filler text (measured on the GPU machine; used
# only to aim long prompts at a token count, the evaluation reports the real counts).
CHARS_PER_TOKEN = 4.0


def clean(text: str) -> str:
    for s in SPECIAL:
        text = text.replace(s, "")
    return text


def text_documents(rng, packages, wordnet, fortunes):
    docs = []
    seen = set()
    group = []
    for name, short, paragraphs in packages:
        fresh = [p for p in paragraphs if p not in seen]
        seen.update(fresh)
        if not fresh:
            continue
        group.append("{}: {}\n\n{}".format(name, short, "\n\n".join(fresh)))
        if len(group) >= rng.randint(3, 8):
            docs.append(("packages", "\n\n".join(group)))
            group = []
    entries = []
    for word, pos, definition, examples, synonyms in wordnet:
        line = "{} ({}): {}.".format(word, pos, definition)
        if examples:
            line += " Example: \"{}\".".format(examples[0])
        if synonyms:
            line += " Also: {}.".format(", ".join(synonyms[:4]))
        entries.append(line)
    for i in range(0, len(entries), 40):
        docs.append(("dictionary", "\n".join(entries[i:i + 40])))
    for _ in range(2):
        shuffled = fortunes[:]
        rng.shuffle(shuffled)
        for i in range(0, len(shuffled), 12):
            docs.append(("fortunes", "\n\n".join(shuffled[i:i + 12])))
    return [(k, clean(t)) for k, t in docs]


def chat_documents(rng, renderer, counts, paragraphs, sentences, wordnet, fortunes, packages, max_chars):
    words = [w for w, _, _, _, _ in wordnet]
    out = []

    def render(kind, request):
        text = renderer.render(request["messages"], tools=request.get("tools"), **request.get("kwargs", {}))
        out.append((kind, text))

    def length():
        # Log-uniform from 600 characters to max_chars: many short retrieval examples (cheap to learn
        # from), still covering the whole trained context.
        return int(math.exp(rng.uniform(math.log(600), math.log(max_chars))))

    for _ in range(counts["passkey"]):
        request, _ = synth.passkey(rng, paragraphs, length())
        render("passkey", request)
    for _ in range(counts["multikey"]):
        render("multikey", synth.multikey(rng, paragraphs, length()))
    for _ in range(counts["copy"]):
        render("copy", synth.copy_task(rng, sentences))
    for _ in range(counts["arithmetic"]):
        render("arithmetic", synth.arithmetic(rng))
    for _ in range(counts["letters"]):
        render("letters", synth.letters(rng, words))
    for _ in range(counts["chat"]):
        render("chat", synth.chat(rng, wordnet, fortunes, packages))
    for _ in range(counts["tools"]):
        render("tools", synth.tool_use(rng, wordnet, packages))
    return out


def write_jsonl(path, rows):
    with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print("wrote {} ({} rows, {:.1f} MB)".format(path, len(rows), os.path.getsize(path) / 1e6))


def write_fixture(renderer, val_paragraphs):
    """The C++ end-to-end test: one passkey question in about 7.6K tokens of context (held-out filler;
    this filler tokenizes at about 4.3 characters per token)."""
    trng = random.Random(8192)
    request, key = synth.passkey(trng, val_paragraphs, 32500, key="58213")
    request["messages"].pop()
    messages = request["messages"]
    prompt = renderer.render(messages, add_generation_prompt=True, enable_thinking=False)
    fixture = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True,
               "prompt": prompt, "key": key}
    path = os.path.join(REPO, "tests", "default_model", "passkey_8k.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, len(prompt), "chars")


def split_sources(rng):
    """The sources, shuffled by `rng` (the --seed generator, before any other use) and split into
    (training, held-out) triples of (packages, wordnet, fortunes): validation text and the filler of
    evaluation prompts never occur in training. make_r3.py's --json-answers takes the same training
    side by calling it with the same seed."""
    packages = sources.load_package_descriptions()
    wordnet = sources.load_wordnet()
    fortunes = sources.load_fortunes()
    rng.shuffle(packages)
    rng.shuffle(wordnet)
    held_out = (packages[:1500], wordnet[:3000], fortunes[:300])
    return (packages[1500:], wordnet[3000:], fortunes[300:]), held_out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(REPO, ".train-data"))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the synthetic task counts")
    parser.add_argument("--max-chars", type=int, default=30000, help="longest long-context user message")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--fixture-only", action="store_true", help="rewrite only tests/default_model/passkey_8k.json")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    renderer = ChatRenderer.from_file(TEMPLATE)

    (packages, wordnet, fortunes), (val_packages, val_wordnet, val_fortunes) = split_sources(rng)

    def paragraphs_of(pkgs):
        out = []
        for _, _, paras in pkgs:
            out.extend(clean(p) for p in paras if 80 <= len(p) <= 1500 and "\n" not in p)
        return sorted(set(out))

    train_paragraphs = paragraphs_of(packages)
    val_paragraphs = paragraphs_of(val_packages)
    sentences = [clean(s) for s in fortunes if "\n" not in s] + [clean(p) for p in train_paragraphs[:20000]]
    print("paragraphs: train {}, val {}".format(len(train_paragraphs), len(val_paragraphs)))

    if args.fixture_only:
        write_fixture(renderer, val_paragraphs)
        return
    counts = {"passkey": 5000, "multikey": 2500, "copy": 10000, "arithmetic": 25000, "letters": 12000,
              "chat": 20000, "tools": 12000}
    counts = {k: max(1, int(v * args.scale)) for k, v in counts.items()}
    val_counts = {k: max(4, v // 50) for k, v in counts.items()}

    train = text_documents(rng, packages, wordnet, fortunes)
    train += chat_documents(rng, renderer, counts, train_paragraphs, sentences, wordnet, fortunes, packages, args.max_chars)
    rng.shuffle(train)
    write_jsonl(os.path.join(args.out, "train.jsonl.xz"), [{"kind": k, "text": t} for k, t in train])

    vrng = random.Random(args.seed + 1)
    val = text_documents(vrng, val_packages, val_wordnet, val_fortunes)
    val += chat_documents(vrng, renderer, val_counts, val_paragraphs, [clean(s) for s in val_fortunes], val_wordnet,
                          val_fortunes, val_packages, args.max_chars)
    write_jsonl(os.path.join(args.out, "val.jsonl.xz"), [{"kind": k, "text": t} for k, t in val])

    # Passkey evaluation: 1K .. 8K (the trained length) and 2x, 4x beyond.
    erng = random.Random(args.seed + 2)
    rows = []
    for tokens in [1024, 2048, 4096, 8192, 16384, 32768]:
        for _ in range(16):
            chars = int((tokens - 64) * CHARS_PER_TOKEN)
            request, key = synth.passkey(erng, val_paragraphs, chars)
            answer = request["messages"].pop()["content"]
            prompt = renderer.render(request["messages"], add_generation_prompt=True, enable_thinking=False)
            rows.append({"tokens": tokens, "prompt": prompt, "answer": "\n" + answer, "key": key})
    write_jsonl(os.path.join(args.out, "passkey_eval.jsonl.xz"), rows)

    # Prompts whose continuations the MTP evaluation drafts and verifies.
    grng = random.Random(args.seed + 3)
    prompts = []
    for i in range(64):
        kind = ["chat", "tools", "arithmetic", "letters"][i % 4]
        if kind == "chat":
            request = synth.chat(grng, val_wordnet, val_fortunes, val_packages)
        elif kind == "tools":
            request = synth.tool_use(grng, val_wordnet, val_packages)
            request["messages"] = request["messages"][:next(j for j, m in enumerate(request["messages"]) if m.get("tool_calls"))]
        elif kind == "arithmetic":
            request = synth.arithmetic(grng)
        else:
            request = synth.letters(grng, [w for w, _, _, _, _ in val_wordnet])
        while request["messages"][-1]["role"] == "assistant":
            request["messages"].pop()
        prompts.append({"kind": kind, "prompt": renderer.render(request["messages"], tools=request.get("tools"),
                                                                add_generation_prompt=True)})
    write_jsonl(os.path.join(args.out, "gen_prompts.jsonl.xz"), prompts)

    write_fixture(renderer, val_paragraphs)
    kinds = {}
    for k, t in train:
        kinds[k] = kinds.get(k, 0) + len(t)
    print("train chars by kind:", {k: "{:.1f}M".format(v / 1e6) for k, v in sorted(kinds.items())})


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Builds the run-3 data folder from the data of prepare.py (run 2's .train-data), small enough to
carry (<= 12 MB); the retrieval documents themselves are synthesized on the GPU machine at training
time (tools/train/curriculum.py) from the filler paragraphs written here.

    /usr/bin/python3 tools/data/make_r3.py --src .train-data --out .train-data-r3

Writes:
  filler.jsonl.xz   {"text"}: training-split package-description paragraphs (80-1500 characters,
                    one line), taken from the "packages" documents of train.jsonl.xz; the held-out
                    validation/evaluation filler never occurs in train.jsonl.xz, so it stays held out
  other.jsonl.xz    every non-retrieval training document (chat, tools, arithmetic, copy, letters,
                    plain text), unchanged; the old passkey/multikey documents are dropped
  val.jsonl.xz, passkey_eval.jsonl.xz, gen_prompts.jsonl.xz   copied unchanged

Run 4 options (defaults keep run 3's output):
  --chat-frac F / --text-frac F / --filler-frac F   keep that share of the chat documents / plain-text
      documents / filler paragraphs (sampled with --seed), so the folder stays under the GPU call's
      carry limit (~12 MB); e.g. --chat-frac 0.35 --text-frac 1 --filler-frac 0.6
  --filler-from-text   no filler.jsonl.xz: pipeline.py then takes the filler paragraphs from the
      "packages" documents of other.jsonl.xz (the same paragraphs when --text-frac is 1; saves ~3 MB)
  --long-passkey 65536,131072   also write passkey_eval_long.jsonl.xz: 16 passkey prompts per nominal
      length in the evaluation's format (synth.passkey, the template, "(tokens - 64) * 4" characters of
      filler), the filler from the held-out validation package paragraphs of val.jsonl.xz
  --json-answers N   append N chat documents whose answer is one JSON object (synth.json_answer,
      kind "json") to other.jsonl.xz, from this machine's sources on prepare.py's training side of the
      split (--sources-seed, its --seed), minus every package and word val.jsonl.xz names (the
      sources may have changed since .train-data was made)
  --tools-unused N   append N chats with one to three tools offered that none of their questions needs,
      answered in text (synth.tool_not_needed, kind "tools_unused"), from the same side of the split
  --manuals   append the prose of this machine's Python and Perl manuals (sources.load_manuals:
      python3.11-doc, perl-doc; ~8M characters) as plain-text documents of kind "manuals", each up to
      --manual-chars of one page's consecutive paragraphs; the validation set stays as it was
  --kernel-docs-chars N   append up to N characters of the Linux kernel documentation's prose
      (sources.load_kernel_docs: linux-doc; ~10M characters in all) as more "manuals" documents, whole
      pages in a --seed order until N is reached: more distinct English prose for the text loss, sized
      to keep the folder under the carry limit (~2.7 MB of xz per 10M characters)

    /usr/bin/python3 tools/data/make_r3.py --src .train-data --out .train-data-r4 \
        --chat-frac 0.35 --filler-frac 0.6 --long-passkey 65536,131072"""
import argparse
import json
import lzma
import os
import random
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import sources  # noqa: E402

RETRIEVAL_KINDS = {"passkey", "multikey"}


def read_jsonl(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, rows):
    with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print("wrote {} ({} rows, {:.2f} MB)".format(path, len(rows), os.path.getsize(path) / 1e6))


def paragraphs_of(docs):
    """Filler paragraphs of "packages" documents: 80-1500 characters, one line (as prepare.py's)."""
    out = set()
    for d in docs:
        if d["kind"] != "packages":
            continue
        for p in d["text"].split("\n\n"):
            if 80 <= len(p) <= 1500 and "\n" not in p:
                out.add(p)
    return sorted(out)


def group(paragraphs, max_chars):
    """Consecutive paragraphs joined by blank lines into documents of at most max_chars (a longer
    paragraph is a document of its own)."""
    out, current = [], []
    for paragraph in paragraphs:
        if current and len("\n\n".join(current + [paragraph])) > max_chars:
            out.append("\n\n".join(current))
            current = []
        current.append(paragraph)
    if current:
        out.append("\n\n".join(current))
    return out


def subsample(rows, frac, rng):
    if frac >= 1.0:
        return rows
    return [r for r in rows if rng.random() < frac]


def held_out_names(val_docs):
    """The package names and dictionary words the validation documents mention: (tokens of every
    validation text, lower-cased dictionary headwords and quoted words)."""
    tokens, words = set(), set()
    for d in val_docs:
        tokens.update(re.findall(r"[A-Za-z0-9][A-Za-z0-9+.\-]*", d["text"]))
        for m in re.finditer(r"^(.+?) \((?:noun|verb|adjective|adverb|adjective satellite)\):", d["text"], re.M):
            words.add(m.group(1).lower())
        words.update(w.lower() for w in re.findall(r"'([^'\n]{1,60})'", d["text"]))
    return tokens, words


def synthetic_docs(task, kind, count, seed, sources_seed, val_docs):
    """`count` rendered documents ({"kind": kind, "text"}) of a synth task (json_answer: an answer that
    is one JSON object; tool_not_needed: tools offered that no question needs) from the training side
    of prepare.py's split of the sources, without the packages and words the validation set names."""
    import prepare  # noqa: E402  (the system sources and the chat template; only for these options)
    import synth  # noqa: E402

    (packages, wordnet, fortunes), _ = prepare.split_sources(random.Random(sources_seed))
    tokens, words = held_out_names(val_docs)
    packages = [p for p in packages if p[0] not in tokens]
    wordnet = [w for w in wordnet if w[0].lower() not in words]
    make = {"json_answer": lambda rng: synth.json_answer(rng, wordnet, packages),
            "tool_not_needed": lambda rng: synth.tool_not_needed(rng, wordnet, fortunes, packages)}[task]
    renderer = prepare.ChatRenderer.from_file(prepare.TEMPLATE)
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        request = make(rng)
        text = renderer.render(request["messages"], tools=request.get("tools"), **request.get("kwargs", {}))
        docs.append({"kind": kind, "text": text})
    return docs


def long_passkey(val_docs, lengths, seed, per_length=16):
    """Passkey prompts like prepare.py's passkey_eval.jsonl.xz, at longer nominal lengths."""
    import synth
    from render import ChatRenderer

    renderer = ChatRenderer.from_file(os.path.join(REPO, "models", "default", "chat_template.jinja"))
    paragraphs = paragraphs_of(val_docs)
    rng = random.Random(seed)
    rows = []
    for tokens in lengths:
        for _ in range(per_length):
            chars = int((tokens - 64) * 4.0)  # prepare.py's CHARS_PER_TOKEN
            request, key = synth.passkey(rng, paragraphs, chars)
            answer = request["messages"].pop()["content"]
            prompt = renderer.render(request["messages"], add_generation_prompt=True, enable_thinking=False)
            rows.append({"tokens": tokens, "prompt": prompt, "answer": "\n" + answer, "key": key})
    print("long passkey prompts: {} held-out filler paragraphs, lengths {}".format(len(paragraphs), lengths))
    return rows


def kernel_documents(pages, max_chars, doc_chars, rng):
    """"manuals" documents of up to doc_chars characters (group) from whole pages taken in rng's
    order until max_chars characters are reached: a cap samples the whole tree, not its first
    folders."""
    order = list(range(len(pages)))
    rng.shuffle(order)
    docs, total = [], 0
    for i in order:
        if total >= max_chars:
            break
        for text in group(pages[i][1], doc_chars):
            docs.append({"kind": "manuals", "text": text})
            total += len(text)
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=".train-data")
    ap.add_argument("--out", default=".train-data-r3")
    ap.add_argument("--chat-frac", type=float, default=1.0, help="share of the chat documents kept")
    ap.add_argument("--text-frac", type=float, default=1.0, help="share of the plain-text documents kept")
    ap.add_argument("--filler-frac", type=float, default=1.0, help="share of the filler paragraphs kept")
    ap.add_argument("--filler-from-text", action="store_true",
                    help="write no filler.jsonl.xz (the pipeline derives it from other.jsonl.xz)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--long-passkey", default="", help="e.g. 65536,131072: passkey_eval_long.jsonl.xz")
    ap.add_argument("--json-answers", type=int, default=0, help="append N JSON-answer chat documents")
    ap.add_argument("--tools-unused", type=int, default=0,
                    help="append N chats with tools offered that no question needs (answered in text)")
    ap.add_argument("--sources-seed", type=int, default=1234, help="prepare.py's --seed (its split)")
    ap.add_argument("--manuals", action="store_true", help="append the Python and Perl manuals' prose")
    ap.add_argument("--manual-chars", type=int, default=3000, help="characters per manual document at most")
    ap.add_argument("--kernel-docs-chars", type=int, default=0,
                    help="append up to N characters of the Linux kernel documentation's prose")
    args = ap.parse_args()
    if args.manual_chars < 1:
        ap.error("--manual-chars must be at least 1, got {}".format(args.manual_chars))
    if args.kernel_docs_chars < 0:
        ap.error("--kernel-docs-chars must be at least 0, got {}".format(args.kernel_docs_chars))
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    docs = read_jsonl(os.path.join(args.src, "train.jsonl.xz"))
    if args.filler_from_text:
        if os.path.exists(os.path.join(args.out, "filler.jsonl.xz")):
            os.remove(os.path.join(args.out, "filler.jsonl.xz"))
    else:
        paragraphs = subsample(paragraphs_of(docs), args.filler_frac, rng)
        write_jsonl(os.path.join(args.out, "filler.jsonl.xz"), [{"text": p} for p in paragraphs])
    other = []
    for d in docs:
        if d["kind"] in RETRIEVAL_KINDS:
            continue
        frac = args.text_frac if d["kind"] in sources.PLAIN_KINDS else args.chat_frac
        if frac >= 1.0 or rng.random() < frac:
            other.append(d)
    if args.json_answers > 0 or args.tools_unused > 0:
        val_docs = read_jsonl(os.path.join(args.src, "val.jsonl.xz"))
        if args.json_answers > 0:
            other += synthetic_docs("json_answer", "json", args.json_answers, args.seed + 200, args.sources_seed,
                                    val_docs)
        if args.tools_unused > 0:
            other += synthetic_docs("tool_not_needed", "tools_unused", args.tools_unused, args.seed + 300,
                                    args.sources_seed, val_docs)
    if args.manuals:
        manuals = [{"kind": "manuals", "text": text}
                   for _, paragraphs in sources.load_manuals() for text in group(paragraphs, args.manual_chars)]
        print("manuals: {} documents, {:.1f}M characters".format(
            len(manuals), sum(len(d["text"]) for d in manuals) / 1e6))
        other += manuals
    if args.kernel_docs_chars > 0:
        kernel = kernel_documents(sources.load_kernel_docs(), args.kernel_docs_chars, args.manual_chars,
                                  random.Random(args.seed + 400))
        print("kernel documentation: {} documents, {:.1f}M characters".format(
            len(kernel), sum(len(d["text"]) for d in kernel) / 1e6))
        other += kernel
    if args.json_answers > 0 or args.tools_unused > 0 or args.manuals or args.kernel_docs_chars > 0:
        rng.shuffle(other)  # the appended documents among the others
    write_jsonl(os.path.join(args.out, "other.jsonl.xz"), other)
    for name in ["val.jsonl.xz", "passkey_eval.jsonl.xz", "gen_prompts.jsonl.xz"]:
        shutil.copyfile(os.path.join(args.src, name), os.path.join(args.out, name))
    if args.long_passkey:
        lengths = [int(x) for x in args.long_passkey.split(",")]
        val_docs = read_jsonl(os.path.join(args.src, "val.jsonl.xz"))
        write_jsonl(os.path.join(args.out, "passkey_eval_long.jsonl.xz"), long_passkey(val_docs, lengths, args.seed + 100))
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print("{}: {:.2f} MB in all".format(args.out, total / 1e6))


if __name__ == "__main__":
    main()

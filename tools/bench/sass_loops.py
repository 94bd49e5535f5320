#!/usr/bin/env python3
"""What each loop of a kernel issues, from its SASS: instructions per iteration by kind.

`cuobjdump -sass` (on the GPU machine: this machine's CUDA has no cuobjdump) lists a kernel's
instructions with their addresses. A backward branch (`BRA` to a lower address) closes a loop; this
script lists every loop of every function in the dump with its address range, its instruction
count without the loops nested in it (the straight-line part of one iteration, every branch of it
counted) and that count split into kinds: uniform-datapath arithmetic (U*, R2UR), shared-memory
loads and stores, global memory, tensor-core MMAs, conversions, integer and float arithmetic,
synchronisation, control. The fused indexer's page loop read this way showed ~50 of its ~250
instructions per page rebuilding wgmma descriptors (docs/benchmarks.md, forty-eighth session).

    (GPU machine) cuobjdump -sass indexer_prefill_bench | xz > all.sass.xz
    python3 tools/bench/sass_loops.py all.sass.xz --function fused_indexer_topk_kernelILi32 \\
        --min-instructions 100

The file may be xz compressed. --function keeps the functions whose mangled name contains it.
"""
import argparse
import collections
import lzma
import re
import signal
import sys

FUNCTION = re.compile(r"Function : (\S+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`\()?(0x[0-9a-f]+)")

# First matching prefix wins; the opcode is the instruction's first word after a predicate.
KINDS = [
    ("mma", ("HGMMA", "QGMMA", "IGMMA", "BGMMA", "HMMA", "IMMA", "QMMA")),
    # Global and local (spill) memory, bulk copies included (before "U": UBLKCP, UTMALDG).
    ("global", ("LDG", "STG", "ATOMG", "RED.", "LDGSTS", "UBLKCP", "UTMA", "LDL", "STL")),
    ("uniform", ("R2UR", "S2UR", "U")),
    ("shared", ("LDS", "STS", "ATOMS", "LDSM")),
    ("convert", ("F2FP", "F2F", "F2I", "I2F", "FRND")),
    ("float", ("FADD", "FMUL", "FFMA", "FMNMX", "HADD2", "HMUL2", "HFMA2", "HMNMX2", "MUFU", "FSEL",
               "FSETP")),
    ("sync", ("BAR", "SYNCS", "WARPGROUP", "MEMBAR", "FENCE", "WARPSYNC", "DEPBAR", "ERRBAR")),
    ("control", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "YIELD", "BPT", "NOP")),
    ("warp", ("SHFL", "VOTE", "MATCH", "REDUX")),
]


def kind_of(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    opcode = words[0] if words else ""
    for kind, prefixes in KINDS:
        if any(opcode.startswith(prefix) for prefix in prefixes):
            return kind
    return "integer"  # IMAD, IADD3, LOP3, SHF, ISETP, SEL, MOV, POPC, ...


def read_functions(path):
    opener = lzma.open if path.endswith(".xz") else open
    functions, name = collections.OrderedDict(), None
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            found = FUNCTION.search(line)
            if found:
                name = found.group(1)
                functions[name] = []
                continue
            found = INSTRUCTION.search(line)
            if name is not None and found:
                functions[name].append((int(found.group(1), 16), found.group(2)))
    return functions


def loops_of(instructions):
    """[(start, end)] address ranges closed by a backward branch, outermost first."""
    loops = set()
    for address, text in instructions:
        found = BRANCH.search(text)
        if found and int(found.group(1), 16) <= address:
            loops.add((int(found.group(1), 16), address))
    return sorted(loops, key=lambda r: (r[0], -r[1]))


def report(name, instructions, min_instructions, out):
    loops = loops_of(instructions)
    out.write(f"\n{name}: {len(instructions)} instructions, {len(loops)} loops\n")
    header = ["start", "end", "own", "with nested"] + [kind for kind, _ in KINDS] + ["integer"]
    rows = []
    for start, end in loops:
        inner = [(s, e) for s, e in loops if start <= s and e <= end and (s, e) != (start, end)]
        body = [(a, t) for a, t in instructions if start <= a <= end]
        own = [(a, t) for a, t in body if not any(s <= a <= e for s, e in inner)]
        if len(own) < min_instructions:
            continue
        counts = collections.Counter(kind_of(t) for _, t in own)
        rows.append([f"{start:#x}", f"{end:#x}", str(len(own)), str(len(body))] +
                    [str(counts.get(k, 0)) for k in header[4:]])
    if not rows:
        out.write("  (no loop of that size)\n")
        return
    out.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
    for row in rows:
        out.write("| " + " | ".join(row) + " |\n")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sass", help="cuobjdump -sass output (.xz allowed)")
    parser.add_argument("--function", default="", help="substring of the mangled names to keep")
    parser.add_argument("--min-instructions", type=int, default=20,
                        help="skip loops with fewer instructions of their own")
    args = parser.parse_args()
    functions = read_functions(args.sass)
    kept = {n: i for n, i in functions.items() if args.function in n}
    if not kept:
        sys.exit(f"no function matching {args.function!r} among {len(functions)}")
    for name, instructions in kept.items():
        report(name, instructions, args.min_instructions, sys.stdout)


if __name__ == "__main__":
    main()

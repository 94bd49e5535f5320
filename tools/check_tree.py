#!/usr/bin/env python3
"""Checks the tree for drift that review keeps finding (CTest `tree_check`):

  * ticket numbers used as names in code ("issue-7 kernels"): name the feature;
  * comments that name a file of the project that does not exist (a file was
    renamed or never written): fix the comment.

A name counts as a project file when it has a path (a/b.h) or a source-like
extension; it exists when some tracked file ends with it, or when it is one
of the files other projects or build steps own (EXTERNAL). Prints every
finding as path:line and exits 1 when there is one.

    python3 tools/check_tree.py [ROOT]
"""
import os
import re
import subprocess
import sys

CODE = ("src", "tests", "bench", "tools", "scripts")
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".py", ".cmake", ".mjs", ".sh")
TICKET = re.compile(r"issue[- ]?#?[0-9]+", re.IGNORECASE)
FILE_NAME = re.compile(r"(?<![\w.\-/])((?:[\w.\-]+/)*[\w\-]+\.(?:h|hpp|cpp|cu|cuh|py|cmake|mjs|sh|md))"
                       r"(?![\w/])")
C_COMMENT = re.compile(r"(//|/\*|^\s*\*)")
HASH_COMMENT = re.compile(r"#")
# Files that belong to other projects, to Hugging Face checkpoints, or that a
# build step writes: naming them in a comment is not drift.
EXTERNAL = {
    "json.hpp", "cuda_runtime.h", "cuda_bf16.h", "cuda_fp8.h", "cublasLt.h", "cublas_v2.h",
    "nccl.h", "pcre2.h", "xxhash.h", "modeling_deepseek.py", "modeling_glm_moe_dsa.py",
    "modeling_deepseek_v32.py", "configuration_glm_moe_dsa.py", "io_struct.py",
    "llm_engine.py", "engine.py", "base.py", "test-backend-ops.cpp", "deepseek2.cpp",
    "params.h", "layernorm_forward.cu", "model.h", "run.c", "sglang_rollout.py",
    "on_policy_distillation.py", "types.py", "web_assets_data.cpp", "architecture.md",
    "model.md", "performance.md", "rl.md", "style.md", "README.md", "inference.py",
    "kernel.py", "generate.py", "model.py", "test_sparse_prefill.py", "flash_mla.py",
    "radix_cache.py", "scheduler.py", "sampling_params.py", "tokenization_utils_base.py",
    "llama.cpp", "configuration_deepseek_v32.py", "http_server.py",
}


def tracked_files(root):
    out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [path for path in out if path and "node_modules/" not in path]


def exists(name, where, files, basenames):
    if os.path.basename(name) in EXTERNAL or name.startswith("_"):
        return True
    if name.startswith("."):  # relative to the file that names it
        return os.path.normpath(os.path.join(os.path.dirname(where), name)) in files
    if "/" in name:
        return any(path == name or path.endswith("/" + name) for path in files)
    return name in basenames


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files = set(tracked_files(root))
    basenames = {os.path.basename(path) for path in files}
    findings = []
    for path in files:
        if not path.startswith(CODE) or not (path.endswith(SOURCE_SUFFIXES) or
                                              path.endswith("CMakeLists.txt")):
            continue
        if path == "tools/check_tree.py":
            continue
        c_like = path.endswith((".h", ".cpp", ".cu", ".cuh", ".mjs"))
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
            for number, line in enumerate(source, 1):
                comment = (C_COMMENT if c_like else HASH_COMMENT).search(line)
                if not comment:
                    continue
                text = line[comment.start():]
                if TICKET.search(text):
                    findings.append(f"{path}:{number}: a ticket number as a name: {line.strip()}")
                for name in FILE_NAME.findall(text):
                    if not exists(name, path, files, basenames):
                        findings.append(f"{path}:{number}: names '{name}', which is not a file "
                                        "of the tree")
    for finding in findings:
        print(finding)
    print(f"check_tree: {len(findings)} findings in {len(files)} files")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The tree is the pipeline: each folder includes only the folders below it.

Reads every #include "a/b.h" of the sources (not tests, fuzz, bench) and checks
it against the layering: support < ir < frontend, passes < codegen < compiler
< cli, with the runtime beside the compiler, depending on support and ir only
(it runs engines; it includes nothing of the compiler). Two finer rules: ir/
includes nothing of the runtime, and no code generator includes the
interpreter (shared arithmetic lives in ir/numerics.h). Prints each edge that
breaks a rule, file:line, and exits 1 when there is one (or when it found no
include to check).
"""
import os
import re
import sys

SRC = os.environ.get("KILN_SOURCE") or os.path.join(os.path.dirname(__file__), "..", "..")

# folder -> the folders its files may include (besides its own)
ALLOWED = {
    "support": set(),
    "ir": {"support"},
    "frontend": {"ir", "support"},
    "passes": {"ir", "support"},
    "runtime": {"ir", "support"},
    "codegen": {"runtime", "ir", "support"},  # the launch-table format the CUDA backend reads
    "compiler": {"frontend", "passes", "codegen", "runtime", "ir", "support"},
    "cli": {"compiler", "runtime", "ir", "support"},
}
# (folder of the includer, prefix of the included path) pairs no file may have
FORBIDDEN = [
    ("ir", "runtime/"),
    ("codegen", "runtime/interp/"),
    ("runtime", "compiler/"), ("runtime", "frontend/"), ("runtime", "passes/"), ("runtime", "codegen/"),
]

include = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')
bad = 0
checked = 0
for top in ALLOWED:
    for root, _, files in os.walk(os.path.join(SRC, top)):
        for name in sorted(files):
            if not name.endswith((".c", ".h", ".y", ".l", ".cuh")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, SRC)
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    m = include.match(line)
                    if not m:
                        continue
                    folder, target = m.group(1), m.group(1) + "/" + m.group(2)
                    if folder not in ALLOWED:
                        continue  # a system-like or generated header
                    checked += 1
                    why = None
                    if folder != top and folder not in ALLOWED[top]:
                        why = f"{top}/ may include {', '.join(sorted(ALLOWED[top])) or 'nothing else'}"
                    for (src, prefix) in FORBIDDEN:
                        if top == src and target.startswith(prefix):
                            why = f"{src}/ must not include {prefix}"
                    if why:
                        print(f"{rel}:{line_no}: includes {target}: {why}")
                        bad += 1
print(f"{checked} includes checked, {bad} against the layering")
sys.exit(1 if bad or checked == 0 else 0)

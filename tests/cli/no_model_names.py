#!/usr/bin/env python3
"""Nothing in the compiler names a particular model: the architectures live in
models/*.kiln. Scans the C sources, lexer and grammar (comments removed) for
model names in code or strings."""
import os, re, sys

root = os.environ.get("KILN_SOURCE") or os.path.join(os.path.dirname(__file__), "..", "..")
names = re.compile(r"llama|qwen|gpt|mistral|tinystories|gemma|phi", re.I)
comment = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# the compiler: what turns a description into an engine. (The runtime's
# tokenizers are named for their file formats' origins, as Hugging Face's are.)
folders = ["support", "frontend", "ir", "passes", "codegen", "compiler", "cli"]
# the importer of llama2.c's own checkpoint format is named for the format, not
# a model; "llama3" is the name of a RoPE frequency-scaling scheme (Hugging
# Face's rope_type), an algorithm the rope op implements; "gptq" a quantized
# checkpoint format (quantization_config.quant_method), any model's
allowed_files = re.compile(r"llama2c")
allowed_words = re.compile(r"llama2c|llama3|gptq", re.I)
bad = []
scanned = 0
for folder in folders:
    for dirpath, _, files in os.walk(os.path.join(root, folder)):
        for f in files:
            if not f.endswith((".c", ".h", ".l", ".y", ".def")) or allowed_files.search(f):
                continue
            path = os.path.join(dirpath, f)
            scanned += 1
            code = comment.sub(lambda m: "\n" * m.group(0).count("\n"), open(path, encoding="utf-8").read())
            for lineno, line in enumerate(code.split("\n"), 1):
                for m in names.finditer(line):
                    if allowed_words.match(line, m.start()):
                        continue
                    bad.append(f"{os.path.relpath(path, root)}:{lineno}: {line.strip()}")
for b in bad:
    print("names a model:", b)
if scanned == 0:
    bad.append(f"no sources under {root}")
    print("FAIL:", bad[-1])
print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad else 0)

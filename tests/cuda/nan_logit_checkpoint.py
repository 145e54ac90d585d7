#!/usr/bin/env python3
"""nan_logit_checkpoint.py SRC_DIR DST_DIR [ROW]: a copy of a Hugging Face checkpoint folder
(config.json, tokenizer.json, an f32 model.safetensors with lm_head.weight) whose output row ROW
(default 100) is NaN, so that every logits row holds one NaN among finite values. Used by
tests/cuda/cuda_runtime.sh (the CPU stand-in) and bench/gpu_check.sh (the GPU)."""
import json
import shutil
import struct
import sys

src, dst = sys.argv[1], sys.argv[2]
row_id = int(sys.argv[3]) if len(sys.argv) > 3 else 100
for name in ("config.json", "tokenizer.json"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
data = bytearray(open(f"{src}/model.safetensors", "rb").read())
n = struct.unpack("<Q", data[:8])[0]
t = json.loads(data[8:8 + n])["lm_head.weight"]
assert t["dtype"] == "F32", t["dtype"]
row = 4 * t["shape"][1]
begin = 8 + n + t["data_offsets"][0] + row_id * row
data[begin:begin + row] = struct.pack("<f", float("nan")) * (row // 4)
open(f"{dst}/model.safetensors", "wb").write(data)

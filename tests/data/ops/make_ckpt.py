#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR — random f32 weights for tests/data/ops/ops.kiln (config.json and
model.safetensors; no numpy: struct), deterministic (seed 7)."""
import json, os, random, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, V = 32, 64
json.dump({"hidden_size": D, "vocab_size": V}, open(os.path.join(out, "config.json"), "w"))
rng = random.Random(7)
tensors = {"embed.weight": ([V, D], 1.5), "w1.weight": ([D, D], 0.3), "w2.weight": ([D, D], 0.3),
           "norm.weight": ([D], 1.0), "head.weight": ([V, D], 0.4)}
hdr, blobs, off = {}, [], 0
for name, (shape, scale) in tensors.items():
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    vals = [rng.uniform(-scale, scale) + (1.0 if name == "norm.weight" else 0.0) for _ in range(n)]
    blob = struct.pack("<%df" % n, *vals)
    hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
    blobs.append(blob)
    off += len(blob)
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)

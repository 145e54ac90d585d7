#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR [--per-expert] — random f32 weights for tests/data/moe/moe.kiln (config.json and
model.safetensors; no numpy: struct), deterministic (seed 11). With --per-expert the same values with
each expert's weights a tensor of its own (experts.E.gate.weight ...: the Hub's layout, read through
{e} templates)."""
import json, os, random, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, V, E, F = 16, 32, 4, 8
json.dump({"hidden_size": D, "vocab_size": V, "num_experts": E, "ffn": F}, open(os.path.join(out, "config.json"), "w"))
rng = random.Random(11)
tensors = {"embed.weight": ([V, D], 1.0), "router.weight": ([E, D], 1.0), "experts.gate.weight": ([E, F, D], 0.4),
           "experts.gate.bias": ([E, F], 0.3), "experts.up.weight": ([E, F, D], 0.4),
           "experts.down.weight": ([E, D, F], 0.4), "head.weight": ([V, D], 0.4)}
hdr, blobs, off = {}, [], 0
for name, (shape, scale) in tensors.items():
    n = 1
    for s in shape:
        n *= s
    vals = [rng.uniform(-scale, scale) for _ in range(n)]
    blob = struct.pack("<%df" % n, *vals)
    hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
    blobs.append(blob)
    off += len(blob)
if "--per-expert" in sys.argv[2:]:
    hdr2, blobs2, off = {}, [], 0
    for (name, v), blob in zip(hdr.items(), blobs):
        shape = v["shape"]
        if not name.startswith("experts."):
            parts = [(name, shape, blob)]
        else:
            step = len(blob) // shape[0]
            parts = [(name.replace("experts.", "experts.%d." % e), shape[1:], blob[e * step:(e + 1) * step])
                     for e in range(shape[0])]
        for n2, s2, b2 in parts:
            hdr2[n2] = {"dtype": "F32", "shape": s2, "data_offsets": [off, off + len(b2)]}
            blobs2.append(b2)
            off += len(b2)
    hdr, blobs = hdr2, blobs2
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)

#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR — random f32 weights for tests/data/sinks/sinks.kiln (config.json and
model.safetensors; no numpy: struct), deterministic (seed 13). The sinks are large enough to matter:
uniform in [-1, 3], where the scores are of order 1."""
import json, os, random, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, V, H, KH = 64, 32, 4, 2
json.dump({"hidden_size": D, "vocab_size": V, "num_attention_heads": H, "num_key_value_heads": KH},
          open(os.path.join(out, "config.json"), "w"))
rng = random.Random(13)
HD = D // H
tensors = {"embed.weight": ([V, D], 1.0, 0.0), "head.weight": ([V, D], 0.3, 0.0)}
for i in range(2):
    tensors.update({"layers.%d.q.weight" % i: ([H * HD, D], 0.25, 0.0), "layers.%d.k.weight" % i: ([KH * HD, D], 0.25, 0.0),
                    "layers.%d.v.weight" % i: ([KH * HD, D], 0.3, 0.0), "layers.%d.o.weight" % i: ([D, H * HD], 0.2, 0.0),
                    "layers.%d.sinks" % i: ([H], 2.0, 1.0)})
hdr, blobs, off = {}, [], 0
for name, (shape, scale, shift) in tensors.items():
    n = 1
    for s in shape:
        n *= s
    vals = [shift + rng.uniform(-scale, scale) for _ in range(n)]
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

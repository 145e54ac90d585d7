#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR — random f32 weights for tests/data/sinks/sinks.kiln (config.json and
model.safetensors, through ../f32_safetensors.py), deterministic (seed 13). The sinks are large enough to matter:
uniform in [-1, 3], where the scores are of order 1."""
import json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from f32_safetensors import save  # noqa: E402

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
items = []
for name, (shape, scale, shift) in tensors.items():
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    items.append((name, shape, [shift + rng.uniform(-scale, scale) for _ in range(n)]))
save(os.path.join(out, "model.safetensors"), items)

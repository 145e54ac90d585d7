#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR — random f32 weights for tests/data/ops/ops.kiln (config.json and
model.safetensors, through ../f32_safetensors.py), deterministic (seed 7)."""
import json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from f32_safetensors import save  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, V = 32, 64
json.dump({"hidden_size": D, "vocab_size": V}, open(os.path.join(out, "config.json"), "w"))
rng = random.Random(7)
tensors = {"embed.weight": ([V, D], 1.5), "w1.weight": ([D, D], 0.3), "w2.weight": ([D, D], 0.3),
           "norm.weight": ([D], 1.0), "head.weight": ([V, D], 0.4)}
save(os.path.join(out, "model.safetensors"),
     [(name, shape, [rng.uniform(-scale, scale) + (1.0 if name == "norm.weight" else 0.0)
                     for _ in range(shape[0] * (shape[1] if len(shape) > 1 else 1))])
      for name, (shape, scale) in tensors.items()])

#!/usr/bin/env python3
"""make_ckpt.py OUT_DIR [--per-expert] — random f32 weights for tests/data/moe/moe.kiln (config.json and
model.safetensors, through ../f32_safetensors.py), deterministic (seed 11). With --per-expert the same values with
each expert's weights a tensor of its own (experts.E.gate.weight ...: the Hub's layout, read through
{e} templates)."""
import json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from f32_safetensors import pack, save  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, V, E, F = 16, 32, 4, 8
json.dump({"hidden_size": D, "vocab_size": V, "num_experts": E, "ffn": F}, open(os.path.join(out, "config.json"), "w"))
rng = random.Random(11)
tensors = {"embed.weight": ([V, D], 1.0), "router.weight": ([E, D], 1.0), "experts.gate.weight": ([E, F, D], 0.4),
           "experts.gate.bias": ([E, F], 0.3), "experts.up.weight": ([E, F, D], 0.4),
           "experts.down.weight": ([E, D, F], 0.4), "head.weight": ([V, D], 0.4)}
items = []
for name, (shape, scale) in tensors.items():
    n = 1
    for d in shape:
        n *= d
    items.append((name, shape, pack([rng.uniform(-scale, scale) for _ in range(n)])))
if "--per-expert" in sys.argv[2:]:  # each expert's slice of a stacked tensor a tensor of its own
    split = []
    for name, shape, blob in items:
        if not name.startswith("experts."):
            split.append((name, shape, blob))
            continue
        step = len(blob) // shape[0]
        split += [(name.replace("experts.", "experts.%d." % e), shape[1:], blob[e * step:(e + 1) * step])
                  for e in range(shape[0])]
    items = split
save(os.path.join(out, "model.safetensors"), items)

#!/usr/bin/env python3
"""expected.py CKPT_DIR IDS — tests/data/moe/moe.kiln computed with numpy in float64 (the routing as
written there: softmax, the two largest, renormalized; SiLU(gate x + b) * up x through the chosen
experts, down, weighted): prints each position's logits, one row a line, for tests/cli/moe_ops.sh."""
import json, os, struct, sys

import numpy as np

d = sys.argv[1]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
t = {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").astype(np.float64)
     .reshape(v["shape"]) for k, v in hdr.items()}
ids = [int(i) for i in sys.argv[2].split(",")]
x = t["embed.weight"][ids]
logits = x @ t["router.weight"].T
p = np.exp(logits - logits.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
out = x.copy()
for r in range(len(ids)):
    idx = np.argsort(-p[r], kind="stable")[:2]
    g = p[r, idx] / p[r, idx].sum()
    for j, e in enumerate(idx):
        a = t["experts.gate.weight"][e] @ x[r] + t["experts.gate.bias"][e]
        h = a / (1 + np.exp(-a)) * (t["experts.up.weight"][e] @ x[r])
        out[r] += g[j] * (t["experts.down.weight"][e] @ h)
for row in out @ t["head.weight"].T:
    print(" ".join("%.9g" % v for v in row))

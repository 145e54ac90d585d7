#!/usr/bin/env python3
"""expected.py CKPT_DIR IDS — sinks.kiln's logits of every position of the prompt IDS (comma-separated) in
float64, plain Python (as transformers' gpt-oss eager attention: the sink appended to each row's scores,
the softmax over both, the sink's share dropped), a row a line."""
import json, math, os, struct, sys

ckpt, ids = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
raw = open(os.path.join(ckpt, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
def tensor(name):
    a, b = hdr[name]["data_offsets"]
    vals = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    shape = hdr[name]["shape"]
    if len(shape) == 1:
        return list(vals)
    return [list(vals[r * shape[1]:(r + 1) * shape[1]]) for r in range(shape[0])]
cfg = json.load(open(os.path.join(ckpt, "config.json")))
D, H, KH = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
HD, G = D // H, H // KH
def lin(x, w):
    return [sum(a * b for a, b in zip(x, row)) for row in w]
x = [list(tensor("embed.weight")[t]) for t in ids]
for i in range(2):
    wq, wk, wv, wo = (tensor("layers.%d.%s.weight" % (i, p)) for p in "qkvo")
    sinks = tensor("layers.%d.sinks" % i)
    q = [lin(r, wq) for r in x]
    k = [lin(r, wk) for r in x]
    v = [lin(r, wv) for r in x]
    window = 3 if i == 0 else 0
    out = []
    for t in range(len(ids)):
        lo = max(0, t - window + 1) if window else 0
        row = []
        for h in range(H):
            kh = h // G
            qh = q[t][h * HD:(h + 1) * HD]
            s = [sum(a * b for a, b in zip(qh, k[j][kh * HD:(kh + 1) * HD])) / math.sqrt(HD) for j in range(lo, t + 1)]
            m = max(s + [sinks[h]])
            e = [math.exp(z - m) for z in s]
            tot = sum(e) + math.exp(sinks[h] - m)
            row += [sum(e[j - lo] / tot * v[j][kh * HD + d] for j in range(lo, t + 1)) for d in range(HD)]
        out.append(row)
    x = [[a + b for a, b in zip(xr, lin(o, wo))] for xr, o in zip(x, out)]
for r in x:
    print(" ".join("%.9g" % z for z in lin(r, tensor("head.weight"))))

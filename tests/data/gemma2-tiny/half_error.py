#!/usr/bin/env python3
"""half_error.py — Hugging Face's own bf16 and fp16 evaluation of gemma2-tiny against its float64 golden:
the largest per-row max|d| / max|golden| over the cases (tests/cuda/half_tolerances.txt takes twice it).
On the CPU (the shared models' figures were measured on an H200: same arithmetic, other kernels)."""
import json, os
import numpy as np, torch
from transformers import Gemma2ForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
golden = json.load(open(os.path.join(here, "golden.json")))
for dt in (torch.bfloat16, torch.float16):
    m = Gemma2ForCausalLM.from_pretrained(here, dtype=dt, attn_implementation="eager").eval()
    worst = 0.0
    with torch.no_grad():
        for c in golden["cases"]:
            want = np.fromfile(os.path.join(here, c["logits"]), dtype="<f4").reshape(c["shape"])
            got = m(torch.tensor([c["input_ids"]])).logits[0].float().numpy()
            rows = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
            worst = max(worst, float(rows.max()))
    print(dt, "%.3g" % worst)

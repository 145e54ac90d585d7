#!/usr/bin/env python3
"""make.py [OUT_DIR] — tests/data/gemma2-tiny: a random-weight Gemma 2 (Gemma2ForCausalLM) and its goldens,
as ../shared's models were made: Hugging Face transformers in float64 on the CPU, eager attention, from exactly
the float32 weights written beside them. Small (hidden 64, 3 layers, vocab 256) and shaped so that each Gemma 2
feature shows: the norm weights (Gemma's 1 + w) randomised, scores and logits large enough that both soft-caps
bend them, a sliding window (6) shorter than the longer cases, query_pre_attn_scalar apart from head_dim.
Needs torch and transformers (PyPI); its output is committed, so tests need neither.
"""
import json, os, sys

import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(23)
cfg = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
                   query_pre_attn_scalar=24, sliding_window=6, attn_logit_softcapping=2.0,
                   final_logit_softcapping=4.0, bos_token_id=2, eos_token_id=1, pad_token_id=0,
                   tie_word_embeddings=True, initializer_range=0.15, attn_implementation="eager")
model = Gemma2ForCausalLM(cfg).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(torch.randn_like(p) * 0.4)  # Gemma's norms start at 0 (1 + w = 1): randomise them
model.save_pretrained(out, safe_serialization=True)
model.generation_config.save_pretrained(out)

model = model.double()
g = torch.Generator().manual_seed(5)
cases = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 9, 40)]
golden = {"model": "tests/data/gemma2-tiny", "weights_on_disk": "float32", "random_init_seed": 23,
          "reference": "transformers %s, torch %s, float64 on CPU, eager attention" % (
              __import__("transformers").__version__, torch.__version__),
          "cases": [], "greedy": [],
          "logits_format": "float32 little-endian, row-major [tokens, vocab], one row per input position"}
with torch.no_grad():
    for i, ids in enumerate(cases):
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
        name = "case%d.logits.f32" % i
        logits.astype("<f4").tofile(os.path.join(out, name))
        golden["cases"].append({"input_ids": ids, "logits": name, "shape": list(logits.shape)})
    prompt = cases[1][:5]
    seq = list(prompt)
    for _ in range(24):  # greedy, no EOS stop
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    golden["greedy"].append({"prompt_ids": prompt, "new_ids": seq[len(prompt):]})
json.dump(golden, open(os.path.join(out, "golden.json"), "w"), indent=1)

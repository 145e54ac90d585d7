#!/usr/bin/env python3
"""make_goldens.py [NAME ...] — the repository's own test models (tests/data/<name>/): random-weight
checkpoints of architectures ../shared does not hold, and their goldens, made as ../shared's were:
Hugging Face transformers in float64 on the CPU, eager attention, from exactly the float32 weights
written beside them (golden.json: cases[] input_ids and a float32 logits file [tokens, vocab]; greedy[]
prompt_ids and new_ids, no EOS stop). Each model is small (hidden 64, 2-3 layers, vocab 256) and shaped
so that its features show: norm weights and biases randomised (Gemma's zero-initialised 1 + w too),
values large enough that soft-caps and clipping bend them, sliding windows shorter than the longer
cases, head_dim and query_pre_attn_scalar apart from hidden / heads. Then half_error() prints Hugging
Face's own bf16 and fp16 error against the golden (tests/cuda/half_tolerances.txt takes twice it).
Needs torch and transformers (PyPI); the output is committed, so the tests need neither.
"""
import json, os, sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=0.15,
              attn_implementation="eager")
# name: (config class, model class, seed, config keys over COMMON)
MODELS = {
    "gemma2-tiny": ("Gemma2Config", "Gemma2ForCausalLM", 23,
                    dict(num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, query_pre_attn_scalar=24,
                         sliding_window=6, attn_logit_softcapping=2.0, final_logit_softcapping=4.0,
                         tie_word_embeddings=True)),
    "gemma-tiny": ("GemmaConfig", "GemmaForCausalLM", 31,
                   dict(num_hidden_layers=2, head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "gemma3-tiny": ("Gemma3TextConfig", "Gemma3ForCausalLM", 37,
                    dict(num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, query_pre_attn_scalar=24,
                         sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                         tie_word_embeddings=True)),
    "qwen3-tiny": ("Qwen3Config", "Qwen3ForCausalLM", 41,
                   dict(num_hidden_layers=2, head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "qwen3-yarn-tiny": ("Qwen3Config", "Qwen3ForCausalLM", 79,
                        dict(num_hidden_layers=2, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 32})),
    "olmo-tiny": ("OlmoConfig", "OlmoForCausalLM", 43,
                  dict(num_hidden_layers=2, clip_qkv=1.5, tie_word_embeddings=False)),
    "olmo2-tiny": ("Olmo2Config", "Olmo2ForCausalLM", 47,
                   dict(num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "granite-tiny": ("GraniteConfig", "GraniteForCausalLM", 53,
                     dict(num_hidden_layers=2, rms_norm_eps=1e-6, embedding_multiplier=3.0, attention_multiplier=0.4,
                          residual_multiplier=0.5, logits_scaling=2.5, tie_word_embeddings=True)),
    "nemotron-tiny": ("NemotronConfig", "NemotronForCausalLM", 59,
                      dict(num_hidden_layers=2, head_dim=32, norm_eps=1e-5, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "phi-tiny": ("PhiConfig", "PhiForCausalLM", 61,
                 dict(num_hidden_layers=2, layer_norm_eps=1e-5, qk_layernorm=True, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "cohere-tiny": ("CohereConfig", "CohereForCausalLM", 67,
                    dict(num_hidden_layers=2, layer_norm_eps=1e-5, logit_scale=0.5, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "phi3-tiny": ("Phi3Config", "Phi3ForCausalLM", 71,
                  dict(num_hidden_layers=2, rms_norm_eps=1e-5, sliding_window=6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75})),
    "gpt_neox-tiny": ("GPTNeoXConfig", "GPTNeoXForCausalLM", 83,
                      dict(num_hidden_layers=2, num_key_value_heads=4, layer_norm_eps=1e-5, use_parallel_residual=True,
                           tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
    "stablelm-parallel-tiny": ("StableLmConfig", "StableLmForCausalLM", 89,
                               dict(num_hidden_layers=2, layer_norm_eps=1e-5, use_parallel_residual=True,
                                    tie_word_embeddings=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5})),
    "bloom-tiny": ("BloomConfig", "BloomForCausalLM", 97,
                   dict(n_layer=2, hidden_size=72, num_attention_heads=6, layer_norm_epsilon=1e-5,
                        tie_word_embeddings=True)),  # 6 heads: ALiBi's slopes past the power of two too
    "stablelm-tiny": ("StableLmConfig", "StableLmForCausalLM", 73,
                      dict(num_hidden_layers=2, layer_norm_eps=1e-5, use_qkv_bias=True, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
}


def randomise(model):
    """Norm weights (and biases) random: a loader that skips them, or a (1 + w) norm's w read as the weight, fails."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                one_plus = any(a in type(model).__name__.lower() for a in ("gemma", "nemotron"))  # (1 + w) norms
                p.copy_(torch.randn_like(p) * 0.4 + (0.0 if one_plus or name.endswith("bias") else 1.0))


def make(name):
    cfg_cls, model_cls, seed, keys = MODELS[name]
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **keys})
    model = getattr(transformers, model_cls)(cfg).eval()
    randomise(model)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    model = model.double()
    g = torch.Generator().manual_seed(5)
    cases = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 9, 40)]
    golden = {"model": "tests/data/" + name, "weights_on_disk": "float32", "random_init_seed": seed,
              "reference": "transformers %s, torch %s, float64 on CPU, eager attention" % (
                  transformers.__version__, torch.__version__),
              "cases": [], "greedy": [],
              "logits_format": "float32 little-endian, row-major [tokens, vocab], one row per input position"}
    with torch.no_grad():
        for i, ids in enumerate(cases):
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            file = "case%d.logits.f32" % i
            logits.astype("<f4").tofile(os.path.join(out, file))
            golden["cases"].append({"input_ids": ids, "logits": file, "shape": list(logits.shape)})
        seq = list(cases[1][:5])
        for _ in range(24):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        golden["greedy"].append({"prompt_ids": cases[1][:5], "new_ids": seq[5:]})
    json.dump(golden, open(os.path.join(out, "golden.json"), "w"), indent=1)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    half_error(name, model_cls, out, golden)


def half_error(name, model_cls, out, golden):
    """Hugging Face's own bf16 and fp16 run against the golden: the largest per-row max|d| / max|golden|."""
    worst = []
    for dt in (torch.bfloat16, torch.float16):
        m = getattr(transformers, model_cls).from_pretrained(out, dtype=dt, attn_implementation="eager").eval()
        w = 0.0
        with torch.no_grad():
            for c in golden["cases"]:
                want = np.fromfile(os.path.join(out, c["logits"]), dtype="<f4").reshape(c["shape"])
                got = m(torch.tensor([c["input_ids"]])).logits[0].float().numpy()
                w = max(w, float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max()))
        worst.append(w)
    print("%-18s Hugging Face bf16 %.3g, fp16 %.3g (CPU): half_tolerances.txt %.3g %.3g"
          % (name, worst[0], worst[1], 2 * worst[0], 2 * worst[1]))


for n in sys.argv[1:] or MODELS:
    make(n)

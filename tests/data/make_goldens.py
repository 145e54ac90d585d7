#!/usr/bin/env python3
"""make_goldens.py [NAME ...] — the repository's own test models (tests/data/<name>/): random-weight
checkpoints of architectures ../shared does not hold, and their goldens, made as ../shared's were:
Hugging Face transformers in float64 on the CPU, eager attention, from exactly the float32 weights
written beside them (golden.json: cases[] input_ids and a float32 logits file [tokens, vocab]; greedy[]
prompt_ids and new_ids, no EOS stop). Each model is small (hidden 64, 2-3 layers, vocab 256) and shaped
so that its features show: norm weights and biases randomised (Gemma's zero-initialised 1 + w too),
values large enough that soft-caps and clipping bend them, sliding windows shorter than the longer
cases, head_dim and query_pre_attn_scalar apart from hidden / heads. Mixture-of-experts models run their
experts eagerly (experts_implementation "eager", the reference loop) and are made far from routing ties:
hooks on every router check, for every token of every case and greedy step, the margin of its top-k choice
(route_check()); a seed whose margin falls below ROUTE_GAP, or that leaves an expert unused, is replaced by
seed + 1000 * attempt (golden.json's random_init_seed is the one used). Then half_error() prints Hugging
Face's own bf16 and fp16 error against the golden (tests/cuda/half_tolerances.txt takes twice it).
Needs torch and transformers (PyPI); the output is committed, so the tests need neither.
"""
import copy, json, os, sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=0.15,
              attn_implementation="eager")
MOE = dict(experts_implementation="eager")  # the reference per-expert loop, float64 on the CPU
ROUTE_GAP = 1e-3  # the least margin of a top-k routing choice, relative to the row's largest |score|
# wider where a half engine's routing would otherwise flip: DeepSeek-V3's sigmoid scores sit close together,
# and bf16 weights moved a choice of deepseek_v3-tiny's at 1e-3 (0.73 of the golden in one row)
ROUTE_GAPS = {"deepseek_v3-tiny": 1e-2, "deepseek_v3-yarn-tiny": 1e-2}
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
    # LongRoPE: original_max_position_embeddings 16 below the 40-token case (the long factors) and the greedy
    # run (its decode steps pass 16: the cached keys keep the short factors' rotation, as generate() has them)
    "phi3-longrope-tiny": ("Phi3Config", "Phi3ForCausalLM", 101,
                           dict(num_hidden_layers=2, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
                                max_position_embeddings=128, original_max_position_embeddings=16,
                                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.75, "original_max_position_embeddings": 16,
                                                 "short_factor": [1.0, 1.15, 1.4, 1.9, 2.6, 3.3],
                                                 "long_factor": [1.0, 1.6, 2.9, 5.2, 9.5, 17.0]})),
    # dynamic NTK: max_position_embeddings 16, the base grown for the 40-token case and the greedy run's later steps
    "llama-dynamic-tiny": ("LlamaConfig", "LlamaForCausalLM", 103,
                           dict(num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                max_position_embeddings=16,
                                rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 8.0})),
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
    "mixtral-tiny": ("MixtralConfig", "MixtralForCausalLM", 101,
                     dict(MOE, num_hidden_layers=2, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                          sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen3_moe-tiny": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", 103,
                       dict(MOE, num_hidden_layers=2, head_dim=24, rms_norm_eps=1e-6, num_experts=6,
                            num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                            decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)),
    "qwen2_moe-tiny": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", 107,
                       dict(MOE, num_hidden_layers=2, rms_norm_eps=1e-6, num_experts=6, num_experts_per_tok=2,
                            moe_intermediate_size=32, shared_expert_intermediate_size=40, norm_topk_prob=False,
                            use_sliding_window=False, tie_word_embeddings=False)),  # qkv_bias: True by default
    "gpt_oss-tiny": ("GptOssConfig", "GptOssForCausalLM", 109,
                     dict(MOE, num_hidden_layers=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                          intermediate_size=32, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                          swiglu_limit=2.0,  # (default 7) so that the clamps bend some values
                          rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                           "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                           "original_max_position_embeddings": 32},
                          tie_word_embeddings=False)),
    "deepseek_v3-tiny": ("DeepseekV3Config", "DeepseekV3ForCausalLM", 113,
                         dict(MOE, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
                              num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=24,
                              n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32,
                              kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                              num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    # YaRN with mscale and mscale_all_dim apart (cos and sin times their ratio, the softmax's scale times the
    # second's square), an original context shorter than the 40-token case; one MoE layer
    "deepseek_v3-yarn-tiny": ("DeepseekV3Config", "DeepseekV3ForCausalLM", 127,
                              dict(MOE, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4,
                                   num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=24,
                                   n_shared_experts=1, routed_scaling_factor=1.5, norm_topk_prob=True,
                                   q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                   v_head_dim=12, num_attention_heads=4, num_key_value_heads=4,
                                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 32, "mscale": 0.8,
                                                    "mscale_all_dim": 0.5, "beta_fast": 16.0, "beta_slow": 1.0},
                                   rope_interleave=False, tie_word_embeddings=False)),
}


def randomise(model):
    """Norm weights (and biases) random: a loader that skips them, or a (1 + w) norm's w read as the weight, fails."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                one_plus = any(a in type(model).__name__.lower() for a in ("gemma", "nemotron"))  # (1 + w) norms
                p.copy_(torch.randn_like(p) * 0.4 + (0.0 if one_plus or name.endswith("bias") else 1.0))


def randomise_moe(model):
    """MoE models: the biases that initialise to zero (attention, gpt-oss's experts), gpt-oss's attention sinks and
    DeepSeek's e_score_correction_bias random, so that a loader that skips any of them fails."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("sinks"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.3)
            elif name.endswith("bias") and "norm" not in name and not p.any():
                p.copy_(torch.randn_like(p) * 0.2)


def routers(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.lower().endswith("topkrouter")]


def route_check(model, log):
    """Forward hooks on each router: per token, in float64 from the router's logits, the gap between the k-th and the
    (k+1)-th largest selection score over the row's largest |score| (softmax probabilities for Mixtral and Qwen, the
    logits for gpt-oss; DeepSeek-V3: sigmoid + e_score_correction_bias, and its group choice's gap between group
    scores, the sum of each group's top two), appended to log[name] with the chosen experts. Returns the handles."""
    def hook(name, mod):
        def f(_, args, out):
            logits = out[0].detach().double().reshape(-1, mod.num_experts)
            kind, k = type(mod).__name__, mod.top_k
            gaps = []
            if kind.startswith("GptOss"):
                s = logits
            elif kind.startswith("DeepseekV3"):
                s = logits.sigmoid() + mod.e_score_correction_bias.double()
                scale = s.abs().amax(-1)
                g = s.view(-1, mod.num_group, mod.num_experts // mod.num_group).topk(2, dim=-1)[0].sum(-1)
                gs = g.sort(dim=-1, descending=True)[0]
                gaps.append((gs[:, mod.topk_group - 1] - gs[:, mod.topk_group]) / gs.abs().amax(-1))
                keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.topk(mod.topk_group, dim=-1)[1], True)
                keep = keep.repeat_interleave(mod.num_experts // mod.num_group, dim=1)
                s = s.masked_fill(~keep, float("-inf"))
            else:
                s = torch.softmax(logits, dim=-1)
            if not kind.startswith("DeepseekV3"):
                scale = s.abs().amax(-1)
            ss = s.sort(dim=-1, descending=True)[0]
            gaps.append((ss[:, k - 1] - ss[:, k]) / scale)
            chosen = s.topk(k, dim=-1)[1].sort(dim=-1)[0]
            if not torch.equal(chosen, out[2].reshape(-1, k).sort(dim=-1)[0]):
                gaps.append(torch.zeros(1, dtype=torch.float64))  # our top-k is not the model's: reject
            log.setdefault(name, []).append((float(torch.stack([x.min() for x in gaps]).min()), chosen))
        return f
    return [m.register_forward_hook(hook(n, m)) for n, m in routers(model)]


def make(name):
    cfg_cls, model_cls, seed0, keys = MODELS[name]
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    cases = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 9, 40)]
    for attempt in range(50):
        seed = seed0 + 1000 * attempt
        torch.manual_seed(seed)
        cfg = getattr(transformers, cfg_cls)(**{**COMMON, **keys})
        model = getattr(transformers, model_cls)(cfg).eval()
        randomise(model)
        if routers(model):
            randomise_moe(model)
        ref = copy.deepcopy(model).double()
        log = {}
        hooks = route_check(ref, log)
        golden = {"model": "tests/data/" + name, "weights_on_disk": "float32", "random_init_seed": seed,
                  "reference": "transformers %s, torch %s, float64 on CPU, eager attention" % (
                      transformers.__version__, torch.__version__),
                  "cases": [], "greedy": [],
                  "logits_format": "float32 little-endian, row-major [tokens, vocab], one row per input position"}
        logits = []
        with torch.no_grad():
            for i, ids in enumerate(cases):
                logits.append(ref(torch.tensor([ids])).logits[0].float().numpy())
                golden["cases"].append({"input_ids": ids, "logits": "case%d.logits.f32" % i,
                                        "shape": list(logits[-1].shape)})
            ncase = {n: len(v) for n, v in log.items()}
            seq, margin = list(cases[1][:5]), float("inf")
            # a KV cache where the rotation follows the sequence's length (longrope, dynamic): generate()'s
            # decode, each step's new token alone; else the whole sequence again (the same numbers)
            cached = (keys.get("rope_parameters") or {}).get("rope_type") in ("longrope", "dynamic")
            past, new = None, list(seq)
            for _ in range(24):
                if cached:
                    step = ref(torch.tensor([new]), past_key_values=past, use_cache=True)
                    past, last = step.past_key_values, step.logits[0, -1]
                else:
                    last = ref(torch.tensor([seq])).logits[0, -1]
                top2 = last.topk(2)[0]
                margin = min(margin, float((top2[0] - top2[1]) / last.abs().max()))
                seq.append(int(last.argmax()))
                new = [seq[-1]]
            golden["greedy"].append({"prompt_ids": cases[1][:5], "new_ids": seq[5:]})
        for h in hooks:
            h.remove()
        if not log:
            break
        gap = min(x[0] for v in log.values() for x in v)
        unused = []
        print("%s seed %d: least routing gap %.3g, greedy argmax margin %.3g; experts chosen over the cases' tokens:"
              % (name, seed, gap, margin))
        for n, v in log.items():
            mod = dict(routers(ref))[n]
            hist = torch.bincount(torch.cat([c for _, c in v[:ncase[n]]]).flatten(), minlength=mod.num_experts)
            print("  %-28s %s" % (n, hist.tolist()))
            unused += [n] if (hist == 0).any() else []
        if gap >= ROUTE_GAPS.get(name, ROUTE_GAP) and not unused:
            break
        print("%s seed %d rejected (%s)" % (name, seed, "gap below %g" % ROUTE_GAPS.get(name, ROUTE_GAP) if gap < ROUTE_GAPS.get(name, ROUTE_GAP) else
                                            "an expert unused"))
    else:
        sys.exit("%s: no seed routes clear of ties" % name)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    for c, l in zip(golden["cases"], logits):
        l.astype("<f4").tofile(os.path.join(out, c["logits"]))
    json.dump(golden, open(os.path.join(out, "golden.json"), "w"), indent=1)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    half_error(name, model_cls, out, golden, {k: keys[k] for k in MOE if k in keys})


def golden_error(model, folder, golden):
    """model's logits against the golden of folder: the largest per-row max|d| / max|golden| over the cases."""
    w = 0.0
    with torch.no_grad():
        for c in golden["cases"]:
            want = np.fromfile(os.path.join(folder, c["logits"]), dtype="<f4").reshape(c["shape"])
            got = model(torch.tensor([c["input_ids"]])).logits[0].float().numpy()
            w = max(w, float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max()))
    return w


def half_error(name, model_cls, out, golden, extra={}):
    """Hugging Face's own bf16 and fp16 run against the golden: the largest per-row max|d| / max|golden|."""
    worst = []
    for dt in (torch.bfloat16, torch.float16):
        m = getattr(transformers, model_cls).from_pretrained(out, dtype=dt, attn_implementation="eager",
                                                             **extra).eval()
        worst.append(golden_error(m, out, golden))
    print("%-18s Hugging Face bf16 %.3g, fp16 %.3g (CPU): half_tolerances.txt %.3g %.3g"
          % (name, worst[0], worst[1], 2 * worst[0], 2 * worst[1]))


if __name__ == "__main__":
    for n in sys.argv[1:] or MODELS:
        make(n)

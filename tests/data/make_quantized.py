#!/usr/bin/env python3
"""make_quantized.py — the repository's own quantized test checkpoints (tests/data/<name>/), in the GPTQ
forms ../shared's llama-gptq-tiny (4-bit, sym, desc_act false, v1 zeros) does not cover, and their
goldens, made as ../shared's were: random Llama weights quantized round-to-nearest with per-group min/max
zero points, packed as AutoGPTQ writes them, then decoded exactly in float64 by the decoder of
quantized_half_error.py (an implementation apart from kiln's frontend/quantized.c) and run in transformers
in float64 on the CPU, eager attention (golden.json as make_goldens.py writes it). Then Hugging Face's own
bf16 and fp16 error against the golden (tests/cuda/half_tolerances.txt takes twice it).

  llama-gptq8-tiny  8-bit, asym, group 16, desc_act true (g_idx: the inputs' groups in a random order),
                    checkpoint_format gptq (v1: a zero stored minus one; zeros of 0 wrap to 255)
  llama-gptq4v2-tiny 4-bit, asym, group -1 (one group: the whole input), checkpoint_format gptq_v2
                    (zeros as they are), no g_idx tensor
  llama-fp8block-tiny FineGrainedFP8 (quant_method "fp8", as DeepSeek-V3's and Qwen3's FP8 checkpoints):
                    E4M3 weights with a float32 weight_scale_inv a 32 x 32 block (weight_block_size), rest
                    bf16 (../shared's llama-fp8-tiny is compressed-tensors' per-channel form)

Needs torch, transformers and safetensors (PyPI); the output is committed, so the tests need none.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors.torch  # noqa: E402
from quantized_half_error import decode, decode_fp8, half_error, load_tensors  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=128, bos_token_id=2, eos_token_id=1, pad_token_id=0,
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
MODELS = {
    "llama-gptq8-tiny": dict(bits=8, group_size=16, desc_act=True, sym=False, checkpoint_format="gptq", seed=53),
    "llama-gptq4v2-tiny": dict(bits=4, group_size=-1, desc_act=False, sym=False, checkpoint_format="gptq_v2",
                               seed=59),
    "llama-fp8block-tiny": dict(fp8_block=[32, 32], seed=61),
}
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack_rows(q, bits):
    """[in, out] codes -> int32 [in * bits / 32, out]: input row i in bits bits*(i % per) of row i / per."""
    per = 32 // bits
    out = np.zeros((q.shape[0] // per, q.shape[1]), dtype=np.uint64)
    for j in range(per):
        out |= (q[j::per].astype(np.uint64) << np.uint64(bits * j))
    return out.astype(np.uint32).view(np.int32)


def pack_cols(z, bits):
    """[groups, out] -> int32 [groups, out * bits / 32]: column o in bits bits*(o % per) of column o / per."""
    per = 32 // bits
    out = np.zeros((z.shape[0], z.shape[1] // per), dtype=np.uint64)
    for j in range(per):
        out |= (z[:, j::per].astype(np.uint64) << np.uint64(bits * j))
    return out.astype(np.uint32).view(np.int32)


def quantize(w, spec, rng):
    """w [out, in] float -> qweight, qzeros, scales (f16), g_idx (or None): AutoGPTQ's layout."""
    bits, group = spec["bits"], spec["group_size"]
    out_dim, in_dim = w.shape
    group = in_dim if group == -1 else group
    groups = in_dim // group
    if spec["desc_act"]:
        g_idx = (rng.permutation(in_dim) // group).astype(np.int32)  # each group's inputs scattered
    else:
        g_idx = (np.arange(in_dim) // group).astype(np.int32)
    top = (1 << bits) - 1
    q = np.zeros((in_dim, out_dim), dtype=np.int64)
    zeros = np.zeros((groups, out_dim), dtype=np.int64)
    scales = np.zeros((groups, out_dim), dtype=np.float16)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        lo = np.minimum(w[:, cols].min(axis=1), 0.0)
        hi = np.maximum(w[:, cols].max(axis=1), 0.0)
        s = ((hi - lo) / top).astype(np.float16)
        s[s == 0] = np.float16(1e-3)
        z = np.clip(np.round(-lo / s.astype(np.float64)), 0, top).astype(np.int64)
        scales[g], zeros[g] = s, z
        q[cols] = np.clip(np.round(w[:, cols] / s.astype(np.float64)[:, None]) + z[:, None], 0, top).T
    stored = (zeros - 1) & top if spec["checkpoint_format"] == "gptq" else zeros
    return pack_rows(q, bits), pack_cols(stored, bits), scales, g_idx if spec["desc_act"] else None


def quantize_fp8(w, block):
    """w [out, in] float -> E4M3 codes (uint8) and float32 scale_inv [ceil(out/bo), ceil(in/bi)]: each block's
    largest magnitude onto E4M3's largest finite value, 448."""
    bo, bi = block
    rows, cols = -(-w.shape[0] // bo), -(-w.shape[1] // bi)
    scale = np.zeros((rows, cols), dtype=np.float32)
    codes = torch.zeros(w.shape, dtype=torch.float8_e4m3fn)
    for r in range(rows):
        for c in range(cols):
            blk = w[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi]
            scale[r, c] = np.float32(max(np.abs(blk).max(), 1e-6) / 448.0)
            codes[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi] = torch.from_numpy(blk / np.float64(scale[r, c])).to(
                torch.float8_e4m3fn)
    return codes, scale


def make(name):
    spec = MODELS[name]
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(spec["seed"])
    torch.manual_seed(spec["seed"])
    cfg = transformers.LlamaConfig(**CONFIG)
    model = transformers.LlamaForCausalLM(cfg).eval()
    tensors = {}
    for n, p in model.state_dict().items():
        v = p.detach().double().numpy()
        if "norm" in n:  # perturbed: a loader that ignored them would fail
            v = 1.0 + 0.3 * rng.standard_normal(v.shape)
        elif "embed" in n or "lm_head" in n:
            v = 0.5 * rng.standard_normal(v.shape)
        else:
            v = 0.15 * rng.standard_normal(v.shape)
        layer = n.rsplit(".", 2)
        if len(layer) == 3 and layer[1] in LINEAR and layer[2] == "weight" and "fp8_block" in spec:
            codes, scale = quantize_fp8(v, spec["fp8_block"])
            tensors[n], tensors[n + "_scale_inv"] = codes, torch.from_numpy(scale)
        elif len(layer) == 3 and layer[1] in LINEAR and layer[2] == "weight":
            qw, qz, sc, gi = quantize(v, spec, rng)
            p_ = n[:-len("weight")]
            tensors[p_ + "qweight"], tensors[p_ + "qzeros"], tensors[p_ + "scales"] = qw, qz, sc
            if gi is not None:
                tensors[p_ + "g_idx"] = gi
        elif "fp8_block" in spec:
            tensors[n] = torch.from_numpy(v).to(torch.bfloat16)
        else:
            tensors[n] = v.astype(np.float16)
    if "fp8_block" in spec:
        qcfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": spec["fp8_block"]}
        safetensors.torch.save_file(tensors, os.path.join(out, "model.safetensors"))
        tensors = load_tensors(os.path.join(out, "model.safetensors"))
    else:
        qcfg = {"bits": spec["bits"], "group_size": spec["group_size"], "desc_act": spec["desc_act"],
                "sym": spec["sym"], "quant_method": "gptq", "checkpoint_format": spec["checkpoint_format"],
                "true_sequential": True}
        save_file(tensors, os.path.join(out, "model.safetensors"))
    config = dict(CONFIG, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                  torch_dtype="bfloat16" if "fp8_block" in spec else "float16", rope_scaling=None,
                  quantization_config=qcfg)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    # the golden: every packed layer decoded exactly (float64), the rest as stored
    state = {}
    for n, t in tensors.items():
        if "fp8_block" in spec and t.dtype == np.uint8:
            state[n] = torch.from_numpy(decode_fp8(qcfg, tensors, n[:-len("weight")]))
        elif n.endswith(".qweight"):
            state[n[:-len("qweight")] + "weight"] = torch.from_numpy(decode(qcfg, tensors, n[:-len("qweight")]))
        elif not n.endswith((".qzeros", ".scales", ".g_idx", ".weight_scale_inv")):
            state[n] = torch.from_numpy(t.astype(np.float64))
    cfg._attn_implementation = "eager"
    ref = transformers.LlamaForCausalLM(cfg).eval()
    ref.load_state_dict(state, strict=False)
    ref = ref.double()
    g = torch.Generator().manual_seed(5)
    cases = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 9, 40)]
    on_disk = "FineGrainedFP8: E4M3 weights, a float32 weight_scale_inv a %d x %d block; rest bfloat16" % tuple(
        spec["fp8_block"]) if "fp8_block" in spec else "GPTQ %d-bit %s, group %d%s, checkpoint_format %s; rest float16" % (
        spec["bits"], "sym" if spec["sym"] else "asym", spec["group_size"],
        ", desc_act (g_idx)" if spec["desc_act"] else "", spec["checkpoint_format"])
    golden = {"model": "tests/data/" + name, "weights_on_disk": on_disk,
              "random_init_seed": spec["seed"],
              "reference": "transformers %s, torch %s, float64 on CPU, eager attention; quantized linear weights "
                           "decoded exactly (float64) from the stored tensors (tests/data/quantized_half_error.py)"
                           % (transformers.__version__, torch.__version__),
              "cases": [], "greedy": [],
              "logits_format": "float32 little-endian, row-major [tokens, vocab], one row per input position"}
    with torch.no_grad():
        for i, ids in enumerate(cases):
            logits = ref(torch.tensor([ids])).logits[0].float().numpy()
            logits.astype("<f4").tofile(os.path.join(out, "case%d.logits.f32" % i))
            golden["cases"].append({"input_ids": ids, "logits": "case%d.logits.f32" % i, "shape": list(logits.shape)})
        seq = list(cases[1][:5])
        for _ in range(24):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
        golden["greedy"].append({"prompt_ids": cases[1][:5], "new_ids": seq[5:]})
    json.dump(golden, open(os.path.join(out, "golden.json"), "w"), indent=1)
    json.dump({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
              open(os.path.join(out, "generation_config.json"), "w"), indent=2)
    half_error(out)


if __name__ == "__main__":
    for n in sys.argv[1:] or MODELS:
        make(n)

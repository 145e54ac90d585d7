#!/usr/bin/env python3
"""Hugging Face's own bf16 and fp16 error against the goldens of ../shared's AWQ, GPTQ and FP8 Llamas, for
tests/cuda/half_tolerances.txt (it takes twice it), as make_goldens.py measures tests/data's models.

The packed layers are decoded here from the format definitions (../shared/models/*/README.md), an
implementation apart from kiln's frontend/quantized.c, exactly in float64; the model then runs in
transformers at bf16 and fp16 (weights rounded to that dtype, as kiln's --dtype rounds the decoded f32),
CPU, eager attention. Usage: python3 tests/data/quantized_half_error.py [SHARED_DIR]
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import golden_error  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def unpack_cols(packed, bits, order=None):
    """int32 [r, c] -> [r, c * 32 / bits]: field j of column c is column c * per + order[j]."""
    per = 32 // bits
    u = packed.astype(np.int64) & 0xFFFFFFFF
    out = np.zeros((packed.shape[0], packed.shape[1] * per), dtype=np.int64)
    for j in range(per):
        col = order[j] if order else j
        out[:, col::per] = (u >> (bits * j)) & ((1 << bits) - 1)
    return out


def decode(q, tensors, prefix):
    bits, group = q.get("bits", q.get("w_bit", 4)), q.get("group_size", q.get("q_group_size", 128))
    scales = tensors[prefix + "scales"].astype(np.float64)
    if q["quant_method"] == "awq":
        qw = unpack_cols(tensors[prefix + "qweight"], 4, AWQ_ORDER)  # [in, out]
        qz = unpack_cols(tensors[prefix + "qzeros"], 4, AWQ_ORDER)  # [in/g, out]
        g = np.arange(qw.shape[0]) // group
    else:
        per = 32 // bits
        packed = tensors[prefix + "qweight"].astype(np.int64) & 0xFFFFFFFF  # [in/per, out]
        qw = np.zeros((packed.shape[0] * per, packed.shape[1]), dtype=np.int64)
        for j in range(per):
            qw[j::per] = (packed >> (bits * j)) & ((1 << bits) - 1)
        qz = unpack_cols(tensors[prefix + "qzeros"], bits)
        if q.get("checkpoint_format", "gptq") == "gptq":
            qz = (qz + 1) & ((1 << bits) - 1)
        group = qw.shape[0] if group == -1 else group  # one group: the whole input
        g = tensors[prefix + "g_idx"].astype(np.int64) if prefix + "g_idx" in tensors else \
            np.arange(qw.shape[0]) // group
    w = (qw - qz[g]) * scales[g]  # [in, out]
    return w.T.copy()


def decode_fp8(q, tensors, prefix):
    """FP8 E4M3 P.weight [out, in] times its scale: one, an output channel's ([out, 1]) or a block's."""
    codes = torch.from_numpy(tensors[prefix + "weight"].view(np.uint8).copy()).view(torch.float8_e4m3fn)
    w = codes.double().numpy()
    scale = tensors.get(prefix + "weight_scale", tensors.get(prefix + "weight_scale_inv")).astype(np.float64)
    if scale.size == 1:
        return w * scale.reshape(())
    if scale.shape == (w.shape[0], 1) or scale.shape == (w.shape[0],):
        return w * scale.reshape(-1, 1)
    bo, bi = -(-w.shape[0] // scale.shape[0]), -(-w.shape[1] // scale.shape[1])
    return w * np.repeat(np.repeat(scale, bo, axis=0), bi, axis=1)[:w.shape[0], :w.shape[1]]


def load_tensors(path):
    """safetensors as numpy, F8_E4M3 tensors as uint8 codes (numpy has no fp8)."""
    import safetensors.torch
    out = {}
    for k, v in safetensors.torch.load_file(path).items():
        out[k] = v.view(torch.uint8).numpy() if v.dtype == torch.float8_e4m3fn else v.float().numpy() \
            if v.dtype == torch.bfloat16 else v.numpy()
    return out


def half_error(folder):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    q = cfg.pop("quantization_config")
    tensors = load_tensors(os.path.join(folder, "model.safetensors"))
    state = {}
    for name, t in tensors.items():
        if q["quant_method"] in ("compressed-tensors", "fp8"):
            if t.dtype == np.uint8:
                state[name] = torch.from_numpy(decode_fp8(q, tensors, name[:-len("weight")]))
            elif not name.endswith((".weight_scale", ".weight_scale_inv", ".input_scale")):
                state[name] = torch.from_numpy(t.astype(np.float64))
        elif name.endswith(".qweight"):
            prefix = name[:-len("qweight")]
            state[prefix + "weight"] = torch.from_numpy(decode(q, tensors, prefix))
        elif not name.endswith((".qzeros", ".scales", ".g_idx")):
            state[name] = torch.from_numpy(t.astype(np.float64))
    golden = json.load(open(os.path.join(folder, "golden.json")))
    config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    worst = []
    for dt in (torch.float64, torch.bfloat16, torch.float16):  # float64 first: the decoding checked
        config._attn_implementation = "eager"
        m = transformers.LlamaForCausalLM(config).eval()
        missing, unexpected = m.load_state_dict(state, strict=False)
        assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
        worst.append(golden_error(m.to(dt), folder, golden))
    assert worst[0] < 1e-6, "the float64 run is %.3g from the golden: the decoding is wrong" % worst[0]
    worst = worst[1:]
    print("%-18s Hugging Face bf16 %.3g, fp16 %.3g (CPU): half_tolerances.txt %.3g %.3g"
          % (os.path.basename(folder), worst[0], worst[1], 2 * worst[0], 2 * worst[1]))


if __name__ == "__main__":
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")
    for model in ("llama-awq-tiny", "llama-gptq-tiny", "llama-fp8-tiny"):
        half_error(os.path.join(shared, "models", model))

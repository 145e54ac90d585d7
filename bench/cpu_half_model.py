#!/usr/bin/env python3
"""cpu_half_model.py OUT_DIR — a Llama with random weights, for bench/cpu_half.sh.

Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (bf16, Hugging Face
tensor names): hidden 1024, 12 layers, 16 heads of 64 (4 KV heads), MLP 2816,
vocabulary 32000, untied lm_head: 200.8M parameters. Weights are normal with
standard deviation 0.02 (seed 0), norms 1. No eos_token_id, so that `kiln run`
generates every token asked for. Prints the bytes of weights a decode step
reads (every matrix once, one row of the embedding) for f32 and bf16.
Needs numpy.
"""
import json
import os
import sys

import numpy as np

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
}


def tensors(c):
    """(name, shape) of every weight, in Hugging Face's naming."""
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    yield "model.embed_tokens.weight", (v, h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def bf16(x):
    """float32 array to bfloat16 bits, rounding to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: cpu_half_model.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    specs = list(tensors(CONFIG))
    header, offset = {}, 0
    for name, shape in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    tmp = os.path.join(out, "model.safetensors.tmp")
    with open(tmp, "wb") as fp:
        fp.write(len(head).to_bytes(8, "little") + head)
        for name, shape in specs:
            if len(shape) == 1:
                data = np.full(shape, 0x3F80, dtype=np.uint16)  # 1.0
            else:
                data = bf16(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
            fp.write(data.tobytes())
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as fp:
        json.dump(CONFIG, fp, indent=2)
    params = sum(int(np.prod(s)) for _, s in specs)
    per_token = params - CONFIG["vocab_size"] * CONFIG["hidden_size"] + CONFIG["hidden_size"]
    print(f"parameters {params}, read per decode token {per_token}: "
          f"f32 {per_token * 4} bytes, bf16 {per_token * 2} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""deepseek_v3_shape.py OUT_DIR [LAYERS] — DeepSeek-V3's shape (hidden 7168, 128 heads, latent attention with
kv_lora_rank 512, 256 routed experts of 2048, 8 active, a shared expert; the first 3 layers dense) with LAYERS
layers (default 4) as a checkpoint folder whose model.safetensors is sparse: its header names every tensor with
its shape and the file is extended to the data's size without writing it (about 30 GB apparent at 4 layers, a
few kB on disk). For checks that read shapes only: the header says which optional weights are present, e.g.

    python3 bench/deepseek_v3_shape.py /tmp/dsv3 && \\
      build/tests/cuda/cuda_compile_graph /tmp/dsv3 /tmp/dsv3/config.json sm_90 bf16 200

(the graph's kernels generated and compiled with NVRTC for sm_90a). Not a model to run: the data reads as zeros.
"""
import json, os, struct, sys

out = sys.argv[1]
L = int(sys.argv[2]) if len(sys.argv) > 2 else 4
H, nh, ql, kvl, nope, rot, vd, ffn, mffn, E, V, dense = 7168, 128, 1536, 512, 128, 64, 128, 18432, 2048, 256, 129280, 3
T = {}
T["model.embed_tokens.weight"] = [V, H]
T["lm_head.weight"] = [V, H]
T["model.norm.weight"] = [H]
for i in range(L):
    p = "model.layers.%d." % i
    T[p + "input_layernorm.weight"] = [H]
    T[p + "post_attention_layernorm.weight"] = [H]
    T[p + "self_attn.q_a_proj.weight"] = [ql, H]
    T[p + "self_attn.q_a_layernorm.weight"] = [ql]
    T[p + "self_attn.q_b_proj.weight"] = [nh * (nope + rot), ql]
    T[p + "self_attn.kv_a_proj_with_mqa.weight"] = [kvl + rot, H]
    T[p + "self_attn.kv_a_layernorm.weight"] = [kvl]
    T[p + "self_attn.kv_b_proj.weight"] = [nh * (nope + vd), kvl]
    T[p + "self_attn.o_proj.weight"] = [H, nh * vd]
    if i < dense:
        for n, s in (("gate_proj", [ffn, H]), ("up_proj", [ffn, H]), ("down_proj", [H, ffn])):
            T[p + "mlp." + n + ".weight"] = s
    else:
        T[p + "mlp.gate.weight"] = [E, H]
        T[p + "mlp.gate.e_score_correction_bias"] = [E]
        for e in list(range(E)) + ["shared"]:
            q = p + ("mlp.shared_experts." if e == "shared" else "mlp.experts.%d." % e)
            for n, s in (("gate_proj", [mffn, H]), ("up_proj", [mffn, H]), ("down_proj", [H, mffn])):
                T[q + n + ".weight"] = s
header, offset = {}, 0
for name, shape in T.items():
    size = 2
    for d in shape:
        size *= d
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
    offset += size
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    f.truncate(8 + len(text) + offset)
config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
          "intermediate_size": ffn, "moe_intermediate_size": mffn, "num_hidden_layers": L,
          "first_k_dense_replace": dense, "num_attention_heads": nh, "num_key_value_heads": nh, "q_lora_rank": ql,
          "kv_lora_rank": kvl, "qk_nope_head_dim": nope, "qk_rope_head_dim": rot, "v_head_dim": vd,
          "n_routed_experts": E, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
          "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
          "hidden_act": "silu", "rms_norm_eps": 1e-06, "vocab_size": V, "max_position_embeddings": 163840,
          "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                "mscale": 1.0, "mscale_all_dim": 1.0,
                                                "original_max_position_embeddings": 4096},
          "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
print("%s: %d layers, %.1f GB of tensors (sparse)" % (out, L, offset / 1e9))

#!/usr/bin/env bash
# `kiln build` streams the checkpoint: it reads (mmap), converts and writes the engine one tensor at a
# time and drops each tensor's mapped pages once written (kf_checkpoint_release), and a tensor the
# checkpoint stores as it is goes in parts of 64 MiB (kd_weight_part; a concatenation of such tensors,
# fuse_sibling_matmuls' q,k,v and gate/up weights, too), so its peak memory is neither
# the checkpoint nor its largest tensor. A Llama-shaped safetensors checkpoint of ~630 MB (4 layers,
# embedding and head 256 MiB each: vocabulary 131072), written here, builds for the CPU with --stats'
# peak memory under 40% of the checkpoint's size (it held the whole checkpoint before: ~1.1x its
# size) and under its largest tensor (a whole copy of it beside its mapped pages before: 2x). Not
# under the sanitizers (their shadow memory and quarantine are not the build's).
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
python3 - "$work/ckpt" <<'PY' || { echo "FAIL: cannot write the checkpoint"; exit 1; }
import json, os, struct, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
D, F, L, V, H, KV = 1024, 4096, 4, 131072, 16, 4
hd = D // H
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "vocab_size": V,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(out, "config.json"), "w"))
shapes = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D], "lm_head.weight": [V, D]}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "self_attn.q_proj.weight": [D, D], p + "self_attn.k_proj.weight": [KV * hd, D],
                   p + "self_attn.v_proj.weight": [KV * hd, D], p + "self_attn.o_proj.weight": [D, D],
                   p + "mlp.gate_proj.weight": [F, D], p + "mlp.up_proj.weight": [F, D],
                   p + "mlp.down_proj.weight": [D, F], p + "input_layernorm.weight": [D],
                   p + "post_attention_layernorm.weight": [D]})
hdr, off = {}, 0
for k, s in shapes.items():
    n = 2 * s[0] * (s[1] if len(s) > 1 else 1)
    hdr[k] = {"dtype": "BF16", "shape": s, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
chunk = bytes([0x12, 0x3c]) * (1 << 20)  # bf16 0.0089..., 2 MiB
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    while off > 0:
        f.write(chunk[:min(off, len(chunk))])
        off -= min(off, len(chunk))
PY
size=$(stat -c %s "$work/ckpt/model.safetensors")
"$KILN_BIN" build "$work/ckpt" --dtype bf16 --stats -o "$work/m.engine" >/dev/null 2>"$work/build.err" \
  || { echo "FAIL: kiln build"; cat "$work/build.err"; exit 1; }
line=$(grep '^kiln: build: .* peak memory' "$work/build.err")
echo "checkpoint $size bytes; $line"
peak=$(sed -n 's/.*peak memory \([0-9.]*\) \(KiB\|MiB\|GiB\)$/\1 \2/p' <<<"$line" \
       | awk '{ m = $2 == "KiB" ? 1024 : $2 == "MiB" ? 1048576 : 1073741824; printf "%.0f", $1 * m }')
[ -n "$peak" ] && [ "$peak" -gt 0 ] && passes=$((passes+1)) || { echo "FAIL: no peak memory in --stats"; failures=$((failures+1)); }
[ -n "$peak" ] && [ "$peak" -lt $((size * 2 / 5)) ] && passes=$((passes+1)) \
  || { echo "FAIL: peak memory $peak bytes, not under 40% of the checkpoint's $size"; failures=$((failures+1)); }
largest=$((131072 * 1024 * 2))
[ -n "$peak" ] && [ "$peak" -lt "$largest" ] && passes=$((passes+1)) \
  || { echo "FAIL: peak memory $peak bytes, not under the largest tensor's $largest"; failures=$((failures+1)); }
finish

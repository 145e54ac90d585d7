#!/usr/bin/env bash
# `kiln build` streams the checkpoint: it reads (mmap), converts and writes the engine one tensor at a
# time and drops each tensor's mapped pages once written (kf_checkpoint_release), and a tensor the
# checkpoint stores as it is goes in parts of 64 MiB (kd_weight_part; a concatenation of such tensors,
# fuse_sibling_matmuls' q,k,v and gate/up weights, too), so its peak memory is neither
# the checkpoint nor its largest tensor.
#  1. A Llama-shaped safetensors checkpoint of ~630 MB (4 layers, embedding and head 256 MiB each:
#     vocabulary 131072), written here, builds for the CPU with --stats' peak memory under 40% of the
#     checkpoint's size (it held the whole checkpoint before: ~1.1x its size) and under its largest
#     tensor (a whole copy of it beside its mapped pages before: 2x).
#  2. Where NVRTC is present: Llama-3-8B's widths (hidden 4096, FFN 14336, 32/8 heads, vocabulary
#     128256) with 2 layers, ~3 GB, built for sm_90 (the kernels compiled by NVRTC in the process):
#     peak memory at most 1.5 GB (issue #11's bar for the 32-layer 16 GB build: the layers only add
#     tensors, which stream), its build time reported. The checkpoint and the engine are on /dev/shm
#     (tmpfs) where it has room for both, as bench/prefill_bench.py puts them.
#  3. An AWQ checkpoint (4-bit GEMM packing, groups of 128) of 8 layers of width 2048 / FFN 5632, whose
#     decoded f32 weights take 1.44 GB: the packed layers decode one at a time as they are read
#     (frontend/quantized.c's lazy tensors), so peak memory stays under 40% of that (all of it before,
#     decoded when the checkpoint was opened), with --quant w4a16 taking the checkpoint's own codes.
# Case 1 runs twice, case 2 once, started by a process holding 2 GiB resident, as
# bench/prefill_bench.py starts kiln right after writing the checkpoint: --stats' peak must be kiln's
# own (Linux's ru_maxrss keeps, across execve, the high water of the process that exec'd: the 8B
# build reported 16 GB, its Python parent's, where kiln itself held ~300 MB).
# Not under the sanitizers (their shadow memory and quarantine are not the build's).
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }

# make_ckpt DIR D F L V H KV: a bf16 Llama checkpoint of those dims, every element 0.0089
make_ckpt() {
  python3 - "$@" <<'PY' || { echo "FAIL: cannot write the checkpoint $1"; exit 1; }
import json, os, struct, sys
out = sys.argv[1]
D, F, L, V, H, KV = (int(a) for a in sys.argv[2:8])
os.makedirs(out, exist_ok=True)
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
}

# big_parent MIB CMD...: CMD run (exec'd) by a python3 that holds MIB MiB resident; CMD's status
big_parent() {
  python3 - "$@" <<'PY'
import subprocess, sys
held = b"\x01" * (int(sys.argv[1]) << 20)  # resident: every page written
sys.exit(subprocess.run(sys.argv[2:]).returncode)
PY
}

# build_peak DIR ENGINE [ARGS...]: kiln build --stats (started by big_parent $PARENT_MIB when it is set);
# sets $line (its build line) and $peak (bytes)
build_peak() {
  local dir=$1 engine=$2
  shift 2
  line= peak=
  local parent=()
  [ -n "${PARENT_MIB:-}" ] && parent=(big_parent "$PARENT_MIB")
  "${parent[@]}" "$KILN_BIN" build "$dir" --dtype bf16 --stats -o "$engine" "$@" >/dev/null 2>"$work/build.err" \
    || { echo "FAIL: kiln build $dir $*"; cat "$work/build.err"; failures=$((failures+1)); return 1; }
  line=$(grep '^kiln: build: .* peak memory' "$work/build.err")
  peak=$(sed -n 's/.*peak memory \([0-9.]*\) \(KiB\|MiB\|GiB\)$/\1 \2/p' <<<"$line" \
         | awk '{ m = $2 == "KiB" ? 1024 : $2 == "MiB" ? 1048576 : 1073741824; printf "%.0f", $1 * m }')
  [ -n "$peak" ] && [ "$peak" -gt 0 ] && passes=$((passes+1)) || { echo "FAIL: no peak memory in --stats"; failures=$((failures+1)); }
}

make_ckpt "$work/ckpt" 1024 4096 4 131072 16 4
size=$(stat -c %s "$work/ckpt/model.safetensors")
for PARENT_MIB in "" 2048; do
  if build_peak "$work/ckpt" "$work/m.engine"; then
    echo "checkpoint $size bytes${PARENT_MIB:+, started by a process of $PARENT_MIB MiB}; $line"
    [ -n "$peak" ] && [ "$peak" -lt $((size * 2 / 5)) ] && passes=$((passes+1)) \
      || { echo "FAIL: peak memory $peak bytes, not under 40% of the checkpoint's $size"; failures=$((failures+1)); }
    largest=$((131072 * 1024 * 2))
    [ -n "$peak" ] && [ "$peak" -lt "$largest" ] && passes=$((passes+1)) \
      || { echo "FAIL: peak memory $peak bytes, not under the largest tensor's $largest"; failures=$((failures+1)); }
  fi
done
PARENT_MIB=
rm -rf "$work/ckpt" "$work/m.engine"

# make_awq DIR D F L V H KV: an AWQ (GEMM, 4-bit, g128) Llama checkpoint: every code 9, zero 8, scale 0.01
make_awq() {
  python3 - "$@" <<'PY' || { echo "FAIL: cannot write the AWQ checkpoint $1"; exit 1; }
import json, os, struct, sys
out = sys.argv[1]
D, F, L, V, H, KV = (int(a) for a in sys.argv[2:8])
G = 128
os.makedirs(out, exist_ok=True)
hd = D // H
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "vocab_size": V,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float16",
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": G, "version": "gemm",
                                   "zero_point": True}}, open(os.path.join(out, "config.json"), "w"))
fill = {}  # name -> (dtype, shape, the repeated bytes of an element)
fill["model.embed_tokens.weight"] = ("F16", [V, D], b"\x8f\x20")
fill["lm_head.weight"] = ("F16", [V, D], b"\x8f\x20")
fill["model.norm.weight"] = ("F16", [D], b"\x00\x3c")
for l in range(L):
    p = f"model.layers.{l}."
    fill[p + "input_layernorm.weight"] = ("F16", [D], b"\x00\x3c")
    fill[p + "post_attention_layernorm.weight"] = ("F16", [D], b"\x00\x3c")
    for name, (o, i) in {"self_attn.q_proj": (D, D), "self_attn.k_proj": (KV * hd, D), "self_attn.v_proj": (KV * hd, D),
                         "self_attn.o_proj": (D, D), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D),
                         "mlp.down_proj": (D, F)}.items():
        fill[p + name + ".qweight"] = ("I32", [i, o // 8], b"\x99\x99\x99\x99")
        fill[p + name + ".qzeros"] = ("I32", [i // G, o // 8], b"\x88\x88\x88\x88")
        fill[p + name + ".scales"] = ("F16", [i // G, o], b"\x1f\x21")
hdr, off = {}, 0
for k, (dt, s, e) in fill.items():
    n = len(e)
    for x in s: n *= x
    hdr[k] = {"dtype": dt, "shape": s, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for k, (dt, s, e) in fill.items():
        n = 1
        for x in s: n *= x
        chunk = e * (1 << 18)
        while n > 0:
            m = min(n, 1 << 18)
            f.write(chunk[:m * len(e)])
            n -= m
PY
}
make_awq "$work/awq" 2048 5632 8 32000 16 4
decoded=$((8 * 4 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 2048 * 5632)))
if build_peak "$work/awq" "$work/awq.engine" --quant w4a16 --quant-group 128; then
  echo "AWQ checkpoint, $decoded bytes of weights decoded: $line"
  [ -n "$peak" ] && [ "$peak" -lt $((decoded * 2 / 5)) ] && passes=$((passes+1)) \
    || { echo "FAIL: peak memory $peak bytes, not under 40% of the decoded weights' $decoded"; failures=$((failures+1)); }
fi
rm -rf "$work/awq" "$work/awq.engine"

if "$KILN_BIN" --version 2>&1 | grep -q '^NVRTC: [0-9]'; then
  # on tmpfs where it has room for the checkpoint (~3 GB) and the engine (~3 GB), with 2 GB to spare
  where=$work
  shm_free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [ -n "$shm_free" ] && [ "$shm_free" -gt $((8 * 1024 * 1024)) ] && shm=$(mktemp -d /dev/shm/kiln-streaming.XXXXXX); then
    where=$shm
    trap 'rm -rf "$work" "$shm"' EXIT
  fi
  make_ckpt "$where/ckpt8b" 4096 14336 2 128256 32 8
  size=$(stat -c %s "$where/ckpt8b/model.safetensors")
  if PARENT_MIB=2048 build_peak "$where/ckpt8b" "$where/m8b.engine" --target sm_90; then
    echo "8B widths, 2 layers, sm_90, in $where, started by a process of 2048 MiB: checkpoint $size bytes; $line"
    [ -n "$peak" ] && [ "$peak" -le $((1536 * 1048576)) ] && passes=$((passes+1)) \
      || { echo "FAIL: peak memory $peak bytes over 1.5 GiB"; failures=$((failures+1)); }
  fi
  rm -rf "$where/ckpt8b" "$where/m8b.engine"
else
  echo "(no NVRTC in this build: the sm_90 case is not run)"
fi
finish

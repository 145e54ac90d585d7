#!/usr/bin/env bash
# Attention sinks (attention(q, k, v, sinks): a logit a head in every row's softmax, with no value; gpt-oss)
# in tests/data/sinks/sinks.kiln (weights made by make_ckpt.py): its logits against plain Python's float64
# (expected_3_5_7_9_11.txt, made by expected.py, transformers' eager formula), kiln verify with all passes
# against none (exact, and bf16 fast), the IR's round trip with the sinks kept through split_kv_write,
# the build for sm_90 (tests/cuda/cuda_ops.sh runs it), and sinks of the wrong shape located.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
data="$(dirname "$0")/../data/sinks"
python3 "$data/make_ckpt.py" "$work/ckpt" || { echo "FAIL: make_ckpt.py"; exit 1; }
"$KILN_BIN" build "$data/sinks.kiln" --weights "$work/ckpt" -o "$work/m.engine" --dump-ir-after all \
  --dump-dir "$work/ir" >/dev/null 2>&1 || { echo "FAIL: kiln build"; exit 1; }
"$KILN_BIN" run "$work/m.engine" --ids 3,5,7,9,11 -n 1 --logits-out "$work/logits" >/dev/null 2>&1 \
  || { echo "FAIL: kiln run"; exit 1; }
compare='import struct, sys
raw = open(sys.argv[1], "rb").read()
got = struct.unpack("<%df" % (len(raw) // 4), raw)
want = [float(v) for line in open(sys.argv[2]) for v in line.split()]
worst = max(abs(a - b) for a, b in zip(got[:len(want)], want)) / max(abs(b) for b in want)
print("rows %d, within %s: %s" % (len(want) // 32, sys.argv[3], worst < float(sys.argv[3])))'
expect_same "logits against float64" "rows 5, within 1e-6: True" \
  "$(python3 -c "$compare" "$work/logits" "$data/expected_3_5_7_9_11.txt" 1e-6)"
# the sinks change the answer: the same model with them all at -1e30 (none) is far from the expected
python3 - "$work/ckpt" "$work/nosink" <<'PY' || { echo "FAIL: the checkpoint without sinks"; exit 1; }
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
for name, v in hdr.items():
    if name.endswith("sinks"):
        a, b = v["data_offsets"]
        raw[8 + n + a:8 + n + b] = struct.pack("<%df" % ((b - a) // 4), *([-1e30] * ((b - a) // 4)))
open(os.path.join(dst, "model.safetensors"), "wb").write(raw)
PY
"$KILN_BIN" build "$data/sinks.kiln" --weights "$work/nosink" -o "$work/n.engine" >/dev/null 2>&1 \
  && "$KILN_BIN" run "$work/n.engine" --ids 3,5,7,9,11 -n 1 --logits-out "$work/nlogits" >/dev/null 2>&1 \
  || { echo "FAIL: kiln build/run without sinks"; exit 1; }
expect_same "the sinks matter" "rows 5, within 1e-2: False" \
  "$(python3 -c "$compare" "$work/nlogits" "$data/expected_3_5_7_9_11.txt" 1e-2)"
for how in "" "--dtype bf16 --precision fast"; do
  # shellcheck disable=SC2086
  if out=$("$KILN_BIN" verify "$data/sinks.kiln" --weights "$work/ckpt" $how 2>&1) && [[ "$out" == *"OK: within tolerance"* ]]; then
    passes=$((passes+1))
  else
    echo "FAIL verify ${how:-exact}"; echo "$out" | sed 's/^/    /'; failures=$((failures+1))
  fi
done
# every pass keeps the sinks: the attention reads them after split_kv_write and in the final plan
for f in "$work"/ir/*compiled.ir "$work"/ir/*split_kv_write.ir "$work"/ir/*plan_memory.ir; do
  [ "$(grep -c '= attention(%[0-9]*, %[0-9]*, %[0-9]*, %[0-9]*)' "$f")" = 2 ] && passes=$((passes+1)) \
    || { echo "FAIL: $(basename "$f") has not two attentions of four operands"; failures=$((failures+1)); }
done
"$KILN_BIN" build "$data/sinks.kiln" --from-ir "$work"/ir/*plan_memory.ir --weights "$work/ckpt" -o "$work/m2.engine" \
  >/dev/null 2>&1 && cmp -s "$work/m.engine" "$work/m2.engine" && passes=$((passes+1)) \
  || { echo "FAIL: the dump does not build back to the same engine (--from-ir)"; failures=$((failures+1)); }
if [ "${KILN_HAVE_NVRTC:-}" = ON ]; then
  "$KILN_BIN" build "$data/sinks.kiln" --weights "$work/ckpt" --target sm_90 --emit-source "$work/src" \
    -o "$work/cuda.engine" >/dev/null 2>&1 && grep -q ', nullptr, sinks);' "$work"/src/*.cu && passes=$((passes+1)) \
    || { echo "FAIL: kiln build --target sm_90 (the attention kernels called with the sinks)"; failures=$((failures+1)); }
fi
sed -e 's/layer weight sinks\[heads\] *= "layers.{i}.sinks";/layer weight sinks[heads] = "layers.{i}.sinks";\nlayer weight wide[2 * heads] = "layers.{i}.sinks" if false;/' \
    -e 's/a = attention(q, k, v, sinks\[i\], /a = attention(q, k, v, view(linear(x, wq[i]), heads, head_dim), /' "$data/sinks.kiln" > "$work/bad.kiln"
expect_fail sinks-shape "bad.kiln:32:9: error: attention: sinks f32[T,4,16] must be [heads] of q f32[T,4,16]: a logit a head" -- \
  "$KILN_BIN" build "$work/bad.kiln" --weights "$work/ckpt" -o "$work/bad.engine"
[ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL: a failed build left bad.engine"; failures=$((failures+1)); }
finish

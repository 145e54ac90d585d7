#!/usr/bin/env bash
# The elementwise ops of soft-capping, routing and clipping (tanh, exp, sigmoid, clamp, maximum,
# minimum, a tensor plus or minus a number) and a row softmax in a model (tests/data/ops/ops.kiln, its weights made by make_ckpt.py):
# kiln verify, all passes against none, in exact and in fast precision (bf16), with the values of
# the unary ops' IR pinned by the round trip; and bad clamps, maximum and minimum located.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
data="$(dirname "$0")/../data/ops"
python3 "$data/make_ckpt.py" "$work/ckpt" || { echo "FAIL: make_ckpt.py"; exit 1; }
for how in "" "--dtype bf16 --precision fast"; do
  # shellcheck disable=SC2086
  if out=$("$KILN_BIN" verify "$data/ops.kiln" --weights "$work/ckpt" $how 2>&1) && [[ "$out" == *"OK: within tolerance"* ]]; then
    passes=$((passes+1))
  else
    echo "FAIL verify ${how:-exact}"; echo "$out" | sed 's/^/    /'; failures=$((failures+1))
  fi
done
# the IR: the ops and their attributes, printed and parsed back
"$KILN_BIN" build "$data/ops.kiln" --weights "$work/ckpt" --dump-ir-after compiled --dump-dir "$work/ir" \
  -o "$work/m.engine" >/dev/null 2>&1 || { echo "FAIL: kiln build --dump-ir-after compiled"; exit 1; }
ir=$(cat "$work"/ir/*.ir 2>/dev/null)
"$KILN_BIN" build "$data/ops.kiln" --from-ir "$work"/ir/*.ir --weights "$work/ckpt" -o "$work/m2.engine" >/dev/null 2>&1 \
  && passes=$((passes+1)) || { echo "FAIL: the dump does not build back (--from-ir)"; failures=$((failures+1)); }
for want in "tanh(%" "sigmoid(%" "exp(%" "max(%" "min(%" "softmax(%" "= ge(%2, %" "= gt(%2, %" "f32[T,1] = amax(%2)" "f32[T,1] = amin(%" "{min=-3.0, max=3.0}" "{max=0.25}" "{min=0.0}" "{value=1.0, shift=0.5}" "{value=-1.0, shift=1.0}" "{value=1.0, shift=-0.5}"; do
  [[ "$ir" == *"$want"* ]] && passes=$((passes+1)) || { echo "FAIL: the IR has no '$want'"; failures=$((failures+1)); }
done
cat > "$work/bad.kiln" <<'K'
model bad;
param max_context = 16;
param bos_token_id = 1;
param eos_token_id = 2;
weight e[64, 32] = "embed.weight";
forward {
  x = embed(e, tokens);
  a = clamp(x);
  b = clamp(x, min: 2.0, max: 1.0);
  c = x + (1e308 * 10.0);
  d = maximum(x, 2.0);
  f = minimum(x, concat(x, x));
  g = x >= 0.5;
  h = x <= concat(x, x);
  i = masked_fill(x, x);
  j = masked_fill(x, concat(x, x), value: -inf);
  k = masked_fill(x, x, value: 0.0 / 0.0);
  l = amax(e);
  m = amin(x, x);
  n = concat(view(x, 4, 8), view(x, 2, 16));
  output logits = a;
}
K
# bad_build NAME WANT: building bad.kiln fails with WANT among its messages (each a line of it)
bad_build() { expect_fail "$1" "$2" -- "$KILN_BIN" build "$work/bad.kiln" --weights "$work/ckpt" -o "$work/bad.engine"; }
bad_build bad-clamps "bad.kiln:8:7: error: clamp: give min:, max: or both"
bad_build bad-clamp-order "bad.kiln:9:26: error: clamp: max 1 is below min 2"
bad_build bad-shift "bad.kiln:10:9: error: '+' adds inf; the number must be finite"
bad_build bad-maximum "bad.kiln:11:18: error: maximum: argument 2 must be a tensor, not a float (a number bounds a tensor from below with clamp(x, min: c))"
bad_build bad-minimum-shapes "bad.kiln:12:7: error: min: shapes do not broadcast: f32[T,32] and f32[T,64]"
bad_build bad-compare-number "bad.kiln:13:9: error: '>=' compares numbers, not a tensor and a float"
bad_build bad-compare-shapes "bad.kiln:14:9: error: ge: shapes do not broadcast: f32[T,64] and f32[T,32]"
bad_build bad-masked-fill-value "bad.kiln:15:7: error: masked_fill: missing attribute 'value'"
bad_build bad-masked-fill-shapes "bad.kiln:16:7: error: masked_fill: shapes do not broadcast: f32[T,32] and f32[T,64]"
bad_build bad-masked-fill-nan "bad.kiln:17:36: error: division by zero in '/'"
bad_build bad-amax-weight "bad.kiln:18:7: error: amax: operand must be a float tensor with T as its first dim, got f32[64,32]"
bad_build bad-amin-args "bad.kiln:19:7: error: amin: expected 1 argument, got 2"
bad_build bad-concat-repeat "bad.kiln:20:7: error: concat: operands differ in more than the last dim (a dim of 1 repeats): f32[T,4,8] and f32[T,2,16]"
[ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL: a failed build left bad.engine"; failures=$((failures+1)); }
finish

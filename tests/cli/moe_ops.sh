#!/usr/bin/env bash
# The routing ops of a mixture of experts (sum, topk, gather, a tensor divided by a row's sum,
# expert_matmul with and without a bias, expert_sum) in tests/data/moe/moe.kiln (weights made by
# make_ckpt.py): its logits against numpy's float64 (expected_3_5_7_9.txt, made by expected.py), kiln
# verify with all passes against none (exact, and bf16 fast), the IR's round trip (the last pass's dump builds
# the same engine), the build for sm_90
# (tests/cuda/cuda_ops.sh runs it), and bad uses located.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
data="$(dirname "$0")/../data/moe"
python3 "$data/make_ckpt.py" "$work/ckpt" || { echo "FAIL: make_ckpt.py"; exit 1; }
"$KILN_BIN" build "$data/moe.kiln" --weights "$work/ckpt" -o "$work/m.engine" --dump-ir-after compiled,plan_memory \
  --dump-dir "$work/ir" >/dev/null 2>&1 || { echo "FAIL: kiln build"; exit 1; }
"$KILN_BIN" run "$work/m.engine" --ids 3,5,7,9 -n 1 --logits-out "$work/logits" >/dev/null 2>&1 \
  || { echo "FAIL: kiln run"; exit 1; }
got=$(python3 - "$work/logits" "$data/expected_3_5_7_9.txt" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
got = struct.unpack("<%df" % (len(raw) // 4), raw)
want = [float(v) for line in open(sys.argv[2]) for v in line.split()]
worst = max(abs(a - b) for a, b in zip(got[:len(want)], want)) / max(abs(b) for b in want)
print("rows %d, within 1e-6: %s" % (len(want) // 32, worst < 1e-6))
PY
)
expect_same "logits against numpy" "rows 4, within 1e-6: True" "$got"
# the Hub's layout, a tensor an expert, stacked by {e}: the same engine's logits; a missing expert located
python3 "$data/make_ckpt.py" "$work/split" --per-expert || { echo "FAIL: make_ckpt.py --per-expert"; exit 1; }
sed -e 's/"experts\.\([a-z]*\)\.\(weight\|bias\)"/"experts.{e}.\1.\2"/' "$data/moe.kiln" > "$work/split.kiln"
grep -q '"experts.{e}.gate.bias"' "$work/split.kiln" || { echo "FAIL: split.kiln has no {e} template"; exit 1; }
"$KILN_BIN" build "$work/split.kiln" --weights "$work/split" -o "$work/split.engine" >/dev/null 2>&1 \
  && "$KILN_BIN" run "$work/split.engine" --ids 3,5,7,9 -n 1 --logits-out "$work/split.logits" >/dev/null 2>&1 \
  && cmp -s "$work/logits" "$work/split.logits" && passes=$((passes+1)) \
  || { echo "FAIL: the per-expert checkpoint through {e} does not give the same logits"; failures=$((failures+1)); }
sed -e 's/^param experts = config.num_experts;/param experts = config.num_experts + 1;/' "$work/split.kiln" > "$work/five.kiln"
expect_fail missing-expert "five.kiln:16:39: error: weight 'wg': expert 4's tensor 'experts.4.gate.weight' is not in the checkpoint (expert 0's is; the declared dim 0 says 5 experts)" -- \
  "$KILN_BIN" build "$work/five.kiln" --weights "$work/split" -o "$work/five.engine"
for how in "" "--dtype bf16 --precision fast"; do
  # shellcheck disable=SC2086
  if out=$("$KILN_BIN" verify "$data/moe.kiln" --weights "$work/ckpt" $how 2>&1) && [[ "$out" == *"OK: within tolerance"* ]]; then
    passes=$((passes+1))
  else
    echo "FAIL verify ${how:-exact}"; echo "$out" | sed 's/^/    /'; failures=$((failures+1))
  fi
done
ir=$(cat "$work"/ir/*-compiled.ir 2>/dev/null)
for want in "i32[T,2] = topk(%" "{k=2}" "= gather(%" "f32[T,1] = sum(%" "= div(%" "f32[T,2,8] = expert_matmul(%" "= expert_sum(%"; do
  [[ "$ir" == *"$want"* ]] && passes=$((passes+1)) || { echo "FAIL: the IR has no '$want'"; failures=$((failures+1)); }
done
"$KILN_BIN" build "$data/moe.kiln" --from-ir "$work"/ir/*-plan_memory.ir --weights "$work/ckpt" -o "$work/m2.engine" >/dev/null 2>&1 \
  && cmp -s "$work/m.engine" "$work/m2.engine" && passes=$((passes+1)) \
  || { echo "FAIL: the dump does not build back to the same engine (--from-ir)"; failures=$((failures+1)); }
if [ "${KILN_HAVE_NVRTC:-}" = ON ]; then
  "$KILN_BIN" build "$data/moe.kiln" --weights "$work/ckpt" --target sm_90 -o "$work/cuda.engine" >/dev/null 2>&1 && passes=$((passes+1)) || { echo "FAIL: kiln build --target sm_90"; failures=$((failures+1)); }
fi
cat > "$work/bad.kiln" <<'K'
model bad;
param max_context = 16;
param bos_token_id = 1;
param eos_token_id = 2;
weight e[32, 16] = "embed.weight";
weight r[4, 16] = "router.weight";
weight wg[4, 8, 16] = "experts.gate.weight";
forward {
  x = embed(e, tokens);
  p = linear(x, r);
  a = topk(p, k: 5);
  b = topk(p);
  c = gather(p, topk(x, k: 2));
  d = gather(p, p);
  f = expert_matmul(x, wg, topk(x, k: 2));
  g = expert_matmul(x, e, topk(p, k: 2));
  h = expert_sum(expert_matmul(x, wg, topk(p, k: 2)), p);
  i = p / concat(p, p);
  output logits = a;
}
K
for case in "bad-k-large|bad.kiln:11:7: error: topk: k = 5 must be from 1 to the 4 values of a row of f32[T,4]" \
            "bad-k-missing|bad.kiln:12:7: error: topk: missing attribute 'k'" \
            "gather-wide|bad.kiln:13:7: error: gather: indices rank 16 values a row, but index only 4" \
            "gather-float|bad.kiln:14:7: error: gather: indices must be i32[T,k] indices (topk's), got f32[T,4]" \
            "expert-range|bad.kiln:15:7: error: expert_matmul: indices rank 16 values a row, but index only 4" \
            "expert-weight|bad.kiln:16:7: error: expert_matmul: expert weights must be a [E,N,K] float weight, got f32[32,16]" \
            "expert-sum|bad.kiln:17:7: error: expert_sum: weights must be [T,2] (one for each row of f32[T,2,8]), got f32[T,4]" \
            "div-shapes|bad.kiln:18:9: error: div: shapes do not broadcast: f32[T,4] and f32[T,8]"; do
  expect_fail "${case%%|*}" "${case#*|}" -- "$KILN_BIN" build "$work/bad.kiln" --weights "$work/ckpt" -o "$work/bad.engine"
done
[ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL: a failed build left bad.engine"; failures=$((failures+1)); }
finish

#!/usr/bin/env bash
# The quantize pass (--quant): what the IR dump shows of each scheme, that a dump builds again to the
# same engine, the quality gates of issue #13 on TinyStories-656K (kiln quant-check against the f32
# engine on tests/data/tinystories_eval.txt; --calib takes the other stories, tinystories_calib.txt),
# and each bad setting a clear error with no engine written.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
data="$(cd "$(dirname "$0")/../data" && pwd)"
eval_text="$data/tinystories_eval.txt"
[ -n "${KILN_SANITIZED:-}" ] && { head -3 "$eval_text" > "$work/eval.txt"; eval_text="$work/eval.txt"; }
"$KILN_BIN" build "$ts" -o "$work/f32.engine" 2>/dev/null || { echo "FAIL: the f32 build"; exit 1; }

# IR: the merged q,k,v weight's three parts, the matmul's scheme; 8 quantized matmuls (4 a layer), the
# lm_head and the embedding left in f32
"$KILN_BIN" build "$ts" -o "$work/w4.engine" --quant w4a16 --dump-ir-after quantize,plan_memory --dump-dir "$work/dump" \
  2>/dev/null || { echo "FAIL: the w4a16 build"; failures=$((failures+1)); }
ir="$work/dump/02-quantize.ir"
expect_same "w4a16: codes" 1 "$(grep -c '^%[0-9]* *: u4\[256,128\] = weight() {name="wq\[0\]+wk\[0\]+wv\[0\]#codes", derive="concat0", sources="wq\[0\],wk\[0\],wv\[0\]", rows=\[128,64,64\], quant="codes", qtype="u4", group=128, asym=1}' "$ir")"
expect_same "w4a16: scales" 1 "$(grep -c '^%[0-9]* *: f16\[256,1\] = weight() {name="wq\[0\]+wk\[0\]+wv\[0\]#scale",.* quant="scale", qtype="u4", group=128, asym=1}' "$ir")"
expect_same "w4a16: zero points" 1 "$(grep -c '^%[0-9]* *: u8\[256,1\] = weight() {name="wq\[0\]+wk\[0\]+wv\[0\]#zero",.* quant="zero", qtype="u4", group=128, asym=1}' "$ir")"
expect_same "w4a16: quantized matmuls" 8 "$(grep -c '= matmul(%[0-9]*, %[0-9]*, %[0-9]*, %[0-9]*) {quant="w4a16"}' "$ir")"
expect_same "w4a16: the lm_head stays f32" 1 "$(grep -c '= matmul(%[0-9]*, %[0-9]*) @' "$ir")"
# the last dump (planned, fused) builds again to an engine with the same logits
"$KILN_BIN" build "$ts" --from-ir "$work/dump/13-plan_memory.ir" -o "$work/w4-again.engine" 2>/dev/null \
  || { echo "FAIL: --from-ir of the quantized dump"; failures=$((failures+1)); }
"$KILN_BIN" run "$work/w4.engine" --ids 1,415,204,263 -n 0 --logits-out "$work/a.bin" >/dev/null 2>&1
"$KILN_BIN" run "$work/w4-again.engine" --ids 1,415,204,263 -n 0 --logits-out "$work/b.bin" >/dev/null 2>&1
cmp -s "$work/a.bin" "$work/b.bin" && [ -s "$work/a.bin" ] && passes=$((passes+1)) \
  || { echo "FAIL: the dump's engine gives other logits"; failures=$((failures+1)); }
# w8a16: i8 codes, a f16 scale a row, no zero points; fp8: f8e4m3 codes, f32 scales; w8a8: i8, f32
for s in "w8a16:i8:f16" "fp8:f8e4m3:f32" "w8a8:i8:f32" "w4a16 --quant-group 32 --quant-sym:u4:f16"; do
  IFS=: read -r args codes scale <<<"$s"
  rm -rf "$work/d2"
  "$KILN_BIN" build "$ts" -o "$work/x.engine" --quant $args --dump-ir-after quantize --dump-dir "$work/d2" 2>/dev/null
  k=$([ "$args" = "${args#w4a16}" ] && echo 1 || echo 4)
  expect_same "$args: codes and scales" 2 "$(grep -cE "^%[0-9]* *: ($codes\[256,128\]|$scale\[256,$k\]) = weight\(\) \{name=\"wq\[0\]\+wk\[0\]\+wv\[0\]#(codes|scale)\"" "$work/d2/02-quantize.ir")"
  expect_same "$args: no zero points" 0 "$(grep -c '#zero' "$work/d2/02-quantize.ir")"
done
# --quant-skip: a glob of description names ('[' is itself); a merged weight goes when any part matches
"$KILN_BIN" build "$ts" -o "$work/x.engine" --quant w8a16 --quant-skip 'wq[*]' --quant-skip 'wd[1]' \
  --dump-ir-after quantize --dump-dir "$work/d3" 2>/dev/null
expect_same "--quant-skip: 5 quantized matmuls" 5 "$(grep -c '{quant="w8a16"}' "$work/d3/02-quantize.ir")"
expect_fail skip-nothing "kiln: warning: --quant-skip 'nosuch*' matches no weight a matmul quantizes" -- \
  sh -c "'$KILN_BIN' build '$ts' -o '$work/x.engine' --quant w8a16 --quant-skip 'nosuch*' && exit 1"

# a Hub checkpoint's own codes: --quant in its layout (AWQ: groups of 64 with zero points; GPTQ sym: 64,
# no zero points) takes them as they are, so the engine's logits are the f32 engine's of the decoded weights,
# bit for bit; another layout quantizes the decoded weights again (close, not equal)
same_logits() {
  local name=$1 want=$2 model=$3; shift 3
  "$KILN_BIN" build "$KILN_SHARED/models/$model" -o "$work/hub-f32.engine" 2>/dev/null &&
    "$KILN_BIN" build "$KILN_SHARED/models/$model" -o "$work/hub-q.engine" "$@" 2>/dev/null ||
    { echo "FAIL: $name: builds"; failures=$((failures+1)); return; }
  "$KILN_BIN" run "$work/hub-f32.engine" --ids 1,5,9,20,33,40 -n 0 --logits-out "$work/hf.bin" >/dev/null 2>&1
  "$KILN_BIN" run "$work/hub-q.engine" --ids 1,5,9,20,33,40 -n 0 --logits-out "$work/hq.bin" >/dev/null 2>&1
  local got=different
  [ -s "$work/hf.bin" ] && cmp -s "$work/hf.bin" "$work/hq.bin" && got=same
  expect_same "$name" "$want" "$got"
}
if [ -d "$KILN_SHARED/models/llama-awq-tiny" ] && [ -d "$KILN_SHARED/models/llama-gptq-tiny" ]; then
  same_logits "AWQ's codes as they are" same llama-awq-tiny --quant w4a16 --quant-group 64
  same_logits "GPTQ's codes as they are" same llama-gptq-tiny --quant w4a16 --quant-group 64 --quant-sym
  same_logits "AWQ quantized again in groups of 32" different llama-awq-tiny --quant w4a16 --quant-group 32
  same_logits "GPTQ sym in the layout with zero points (each 8): its codes too" same llama-gptq-tiny --quant w4a16 --quant-group 64
  same_logits "GPTQ 4-bit as w8a16: quantized again" different llama-gptq-tiny --quant w8a16
  # smoothed in the checkpoint's own layout: its codes are not the smoothed matrix's, so the weights are quantized
  # again (taking them with the gain over s gave a mean KL of 0.063 and 2.7% top-1 against the decoded engine)
  awq="$KILN_SHARED/models/llama-awq-tiny" tok="$KILN_SHARED/models/stories260k/tok512.bin"
  "$KILN_BIN" build "$awq" --tokenizer "$tok" -o "$work/awq-f32.engine" 2>/dev/null &&
    "$KILN_BIN" build "$awq" --tokenizer "$tok" -o "$work/awq-sq.engine" --quant w4a16 --quant-group 64 \
      --calib "$data/tinystories_calib.txt" --quant-smooth smoothquant --quant-round rtn 2>/dev/null &&
    "$KILN_BIN" quant-check "$work/awq-sq.engine" --reference "$work/awq-f32.engine" --text "$eval_text" --max-kl 0.01 \
      >/dev/null 2>&1 && passes=$((passes+1)) || { echo "FAIL: a smoothed AWQ checkpoint in its own layout"; failures=$((failures+1)); }
  # a calibration tokenizer with ids past the model's vocabulary: the user's error, not the interpreter's assert
  rm -f "$work/bad.engine"
  expect_fail calib-foreign-tokenizer "tinystories_calib.txt: error: the tokenizer gives id 598, but the model's vocabulary has 512 ids" -- \
    "$KILN_BIN" build "$awq" --tokenizer "$ts/tokenizer.json" -o "$work/bad.engine" --quant w4a16 --calib "$data/tinystories_calib.txt"
  [ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL: calib-foreign-tokenizer: engine written"; failures=$((failures+1)); }
fi

# quality (bench/RESULTS.md has the figures): mean KL against f32 on held-out text
gate() {
  local name=$1 max=$2; shift 2
  "$KILN_BIN" build "$ts" -o "$work/q.engine" "$@" 2>/dev/null || { echo "FAIL: $name build"; failures=$((failures+1)); return; }
  out=$("$KILN_BIN" quant-check "$work/q.engine" --reference "$work/f32.engine" --text "$eval_text" --max-kl "$max" 2>&1) \
    && passes=$((passes+1)) || { echo "FAIL: $name: mean KL over $max"; echo "$out"; failures=$((failures+1)); }
}
gate w8a16 0.01 --quant w8a16
gate w8a8 0.01 --quant w8a8
gate fp8 0.0125 --quant fp8
gate "w4a16 (RTN)" 0.12 --quant w4a16
gate "w4a16 GPTQ --calib" 0.06 --quant w4a16 --calib "$data/tinystories_calib.txt"
gate "fp8 GPTQ --calib" 0.01 --quant fp8 --calib "$data/tinystories_calib.txt"
# the KV cache quantized (--kv-dtype): int8 and fp8 codes, a scale a position and head
gate "KV int8" 0.001 --kv-dtype int8
gate "KV fp8" 0.01 --kv-dtype fp8
"$KILN_BIN" build "$ts" -o "$work/kv.engine" --kv-dtype int8 --dump-ir-after quantize_kv --dump-dir "$work/d4" 2>/dev/null
expect_same "--kv-dtype int8: 2 attention, 2 kv_write on i8" 4 "$(grep -cE '= (attention|kv_write)\(.*kv_dtype="i8"' "$work/d4/10-quantize_kv.ir")"
# a write of codes is a kernel of its own (its scale is a head row's amax): out of the q,k,v matmul's group,
# right after it
expect_same "--kv-dtype int8: kv_write in no group" 0 "$(grep -cE '= kv_write\(.*fuse=' "$work/d4/10-quantize_kv.ir")"
expect_same "--kv-dtype int8: kv_write after the group" 2 \
  "$(grep -B1 -E '= kv_write\(' "$work/d4/10-quantize_kv.ir" | grep -cE '= rope\(.*fuse=')"
# GPTQ beats round to nearest on the held-out text
kl() { "$KILN_BIN" quant-check "$1" --reference "$work/f32.engine" --text "$eval_text" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['mean_kl'])"; }
"$KILN_BIN" build "$ts" -o "$work/rtn.engine" --quant w4a16 2>/dev/null
"$KILN_BIN" build "$ts" -o "$work/gptq.engine" --quant w4a16 --calib "$data/tinystories_calib.txt" 2>/dev/null
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 0.8 * float(sys.argv[2]) else 1)" "$(kl "$work/gptq.engine")" "$(kl "$work/rtn.engine")" \
  && passes=$((passes+1)) || { echo "FAIL: GPTQ not 20% below RTN's KL"; failures=$((failures+1)); }
# smoothing (--quant-smooth): each below the same rounding without it
below() { # name, then two sets of build arguments separated by --
  local name=$1; shift
  local a=() b=()
  while [ "$1" != -- ]; do a+=("$1"); shift; done; shift; b=("$@")
  "$KILN_BIN" build "$ts" -o "$work/a.engine" "${a[@]}" 2>/dev/null && "$KILN_BIN" build "$ts" -o "$work/b.engine" "${b[@]}" 2>/dev/null \
    && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$(kl "$work/a.engine")" "$(kl "$work/b.engine")" \
    && passes=$((passes+1)) || { echo "FAIL: $name"; failures=$((failures+1)); }
}
calib=(--calib "$data/tinystories_calib.txt")
below "SmoothQuant below w8a8 unsmoothed" --quant w8a8 "${calib[@]}" -- --quant w8a8 "${calib[@]}" --quant-smooth none
below "AWQ below round to nearest" --quant w4a16 "${calib[@]}" --quant-smooth awq --quant-round rtn -- --quant w4a16 "${calib[@]}" --quant-round rtn
gate "w8a8 SmoothQuant --calib" 0.01 --quant w8a8 "${calib[@]}"
# the IR of smoothing: each norm before a quantized matmul reads its gain over s; the matmul's parts say how
"$KILN_BIN" build "$ts" -o "$work/sq.engine" --quant w8a8 "${calib[@]}" --dump-ir-after quantize,plan_memory --dump-dir "$work/d5" 2>/dev/null
expect_same "smoothquant: the gains over s" 4 "$(grep -c '= weight() {name="[a-z_]*\[[01]\]#smooth", derive="smooth", sources="[a-z_]*\[[01]\]", rows=\[128\], smooth_of="w[a-z]\[[01]\]+w' "$work/d5/02-quantize.ir")"
expect_same "smoothquant: the smoothed parts" 4 "$(grep -c '#codes".*smooth="smoothquant"' "$work/d5/02-quantize.ir")"
expect_fail smooth-from-ir "kiln: error: weight 'attn_norm[0]#smooth': smoothing 'wq[0]+wk[0]+wv[0]' (smoothquant) needs the calibration of its input (--calib), which a build from an IR text does not run" -- \
  "$KILN_BIN" build "$ts" --from-ir "$work/d5/13-plan_memory.ir" -o "$work/none.engine"

# bad settings: an error, no engine
bad() {
  local name=$1 want=$2; shift 2
  rm -f "$work/bad.engine"
  expect_fail "$name" "$want" -- "$KILN_BIN" build "$ts" -o "$work/bad.engine" "$@"
  [ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL $name: engine written"; failures=$((failures+1)); }
}
bad unknown-scheme "kiln: error: --quant w5a16: unknown scheme (known: w4a16, w8a16, fp8, w8a8)" --quant w5a16
bad group-not-dividing "kiln: error: --quant w4a16: weight 'wq[0]+wk[0]+wv[0]' has 128 columns (inputs), which groups of 96 do not divide" --quant w4a16 --quant-group 96
bad group-without-quant "kiln: error: --quant-group is a setting of --quant, which is not given" --quant-group 64
bad skip-without-quant "kiln: error: --quant-skip is a setting of --quant, which is not given" --quant-skip 'w*'
bad asym-fp8 "kiln: error: --quant-asym: --quant fp8 has no zero points (symmetric codes only)" --quant fp8 --quant-asym
bad group-w8a8 "kiln: error: --quant-group: --quant w8a8 takes a scale a row" --quant w8a8 --quant-group 64
bad sym-and-asym "kiln build: error: --quant-sym and --quant-asym: choose one" --quant w4a16 --quant-sym --quant-asym
bad group-zero "--quant-group" --quant w4a16 --quant-group 0
bad calib-without-quant "kiln: error: --calib $data/tinystories_calib.txt: a calibration text weighs --quant's quantization, which is not given" --calib "$data/tinystories_calib.txt"
bad calib-missing "$work/none.txt" --quant w4a16 --calib "$work/none.txt"
bad quant-from-ir "kiln: error: --quant w4a16 with --from-ir $work/dump/13-plan_memory.ir: no pass runs on an IR text" \
  --quant w4a16 --from-ir "$work/dump/13-plan_memory.ir"
: > "$work/empty.txt"
bad calib-empty "a calibration text needs at least 2 tokens" --quant w4a16 --calib "$work/empty.txt"
bad smooth-without-quant "kiln: error: --quant-smooth is a setting of --quant, which is not given" --quant-smooth awq
bad smooth-without-calib "kiln: error: --quant-smooth awq: smoothing follows the inputs' statistics, which --calib FILE gives" --quant w4a16 --quant-smooth awq
bad smooth-unknown "kiln: error: --quant-smooth foo: unknown (known: awq, smoothquant, none)" --quant w4a16 --quant-smooth foo "${calib[@]}"
bad round-gptq-without-calib "kiln: error: --quant-round gptq: GPTQ spreads each rounding's error by the inputs' statistics, which --calib FILE gives" --quant w4a16 --quant-round gptq
bad round-unknown "kiln: error: --quant-round x: unknown (known: gptq, rtn)" --quant w4a16 --quant-round x
bad kv-unknown "kiln: error: --kv-dtype int4: unknown (known: int8, fp8; without it the cache holds the compute dtype)" --kv-dtype int4
bad kv-from-ir "kiln: error: --kv-dtype int8 with --from-ir $work/dump/13-plan_memory.ir: no pass runs on an IR text" \
  --kv-dtype int8 --from-ir "$work/dump/13-plan_memory.ir"
finish

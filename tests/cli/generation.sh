#!/usr/bin/env bash
# The generation loop (runtime/generate.c) through kiln run: what starts it,
# what ends it, and prompts longer than the engine's step.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
s260="$KILN_SHARED/models/stories260k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL build"; exit 1; }
"$KILN_BIN" build "$s260/stories260K.bin" --tokenizer "$s260/tok512.bin" -o "$work/s260.engine" \
  || { echo "FAIL build"; exit 1; }

# no --prompt, no --ids: from BOS, as llama2.c's run.c does without a prompt
expect_same_output from-bos "$("$KILN_BIN" run "$work/ts.engine" --prompt "" -n 30 2>/dev/null)" \
  "$("$KILN_BIN" run "$work/ts.engine" -n 30 2>/dev/null)"

# the context's last position is used: a 16-position context takes BOS and 15 more tokens, and
# the token drawn from position 15 is the 16th generated (run.c prints seq_len tokens after BOS)
want=$("$KILN_BIN" run "$work/s260.engine" --ids 1 -n 16 2>/dev/null)
got=$("$KILN_BIN" run "$work/s260.engine" --ids 1 -n 100 --max-context 16 2>"$work/ctx.err")
expect_same_output last-position "$want" "$got"
expect_same last-position-count 16 "$(wc -w <<<"$got")"
grep -q "kiln: note: generated 16 tokens, not 100: the context of 16 positions is full" "$work/ctx.err" \
  && passes=$((passes+1)) || { echo "FAIL context note:"; cat "$work/ctx.err"; failures=$((failures+1)); }

# a prompt longer than the engine's largest step (--max-tokens 4) is prefilled in steps of 4:
# the logits and ids of the engine that takes it in one step
"$KILN_BIN" build "$ts" --max-tokens 4 -o "$work/ts4.engine" || { echo "FAIL build --max-tokens 4"; exit 1; }
ids=1,7,12,31,5,9,40,2,11
a=$("$KILN_BIN" run "$work/ts.engine" --ids $ids -n 8 --logits-out "$work/one.f32" 2>/dev/null)
b=$("$KILN_BIN" run "$work/ts4.engine" --ids $ids -n 8 --logits-out "$work/four.f32" 2>/dev/null)
expect_same_output chunked-ids "$a" "$b"
python3 - "$work/one.f32" "$work/four.f32" <<'PY' && passes=$((passes+1)) || failures=$((failures+1))
import struct, sys
a, b = (open(f, "rb").read() for f in sys.argv[1:3])
if len(a) != len(b) or not a:
    print("FAIL chunked logits: sizes", len(a), len(b)); sys.exit(1)
n = len(a) // 4
x, y = struct.unpack(f"<{n}f", a), struct.unpack(f"<{n}f", b)
worst = max(abs(p - q) for p, q in zip(x, y)) / max(abs(p) for p in x)
print(f"chunked prefill: logits within {worst:.3g} of the one-step prefill")
sys.exit(0 if worst <= 1e-6 else 1)
PY

# TinyStories ends its stories with <|end_story|>, its EOS token, but may spell it piece by piece:
# generation ends there either way and the text is not printed (this seed spells it)
out=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once upon a time" -n 300 --temperature 0.8 --seed 3 2>"$work/eos.err")
[[ "$out" != *"end_story"* && "$out" == *"drawings together." ]] && passes=$((passes+1)) \
  || { echo "FAIL eos text: $(tail -c 200 <<<"$out")"; failures=$((failures+1)); }
n_eos=$(sed -n 's/.*generated tokens \([0-9]*\),.*/\1/p' "$work/eos.err")
[ -n "$n_eos" ] && [ "$n_eos" -lt 300 ] && passes=$((passes+1)) || { echo "FAIL eos count: $n_eos"; failures=$((failures+1)); }
# --ignore-eos goes on past it
out=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once upon a time" -n 300 --temperature 0.8 --seed 3 --ignore-eos \
      2>"$work/noeos.err")
grep -q "generated tokens 300," "$work/noeos.err" && [[ "$out" == *"end_story"* ]] && passes=$((passes+1)) \
  || { echo "FAIL --ignore-eos: $(cat "$work/noeos.err")"; failures=$((failures+1)); }
# the EOS id itself ends generation too (greedy from BOS reaches it) and is not printed
out=$("$KILN_BIN" run "$work/ts.engine" --ids 1 -n 500 2>/dev/null)
[[ " $out " != *" 2 "* ]] && [ "$(wc -w <<<"$out")" -lt 500 ] && passes=$((passes+1)) \
  || { echo "FAIL eos id: $(wc -w <<<"$out") ids"; failures=$((failures+1)); }

# every EOS id a list names ends generation, and generation_config.json's list wins over
# config.json's id (as in Llama 3): a copy of TinyStories whose generation config lists 2 and the
# sixth id greedy generation from BOS draws
greedy=$("$KILN_BIN" run "$work/ts.engine" --ids 1 -n 12 2>/dev/null)
stop_id=$(awk '{print $6}' <<<"$greedy")
first5=$(awk '{print $1, $2, $3, $4, $5}' <<<"$greedy")
mkdir -p "$work/eoslist"
ln -s "$ts"/model.safetensors "$ts"/tokenizer.json "$work/eoslist/"
cp "$ts/config.json" "$work/eoslist/"
printf '{"bos_token_id": 1, "eos_token_id": [2, %s]}\n' "$stop_id" > "$work/eoslist/generation_config.json"
"$KILN_BIN" build "$work/eoslist" -o "$work/eoslist.engine" || { echo "FAIL build eoslist"; exit 1; }
if [[ " $first5 " == *" $stop_id "* ]]; then
  echo "FAIL: the sixth greedy id $stop_id comes earlier too ($greedy)"; failures=$((failures+1))
else
  expect_same eos-list "$first5" "$("$KILN_BIN" run "$work/eoslist.engine" --ids 1 -n 12 2>/dev/null)"
fi

# logits that are NaN are an error, not a silent end: a copy of the checkpoint with NaN in the
# final norm's weight
mkdir -p "$work/nan"
cp "$ts"/config.json "$ts"/tokenizer.json "$work/nan/"
python3 - "$ts/model.safetensors" "$work/nan/model.safetensors" <<'PY' || { echo "FAIL: making the NaN checkpoint"; exit 1; }
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
t = header["model.norm.weight"]
assert t["dtype"] == "F32"
begin, end = (8 + n + o for o in t["data_offsets"])
data[begin:end] = struct.pack("<f", float("nan")) * ((end - begin) // 4)
open(sys.argv[2], "wb").write(data)
PY
"$KILN_BIN" build "$work/nan" -o "$work/nan.engine" || { echo "FAIL build nan"; exit 1; }
expect_fail nan-logits "kiln: error: the model's logits are NaN or infinite after 5 tokens of sequence 0: no next token" -- \
  "$KILN_BIN" run "$work/nan.engine" --ids 1,7,12,31,5 -n 4
finish

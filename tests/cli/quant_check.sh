#!/usr/bin/env bash
# kiln quant-check: TinyStories-656K's bf16 engine against its f32 engine on
# tests/data/tinystories_eval.txt (original stories in the TinyStories style),
# an engine against itself, steps shorter than the window, the --max-kl gate,
# --json, and bad input.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
text="$(cd "$(dirname "$0")/../data" && pwd)/tinystories_eval.txt"
for args in "-o $work/f32.engine" "--dtype bf16 -o $work/bf16.engine" "--max-tokens 16 -o $work/step16.engine"; do
  # shellcheck disable=SC2086 # args is split on purpose
  "$KILN_BIN" build "$ts" $args 2>/dev/null || { echo "FAIL build $args"; exit 1; }
done
# the first two stories, for the runs that check something other than the numbers on the whole text;
# the sanitized build (KILN_SANITIZED=1, tests/cli/CMakeLists.txt), whose interpreter takes some 3 ms a
# token, scores only them
head -n 3 "$text" >"$work/part.txt"
[ "${KILN_SANITIZED:-0}" = 1 ] && whole="$work/part.txt" || whole="$text"

# num NAME FILE: the number after "NAME:" in quant-check's plain output
num() { sed -n "s/^$1: *\([-0-9.e+]*\).*/\1/p" "$2"; }
# expect_true NAME PYTHON-EXPRESSION: a check python3 decides
expect_true() {
  if python3 -c "import sys; sys.exit(0 if ($2) else 1)"; then passes=$((passes+1)); else
    echo "FAIL $1: $2"; failures=$((failures+1)); fi
}

# bf16 against f32 on the whole text: every field, a small mean KL, every token after the first scored
"$KILN_BIN" quant-check "$work/bf16.engine" --reference "$work/f32.engine" --text "$whole" --window 256 \
  >"$work/bf16.out" 2>"$work/bf16.err" && passes=$((passes+1)) \
  || { echo "FAIL bf16 vs f32: exit $?"; cat "$work/bf16.err"; failures=$((failures+1)); }
cat "$work/bf16.out"
for field in "engine" "reference" "text" "tokens scored" "mean KL" "p99 KL" "max KL" "top-1 agreement" "perplexity"; do
  grep -q "^$field: " "$work/bf16.out" && passes=$((passes+1)) || { echo "FAIL field '$field' missing"; failures=$((failures+1)); }
done
tokens=$(sed -n 's/^text: .* (\([0-9]*\) tokens, .*/\1/p' "$work/bf16.out")
mean=$(num "mean KL" "$work/bf16.out") p99=$(num "p99 KL" "$work/bf16.out") max=$(num "max KL" "$work/bf16.out")
top1=$(num "top-1 agreement" "$work/bf16.out")
# perp FILE: "ENGINE REFERENCE", the two perplexities
perp() { sed -n 's/^perplexity: *\([0-9.e+]*\) (engine), \([0-9.e+]*\) (reference)$/\1 \2/p' "$1"; }
ppl=$(perp "$work/bf16.out")
expect_same bf16-scored "$((tokens - 1))" "$(num "tokens scored" "$work/bf16.out")"
expect_true bf16-kl "0 < $mean < 0.01 and $mean <= $max and $p99 <= $max"
expect_true bf16-top1 "95 <= $top1 <= 100"
expect_true bf16-perplexity "1 < ${ppl% *} < 2048 and abs(${ppl% *} / ${ppl#* } - 1) < 0.01"
grep -Eq "^text: .* \([0-9]+ tokens, [0-9]+ windows? of at most 256\)$" "$work/bf16.out" && passes=$((passes+1)) \
  || { echo "FAIL windows line"; failures=$((failures+1)); }

# an engine against itself: exactly 0, every argmax the same, one perplexity
"$KILN_BIN" quant-check "$work/f32.engine" --reference "$work/f32.engine" --text "$work/part.txt" >"$work/self.out" \
  || { echo "FAIL self: exit $?"; failures=$((failures+1)); }
for field in "mean KL" "p99 KL" "max KL"; do expect_same "self $field" 0 "$(num "$field" "$work/self.out")"; done
expect_same self-top1 100.00 "$(num "top-1 agreement" "$work/self.out")"
ppl_self=$(perp "$work/self.out")
expect_same self-perplexity "${ppl_self% *}" "${ppl_self#* }"

# steps of 16 tokens (the engine's plan) in windows of 40 give the one-step engine's logits within
# rounding: what is compared is each token's own row
"$KILN_BIN" quant-check "$work/step16.engine" --reference "$work/f32.engine" --text "$work/part.txt" --window 40 \
  >"$work/step.out" || { echo "FAIL step16: exit $?"; failures=$((failures+1)); }
expect_true step16-kl "$(num "mean KL" "$work/step.out") < 1e-9"
expect_same step16-top1 100.00 "$(num "top-1 agreement" "$work/step.out")"

# --max-kl: exit 1 with the message past it (the results printed first), 0 within it
"$KILN_BIN" quant-check "$work/bf16.engine" --reference "$work/f32.engine" --text "$work/part.txt" --max-kl 0 \
  >"$work/gate.out" 2>"$work/gate.err"
expect_same max-kl-exit 1 "$?"
grep -Eq "^kiln quant-check: mean KL [0-9.e+-]+ exceeds --max-kl 0$" "$work/gate.err" && passes=$((passes+1)) \
  || { echo "FAIL max-kl message:"; cat "$work/gate.err"; failures=$((failures+1)); }
grep -q "^mean KL: " "$work/gate.out" && passes=$((passes+1)) || { echo "FAIL max-kl: no results"; failures=$((failures+1)); }

# --json (and --max-kl within the mean: exit 0): one object, with the plain output's numbers
"$KILN_BIN" quant-check "$work/bf16.engine" --reference "$work/f32.engine" --text "$work/part.txt" --json \
  --max-kl 0.01 >"$work/q.json" 2>"$work/q.err"
expect_same json-exit "0:" "$?:$(cat "$work/q.err")"
python3 - "$work/q.json" "$(num "mean KL" "$work/gate.out")" "$(num "tokens scored" "$work/gate.out")" <<'PY' \
  && passes=$((passes+1)) || failures=$((failures+1))
import json, sys
with open(sys.argv[1]) as f:
    r = json.load(f)
keys = ["kiln_quant_check", "engine", "reference", "text", "text_tokens", "window", "windows", "tokens_scored",
        "mean_kl", "p99_kl", "max_kl", "top1_agreement_pct", "top1_matches", "perplexity", "reference_perplexity"]
missing = [k for k in keys if k not in r]
ok = (not missing and r["tokens_scored"] == int(sys.argv[3]) == r["text_tokens"] - 1 and r["window"] == 512
      and abs(r["mean_kl"] - float(sys.argv[2])) <= 1e-5 * r["mean_kl"] and r["mean_kl"] <= r["p99_kl"] <= r["max_kl"]
      and 0 <= r["top1_agreement_pct"] <= 100)
if not ok:
    print("FAIL --json:", missing, r)
sys.exit(0 if ok else 1)
PY

# bad input: each a message naming the file or the option, a non-zero exit, no crash
q() { "$KILN_BIN" quant-check "$@"; }
printf '' >"$work/empty.txt"
mkdir "$work/dir"
"$KILN_BIN" build "$KILN_SHARED/models/stories260k/stories260K.bin" \
  --tokenizer "$KILN_SHARED/models/stories260k/tok512.bin" -o "$work/s260.engine" 2>/dev/null \
  || { echo "FAIL build stories260k"; exit 1; }
# the same model with a tokenizer that lacks its first merge: the same vocabulary, other ids; and one
# that adds no BOS, whose one-word text is one token
python3 - "$ts/tokenizer.json" "$work" <<'PY' || { echo "FAIL tokenizer copies"; exit 1; }
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["merges"] = t["model"]["merges"][1:]
json.dump(t, open(sys.argv[2] + "/merges.json", "w"))
t = json.load(open(sys.argv[1]))
t["post_processor"] = None
json.dump(t, open(sys.argv[2] + "/nobos.json", "w"))
PY
"$KILN_BIN" build "$ts" --tokenizer "$work/merges.json" -o "$work/merges.engine" 2>/dev/null \
  && "$KILN_BIN" build "$ts" --tokenizer "$work/nobos.json" -o "$work/nobos.engine" 2>/dev/null \
  || { echo "FAIL build with the tokenizer copies"; exit 1; }
"$KILN_BIN" build "$KILN_SHARED/models/stories260k/stories260K.bin" -o "$work/notok.engine" 2>/dev/null \
  || { echo "FAIL build stories260k without its tokenizer"; exit 1; }
printf 'a' >"$work/one.txt"
f32="$work/f32.engine" bf16="$work/bf16.engine" part="$work/part.txt"
# qb ARGS...: bf16 against f32 on the first stories, with ARGS
qb() { q "$bf16" --reference "$f32" --text "$part" "$@"; }
usage="kiln quant-check: error: needs an engine, --reference REF_ENGINE and --text FILE"
expect_fail no-args "$usage" -- q
expect_fail no-reference "$usage" -- q "$bf16" --text "$part"
expect_fail no-text "$usage" -- q "$bf16" --reference "$f32"
expect_fail two-engines "kiln quant-check: error: unexpected argument '$f32'" -- qb "$f32"
expect_fail missing-engine "$work/nope.engine: error: cannot open" -- q "$work/nope.engine" --reference "$f32" --text "$part"
expect_fail missing-reference "$work/nope.engine: error: cannot open" -- q "$bf16" --reference "$work/nope.engine" --text "$part"
expect_fail not-an-engine "$part: error:" -- q "$part" --reference "$f32" --text "$part"
expect_fail no-tokenizer "$work/notok.engine: error: the engine holds no tokenizer" \
  -- q "$bf16" --reference "$work/notok.engine" --text "$part"
expect_fail missing-text "$work/nope.txt: error: cannot read: No such file or directory" \
  -- q "$bf16" --reference "$f32" --text "$work/nope.txt"
expect_fail text-dir "$work/dir: error: is a directory; --text names the text to score" \
  -- q "$bf16" --reference "$f32" --text "$work/dir"
expect_fail empty-text "$work/empty.txt: error: the text is empty" -- q "$bf16" --reference "$f32" --text "$work/empty.txt"
expect_fail one-token "$work/one.txt: error: the text is 1 token (with BOS); quant-check needs at least 2 to score one" \
  -- q "$work/nobos.engine" --reference "$work/nobos.engine" --text "$work/one.txt"
expect_fail vocab "$work/s260.engine: error: its vocabulary has 512 logits per token, the reference $f32's 2048" \
  -- q "$work/s260.engine" --reference "$f32" --text "$part"
expect_fail_re tokenizer \
  "^$work/merges.engine: error: its tokenizer gives $part other token ids than the reference $f32's: token [0-9]+ is [0-9]+, the reference's [0-9]+ \(" \
  -- q "$work/merges.engine" --reference "$f32" --text "$part"
for bad in abc -1 nan inf 1e10 ""; do
  expect_fail "max-kl '$bad'" "kiln quant-check: error: --max-kl: '$bad' is not a number in [0, 1e+09]" -- qb --max-kl "$bad"
done
for bad in 0 1 -5 1.5 x 99999999999; do
  expect_fail "window '$bad'" "kiln quant-check: error: --window: '$bad' is not an integer from 2 to" -- qb --window "$bad"
done
expect_fail window-context "$bf16: error: --window 513 is more than its context of 512 positions" -- qb --window 513
expect_fail max-kl-value "kiln quant-check: error: option '--max-kl' needs a value" -- qb --max-kl
finish

#!/usr/bin/env bash
# Text in, text out: kiln run against llama2.c's own run.c output, the
# TinyStories golden, and the sampler's determinism.
. "$(dirname "$0")/lib.sh"
s260="$KILN_SHARED/models/stories260k"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$s260/stories260K.bin" --tokenizer "$s260/tok512.bin" -o "$work/s260.engine" || { echo "FAIL build"; exit 1; }
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL build"; exit 1; }

# run.c's -n counts forward positions: BOS and the prompt's tokens but the
# last are positions too, so new tokens = steps - prompt tokens + 1.
run_like_runc() { # ENGINE PROMPT STEPS
  local n_prompt
  n_prompt=$("$KILN_BIN" tokenize "$1" --prompt "$2" | wc -w)
  "$KILN_BIN" run "$1" --prompt "$2" -n $(($3 - n_prompt + 1)) --temperature 0 2>/dev/null
}
expect_same runc-bos-256 "$(cat "$s260/expected_greedy_bos_256.txt")" "$(run_like_runc "$work/s260.engine" "" 256)"
expect_same runc-zoo-60 "$(cat "$s260/expected_greedy_Zoo_60.txt")" "$(run_like_runc "$work/s260.engine" "Zoo" 60)"
# byte for byte, trailing newline included
run_like_runc "$work/s260.engine" "Zoo" 60 > "$work/zoo.txt"
cmp -s "$work/zoo.txt" "$s260/expected_greedy_Zoo_60.txt" && passes=$((passes+1)) || { echo "FAIL zoo bytes"; failures=$((failures+1)); }

# TinyStories: greedy from BOS generates golden greedy[0].new_ids, and --prompt prints their text
want_ids=$(python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['greedy'][0]['new_ids'])))" "$ts/golden.json")
expect_same tinystories-ids "$want_ids" "$("$KILN_BIN" run "$work/ts.engine" --ids 1 -n 120)"
text=$("$KILN_BIN" run "$work/ts.engine" --prompt "" -n 120 2>/dev/null)
[[ "$text" == "Once upon a time, there was a little girl named Lily."* ]] && passes=$((passes+1)) \
  || { echo "FAIL tinystories text: $text"; failures=$((failures+1)); }

# statistics go to stderr, nothing else to stdout
err=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once" -n 5 2>&1 >/dev/null)
[[ "$err" =~ ^kiln:\ prompt\ tokens\ [0-9]+,\ generated\ tokens\ 5,\ time\ to\ first\ token\ [0-9.]+\ ms,\ [0-9.]+\ tokens/s$ ]] \
  && passes=$((passes+1)) || { echo "FAIL stats: $err"; failures=$((failures+1)); }

# sampling: same seed, same output; another seed, other output
a=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once" -n 40 --temperature 1 --top-p 0.95 --seed 11 2>/dev/null)
b=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once" -n 40 --temperature 1 --top-p 0.95 --seed 11 2>/dev/null)
c=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once" -n 40 --temperature 1 --top-p 0.95 --seed 12 2>/dev/null)
expect_same_output seed-repeat "$a" "$b"
[ "$a" != "$c" ] && passes=$((passes+1)) || { echo "FAIL: seeds 11 and 12 gave the same text"; failures=$((failures+1)); }
# a stop string ends the output before it
out=$("$KILN_BIN" run "$work/ts.engine" --prompt "" -n 120 --stop "Lily" 2>/dev/null)
expect_same stop-string "Once upon a time, there was a little girl named " "$out"

# bad requests
long=$(printf 'Zoo %.0s' $(seq 600))
expect_fail prompt-too-long "kiln: error: the prompt has" -- "$KILN_BIN" run "$work/s260.engine" --prompt "$long"
"$KILN_BIN" build "$KILN_SHARED/models/gpt2-tiny" -o "$work/notok.engine" || { echo "FAIL build gpt2"; exit 1; }
expect_fail no-tokenizer "$work/notok.engine: error: the engine holds no tokenizer; rebuild it with --tokenizer FILE, or give token ids" -- \
  "$KILN_BIN" run "$work/notok.engine" --prompt "hi"
expect_fail bad-temperature "kiln run: error: --temperature: 'hot' is not a number in [0, 100]" -- \
  "$KILN_BIN" run "$work/ts.engine" --prompt "hi" --temperature hot
printf 'not a tokenizer' > "$work/bad.tok"
expect_fail bad-tokenizer "$work/bad.tok: error:" -- \
  "$KILN_BIN" build "$s260/stories260K.bin" --tokenizer "$work/bad.tok" -o "$work/x.engine"
[ ! -e "$work/x.engine" ] && passes=$((passes+1)) || { echo "FAIL: output left behind"; failures=$((failures+1)); }

# the embedded default model: builds with no input, generates text
"$KILN_BIN" build --default -o "$work/default.engine" || { echo "FAIL default build"; failures=$((failures+1)); }
out=$("$KILN_BIN" run "$work/default.engine" --prompt "Once upon a time" -n 20 --temperature 0.8 --top-k 40 2>/dev/null)
[[ "$out" == "Once upon a time"* && ${#out} -gt 20 ]] && passes=$((passes+1)) || { echo "FAIL default run: $out"; failures=$((failures+1)); }
finish

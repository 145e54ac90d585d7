#!/usr/bin/env bash
# Deeply nested .kiln text (generated here): a clear error at the place, never bison's bare
# "memory exhausted" nor a crash; a long `else if` chain is no nesting at all and compiles.
# (The small cases, with their carets, are in tests/frontend/errors.test.)
. "$(dirname "$0")/lib.sh"
rep() { printf "%${2}s" "" | sed "s/ /$1/g"; } # rep TEXT N: TEXT N times (TEXT without spaces or '/')
head='model t;
param bos_token_id = 1;
param eos_token_id = 2;
param max_context = 8;'
forward='weight e[4, 4] = "e";
forward {
  x = embedding(e, tokens);
  output logits = matmul(x, e);
}'
# first_line NAME FILE WANT: kiln ir FILE fails, and its first line of stderr is WANT
first_line() {
  local err rc
  err=$("$KILN_BIN" ir "$2" 2>&1 >/dev/null); rc=$?
  expect_same "$1" "exit 1: $3" "exit $rc: $(head -1 <<<"$err")"
}
t="$work/t.kiln"

printf '%s\nparam a = %s1%s;\n' "$head" "$(rep '(' 10000)" "$(rep ')' 10000)" > "$t"
first_line "10000 parentheses" "$t" "$t:5:211: error: expression nested too deeply (more than 200 levels)"
expect_same "10000 parentheses: one message, its line and caret" 3 "$("$KILN_BIN" ir "$t" 2>&1 | wc -l)"

printf '%s\nparam a = %s1%s;\n' "$head" "$(rep 'f(' 10000)" "$(rep ')' 10000)" > "$t"
first_line "10000 nested calls" "$t" "$t:5:412: error: expression nested too deeply (more than 200 levels)"

printf '%s\nparam a = %s1;\n' "$head" "$(rep '-' 100000)" > "$t"
first_line "100000 minus signs" "$t" "$t:5:210: error: expression nested too deeply (more than 200 levels)"

printf '%s\nparam a = 1%s;\n' "$head" "$(rep '??1' 100000)" > "$t"
first_line "a ?? chain of 100000" "$t" "$t:5:609: error: expression nested too deeply (more than 200 levels)"

printf '%s\nparam a = %s1;\n' "$head" "$(rep 'true?1:' 100000)" > "$t"
first_line "a ?: chain of 100000" "$t" "$t:5:1408: error: expression nested too deeply (more than 200 levels)"

printf '%s\n%s\nforward {\n%s\n' "$head" 'weight e[4, 4] = "e";' "$(rep 'if_true{' 10000 | tr _ ' ')" > "$t"
first_line "10000 nested blocks" "$t" "$t:7:512: error: blocks nested too deeply (more than 64 levels)"
expect_same "10000 nested blocks: one message" 3 "$("$KILN_BIN" ir "$t" 2>&1 | wc -l)"

# an else-if chain of 20000 is flat: it compiles and takes its last branch
{ printf '%s\nparam n = 20000;\n%s\n' "$head" 'weight e[8, 8] = "e"; weight w[8, 8] = "w";'
  echo 'forward {'
  echo '  x = embed(e, tokens);'
  echo '  if n == 0 { y = x; }'
  for ((i = 1; i < 20000; i++)); do echo "  else if n == $i { y = x; }"; done
  echo '  else { y = linear(x, w); }'
  echo '  output logits = y;'
  echo '}'; } > "$t"
"$KILN_BIN" ir "$t" > "$work/chain.ir" 2>"$work/err" && passes=$((passes+1)) \
  || { echo "FAIL else-if chain: $(head -3 "$work/err")"; failures=$((failures+1)); }
grep -q matmul "$work/chain.ir" && passes=$((passes+1)) || { echo "FAIL else-if chain: no matmul"; failures=$((failures+1)); }
finish

#!/usr/bin/env bash
# Every numeric option of every command: integer options take integers only (no 1.5, 1e3, 0x10,
# ' 5', or a value out of range), with one message naming the option, the value and the range;
# number options keep theirs.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL: build"; exit 1; }
e="$work/ts.engine"
# int_opt CMD OPTION LO HI ARGS...: OPTION rejects a fraction, an exponent, hex, a space, and LO-1 / HI+1
int_opt() {
  local cmd="$1" opt="$2" lo="$3" hi="$4"; shift 4
  local v below above
  below=$(python3 -c "print($lo - 1)"); above=$(python3 -c "print($hi + 1)")
  for v in 1.5 1e3 0x10 " 5" "" abc "$below" "$above"; do
    expect_fail "$cmd $opt '$v'" "kiln $cmd: error: $opt: '$v' is not an integer from $lo to $hi" -- \
      "$KILN_BIN" "$cmd" "$@" "$opt" "$v"
  done
}
int_opt run -n 0 10000000 "$e" --ids 1
int_opt run --top-k 0 1000000000 "$e" --ids 1
int_opt run --seed 0 18446744073709551615 "$e" --ids 1
int_opt run --max-context 1 2147483647 "$e" --ids 1
int_opt run --kv-blocks 1 2147483647 "$e" --ids 1
int_opt build --max-tokens 1 16777216 "$ts" -o "$work/x.engine"
int_opt ir --max-tokens 1 16777216 "$ts"
int_opt verify --tokens 1 1048576 "$ts"
int_opt verify --steps 0 1048576 "$ts"
int_opt verify --seed 0 18446744073709551615 "$ts"
# the largest seed is taken as it is (a double would round it): same ids as itself, not as its neighbour
a=$("$KILN_BIN" run "$e" --ids 1 -n 8 --temperature 1 --seed 18446744073709551615 2>/dev/null)
b=$("$KILN_BIN" run "$e" --ids 1 -n 8 --temperature 1 --seed 18446744073709551614 2>/dev/null)
[ -n "$a" ] && [ "$a" != "$b" ] && passes=$((passes+1)) || { echo "FAIL: seeds 2^64-1 and 2^64-2 draw the same: '$a' '$b'"; failures=$((failures+1)); }
# integers in range still work, with a sign-less leading zero
expect_same "-n 03" 3 "$("$KILN_BIN" run "$e" --ids 1 -n 03 2>/dev/null | wc -w)"
# token ids are integers too: no spaces, signs or fractions
expect_fail ids-space "kiln run: error: --ids: bad token id at character 3 of '1, 2'" -- "$KILN_BIN" run "$e" --ids "1, 2"
expect_fail ids-plus "kiln run: error: --ids: bad token id at character 1 of '+1'" -- "$KILN_BIN" run "$e" --ids "+1"
expect_fail ids-fraction "kiln run: error: --ids: bad token id at character 3 of '1,2.5'" -- "$KILN_BIN" run "$e" --ids "1,2.5"
# number options: fractions are fine, words and ranges are not
expect_fail top-p "kiln run: error: --top-p: 'x' is not a number in [0, 1]" -- "$KILN_BIN" run "$e" --ids 1 --top-p x
expect_fail repetition "kiln run: error: --repetition-penalty: '0' is not a number in [0.01, 100]" -- \
  "$KILN_BIN" run "$e" --ids 1 --repetition-penalty 0
expect_fail tolerance "kiln verify: error: --tolerance: '-1' is not a number in [0, 1e+09]" -- \
  "$KILN_BIN" verify "$ts" --tolerance -1
[ ! -e "$work/x.engine" ] && passes=$((passes+1)) || { echo "FAIL: x.engine written"; failures=$((failures+1)); }
finish

#!/usr/bin/env bash
# The C API's example program (runtime/example/generate.c) generates what
# `kiln run` generates, and reports errors through the API.
. "$(dirname "$0")/lib.sh"
: "${KILN_GENERATE:?}"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL build"; exit 1; }
# both must succeed and print the story: two programs failing alike (both
# empty) is a failure, not a match
want=$("$KILN_BIN" run "$work/ts.engine" --prompt "Once upon a time" -n 40 2>/dev/null) \
  || { echo "FAIL kiln run: exit $?"; failures=$((failures+1)); }
got=$("$KILN_GENERATE" "$work/ts.engine" "Once upon a time" 40) \
  || { echo "FAIL example: exit $?"; failures=$((failures+1)); }
[[ "$want" == "Once upon a time"?* ]] && passes=$((passes+1)) \
  || { echo "FAIL kiln run printed no story: '$want'"; failures=$((failures+1)); }
expect_same example-text "$want" "$got"
expect_fail example-bad-engine "$work/none.engine: error: cannot open: No such file or directory" -- \
  "$KILN_GENERATE" "$work/none.engine" "hi"
finish

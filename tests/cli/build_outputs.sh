#!/usr/bin/env bash
# Builds are reproducible, and `kiln run` writes the logits it promises.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/a.engine" && "$KILN_BIN" build "$ts" -o "$work/b.engine" \
  || { echo "FAIL build"; exit 1; }
cmp -s "$work/a.engine" "$work/b.engine" && passes=$((passes+1)) || { echo "FAIL: builds differ"; failures=$((failures+1)); }
out=$("$KILN_BIN" run "$work/a.engine" --ids 1,415,2 -n 5 --logits-out "$work/l.f32") || { echo "FAIL run"; failures=$((failures+1)); }
size=$(stat -c %s "$work/l.f32")
expect_same logits-size $((3 * 2048 * 4)) "$size"
[[ "$out" =~ ^[0-9]+(\ [0-9]+){4}$ ]] && passes=$((passes+1)) || { echo "FAIL ids output: '$out'"; failures=$((failures+1)); }
finish

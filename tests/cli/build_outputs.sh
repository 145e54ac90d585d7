#!/usr/bin/env bash
# Builds are reproducible, and `kiln run` writes the logits it promises.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/a.engine" 2>"$work/a.err" && "$KILN_BIN" build "$ts" -o "$work/b.engine" 2>/dev/null \
  || { echo "FAIL build"; exit 1; }
# one line on stderr says what was written (the time varies); no progress when stderr is no terminal
expect_same "build's stderr" "kiln: wrote $work/a.engine (3.6 MiB, cpu, f32, 2 layers) in T s" \
  "$(sed -E 's/ in [0-9]+\.[0-9]{2} s$/ in T s/' "$work/a.err")"
"$KILN_BIN" build "$ts" --dtype bf16 --passes none -o "$work/bf16.engine" 2>"$work/bf16.err"
expect_same "bf16 build's stderr" "kiln: wrote $work/bf16.engine (1.8 MiB, cpu, bf16, 2 layers) in T s" \
  "$(sed -E 's/ in [0-9]+\.[0-9]{2} s$/ in T s/' "$work/bf16.err")"
"$KILN_BIN" build --default -o "$work/default.engine" 2>"$work/default.err"
[[ "$(cat "$work/default.err")" =~ ^kiln:\ wrote\ $work/default.engine\ \([0-9.]+\ [KM]iB,\ cpu,\ f32,\ [0-9]+\ layers\)\ in\ [0-9.]+\ s$ ]] \
  && passes=$((passes+1)) || { echo "FAIL default build's stderr: $(cat "$work/default.err")"; failures=$((failures+1)); }
# on a terminal (script(1) gives one): any progress line is erased before the last line
if command -v script >/dev/null; then
  script -qec "'$KILN_BIN' build '$ts' -o '$work/tty.engine'" /dev/null > "$work/tty.out" 2>&1
  last=$(tr -d '\r' < "$work/tty.out" | sed 's/.*\x1b\[K//' | tail -1 | sed -E 's/ in [0-9]+\.[0-9]{2} s$/ in T s/')
  expect_same "build's last line on a terminal" "kiln: wrote $work/tty.engine (3.6 MiB, cpu, f32, 2 layers) in T s" "$last"
else
  echo "note: no script(1): the terminal check is skipped"
fi
# a failed build prints its error, not the line
"$KILN_BIN" build "$ts" --dtype f64 -o "$work/c.engine" 2>"$work/c.err"
expect_same "failed build's stderr" "kiln: error: --dtype f64: unknown weight dtype (known: f32, bf16, f16)" "$(cat "$work/c.err")"
cmp -s "$work/a.engine" "$work/b.engine" && passes=$((passes+1)) || { echo "FAIL: builds differ"; failures=$((failures+1)); }
out=$("$KILN_BIN" run "$work/a.engine" --ids 1,415,2 -n 5 --logits-out "$work/l.f32") || { echo "FAIL run"; failures=$((failures+1)); }
size=$(stat -c %s "$work/l.f32")
expect_same logits-size $((3 * 2048 * 4)) "$size"
[[ "$out" =~ ^[0-9]+(\ [0-9]+){4}$ ]] && passes=$((passes+1)) || { echo "FAIL ids output: '$out'"; failures=$((failures+1)); }
finish

#!/usr/bin/env bash
# A wrong, truncated or damaged engine file is rejected before anything runs.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/good.engine" || { echo "FAIL: build"; exit 1; }
size=$(stat -c %s "$work/good.engine")

expect_fail missing "$work/none.engine: error: cannot open: No such file or directory" -- \
  "$KILN_BIN" run "$work/none.engine" --ids 1
printf 'hello, not an engine at all; long enough to have a header......' > "$work/text.engine"
expect_fail magic "$work/text.engine: error: not a kiln engine file (bad magic)" -- \
  "$KILN_BIN" run "$work/text.engine" --ids 1
: > "$work/empty.engine"
expect_fail empty "$work/empty.engine: error: not a kiln engine file (bad magic)" -- \
  "$KILN_BIN" inspect "$work/empty.engine"
head -c $((size / 2)) "$work/good.engine" > "$work/trunc.engine"
expect_fail truncated "$work/trunc.engine: error: truncated or damaged: header says $size bytes, file has $((size / 2))" -- \
  "$KILN_BIN" run "$work/trunc.engine" --ids 1
cp "$work/good.engine" "$work/flip.engine"
printf '\x55' | dd of="$work/flip.engine" bs=1 seek=$((size - 1000)) conv=notrunc 2>/dev/null
expect_fail checksum "$work/flip.engine: error: damaged: checksum mismatch" -- \
  "$KILN_BIN" run "$work/flip.engine" --ids 1
cp "$work/good.engine" "$work/version.engine"
printf '\x63' | dd of="$work/version.engine" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_fail version "$work/version.engine: error: engine format version 99, this kiln reads version 2; rebuild the engine" -- \
  "$KILN_BIN" inspect "$work/version.engine"
cp "$work/good.engine" "$work/v1.engine"
printf '\x01' | dd of="$work/v1.engine" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_fail format-1 "$work/v1.engine: error: built by an older kiln (format 1); rebuild it" -- \
  "$KILN_BIN" inspect "$work/v1.engine"
# the header is checksummed too: a section count of 4 instead of 5 (a flipped bit) is damage, not a
# smaller engine (tests/engine/test_engine_file.c flips every header byte)
cp "$work/good.engine" "$work/count.engine"
printf '\x04' | dd of="$work/count.engine" bs=1 seek=12 conv=notrunc 2>/dev/null
expect_fail section-count "$work/count.engine: error: damaged: checksum mismatch" -- \
  "$KILN_BIN" inspect "$work/count.engine"
cp "$work/good.engine" "$work/pad.engine"
printf '\x01' | dd of="$work/pad.engine" bs=1 seek=40 conv=notrunc 2>/dev/null
expect_fail header-padding "$work/pad.engine: error: damaged: checksum mismatch" -- \
  "$KILN_BIN" inspect "$work/pad.engine"
# inspect says verified of what it checked: every byte, and the memory plan
"$KILN_BIN" inspect "$work/good.engine" > "$work/inspect.txt" || { echo "FAIL inspect"; failures=$((failures+1)); }
grep -q "^format:      kiln engine version 2, $size bytes, checksum [0-9a-f]* (verified over every byte)$" "$work/inspect.txt" &&
  passes=$((passes+1)) || { echo "FAIL inspect text"; failures=$((failures+1)); }
grep -q "^memory plan: arena [0-9]* bytes for steps of up to 512 tokens (verified: every value inside it, no two live values in the same bytes)$" \
  "$work/inspect.txt" && passes=$((passes+1)) || { echo "FAIL inspect plan"; failures=$((failures+1)); }
"$KILN_BIN" build "$ts" --passes none -o "$work/unplanned.engine" &&
  "$KILN_BIN" inspect "$work/unplanned.engine" | grep -q "^memory plan: none (each value gets its own place)$" &&
  passes=$((passes+1)) || { echo "FAIL inspect without a plan"; failures=$((failures+1)); }
finish

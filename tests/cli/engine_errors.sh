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
expect_fail version "$work/version.engine: error: engine format version 99, this kiln reads version 1; rebuild the engine" -- \
  "$KILN_BIN" inspect "$work/version.engine"
"$KILN_BIN" inspect "$work/good.engine" > "$work/inspect.txt" || { echo "FAIL inspect"; failures=$((failures+1)); }
grep -q "checksum [0-9a-f]* (verified)" "$work/inspect.txt" && passes=$((passes+1)) || { echo "FAIL inspect text"; failures=$((failures+1)); }
finish

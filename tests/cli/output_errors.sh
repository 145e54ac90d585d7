#!/usr/bin/env bash
# Outputs that cannot be written say why, with the errno of the write, flush, fsync or close that
# failed (a full disk is "No space left on device", not "I/O error"), exit non-zero and leave no
# temp file. The full disk is a private /dev/full node in the test's folder (as root only) and a
# file size limit (ulimit -f with SIGXFSZ ignored: writes fail with EFBIG).
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL: build"; exit 1; }
ok() { passes=$((passes+1)); }
bad() { echo "FAIL $*"; failures=$((failures+1)); }
no_temp() { ls -a "$work" | grep -q '\.tmp\.' && bad "$1: temp files left: $(ls -a "$work" | grep '\.tmp\.')" || ok; }

if [ "$(id -u)" = 0 ] && mknod "$work/full" c 1 7 2>/dev/null; then
  full="$work/full"
  expect_fail logits-full "$full: error: cannot write: No space left on device" -- \
    "$KILN_BIN" run "$work/ts.engine" --ids 1,415,2 -n 1 --logits-out "$full"
  expect_fail engine-full "$full: error: cannot write: No space left on device" -- \
    "$KILN_BIN" build "$ts" -o "$full"
  expect_fail ir-full "$full: error: cannot write: No space left on device" -- "$KILN_BIN" ir "$ts" -o "$full"
  [ -c "$full" ] && [ "$(stat -c %t,%T "$full")" = "1,7" ] && ok || bad "the full device node was replaced"
  no_temp "full device"
else
  echo "note: not root (or mknod is not allowed): the /dev/full checks are skipped"
fi

# a regular file over the size limit: EFBIG from the temp file's writes; the old file stays whole
echo old > "$work/big.engine"
expect_fail engine-too-large "$work/big.engine: error: cannot write: File too large" -- \
  bash -c 'trap "" XFSZ; ulimit -f 64; exec "$@"' - "$KILN_BIN" build "$ts" -o "$work/big.engine"
expect_same "old file kept" old "$(cat "$work/big.engine")"
expect_fail logits-too-large "$work/big.f32: error: cannot write: File too large" -- \
  bash -c 'trap "" XFSZ; ulimit -f 8; exec "$@"' - "$KILN_BIN" run "$work/ts.engine" --ids "$(seq -s, 1 10)" -n 1 \
  --logits-out "$work/big.f32"
[ ! -e "$work/big.f32" ] && ok || bad "a failed --logits-out left $work/big.f32"
no_temp "size limit"
finish

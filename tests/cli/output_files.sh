#!/usr/bin/env bash
# Output files (kiln build -o, kiln ir -o, kiln run --logits-out, --dump-dir) that are not plain
# files: a symlink keeps pointing where it did and its target gets the bytes; a FIFO and a device
# are written through, never replaced by a regular file. The devices are private nodes in the
# test's folder (never the machine's /dev/null), made only when running as root.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL: build"; exit 1; }
"$KILN_BIN" run "$work/ts.engine" --ids 1,415,2 -n 1 --logits-out "$work/ts.f32" >/dev/null 2>&1 \
  || { echo "FAIL: run"; exit 1; }
"$KILN_BIN" ir "$ts" -o "$work/ts.ir" || { echo "FAIL: ir"; exit 1; }
T() { timeout 120 "$@"; } # a FIFO nobody opens would block for ever: fail instead

ok() { passes=$((passes+1)); }
bad() { echo "FAIL $*"; failures=$((failures+1)); }
# same_file NAME WANT GOT: byte for byte
same_file() { cmp -s "$2" "$3" && ok || bad "$1: $3 differs from $2"; }
# still_link NAME LINK TARGET: LINK is still a symlink to TARGET
still_link() { [ -L "$2" ] && [ "$(readlink "$2")" = "$3" ] && ok || bad "$1: $2 is no longer a link to $3"; }

# ---- symlinks: to a regular file (relative and absolute), and a dangling one -----------------
cd "$work" || exit 1
for out in engine ir f32; do
  echo old > "real.$out"
  ln -s "real.$out" "link.$out"
  ln -s "$work/real-abs.$out" "abs.$out"; echo old > "real-abs.$out"
  ln -s "nothing-yet.$out" "dangling.$out"
done
mkdir sub && ln -s ../real2.engine sub/up.engine && echo old > real2.engine
for l in link abs dangling; do
  T "$KILN_BIN" build "$ts" -o "$l.engine" || bad "build -o $l.engine"
  T "$KILN_BIN" ir "$ts" -o "$l.ir" || bad "ir -o $l.ir"
  T "$KILN_BIN" run ts.engine --ids 1,415,2 -n 1 --logits-out "$l.f32" >/dev/null 2>&1 || bad "run --logits-out $l.f32"
done
T "$KILN_BIN" build "$ts" -o sub/up.engine || bad "build -o sub/up.engine"
for out in engine ir f32; do
  want="ts.$out"
  still_link "link.$out" "link.$out" "real.$out"; same_file "link.$out" "$want" "real.$out"
  still_link "abs.$out" "abs.$out" "$work/real-abs.$out"; same_file "abs.$out" "$want" "real-abs.$out"
  still_link "dangling.$out" "dangling.$out" "nothing-yet.$out"; same_file "dangling.$out" "$want" "nothing-yet.$out"
done
still_link "sub/up.engine" sub/up.engine ../real2.engine; same_file "sub/up.engine" ts.engine real2.engine
# --dump-dir: a dump whose name is a link
mkdir dumps && ln -s ../kept.ir dumps/00-compiled.ir
T "$KILN_BIN" build "$ts" -o dumped.engine --dump-ir-after all --dump-dir dumps || bad "build --dump-dir"
still_link "dump link" dumps/00-compiled.ir ../kept.ir
[ -s kept.ir ] && [ "$(head -c 6 kept.ir)" = "$(head -c 6 ts.ir)" ] && ok || bad "dump link: kept.ir holds no IR"

# ---- a FIFO, with a reader on the other end ---------------------------------------------------
mkfifo fifo
# through_fifo NAME WANT CMD...: CMD writes into ./fifo while cat reads it
through_fifo() {
  local name="$1" want="$2"; shift 2
  T cat fifo > fifo.out & local reader=$!
  T "$@" >/dev/null 2>&1 || bad "$name: exit $?"
  wait $reader
  [ -p fifo ] && ok || bad "$name: fifo is no longer a FIFO"
  same_file "$name" "$want" fifo.out
  [ -p fifo ] || { rm -f fifo; mkfifo fifo; }
}
through_fifo "logits into a FIFO" ts.f32 "$KILN_BIN" run ts.engine --ids 1,415,2 -n 1 --logits-out fifo
through_fifo "IR into a FIFO" ts.ir "$KILN_BIN" ir "$ts" -o fifo
through_fifo "engine into a FIFO" ts.engine "$KILN_BIN" build "$ts" -o fifo

# ---- devices: private nodes, as root only -------------------------------------------------------
if [ "$(id -u)" = 0 ] && mknod "$work/null" c 1 3 2>/dev/null; then
  T "$KILN_BIN" run ts.engine --ids 1,415,2 -n 1 --logits-out null >/dev/null 2>&1 || bad "run --logits-out null"
  T "$KILN_BIN" build "$ts" -o null || bad "build -o null"
  T "$KILN_BIN" ir "$ts" -o null || bad "ir -o null"
  [ -c null ] && [ "$(stat -c %t,%T null)" = "1,3" ] && ok || bad "the null device node was replaced: $(ls -l null)"
else
  echo "note: not root (or mknod is not allowed): the device-node checks are skipped"
fi
ls -a "$work" "$work/dumps" "$work/sub" | grep -q '\.tmp\.' && bad "temp files left: $(ls -a "$work" | grep '\.tmp\.')" || ok
cd / || exit 1
finish

#!/usr/bin/env bash
# A memory plan edited into an IR dump is checked when kiln builds from it
# (--from-ir): a value past the arena, or two values live at once in the same
# bytes, is refused with a message that names the value and its place, and no
# engine is written. The dump as written builds.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/good.engine" --dump-ir-after all --dump-dir "$work/dumps" ||
  { echo "FAIL: build"; exit 1; }
last=$(ls "$work/dumps"/*.ir | tail -1)
expect_same "the last dump holds the plan" "13-plan_memory.ir" "$(basename "$last")"

# field N KEY: the int attribute KEY of node %N in the dump; loc N: its source place
field() { sed -n "s/^%$1 .*[{ ]$2=\([0-9]*\).*/\1/p" "$last"; }
loc() { sed -n "s/^%$1 .*@\"\([^\"]*\)\":\([0-9]*\):\([0-9]*\)\$/\1:\2:\3/p" "$last"; }
arena=$(sed -n 's/^param mem.arena_bytes = //p' "$last")
tokens=$(sed -n 's/^param mem.max_tokens = //p' "$last")

# the dump as written builds, and gives the engine built without it
"$KILN_BIN" build "$ts" --from-ir "$last" -o "$work/same.engine" && passes=$((passes+1)) ||
  { echo "FAIL: the unedited dump does not build"; failures=$((failures+1)); }
expect_same_output "the unedited dump's logits" "$("$KILN_BIN" run "$work/good.engine" --ids 1,2,3 -n 4 2>/dev/null)" \
  "$("$KILN_BIN" run "$work/same.engine" --ids 1,2,3 -n 4 2>/dev/null)"

# past the arena: the logits matmul %65 and its view, the output %66, moved to the arena's end
sed -E "/^%(65|66) /s/mem.offset=[0-9]+/mem.offset=$arena/" "$last" > "$work/past.ir"
expect_fail past-arena "$(loc 65): error: node %65 (matmul): mem.offset $arena + $(field 65 mem.bytes) bytes at $tokens tokens is past mem.arena_bytes $arena" -- \
  "$KILN_BIN" build "$ts" --from-ir "$work/past.ir" -o "$work/past.engine"

# overlap: layer 1's output projection %49 moved onto the bytes of the attention %46 it reads (through a view)
at=$(field 46 mem.offset)
end=$((at + $(field 49 mem.bytes)))
[ "$end" -le $((at + $(field 46 mem.bytes))) ] || end=$((at + $(field 46 mem.bytes)))
sed -E "/^%49 /s/mem.offset=[0-9]+/mem.offset=$at/" "$last" > "$work/overlap.ir"
expect_fail overlap "$(loc 49): error: node %49 (matmul): shares bytes [$at,$end) with node %46 (attention), and both are live at node %49" -- \
  "$KILN_BIN" build "$ts" --from-ir "$work/overlap.ir" -o "$work/overlap.engine"

# nothing written for the refused plans, not even a temporary file
expect_same "files written" "$(printf 'dumps\ngood.engine\noverlap.ir\npast.ir\nsame.engine')" "$(ls "$work")"
finish

#!/usr/bin/env bash
# IR round trip for every shipped model: print -> parse -> print is
# byte-identical (kiln ir's output fed back through --from-ir would do the
# same; here the ir_roundtrip tool parses and prints).
. "$(dirname "$0")/lib.sh"
require_models
for dir in $(shared_models); do
  name=$(basename "$dir")
  if ! "$KILN_BIN" ir "$dir" -o "$work/$name.ir"; then echo "FAIL $name: kiln ir"; failures=$((failures+1)); continue; fi
  if ! "$KILN_BIN" ir "$work/$name.ir" -o "$work/$name.2.ir"; then echo "FAIL $name: reparse"; failures=$((failures+1)); continue; fi
  if cmp -s "$work/$name.ir" "$work/$name.2.ir"; then passes=$((passes+1)); else
    echo "FAIL $name: round trip differs"; diff "$work/$name.ir" "$work/$name.2.ir" | head; failures=$((failures+1)); fi
done
# llama2.c checkpoints carry their configuration in the .bin header
s260="$KILN_SHARED/models/stories260k/stories260K.bin"
if "$KILN_BIN" ir "$s260" -o "$work/s260.ir" && "$KILN_BIN" ir "$work/s260.ir" -o "$work/s260.2.ir" \
   && cmp -s "$work/s260.ir" "$work/s260.2.ir"; then passes=$((passes+1)); else echo "FAIL stories260k round trip"; failures=$((failures+1)); fi
finish

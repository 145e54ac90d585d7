#!/usr/bin/env bash
# The shared quantized checkpoints (AWQ, GPTQ, compressed-tensors FP8), which
# kiln does not read yet: a clear error naming config.json and the method,
# no engine written.
. "$(dirname "$0")/lib.sh"
for dir in $(tr ':' '\n' <<<"${KILN_QUANTIZED:-}"); do
  name=$(basename "$dir")
  method=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['quantization_config']['quant_method'])" "$dir/config.json")
  expect_fail "$name" "$dir/config.json: error: quantization_config (quant_method \"$method\"): kiln does not read quantized checkpoints yet" -- \
    "$KILN_BIN" build "$dir" -o "$work/$name.engine"
  [ ! -e "$work/$name.engine" ] && passes=$((passes+1)) || { echo "FAIL $name: engine written"; failures=$((failures+1)); }
done
finish

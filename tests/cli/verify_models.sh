#!/usr/bin/env bash
# kiln verify passes for every shared model (all passes against none), and
# names the verdict.
. "$(dirname "$0")/lib.sh"
require_models
for input in $(shared_models) "$KILN_SHARED/models/stories260k/stories260K.bin"; do
  name=$(basename "$(dirname "$input")"); [ -d "$input" ] && name=$(basename "$input")
  if out=$("$KILN_BIN" verify "$input" 2>&1) && [[ "$out" == *"OK: within tolerance"* ]]; then
    passes=$((passes+1))
  else
    echo "FAIL verify $name"; echo "$out" | sed 's/^/    /'; failures=$((failures+1))
  fi
done
# a subset of passes works too
out=$("$KILN_BIN" verify "$KILN_SHARED/models/qwen2-tiny" --passes fuse_sibling_matmuls,eliminate_dead_nodes 2>&1) \
  && passes=$((passes+1)) || { echo "FAIL subset: $out"; failures=$((failures+1)); }
expect_fail unknown-pass "kiln: error: unknown pass 'fuse_everything'" -- \
  "$KILN_BIN" verify "$KILN_SHARED/models/qwen2-tiny" --passes fuse_everything
finish

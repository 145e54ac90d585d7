#!/usr/bin/env bash
# kiln verify passes for every shared model (all passes against none), and
# names the verdict.
. "$(dirname "$0")/lib.sh"
for dir in "$KILN_SHARED"/models/*/; do
  name=$(basename "$dir")
  input="$dir"
  [ -f "$dir/config.json" ] || input=$(ls "$dir"/*.bin 2>/dev/null | head -1)
  [ -n "$input" ] || continue
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

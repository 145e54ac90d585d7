#!/usr/bin/env bash
# The pass pipeline's promises, through the CLI:
#  - every dump (after every pass) parses back to the same text;
#  - planned peak <= 1.05 x the lower bound for every shipped model and the
#    Llama-3-8B configuration, whose decode step takes at most 6 kernels per layer;
#  - a dumped IR with its fusions undone by hand builds (--from-ir) and still
#    matches the golden logits.
. "$(dirname "$0")/lib.sh"
src="${KILN_SOURCE:-$(dirname "$0")/../..}"

ratio_ok() { # STATS_TEXT -> checks peak/bound
  local r
  r=$(sed -n 's/.*peak\/bound \([0-9.]*\).*/\1/p' <<<"$1")
  [ -n "$r" ] && python3 -c "import sys; sys.exit(0 if float('$r') <= 1.05 else 1)"
}

require_models
for input in $(shared_models) "$KILN_SHARED/models/stories260k/stories260K.bin"; do
  name=$(basename "$(dirname "$input")"); [ -d "$input" ] && name=$(basename "$input")
  stats=$("$KILN_BIN" build "$input" -o "$work/$name.engine" --stats --dump-ir-after all --dump-dir "$work/$name.dump") \
    || { echo "FAIL build $name"; failures=$((failures+1)); continue; }
  ratio_ok "$stats" && passes=$((passes+1)) || { echo "FAIL $name plan: $stats"; failures=$((failures+1)); }
  for f in "$work/$name.dump"/*.ir; do
    "$KILN_BIN" ir "$f" -o "$work/again.ir" && cmp -s "$f" "$work/again.ir" && passes=$((passes+1)) \
      || { echo "FAIL round trip $f"; failures=$((failures+1)); }
  done
done

stats=$("$KILN_BIN" ir "$src/models/llama.kiln" --config "$src/tests/data/llama3-8b-config.json" --passes all --stats \
        -o "$work/l3.ir" 2>&1) || { echo "FAIL llama3-8b: $stats"; failures=$((failures+1)); }
echo "$stats" | tail -2
ratio_ok "$stats" && passes=$((passes+1)) || { echo "FAIL llama3-8b plan"; failures=$((failures+1)); }
per_layer=$(sed -n 's/.*: \([0-9.]*\) per layer.*/\1/p' <<<"$stats")
python3 -c "import sys; sys.exit(0 if float('$per_layer') <= 6 else 1)" && passes=$((passes+1)) \
  || { echo "FAIL llama3-8b kernels per layer: $per_layer"; failures=$((failures+1)); }

# undo every fusion group by hand in the final dump, build from it, compare with the golden
m="$KILN_SHARED/models/llama-gqa-tiny"
last=$(ls "$work/llama-gqa-tiny.dump"/*.ir | tail -1)
sed -E 's/fuse=[0-9]+, //; s/, fuse=[0-9]+//; s/ \{fuse=[0-9]+\}//' "$last" > "$work/edited.ir"
grep -q 'fuse=' "$work/edited.ir" && { echo "FAIL: edit left fusions"; failures=$((failures+1)); }
"$KILN_BIN" build "$m" --from-ir "$work/edited.ir" -o "$work/edited.engine" --stats > "$work/edited.stats" \
  || { echo "FAIL build --from-ir"; failures=$((failures+1)); }
grep -q "kernels: " "$work/edited.stats" && passes=$((passes+1)) || { echo "FAIL: no kernel count in --stats"; failures=$((failures+1)); }
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['cases'][2]['input_ids'])))" "$m/golden.json")
"$KILN_BIN" run "$work/edited.engine" --ids "$ids" --logits-out "$work/edited.f32" > /dev/null \
  || { echo "FAIL run edited"; failures=$((failures+1)); }
python3 - "$m" "$work/edited.f32" <<'PY' && passes=$((passes+1)) || failures=$((failures+1))
import json, struct, sys
m, got = sys.argv[1], sys.argv[2]
g = json.load(open(m + "/golden.json"))["cases"][2]
want = open(m + "/" + g["logits"], "rb").read()
have = open(got, "rb").read()
if len(want) != len(have):
    print("FAIL edited: sizes differ", len(want), len(have)); sys.exit(1)
n = len(want) // 4
w = struct.unpack(f"<{n}f", want); h = struct.unpack(f"<{n}f", have)
rows = len(g["input_ids"]); vocab = n // rows
worst = max(max(abs(a - b) for a, b in zip(w[r*vocab:(r+1)*vocab], h[r*vocab:(r+1)*vocab])) /
            max(abs(a) for a in w[r*vocab:(r+1)*vocab]) for r in range(rows))
print(f"edited IR against the golden: worst row max|d|/max|golden| = {worst:.3g}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
# an edit that breaks the graph is reported at its place
sed -E '0,/= matmul\(%([0-9]+), %([0-9]+)\)/s//= matmul(%\2, %\1)/' "$last" > "$work/broken.ir"
expect_fail broken-edit "error: node %7 (matmul): input must be a float tensor with T as its first dim, got f32[384,256]" -- "$KILN_BIN" build "$m" --from-ir "$work/broken.ir" -o "$work/broken.engine"
[ ! -e "$work/broken.engine" ] && passes=$((passes+1)) || { echo "FAIL: broken build left a file"; failures=$((failures+1)); }
finish

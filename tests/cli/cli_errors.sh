#!/usr/bin/env bash
# Command-line misuse and bad requests: clear messages, non-zero exits.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL: build"; exit 1; }
for cmd in build ir inspect run verify tokenize version; do
  out=$("$KILN_BIN" $cmd --help) && [[ "$out" == "usage: kiln $cmd"* ]] && passes=$((passes+1)) \
    || { echo "FAIL $cmd --help"; failures=$((failures+1)); }
done
expect_fail unknown-command "kiln: error: unknown command 'frobnicate'" -- "$KILN_BIN" frobnicate
expect_fail unknown-option "kiln run: error: unknown option '--idz'" -- "$KILN_BIN" run "$work/ts.engine" --idz 1
expect_fail bad-ids "kiln run: error: --ids: bad token id at character 3 of '1,x,3'" -- \
  "$KILN_BIN" run "$work/ts.engine" --ids 1,x,3
expect_fail id-range "kiln: error: token id 5000 is out of range (the vocabulary has 2048 ids)" -- \
  "$KILN_BIN" run "$work/ts.engine" --ids 1,5000
expect_fail context "kiln: error: the prompt has 513 tokens, more than the 512 the context has left" -- \
  "$KILN_BIN" run "$work/ts.engine" --ids "$(seq -s, 1 513)"
expect_fail no-output "kiln build: error: needs a model (or --default) and -o ENGINE" -- "$KILN_BIN" build "$ts"
expect_fail not-model "$work/ts.engine: error: not a .kiln file or a checkpoint folder" -- \
  "$KILN_BIN" build "$work/ts.engine" -o "$work/x.engine"
mkdir -p "$work/noconfig"
expect_fail no-config "$work/noconfig: error: no config.json in the checkpoint folder" -- \
  "$KILN_BIN" build "$work/noconfig" -o "$work/x.engine"
mkdir -p "$work/badjson"; printf '{\n  "model_type": "llama",\n  oops\n}\n' > "$work/badjson/config.json"
expect_fail bad-json "$work/badjson/config.json:3:4: error: invalid JSON" -- \
  "$KILN_BIN" build "$work/badjson" -o "$work/x.engine"
mkdir -p "$work/unknown"; printf '{"model_type": "mamba"}\n' > "$work/unknown/config.json"
expect_fail unknown-arch "$work/unknown/config.json: error: model_type 'mamba' matches no shipped model description" -- \
  "$KILN_BIN" build "$work/unknown" -o "$work/x.engine"
# a description without a config: one error with the way to give one, not one per key
out=$("$KILN_BIN" ir "$KILN_SOURCE/models/llama.kiln" 2>&1); rc=$?
expect_same "kiln ir without a config" "exit 1: $KILN_SOURCE/models/llama.kiln: error: the description reads config.json keys (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, and 5 more) but no config was given; pass --config FILE or --weights CHECKPOINT_DIR" "exit $rc: $out"
mkdir -p "$work/weights-only" && cp "$ts/model.safetensors" "$work/weights-only/"
out=$("$KILN_BIN" ir "$KILN_SOURCE/models/llama.kiln" --weights "$work/weights-only" 2>&1); rc=$?
expect_same "kiln ir with weights but no config" "exit 1: $KILN_SOURCE/models/llama.kiln: error: the description reads config.json keys (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, and 5 more) but no config was given; $work/weights-only has no config.json: pass --config FILE" "exit $rc: $out"
# a config that is given but lacks keys: one message per key, at its place
echo '{"hidden_size": 64}' > "$work/partial.json"
out=$("$KILN_BIN" ir "$KILN_SOURCE/models/llama.kiln" --config "$work/partial.json" 2>&1 | head -2)
expect_same "config given, keys missing" "$KILN_SOURCE/models/llama.kiln:8:18: error: missing key 'num_hidden_layers' in $work/partial.json
  param layers   = config.num_hidden_layers;" "$out"
# an output option naming a folder says so, before any work
mkdir -p "$work/out"
expect_fail output-dir "$work/out/: error: is a directory; -o names the engine file to write" -- \
  "$KILN_BIN" build "$ts" -o "$work/out/"
expect_fail output-dir-no-slash "$work/out: error: is a directory; -o names the engine file to write" -- \
  "$KILN_BIN" build "$ts" -o "$work/out"
expect_fail output-missing-dir "$work/new/: error: names a directory (it ends with '/'); -o names the engine file to write" -- \
  "$KILN_BIN" build "$ts" -o "$work/new/"
expect_fail ir-output-dir "$work/out: error: is a directory; -o names the file the IR is written to" -- \
  "$KILN_BIN" ir "$ts" -o "$work/out"
expect_fail logits-dir "$work/out: error: is a directory; --logits-out names the file the logits are written to" -- \
  "$KILN_BIN" run "$work/ts.engine" --ids 1 --logits-out "$work/out"
echo > "$work/file"
expect_fail dump-dir-file "$work/file: error: not a directory; --dump-dir names the folder the IR dumps go to" -- \
  "$KILN_BIN" build "$ts" -o "$work/x.engine" --dump-ir-after all --dump-dir "$work/file"
expect_fail dump-unknown-pass "kiln: error: --dump-ir-after: unknown pass 'nosuch' (known: compiled, from-ir, fuse_sibling_matmuls, quantize, share_kv, split_kv_write, fuse_epilogues, fuse_norm_prologue, fuse_add_norm, eliminate_dead_nodes, lower_precision, quantize_kv, fuse_rows, fuse_norm_rope, plan_memory, all)" -- \
  "$KILN_BIN" build "$ts" -o "$work/x.engine" --dump-ir-after fuse_epilogues,nosuch --dump-dir "$work/out"
expect_fail precision-unknown "kiln: error: --precision quick: unknown precision (known: exact, fast)" -- \
  "$KILN_BIN" build "$ts" -o "$work/x.engine" --precision quick
expect_fail precision-fast-f32 "kiln: error: --precision fast computes in the weights' half dtype, and these are f32: build with --dtype bf16 or f16, or --precision exact" -- \
  "$KILN_BIN" build "$ts" -o "$work/x.engine" --precision fast
"$KILN_BIN" build "$ts" -o "$work/dumped.engine" --dump-ir-after compiled,fuse_epilogues,plan_memory --dump-dir "$work/dumps" \
  && expect_same "dumps of known passes" "00-compiled.ir 05-fuse_epilogues.ir 13-plan_memory.ir" "$(ls "$work/dumps" | tr '\n' ' ' | sed 's/ $//')" \
  || { echo "FAIL: --dump-ir-after with known passes"; failures=$((failures+1)); }
rm -rf "$work/dumps" "$work/dumped.engine"
[ -z "$(ls -A "$work/out")" ] && passes=$((passes+1)) || { echo "FAIL: files in $work/out"; failures=$((failures+1)); }
[ ! -e "$work/x.engine" ] && passes=$((passes+1)) || { echo "FAIL: a failed build left an output file"; failures=$((failures+1)); }
ls "$work" | grep -q '\.tmp\.' && { echo "FAIL: temp files left"; failures=$((failures+1)); } || passes=$((passes+1))
finish

#!/usr/bin/env bash
# Bad configs and checkpoints that `kiln build` must refuse (or warn about)
# before anything runs: each case is a shared model folder copied into the
# temp dir (its files linked, config.json edited with sed), built, and the
# whole message pinned.
. "$(dirname "$0")/lib.sh"
require_models
models="$KILN_SHARED/models"
ts="$models/tinystories-656k"

# variant NAME SRC SED_ARGS...: $work/NAME holds SRC's files, linked, with
# config.json edited by sed
variant() {
  local dir="$work/$1" src="$2"; shift 2
  rm -rf "$dir"; mkdir -p "$dir"
  for f in "$src"/*; do ln -s "$f" "$dir/"; done
  rm "$dir/config.json"
  sed "$@" "$src/config.json" > "$dir/config.json"
}

# expect_build_fails NAME DIR WANT: kiln build DIR exits 1 with exactly WANT
# on stderr and writes no engine
expect_build_fails() {
  local name="$1" dir="$2" want="$3" got rc
  got=$("$KILN_BIN" build "$dir" -o "$work/$name.engine" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 1 ]; then
    echo "FAIL $name: exit $rc"; echo "$got" | sed 's/^/    /'; failures=$((failures+1)); return
  fi
  [ -e "$work/$name.engine" ] && { echo "FAIL $name: a failed build wrote an engine"; failures=$((failures+1)); }
  expect_same "$name" "$want" "$got"
}

# 1. The context the runtime reads: positive, and within 32 bits (1e12 was
#    truncated to a negative int at run time).
variant ctx0 "$ts" 's/"max_position_embeddings": 512/"max_position_embeddings": 0/'
expect_build_fails ctx0 "$work/ctx0" "$work/ctx0/config.json:13:30: error: param 'max_context' is 0; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"max_position_embeddings\": 0,
                               ^
models/llama.kiln:33:48: note: 'max_position_embeddings' is used here
                                               : config.max_position_embeddings;
                                                 ^"
variant ctx_neg "$ts" 's/"max_position_embeddings": 512/"max_position_embeddings": -5/'
expect_build_fails ctx_neg "$work/ctx_neg" "$work/ctx_neg/config.json:13:30: error: param 'max_context' is -5; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"max_position_embeddings\": -5,
                               ^
models/llama.kiln:33:48: note: 'max_position_embeddings' is used here
                                               : config.max_position_embeddings;
                                                 ^"
variant ctx_huge "$ts" 's/"max_position_embeddings": 512/"max_position_embeddings": 1e12/'
expect_build_fails ctx_huge "$work/ctx_huge" "$work/ctx_huge/config.json:13:30: error: param 'max_context' is 1000000000000; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"max_position_embeddings\": 1e12,
                               ^
models/llama.kiln:33:48: note: 'max_position_embeddings' is used here
                                               : config.max_position_embeddings;
                                                 ^"
variant gpt2_ctx "$models/gpt2-tiny" 's/"n_positions": 256/"n_positions": 0/'
expect_build_fails gpt2_ctx "$work/gpt2_ctx" "$work/gpt2_ctx/config.json:19:18: error: param 'max_context' is 0; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"n_positions\": 0,
                   ^
models/gpt2.kiln:20:22: note: 'n_positions' is used here
  param max_context  = config.n_positions ?? config.max_position_embeddings;
                       ^"

# 2. A norm's eps: positive (a negative one gave NaN at run time).
variant eps "$ts" 's/"rms_norm_eps": 1e-06/"rms_norm_eps": -1/'
expect_build_fails eps "$work/eps" "$work/eps/config.json:20:19: error: rms_norm: attribute 'eps' is -1; it must be positive
    \"rms_norm_eps\": -1,
                    ^
models/llama.kiln:70:40: note: 'rms_norm_eps' is used here
      h = rms_norm(x, attn_norm[i], eps: eps);
                                         ^"
variant ln_eps "$models/gpt2-tiny" 's/"layer_norm_epsilon": 1e-05/"layer_norm_epsilon": -1e-05/'
expect_build_fails ln_eps "$work/ln_eps" "$work/ln_eps/config.json:13:25: error: layer_norm: attribute 'eps' is -1e-05; it must be positive
    \"layer_norm_epsilon\": -1e-05,
                          ^
models/gpt2.kiln:64:48: note: 'layer_norm_epsilon' is used here
      h = layer_norm(x, ln1_w[i], ln1_b[i], eps: eps);
                                                 ^"

# 3. No layers: the graph was embedding -> norm -> head, and ran.
variant layers0 "$ts" 's/"num_hidden_layers": 2/"num_hidden_layers": 0/'
expect_build_fails layers0 "$work/layers0" "$work/layers0/config.json:17:24: error: param 'layers' (the number of layers) is 0; it must be from 1 to 65536
    \"num_hidden_layers\": 0,
                         ^
models/llama.kiln:8:18: note: 'num_hidden_layers' is used here
  param layers   = config.num_hidden_layers;
                   ^"
variant gpt2_layers0 "$models/gpt2-tiny" 's/"n_layer": 2/"n_layer": 0/'
expect_build_fails gpt2_layers0 "$work/gpt2_layers0" "$work/gpt2_layers0/config.json:18:14: error: param 'layers' (the number of layers) is 0; it must be from 1 to 65536
    \"n_layer\": 0,
               ^
models/gpt2.kiln:10:18: note: 'n_layer' is used here
  param layers   = config.n_layer;
                   ^"

# 4. Fewer layers in the config than in the checkpoint: the rest was dropped
#    silently. An error at the layer count, with the checkpoint's.
variant layers1 "$ts" 's/"num_hidden_layers": 2/"num_hidden_layers": 1/'
expect_build_fails layers1 "$work/layers1" "$work/layers1/config.json:17:24: error: the model has 1 layer, but the checkpoint has tensors for 2 (up to 'model.layers.1.input_layernorm.weight')
    \"num_hidden_layers\": 1,
                         ^
models/llama.kiln:8:18: note: 'num_hidden_layers' is used here
  param layers   = config.num_hidden_layers;
                   ^"
#    Other tensors nothing reads: one warning, grouped; buffers the description
#    ignores (RoPE's inv_freq) left out. The checkpoint here is sharded: the
#    model's own file and a second one with the extras, written by hand.
variant extras "$ts" -e ''
rm "$work/extras/model.safetensors"
ln -s "$ts/model.safetensors" "$work/extras/model-00001.safetensors"
hdr='{"model.layers.0.self_attn.rotary_emb.inv_freq":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
hdr+='"model.layers.0.extra.weight":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},'
hdr+='"model.layers.1.extra.weight":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},'
hdr+='"spare":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}'
while (( ${#hdr} % 8 )); do hdr+=' '; done
n=${#hdr}
printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) \
  $((n >> 24 & 255)))" > "$work/extras/extra.safetensors"
printf '%s' "$hdr" >> "$work/extras/extra.safetensors"
head -c 20 /dev/zero >> "$work/extras/extra.safetensors"
echo '{"weight_map": {"lm_head.weight": "model-00001.safetensors", "spare": "extra.safetensors"}}' \
  > "$work/extras/model.safetensors.index.json"
got=$("$KILN_BIN" build "$work/extras" -o "$work/extras.engine" 2>&1 >/dev/null) \
  && [ -s "$work/extras.engine" ] && passes=$((passes+1)) || { echo "FAIL extras: build"; failures=$((failures+1)); }
expect_same extras "$work/extras: warning: the model does not use 3 of the checkpoint's tensors: model.layers.*.extra.weight (2), spare" "$(grep -v '^kiln: wrote ' <<<"$got")"
#    The shared checkpoints hold nothing unused: their builds say nothing but what they wrote.
for m in $(shared_models) "$models/stories260k/stories260K.bin"; do
  got=$("$KILN_BIN" build "$m" -o "$work/quiet.engine" 2>&1 >/dev/null); rc=$?
  expect_same "quiet build of $(basename "$m")" "exit 0: " "exit $rc: $(grep -v '^kiln: wrote ' <<<"$got")"
done

# 5. A tokenizer with ids the model has no embedding row for: they failed
#    only when a prompt used them. The first such token is named.
expect_fail tok_json "$ts/tokenizer.json: error: token 'kno' has id 500, but the model's vocabulary has 500 ids (the rows of its embedding table); the tokenizer holds 2048 ids: is it the model's own?" -- \
  "$KILN_BIN" build "$models/gpt2-tiny" --tokenizer "$ts/tokenizer.json" -o "$work/tok.engine"
expect_fail tok_bin "$models/stories260k/tok512.bin: error: token '\\\\' has id 500, but the model's vocabulary has 500 ids (the rows of its embedding table); the tokenizer holds 512 ids: is it the model's own?" -- \
  "$KILN_BIN" build "$models/gpt2-tiny" --tokenizer "$models/stories260k/tok512.bin" -o "$work/tok.engine"
[ ! -e "$work/tok.engine" ] && passes=$((passes+1)) || { echo "FAIL tok: an engine was written"; failures=$((failures+1)); }
#    The BOS and EOS ids the runtime reads lie in the vocabulary (here from
#    generation_config.json, which comes before config.json).
variant eos_range "$ts" -e ''
rm "$work/eos_range/generation_config.json"
sed 's/"eos_token_id": 2/"eos_token_id": 2048/' "$ts/generation_config.json" > "$work/eos_range/generation_config.json"
expect_build_fails eos_range "$work/eos_range" "$work/eos_range/generation_config.json:4:19: error: param 'eos_token_id' is 2048, outside the vocabulary (2048 ids)
    \"eos_token_id\": 2048,
                    ^
models/llama.kiln:36:22: note: 'eos_token_id' is used here
  param eos_token_id = generation.eos_token_id ?? config.eos_token_id ?? -1;
                       ^"

# 6. Every EOS id reaches the engine: a list in config.json stays a list
#    (only its first id was kept), and generation_config.json comes first
#    (it was not read).
variant eos_list "$ts" 's/"eos_token_id": 2,/"eos_token_id": [2, 7],/'
rm "$work/eos_list/generation_config.json"
got=$("$KILN_BIN" ir "$work/eos_list" 2>&1 | grep '^param .*_token_id')
expect_same eos_list "param bos_token_id = 1
param eos_token_id = [2, 7]" "$got"
printf '{\n  "bos_token_id": 1,\n  "eos_token_id": [2, 5, 7]\n}\n' > "$work/eos_list/generation_config.json"
got=$("$KILN_BIN" ir "$work/eos_list" 2>&1 | grep '^param .*_token_id')
expect_same eos_generation "param bos_token_id = 1
param eos_token_id = [2, 5, 7]" "$got"
"$KILN_BIN" build "$work/eos_list" -o "$work/eos_list.engine" && passes=$((passes+1)) \
  || { echo "FAIL eos_list: build"; failures=$((failures+1)); }
got=$("$KILN_BIN" inspect "$work/eos_list.engine" | grep '_token_id')
expect_same eos_engine "  bos_token_id             1
  eos_token_id             [2, 5, 7]" "$got"
#    A generation_config.json that is not JSON stops the build.
printf '{"eos_token_id": [2,}\n' > "$work/eos_list/generation_config.json"
expect_build_fails eos_bad_json "$work/eos_list" "$work/eos_list/generation_config.json:1:21: error: invalid JSON
  {\"eos_token_id\": [2,}
                      ^"

# 8. Values of the wrong JSON type: an error at the value, with the use that
#    needs another type (a string where a number goes; an integer past what
#    a double holds exactly; a rope_scaling that is not an object, which `??`
#    used to pass over silently).
variant str_num "$ts" 's/"hidden_size": 128/"hidden_size": "128"/'
expect_build_fails str_num "$work/str_num" "$work/str_num/config.json:10:18: error: '/' expects numbers or tensors, not a string and an int
    \"hidden_size\": \"128\",
                   ^
models/llama.kiln:11:44: note: 'hidden_size' is used here
  param head_dim = config.head_dim ?? hidden / heads;
                                             ^"
variant huge_int "$ts" 's/"vocab_size": 2048/"vocab_size": 18446744073709551616/'
expect_build_fails huge_int "$work/huge_int" "$work/huge_int/config.json:27:17: error: a weight dimension must be an int, not a whole number too large to read exactly (2^53 or more)
    \"vocab_size\": 18446744073709551616
                  ^
models/llama.kiln:43:14: note: 'vocab_size' is used here
  weight embed[vocab, hidden]   = \"model.embed_tokens.weight\" | \"lm_head.weight\";
               ^"
variant rope_str "$ts" 's/"rope_scaling": null/"rope_scaling": "linear"/'
expect_build_fails rope_str "$work/rope_str" "$work/rope_str/config.json:21:19: error: 'rope_scaling' in $work/rope_str/config.json is a string, not an object: the description reads its key 'rope_type'
    \"rope_scaling\": \"linear\",
                    ^
models/llama.kiln:22:55: note: 'rope_scaling' is used here
  param rope_type = config.rope_parameters.rope_type ?? config.rope_scaling.rope_type
                                                        ^"
mkdir -p "$work/not_object"
printf '\n  [{"model_type": "llama"}]\n' > "$work/not_object/config.json"
expect_build_fails not_object "$work/not_object" "$work/not_object/config.json:2:3: error: expected a JSON object
    [{\"model_type\": \"llama\"}]
    ^"

finish

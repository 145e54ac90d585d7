#!/usr/bin/env bash
# Bad configs and checkpoints that `kiln build` must refuse (or warn about)
# before anything runs: each case is a shared model folder copied into the
# temp dir (its files linked, config.json edited with sed), built, and the
# whole message pinned.
. "$(dirname "$0")/lib.sh"
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
models/llama.kiln:22:22: note: 'max_position_embeddings' is used here
  param max_context  = config.max_position_embeddings;
                       ^"
variant ctx_neg "$ts" 's/"max_position_embeddings": 512/"max_position_embeddings": -5/'
expect_build_fails ctx_neg "$work/ctx_neg" "$work/ctx_neg/config.json:13:30: error: param 'max_context' is -5; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"max_position_embeddings\": -5,
                               ^
models/llama.kiln:22:22: note: 'max_position_embeddings' is used here
  param max_context  = config.max_position_embeddings;
                       ^"
variant ctx_huge "$ts" 's/"max_position_embeddings": 512/"max_position_embeddings": 1e12/'
expect_build_fails ctx_huge "$work/ctx_huge" "$work/ctx_huge/config.json:13:30: error: param 'max_context' is 1000000000000; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"max_position_embeddings\": 1e12,
                               ^
models/llama.kiln:22:22: note: 'max_position_embeddings' is used here
  param max_context  = config.max_position_embeddings;
                       ^"
variant gpt2_ctx "$models/gpt2-tiny" 's/"n_positions": 256/"n_positions": 0/'
expect_build_fails gpt2_ctx "$work/gpt2_ctx" "$work/gpt2_ctx/config.json:19:18: error: param 'max_context' is 0; it must be from 1 to 2147483647 (the positions a sequence holds)
    \"n_positions\": 0,
                   ^
models/gpt2.kiln:21:22: note: 'n_positions' is used here
  param max_context  = config.n_positions ?? config.max_position_embeddings;
                       ^"

# 2. A norm's eps: positive (a negative one gave NaN at run time).
variant eps "$ts" 's/"rms_norm_eps": 1e-06/"rms_norm_eps": -1/'
expect_build_fails eps "$work/eps" "$work/eps/config.json:20:19: error: rms_norm: attribute 'eps' is -1; it must be positive
    \"rms_norm_eps\": -1,
                    ^
models/llama.kiln:66:40: note: 'rms_norm_eps' is used here
      h = rms_norm(x, attn_norm[i], eps: eps);
                                         ^"
variant ln_eps "$models/gpt2-tiny" 's/"layer_norm_epsilon": 1e-05/"layer_norm_epsilon": -1e-05/'
expect_build_fails ln_eps "$work/ln_eps" "$work/ln_eps/config.json:13:25: error: layer_norm: attribute 'eps' is -1e-05; it must be positive
    \"layer_norm_epsilon\": -1e-05,
                          ^
models/gpt2.kiln:63:48: note: 'layer_norm_epsilon' is used here
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

finish

#!/usr/bin/env bash
# `kiln build --dtype f16` checks the checkpoint's values first (compiler/f16_range.c): finite values
# that f16 rounds to inf (magnitude 65520 and up) are an error naming the tensor, how many and the
# largest magnitude, and no engine is written; a tensor with more than 1% of its values nonzero
# and under f16's normal range (2^-14) is a warning (how many, the smallest, how many become 0),
# and the build goes on. bf16 builds, and tensors already stored as f16, are not checked.
# Checkpoints: a two-weight .kiln model over a safetensors file written here byte by byte.
. "$(dirname "$0")/lib.sh"

cat > "$work/t.kiln" <<'EOF'
model t;
param max_context = 16;
param bos_token_id = 1;
param eos_token_id = 2;
weight e[4, 8] = "emb";
weight w[4, 8] = "proj";
forward {
  x = embed(e, tokens);
  output logits = linear(x, w);
}
EOF

# Little-endian bytes of the values used, as printf escapes (a shell variable cannot hold NUL).
Q='\x00\x00\x80\x3e'         # 0.25 (f32)
BIG='\x00\x50\xc3\x47'       # 100000
NEG='\x00\xb8\x88\xc7'       # -70000
EDGE='\x00\xef\x7f\x47'      # 65519: rounds to 65504, in range
TINY='\x5f\x70\x89\x30'      # 1e-9: becomes 0 in f16
SMALL='\xbd\x37\x86\x35'     # 1e-6: an f16 subnormal
BQ='\x80\x3e' BBIG='\xc3\x47' BSMALL='\x86\x35'   # bf16: 0.25, 99840, 9.98e-7
HQ='\x00\x34'                # f16: 0.25

# repeat ESCAPES N: ESCAPES N times
repeat() { local i; for ((i = 0; i < $2; i++)); do printf '%s' "$1"; done; }
# checkpoint FILE DTYPE EMB_DATA PROJ_DATA: both tensors [4, 8] of DTYPE (F32, BF16, F16), their
# data given as escapes
checkpoint() {
  local file="$1" dtype="$2" size=128 header len i
  [ "$dtype" = F32 ] || size=64
  header="{\"emb\":{\"dtype\":\"$dtype\",\"shape\":[4,8],\"data_offsets\":[0,$size]},"
  header+="\"proj\":{\"dtype\":\"$dtype\",\"shape\":[4,8],\"data_offsets\":[$size,$((2 * size))]}}"
  while (( ${#header} % 8 )); do header+=" "; done
  len=${#header}
  {
    for ((i = 0; i < 8; i++)); do printf "\\x$(printf %02x $(( (len >> (8 * i)) & 255 )))"; done
    printf '%s' "$header"
    printf "$3"
    printf "$4"
  } > "$file"
}

# build NAME CHECKPOINT DTYPE WANT_STATUS WANT_STDERR: the build's exit status and its messages
# (the last line of a build that succeeds, what it wrote, is checked apart: its time varies)
build() {
  local err rc wrote
  rm -f "$work/$1.engine"
  err=$("$KILN_BIN" build "$work/t.kiln" --weights "$2" --dtype "$3" -o "$work/$1.engine" 2>&1 >/dev/null); rc=$?
  expect_same "$1: exit status" "$4" "$rc"
  wrote=$(grep '^kiln: wrote ' <<<"$err" | sed -E 's/ in [0-9.]+ s$/ in T s/')
  err=$(grep -v '^kiln: wrote ' <<<"$err")
  expect_same "$1: messages" "$5" "$err"
  if [ "$4" = 0 ]; then
    expect_same "$1: what was written" "kiln: wrote $work/$1.engine (4.3 KiB, cpu, $3, 0 layers) in T s" "$wrote"
  else
    expect_same "$1: nothing written" "" "$wrote"
  fi
  if [ "$4" = 0 ]; then
    [ -s "$work/$1.engine" ] && passes=$((passes+1)) || { echo "FAIL $1: no engine"; failures=$((failures+1)); }
  else
    [ ! -e "$work/$1.engine" ] && passes=$((passes+1)) || { echo "FAIL $1: an engine was written"; failures=$((failures+1)); }
  fi
}

# In range (65519 rounds to 65504): no message.
checkpoint "$work/clean.safetensors" F32 "$(repeat "$Q" 32)" "$EDGE$(repeat "$Q" 31)"
build clean "$work/clean.safetensors" f16 0 ""

# Two values beyond the range: an error, no engine; bf16 takes them.
checkpoint "$work/big.safetensors" F32 "$(repeat "$Q" 32)" "$(repeat "$Q" 5)$BIG$EDGE$NEG$(repeat "$Q" 24)"
build big "$work/big.safetensors" f16 1 \
  "kiln: error: --dtype f16: tensor 'proj' has 2 of 32 values beyond f16's range (largest magnitude 100000; f16 holds at most 65504): they would become inf; --dtype bf16 keeps f32's range"
build big-bf16 "$work/big.safetensors" bf16 0 ""

# 10 of 32 values below the normal range, 2 of them small enough to become 0: a warning.
checkpoint "$work/small.safetensors" F32 "$(repeat "$SMALL" 8)$(repeat "$TINY" 2)$(repeat "$Q" 22)" "$(repeat "$Q" 32)"
build small "$work/small.safetensors" f16 0 \
  "kiln: warning: --dtype f16: tensor 'emb' has 10 of 32 values (31.2%) below f16's normal range (nonzero, magnitude under 6.10352e-05; the smallest 1e-09): stored with fewer significant bits, 2 of them as 0; --dtype bf16 keeps f32's range"

# Both in one checkpoint: every tensor is reported, in the graph's order.
checkpoint "$work/both.safetensors" F32 "$(repeat "$SMALL" 8)$(repeat "$TINY" 2)$(repeat "$Q" 22)" \
  "$(repeat "$Q" 5)$BIG$EDGE$NEG$(repeat "$Q" 24)"
build both "$work/both.safetensors" f16 1 \
  "kiln: warning: --dtype f16: tensor 'emb' has 10 of 32 values (31.2%) below f16's normal range (nonzero, magnitude under 6.10352e-05; the smallest 1e-09): stored with fewer significant bits, 2 of them as 0; --dtype bf16 keeps f32's range
kiln: error: --dtype f16: tensor 'proj' has 2 of 32 values beyond f16's range (largest magnitude 100000; f16 holds at most 65504): they would become inf; --dtype bf16 keeps f32's range"

# A bf16 checkpoint: the same rules on its values (bf16's 99840 is beyond f16's range).
checkpoint "$work/bf16.safetensors" BF16 "$(repeat "$BSMALL" 4)$(repeat "$BQ" 28)" "$BBIG$(repeat "$BQ" 31)"
build from-bf16 "$work/bf16.safetensors" f16 1 \
  "kiln: warning: --dtype f16: tensor 'emb' has 4 of 32 values (12.5%) below f16's normal range (nonzero, magnitude under 6.10352e-05; the smallest 9.98378e-07): stored with fewer significant bits, 0 of them as 0; --dtype bf16 keeps f32's range
kiln: error: --dtype f16: tensor 'proj' has 1 of 32 values beyond f16's range (largest magnitude 99840; f16 holds at most 65504): they would become inf; --dtype bf16 keeps f32's range"

# Tensors stored as f16 already lose nothing: no check.
checkpoint "$work/f16.safetensors" F16 "$(repeat "$HQ" 32)" "$(repeat "$HQ" 32)"
build from-f16 "$work/f16.safetensors" f16 0 ""

# The shared models convert without a message (their weights are at most 0.52% below the range).
for m in tinystories-656k gpt2-tiny; do
  err=$("$KILN_BIN" build "$KILN_SHARED/models/$m" --dtype f16 -o "$work/$m.engine" 2>&1 >/dev/null)
  expect_same "$m --dtype f16: no message but what was written" "kiln: wrote $work/$m.engine" "${err%% (*}"
done
finish

#!/usr/bin/env bash
# cuda_ops.sh — the elementwise ops of soft-capping, routing and clipping (tanh, exp, sigmoid, clamp,
# maximum, minimum, softmax, a tensor plus or minus a number) on the CUDA backend over emu_libcuda (tests/data/ops/ops.kiln:
# the ops standalone and in matmul epilogues), and a mixture of experts' routing ops (tests/data/moe/moe.kiln:
# sum, topk, gather, div by a row, expert_matmul, expert_sum), and attention sinks (tests/data/sinks/sinks.kiln: the
# CUDA-core kernel in f32, kcu_flash_attention and kcu_flash_decode in bf16 fast): kiln verify --target sm_90, the CUDA engine's every
# value against the unfused interpreter, exact (f32) and fast (bf16, the formulas' float forms).
# Skips (77) without NVRTC or g++.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
for m in ops moe sinks; do
data="$(dirname "$0")/../data/$m"
python3 "$data/make_ckpt.py" "$work/ckpt$m" || { echo "FAIL: $m/make_ckpt.py"; exit 1; }
for how in "--dtype f32" "--dtype bf16 --precision fast"; do
  tag=${how//[^a-z0-9]/}$m
  # the kernels verify's engine runs: the same build, its source compiled for the CPU
  # shellcheck disable=SC2086
  "$KILN_BIN" build "$data/$m.kiln" --weights "$work/ckpt$m" --target sm_90 $how --emit-source "$work/src$tag" \
    -o "$work/$tag.engine" >"$work/$tag.log" 2>&1 && compile_kernels "$work/src$tag" "$work/$tag.so" \
    || { echo "FAIL: build $m ($how)"; cat "$work/$tag.log"; failures=$((failures+1)); continue; }
  # shellcheck disable=SC2086
  out=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/$tag.so" \
        "$KILN_BIN" verify "$data/$m.kiln" --weights "$work/ckpt$m" --target sm_90 $how 2>&1); rc=$?
  echo "$m $how: $(grep -E 'logits:' <<<"$out")"
  [ $rc -eq 0 ] && [[ "$out" == *"on the cuda backend"* ]] && [[ "$out" == *"OK: within tolerance"* ]] \
    && passes=$((passes+1)) || { echo "FAIL: verify $m --target sm_90 $how (exit $rc)"; echo "$out" | sed 's/^/    /'; failures=$((failures+1)); }
done
done
# the grouped MoE matmul's prompt kernel with tiles of 16 routed rows (KILN_CUDA_MOE_BT_LARGE): moe.kiln's 36-token
# step routes more than 16 rows to an expert (72 choices over 4 experts), which its blocks take a tile at a time
# (kcu_moe_collect's search goes on where the last tile stopped)
data="$(dirname "$0")/../data/moe"
KILN_CUDA_MOE_BT_LARGE=16 "$KILN_BIN" build "$data/moe.kiln" --weights "$work/ckptmoe" --target sm_90 --dtype bf16 \
  --precision fast --emit-source "$work/srcbt16" -o "$work/bt16.engine" >"$work/bt16.log" 2>&1 \
  && compile_kernels "$work/srcbt16" "$work/bt16.so" || { echo "FAIL: build moe with tiles of 16"; cat "$work/bt16.log"; failures=$((failures+1)); }
[ "$(grep -c 'kcu_moe_matmul<kcu_bf16, 8, 16, 4, 2, 16, true>' "$work"/srcbt16/*.cu)" = 2 ] && passes=$((passes+1)) \
  || { echo "FAIL: moe's grouped kernels do not take tiles of 16 with KILN_CUDA_MOE_BT_LARGE=16"; failures=$((failures+1)); }
out=$(KILN_CUDA_MOE_BT_LARGE=16 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/bt16.so" \
      "$KILN_BIN" verify "$data/moe.kiln" --weights "$work/ckptmoe" --target sm_90 --dtype bf16 --precision fast 2>&1); rc=$?
echo "moe, tiles of 16: $(grep -E 'logits:' <<<"$out")"
[ $rc -eq 0 ] && [[ "$out" == *"OK: within tolerance"* ]] && passes=$((passes+1)) \
  || { echo "FAIL: verify moe with tiles of 16 (exit $rc)"; echo "$out" | sed 's/^/    /'; failures=$((failures+1)); }
# the generated kernels hold the ops: clamp's one-sided bounds, the shifted scale, tanh in a matmul epilogue,
# max (in a row group or alone) and min in an epilogue (ir/ops.def's KIR_BINARY: a NaN of either operand kept), softmax's
# row maximum
src=$(cat "$work"/srcdtypef32ops/*.cu)
for want in "kcu_clamp_hi(kcu_clamp_lo(" "kcu_clamp_hi(x[i], 0.25f)" "kcu_clamp_lo(x[i], 0.0f)" "(tanh((double)m0))" "exp(a)" \
  "= (va != va || va > vb) ? va : vb;" "(m0 != m0 || m0 < r.in1_1[0]) ? m0 : r.in1_1[0]" \
  "m = (e != e || e > m) ? e : m;"; do
  [[ "$src" == *"$want"* ]] && passes=$((passes+1)) || { echo "FAIL: no '$want' in the generated source"; failures=$((failures+1)); }
done
# the repository's models that hold those ops (gpt-oss: sinks, the clamped SwiGLU, stacked experts; DeepSeek-V3:
# latent attention's repeated rotary key, group routing with amin, masks and masked_fill): every value of the
# emulated CUDA engine against the interpreter's (deepseek_v3-yarn-tiny adds no kernel: its YaRN RoPE is
# qwen3-yarn-tiny's and nemotron-tiny's, emulated in cuda_engines; CI's time); and the rotations whose
# frequencies follow each token's sequence length (a rope kernel of its own): phi3-longrope-tiny (LongRoPE's
# short and long factors) and llama-dynamic-tiny (dynamic NTK's base, grown in the kernel), in f32, with a
# 30-token prompt beside a 15-token one in a step (past and within the 16 positions of their original
# context), whose decode steps then cross it
# (KILN_OPS_MODELS, when set, names the models instead: empty under the sanitizers, tests/cuda/CMakeLists.txt)
# qwen3_moe-tiny in fast precision: the grouped matmul (kcu_moe_matmul) with the gate, up and SwiGLU as one
# kernel (kcu_moe_swiglu) and the down projection alone, a prompt of more than 32 tokens on its _large
# kernel, the router's row ops one kernel (passes/fuse_rows.c), expert_sum with the residual add one kernel,
# each head's q and k norm with its rotation one kernel (passes/fuse_norm_rope.c);
# then tests/session's test_session on that engine: a sequence decoded among 7 and 31 others
# bitwise equal to alone (the grouped matmul's rows depend on nothing else in the step)
ops_models=" ${KILN_OPS_MODELS-gpt_oss-tiny deepseek_v3-tiny phi3-longrope-tiny llama-dynamic-tiny qwen3_moe-tiny} "
for m in $ops_models; do
  dir="$(dirname "$0")/../data/$m"
  hows=("--dtype f32" "--dtype bf16 --precision fast") steps=""
  case $m in phi3-longrope-tiny|llama-dynamic-tiny) hows=("--dtype f32") steps="--tokens 30";; esac
  [ $m = qwen3_moe-tiny ] && hows=("--dtype bf16 --precision fast")
  # DeepSeek-V3's routing (sigmoid scores of random weights, groups masked by `>`) meets near-ties at bf16's
  # resolution in many random prompts: fused and unfused round in different places, and a group or an
  # expert flips (4 of seeds 1-8 on the CPU alone, kiln verify --dtype bf16 --precision fast); seed 5's
  # prompts route clear of them on both backends
  [ $m = deepseek_v3-tiny ] && steps="--seed 5"
  # gpt_oss-tiny's router (4 experts, random weights, its logits stored in bf16) ties or nearly ties in most
  # random prompts: kiln verify --dtype bf16 --precision fast on the CPU alone diverges at 10 of seeds 1-14 (the
  # fused graph's one rounding of matmul + bias against the unfused graph's two flips an expert); seed 9's
  # prompts route clear on both backends (seed 1's, clear on the CPU, flip after the grouped down projection)
  [ $m = gpt_oss-tiny ] && steps="--seed 9"
  for how in "${hows[@]}"; do
    tag=${how//[^a-z0-9]/}$m
    # shellcheck disable=SC2086
    "$KILN_BIN" build "$dir" --target sm_90 $how --emit-source "$work/src$tag" -o "$work/$tag.engine" >"$work/$tag.log" 2>&1 \
      && compile_kernels "$work/src$tag" "$work/$tag.so" \
      || { echo "FAIL: build $m ($how)"; cat "$work/$tag.log"; failures=$((failures+1)); continue; }
    # shellcheck disable=SC2086
    out=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/$tag.so" "$KILN_BIN" verify "$dir" --target sm_90 $how $steps 2>&1); rc=$?
    echo "$m $how: $(grep -E 'logits:' <<<"$out")"
    [ $rc -eq 0 ] && [[ "$out" == *"on the cuda backend"* ]] && [[ "$out" == *"OK: within tolerance"* ]] \
      && passes=$((passes+1)) || { echo "FAIL: verify $m --target sm_90 $how (exit $rc)"; echo "$out" | sed 's/^/    /'; failures=$((failures+1)); }
  done
done
if [[ "$ops_models" == *" qwen3_moe-tiny "* ]]; then
  src=$(cat "$work"/srcdtypebf16precisionfastqwen3_moe-tiny/*.cu)
  for want in "kcu_moe_matmul<kcu_bf16, 64, 64, 6, 2, 16, false>(T, x, w, idx, kcu_pro_none(), kcu_moe_swiglu<32, kcu_bf16>{out})" \
    "kcu_moe_matmul<kcu_bf16, 64, 64, 6, 2, 64, false>(T, x, w, idx, kcu_pro_none(), kcu_moe_swiglu<32, kcu_bf16>{out})" \
    "kcu_moe_matmul<kcu_bf16, 32, 64, 6, 2, 16, true>(T, x, w, idx, kcu_pro_none(), kcu_moe_store<64, kcu_bf16, false>{out, nullptr})" \
    "a warp a row" "the residual plus the chosen experts' rows weighted by g" "a token's row ops as one kernel" \
    "q's and k's head norms and rotations, k and v into the KV cache"; do
    [[ "$src" == *"$want"* ]] && passes=$((passes+1)) || { echo "FAIL: no '$want' in qwen3_moe-tiny's fast source"; failures=$((failures+1)); }
  done
  # the experts' L2 prefetches, off by default (measured slower), in with KILN_CUDA_L2_AHEAD=N: the routing
  # kernel's of the chosen experts, and the gate/up kernel's of the down projection's slab
  KILN_CUDA_L2_AHEAD=32 "$KILN_BIN" build "$(dirname "$0")/../data/qwen3_moe-tiny" --target sm_90 --dtype bf16 --precision fast \
    --emit-source "$work/srcahead" -o "$work/ahead.engine" >"$work/ahead.log" 2>&1 \
    || { echo "FAIL: build qwen3_moe-tiny with KILN_CUDA_L2_AHEAD=32"; cat "$work/ahead.log"; failures=$((failures+1)); }
  src=$(cat "$work"/srcahead/*.cu)
  for want in "kcu_moe_swiglu<32, kcu_bf16>{out}, next_w, 4096LL, 33554432LL)" "kcu_l2_expert(experts_ahead, ri[warp]["; do
    [[ "$src" == *"$want"* ]] && passes=$((passes+1)) || { echo "FAIL: no '$want' with KILN_CUDA_L2_AHEAD=32"; failures=$((failures+1)); }
  done
  [[ "$(cat "$work"/srcdtypebf16precisionfastqwen3_moe-tiny/*.cu)" != *"kcu_l2_expert(experts_ahead"* ]] && passes=$((passes+1)) \
    || { echo "FAIL: the experts' L2 prefetch in the default build"; failures=$((failures+1)); }
  tag=dtypebf16precisionfastqwen3_moe-tiny
  out=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/$tag.so" "$KILN_TEST_SESSION" "$work/$tag.engine" 2>&1); rc=$?
  echo "$out" | grep -E "batch|session"
  [ $rc -eq 0 ] && passes=$((passes+1)) || { echo "FAIL: test_session on qwen3_moe-tiny's fast engine (exit $rc)"; echo "$out" | tail -20; failures=$((failures+1)); }
fi
# the rotations by length are kernels of their own, reading each token's sequence length: LongRoPE's two tables,
# dynamic NTK's base computed there
for want in "phi3-longrope-tiny:_inv_freq_long[j]; /* the long factors */" "llama-dynamic-tiny:const float grow = (float)len * 8.0f / 16.0f - 7.0f;"; do
  [[ "$ops_models" == *" ${want%%:*} "* ]] || continue # a model left out (the sanitizers' run)
  src=$(cat "$work/srcdtypef32${want%%:*}"/*.cu)
  [[ "$src" == *"const int len = seq_len[i / "* && "$src" == *"${want#*:}"* ]] && passes=$((passes+1)) \
    || { echo "FAIL: no '${want#*:}' (and seq_len) in ${want%%:*}'s generated source"; failures=$((failures+1)); }
done
finish

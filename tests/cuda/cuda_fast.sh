#!/usr/bin/env bash
# cuda_fast.sh MODEL_DIR ENGINES DTYPE... — fast-precision engines (kiln build --precision fast,
# cuda_engines_<model>_<dtype>-fast): the emulated GPU (the engine's kernels compiled for the CPU,
# run through the CUDA backend over emu_libcuda) against the interpreter running the same engine
# built for the CPU. Both round the same values to the half dtype at the same points (each value a
# kernel stores, the KV rows, a prologue norm's output); their sums run in different orders, so an
# f32 sum that lands next to a half rounding boundary rounds the other way on one side (one half
# ulp of that element), and such flips spread through the layers: the logits are not bitwise
# equal (the 33-token prefill below: within 4 u). Measured (llama-gqa-tiny, tinystories-656k, gpt2-tiny, qwen2-tiny): max|d|/max|ref| of
# the logits 6e-8 .. 3.5e-3 for bf16 (u = 2^-8 = 3.9e-3) and 1.3e-5 .. 5e-4 for f16 (u = 2^-11 =
# 4.9e-4), against ~1e-2 (bf16) between fast and exact precision. Checked here: the same greedy
# ids, and the logits within 4 u (the 33- and 20-token prompts, below) or 2 u (3 tokens) of the half
# dtype (2 u: 7.8e-3 bf16, 9.8e-4 f16), for
#  - a 33-token prompt on an emulated sm_80 (the prefill path: mma.sync, half x and weights, one mma
#    a product; the shared models, whose fast engines have an sm_80 cubin) and sm_90 (kcu_gemm90 through its CPU stand-in: tensor maps, split tiles);
#  - a 20- and a 3-token prompt (the decode path, kcu_matmul_tc: steps of up to 32 tokens), then 5
#    decode steps (the greedy ids);
# the tiles `kiln build --stats` reports for the gemm90 kernels (the setup test's stats.txt);
# and kiln verify --target sm_90 --precision fast for the first dtype: the fused CUDA engine's
# values (half ones copied back as f32) against the unfused reference lowered to the half dtype,
# within verify's half tolerance.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_TEST_CUDA:?}" "${KILN_EMU_LIB:?}"
model="$1" engines="$2"
model_args "$model"
shift 2
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
for dtype in "$@"; do
  dir="$engines/$dtype"
  have_engine "$dir" || exit 1
  tol2=$([ "$dtype" = bf16-fast ] && echo 7.8e-3 || echo 9.8e-4)
  # the 33- and 20-token prompts: 4 u (1.56e-2 bf16, 1.96e-3 f16). The attention kernels round p to
  # the half dtype relative to the row's running maximum, the interpreter relative to its final one
  # (interp_kernels.c): the same where the maximum is among a row's first 16 positions, else a flip
  # here and there, spread over more positions the longer the prompt (measured in the emulator, bf16,
  # 20 tokens: qwen3-yarn-tiny 1.0e-2, gemma2-tiny 7.1e-3, gemma3-tiny 4.9e-3; 33 tokens within 5.5e-3;
  # 3 tokens, one chunk, within 2.4e-7)
  tol4=$([ "$dtype" = bf16-fast ] && echo 1.56e-2 || echo 1.96e-3)
  want_prefill=
  for ids in 1,7,12,31,5,9,40,2,11,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26 1,7,12,31,5,9,40,2,11,3,4,5,6,7,8,9,10,11,12,13 1,7,12; do
    tol=$tol4
    [ "$ids" = 1,7,12 ] && tol=$tol2
    want=$("$KILN_BIN" run "$dir/cpu.engine" --ids $ids -n 6 --logits-out "$work/cpu.f32" 2>/dev/null)
    [ -z "$want_prefill" ] && want_prefill=$want
    # sm_80 (KILN_EMU_CC=8.0): its cubin, mma.sync for the prefill, no gemm90 (where the engine has an
    # sm_80 cubin: the shared models'; tests/CMakeLists.txt builds the others' for sm_90 alone, CI time)
    if [[ "$(cat "$dir/target")" == *sm_80* ]]; then
    got=$(KILN_EMU_STATS=1 KILN_EMU_CC=8.0 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$dir/kernels.so" \
          "$KILN_BIN" run "$dir/cuda.engine" --ids $ids -n 6 --logits-out "$work/cuda.f32" 2>"$work/sm80.err")
    expect_same_output "greedy ids, $dtype, sm_80, prompt $ids" "$want" "$got"
    "$KILN_TEST_CUDA" --compare "$work/cuda.f32" "$work/cpu.f32" $tol && passes=$((passes+1)) \
      || { echo "FAIL: $dtype logits (sm_80, prompt $ids) differ from the interpreter's past $tol"; failures=$((failures+1)); }
    grep -q "^emu_libcuda: 0 launches of _g90_ kernels, 0 tensor maps" "$work/sm80.err" && passes=$((passes+1)) \
      || { echo "FAIL: $dtype: gemm90 ran on sm_80"; failures=$((failures+1)); }
    fi
  done
  # sm_90 (the emulator's default): the sm_90a cubin; the 33-token prompt's matmuls run as gemm90
  # kernels (above the decode kernel's 32 tokens) reading tensor maps (a norm prologue as its own
  # kernel first; RoPE halves and gate/up paired through split tiles)
  ids=1,7,12,31,5,9,40,2,11,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26
  "$KILN_BIN" run "$dir/cpu.engine" --ids $ids -n 6 --logits-out "$work/cpu.f32" >/dev/null 2>&1
  got=$(KILN_EMU_STATS=1 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$dir/kernels.so" \
        "$KILN_BIN" run "$dir/cuda.engine" --ids $ids -n 6 --logits-out "$work/cuda.f32" 2>"$work/g90.err")
  expect_same_output "greedy ids, $dtype, gemm90" "$want_prefill" "$got"
  "$KILN_TEST_CUDA" --compare "$work/cuda.f32" "$work/cpu.f32" $tol4 && passes=$((passes+1)) \
    || { echo "FAIL: $dtype logits through gemm90 differ from the interpreter's past $tol4"; failures=$((failures+1)); }
  stats=$(grep "_g90_ kernels" "$work/g90.err")
  echo "$dtype: $stats"
  [[ "$stats" =~ ([0-9]+)\ launches\ of\ _g90_\ kernels,\ ([0-9]+)\ tensor ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] \
    && [ "${BASH_REMATCH[2]}" -gt 0 ] && passes=$((passes+1)) \
    || { echo "FAIL: $dtype: no gemm90 launches or tensor maps ($stats)"; failures=$((failures+1)); }
  # --stats: a line a gemm90 kernel, its tiles above the decode kernel's 32 tokens
  tiles=$(grep -cE "sm_90a above 32 tokens: .*wgmma tiles 128 x [0-9]+ \(.* column tiles of .*, [0-9]+ stages, [0-9]+ bytes" \
          "$dir/stats.txt")
  echo "$dtype: kiln build --stats names the tiles of $tiles gemm90 kernels"
  [ "$tiles" -gt 0 ] && passes=$((passes+1)) \
    || { echo "FAIL: $dtype: kiln build --stats shows no gemm90 tiles"; cat "$dir/stats.txt"; failures=$((failures+1)); }
done

dtype=$1 dir="$engines/$1"
# the decode matmuls: kcu_matmul_tc for steps of up to 32 tokens by default (batch-invariant); with
# KILN_CUDA_BATCH_VARIANT=1 the per-T kernels (kcu_matmul_small up to 8 tokens, gemm90 above)
tc=$(cat "$dir"/src/*.cu | grep -cE "kcu_matmul_tc<(kcu_|float)")
small=$(cat "$dir"/src/*.cu | grep -cE "kcu_matmul_small<(kcu_|float)")
expect_same "decode matmuls on kcu_matmul_tc by default ($tc)" "0" "$small"
[ "$tc" -gt 0 ] && passes=$((passes+1)) || { echo "FAIL: no kcu_matmul_tc in the fast engine"; failures=$((failures+1)); }
# every engine kernel (krt_draw, launched plainly, aside) opens with KCU_PDL_ENTER: nothing, not even
# a weight's cp.async, before it waits for the kernel ahead (copies in flight across the wait gave
# wrong logits on the H100 and the H200, kcu_prelude.cuh; the emulator cannot show it) — but L2
# prefetches, which read nothing into the kernel: kcu_l2_ahead's, or kcu_matmul_tc's own before its
# wait (the kernel says so where KCU_PDL_ENTER would be)
late=$(cat "$dir"/src/*.cu | awk '/^extern "C" __global__/ && !/KRT_DRAW/ { k = $0; n++; getline; getline;
         if ($0 ~ /^    kcu_l2_ahead\(ahead, [0-9]+LL\);/) getline;
         if ($0 !~ /^    KCU_PDL_ENTER\(\);$/ && $0 !~ /^    \/\* KCU_PDL_ENTER: kcu_matmul_tc.s, after its L2 prefetch \*\/$/) {
           bad++; print "  " substr(k, 1, 100) } }
         END { print n + 0 " kernels, " bad + 0 " not opening with KCU_PDL_ENTER" }')
echo "$late"
[[ "$late" =~ ^([0-9]+)\ kernels,\ 0\ not ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] && passes=$((passes+1)) \
  || { echo "FAIL: kernels that do not open with KCU_PDL_ENTER"; failures=$((failures+1)); }
# the knob's kernels do not depend on the model: one model's build shows them (an NVRTC compile, CI time)
if [ "$(basename "$model")" = llama-gqa-tiny ]; then
KILN_CUDA_BATCH_VARIANT=1 "$KILN_BIN" build "${args[@]}" --target sm_90 --dtype ${dtype%-fast} --precision fast \
  --emit-source "$work/variant" --stats -o "$work/variant.engine" >"$work/variant.log" 2>&1 \
  || { echo "FAIL: the batch-variant build"; cat "$work/variant.log"; failures=$((failures+1)); }
expect_same "KILN_CUDA_BATCH_VARIANT=1: no kcu_matmul_tc" "0" "$(cat "$work"/variant/*.cu | grep -cE "kcu_matmul_tc<(kcu_|float)")"
grep -q "sm_90a above 8 tokens" "$work/variant.log" && passes=$((passes+1)) \
  || { echo "FAIL: KILN_CUDA_BATCH_VARIANT=1: gemm90 not above 8 tokens"; failures=$((failures+1)); }
# the L2 prefetches: none by default (measured slower on an H100, bench/RESULTS.md); the knobs put the
# attention kernel's prefetch of the o projection's weights and the decode matmuls' of their own first
# steps in (and x of steps over 8 tokens goes through registers, not the ring: KILN_CUDA_TC_XRING=0)
expect_same "default: no kcu_l2_ahead" "0" "$(cat "$dir"/src/*.cu | grep -c '^    kcu_l2_ahead(')"
expect_same "default: no KCU_TC_PREFETCH of the generator's" "0" "$(cat "$dir"/src/*.cu | grep -c '^#define KCU_TC_PREFETCH [0-9]*$')"
KILN_CUDA_TC_PREFETCH=6 KILN_CUDA_L2_AHEAD=32 KILN_CUDA_TC_XRING=0 "$KILN_BIN" build "${args[@]}" --target sm_90 --dtype ${dtype%-fast} \
  --precision fast --emit-source "$work/prefetch" -o "$work/prefetch.engine" >"$work/prefetch.log" 2>&1 \
  || { echo "FAIL: the build with prefetches"; cat "$work/prefetch.log"; failures=$((failures+1)); }
expect_same "KILN_CUDA_L2_AHEAD=32: the attention prefetches the next matmul's weights" "1" \
  "$(cat "$work"/prefetch/*.cu | grep -A3 '^/\* attention:' | grep -c '^    kcu_l2_ahead(ahead, [0-9]*LL);')"
expect_same "KILN_CUDA_TC_PREFETCH=6: KCU_TC_PREFETCH 6" "1" "$(cat "$work"/prefetch/*.cu | grep -c '^#define KCU_TC_PREFETCH 6$')"
expect_same "KILN_CUDA_TC_XRING=0: KCU_TC_XRING 0" "1" "$(cat "$work"/prefetch/*.cu | grep -c '^#define KCU_TC_XRING 0$')"
fi
# (KILN_CUDA_GEMM90_ABOVE as the setup test built the kernels, so that verify's engine names them alike)
out=$(KILN_CUDA_GEMM90_ABOVE=8 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$dir/kernels.so" \
      "$KILN_BIN" verify "$model" --target sm_90 --dtype ${dtype%-fast} --precision fast --tokens 12 --steps 2); rc=$?
echo "$out"
[ $rc -eq 0 ] && [[ "$out" == *"roundings (u = 2^-"* ]] && [[ "$out" == *"OK: within tolerance"* ]] \
  && passes=$((passes+1)) || { echo "FAIL: kiln verify --target sm_90 --precision fast (exit $rc)"; failures=$((failures+1)); }
finish

#!/usr/bin/env bash
# cuda_quant.sh — quantized matmuls (kiln build --quant) through the CUDA backend, emulated on the
# CPU: kcu_matmul_q's logits against the reference interpreter's (the same codes: both engines are
# built from one RTN quantization), for a step of 40 tokens (the prefill kernel) and
# decode steps, in exact precision (f32 x: u4 codes with zero points, groups of 128; the prefill
# 8 tokens at a time on CUDA cores) and in fast precision (bf16 x: i8 codes, a scale a row; u4 in
# groups of 64; the prefill on kcu_matmul_mma's tensor cores, each weight dequantized to bf16 as it is
# loaded, hence the fast tolerance), the norm before q,k,v and gate/up fused into them; fp8 and w8a8 likewise,
# x quantized a token at a time in the kernel, and on sm_90a's FP8 and INT8 wgmma (kcu_gemm90 on codes); w4a16's
# prefill on kcu_gemm90 over its weights dequantized by a pre-pass; a KV cache of int8 or fp8 codes (--kv-dtype).
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}" "${KILN_TEST_SESSION:?}" "${KILN_TEST_CUDA:?}"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
ts="$KILN_SHARED/models/tinystories-656k"
ids=$(python3 -c "print(','.join(str(1 + 37 * i % 2000) for i in range(40)))") # 40 tokens: past the decode kernel's 32
check() {
  local name=$1 tol=$2; shift 2
  local d="$work/$name"
  mkdir -p "$d"
  "$KILN_BIN" build "$ts" -o "$d/cpu.engine" "$@" 2>/dev/null &&
    "$KILN_BIN" build "$ts" -o "$d/cuda.engine" --target sm_90 --emit-source "$d/src" "$@" 2>/dev/null ||
    { echo "FAIL: $name: builds"; failures=$((failures+1)); return; }
  case $name in
    kv-*) # a KV cache of codes: each layer's write a kernel of its own, attention on the codes
      expect_same "$name: the layers' writes of codes (one kernel text)" 1 "$(cat "$d"/src/*.cu | grep -c 'kcu_kv_put_row<DK>')"
      # the attention kernel's calls with the scales: kcu_attention_kernel (exact), or kcu_flash_decode and
      # kcu_flash_attention's two plans (fast precision: the tensor cores stage the codes times their scales)
      case $name in *fast) calls=3 ;; *) calls=1 ;; esac
      expect_same "$name: attention over codes" $calls "$(cat "$d"/src/*.cu | grep -cE '^        [a-z].*, ks, vs\);$')"
      case $name in
        *fast) expect_same "$name: kcu_flash_attention and kcu_flash_decode over codes" 3 \
                 "$(cat "$d"/src/*.cu | grep -cE '^ +kcu_flash_(attention|decode)<.*kcu_kv_(i8|e4m3)')" ;;
      esac ;;
    *)
      expect_same "$name: kcu_matmul_q in every matmul kernel but the lm_head's" 8 "$(cat "$d"/src/*.cu | grep -c '^    kcu_matmul_q<')" ;;
  esac
  # the norms before q,k,v and gate/up inside them (w4a16, w8a16: two kernel texts, decode and prefill, each);
  # fp8 and w8a8 quantize x instead (kcu_pro_xq in all 8)
  case $name in
    w4a16*|w8a16*) expect_same "$name: the norms fused" 4 "$(cat "$d"/src/*.cu | grep -c '^    kcu_matmul_q<.*kcu_pro_rms')" ;;
    fp8*|w8a8*) expect_same "$name: x quantized in the kernel" 8 "$(cat "$d"/src/*.cu | grep -c '^    kcu_matmul_q<.*kcu_pro_xq')" ;;
  esac
  # sm_90a's prefill of fp8 and w8a8 on FP8 and INT8 wgmma: each of the four matmul groups' x codes by a pre-pass
  # kernel, and kcu_gemm90 on e4m3 or i8 codes of both operands
  case $name in
    w4a16*-g90) expect_same "$name: the weights dequantized by a pre-pass" 4 \
                  "$(cat "$d"/src/*.cu | grep -c '^    kcu_dequantize_weight<')" ;;
    *-g90) expect_same "$name: x's codes by a pre-pass" 4 "$(cat "$d"/src/*.cu | grep -c '^    kcu_g90_quantize_x<')"
           n=$(cat "$d"/src/*.cu | grep -c '^    kcu_gemm90<kcu_kv_\(e4m3\|i8\),')
           expect_same "$name: kcu_gemm90 on codes, a tile width or more a group" ok "$([ "$n" -ge 4 ] && echo ok || echo "$n")" ;;
  esac
  compile_kernels "$d/src" "$d/kernels.so" || { echo "FAIL: $name: g++"; failures=$((failures+1)); return; }
  KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$d/kernels.so" "$KILN_BIN" run "$d/cuda.engine" --ids $ids -n 4 \
    --temperature 0 --logits-out "$d/cuda.bin" >/dev/null 2>&1
  "$KILN_BIN" run "$d/cpu.engine" --ids $ids -n 4 --temperature 0 --logits-out "$d/cpu.bin" >/dev/null 2>&1
  out=$(python3 -c "
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
if not a or len(a) != len(b): print('sizes', len(a), len(b)); sys.exit(1)
x = struct.unpack('%df' % (len(a) // 4), a); y = struct.unpack('%df' % (len(b) // 4), b)
err = max(abs(p - q) for p, q in zip(x, y)) / max(abs(q) for q in y)
print('max|cuda-cpu|/max|cpu| = %.3g' % err); sys.exit(0 if err <= float(sys.argv[3]) else 1)" "$d/cuda.bin" "$d/cpu.bin" "$tol") \
    && passes=$((passes+1)) || { echo "FAIL: $name: $out (tolerance $tol)"; failures=$((failures+1)); }
  echo "$name: $out"
}
check w4a16-f32 1e-5 --quant w4a16
check w8a16-bf16-fast 0.0156 --quant w8a16 --dtype bf16
check w4a16-g64-bf16-fast 0.0156 --quant w4a16 --quant-group 64 --dtype bf16
# its prefill on sm_90a's kcu_gemm90 (from KILN_CUDA_GEMM90_ABOVE tokens; by default 64): a pre-pass kernel
# dequantizes each weight to bf16 as the tiles above do, the matmul reads that copy (measured here 7.97e-3, the
# same as the tiles': the weights' bf16 rounding)
KILN_CUDA_GEMM90_ABOVE=8 check w4a16-g64-bf16-fast-g90 0.0156 --quant w4a16 --quant-group 64 --dtype bf16
# fp8 and w8a8: x quantized a token at a time in the kernel (kcu_pro_xq), e4m3 or i8 codes; exact (f32 x) and
# fast (bf16 x: the prefill's tensor cores take x's codes times its scale rounded to bf16). Quantizing x
# magnifies the summation order's last bits: where the GPU's x and the interpreter's differ by an f32 (or
# half) rounding across a code boundary, that element moves a whole step (e4m3: 1/16 of its value; i8:
# 1/127 of the row's amax), hence tolerances above the weight-only schemes' (measured here: fp8 1.6e-3 exact,
# 0.051 fast; w8a8 3.7e-7 exact, 0.029 fast)
check fp8-f32 5e-3 --quant fp8
check w8a8-f32 1e-3 --quant w8a8
# (fast: without sm_90a's kcu_gemm90, KILN_CUDA_GEMM90=0, the prefill of an sm_80 or sm_89 engine)
KILN_CUDA_GEMM90=0 check fp8-bf16-fast 0.08 --quant fp8 --dtype bf16
KILN_CUDA_GEMM90=0 check w8a8-bf16-fast 0.05 --quant w8a8 --dtype bf16
# the same prompt's prefill on kcu_gemm90 (the 40-token step, above the decode kernel's 32, runs the sm_90a
# variant): both operands' codes multiplied exactly, sums scaled by x's row scale and the weight row's (the
# emulator's f32 sums; measured here 2.1e-5 fp8, 2.3e-5 w8a8: no x element crossed a code boundary; one that
# does moves a step, hence the weight-only tolerance)
check fp8-bf16-fast-g90 0.0156 --quant fp8 --dtype bf16
check w8a8-bf16-fast-g90 0.0156 --quant w8a8 --dtype bf16
# a KV cache of int8 or fp8 codes (--kv-dtype): each (position, KV head) row's codes and scale written by a warp
# (the row's amax, as the interpreter's kir_kv_round), attention reading codes times scale (exact precision:
# kcu_attention_kernel in f32; fast: the tensor-core kernels, each value rounded to bf16 as it is staged, as the
# interpreter models it); the same values in the cache as the interpreter's, so the tolerances of the weights
# alone, but for a k or v element that the GPU's other summation order puts across a code boundary: that code
# moves a whole step (int8: 1/127 of its row's amax), and every later row that attends to it moves ~1e-3 (measured
# here with this prompt: int8 f32 4.7e-7; fp8 bf16 fast 1.3e-3, int8 bf16 fast 2.1e-3, each from position 16 on;
# a 12-token prompt on the decode kernels: int8 f32 1.4e-3 from position 6 on, fading to 1e-5 by position 20)
check kv-int8-f32 5e-3 --kv-dtype int8
check kv-fp8-bf16-fast 0.0156 --kv-dtype fp8 --dtype bf16
check kv-int8-w4a16-bf16-fast 0.0156 --kv-dtype int8 --quant w4a16 --dtype bf16
# forked sequences (copy-on-write of a shared, half-full block: the codes and their scales) against the interpreter
d="$work/kv-int8-f32"
if [ -f "$d/kernels.so" ]; then
  KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$d/kernels.so" "$KILN_TEST_CUDA" --fork-check "$d/cuda.engine" \
    "$d/cpu.engine" && passes=$((passes+1)) || { echo "FAIL: kv-int8: forked sequences"; failures=$((failures+1)); }
fi
# the same fraction of free memory holds more blocks of codes: TinyStories-656K's heads of 16 dims take 2 x 16
# bytes a (position, head) in bf16 and 16 + 4 (its scale) in int8: 1.6x the blocks (the 8B's heads of 128: 1.94x)
blocks() {
  KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/$1/kernels.so" "$KILN_BIN" run "$work/$1/cuda.engine" --ids 1,2,3 \
    -n 1 --kv-fraction 0.0001 2>&1 >/dev/null | sed -n 's/.*KV cache on .*: \([0-9]*\) blocks.*/\1/p'
}
b16=$(blocks w8a16-bf16-fast) b8=$(blocks kv-fp8-bf16-fast)
expect_same "KV blocks: fp8 codes over bf16 at one fraction, 1.6x" ok \
  "$(python3 -c "import sys; r = int(sys.argv[2]) / int(sys.argv[1]); print('ok' if 1.55 <= r <= 1.65 else r)" \
     "${b16:-1}" "${b8:-0}")"
# batch invariance (issue #11): a sequence's decode steps alone, among 7 and among 31 others, bitwise the same
# (tests/session's test_session over the emulator: its decode steps of 1, 8 and 32 tokens on kcu_matmul_q;
# fp8's x scales are each token's own; a cache of codes: each row's scale its own)
for name in w4a16-g64-bf16-fast fp8-bf16-fast kv-int8-w4a16-bf16-fast; do
d="$work/$name"
if [ -f "$d/kernels.so" ]; then
  out=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$d/kernels.so" "$KILN_TEST_SESSION" "$d/cuda.engine")
  rc=$?
  echo "$out" | grep -E "batch invariance"
  [ $rc -eq 0 ] && passes=$((passes+1)) || { echo "FAIL: test_session on the quantized engine (exit $rc)"; echo "$out" | tail -5; failures=$((failures+1)); }
fi
done
finish

#!/usr/bin/env bash
# cuda_flash_golden.sh MODEL_DIR OUT_DIR — a shared model's f32 engine built with the tensor-core
# prefill attention forced on an exact engine (KILN_CUDA_FLASH_PREFILL=1: kcu_options.flash_prefill;
# fast-precision engines take it by themselves: cuda_emu_golden_*-fast), its kernels run on the CPU (g++ with emu_shim.h) behind emu_libcuda: golden_test's
# prompts of more than 32 tokens, and its step of all prompts interleaved, go through
# kcu_flash_attention (bf16 products, f32 softmax), the rest through today's kernel. Every row
# within the model's bf16 tolerance (half_tolerances.txt: twice Hugging Face's own bf16 error);
# greedy ids reported. Checks that the engine has the kernel and launches it on its own grid.
# Skips (77) without NVRTC or g++.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_GOLDEN_TEST:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1" out="$2"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
tol=$(awk -v m="$(basename "$model")" '$1 == m { print $2 }' "$(dirname "$0")/half_tolerances.txt")
[ -n "$tol" ] || { echo "FAIL: no bf16 tolerance for $(basename "$model") in half_tolerances.txt"; exit 1; }
rm -rf "$out" && mkdir -p "$out" || { echo "FAIL: cannot make $out"; exit 1; }
model_args "$model"
# for sm_90 alone: the emulated run takes the sm_90 variants; the kernel's code takes the same
# branches for sm_80 (__CUDA_ARCH__ >= 800 holds for both), and the fast engines, which take it
# by themselves, compile it for sm_80 too
KILN_CUDA_FLASH_PREFILL=1 "$KILN_BIN" build "${args[@]}" --target sm_90 --emit-source "$out/src" \
  -o "$out/cuda.engine" || { echo "FAIL: kiln build --target sm_90 (flash prefill)"; exit 1; }
grep -q 'kcu_flash_attention<' "$out"/src/*.cu || { echo "FAIL: no kcu_flash_attention in the source"; exit 1; }
grep -aq '_large","above":32,"per_seq":true,"grid":' "$out/cuda.engine" \
  || { echo "FAIL: the attention's _large variant has no grid, or is not chosen by sequence"; exit 1; }
compile_kernels "$out/src" "$out/kernels.so" || { echo "FAIL: g++ $out/src"; exit 1; }
KILN_GOLDEN_TOL=$tol KILN_GOLDEN_TARGET=sm_90 KILN_GOLDEN_PREBUILT=1 KILN_CUDA_LIB="$KILN_EMU_LIB" \
  KILN_EMU_KERNELS="$out/kernels.so" "$KILN_GOLDEN_TEST" "$model" "$out/cuda.engine"

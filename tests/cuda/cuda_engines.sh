#!/usr/bin/env bash
# cuda_engines.sh MODEL_DIR DTYPE OUT_DIR TARGET — the setup test that builds a shared model's CUDA
# engine (for TARGET, e.g. sm_80,sm_90, with DTYPE weights: f32, bf16 or f16, or bf16-fast and
# f16-fast for --precision fast, half values between kernels and a half KV cache), its source, its kernels for the CPU
# stand-in and its CPU engine into OUT_DIR, for the tests that use them (cuda_lib.sh says which
# files). OUT_DIR is emptied first: nothing of an earlier run is ever used. Without NVRTC there is
# nothing to build: it says so and passes, and the tests that need the engine check what kiln says
# without NVRTC and skip.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
model="$1" dtype="$2" out="$3" target="$4"
precision=exact
case "$dtype" in *-fast) dtype=${dtype%-fast} precision=fast ;; esac
rm -rf "$out" && mkdir -p "$out" || { echo "FAIL: cannot make $out"; exit 1; }
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ]; then
  echo "note: built without NVRTC: no CUDA engine to build"; exit 0
fi
model_args "$model"
# fast engines take kcu_gemm90 (sm_90a) for steps of more than 8 tokens, not 64, so that the tests'
# prompts run it (through its CPU stand-in) on an emulated sm_90 and mma.sync on an emulated sm_80
gemm90_above=
[ $precision = fast ] && gemm90_above=8
# (--stats: the passes' counts and the kernels' tiles, into stats.txt for cuda_fast.sh)
KILN_CUDA_GEMM90_ABOVE=$gemm90_above \
"$KILN_BIN" build "${args[@]}" --target "$target" --dtype "$dtype" --precision $precision --emit-source "$out/src" \
  --stats -o "$out/cuda.engine" >"$out/stats.txt" \
  || { echo "FAIL: kiln build --target $target --dtype $dtype --precision $precision"; exit 1; }
echo "$target" >"$out/target"
"$KILN_BIN" build "${args[@]}" --dtype "$dtype" --precision $precision -o "$out/cpu.engine" \
  || { echo "FAIL: kiln build --dtype $dtype --precision $precision"; exit 1; }
if [ -n "${KILN_GXX:-}" ]; then
  compile_kernels "$out/src" "$out/kernels.so" || { echo "FAIL: g++ $out/src"; exit 1; }
else
  echo "note: no g++: the kernels are not compiled for the CPU"
fi
echo "built $out"

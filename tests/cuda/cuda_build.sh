#!/usr/bin/env bash
# cuda_build.sh MODEL_DIR — a shared model built for the CUDA target (needs NVRTC; skips with 77
# otherwise, after checking what kiln says without it):
#  - `kiln build --target sm_80,sm_90` holds cuda.meta and an ELF cubin for each architecture;
#    its weights are f32; two builds are byte-identical;
#  - the --emit-source output compiles with nvcc -cubin (when nvcc is found);
#  - that source compiled for the CPU (g++, emu_shim.h), run through the CUDA backend over
#    emu_libcuda, generates the interpreter's tokens with its logits within 1e-5, also for forked
#    sequences whose shared KV block is copied on write (when g++ is found);
#  - the same with --dtype bf16 and --dtype f16: every weight of that dtype, stored at 2 bytes an
#    element, and the emulated CUDA engine against the interpreter running the same
#    half-precision engine built for the CPU (same tokens, logits within 1e-5);
#  - --dtype with an unknown name fails with its message.
. "$(dirname "$0")/../cli/lib.sh"
: "${KILN_TEST_CUDA:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1"
if [ -f "$model/config.json" ]; then
  args=("$model")
else # a llama2.c checkpoint and its tokenizer
  ckpt=$(ls "$model"/*.bin | grep -v '/tok[^/]*\.bin$' | head -1)
  args=("$ckpt")
  tok=$(ls "$model"/tok*.bin 2>/dev/null | head -1)
  [ -n "$tok" ] && args+=(--tokenizer "$tok")
fi

expect_fail bad-dtype "kiln: error: --dtype f8: unknown weight dtype (known: f32, bf16, f16)" \
  -- "$KILN_BIN" build "${args[@]}" --dtype f8 -o "$work/bad.engine"

if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ]; then
  expect_fail no-nvrtc "kiln: error: target sm_80: this kiln was built without NVRTC (CMake found no libnvrtc), so it cannot compile CUDA kernels" \
    -- "$KILN_BIN" build "${args[@]}" --target sm_80,sm_90 -o "$work/a.engine"
  finish || exit 1
  echo "skipped: built without NVRTC"; exit 77
fi

# emulate DTYPE ENGINE SRC_DIR CPU_ENGINE: the engine's kernels (from SRC_DIR) on the CPU stand-in
# against the interpreter running CPU_ENGINE
emulate() {
  local dtype="$1" engine="$2" src="$3" cpu="$4" ids=1,7,12,31,5,9,40,2,11 want got
  "$KILN_GXX" -O2 -w -fno-strict-aliasing -shared -fPIC -include "$KILN_EMU_SHIM" -x c++ "$src"/*.cu \
    -o "$work/kernels.$dtype.so" || { echo "FAIL: g++ $src ($dtype)"; failures=$((failures+1)); return; }
  want=$("$KILN_BIN" run "$cpu" --ids $ids -n 6 --logits-out "$work/cpu.$dtype.f32" 2>/dev/null)
  got=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/kernels.$dtype.so" \
        "$KILN_BIN" run "$engine" --ids $ids -n 6 --logits-out "$work/cuda.$dtype.f32" 2>/dev/null)
  expect_same "greedy ids through the CUDA backend ($dtype weights)" "$want" "$got"
  "$KILN_TEST_CUDA" --compare "$work/cuda.$dtype.f32" "$work/cpu.$dtype.f32" 1e-5 && passes=$((passes+1)) \
    || { echo "FAIL: logits differ from the interpreter's ($dtype weights)"; failures=$((failures+1)); }
}

"$KILN_BIN" build "${args[@]}" --target sm_80,sm_90 --emit-source "$work/src" -o "$work/a.engine" \
  && "$KILN_BIN" build "${args[@]}" --target sm_80,sm_90 -o "$work/b.engine" || { echo "FAIL build"; exit 1; }
cmp -s "$work/a.engine" "$work/b.engine" && passes=$((passes+1)) || { echo "FAIL: two builds differ"; failures=$((failures+1)); }
"$KILN_TEST_CUDA" --check-engine "$work/a.engine" f32 sm_80 sm_90 && passes=$((passes+1)) || { echo "FAIL: CUDA sections"; failures=$((failures+1)); }
src=$(ls "$work"/src/*.cu)

if [ -n "${KILN_NVCC:-}" ]; then
  "$KILN_NVCC" -cubin -arch=sm_90 --fmad=false "$src" -o "$work/nvcc.cubin" \
    && passes=$((passes+1)) || { echo "FAIL: nvcc -cubin $src"; failures=$((failures+1)); }
else
  echo "note: no nvcc: the emitted source is not compiled with it"
fi

if [ -n "${KILN_GXX:-}" ]; then
  "$KILN_BIN" build "${args[@]}" -o "$work/cpu.engine" || { echo "FAIL cpu build"; exit 1; }
  emulate f32 "$work/a.engine" "$work/src" "$work/cpu.engine"
  KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/kernels.f32.so" \
    "$KILN_TEST_CUDA" --fork-check "$work/a.engine" "$work/cpu.engine" && passes=$((passes+1)) \
    || { echo "FAIL: forked sequences"; failures=$((failures+1)); }
else
  echo "note: no g++: the kernels are not run on the CPU"
fi

for dtype in bf16 f16; do
  "$KILN_BIN" build "${args[@]}" --target sm_80,sm_90 --dtype $dtype --emit-source "$work/src.$dtype" \
    -o "$work/$dtype.engine" || { echo "FAIL build --dtype $dtype"; failures=$((failures+1)); continue; }
  "$KILN_TEST_CUDA" --check-engine "$work/$dtype.engine" $dtype sm_80 sm_90 && passes=$((passes+1)) \
    || { echo "FAIL: $dtype engine"; failures=$((failures+1)); }
  if [ -n "${KILN_GXX:-}" ]; then
    "$KILN_BIN" build "${args[@]}" --dtype $dtype -o "$work/cpu.$dtype.engine" || { echo "FAIL cpu build $dtype"; exit 1; }
    emulate $dtype "$work/$dtype.engine" "$work/src.$dtype" "$work/cpu.$dtype.engine"
  fi
done
finish

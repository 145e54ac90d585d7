#!/usr/bin/env bash
# cuda_build.sh MODEL_DIR ENGINES [DTYPE...] — a shared model built for the CUDA target (needs NVRTC;
# skips with 77 otherwise, after checking what kiln says without it). ENGINES holds the engines the
# cuda_engines_<model>_<dtype> setup tests built (cuda_lib.sh), for the DTYPEs (default f32 bf16 f16;
# f32 comes first):
#  - `kiln build --target sm_80,sm_90` holds cuda.meta and an ELF cubin for each architecture;
#    its weights are f32; a second build is byte-identical to the first (its cubins from the
#    tests' cubin cache, but for the model whose test sets KILN_BUILD_AGAIN_UNCACHED=1);
#  - the --emit-source output compiles with nvcc -cubin (when nvcc is found);
#  - that source compiled for the CPU (g++, emu_shim.h), run through the CUDA backend over
#    emu_libcuda, generates the interpreter's tokens with its logits within 1e-5, also for forked
#    sequences whose shared KV block is copied on write (when g++ is found);
#  - the same with --dtype bf16 and --dtype f16: every weight of that dtype, stored at 2 bytes an
#    element, and the emulated CUDA engine against the interpreter running the same
#    half-precision engine built for the CPU (same tokens, logits within 1e-5); a cubin for each
#    architecture its setup test built for (sm_90 alone: tests/cuda/CMakeLists.txt says why);
#  - --dtype with an unknown name fails with its message.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_TEST_CUDA:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1" engines="$2"
shift 2
dtypes="${*:-f32 bf16 f16}"
[ "${dtypes%% *}" = f32 ] || { echo "FAIL: the dtypes ($dtypes) must begin with f32"; exit 1; }
model_args "$model"

expect_fail bad-dtype "kiln: error: --dtype f8: unknown weight dtype (known: f32, bf16, f16)" \
  -- "$KILN_BIN" build "${args[@]}" --dtype f8 -o "$work/bad.engine"

if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ]; then
  expect_fail no-nvrtc "kiln: error: target sm_80: this kiln was built without NVRTC (CMake found no libnvrtc), so it cannot compile CUDA kernels" \
    -- "$KILN_BIN" build "${args[@]}" --target sm_80,sm_90 -o "$work/a.engine"
  finish || exit 1
  echo "skipped: built without NVRTC"; exit 77
fi
for dtype in $dtypes; do have_engine "$engines/$dtype" || exit 1; done

# emulate DTYPE: the engine's kernels on the CPU stand-in against the interpreter running its CPU engine
emulate() {
  local dtype="$1" dir="$engines/$1" ids=1,7,12,31,5,9,40,2,11 want got
  want=$("$KILN_BIN" run "$dir/cpu.engine" --ids $ids -n 6 --logits-out "$work/cpu.$dtype.f32" 2>/dev/null)
  got=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$dir/kernels.so" \
        "$KILN_BIN" run "$dir/cuda.engine" --ids $ids -n 6 --logits-out "$work/cuda.$dtype.f32" 2>/dev/null)
  expect_same_output "greedy ids through the CUDA backend ($dtype weights)" "$want" "$got"
  "$KILN_TEST_CUDA" --compare "$work/cuda.$dtype.f32" "$work/cpu.$dtype.f32" 1e-5 && passes=$((passes+1)) \
    || { echo "FAIL: logits differ from the interpreter's ($dtype weights)"; failures=$((failures+1)); }
}

# the setup test's f32 engine, built again: the same bytes (its cubins from the tests' cubin cache,
# KILN_CUDA_CACHE, when the source is the same; with KILN_BUILD_AGAIN_UNCACHED=1, compiled again by
# NVRTC: one model's test checks that NVRTC's cubins are reproducible too)
read -r target <"$engines/f32/target"
[ "$target" = sm_80,sm_90 ] || { echo "FAIL: the f32 engine is for $target, not sm_80,sm_90"; exit 1; }
cache=${KILN_CUDA_CACHE:-}
[ "${KILN_BUILD_AGAIN_UNCACHED:-}" = 1 ] && cache=
KILN_CUDA_CACHE=$cache "$KILN_BIN" build "${args[@]}" --target "$target" -o "$work/again.engine" \
  || { echo "FAIL build"; exit 1; }
cmp -s "$engines/f32/cuda.engine" "$work/again.engine" && passes=$((passes+1)) \
  || { echo "FAIL: two builds differ"; failures=$((failures+1)); }
src=$(ls "$engines"/f32/src/*.cu)

if [ -n "${KILN_NVCC:-}" ]; then
  "$KILN_NVCC" -cubin -arch=sm_90 --fmad=false "$src" -o "$work/nvcc.cubin" \
    && passes=$((passes+1)) || { echo "FAIL: nvcc -cubin $src"; failures=$((failures+1)); }
else
  # (not given in a sanitizer build, whose emitted source is the plain build's)
  echo "note: no nvcc: the emitted source is not compiled with it"
fi

for dtype in $dtypes; do
  read -r target <"$engines/$dtype/target"
  "$KILN_TEST_CUDA" --check-engine "$engines/$dtype/cuda.engine" $dtype ${target//,/ } && passes=$((passes+1)) \
    || { echo "FAIL: $dtype engine ($target)"; failures=$((failures+1)); }
  if [ -n "${KILN_GXX:-}" ]; then
    emulate $dtype
  fi
done
if [ -n "${KILN_GXX:-}" ]; then
  KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$engines/f32/kernels.so" \
    "$KILN_TEST_CUDA" --fork-check "$engines/f32/cuda.engine" "$engines/f32/cpu.engine" && passes=$((passes+1)) \
    || { echo "FAIL: forked sequences"; failures=$((failures+1)); }
else
  echo "note: no g++: the kernels are not run on the CPU"
fi
finish

#!/usr/bin/env bash
# cuda_emu_golden.sh MODEL_DIR [DTYPE] — tests/golden's golden_test through the CUDA backend: the
# engine is built for sm_90 (with DTYPE weights: f32, the default, bf16 or f16), its kernels run on
# the CPU (g++ with emu_shim.h) behind emu_libcuda, a CPU stand-in for libcuda. Covers the
# backend's host side (KV blocks in "device" memory, block tables, many sequences in one step,
# greedy decoding through the cache) and the kernels' semantics. f32: every row within 1e-4 of the
# golden and greedy ids exact; bf16, f16: rows within half_tolerances.txt (twice Hugging Face's own
# error in that dtype). Skips (77) without NVRTC or g++.
. "$(dirname "$0")/../cli/lib.sh"
: "${KILN_GOLDEN_TEST:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1" dtype="${2:-f32}"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
if [ "$dtype" != f32 ]; then
  col=$([ "$dtype" = bf16 ] && echo 2 || echo 3)
  tol=$(awk -v m="$(basename "$model")" -v c=$col '$1 == m { print $c }' "$(dirname "$0")/half_tolerances.txt")
  [ -n "$tol" ] || { echo "FAIL: no $dtype tolerance for $(basename "$model") in half_tolerances.txt"; exit 1; }
  export KILN_GOLDEN_DTYPE=$dtype KILN_GOLDEN_TOL=$tol
fi
"$KILN_BIN" build "$model" --target sm_90 --dtype "$dtype" --emit-source "$work/src" -o "$work/k.engine" \
  || { echo "FAIL build"; exit 1; }
"$KILN_GXX" -O2 -w -fno-strict-aliasing -shared -fPIC -include "$KILN_EMU_SHIM" -x c++ "$work"/src/*.cu \
  -o "$work/kernels.so" || { echo "FAIL: g++"; exit 1; }
# the engine just built (its kernels are the ones compiled for the CPU): golden_test opens it as it is
KILN_GOLDEN_TARGET=sm_90 KILN_GOLDEN_PREBUILT=1 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/kernels.so" \
  "$KILN_GOLDEN_TEST" "$model" "$work/k.engine"

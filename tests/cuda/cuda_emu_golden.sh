#!/usr/bin/env bash
# cuda_emu_golden.sh MODEL_DIR ENGINES [DTYPE] — tests/golden's golden_test through the CUDA
# backend: the engine the cuda_engines_<model>_<dtype> setup test built (cuda_lib.sh: sm_80 and
# sm_90, DTYPE weights: f32, the default, bf16 or f16; bf16-fast and f16-fast: --precision fast,
# within the same half tolerances as tests/golden's golden_<model>_<dtype>_fast), its kernels run on the CPU (g++ with
# emu_shim.h) behind emu_libcuda, a CPU stand-in for libcuda (an sm_90 device). Covers the
# backend's host side (KV blocks in "device" memory, block tables, many sequences in one step,
# greedy decoding through the cache) and the kernels' semantics. f32: every row within 1e-4 of the
# golden and greedy ids exact; bf16, f16: rows within half_tolerances.txt (twice Hugging Face's own
# error in that dtype). Skips (77) without NVRTC or g++.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_GOLDEN_TEST:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1" engines="$2" dtype="${3:-f32}"
dir="$engines/$dtype"
export KILN_GOLDEN_PRECISION=exact # the setup test's engines: DTYPE exact, DTYPE-fast fast
case "$dtype" in *-fast) dtype=${dtype%-fast}; export KILN_GOLDEN_PRECISION=fast ;; esac
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
if [ "$dtype" != f32 ]; then
  col=$([ "$dtype" = bf16 ] && echo 2 || echo 3)
  tol=$(awk -v m="$(basename "$model")" -v c=$col '$1 == m { print $c }' "$(dirname "$0")/half_tolerances.txt")
  [ -n "$tol" ] || { echo "FAIL: no $dtype tolerance for $(basename "$model") in half_tolerances.txt"; exit 1; }
  export KILN_GOLDEN_DTYPE=$dtype KILN_GOLDEN_TOL=$tol
fi
have_engine "$dir" || exit 1
# the engine as built (its kernels are the ones compiled for the CPU): golden_test opens it as it is
KILN_GOLDEN_TARGET=sm_90 KILN_GOLDEN_PREBUILT=1 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$dir/kernels.so" \
  "$KILN_GOLDEN_TEST" "$model" "$dir/cuda.engine"

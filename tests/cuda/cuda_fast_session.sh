#!/usr/bin/env bash
# cuda_fast_session.sh ENGINE_DIR — tests/session's test_session on a fast-precision CUDA engine
# (kiln build --precision fast, the cuda_engines_<model>_bf16-fast setup test's) over the CPU
# stand-in: its decode steps on kcu_matmul_tc and kcu_flash_decode, a sequence decoded alone, among
# 7 and among 31 others bitwise equal (issue #11's batch invariance; bench/gpu_check.sh's profile
# stage runs the same on the GPU for the 8B shape), and its graphs, draws and failures checks.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_EMU_LIB:?}" "${KILN_TEST_SESSION:?}"
engine_dir="$1"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
have_engine "$engine_dir" || exit 1
grep -q "kcu_flash_decode<" "$engine_dir"/src/*.cu && passes=$((passes+1)) \
  || { echo "FAIL: the fast engine's attention has no kcu_flash_decode"; failures=$((failures+1)); }
out=$(KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$engine_dir/kernels.so" "$KILN_TEST_SESSION" "$engine_dir/cuda.engine")
rc=$?
echo "$out" | grep -E "batch|session"
[ $rc -eq 0 ] && passes=$((passes+1)) || { echo "FAIL: test_session on the fast engine (exit $rc)"; failures=$((failures+1)); }
finish

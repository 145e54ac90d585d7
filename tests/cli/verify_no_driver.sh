#!/usr/bin/env bash
# kiln verify --target sm_XX runs the fused engine on the GPU: without the NVIDIA driver it says
# so at once, before it compiles anything (nothing on stdout: no build was made or run). A
# driver library that does not exist (KILN_CUDA_LIB, as the CUDA tests point it elsewhere) tests
# this on every machine; the real libcuda.so.1 only where it cannot be loaded.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
# no_driver NAME LIB: verify with the driver library LIB missing
no_driver() {
  local out rc
  out=$(KILN_CUDA_LIB="$2" "$KILN_BIN" verify "$ts" --target sm_90 2>"$work/err"); rc=$?
  expect_same "$1: exit status" 1 "$rc"
  expect_same "$1: nothing compiled or run" "" "$out"
  expect_same "$1: message" "cuda: error: cannot load the NVIDIA driver library $2 ($2: cannot open shared object file: No such file or directory): running a CUDA engine needs an NVIDIA GPU and its driver" "$(cat "$work/err")"
}
no_driver "missing library" "$work/no-such/libcuda.so.1"
if python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
  echo "note: libcuda.so.1 loads here (a GPU machine): the check without KILN_CUDA_LIB is skipped"
else
  no_driver "no libcuda.so.1" libcuda.so.1
fi
finish

#!/usr/bin/env bash
# cuda_emu_golden.sh MODEL_DIR — tests/golden's golden_test through the CUDA backend: the engine
# is built for sm_90, its kernels run on the CPU (g++ with emu_shim.h) behind emu_libcuda, a CPU
# stand-in for libcuda. Covers the backend's host side (KV blocks in "device" memory, block
# tables, many sequences in one step, greedy decoding through the cache) and the kernels'
# semantics. Skips (77) without NVRTC or g++.
. "$(dirname "$0")/../cli/lib.sh"
: "${KILN_GOLDEN_TEST:?}" "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}"
model="$1"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
"$KILN_BIN" build "$model" --target sm_90 --emit-source "$work/src" -o "$work/k.engine" || { echo "FAIL build"; exit 1; }
"$KILN_GXX" -O2 -w -shared -fPIC -include "$KILN_EMU_SHIM" -x c++ "$work"/src/*.cu -o "$work/kernels.so" \
  || { echo "FAIL: g++"; exit 1; }
KILN_GOLDEN_TARGET=sm_90 KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/kernels.so" \
  "$KILN_GOLDEN_TEST" "$model" "$work/golden.engine"

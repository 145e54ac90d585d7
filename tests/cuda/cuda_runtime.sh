#!/usr/bin/env bash
# cuda_runtime.sh MODEL_DIR — the CUDA backend's runtime over emu_libcuda (the CPU stand-in
# for libcuda; the engine's kernels compiled for the CPU with g++, alignment checked): skips
# (77) without NVRTC or g++.
#  - tests/session's test_session on the CUDA engine: per-sequence failures, draws on the
#    device against the CPU sampler, steps with and without CUDA graphs bitwise equal;
#  - kiln run: graphs replayed (the stand-in counts them) and the same logits without them;
#    draws on the device equal to --host-sampling's and to the CPU engine's greedy ids;
#    the KV cache sized from the device's free memory and reported; out-of-memory messages
#    (a KV cache that cannot fit, weights that cannot fit); the context limit;
#  - kiln verify --target sm_90: the fused CUDA engine against the unfused interpreter.
. "$(dirname "$0")/../cli/lib.sh"
: "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}" "${KILN_TEST_SESSION:?}"
model="$1"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
"$KILN_BIN" build "$model" --target sm_90 --emit-source "$work/src" -o "$work/cu.engine" \
  && "$KILN_BIN" build "$model" -o "$work/cpu.engine" || { echo "FAIL build"; exit 1; }
# with alignment checks: a GPU faults on a misaligned access that the CPU forgives
"$KILN_GXX" -O2 -w -shared -fPIC -fno-strict-aliasing -fsanitize=alignment -fno-sanitize-recover=alignment \
  -include "$KILN_EMU_SHIM" -x c++ "$work"/src/*.cu -o "$work/kernels.so" || { echo "FAIL: g++"; exit 1; }
export KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$work/kernels.so"
cu="$work/cu.engine"

"$KILN_TEST_SESSION" "$cu" && passes=$((passes+1)) || { echo "FAIL: test_session on the CUDA engine"; failures=$((failures+1)); }

# graphs: captured and replayed, and the same bits as launching each kernel
ids=1,7,12,31,5,9,40,2,11
a=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/g.f32" 2>"$work/g.err")
b=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/n.f32" --no-cuda-graphs 2>"$work/n.err")
expect_same "ids with and without graphs" "$a" "$b"
cmp -s "$work/g.f32" "$work/n.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ without graphs"; failures=$((failures+1)); }
expect_same "graphs used" "2 graphs captured, 6 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/g.err")"
expect_same "no graphs" "0 graphs captured, 0 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/n.err")"

# draws on the device: the host's, and the CPU engine's greedy ids
for smp in "--temperature 0" "--temperature 0.8 --top-k 40 --top-p 0.95 --seed 3" "--temperature 1.2 --seed 9"; do
  dev=$("$KILN_BIN" run "$cu" --ids 1,7 -n 8 $smp 2>/dev/null)
  host=$("$KILN_BIN" run "$cu" --ids 1,7 -n 8 $smp --host-sampling 2>/dev/null)
  expect_same "draws on the device ($smp) = on the host" "$host" "$dev"
done
expect_same "greedy ids = the CPU engine's" "$("$KILN_BIN" run "$work/cpu.engine" --ids $ids -n 6 2>/dev/null)" "$a"

# the KV cache from the device's free memory, reported on stderr
err=$("$KILN_BIN" run "$cu" --ids 1 -n 1 2>&1 >/dev/null | head -1)
[[ "$err" =~ ^kiln:\ KV\ cache\ on\ kiln\ CPU\ emulator:\ 512\ blocks\ of\ 16\ positions\ \(8\.0\ MiB\),\ at\ most\ 0\.9\ of\ the\ 8\.0\ GiB\ free$ ]] \
  && passes=$((passes+1)) || { echo "FAIL: KV report: $err"; failures=$((failures+1)); }
# a small device: fewer blocks than a full context of 16 sequences needs
err=$(KILN_EMU_MEM=8M "$KILN_BIN" run "$cu" --ids 1 -n 1 --kv-fraction 0.5 2>&1 >/dev/null | head -1)
[[ "$err" =~ ^kiln:\ KV\ cache\ on\ kiln\ CPU\ emulator:\ [0-9]+\ blocks\ of\ 16\ positions\ \([0-9.]+\ MiB\),\ at\ most\ 0\.5\ of\ the\ [0-9.]+\ MiB\ free$ ]] \
  && [ "$(echo "$err" | awk '{print $8}')" -lt 512 ] && passes=$((passes+1)) \
  || { echo "FAIL: KV report on a small device: $err"; failures=$((failures+1)); }
err=$("$KILN_BIN" run "$cu" --ids 1 -n 1 --kv-blocks 100 2>&1 >/dev/null | head -1)
expect_same "KV report, blocks asked" "kiln: KV cache on kiln CPU emulator: 100 blocks of 16 positions (1.6 MiB), as asked" "$err"

# out of memory: clear errors, no crash
expect_fail kv-does-not-fit "kiln: error: a KV cache of 1000000 blocks (15.3 GiB) does not fit in the " -- \
  "$KILN_BIN" run "$cu" --ids 1 --kv-blocks 1000000
expect_fail kv-does-not-fit-end "free on the device (kiln CPU emulator): ask for fewer blocks, or leave the size to the KV-cache fraction" -- \
  "$KILN_BIN" run "$cu" --ids 1 --kv-blocks 1000000
expect_fail weights-do-not-fit "bytes for the weights: CUDA_ERROR_OUT_OF_MEMORY: out of memory" -- \
  env KILN_EMU_MEM=1M "$KILN_BIN" run "$cu" --ids 1
expect_fail acts-do-not-fit "bytes of activations for 64 tokens: CUDA_ERROR_OUT_OF_MEMORY: out of memory" -- \
  env KILN_EMU_MEM=8M "$KILN_BIN" run "$cu" --ids 1,2 -n 2 --kv-fraction 1
expect_fail over-limit "kiln: error: a context of 600 positions is over the engine's limit of 512" -- \
  "$KILN_BIN" run "$cu" --ids 1 --max-context 600

# verify on the CUDA backend: every value the engine computes, copied back and compared
out=$("$KILN_BIN" verify "$model" --target sm_90 --tokens 12 --steps 2); rc=$?
echo "$out"
[ $rc -eq 0 ] && [[ "$out" == *"the fused engine (sm_90) on the CUDA backend"* ]] && [[ "$out" == *"OK: within tolerance"* ]] \
  && passes=$((passes+1)) || { echo "FAIL: kiln verify --target sm_90 (exit $rc)"; failures=$((failures+1)); }
finish

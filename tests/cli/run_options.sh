#!/usr/bin/env bash
# kiln run's session options on the CPU: the context limit, the KV-cache size flags and what
# happens when the cache runs out, each with its message; --profile's step times.
# (The same flags on a CUDA engine: tests/cuda/cuda_runtime.sh.)
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ts" -o "$work/ts.engine" || { echo "FAIL: build"; exit 1; }
e="$work/ts.engine"

expect_fail over-limit "kiln: error: a context of 600 positions is over the engine's limit of 512" -- \
  "$KILN_BIN" run "$e" --ids 1,2,3 --max-context 600
expect_fail prompt-over-context "kiln: error: the prompt has 9 tokens, more than the 8 the context has left" -- \
  "$KILN_BIN" run "$e" --ids "$(seq -s, 1 9)" --max-context 8
expect_fail fraction-range "kiln run: error: --kv-fraction: '1.5' is not a number in (0, 1]" -- \
  "$KILN_BIN" run "$e" --ids 1 --kv-fraction 1.5
expect_fail fraction-zero "kiln run: error: --kv-fraction: '0' is not a number in (0, 1]" -- \
  "$KILN_BIN" run "$e" --ids 1 --kv-fraction 0
expect_fail both-sizes "kiln run: error: --kv-fraction and --kv-blocks both size the KV cache: give one" -- \
  "$KILN_BIN" run "$e" --ids 1 --kv-blocks 4 --kv-fraction 0.5
expect_fail blocks-range "kiln run: error: --kv-blocks: '0' is not an integer from 1 to 2147483647" -- \
  "$KILN_BIN" run "$e" --ids 1 --kv-blocks 0

# two blocks of 16 positions: a 40-token prompt does not fit; a 30-token one runs until position 32
expect_fail prompt-out-of-blocks "kiln: error: sequence 0: out of KV cache blocks (2 of 2 blocks free)" -- \
  "$KILN_BIN" run "$e" --ids "$(seq -s, 1 40)" --kv-blocks 2
out=$("$KILN_BIN" run "$e" --ids "$(seq -s, 1 30)" -n 5 --kv-blocks 2 2>"$work/err"); rc=$?
want=$("$KILN_BIN" run "$e" --ids "$(seq -s, 1 30)" -n 3 2>/dev/null)
expect_same_output "ids before the cache ran out" "$want" "$out"
expect_same "out of blocks mid-generation" "exit 1: kiln: error: sequence 0: out of KV cache blocks (0 of 2 blocks free)" \
  "exit $rc: $(cat "$work/err")"
# enough blocks: the same ids as an unlimited cache, and no KV report for a cache in host memory
out=$("$KILN_BIN" run "$e" --ids "$(seq -s, 1 30)" -n 3 --kv-blocks 3 --no-cuda-graphs --host-sampling 2>"$work/err")
expect_same_output "three blocks suffice" "$want" "$out"
[[ "$(cat "$work/err")" =~ ^kiln:\ prompt\ tokens\ 30,\ generated\ tokens\ 3, ]] && passes=$((passes+1)) \
  || { echo "FAIL: stderr of a CPU run: $(cat "$work/err")"; failures=$((failures+1)); }

# --profile on the CPU: whole steps timed, prefill (over 8 tokens) and decode apart; kernels are for CUDA engines
out=$("$KILN_BIN" run "$e" --ids "$(seq -s, 1 12)" -n 3 --profile 2>"$work/err")
expect_same_output "ids with --profile" "$("$KILN_BIN" run "$e" --ids "$(seq -s, 1 12)" -n 3 2>/dev/null)" "$out"
expect_same "profile on the CPU" "kiln: profile: 1 prefill step (12 tokens; > 8 tokens a step): host time
kiln: profile: 2 decode steps (2 tokens; <= 8 tokens a step): host time
kiln: profile: kernels are timed on CUDA engines (kiln build --target sm_XX); this one runs on the CPU interpreter, whose steps are timed above" \
  "$(grep '^kiln: profile' "$work/err" | sed 's/: host time .*/: host time/')"
expect_fail ceiling-without-profile "kiln run: error: --profile-ceiling goes with --profile" -- \
  "$KILN_BIN" run "$e" --ids 1 --profile-ceiling 700
expect_fail ceiling-not-a-number "kiln run: error: --profile-ceiling: 'fast' is not a number in [0.001, 1e+06]" -- \
  "$KILN_BIN" run "$e" --ids 1 --profile --profile-ceiling fast

expect_fail verify-target "kiln: error: unknown target 'tpu' (known: cpu, or NVIDIA GPU architectures such as sm_90 or sm_80,sm_90)" -- \
  "$KILN_BIN" verify "$ts" --target tpu
finish

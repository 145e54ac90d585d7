#!/usr/bin/env bash
# The test command (README): builds kiln twice — warnings as errors, and with
# AddressSanitizer + UndefinedBehaviorSanitizer — and runs the whole ctest
# suite under each. Reads the test data at ../shared (or $KILN_SHARED).
# Prints each half's wall time (build, tests) and its slowest tests; ctest's
# --timeout is a guard against hangs, not a limit any test is meant to meet.
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${KILN_SHARED:-$(cd .. && pwd)/shared}"
jobs="$(nproc 2>/dev/null || echo 2)"
summary=""
run_suite() {
  local name="$1" dir="$2"; shift 2
  local start=$SECONDS built rc=0
  cmake -S . -B "$dir" -G Ninja -DKILN_WERROR=ON -DKILN_SHARED_DIR="$shared" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  built=$SECONDS
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 900 2>&1 | tee ctest.log) || rc=$?
  echo "-- $name: slowest tests"
  # ctest's result lines: "12/72 Test #17: cuda_build_gpt2-tiny ....   Passed   88.69 sec"
  sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$dir/ctest.log" \
    | sort -rn | head -10 | awk '{ printf "   %8.2f s  %s\n", $1, $2 }'
  summary+="$(printf '%-26s %4d s (build %d s, tests %d s)' "$name" $((SECONDS - start)) $((built - start)) \
    $((SECONDS - built)))"$'\n'
  echo "-- $name: $((SECONDS - start)) s"
  return $rc
}
echo "== release build (warnings as errors)"
run_suite "release" build-ci -DCMAKE_BUILD_TYPE=Release
echo "== ASan + UBSan build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite "ASan + UBSan" build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON
echo "== wall time"
printf '%s' "$summary"
echo "total                      $SECONDS s"

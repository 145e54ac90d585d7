#!/usr/bin/env bash
# The test command (README): builds kiln twice — warnings as errors, and with
# AddressSanitizer + UndefinedBehaviorSanitizer — and runs the whole ctest
# suite under each. Reads the test data at ../shared (or $KILN_SHARED).
# Prints each half's wall time (build, tests) and its slowest tests; ctest's
# --timeout is a guard against hangs, not a limit any test is meant to meet.
# The sanitized build is compiled at -O1 (as AddressSanitizer's documentation advises for speed: the
# interpreter's loops at -O0 made the allocation-failure test alone take 100 s), which keeps every
# check. What the sanitizer half leaves to the plain one (CI time; the C code of ours
# that these run is run sanitized by other tests, tests/cuda/CMakeLists.txt):
#  - the tests labelled nvrtc_only, whose whole point is NVRTC compiling
#    generated CUDA (NVRTC is not sanitized, and runs 1.5x slower there);
#  - NVRTC's compiles of the engines: both halves share one cubin cache
#    (KILN_CUDA_CACHE, in build-ci), keyed by the whole source, so the
#    sanitized kiln, generating the same sources, reads the cubins the plain
#    half compiled (a source it generated differently is compiled afresh).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${KILN_SHARED:-$(cd .. && pwd)/shared}"
jobs="$(nproc 2>/dev/null || echo 2)"
summary=""
cubins="$PWD/build-ci/cubin-cache"
run_suite() {
  local name="$1" dir="$2" ctest_args="$3"; shift 3
  local start=$SECONDS built rc=0
  cmake -S . -B "$dir" -G Ninja -DKILN_WERROR=ON -DKILN_SHARED_DIR="$shared" -DKILN_TEST_CUBIN_CACHE="$cubins" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  built=$SECONDS
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 900 $ctest_args 2>&1 | tee ctest.log) || rc=$?
  echo "-- $name: slowest tests"
  # ctest's result lines: "12/72 Test #17: cuda_build_gpt2-tiny ....   Passed   88.69 sec"
  sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$dir/ctest.log" \
    | sort -rn | awk 'NR <= 10 { printf "   %8.2f s  %s\n", $1, $2 }' # all read: no SIGPIPE under pipefail
  summary+="$(printf '%-26s %4d s (build %d s, tests %d s)' "$name" $((SECONDS - start)) $((built - start)) \
    $((SECONDS - built)))"$'\n'
  echo "-- $name: $((SECONDS - start)) s"
  return $rc
}
echo "== release build (warnings as errors)"
run_suite "release" build-ci "" -DCMAKE_BUILD_TYPE=Release
echo "== ASan + UBSan build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite "ASan + UBSan" build-asan "-LE nvrtc_only" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
  -DKILN_SANITIZE=ON
echo "== wall time"
printf '%s' "$summary"
echo "total                      $SECONDS s"

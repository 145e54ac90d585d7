#!/usr/bin/env bash
# The test command (README): builds kiln twice — warnings as errors, and with
# AddressSanitizer + UndefinedBehaviorSanitizer — and runs the whole ctest
# suite under each. Reads the test data at ../shared (or $KILN_SHARED).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${KILN_SHARED:-$(cd .. && pwd)/shared}"
jobs="$(nproc 2>/dev/null || echo 2)"
run_suite() {
  local dir="$1"; shift
  cmake -S . -B "$dir" -G Ninja -DKILN_WERROR=ON -DKILN_SHARED_DIR="$shared" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 900)
}
echo "== release build (warnings as errors)"
run_suite build-ci -DCMAKE_BUILD_TYPE=Release
echo "== ASan + UBSan build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON

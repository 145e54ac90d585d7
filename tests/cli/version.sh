#!/usr/bin/env bash
# kiln --version and kiln version: the version (the one the engines record) and what this kiln
# was built with.
. "$(dirname "$0")/lib.sh"
out=$("$KILN_BIN" --version); rc=$?
expect_same "--version exit status" 0 "$rc"
expect_same "kiln version = kiln --version" "$out" "$("$KILN_BIN" version)"
expect_same "first line" "kiln 0.1.0" "$(head -1 <<<"$out")"
[[ "$(sed -n 2p <<<"$out")" =~ ^built\ with:\ gcc\ [0-9]+\.[0-9]+ ]] && passes=$((passes+1)) \
  || { echo "FAIL compiler line: $(sed -n 2p <<<"$out")"; failures=$((failures+1)); }
nvrtc=$(sed -n 3p <<<"$out")
if [ "${KILN_HAVE_NVRTC:-}" = ON ]; then
  [[ "$nvrtc" =~ ^NVRTC:\ [0-9]+\.[0-9]+\ \(kiln\ build\ --target\ sm_[0-9]+\ to\ sm_[0-9]+\)$ ]] && passes=$((passes+1)) \
    || { echo "FAIL NVRTC line: $nvrtc"; failures=$((failures+1)); }
else
  expect_same "NVRTC line" "NVRTC: none (CMake found no libnvrtc): kiln build --target sm_XX is not available" "$nvrtc"
fi
expect_same "lines" 3 "$(wc -l <<<"$out")"
# the engine records the same version
"$KILN_BIN" build --default -o "$work/d.engine" 2>/dev/null || { echo "FAIL build"; exit 1; }
recorded=$("$KILN_BIN" inspect "$work/d.engine" | grep -o '"kiln_version":[[:space:]]*"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')
expect_same "engine's kiln_version" "$(head -1 <<<"$out" | cut -d' ' -f2)" "$recorded"
[[ "$("$KILN_BIN" --help)" == *"  version  "* ]] && passes=$((passes+1)) || { echo "FAIL: --help lists no version"; failures=$((failures+1)); }
finish

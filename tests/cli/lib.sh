# lib.sh — helpers for the command-line tests: run kiln, pin its output.
set -u
: "${KILN_BIN:?}" "${KILN_SHARED:?}"
work=$(mktemp -d)
# The shared model folders kiln reads (tests/CMakeLists.txt: those with a
# golden.json that are not quantized), one per line; stories260k (llama2.c)
# is named where a test wants it.
shared_models() { tr ':' '\n' <<<"${KILN_MODELS:-}" | sed '/^$/d'; }
# require_models: a script that loops over shared_models fails when there are none
require_models() { [ -n "${KILN_MODELS:-}" ] || { echo "FAIL: no shared models (KILN_MODELS is empty)"; exit 1; }; }
trap 'rm -rf "$work"' EXIT
failures=0
passes=0

# expect_fail NAME EXPECTED_STDERR_SUBSTRING -- CMD...: exit must be non-zero,
# stderr must contain the text, nothing may crash (exit >= 128).
# expect_fail_re NAME REGEX -- CMD...: the same, stderr matched by an extended regular expression.
expect_fail() { fail_matching substring "$@"; }
expect_fail_re() { fail_matching regex "$@"; }
fail_matching() {
  local how="$1" name="$2" want="$3"; shift 4
  local err rc match
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
    echo "FAIL $name: exit $rc"; echo "$err" | sed 's/^/    /'; failures=$((failures+1)); return
  fi
  if [ "$how" = regex ]; then [[ "$err" =~ $want ]]; else [[ "$err" == *"$want"* ]]; fi
  match=$?
  if [ $match -ne 0 ]; then
    echo "FAIL $name: message differs"; echo "  want: $want"; echo "$err" | sed 's/^/   got: /'
    failures=$((failures+1)); return
  fi
  passes=$((passes+1))
}

# expect_quiet_build NAME DIR: kiln build DIR succeeds and warns of no checkpoint tensor it leaves unread
expect_quiet_build() {
  local out rc
  out=$("$KILN_BIN" build "$2" -o "$work/quiet.engine" 2>&1); rc=$?
  [ $rc -eq 0 ] && [[ "$out" != *"does not use"* ]] && passes=$((passes+1)) \
    || { echo "FAIL $1: exit $rc or a warning of unread tensors"; echo "$out" | sed 's/^/    /'; failures=$((failures+1)); }
}

# expect_same NAME WANT GOT
expect_same() {
  if [ "$2" != "$3" ]; then
    echo "FAIL $1"; diff <(echo "$2") <(echo "$3") | head -20; failures=$((failures+1))
  else
    passes=$((passes+1))
  fi
}

# expect_same_output NAME WANT GOT: what two runs printed, the same and not empty (two runs that
# both failed and printed nothing do not match)
expect_same_output() {
  if [ -z "$2" ]; then echo "FAIL $1: nothing printed"; failures=$((failures+1)); return; fi
  expect_same "$@"
}

# finish: the exit status; a script that checked nothing fails
finish() {
  echo "$passes passed, $failures failed"
  [ $((passes + failures)) -gt 0 ] || { echo "FAIL: nothing was checked"; return 1; }
  [ $failures -eq 0 ]
}

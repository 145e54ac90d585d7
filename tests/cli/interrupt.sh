#!/usr/bin/env bash
# Ctrl-C (SIGINT) or SIGTERM during kiln build removes the engine's temp file, and kiln dies of the
# signal (exit status 128 + its number, as a shell reports it). No timing: the tokenizer is a FIFO,
# which kiln reads after it has opened the engine's temp file, so the build waits there until the
# signal comes; the test waits (without a time limit that matters) until the temp file exists.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
set -m # job control: a background job does not ignore SIGINT
# interrupt NAME SIGNAL STATUS
interrupt() {
  local name="$1" sig="$2" want="$3" i rc seen=0
  rm -f "$work/tok.fifo" && mkfifo "$work/tok.fifo"
  "$KILN_BIN" build "$ts" --tokenizer "$work/tok.fifo" -o "$work/x.engine" 2>"$work/err" &
  local pid=$!
  for i in $(seq 1200); do # up to 2 minutes on a loaded machine; usually at once
    if ls "$work" | grep -q '^x\.engine\.tmp\.'; then seen=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [ $seen = 1 ] && passes=$((passes+1)) || { echo "FAIL $name: no temp file while the build waits"; failures=$((failures+1)); }
  kill -s "$sig" $pid 2>/dev/null
  for i in $(seq 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -KILL $pid 2>/dev/null
  { wait $pid; } 2>/dev/null; rc=$?
  expect_same "$name: exit status" "$want" "$rc"
  expect_same "$name: nothing on stderr" "" "$(cat "$work/err")"
  expect_same "$name: files left" "tok.fifo" "$(ls "$work" | grep -v '^err$')"
}
interrupt sigint INT 130
interrupt sigterm TERM 143
interrupt sighup HUP 129
finish

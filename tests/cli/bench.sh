#!/usr/bin/env bash
# kiln bench on a CPU engine: the table's and the JSON's shape (not the times: tests assert no
# speed), the notes for a prompt run in several steps and one over the context, the help text,
# and the argument errors with their messages.
. "$(dirname "$0")/lib.sh"
ts="$KILN_SHARED/models/tinystories-656k"
# steps of at most 64 tokens, a context of 512 positions
"$KILN_BIN" build "$ts" --max-tokens 64 -o "$work/ts.engine" > /dev/null || { echo "FAIL: build"; exit 1; }
e="$work/ts.engine"

# the table: numbers masked, the rest pinned
num='[0-9]+\.[0-9]+'
out=$("$KILN_BIN" bench "$e" --prompts 8,100,1000 --decode 4 --reps 2 2>"$work/err"); rc=$?
expect_same "table: exit and stderr" "exit 0, " "exit $rc, $(cat "$work/err")"
expect_same "table" "kiln bench: $e on cpu (f32 weights, context 512, steps of at most 64 tokens)
1 warm-up and 2 timed runs of each; times from the prompt to the first new token (greedy)

measurement                   steps    median ms       min ms     tokens/s
prefill 8 tokens                  1 T T T
prefill 100 tokens                2 T T T
prefill 1000 tokens               -      skipped            -            -
decode, batch 1, per token        4 T T T

cold start: T s from the engine file to the first token: the file read and checked in T s (T MiB, T GB/s), the session opened in T s (on a GPU: the weights uploaded), the first 8-token prompt's first token T ms

notes:
  prefill 100 tokens: prefilled in 2 steps of at most 64 tokens (the engine's largest step: kiln build --max-tokens)
  prefill 1000 tokens: skipped: longer than the context of 512 positions
  decode: 4 one-token steps after a prompt of 16 tokens; time per step" \
  "$(sed -E "s/ +$num +$num +$num\$/ T T T/; /^cold start/ s/$num/T/g" <<<"$out")"

# the JSON: one line, one object, its fields and their types (bench/prefill_bench.py reads them)
out=$("$KILN_BIN" bench "$e" --prompts 8,100,1000 --decode 4 --decode-prompt 5 --reps 3 --warmup 0 --json); rc=$?
expect_same "json: exit and one line" "exit 0, 1 line" "exit $rc, $(wc -l <<<"$out") line"
shape=$(python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
def kind(v):
    return "null" if v is None else "bool" if isinstance(v, bool) else "num" if isinstance(v, (int, float)) else \
        "str" if isinstance(v, str) else type(v).__name__
top = {k: (v if k not in ("engine",) and not isinstance(v, (list, dict)) else kind(v)) for k, v in r.items()}
print(top)
for p in r["prefill"]:
    print({k: (v if k in ("tokens", "ran", "steps", "note") else kind(v)) for k, v in p.items()})
print({k: (v if k in ("prompt_tokens", "tokens") else kind(v)) for k, v in r["decode"].items()})
c = r["cold_start"]
print({k: (v if k in ("prompt_tokens", "engine_bytes") else kind(v)) for k, v in c.items()},
      "total:", abs(c["total_s"] - (c["open_s"] + c["session_s"] + c["first_token_ms"] / 1e3)) < 0.0025)
ok = all(p["ttft_ms_min"] <= p["ttft_ms_median"] <= p["ttft_ms_max"] and p["ttft_ms_min"] <= p["ttft_ms_first"]
         <= p["ttft_ms_max"] for p in r["prefill"] if p["ran"])
print("min <= median:", ok and r["decode"]["ms_per_token_min"] <= r["decode"]["ms_per_token_median"])
' <<<"$out")
expect_same "json shape" "{'kiln_bench': 1, 'engine': 'str', 'device': 'cpu', 'weight_dtype': 'f32', 'vocab': 2048, 'max_context': 512, 'max_step_tokens': 64, 'kv_blocks': 32, 'kv_block_size': 16, 'kv_bytes': 524288, 'warmup': 0, 'reps': 3, 'prefill': 'list', 'decode': 'dict', 'cold_start': 'dict', 'decode_batch': 'list'}
{'tokens': 8, 'ran': True, 'steps': 1, 'ttft_ms_median': 'num', 'ttft_ms_min': 'num', 'ttft_ms_max': 'num', 'ttft_ms_first': 'num', 'tokens_per_s': 'num', 'note': None}
{'tokens': 100, 'ran': True, 'steps': 2, 'ttft_ms_median': 'num', 'ttft_ms_min': 'num', 'ttft_ms_max': 'num', 'ttft_ms_first': 'num', 'tokens_per_s': 'num', 'note': \"prefilled in 2 steps of at most 64 tokens (the engine's largest step: kiln build --max-tokens)\"}
{'tokens': 1000, 'ran': False, 'steps': 0, 'ttft_ms_median': 'null', 'ttft_ms_min': 'null', 'ttft_ms_max': 'null', 'ttft_ms_first': 'null', 'tokens_per_s': 'null', 'note': 'skipped: longer than the context of 512 positions'}
{'prompt_tokens': 5, 'tokens': 4, 'ms_per_token_median': 'num', 'ms_per_token_min': 'num', 'tokens_per_s': 'num'}
{'total_s': 'num', 'open_s': 'num', 'engine_bytes': $(stat -c %s "$e"), 'read_gb_per_s': 'num', 'session_s': 'num', 'prompt_tokens': 8, 'first_token_ms': 'num'} total: True
min <= median: True" "$shape"
# the batched decode: B sequences a step (the runtime's multi-sequence step), a row each, and its JSON
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 3 --decode-prompt 4 --batch 2,5 --reps 1 --warmup 0); rc=$?
expect_same "batch table" "exit 0
decode, batch 1, per token        3 T T T
decode, batch 2, per step         3 T T T
decode, batch 5, per step         3 T T T
  decode, batch B: B sequences, each after a prompt of 4 tokens, 3 steps of a token each; time per step, tokens/s of all" \
  "exit $rc
$(grep '^ *decode' <<<"$out" | grep -v '^  decode: ' | sed -E "s/ +$num +$num +$num\$/ T T T/")"
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 3 --batch 3 --reps 2 --warmup 0 --json)
expect_same "batch json" "[{'batch': 3, 'ran': True, 'steps': 3, 'ms_per_step_median': 'num', 'ms_per_step_min': 'num', 'tokens_per_s': 'num', 'note': None}]" \
  "$(python3 -c 'import json,sys; r=json.load(sys.stdin); print([{k: (v if k in ("batch", "ran", "steps", "note") else "num") for k, v in b.items()} for b in r["decode_batch"]])' <<<"$out")"
# a batch whose sequences outgrow the KV cache (9 blocks of 16: batch 2 of 33 positions takes 6, batch 5
# would take 15) is skipped with a note, the others measured, exit 0 (a smaller GPU still measures the rest)
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 3 --decode-prompt 30 --batch 5,2 --reps 1 --warmup 0 --kv-blocks 9); rc=$?
expect_same "batch over the cache" "exit 0
decode, batch 5, per step         -      skipped            -            -
decode, batch 2, per step         3 T T T
  decode, batch 5: skipped: 5 sequences of 33 positions need 15 KV-cache blocks of 16 (240.0 KiB); the session's cache holds 9 (144.0 KiB)" \
  "exit $rc
$(grep -E '^decode, batch [25]|^  decode, batch 5' <<<"$out" | sed -E "s/ +$num +$num +$num\$/ T T T/")"
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 3 --decode-prompt 30 --batch 5 --reps 1 --warmup 0 --kv-blocks 9 --json)
expect_same "batch over the cache, json" "False None None" \
  "$(python3 -c 'import json,sys; b=json.load(sys.stdin)["decode_batch"][0]; print(b["ran"], b["ms_per_step_median"], b["tokens_per_s"])' <<<"$out")"
# a batched decode whose prompts are longer than the engine's largest step (64): each prefilled in steps
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 2 --decode-prompt 100 --batch 2 --reps 1 --warmup 0 2>&1); rc=$?
expect_same "batch after a long prompt" "exit 0
decode, batch 2, per step         2 T T T" "exit $rc
$(grep '^decode, batch 2' <<<"$out" | sed -E "s/ +$num +$num +$num\$/ T T T/")"
# --profile on a CPU engine: the results as without it, and a line saying kernels are timed on CUDA engines
out=$("$KILN_BIN" bench "$e" --prompts 8 --decode 2 --reps 1 --warmup 0 --profile 2>"$work/err"); rc=$?
expect_same "profile on the CPU" "exit 0, 6 lines of results
kiln bench: profile: kernels are timed on CUDA engines (kiln build --target sm_XX); this one runs on the CPU interpreter" \
  "exit $rc, $(grep -c '^[a-z]' <<<"$out") lines of results
$(cat "$work/err")"
# no decode: "decode" is null; --max-context shortens the context the notes name
out=$("$KILN_BIN" bench "$e" --prompts 40 --decode 0 --reps 1 --max-context 32 --json)
expect_same "json without decode" "None skipped: longer than the context of 32 positions" \
  "$(python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["decode"], r["prefill"][0]["note"])' <<<"$out")"

# help and usage
out=$("$KILN_BIN" bench --help); rc=$?
expect_same "help" "exit 0: usage: kiln bench ENGINE [--prompts N,N,...] [--decode N] [--decode-prompt N]" \
  "exit $rc: $(head -1 <<<"$out")"
for opt in --prompts --decode --decode-prompt --batch --reps --warmup --json --max-context --kv-blocks --no-cuda-graphs --profile; do
  grep -q -- "^  $opt " <<<"$out" && passes=$((passes+1)) || { echo "FAIL: help lacks $opt"; failures=$((failures+1)); }
done
expect_same "kiln --help lists bench" "  bench       time an engine: time to first token by prompt length, decode per token" \
  "$("$KILN_BIN" --help | grep '^  bench ')"

# argument errors: exit 2, the message pinned
expect_fail no-engine "kiln bench: error: needs an engine (see 'kiln bench --help')" -- "$KILN_BIN" bench
expect_fail two-engines "kiln bench: error: unexpected argument 'b'" -- "$KILN_BIN" bench "$e" b
expect_fail unknown "kiln bench: error: unknown option '--batches' (see 'kiln bench --help')" -- "$KILN_BIN" bench "$e" --batches 8
expect_fail kv-blocks-zero "kiln bench: error: --kv-blocks: '0' is not an integer from 1 to 2147483647" -- \
  "$KILN_BIN" bench "$e" --kv-blocks 0
expect_fail batch-one "kiln bench: error: --batch: '1' is not an integer from 2 to 256" -- "$KILN_BIN" bench "$e" --batch 1
expect_fail batch-empty "kiln bench: error: --batch: an empty size in '2,'" -- "$KILN_BIN" bench "$e" --batch 2,
expect_fail batch-many "kiln bench: error: --batch: more than 8 sizes in '$(seq -s, 2 10)'" -- \
  "$KILN_BIN" bench "$e" --batch "$(seq -s, 2 10)"
expect_fail batch-no-decode "$e: error: benchmark: a batched decode needs decode steps (decode is 0)" -- \
  "$KILN_BIN" bench "$e" --decode 0 --batch 2
expect_fail empty-length "kiln bench: error: --prompts: an empty length in '8,,16'" -- "$KILN_BIN" bench "$e" --prompts 8,,16
expect_fail zero-length "kiln bench: error: --prompts: '0' is not an integer from 1 to 16777216" -- \
  "$KILN_BIN" bench "$e" --prompts 8,0
expect_fail bad-length "kiln bench: error: --prompts: '1e3' is not an integer from 1 to 16777216" -- \
  "$KILN_BIN" bench "$e" --prompts 1e3
expect_fail many-lengths "kiln bench: error: --prompts: more than 16 lengths in '$(seq -s, 1 17)'" -- \
  "$KILN_BIN" bench "$e" --prompts "$(seq -s, 1 17)"
expect_fail reps "kiln bench: error: --reps: '0' is not an integer from 1 to 1000" -- "$KILN_BIN" bench "$e" --reps 0
expect_fail warmup "kiln bench: error: --warmup: '-1' is not an integer from 0 to 1000" -- "$KILN_BIN" bench "$e" --warmup -1
expect_fail decode "kiln bench: error: --decode: 'x' is not an integer from 0 to 16777216" -- "$KILN_BIN" bench "$e" --decode x
expect_fail no-value "kiln bench: error: option '--reps' needs a value" -- "$KILN_BIN" bench "$e" --reps
for a in "bench" "bench $e --prompts 8,,16" "bench $e --reps 0"; do
  # shellcheck disable=SC2086
  "$KILN_BIN" $a > /dev/null 2>&1
  expect_same "exit code of kiln $a" 2 $?
done
# what the engine cannot do: exit 1, from the runtime
expect_fail decode-over-context \
  "$e: error: benchmark: a decode of 600 steps after 16 prompt tokens needs 616 positions; the context has 512" -- \
  "$KILN_BIN" bench "$e" --decode 600
expect_fail missing-engine "$work/none.engine: error: cannot open: No such file or directory" -- \
  "$KILN_BIN" bench "$work/none.engine"
"$KILN_BIN" bench "$e" --decode 600 > /dev/null 2>&1
expect_same "exit code of a decode over the context" 1 $?
finish

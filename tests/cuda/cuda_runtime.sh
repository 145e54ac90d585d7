#!/usr/bin/env bash
# cuda_runtime.sh MODEL_DIR — the CUDA backend's runtime over emu_libcuda (the CPU stand-in
# for libcuda; the engine's kernels compiled for the CPU with g++, alignment checked): skips
# (77) without NVRTC or g++.
#  - tests/session's test_session on the CUDA engine: per-sequence failures, draws on the
#    device against the CPU sampler, steps with and without CUDA graphs bitwise equal; and on an
#    engine with the tensor-core prefill attention (a batch of 41 decode tokens on the decode kernel);
#  - tests/session's test_oom on it: every host allocation of kiln.h's calls failing in turn,
#    the backend's included, reported as out of memory with nothing changed;
#  - kiln run: graphs replayed (the stand-in counts them) and the same logits without them;
#    draws on the device equal to --host-sampling's and to the CPU engine's greedy ids;
#    the KV cache sized from the device's free memory and reported; out-of-memory messages
#    (a KV cache that cannot fit, weights that cannot fit); the context limit;
#  - the activations: one allocation of the memory plan's mem.arena_bytes (the stand-in lists
#    its allocations); a step over the plan's mem.max_tokens refused as the CPU engine refuses
#    it; an engine built without a plan (--passes none) runs with a buffer per value; the
#    arena not fitting the device;
#  - kiln run --profile: no graphs, every launch timed (the stand-in's count), the same logits,
#    (and kiln bench --profile of a batched decode: its steps apart from the one-token ones),
#    a table per kind of step; the operations (GFLOP) of the attention kernel and of all kernels
#    against the model's dimensions, TFLOP/s, and --profile-ceiling's column (left out without);
#  - kiln verify --target sm_90: the fused CUDA engine against the unfused interpreter.
# usage: cuda_runtime.sh MODEL_DIR ENGINE_DIR, ENGINE_DIR the f32 engine the
# cuda_engines_<model>_f32 setup test built (cuda_lib.sh: sm_80,sm_90, kernels alignment-checked).
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
: "${KILN_EMU_LIB:?}" "${KILN_EMU_SHIM:?}" "${KILN_TEST_SESSION:?}" "${KILN_TEST_OOM:?}"
model="$1" engine_dir="$2"
if [ "${KILN_HAVE_NVRTC:-OFF}" != "ON" ] || [ -z "${KILN_GXX:-}" ]; then
  echo "skipped: needs NVRTC and g++"; exit 77
fi
have_engine "$engine_dir" || exit 1
cu="$engine_dir/cuda.engine"
# two more engines, built meanwhile: a plan for 4 tokens a step, and no plan at all
( "$KILN_BIN" build "$model" --target sm_90 --max-tokens 4 --emit-source "$work/src4" -o "$work/cu4.engine" \
    && compile_kernels "$work/src4" "$work/kernels4.so" ) >"$work/extra4.log" 2>&1 &
extra4=$!
( "$KILN_BIN" build "$model" --target sm_90 --passes none --emit-source "$work/src0" -o "$work/cu0.engine" \
    && compile_kernels "$work/src0" "$work/kernels0.so" ) >"$work/extra0.log" 2>&1 &
extra0=$!
# and one with the tensor-core prefill attention (the attention kernels' large variant, chosen by the
# step's longest sequence): test_session's batch of 41 one-token sequences must stay on the decode kernel
( KILN_CUDA_FLASH_PREFILL=1 "$KILN_BIN" build "$model" --target sm_90 --emit-source "$work/srcf" -o "$work/cuf.engine" \
    && compile_kernels "$work/srcf" "$work/kernelsf.so" ) >"$work/extraf.log" 2>&1 &
extraf=$!
# and one whose logits hold a NaN (the tied embedding/output row of id 100): the engine's own
# graph, so the same kernels
mkdir -p "$work/nan"
python3 "$(dirname "$0")/nan_logit_checkpoint.py" "$model" "$work/nan" || { echo "FAIL: making the NaN checkpoint"; exit 1; }
"$KILN_BIN" build "$work/nan" --target sm_90 -o "$work/nan.engine" >"$work/nan.log" 2>&1 &
nan_build=$!
# the engine's memory plan (graph params mem.*) and its weights' bytes, as kiln inspect shows them
"$KILN_BIN" inspect "$cu" >"$work/inspect.txt" || { echo "FAIL: kiln inspect"; exit 1; }
arena=$(awk '$1 == "mem.arena_bytes" { print $2 }' "$work/inspect.txt")
plan_tokens=$(awk '$1 == "mem.max_tokens" { print $2 }' "$work/inspect.txt")
weight_bytes=$(awk '$1 == "weights:" { print $4 }' "$work/inspect.txt")
[ -n "$arena" ] && [ -n "$plan_tokens" ] && [ -n "$weight_bytes" ] || { echo "FAIL: no memory plan in the engine"; exit 1; }
export KILN_CUDA_LIB="$KILN_EMU_LIB" KILN_EMU_KERNELS="$engine_dir/kernels.so"

"$KILN_TEST_SESSION" "$cu" && passes=$((passes+1)) || { echo "FAIL: test_session on the CUDA engine"; failures=$((failures+1)); }
wait $extraf || { echo "FAIL: the flash-prefill engine:"; cat "$work/extraf.log"; exit 1; }
KILN_EMU_KERNELS="$work/kernelsf.so" "$KILN_TEST_SESSION" "$work/cuf.engine" --batch-of-41 | grep -E "batch|checks" \
  && [ "${PIPESTATUS[0]}" -eq 0 ] && passes=$((passes+1)) \
  || { echo "FAIL: test_session on the flash-prefill CUDA engine"; failures=$((failures+1)); }
"$KILN_TEST_OOM" "$cu" && passes=$((passes+1)) || { echo "FAIL: test_oom on the CUDA engine"; failures=$((failures+1)); }

# graphs: captured and replayed, and the same bits as launching each kernel
ids=1,7,12,31,5,9,40,2,11
a=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/g.f32" 2>"$work/g.err")
b=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/n.f32" --no-cuda-graphs 2>"$work/n.err")
expect_same_output "ids with and without graphs" "$a" "$b"
cmp -s "$work/g.f32" "$work/n.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ without graphs"; failures=$((failures+1)); }
expect_same "graphs used" "2 graphs captured, 6 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/g.err")"
expect_same "no graphs" "0 graphs captured, 0 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/n.err")"
# kernel overlap (programmatic dependent launch): on the 9.0 device every kernel of the engine
# (its meta's "pdl") is launched to overlap the one before (here: every launch, the draws being on
# the host); --no-kernel-overlap launches none so, nor does an sm_80 device (the driver refuses the
# attribute there); the logits are the same bits
o=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/o.f32" --no-cuda-graphs --host-sampling 2>"$work/o.err")
expect_same_output "ids with kernel overlap, host sampling" "$a" "$o"
cmp -s "$work/g.f32" "$work/o.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ with host sampling"; failures=$((failures+1)); }
expect_same "every launch overlapping the one before" "$(grep -o '^emu_libcuda: [0-9]* kernel launches' "$work/o.err" | cut -d' ' -f2)" \
  "$(grep -o '[0-9]* launches overlapping' "$work/o.err" | cut -d' ' -f1)"
"$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/no.f32" --no-kernel-overlap >/dev/null 2>&1
cmp -s "$work/g.f32" "$work/no.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ with --no-kernel-overlap"; failures=$((failures+1)); }
expect_same "--no-kernel-overlap: no launch overlapping" "0 launches overlapping" \
  "$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --no-kernel-overlap 2>&1 >/dev/null | grep -o '[0-9]* launches overlapping')"
# a driver whose graphs take no overlapping launches (before CUDA 12.3): the capture retried without
# the overlap, which stays off; the graphs and the logits as before
KILN_EMU_NO_PDL_CAPTURE=1 KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/od.f32" \
  >/dev/null 2>"$work/od.err"
cmp -s "$work/g.f32" "$work/od.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ when graphs refuse the overlap"; failures=$((failures+1)); }
expect_same "graphs refusing the overlap: captured without it" "2 graphs captured, 6 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/od.err")"
expect_same "sm_80: no launch overlapping" "0 launches overlapping" \
  "$(KILN_EMU_CC=8.0 KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 2>&1 >/dev/null | grep -o '[0-9]* launches overlapping')"

# the activations: one allocation of the plan's arena, for the prefill and every decode step
expect_same "the arena allocated once, at the plan's size" "1" \
  "$(grep '^emu_libcuda: allocations' "$work/g.err" | tr ' ' '\n' | grep -c "^$arena\$")"

# --profile: every kernel launched and timed, the same logits, tables per kind of step
p=$(KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 6 --logits-out "$work/p.f32" --profile 2>"$work/p.err")
expect_same_output "ids with --profile" "$a" "$p"
cmp -s "$work/g.f32" "$work/p.f32" && passes=$((passes+1)) || { echo "FAIL: logits differ with --profile"; failures=$((failures+1)); }
expect_same "no graphs when profiling" "0 graphs captured, 0 graph launches" \
  "$(grep -o '[0-9]* graphs captured, [0-9]* graph launches' "$work/p.err")"
expect_same "profile: the arena" \
  "kiln: profile: activations: one arena of $arena bytes (the memory plan, for steps of up to $plan_tokens tokens)" \
  "$(grep '^kiln: profile: activations' "$work/p.err")"
expect_same "profile: kinds of step" \
  "kiln: profile: 1 prefill step (9 tokens; > 8 tokens a step): host time
kiln: profile: 5 decode steps (5 tokens; <= 8 tokens a step): host time
kiln: profile: 1 prefill step (9 tokens; > 8 tokens a step): device time
kiln: profile: 5 decode steps (5 tokens; <= 8 tokens a step): device time" \
  "$(grep -o '^kiln: profile: [0-9].* time' "$work/p.err")"
# the tables count every launch the stand-in ran (kernels and draws), rows sorted by total time
launched=$(grep -o '[0-9]* kernel launches' "$work/p.err" | cut -d' ' -f1)
counted=$(awk '$1 == "(all" { n += $3 } END { print n }' "$work/p.err")
expect_same_output "profile: every launch timed" "$launched" "$counted"
sorted=$(awk '/^  kernel / { t = 1; prev = ""; next } /^  \(all/ { t = 0 } t {
  if (prev != "" && $3 + 0 > prev + 0) bad = 1; prev = $3 } END { print bad ? "unsorted" : "sorted" }' "$work/p.err")
expect_same "profile: rows by total time" "sorted" "$sorted"
grep -q '^  krt_draw  *5 .*the next tokens. draws$' "$work/p.err" && grep -q 'matmul \[fuse [0-9]*: ' "$work/p.err" \
  && passes=$((passes+1)) || { echo "FAIL: profile rows:"; cat "$work/p.err"; failures=$((failures+1)); }

# kiln bench --profile of a batched decode alone: its steps of 12 tokens are the only ones over 8
"$KILN_BIN" bench "$cu" --prompts 1 --decode-prompt 1 --decode 2 --batch 12 --reps 1 --warmup 0 --profile \
  >/dev/null 2>"$work/bp.err"
expect_same "bench --profile: the batched steps apart" \
  "kiln: profile: 2 prefill steps (24 tokens; > 8 tokens a step): device time" \
  "$(grep -o '^kiln: profile: [0-9]* prefill.* device time' "$work/bp.err")"
grep -q 'matmul \[fuse [0-9]*: ' "$work/bp.err" && passes=$((passes+1)) \
  || { echo "FAIL: bench --profile has no kernel rows:"; cat "$work/bp.err"; failures=$((failures+1)); }

# matmuls run their decode kernel in steps of up to 32 tokens (the 9-token prefill above: no _large
# launch) and their _large kernel past that: a 40-token prompt's step launches a _large kernel for
# every matmul of its table but the head's (which runs on the one row drawn from)
expect_same "no _large kernel for a 9-token step" "0" \
  "$(grep -o '[0-9]* launches of _large kernels' "$work/p.err" | cut -d' ' -f1)"
ids40=$(seq -s, 1 40)
KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids40 -n 1 --profile >/dev/null 2>"$work/p40.err"
large=$(grep -o '[0-9]* launches of _large kernels' "$work/p40.err" | cut -d' ' -f1)
mm_prefill=$(awk '/^kiln: profile: [0-9]* prefill step.*device time/ { t = 1; next } /^kiln: profile:/ { t = 0 }
  t { for (i = 6; i < NF; i++) if ($i ~ /^%[0-9]+$/) { if ($(i + 1) == "matmul") n += $2; break } }
  END { print n - 1 }' "$work/p40.err")
expect_same "matmuls' _large kernels launched for the 40-token step" "$mm_prefill" "$large"
[ "${large:-0}" -gt 0 ] && passes=$((passes+1)) || { echo "FAIL: no _large kernel launched"; failures=$((failures+1)); }

# the operations (ir/flops.h), from the model's dimensions (tinystories-656k: llama, 2 layers, hidden 128,
# 8 heads of 16, 4 KV heads, MLP 384, vocab 2048): matmuls 2·T·K·N summed over q, k, v, o, gate, up, down and
# the LM head; attention 2·H·(DK + DV) a position attended, token i of a step at position p attending p + 1.
# The prefill step: 9 tokens at positions 0..8; the 5 decode steps: one token each at positions 9..13.
L=2 h=128 H=8 KH=4 D=16 F=384 V=2048
mm_token=$(( 2 * (L * (h * (H * D + 2 * KH * D) + H * D * h + 2 * h * F + F * h) + h * V) ))
att_prefill=$(( L * 2 * H * (D + D) * (9 * 10 / 2) ))        # sum of p + 1 over p = 0..8: 45
att_decode=$(( L * 2 * H * (D + D) * (10 + 11 + 12 + 13 + 14) ))
gflop() { awk -v f="$1" 'BEGIN { printf "%.6f", f / 1e9 }'; }
# a table's columns: the GFLOP of its attention row and of its (all kernels) row
flop_cols() { awk -v kind="$1" '$0 ~ "^kiln: profile: [0-9]* " kind " step.*device time" { t = 1; next } /^kiln: profile:/ { t = 0 }
  t && / attention(,| \[|$)/ && $1 != "(all" { att = $6 } t && $1 == "(all" { all = $6 } END { print att, all }' "$work/p.err"; }
expect_same "profile: prefill GFLOP (attention, all kernels)" \
  "$(gflop $att_prefill) $(gflop $(( 9 * mm_token + att_prefill )))" "$(flop_cols prefill)"
expect_same "profile: decode GFLOP (attention, all kernels)" \
  "$(gflop $att_decode) $(gflop $(( 5 * mm_token + att_decode )))" "$(flop_cols decode)"
expect_same "profile: columns without a ceiling" "share GFLOP TFLOP/s computes" \
  "$(grep -m1 '^  kernel ' "$work/p.err" | awk '{ print $7, $8, $9, $10 }')"
# --profile-ceiling: its column, each row's TFLOP/s (GFLOP over the total µs) as a fraction of it;
# rows without operations show -
KILN_EMU_STATS=1 "$KILN_BIN" run "$cu" --ids $ids -n 1 --profile --profile-ceiling 0.001 >/dev/null 2>"$work/c.err"
expect_same "profile: columns with a ceiling" "GFLOP TFLOP/s ceiling computes" \
  "$(grep -m1 '^  kernel ' "$work/c.err" | awk '{ print $8, $9, $10, $11 }')"
checked=$(awk '/^  kernel / { t = 1; next } /^  \(all/ { t = 0 } t {
  if ($6 == "-") { if ($7 != "-" || $8 != "-") bad = bad " " $1; next }
  tf = $6 / ($3 * 1e-6) / 1e3; frac = 100 * tf / 0.001; got = $8; sub(/%$/, "", got)
  if (($7 - tf > 0.005 || tf - $7 > 0.005) || (got - frac > 0.05 + frac * 0.02 || frac - got > 0.05 + frac * 0.02)) bad = bad " " $1
  n++ } END { print (n > 0 && bad == "" ? "consistent" : "inconsistent:" bad) }' "$work/c.err")
expect_same "profile: TFLOP/s and the ceiling's fraction" "consistent" "$checked"
grep -q '^kiln: profile: GFLOP: .*; ceiling: TFLOP/s as a fraction of 0.001 TFLOP/s$' "$work/c.err" \
  && passes=$((passes+1)) || { echo "FAIL: the note on GFLOP and the ceiling:"; cat "$work/c.err"; failures=$((failures+1)); }

# no logits wanted (draws on the device, no graph: --profile): the head (final norm and lm_head)
# runs on the drawn row alone: its GFLOP in the prefill table is 1/9 of the 9-token run that copies
# every row's logits back (p.err), every other kernel's the same
prefill_gflop() { # the prefill table's kernels and their GFLOP
  awk '/prefill step .*device time/ { t = 1; next } t && /^  k_/ { print $1, $6 } t && /^  \(all/ { exit }' "$1"
}
head=$( { prefill_gflop "$work/p.err" | sed 's/^/all /'; prefill_gflop "$work/c.err"; } | awk '
  $1 == "all" { all[$2] = $3; next }
  { if (!($1 in all)) bad = bad " " $1
    else if ($2 != all[$1]) { r = all[$1] / $2; if (r < 8.99 || r > 9.01 || seen++) bad = bad " " $1 } }
  END { print (seen == 1 && bad == "" ? "the head on one row" : "unexpected:" bad " (" seen + 0 " changed)") }')
expect_same "profile: the head's GFLOP on the drawn row only" "the head on one row" "$head"
# and what it draws: the same ids as drawing on the host from every row's logits
for smp in "--temperature 0" "--temperature 0.9 --seed 5"; do
  dev=$("$KILN_BIN" run "$cu" --ids $ids -n 4 --no-cuda-graphs $smp 2>/dev/null)
  host=$("$KILN_BIN" run "$cu" --ids $ids -n 4 --no-cuda-graphs $smp --host-sampling 2>/dev/null)
  expect_same_output "the head on the drawn rows ($smp): the host's draws" "$host" "$dev"
done

# draws on the device: the host's, and the CPU engine's greedy ids
for smp in "--temperature 0" "--temperature 0.8 --top-k 40 --top-p 0.95 --seed 3" "--temperature 1.2 --seed 9"; do
  dev=$("$KILN_BIN" run "$cu" --ids 1,7 -n 8 $smp 2>/dev/null)
  host=$("$KILN_BIN" run "$cu" --ids 1,7 -n 8 $smp --host-sampling 2>/dev/null)
  expect_same_output "draws on the device ($smp) = on the host" "$host" "$dev"
done
expect_same_output "greedy ids = the CPU engine's" "$("$KILN_BIN" run "$engine_dir/cpu.engine" --ids $ids -n 6 2>/dev/null)" "$a"

# the KV cache from the device's free memory, reported on stderr
err=$("$KILN_BIN" run "$cu" --ids 1 -n 1 2>&1 >/dev/null | head -1)
[[ "$err" =~ ^kiln:\ KV\ cache\ on\ kiln\ CPU\ emulator:\ 512\ blocks\ of\ 16\ positions\ \(8\.0\ MiB\),\ at\ most\ 0\.9\ of\ the\ 8\.0\ GiB\ free$ ]] \
  && passes=$((passes+1)) || { echo "FAIL: KV report: $err"; failures=$((failures+1)); }
# a small device (4 MiB free after the weights and the activations): fewer blocks than a full
# context of 16 sequences needs
err=$(KILN_EMU_MEM=$(( weight_bytes + arena + (4 << 20) )) "$KILN_BIN" run "$cu" --ids 1 -n 1 --kv-fraction 0.5 2>&1 >/dev/null | head -1)
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
# the weights fit, the arena does not
expect_fail acts-do-not-fit "cuda: error: cannot allocate $arena bytes of activations for steps of up to $plan_tokens tokens (the engine's memory plan; kiln build --max-tokens N plans for fewer): CUDA_ERROR_OUT_OF_MEMORY: out of memory" -- \
  env KILN_EMU_MEM=$(( weight_bytes + arena / 2 )) "$KILN_BIN" run "$cu" --ids 1,2 -n 2
expect_fail over-limit "kiln: error: a context of 600 positions is over the engine's limit of 512" -- \
  "$KILN_BIN" run "$cu" --ids 1 --max-context 600

# a plan for 4 tokens: a 9-token prompt is prefilled in steps of 4, 4 and 1, with the logits and
# ids of the one-step engine; 3 tokens run in one step
wait $extra4 || { echo "FAIL: the 4-token engine:"; cat "$work/extra4.log"; exit 1; }
expect_same_output "4-token plan: a 9-token prompt in three steps" "$a" \
  "$(KILN_EMU_KERNELS="$work/kernels4.so" "$KILN_BIN" run "$work/cu4.engine" --ids $ids -n 6 \
     --logits-out "$work/4.f32" 2>/dev/null)"
python3 - "$work/g.f32" "$work/4.f32" <<'PY' && passes=$((passes+1)) || failures=$((failures+1))
import struct, sys
a, b = (open(f, "rb").read() for f in sys.argv[1:3])
n = len(a) // 4
x, y = struct.unpack(f"<{n}f", a), struct.unpack(f"<{len(b) // 4}f", b)
worst = max(abs(p - q) for p, q in zip(x, y)) if len(x) == len(y) else float("inf")
print(f"4-token plan: prompt logits within {worst:.3g} of the one-step prefill")
sys.exit(0 if worst <= 1e-4 else 1)
PY
expect_same_output "4-token plan: ids" "$("$KILN_BIN" run "$cu" --ids 1,7,12 -n 3 2>/dev/null)" \
  "$(KILN_EMU_KERNELS="$work/kernels4.so" "$KILN_BIN" run "$work/cu4.engine" --ids 1,7,12 -n 3 2>/dev/null)"
# no plan (--passes none): a buffer per value, the CPU engine's greedy ids
wait $extra0 || { echo "FAIL: the engine without a plan:"; cat "$work/extra0.log"; exit 1; }
out=$(KILN_EMU_KERNELS="$work/kernels0.so" "$KILN_BIN" run "$work/cu0.engine" --ids $ids -n 6 --profile 2>"$work/0.err")
expect_same_output "no plan: greedy ids = the CPU engine's" "$a" "$out"
grep -q '^kiln: profile: activations: [0-9]* bytes, a buffer per value for steps of up to 9 tokens (the engine has no memory plan)$' \
  "$work/0.err" && passes=$((passes+1)) || { echo "FAIL: no plan: $(cat "$work/0.err")"; failures=$((failures+1)); }

# one NaN logit among finite ones: no token drawn, on the device as on the host, and an error
wait $nan_build || { echo "FAIL: the NaN engine:"; cat "$work/nan.log"; exit 1; }
for how in "device draws" "--host-sampling"; do
  flag=(); [ "$how" = "--host-sampling" ] && flag=(--host-sampling)
  expect_fail "one NaN logit ($how)" \
    "kiln: error: the model's logits are NaN or infinite after 2 tokens of sequence 0: no next token" -- \
    "$KILN_BIN" run "$work/nan.engine" --ids 1,7 -n 4 "${flag[@]}"
done

# verify on the CUDA backend: every value the engine computes, copied back and compared
out=$("$KILN_BIN" verify "$model" --target sm_90 --tokens 12 --steps 2); rc=$?
echo "$out"
[ $rc -eq 0 ] && [[ "$out" == *"the fused engine (sm_90) on the cuda backend"* ]] && [[ "$out" == *"OK: within tolerance"* ]] \
  && passes=$((passes+1)) || { echo "FAIL: kiln verify --target sm_90 (exit $rc)"; failures=$((failures+1)); }
finish

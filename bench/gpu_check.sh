#!/usr/bin/env bash
# gpu_check.sh — the CUDA backend on a real GPU: f32, bf16 and f16 engines against the goldens and
# the interpreter, and a Llama-3-8B-shaped model against Hugging Face (bench/llama8b_check.py).
# Two halves:
#
#   bash bench/gpu_check.sh prepare   HERE, on the build machine (needs no GPU): builds kiln,
#       golden_test and test_cuda in $KILN_BUILD (default build-cuda-a/; flex, bison, cJSON and
#       NVRTC live here) and gathers what the GPU machine needs into $KILN_BUILD/gpu/: those
#       binaries, the libcjson and libpcre2 they load, and a copy of ../shared/models for the run
#       (an ignored build folder, not the repository). Carry "build-cuda-a/gpu" with the call.
#
#   bash bench/gpu_check.sh run       THERE, from the repository root (the device tool's `run`):
#       builds nothing that needs flex/bison/cJSON; kiln compiles each engine with NVRTC there.
#       For every shared model with a golden.json, and each weight dtype (f32, bf16, f16):
#         - tests/golden/golden_test through the CUDA backend (KILN_GOLDEN_TARGET=sm_80,sm_90:
#           one engine with both cubins; the runtime picks the device's): f32 within 1e-4 of the
#           golden per row and greedy ids exact; bf16, f16 within twice Hugging Face's own error
#           in that dtype (tests/cuda/half_tolerances.txt), greedy ids reported;
#         - `kiln run --ids ... --logits-out` twice on the GPU: bitwise equal logits and ids;
#         - the same engine built for the CPU interpreter: the GPU's logits within 1e-5 of its
#           (same weights, different summation order), same ids;
#         - f32: forked sequences (a shared, half-full KV block copied on write on the device)
#           against the interpreter (test_cuda --fork-check);
#       stories260k against llama2.c's own greedy output; an sm_80-only engine on the device
#       (the architecture error); compute-sanitizer memcheck and racecheck on one model (a
#       12-token prompt: the tiled matmul; decode: the matrix-vector one); then
#       bench/llama8b_check.py (GPU_CHECK_LLAMA8B=0 skips it), given what is left of
#       GPU_CHECK_BUDGET seconds (default 585: the device tool's 600 s a command, less a margin).
#       Everything goes to $OUT/gpu_check.log; the summary table comes last.
#       GPU_CHECK_MODELS="a b" limits the golden models to those; GPU_CHECK_DTYPES="f32 bf16" the
#       dtypes.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${KILN_BUILD:-$root/build-cuda-a}"
gpu="$build/gpu"

prepare() {
  local shared="${KILN_SHARED:-$root/../shared}"
  cmake -S "$root" -B "$build" -G Ninja -DKILN_WERROR=ON >/dev/null || return 1
  cmake --build "$build" --target kiln golden_test test_cuda || return 1
  grep -q 'KILN_HAVE_NVRTC:INTERNAL=ON' "$build/CMakeCache.txt" || { echo "kiln was built without NVRTC"; return 1; }
  rm -rf "$gpu" && mkdir -p "$gpu/bin" "$gpu/lib" "$gpu/models" || return 1
  cp "$build/cli/kiln" "$build/tests/golden/golden_test" "$build/tests/cuda/test_cuda" "$gpu/bin/"
  for lib in libcjson.so.1 libpcre2-8.so.0; do
    local path
    path=$(ldd "$build/cli/kiln" | awk -v l="$lib" '$1 == l { print $3 }')
    [ -n "$path" ] && cp -L "$path" "$gpu/lib/"
  done
  # the models, without the GGUF copy nothing here reads
  (cd "$shared/models" && find . -type f ! -name '*.gguf' -exec cp --parents {} "$gpu/models/" \;)
  du -sh "$gpu"
  echo "carry: ${gpu#$root/}    command: bash bench/gpu_check.sh run"
}

# Where the GPU machine keeps libnvrtc, if the loader does not find it by itself.
find_nvrtc() {
  ldd "$gpu/bin/kiln" | grep -q 'libnvrtc.*not found' || return 0
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
      $(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(os.path.dirname(m.__file__), "lib"))' 2>/dev/null); do
    if ls "$d"/libnvrtc.so.13* >/dev/null 2>&1; then
      export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"
      echo "libnvrtc from $d"
      return 0
    fi
  done
  echo "no libnvrtc.so.13 on this machine"; return 1
}

# half_tolerance MODEL DTYPE: twice Hugging Face's own error in that dtype; empty for f32
half_tolerance() {
  [ "$2" = f32 ] && return 0
  local col=2; [ "$2" = f16 ] && col=3
  awk -v m="$1" -v c=$col '$1 == m { print $c }' "$root/tests/cuda/half_tolerances.txt"
}

# check_model DIR WORK: every dtype of one golden model (see the top); its summary rows go to
# WORK/<model>.summary
check_model() {
  local dir="$1" work="$2" m dt
  m=$(basename "$dir")
  local kiln="$gpu/bin/kiln" golden="$gpu/bin/golden_test" tcuda="$gpu/bin/test_cuda"
  for dt in ${GPU_CHECK_DTYPES:-f32 bf16 f16}; do
    local tol limit="1e-4" archs=sm_90; tol=$(half_tolerance "$m" "$dt")
    [ -n "$tol" ] && limit=$tol
    [ $dt = f32 ] && archs=sm_80,sm_90 # one engine of two cubins; the runtime picks the device's
    echo "== $m ($dt weights): golden_test through the CUDA backend ($archs; limit $limit)"
    local g_status=FAIL worst="-" e="$work/$m.$dt"
    if env KILN_GOLDEN_TARGET=$archs KILN_GOLDEN_DTYPE=$dt ${tol:+KILN_GOLDEN_TOL=$tol} \
        "$golden" "$dir" "$e.golden.engine" > "$e.golden.txt" 2>&1; then g_status=pass; fi
    cat "$e.golden.txt"
    worst=$(grep -o 'max|golden| = [0-9.e+-]*' "$e.golden.txt" | awk '{print $3}' | sort -g | tail -1)
    echo "== $m ($dt): kiln run on the GPU (twice) and on the CPU interpreter"
    "$kiln" build "$dir" --target sm_90 --dtype $dt -o "$e.cu.engine" \
      && "$kiln" build "$dir" --dtype $dt -o "$e.cpu.engine" || { echo "FAIL build $m $dt"; continue; }
    "$tcuda" --check-engine "$e.cu.engine" $dt sm_90
    local ids=1,7,12,31,5,9,40,2,11,19,23,3,8,15,42,6
    local a b c rate det="no" same="no" cmpres forkres="-"
    a=$("$kiln" run "$e.cu.engine" --ids $ids -n 48 --logits-out "$e.a.f32" 2>"$e.a.err")
    cat "$e.a.err"
    b=$("$kiln" run "$e.cu.engine" --ids $ids -n 48 --logits-out "$e.b.f32" 2>/dev/null)
    c=$("$kiln" run "$e.cpu.engine" --ids $ids -n 48 --logits-out "$e.c.f32" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$e.a.f32" "$e.b.f32"; then det="bitwise"; fi
    [ -n "$a" ] && [ "$a" = "$c" ] && same="same"
    if [ $dt = f32 ]; then
      forkres=$("$tcuda" --fork-check "$e.cu.engine" "$e.cpu.engine") || forkres="FAIL $forkres"
      echo "$forkres"
    fi
    cmpres=$("$tcuda" --compare "$e.a.f32" "$e.c.f32" 1e-5 | sed 's/.*= \([^ ]*\) .*/\1/')
    echo "gpu ids: $a"; echo "cpu ids: $c"; echo "gpu vs interpreter logits: $cmpres"
    rate=$(grep -o '[0-9.]* tokens/s' "$e.a.err" | awk '{print $1}')
    printf '%-17s %-5s %-7s %-10s %-9s %-13s %-13s %-5s %-9s %s\n' "$m" $dt "$g_status" "${worst:--}" "$limit" \
      "${cmpres:--}" "$det" "$same" "$(echo "$forkres" | sed 's/.*= //')" "${rate:--}" >> "$work/$m.summary"
    rm -f "$e".*.engine "$e".*.f32
  done
}

run() {
  local out="${OUT:-/tmp/gpu_check}" work
  mkdir -p "$out"
  exec > >(tee "$out/gpu_check.log") 2>&1
  export LD_LIBRARY_PATH="$gpu/lib:${LD_LIBRARY_PATH:-}"
  local kiln="$gpu/bin/kiln" golden="$gpu/bin/golden_test" tcuda="$gpu/bin/test_cuda" models="$gpu/models"
  work=$(mktemp -d)
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cores"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv || true
  df -h / /dev/shm 2>/dev/null | sed 's/^/  /'
  find_nvrtc || return 1
  ldd "$kiln" | grep 'not found' && return 1
  local summary="$out/summary.txt" t_start=$SECONDS
  printf '%-17s %-5s %-7s %-10s %-9s %-13s %-13s %-5s %-9s %s\n' model dtype golden "worst/gold" limit \
    "gpu-vs-interp" deterministic ids "fork(CoW)" "decode tok/s" > "$summary"

  # the models in parallel (one process each; the GPU has room): their decode rates are measured
  # side by side, not alone (the timing runs below are alone)
  local dir m pids=()
  for dir in "$models"/*/; do
    dir=${dir%/}
    m=$(basename "$dir")
    [ -f "$dir/golden.json" ] || continue
    [ -n "${GPU_CHECK_MODELS:-}" ] && [[ " $GPU_CHECK_MODELS " != *" $m "* ]] && continue
    check_model "$dir" "$work" > "$work/$m.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for dir in "$models"/*/; do
    m=$(basename "${dir%/}")
    [ -f "$work/$m.log" ] && cat "$work/$m.log"
    [ -f "$work/$m.summary" ] && cat "$work/$m.summary" >> "$summary"
  done
  echo "golden and interpreter checks: $((SECONDS - t_start)) s" | tee -a "$summary"

  echo "== stories260k (llama2.c checkpoint, interleaved RoPE) against llama2.c's run.c"
  local s=$models/stories260k st="FAIL" want
  if "$kiln" build "$s/stories260K.bin" --tokenizer "$s/tok512.bin" --target sm_80,sm_90 -o "$work/s260.engine"; then
    # run.c's steps count positions: new tokens = steps - prompt tokens (BOS included) + 1
    local got prompt steps n st=pass
    for prompt in "" Zoo; do
      if [ -z "$prompt" ]; then steps=256; want="$s/expected_greedy_bos_256.txt"; else steps=60; want="$s/expected_greedy_Zoo_60.txt"; fi
      n=$("$kiln" tokenize "$work/s260.engine" --prompt "$prompt" | wc -w)
      got=$("$kiln" run "$work/s260.engine" --prompt "$prompt" -n $((steps - n + 1)) --temperature 0 2>/dev/null)
      [ "$got" = "$(cat "$want")" ] || { st=FAIL; echo "prompt '$prompt': got: $got"; }
    done
  fi
  echo "stories260k vs run.c (bos 256, Zoo 60): $st"
  printf '%-17s %-5s %-7s %s\n' stories260k f32 "$st" "greedy text equal to llama2.c run.c (BOS 256 steps, 'Zoo' 60)" >> "$summary"

  echo "== an engine without the device's architecture"
  local ts=$models/tinystories-656k msg
  "$kiln" build "$ts" --target sm_80 -o "$work/sm80.engine" >/dev/null
  msg=$("$kiln" run "$work/sm80.engine" --ids 1 -n 2 2>&1 >/dev/null); echo "exit $?: $msg"
  echo "arch error: $msg" >> "$summary"

  echo "== prefill and decode timing (tinystories-656k, 300-token prompt, 200 new tokens)"
  local long; long=$(seq -s, 3 302)
  "$kiln" build "$ts" --target sm_90 -o "$work/ts.engine" >/dev/null
  "$kiln" run "$work/ts.engine" --ids "$long" -n 200 2>&1 >/dev/null | sed 's/^/tinystories f32: /' | tee -a "$summary"

  local san=""
  for cand in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do command -v "$cand" >/dev/null && { san=$cand; break; }; done
  if [ -n "$san" ]; then
    # memcheck and racecheck, f32 and bf16 weights, side by side
    local tool dt spids=()
    for dt in f32 bf16; do
      "$kiln" build "$ts" --target sm_90 --dtype $dt -o "$work/san.$dt.engine" >/dev/null
      for tool in memcheck racecheck; do
        (timeout 150 "$san" --tool $tool --error-exitcode 3 "$kiln" run "$work/san.$dt.engine" \
           --ids 1,7,12,31,5,9,40,2,11,19,23,3 -n 3 > "$work/san.$tool.$dt.txt" 2>&1
         echo "exit $?" >> "$work/san.$tool.$dt.txt") &
        spids+=($!)
      done
    done
    wait "${spids[@]}"
    for dt in f32 bf16; do
      for tool in memcheck racecheck; do
        echo "== compute-sanitizer --tool $tool (tinystories-656k, $dt, 12-token prompt, 3 new)"
        tail -5 "$work/san.$tool.$dt.txt"
        echo "compute-sanitizer $tool ($dt): $(tail -1 "$work/san.$tool.$dt.txt"); $(grep -o '[A-Z]* SUMMARY: .*' "$work/san.$tool.$dt.txt" | tr '\n' ' ')" >> "$summary"
      done
    done
  else
    echo "compute-sanitizer: not found" >> "$summary"
  fi
  rm -rf "$work"
  echo "tiny-model checks done: $((SECONDS - t_start)) s" | tee -a "$summary"

  if [ "${GPU_CHECK_LLAMA8B:-1}" != 0 ]; then
    echo "== Llama-3-8B-shaped model, random weights: kiln f32 and bf16 against Hugging Face"
    # what is left of the device tool's 600 s, less a margin for the summary
    local left=$(( ${GPU_CHECK_BUDGET:-585} - SECONDS ))
    echo "(llama8b_check gets ${left} s)"
    PYTHONUNBUFFERED=1 timeout "$left" python3 "$root/bench/llama8b_check.py" \
      --kiln "$kiln" --config "$root/tests/data/llama3-8b-config.json" --out "$out" 2>&1 \
      | grep -v 'it/s\]$' | tee "$out/llama8b.log" | grep -E '^(kiln|HF|floors|llama8b|FAIL|model|GPU|transformers)' \
      >> "$summary"
    echo "llama8b_check exit ${PIPESTATUS[0]}" | tee -a "$summary"
  fi
  echo "== summary ($((SECONDS - t_start)) s)"
  cat "$summary"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac

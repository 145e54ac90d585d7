#!/usr/bin/env bash
# gpu_check.sh — the CUDA backend (phase 1, f32) on a real GPU, against the goldens and the
# interpreter. Two halves:
#
#   bash bench/gpu_check.sh prepare   HERE, on the build machine (needs no GPU): builds kiln,
#       golden_test and test_cuda in build-cuda/ (flex, bison, cJSON and NVRTC live here) and
#       gathers what the GPU machine needs into build-cuda/gpu/: those binaries, the libcjson and
#       libpcre2 they load, and a copy of ../shared/models for the run (an ignored build folder,
#       not the repository). Carry "build-cuda/gpu" with the call.
#
#   bash bench/gpu_check.sh run       THERE, from the repository root (the device tool's `run`):
#       builds nothing that needs flex/bison/cJSON; kiln compiles each engine with NVRTC there.
#       For every shared model with a golden.json:
#         - tests/golden/golden_test through the CUDA backend (KILN_GOLDEN_TARGET=sm_80,sm_90:
#           one engine with both cubins; the runtime picks the device's);
#         - `kiln run --ids ... --logits-out` twice on the GPU: bitwise equal logits and ids;
#         - the same on the CPU interpreter: the GPU's logits within 1e-5 of its, same ids;
#         - forked sequences (a shared, half-full KV block copied on write on the device)
#           against the interpreter (test_cuda --fork-check);
#       stories260k against llama2.c's own greedy output; an sm_80-only engine on the device
#       (the architecture error); compute-sanitizer memcheck and racecheck on one model.
#       Everything goes to $OUT/gpu_check.log; the summary table comes last.
#       GPU_CHECK_MODELS="a b" limits the golden models to those.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${KILN_BUILD:-$root/build-cuda}"
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
  echo "carry: build-cuda/gpu    command: bash bench/gpu_check.sh run"
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

run() {
  local out="${OUT:-/tmp/gpu_check}" work
  mkdir -p "$out"
  exec > >(tee "$out/gpu_check.log") 2>&1
  export LD_LIBRARY_PATH="$gpu/lib:${LD_LIBRARY_PATH:-}"
  local kiln="$gpu/bin/kiln" golden="$gpu/bin/golden_test" tcuda="$gpu/bin/test_cuda" models="$gpu/models"
  work=$(mktemp -d)
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv || true
  find_nvrtc || return 1
  ldd "$kiln" | grep 'not found' && return 1
  local summary="$out/summary.txt"
  printf '%-18s %-8s %-12s %-14s %-13s %-8s %-10s %s\n' model golden "worst/golden" "gpu-vs-interp" deterministic "ids" "fork(CoW)" "decode tok/s" > "$summary"

  for dir in "$models"/*/; do
    dir=${dir%/}
    local m; m=$(basename "$dir")
    [ -f "$dir/golden.json" ] || continue
    [ -n "${GPU_CHECK_MODELS:-}" ] && [[ " $GPU_CHECK_MODELS " != *" $m "* ]] && continue
    echo "== $m: golden_test through the CUDA backend"
    local g_status=FAIL worst="-"
    if KILN_GOLDEN_TARGET=sm_80,sm_90 "$golden" "$dir" "$work/$m.golden.engine" > "$work/$m.golden.txt" 2>&1; then g_status=pass; fi
    cat "$work/$m.golden.txt"
    worst=$(grep -o 'max|golden| = [0-9.e+-]*' "$work/$m.golden.txt" | awk '{print $3}' | sort -g | tail -1)
    echo "== $m: kiln run on the GPU (twice) and on the CPU interpreter"
    "$kiln" build "$dir" --target sm_80,sm_90 -o "$work/$m.cu.engine" && "$kiln" build "$dir" -o "$work/$m.cpu.engine" \
      || { echo "FAIL build $m"; continue; }
    "$tcuda" --check-engine "$work/$m.cu.engine" sm_80 sm_90
    local ids=1,7,12,31,5,9,40,2,11,19,23,3,8,15,42,6
    local a b c rate det="no" same="no" cmpres
    a=$("$kiln" run "$work/$m.cu.engine" --ids $ids -n 48 --logits-out "$work/$m.a.f32" 2>"$work/$m.a.err")
    cat "$work/$m.a.err"
    b=$("$kiln" run "$work/$m.cu.engine" --ids $ids -n 48 --logits-out "$work/$m.b.f32" 2>/dev/null)
    c=$("$kiln" run "$work/$m.cpu.engine" --ids $ids -n 48 --logits-out "$work/$m.c.f32" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$work/$m.a.f32" "$work/$m.b.f32"; then det="bitwise"; fi
    [ -n "$a" ] && [ "$a" = "$c" ] && same="same"
    local forkres; forkres=$("$tcuda" --fork-check "$work/$m.cu.engine" "$work/$m.cpu.engine") || forkres="FAIL $forkres"
    echo "$forkres"
    cmpres=$("$tcuda" --compare "$work/$m.a.f32" "$work/$m.c.f32" 1e-5 | sed 's/.*= \([^ ]*\) .*/\1/')
    echo "gpu ids: $a"; echo "cpu ids: $c"; echo "gpu vs interpreter logits: $cmpres"
    rate=$(grep -o '[0-9.]* tokens/s' "$work/$m.a.err" | awk '{print $1}')
    printf '%-18s %-8s %-12s %-14s %-13s %-8s %-10s %s\n' "$m" "$g_status" "${worst:--}" "${cmpres:--}" "$det" "$same" \
      "$(echo "$forkres" | sed 's/.*= //')" "${rate:--}" >> "$summary"
  done

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
  printf '%-18s %-8s %s\n' stories260k "$st" "greedy text equal to llama2.c run.c (BOS 256 steps, 'Zoo' 60)" >> "$summary"

  echo "== an engine without the device's architecture"
  local ts=$models/tinystories-656k msg
  "$kiln" build "$ts" --target sm_80 -o "$work/sm80.engine" >/dev/null
  msg=$("$kiln" run "$work/sm80.engine" --ids 1 -n 2 2>&1 >/dev/null); echo "exit $?: $msg"
  echo "arch error: $msg" >> "$summary"

  echo "== prefill and decode timing (tinystories-656k, 300-token prompt, 200 new tokens; includes module load)"
  local long; long=$(seq -s, 3 302)
  "$kiln" run "$work/tinystories-656k.cu.engine" --ids "$long" -n 200 2>&1 >/dev/null | tee -a "$summary"

  local san=""
  for cand in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do command -v "$cand" >/dev/null && { san=$cand; break; }; done
  if [ -n "$san" ]; then
    local tool
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool (tinystories-656k, 8-token prompt, 4 new)"
      timeout 90 "$san" --tool $tool --error-exitcode 3 "$kiln" run "$work/tinystories-656k.cu.engine" \
        --ids 1,7,12,31,5,9,40,2 -n 3 > "$work/san.$tool.txt" 2>&1
      local rc=$?
      tail -4 "$work/san.$tool.txt"
      echo "compute-sanitizer $tool: exit $rc; $(grep -o '[A-Z]* SUMMARY: .*' "$work/san.$tool.txt" | tr '\n' ' ')" >> "$summary"
    done
  else
    echo "compute-sanitizer: not found" >> "$summary"
  fi
  echo "== summary"
  cat "$summary"
  rm -rf "$work"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# gpu_runtime_check.sh — the CUDA backend's runtime on a real GPU: CUDA graphs, draws on the
# device, the KV cache sized from free memory, failures that stay with their sequence, out of
# memory, and kiln verify on the GPU. Two halves, as bench/gpu_check.sh:
#
#   bash bench/gpu_runtime_check.sh prepare   HERE (no GPU needed): builds kiln and
#       test_session in build-cuda-b/, builds every shared model's engine for sm_80,sm_90 (NVRTC
#       is here), and gathers binaries, the libcjson/libpcre2 they load, the engines and a copy
#       of ../shared/models into build-cuda-b/gpu/ (ignored). Carry "build-cuda-b/gpu". (The
#       CPU engines are built there: they need no NVRTC, and the carry limit is 64 MiB.)
#
#   bash bench/gpu_runtime_check.sh run       THERE, from the repository root:
#       for every model: test_session on its CUDA engine (per-sequence failures, draws on the
#       GPU against the CPU sampler, 512-draw distribution, graphs vs no graphs bitwise);
#       kiln run greedy and seeded sampling on the GPU against --host-sampling (the CPU
#       sampler on the GPU's logits) and against the CPU engine, twice for repeatability;
#       decode tokens/s with and without graphs (and with host sampling) for tinystories-656k
#       and llama-gqa-tiny; the KV report; out-of-memory messages; kiln verify --target sm_90
#       for every model (this compiles with NVRTC there). Log: $OUT/gpu_runtime_check.log,
#       summary last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${KILN_BUILD:-$root/build-cuda-b}"
gpu="$build/gpu"
models_all="${GPU_RUNTIME_MODELS:-gpt2-tiny llama-gqa-tiny qwen2-tiny stories260k tinystories-656k}"

# The build arguments of a model folder (a llama2.c checkpoint needs its tokenizer named).
model_args() {
  local dir="$1"
  if [ -f "$dir/config.json" ]; then echo "$dir"; else echo "$dir/stories260K.bin --tokenizer $dir/tok512.bin"; fi
}

prepare() {
  local shared="${KILN_SHARED:-$root/../shared}"
  cmake -S "$root" -B "$build" -G Ninja -DKILN_WERROR=ON >/dev/null || return 1
  cmake --build "$build" --target kiln test_session || return 1
  grep -q 'KILN_HAVE_NVRTC:INTERNAL=ON' "$build/CMakeCache.txt" || { echo "kiln was built without NVRTC"; return 1; }
  rm -rf "$gpu" && mkdir -p "$gpu/bin" "$gpu/lib" "$gpu/models" "$gpu/engines" || return 1
  cp "$build/cli/kiln" "$build/tests/session/test_session" "$gpu/bin/"
  for lib in libcjson.so.1 libpcre2-8.so.0; do
    local path
    path=$(ldd "$build/cli/kiln" | awk -v l="$lib" '$1 == l { print $3 }')
    [ -n "$path" ] && cp -L "$path" "$gpu/lib/"
  done
  (cd "$shared/models" && find . -type f ! -name '*.gguf' -exec cp --parents {} "$gpu/models/" \;)
  local m
  for m in $models_all; do
    # shellcheck disable=SC2046
    "$build/cli/kiln" build $(model_args "$shared/models/$m") --target sm_80,sm_90 -o "$gpu/engines/$m.cu.engine" \
      || return 1
  done
  du -sh "$gpu"
  echo "carry: build-cuda-b/gpu    command: bash bench/gpu_runtime_check.sh run"
}

# Where the GPU machine keeps libnvrtc, if the loader does not find it by itself (kiln verify
# compiles there).
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

rate_of() { grep -o '[0-9.]* tokens/s' "$1" | awk '{print $1}'; }

run() {
  local out="${OUT:-/tmp/gpu_runtime_check}" work
  mkdir -p "$out"
  exec > >(tee "$out/gpu_runtime_check.log") 2>&1
  export LD_LIBRARY_PATH="$gpu/lib:${LD_LIBRARY_PATH:-}"
  local kiln="$gpu/bin/kiln" tsess="$gpu/bin/test_session" models="$gpu/models" engines="$gpu/engines"
  work=$(mktemp -d)
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.used --format=csv || true
  find_nvrtc || return 1
  ldd "$kiln" | grep 'not found' && return 1
  local summary="$out/summary.txt" m
  : > "$summary"
  for m in $models_all; do
    # shellcheck disable=SC2046
    "$kiln" build $(model_args "$models/$m") -o "$work/$m.cpu.engine" > /dev/null || { echo "FAIL: cpu build of $m"; return 1; }
  done

  for m in $models_all; do
    local cu="$engines/$m.cu.engine" cpu="$work/$m.cpu.engine"
    echo "== $m: test_session on the GPU"
    "$tsess" "$cu" > "$work/$m.sess" 2>&1; local sess_rc=$?
    cat "$work/$m.sess"
    echo "$m test_session: $([ $sess_rc -eq 0 ] && echo pass || echo FAIL)" >> "$summary"
    grep -E '^(draws|graphs|failures)' "$work/$m.sess" | sed "s/^/  /" >> "$summary"

    echo "== $m: kiln run, draws on the GPU against the host and the CPU engine"
    local ids=1,7,12,31,5,9,40,2,11,19,23,3,8,15,42,6 smp res=""
    for smp in "--temperature 0" "--temperature 0.8 --top-k 40 --top-p 0.95 --seed 3" "--temperature 1 --seed 11"; do
      local g1 g2 h c
      # shellcheck disable=SC2086
      g1=$("$kiln" run "$cu" --ids $ids -n 64 $smp 2>/dev/null)
      g2=$("$kiln" run "$cu" --ids $ids -n 64 $smp 2>/dev/null)
      h=$("$kiln" run "$cu" --ids $ids -n 64 $smp --host-sampling 2>/dev/null)
      c=$("$kiln" run "$cpu" --ids $ids -n 64 $smp 2>/dev/null)
      echo "[$smp] gpu: $g1"; echo "[$smp] cpu engine: $c"
      res="$res [$smp] repeat:$([ -n "$g1" ] && [ "$g1" = "$g2" ] && echo same || echo DIFF)"
      res="$res host-sampling:$([ -n "$g1" ] && [ "$g1" = "$h" ] && echo same || echo DIFF)"
      res="$res cpu-engine:$([ -n "$g1" ] && [ "$g1" = "$c" ] && echo same || echo differs)"
    done
    echo "$m kiln run (64 new):$res" >> "$summary"

    echo "== $m: kiln verify --target sm_90"
    # shellcheck disable=SC2046
    "$kiln" verify $(model_args "$models/$m" | sed 's/ --tokenizer .*//') --target sm_90 > "$work/$m.verify" 2>&1
    local vrc=$?
    cat "$work/$m.verify"
    echo "$m verify --target sm_90: exit $vrc, $(tail -1 "$work/$m.verify"); $(grep 'logits:' "$work/$m.verify" | sed 's/^ *//')" >> "$summary"
  done

  echo "== decode speed: one sequence, 16-token prompt, 256 new tokens (greedy), best of 3"
  for m in tinystories-656k llama-gqa-tiny; do
    local cu="$engines/$m.cu.engine" ids; ids=$(seq -s, 3 18)
    local mode line=""
    for mode in "graphs+gpu-draw:" "no-graphs+gpu-draw:--no-cuda-graphs" "graphs+host-draw:--host-sampling" \
        "no-graphs+host-draw:--no-cuda-graphs --host-sampling"; do
      local name=${mode%%:*} flags=${mode#*:} best=0 r i
      for i in 1 2 3; do
        # shellcheck disable=SC2086
        "$kiln" run "$cu" --ids "$ids" -n "${DECODE_N:-256}" $flags > /dev/null 2> "$work/rate.err"
        r=$(rate_of "$work/rate.err")
        awk -v a="$r" -v b="$best" 'BEGIN { exit !(a > b) }' && best=$r
      done
      cat "$work/rate.err"
      line="$line $name $best"
    done
    echo "$m decode tok/s:$line" | tee -a "$summary"
  done

  echo "== the KV cache from free memory, and out of memory"
  local ts="$engines/tinystories-656k.cu.engine" msg
  msg=$("$kiln" run "$ts" --ids 1 -n 1 2>&1 >/dev/null | head -1); echo "$msg"; echo "KV report: $msg" >> "$summary"
  msg=$("$kiln" run "$ts" --ids 1 -n 1 --max-context 512 --kv-fraction 0.5 2>&1 >/dev/null | head -1); echo "$msg"
  local rc
  msg=$("$kiln" run "$ts" --ids 1 -n 1 --kv-blocks 100000000 2>&1 >/dev/null); rc=$?
  echo "exit $rc: $msg"; echo "OOM (KV blocks): exit $rc: $msg" >> "$summary"
  msg=$("$kiln" run "$ts" --ids 1 -n 1 --kv-blocks 9000000 2>&1 >/dev/null); rc=$?
  echo "exit $rc: $msg"; echo "KV blocks near the device's size: exit $rc: $(echo "$msg" | tr '\n' ' ')" >> "$summary"
  msg=$("$kiln" run "$ts" --ids 1 -n 1 --kv-blocks 9125000 2>&1 >/dev/null); rc=$?
  echo "exit $rc: $msg"; echo "KV blocks at the device's size: exit $rc: $(echo "$msg" | tr '\n' ' ')" >> "$summary"
  msg=$("$kiln" run "$ts" --ids 1 -n 1 --max-context 4096 2>&1 >/dev/null); rc=$?
  echo "exit $rc: $msg"; echo "context over the limit: exit $rc: $msg" >> "$summary"

  local san=""
  for cand in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do command -v "$cand" >/dev/null && { san=$cand; break; }; done
  if [ -n "$san" ]; then
    local tool
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool: graphs and draws (tinystories-656k, top-p draws, 3 new tokens)"
      timeout 60 "$san" --tool $tool --error-exitcode 3 "$kiln" run "$ts" --ids 1,7,12,31 -n 3 --temperature 1 \
        --top-k 40 --top-p 0.9 --seed 2 > "$work/san.$tool.txt" 2>&1
      rc=$?
      tail -3 "$work/san.$tool.txt"
      echo "compute-sanitizer $tool: exit $rc; $(grep -o '[A-Z]* SUMMARY: .*' "$work/san.$tool.txt" | tr '\n' ' ')" >> "$summary"
    done
  fi

  echo "== summary"
  cat "$summary"
  rm -rf "$work"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_runtime_check.sh prepare|run" >&2; exit 2 ;;
esac

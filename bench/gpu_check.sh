#!/usr/bin/env bash
# gpu_check.sh — the one script for the GPU: the CUDA backend on a real GPU (f32, bf16 and f16
# engines against the goldens and the interpreter; the runtime: graphs, draws, failures, memory,
# kiln verify; a Llama-3-8B-shaped model against Hugging Face, bench/llama8b_check.py).
# Two halves:
#
#   bash bench/gpu_check.sh prepare   HERE, on the build machine (needs no GPU): builds kiln,
#       golden_test, test_cuda and test_session in $KILN_BUILD (default build-gpu/; flex, bison,
#       cJSON and NVRTC live here) and gathers what the GPU machine needs into $KILN_BUILD/gpu/:
#       those binaries, the libcjson and libpcre2 they load, and a copy of ../shared/models for
#       the run and the repository's own goldens (tests/data/*: an ignored build folder, not the
#       repository). Carry "build-gpu/gpu" with the call.
#
#   bash bench/gpu_check.sh run       THERE, from the repository root (the device tool's `run`):
#       builds nothing that needs flex/bison/cJSON; kiln compiles each engine with NVRTC there.
#       Stages, GPU_CHECK_STAGES="golden runtime llama8b" (the default: all three, in order):
#       golden — for every shared model with a golden.json, and each weight dtype (f32, bf16, f16)
#         and fast precision (bf16-fast, f16-fast: kiln build --precision fast, half values between
#         kernels and a half KV cache, the tensor-core prefill on half x):
#         fast precision builds with KILN_CUDA_GEMM90_ABOVE=${GPU_CHECK_GEMM90_ABOVE:-8}, so that the
#         matmuls of its prompts run kcu_gemm90 (sm_90a: wgmma fed by TMA; the sm_90 cubin is sm_90a);
#         - tests/golden/golden_test through the CUDA backend (KILN_GOLDEN_TARGET=sm_80,sm_90:
#           one engine with both cubins; the runtime picks the device's): f32 within 1e-4 of the
#           golden per row and greedy ids exact; bf16, f16 within twice Hugging Face's own error
#           in that dtype (tests/cuda/half_tolerances.txt), greedy ids reported;
#         - `kiln run --ids ... --logits-out` twice on the GPU: bitwise equal logits and ids;
#         - the same engine built for the CPU interpreter: the GPU's logits within 1e-5 of its
#           (same weights, different summation order), same ids; fast precision within 2 half
#           ulps (7.8e-3 bf16, 9.8e-4 f16: a sum in another order flips a half rounding now and
#           then, tests/cuda/cuda_fast.sh);
#         - f32: forked sequences (a shared, half-full KV block copied on write on the device)
#           against the interpreter (test_cuda --fork-check);
#         stories260k against llama2.c's own greedy output; an sm_80-only engine on the device
#         (the architecture error); a logits row with one NaN (an error with device and host
#         draws: tests/cuda/nan_logit_checkpoint.py); compute-sanitizer memcheck and racecheck on one model (a
#         12-token prompt: the tiled matmul; decode: the matrix-vector one);
#       verify — kiln verify --target sm_90 for every model (not in the default: runtime has it);
#       runtime — runtime_checks below (test_session, draws, kiln verify --target sm_90 for every
#         model, decode rates with and without graphs, KV sizing, out of memory on the device and,
#         test_oom, on the host, sanitizers);
#       llama8b — bench/llama8b_check.py, given what is left of GPU_CHECK_BUDGET seconds (default
#         585: the device tool's 600 s a command, less a margin), with a `kiln run --profile`.
#       bench — bench/prefill_bench.py (not in the default: it wants a command to itself,
#         GPU_CHECK_STAGES=bench): the ceilings (copy, cuBLAS GEMMs, SDPA), the 8B-shaped model,
#         kiln's engine of it and a torch.compile'd PyTorch peer checked against Hugging Face,
#         `kiln bench --json`, one table with ratios; what is left of GPU_CHECK_BUDGET is its
#         budget. $OUT gets prefill_bench.json, .md (for bench/RESULTS.md), .png (with matplotlib;
#         else `python3 bench/prefill_bench.py --chart prefill_bench.json` here) and .log.
#         PREFILL_BENCH_ARGS adds arguments (e.g. "--lengths 512,2048", or "--tiny" to try the
#         stage on a machine without a GPU).
#       profile — `kiln run --profile` of Llama-3-8B's shape with GPU_PROFILE_LAYERS (default 4) layers at
#         512 and 2048 tokens, and `kiln bench --profile` of a decode of 32 sequences a step
#         and test_session on that engine (the 8B shape's batch invariance)
#         (about 90 s: the per-kernel times and TFLOP/s, `kiln build --stats`' tiles in
#         $OUT/profile_build.txt); with GPU_PROFILE_NCU="kernel name regex", Nsight Compute on those kernels
#         (their first GPU_PROFILE_NCU_COUNT, default 2, launches; GPU_PROFILE_NCU_ON=batch32: in a decode of
#         32 sequences a step, not a prefill); GPU_PROFILE_ALT_ENV="NAME=VALUE ..." builds and
#         profiles the model a second time with that environment (a kcu_build knob) beside the default: $OUT/ncu.txt and, per SASS
#         instruction, warp-stall samples in $OUT/ncu_sass.csv.gz (not in the default). With
#         GPU_CHECK_ALT_REV=REV given to prepare (that revision's kiln, built here as bin/kiln-alt), the
#         model is built by both and every profile runs on both engines: a change's before and after.
#       clocks — why a process's first 2048-token prefill of the 8B shape is faster than the next ones
#         (bench/RESULTS.md, issue #10 step 9): the 8B shape with GPU_CLOCKS_LAYERS (default 32) layers,
#         `kiln bench` of 12 prefills of 2048 tokens back to back, while nvidia-smi samples the SM clock,
#         power and the clock-event reasons every 20 ms: $OUT/clocks.csv, clocks_bench.json.
#       kernels — the prefill kernels alone, on cubins compiled here by NVRTC: tests/cuda/cuda_mm_check
#         --gpu (the mma.sync matmul), cuda_gemm90_check --gpu (the sm_90a wgmma/TMA matmul) with
#         bench/gemm90_vs_cublas.py (cuBLAS on the same shapes), cuda_att_check --gpu (the
#         tensor-core prefill attention) with torch SDPA at the same lengths (not in the default).
#       gemm90 — the kernels stage's cuda_gemm90_check and bench/gemm90_vs_cublas.py alone.
#       mm — the kernels stage's cuda_mm_check --gpu alone (the matmul checks, batch invariance of the
#         tensor-core decode kernel, and the 8B's decode matmuls timed at T = 1, 8, 32).
#       att — the kernels stage's cuda_att_check --gpu alone (kcu_flash_attention and, sm_90a, kcu_flash90).
#       variants — where a fast-precision engine diverges: for each GPU_CHECK_MODELS model (default
#         llama-gqa-tiny tinystories-656k gpt2-tiny) and each build variant of GPU_VARIANTS ("name:ENV=V,ENV=V
#         ..."; default the kcu_build knobs that switch one kernel family off), a bf16-fast engine run
#         with kernel overlap, without it and without graphs, each against the CPU interpreter's
#         logits; kiln verify --precision fast (the first fused value past its tolerance); and
#         compute-sanitizer memcheck, racecheck and synccheck on the default engine.
#       serve — bench/serve_gpu.py (issue #14): `kiln serve` of the 8B shape (GPU_SERVE_LAYERS, default 32;
#         bf16 fast) at concurrency GPU_SERVE_LEVELS (default 1,16,64,256; 512-token prompts, 128 new tokens):
#         throughput and P50/P99 TTFT, inter-token and end-to-end latency; with GPU_SERVE_SOAK=SECONDS a soak at
#         the last level, RSS and device memory growth (a call of its own: GPU_SERVE_LEVELS=64
#         GPU_SERVE_SOAK=480). $OUT/serve_gpu.json, serve_levels.json, serve_soak.json.
#       moe — bench/moe_bench.py (issue #12): a Qwen3-30B-A3B-shaped mixture of experts (GPU_MOE_LAYERS,
#         default 24, of its 48 layers; random bf16, ~31 GB) built and decoded at batch 1 and 32 against
#         the bytes a step must read over the copy rate measured in the run; $OUT/moe_bench.json, and
#         `kiln bench --profile` of both decodes ($OUT/moe_profile_b1.txt, _b32.txt).
#       quant — bench/quant_bench.py (issue #13): the 8B shape (GPU_QUANT_LAYERS, default 32) built bf16 and
#         with --quant GPU_QUANT_SCHEMES (default w4a16,w8a16) from one random bf16 checkpoint, each decoded at
#         batch 1 and 8 against the bytes a step must read over the copy rate measured in the run, and its
#         time to first token at GPU_QUANT_PROMPTS (default 512,2048; the ratio to bf16's printed: fp8's bar is
#         0.6 at 2048); $OUT/quant_bench.json and `kiln bench --profile` of each batch-1 decode
#         ($OUT/quant_profile_<scheme>.txt).
#       decode_ab — a change's effect on a whole decode step, graphs and kernel overlap on (what `kiln bench
#         --profile`, a kernel at a time, does not see): the 8B shape with GPU_AB_LAYERS (default 8) layers,
#         built once a variant of GPU_AB_VARIANTS ("name:ENV=V,ENV=V ...", the environment of its build and of its
#         bench run (a runtime knob such as KILN_CUDA_CARVEOUT=100 too), a word +ARG a build argument:
#         "no_rope:+--disable-pass,+fuse_norm_rope"; @alt: built by prepare's GPU_CHECK_ALT_REV, "before:@alt"; default: the default engine, the
#         L2 prefetches on, each alone (KILN_CUDA_TC_PREFETCH=6, KILN_CUDA_L2_AHEAD=32), x in registers (KILN_CUDA_TC_XRING=0)), `kiln
#         bench` decode at batch 1, 8 and 32 (GPU_AB_BATCHES), the variants interleaved, two rounds
#         (GPU_AB_ROUNDS): $OUT/decode_ab.txt. GPU_AB_MODEL=moe: bench/moe_bench.py's Qwen3-30B-A3B shape instead;
#         GPU_AB_MODELS="llama:8 moe:4": both, with those layers, one after the other.
#       probe — bench/gemv_probe.cu (compiled there by nvcc): the batch-1 matrix-vector designs (weights in
#         flight in registers, a cp.async ring, bulk copies) at the 8B shapes against the copy rate.
#       LLAMA8B_ARGS adds arguments to llama8b_check.py (e.g. "--dtypes bf16").
#       Everything goes to $OUT/gpu_check.log; the summary table comes last.
#       GPU_CHECK_MODELS="a b" limits the golden models to those; GPU_CHECK_DTYPES="f32 bf16" the
#       dtypes (default "f32 bf16 f16 bf16-fast f16-fast"); GPU_RUNTIME_MODELS the runtime stage's models.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${KILN_BUILD:-$root/build-gpu}"
models_all="${GPU_RUNTIME_MODELS:-gpt2-tiny llama-gqa-tiny qwen2-tiny stories260k tinystories-656k gemma2-tiny}"
gpu="$build/gpu"

prepare() {
  local shared="${KILN_SHARED:-$root/../shared}"
  cmake -S "$root" -B "$build" -G Ninja -DKILN_WERROR=ON >/dev/null || return 1
  cmake --build "$build" --target kiln golden_test test_cuda test_session test_oom || return 1
  grep -q 'KILN_HAVE_NVRTC:INTERNAL=ON' "$build/CMakeCache.txt" || { echo "kiln was built without NVRTC"; return 1; }
  rm -rf "$gpu" && mkdir -p "$gpu/bin" "$gpu/lib" "$gpu/models" || return 1
  cmake --build "$build" --target cuda_mm_check cuda_gemm90_check cuda_att_check || return 1
  cp "$build/cli/kiln" "$build/tests/golden/golden_test" "$build/tests/cuda/test_cuda" "$build/tests/session/test_session" \
    "$build/tests/session/test_oom" "$build/tests/cuda/cuda_mm_check" "$build/tests/cuda/cuda_gemm90_check" \
    "$build/tests/cuda/cuda_att_check" "$gpu/bin/"
  mkdir -p "$gpu/cubin" || return 1
  "$build/tests/cuda/cuda_mm_check" --compile sm_90 "$gpu/cubin/mm_sm90.cubin" >/dev/null || return 1
  "$build/tests/cuda/cuda_gemm90_check" --compile "$gpu/cubin/gemm90_sm90a.cubin" >/dev/null || return 1
  "$build/tests/cuda/cuda_att_check" --compile sm_90 "$gpu/cubin/att_sm90.cubin" >/dev/null || return 1
  # the libraries kiln loads that the GPU machine may not have: cJSON, PCRE2, and kiln serve's libmicrohttpd
  # with what it loads (gnutls and its own)
  for lib in libcjson.so.1 libpcre2-8.so.0 libmicrohttpd.so.12 libgnutls.so.30 libp11-kit.so.0 libidn2.so.0 \
    libunistring.so.2 libtasn1.so.6 libnettle.so.8 libhogweed.so.6 libgmp.so.10 libffi.so.8; do
    local path
    path=$(ldd "$build/cli/kiln" | awk -v l="$lib" '$1 == l { print $3 }')
    [ -n "$path" ] && cp -L "$path" "$gpu/lib/"
  done
  # GPU_CHECK_ALT_REV=REV: that revision's kiln too (bin/kiln-alt), so that the profile stage builds the
  # model with it as well and profiles both engines in one call (a change's before and after)
  if [ -n "${GPU_CHECK_ALT_REV:-}" ]; then
    local wt="$build/alt-src"
    rm -rf "$wt" && git -C "$root" worktree prune && git -C "$root" worktree add -f --detach "$wt" "$GPU_CHECK_ALT_REV" \
      >/dev/null || return 1
    cmake -S "$wt" -B "$build/alt-build" -G Ninja -DKILN_SERVER=OFF >/dev/null && cmake --build "$build/alt-build" --target kiln >/dev/null \
      || return 1
    cp "$build/alt-build/cli/kiln" "$gpu/bin/kiln-alt"
    git -C "$root" worktree remove --force "$wt"
  fi
  # the models, without the GGUF copy nothing here reads (GPU_CHECK_NO_MODELS=1: none, for the stages that
  # make their own — mm, att, profile, bench, moe — when the carry's 64 MiB would not hold them beside kiln-alt)
  [ "${GPU_CHECK_NO_MODELS:-0}" = 1 ] \
    || (cd "$shared/models" && find . -type f ! -name '*.gguf' -exec cp --parents {} "$gpu/models/" \;)
  # the repository's own (tests/data/*/golden.json) travel with the work tree: run links them in
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
  for dt in ${GPU_CHECK_DTYPES:-f32 bf16 f16 bf16-fast f16-fast}; do
    # DTYPE-fast: --precision fast with DTYPE weights; the same golden tolerances
    local wdt=${dt%-fast} prec=exact near=1e-5
    if [ "$wdt" != "$dt" ]; then prec=fast; near=$([ $wdt = bf16 ] && echo 7.8e-3 || echo 9.8e-4); fi
    # fast precision: the matmuls of every step above GPU_CHECK_GEMM90_ABOVE tokens (default 8: the
    # golden prompts and the 16-token prompt below) run kcu_gemm90, the sm_90a wgmma/TMA kernels
    local g90=""; [ $prec = fast ] && g90="KILN_CUDA_GEMM90_ABOVE=${GPU_CHECK_GEMM90_ABOVE:-8}"
    local tol limit="1e-4" archs=sm_90; tol=$(half_tolerance "$m" "$wdt")
    [ -n "$tol" ] && limit=$tol
    [ $dt = f32 ] && archs=sm_80,sm_90 # one engine of two cubins; the runtime picks the device's
    echo "== $m ($dt weights): golden_test through the CUDA backend ($archs; limit $limit${g90:+; $g90})"
    local g_status=FAIL worst="-" e="$work/$m.$dt"
    if env $g90 KILN_GOLDEN_TARGET=$archs KILN_GOLDEN_DTYPE=$wdt KILN_GOLDEN_PRECISION=$prec ${tol:+KILN_GOLDEN_TOL=$tol} \
        "$golden" "$dir" "$e.golden.engine" > "$e.golden.txt" 2>&1; then g_status=pass; fi
    cat "$e.golden.txt"
    worst=$(grep -o 'max|golden| = [0-9.e+-]*' "$e.golden.txt" | awk '{print $3}' | sort -g | tail -1)
    echo "== $m ($dt): kiln run on the GPU (twice) and on the CPU interpreter"
    env $g90 "$kiln" build "$dir" --target sm_90 --dtype $wdt --precision $prec -o "$e.cu.engine" \
      && "$kiln" build "$dir" --dtype $wdt --precision $prec -o "$e.cpu.engine" || { echo "FAIL build $m $dt"; continue; }
    "$tcuda" --check-engine "$e.cu.engine" $wdt sm_90
    local ids=1,7,12,31,5,9,40,2,11,19,23,3,8,15,42,6
    local a b c rate det="no" same="no" cmpres forkres="-"
    a=$("$kiln" run "$e.cu.engine" --ids $ids -n 48 --ignore-eos --logits-out "$e.a.f32" 2>"$e.a.err")
    cat "$e.a.err"
    b=$("$kiln" run "$e.cu.engine" --ids $ids -n 48 --ignore-eos --logits-out "$e.b.f32" 2>/dev/null)
    c=$("$kiln" run "$e.cpu.engine" --ids $ids -n 48 --ignore-eos --logits-out "$e.c.f32" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$e.a.f32" "$e.b.f32"; then det="bitwise"; fi
    [ -n "$a" ] && [ "$a" = "$c" ] && same="same"
    if [ $dt = f32 ]; then
      forkres=$("$tcuda" --fork-check "$e.cu.engine" "$e.cpu.engine") || forkres="FAIL $forkres"
      echo "$forkres"
    fi
    cmpres=$("$tcuda" --compare "$e.a.f32" "$e.c.f32" $near | sed 's/.*= \([^ ]*\) .*/\1/')
    echo "gpu ids: $a"; echo "cpu ids: $c"; echo "gpu vs interpreter logits: $cmpres"
    rate=$(grep -o '[0-9.]* tokens/s' "$e.a.err" | awk '{print $1}')
    printf '%-17s %-9s %-7s %-10s %-9s %-13s %-13s %-5s %-9s %s\n' "$m" $dt "$g_status" "${worst:--}" "$limit" \
      "${cmpres:--}" "$det" "$same" "$(echo "$forkres" | sed 's/.*= //')" "${rate:--}" >> "$work/$m.summary"
    rm -f "$e".*.engine "$e".*.f32
  done
}

# The build arguments of a model folder (a llama2.c checkpoint needs its tokenizer named).
model_args() {
  local dir="$1"
  if [ -f "$dir/config.json" ]; then echo "$dir"; else echo "$dir/stories260K.bin --tokenizer $dir/tok512.bin"; fi
}

rate_of() { grep -o '[0-9.]* tokens/s' "$1" | awk '{print $1}'; }

# The path of compute-sanitizer, or nothing.
sanitizer() {
  local cand
  for cand in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do command -v "$cand" >/dev/null && { echo "$cand"; return; }; done
}

# variant_checks SUMMARY: the variants stage (see the top)
variant_checks() {
  local summary="$1" work m v name envs how res rc
  local kiln="$gpu/bin/kiln" tcuda="$gpu/bin/test_cuda" models="$gpu/models"
  work=$(mktemp -d)
  local ids=1,7,12,31,5,9,40,2,11,19,23,3,8,15,42,6
  local vmodels=${GPU_CHECK_MODELS:-llama-gqa-tiny tinystories-656k gpt2-tiny}
  local variants=${GPU_VARIANTS:-"default: batch_variant:KILN_CUDA_BATCH_VARIANT=1 ring32:KILN_CUDA_TC_RING=32 no_gemm90:KILN_CUDA_GEMM90=0 tc16:KILN_CUDA_GEMM90_ABOVE=32 no_flash_decode:KILN_CUDA_FLASH_DECODE=0"}
  # every engine first, side by side (NVRTC takes one core an engine)
  local pids=()
  for m in $vmodels; do
    "$kiln" build "$models/$m" --dtype bf16 --precision fast -o "$work/$m.cpu.engine" >/dev/null 2>&1 &
    pids+=($!)
    for v in $variants; do
      name=${v%%:*}; envs=${v#*:}; envs=${envs//,/ }
      # shellcheck disable=SC2086
      env KILN_CUDA_GEMM90_ABOVE=8 $envs "$kiln" build "$models/$m" --target sm_90 --dtype bf16 --precision fast \
        -o "$work/$m.$name.engine" >"$work/$m.$name.build" 2>&1 &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  for m in $vmodels; do
    local dir="$models/$m"
    "$kiln" run "$work/$m.cpu.engine" --ids $ids -n 48 --logits-out "$work/$m.cpu.f32" >/dev/null 2>&1
    for v in $variants; do
      name=${v%%:*}
      [ -f "$work/$m.$name.engine" ] || { echo "variant FAIL build $m $name: $(tail -2 "$work/$m.$name.build")" | tee -a "$summary"; continue; }
      for how in "" --no-kernel-overlap --no-cuda-graphs; do
        "$kiln" run "$work/$m.$name.engine" --ids $ids -n 48 $how --logits-out "$work/g.f32" >/dev/null 2>"$work/run.err"; rc=$?
        res=$("$tcuda" --compare "$work/g.f32" "$work/$m.cpu.f32" 7.8e-3 2>&1 | tail -1)
        printf 'variant %-15s %-14s %-20s exit %d: %s\n' "$m" "$name" "${how:-overlap,graphs}" $rc "$res" | tee -a "$summary"
      done
    done
    timeout 120 "$kiln" verify "$dir" --target sm_90 --dtype bf16 --precision fast --tokens 5 --steps 4 >"$work/verify.txt" 2>&1
    echo "variant $m verify --precision fast --tokens 5: exit $?: $(grep -iE 'diverg|first|logits:' "$work/verify.txt" | head -4 | tr '\n' ' ')" | tee -a "$summary"
    tail -30 "$work/verify.txt"
  done
  local san tool m0=${vmodels%% *}
  san=$(sanitizer)
  if [ -n "$san" ] && [ -f "$work/$m0.default.engine" ]; then
    for tool in memcheck racecheck synccheck; do
      timeout 150 "$san" --tool $tool --error-exitcode 3 "$kiln" run "$work/$m0.default.engine" --ids $ids -n 4 \
        > "$work/san.$tool.txt" 2>&1; rc=$?
      head -40 "$work/san.$tool.txt"
      echo "variant $m0 bf16-fast compute-sanitizer $tool: exit $rc; $(grep -o '[A-Z]* SUMMARY: .*' "$work/san.$tool.txt" | tr '\n' ' ')" | tee -a "$summary"
    done
  fi
  rm -rf "$work"
}

# runtime_checks SUMMARY: the runtime on the GPU — for every model: test_session on its CUDA
# engine (per-sequence failures, draws on the GPU against the CPU sampler, a 512-draw
# distribution, graphs vs no graphs bitwise); kiln run greedy and seeded on the GPU against
# --host-sampling and against the CPU engine, twice; kiln verify --target sm_90 (compiles with
# NVRTC there); then decode tokens/s with and without graphs, the KV report, out-of-memory
# messages, compute-sanitizer over graphs and draws; and kiln run --profile of one model.
runtime_checks() {
  local summary="$1" work
  local kiln="$gpu/bin/kiln" tsess="$gpu/bin/test_session" models="$gpu/models" engines
  work=$(mktemp -d); engines=$work
  local m
  for m in $models_all; do
    # shellcheck disable=SC2046
    "$kiln" build $(model_args "$models/$m") -o "$work/$m.cpu.engine" > /dev/null || { echo "FAIL: cpu build of $m"; return 1; }
    # shellcheck disable=SC2046
    "$kiln" build $(model_args "$models/$m") --target sm_80,sm_90 -o "$work/$m.cu.engine" > /dev/null \
      || { echo "FAIL: cuda build of $m"; return 1; }
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

  echo "== out of memory on the host inside kiln.h's calls, on the GPU (tests/session/test_oom ENGINE: each allocation failing once)"
  timeout "${GPU_OOM_TIMEOUT:-240}" "$gpu/bin/test_oom" "$ts" > "$work/oom.txt" 2>&1; rc=$?
  tail -3 "$work/oom.txt"
  echo "test_oom (tinystories-656k, CUDA engine): exit $rc; $(tail -1 "$work/oom.txt")" >> "$summary"

  local san
  san=$(sanitizer)
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

  if "$kiln" run --help 2>&1 | grep -q -- --profile; then
    echo "== kiln run --profile (tinystories-656k, 16-token prompt, 64 new; no graphs)"
    "$kiln" run "$engines/tinystories-656k.cu.engine" --ids "$(seq -s, 3 18)" -n 64 --profile 2>&1 >/dev/null | tail -40
  fi
  rm -rf "$work"
}


run() {
  local out="${OUT:-/tmp/gpu_check}" work
  mkdir -p "$out"
  exec > >(tee "$out/gpu_check.log") 2>&1
  export LD_LIBRARY_PATH="$gpu/lib:${LD_LIBRARY_PATH:-}"
  local kiln="$gpu/bin/kiln" golden="$gpu/bin/golden_test" tcuda="$gpu/bin/test_cuda" models="$gpu/models"
  work=$(mktemp -d)
  # the repository's own models (tests/data/*/golden.json), beside ../shared's, as the tests run them (linked:
  # copied by prepare they pushed the carry past its 64 MiB)
  local own
  for own in "$root"/tests/data/*/golden.json; do ln -sfn "$(dirname "$own")" "$models/" || return 1; done
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cores"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv || true
  df -h / /dev/shm 2>/dev/null | sed 's/^/  /'
  find_nvrtc || return 1
  ldd "$kiln" | grep 'not found' && return 1
  local summary="$out/summary.txt" t_start=$SECONDS
  printf '%-17s %-9s %-7s %-10s %-9s %-13s %-13s %-5s %-9s %s\n' model dtype golden "worst/gold" limit \
    "gpu-vs-interp" deterministic ids "fork(CoW)" "decode tok/s" > "$summary"

  local stages=" ${GPU_CHECK_STAGES:-golden runtime llama8b} "
  if [[ $stages == *" golden "* ]]; then
  # the models in parallel (one process each; the GPU has room): their decode rates are measured
  # side by side, not alone (the timing runs below are alone)
  local dir m pids=()
  for dir in "$models"/*/; do
    dir=${dir%/}
    m=$(basename "$dir")
    [ -f "$dir/golden.json" ] || continue
    grep -q '"quantization_config"' "$dir/config.json" && continue # kiln does not read quantized checkpoints yet
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
  printf '%-17s %-9s %-7s %s\n' stories260k f32 "$st" "greedy text equal to llama2.c run.c (BOS 256 steps, 'Zoo' 60)" >> "$summary"

  echo "== an engine without the device's architecture"
  local ts=$models/tinystories-656k msg
  "$kiln" build "$ts" --target sm_80 -o "$work/sm80.engine" >/dev/null
  msg=$("$kiln" run "$work/sm80.engine" --ids 1 -n 2 2>&1 >/dev/null); echo "exit $?: $msg"
  echo "arch error: $msg" >> "$summary"

  echo "== one NaN logit among finite ones (tests/cuda/nan_logit_checkpoint.py): an error, device or host draws"
  mkdir -p "$work/nan"
  python3 "$root/tests/cuda/nan_logit_checkpoint.py" "$ts" "$work/nan" \
    && "$kiln" build "$work/nan" --target sm_90 -o "$work/nan.engine" >/dev/null
  local how rc
  for how in "" --host-sampling; do
    msg=$("$kiln" run "$work/nan.engine" --ids 1,7 -n 4 $how 2>&1 >/dev/null); rc=$?
    echo "exit $rc: $msg"
    echo "nan logit (${how:-device draws}): exit $rc: ${msg##*$'\n'}" >> "$summary"
  done

  echo "== prefill and decode timing (tinystories-656k, 300-token prompt, 200 new tokens)"
  local long; long=$(seq -s, 3 302)
  "$kiln" build "$ts" --target sm_90 -o "$work/ts.engine" >/dev/null
  "$kiln" run "$work/ts.engine" --ids "$long" -n 200 2>&1 >/dev/null | sed 's/^/tinystories f32: /' | tee -a "$summary"

  local san
  san=$(sanitizer)
  if [ -n "$san" ]; then
    # memcheck and racecheck, f32, bf16 and bf16-fast engines, side by side
    local tool dt spids=()
    # bf16-fast: kcu_matmul_tc's cp.async ring and the tensor-core kernels, which f32 and bf16 exact never take
    for dt in f32 bf16 bf16-fast; do
      local sdt=${dt%-fast} sprec=exact; [ "$sdt" != "$dt" ] && sprec=fast
      "$kiln" build "$ts" --target sm_90 --dtype $sdt --precision $sprec -o "$work/san.$dt.engine" >/dev/null
      for tool in memcheck racecheck; do
        (timeout 150 "$san" --tool $tool --error-exitcode 3 "$kiln" run "$work/san.$dt.engine" \
           --ids 1,7,12,31,5,9,40,2,11,19,23,3 -n 3 > "$work/san.$tool.$dt.txt" 2>&1
         echo "exit $?" >> "$work/san.$tool.$dt.txt") &
        spids+=($!)
      done
    done
    wait "${spids[@]}"
    for dt in f32 bf16 bf16-fast; do
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
  fi
  if [[ $stages == *" verify "* ]]; then
    # kiln verify on the GPU alone (the runtime stage runs it too): fused CUDA kernels against the
    # unfused interpreter, value by value
    local vm vrc vwork
    vwork=$(mktemp -d)
    for vm in $models_all; do
      # shellcheck disable=SC2046
      "$kiln" verify $(model_args "$models/$vm" | sed 's/ --tokenizer .*//') --target sm_90 > "$vwork/$vm.verify" 2>&1
      vrc=$?
      cat "$vwork/$vm.verify"
      echo "$vm verify --target sm_90: exit $vrc, $(tail -1 "$vwork/$vm.verify"); $(grep 'logits:' "$vwork/$vm.verify" | sed 's/^ *//')" >> "$summary"
    done
    rm -rf "$vwork"
  fi
  if [[ $stages == *" runtime "* ]]; then
    echo "== runtime checks" | tee -a "$summary"
    runtime_checks "$summary"
    echo "runtime checks done: $((SECONDS - t_start)) s" | tee -a "$summary"
  fi

  if [[ $stages == *" variants "* ]]; then
    variant_checks "$summary"
  fi
  if [[ $stages == *" llama8b "* ]]; then
    echo "== Llama-3-8B-shaped model, random weights: kiln f32 and bf16 against Hugging Face"
    # what is left of the device tool's 600 s, less a margin for the summary
    local left=$(( ${GPU_CHECK_BUDGET:-585} - SECONDS ))
    echo "(llama8b_check gets ${left} s)"
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout "$left" python3 "$root/bench/llama8b_check.py" \
      --kiln "$kiln" --config "$root/tests/data/llama3-8b-config.json" --out "$out" ${LLAMA8B_ARGS:-} 2>&1 \
      | grep -v 'it/s\]$' | tee "$out/llama8b.log" | grep -E '^(kiln|HF|floors|llama8b|FAIL|model|GPU|transformers)' \
      >> "$summary"
    echo "llama8b_check exit ${PIPESTATUS[0]}" | tee -a "$summary"
  fi
  if [[ $stages == *" bench "* ]]; then
    echo "== kiln against the ceilings and a compiled PyTorch peer (bench/prefill_bench.py)"
    # what is left of the device tool's 600 s; the script keeps 15 s of it for the report
    local left=$(( ${GPU_CHECK_BUDGET:-585} - SECONDS ))
    echo "(prefill_bench gets ${left} s)"
    # the SM clock and power every 100 ms beside it (the H200 caps its power: sustained tensor-core
    # work runs at 1650-1815 MHz, not 1980; the clocks stage)
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 100 \
      > "$out/bench_clocks.csv" 2>&1 &
    local bsmi=$!
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout "$left" python3 "$root/bench/prefill_bench.py" --kiln "$kiln" --out "$out" \
      --budget $(( left - 15 )) ${PREFILL_BENCH_ARGS:-} 2>&1 | grep -v 'it/s\]$' | tee "$out/prefill_bench.log" \
      | grep -E '^(kiln|peer|copy|T = |SKIP|FAIL|prefill_bench|device|GPU memory)' >> "$summary"
    echo "prefill_bench exit ${PIPESTATUS[0]}" | tee -a "$summary"
    kill $bsmi 2>/dev/null; wait $bsmi 2>/dev/null
    [ -f "$out/prefill_bench.md" ] && cat "$out/prefill_bench.md" >> "$summary"
  fi
  if [[ $stages == *" quant "* ]] && [ -d "$gpu/models/tinystories-656k" ]; then
    # issue #13, correctness on the GPU first: TinyStories-656K quantized (bf16 fast), the GPU's logits of a
    # 40-token prompt and 4 greedy steps against the interpreter's engine of the same codes, within
    # tests/cuda/cuda_quant.sh's tolerances (0.0156 weight-only; x-quantized fp8 0.08, w8a8 0.05)
    local qm="$gpu/models/tinystories-656k" qd="/dev/shm/gpu_check_quant" qids
    qids=$(python3 -c "print(','.join(str(1 + 37 * i % 2000) for i in range(40)))")
    mkdir -p "$qd"
    # (kv-int8, kv-fp8: bf16 weights, the KV cache of codes, --kv-dtype: tests/cuda/cuda_quant.sh's 0.0156)
    for qs in w4a16:0.0156 w8a16:0.0156 fp8:0.08 w8a8:0.05 kv-int8:0.0156 kv-fp8:0.0156; do
      local scheme=${qs%%:*} tol=${qs#*:} qargs
      if [[ $scheme == kv-* ]]; then qargs=(--kv-dtype "${scheme#kv-}"); else qargs=(--quant "$scheme"); fi
      "$kiln" build "$qm" --dtype bf16 "${qargs[@]}" -o "$qd/cpu.engine" >/dev/null 2>&1 &&
        "$kiln" build "$qm" --dtype bf16 "${qargs[@]}" --target sm_90 -o "$qd/gpu.engine" >/dev/null 2>&1 &&
        "$kiln" run "$qd/gpu.engine" --ids "$qids" -n 4 --temperature 0 --logits-out "$qd/gpu.bin" >/dev/null 2>&1 &&
        "$kiln" run "$qd/cpu.engine" --ids "$qids" -n 4 --temperature 0 --logits-out "$qd/cpu.bin" >/dev/null 2>&1 ||
        { echo "FAIL: quant $scheme: build or run" | tee -a "$summary"; continue; }
      python3 -c "
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
x = struct.unpack('%df' % (len(a) // 4), a); y = struct.unpack('%df' % (len(b) // 4), b)
err = max(abs(p - q) for p, q in zip(x, y)) / max(abs(q) for q in y) if a and len(a) == len(b) else 1e9
print('quant %s on the GPU: max|gpu-cpu|/max|cpu| = %.3g (tolerance %s) %s' % (sys.argv[3], err, sys.argv[4],
      'ok' if err <= float(sys.argv[4]) else 'FAIL'))" "$qd/gpu.bin" "$qd/cpu.bin" "$scheme" "$tol" | tee -a "$summary"
    done
    rm -rf "$qd"
  fi
  if [[ $stages == *" quant "* ]]; then
    # issue #13: quantized 8B-shaped engines against their bytes floors and the bf16 engine
    echo "== bench/quant_bench.py: Llama-3-8B's shape, ${GPU_QUANT_LAYERS:-32} layers, ${GPU_QUANT_SCHEMES:-w4a16,w8a16}"
    PYTHONUNBUFFERED=1 timeout $(( ${GPU_CHECK_BUDGET:-585} - SECONDS )) python3 "$root/bench/quant_bench.py" \
      --kiln "$kiln" --layers "${GPU_QUANT_LAYERS:-32}" --schemes "${GPU_QUANT_SCHEMES:-w4a16,w8a16}" --out "$out" \
      --prompts "${GPU_QUANT_PROMPTS:-512,2048}" --profile 2>&1 | grep -v 'it/s\]$' | tee "$out/quant_bench.log" \
      | grep -E '^(\||copy|model|kiln|floor|FAIL|.* time to first token / )' >> "$summary"
    echo "quant_bench exit ${PIPESTATUS[0]}" | tee -a "$summary"
    for f in "$out"/quant_profile_*.txt; do
      [ -f "$f" ] && { echo "== $(basename "$f")"; grep -A16 "decode steps" "$f" | head -20; } | tee -a "$summary"
    done
  fi
  if [[ $stages == *" serve "* ]]; then
    echo "== bench/serve_gpu.py: kiln serve, Llama-3-8B's shape, ${GPU_SERVE_LAYERS:-32} layers"
    PYTHONUNBUFFERED=1 timeout $(( ${GPU_CHECK_BUDGET:-585} - SECONDS )) python3 "$root/bench/serve_gpu.py" \
      --kiln "$kiln" --layers "${GPU_SERVE_LAYERS:-32}" --levels "${GPU_SERVE_LEVELS:-1,16,64,256}" \
      --soak "${GPU_SERVE_SOAK:-0}" --out "$out" 2>&1 | grep -v 'it/s\]$' | tee "$out/serve_gpu.log" \
      | grep -E '^(\||soak|kiln build|FAIL)' >> "$summary"
    echo "serve_gpu exit ${PIPESTATUS[0]}" | tee -a "$summary"
  fi
  if [[ $stages == *" moe "* ]]; then
    # issue #12: a Qwen3-30B-A3B-shaped MoE (24 layers, random bf16) decoded against its bytes floor
    echo "== bench/moe_bench.py: Qwen3-30B-A3B's shape, ${GPU_MOE_LAYERS:-24} layers"
    PYTHONUNBUFFERED=1 timeout $(( ${GPU_CHECK_BUDGET:-585} - SECONDS )) python3 "$root/bench/moe_bench.py" \
      --kiln "$kiln" --layers "${GPU_MOE_LAYERS:-24}" --out "$out" --profile 2>&1 | grep -v 'it/s\]$' | tee "$out/moe_bench.log" \
      | grep -E '^(\||copy|model|kiln|floor|FAIL)' >> "$summary"
    echo "moe_bench exit ${PIPESTATUS[0]}" | tee -a "$summary"
    # where a step's time goes: the profiles' kernel tables (decode steps)
    for f in "$out"/moe_profile_b*.txt; do
      [ -f "$f" ] && { echo "== $(basename "$f")"; grep -A24 "decode steps" "$f" | head -30; } | tee -a "$summary"
    done
  fi
  if [[ $stages == *" decode_ab "* ]]; then
    # GPU_AB_MODELS="llama:8 moe:4": each model (llama: the 8B shape; moe: bench/moe_bench.py's Qwen3-30B-A3B
    # shape) with that many layers, one after another (default: GPU_AB_MODEL, llama or moe, GPU_AB_LAYERS layers)
    local variants=${GPU_AB_VARIANTS:-"default: tc_prefetch:KILN_CUDA_TC_PREFETCH=6 l2_ahead:KILN_CUDA_L2_AHEAD=32 no_xring:KILN_CUDA_TC_XRING=0"}
    local m="/dev/shm/gpu_check_ab" v name envs r b ab model layers shape
    for ab in ${GPU_AB_MODELS:-"${GPU_AB_MODEL:-llama}:${GPU_AB_LAYERS:-8}"}; do
      model=${ab%%:*} layers=${ab#*:}
      [ "$layers" = "$ab" ] && layers=8
      shape="Llama-3-8B's shape"
      [ "$model" = moe ] && shape="Qwen3-30B-A3B's shape"
      echo "== decode_ab: $shape, $layers layers, variants: $variants" | tee -a "$summary" "$out/decode_ab.txt"
      if [ "$model" = moe ]; then
        (cd "$root/bench" && python3 -c "
from llama8b_common import make_checkpoint
from moe_bench import QWEN3_30B_A3B
make_checkpoint(dict(QWEN3_30B_A3B, num_hidden_layers=$layers), '$m', 'cuda', 0,
                ('Qwen3MoeConfig', 'Qwen3MoeForCausalLM'), '4GB')" 2>&1 | tail -1)
      else
        (cd "$root/bench" && python3 -c "
import json
from llama8b_common import make_checkpoint
cfg = json.load(open('../tests/data/llama3-8b-config.json')); cfg['num_hidden_layers'] = $layers
make_checkpoint(cfg, '$m', 'cuda', 0)" 2>&1 | tail -1)
      fi
      local pids=()
      for v in $variants; do
        name=${v%%:*}; envs=${v#*:}; envs=${envs//,/ }
        # a word that starts with + is a build argument (no_rope:+--disable-pass,+fuse_norm_rope), the rest the environment
        # and @alt builds it with bin/kiln-alt (prepare's GPU_CHECK_ALT_REV): before:@alt
        local word vargs=() venv=() vkiln="$kiln"
        for word in $envs; do
          if [ "$word" = @alt ]; then vkiln="$gpu/bin/kiln-alt"
          elif [[ $word == +* ]]; then vargs+=("${word#+}")
          else venv+=("$word"); fi
        done
        env "${venv[@]}" "$vkiln" build "$m" --dtype bf16 --precision fast --max-tokens 2048 --target sm_90 "${vargs[@]}" \
          -o "$m.$name.engine" >"$out/decode_ab_build_${model}_$name.txt" 2>&1 &
        pids+=($!)
      done
      wait "${pids[@]}"
      rm -rf "$m"
      for r in $(seq 1 "${GPU_AB_ROUNDS:-2}"); do
        for b in ${GPU_AB_BATCHES:-1 8 32}; do
          for v in $variants; do
            name=${v%%:*}; envs=${v#*:}; envs=${envs//,/ }
            [ -f "$m.$name.engine" ] || { echo "FAIL: kiln build of variant $name" | tee -a "$summary"; continue; }
            local bo=(--batch "$b") benv=()
            [ "$b" = 1 ] && bo=()
            # the variant's environment holds for the run too (a runtime knob: KILN_CUDA_CARVEOUT)
            for word in $envs; do [[ $word == +* || $word == @alt ]] || benv+=("$word"); done
            echo "$model round $r, $name: $(env "${benv[@]}" "$kiln" bench "$m.$name.engine" --prompts 1 --decode-prompt 16 --decode 64 \
              "${bo[@]}" --reps 3 --warmup 1 2>&1 | grep -E "^decode, batch $b,")" | tee -a "$out/decode_ab.txt" "$summary"
          done
        done
      done
      rm -f "$m".*.engine
    done
  fi
  if [[ $stages == *" profile "* ]]; then
    # the 8B shape with few layers (every layer runs the same kernels): quick per-kernel figures
    local layers=${GPU_PROFILE_LAYERS:-4} m="/dev/shm/gpu_check_profile"
    echo "== kiln run --profile: Llama-3-8B's shape, $layers layers, at 512 and 2048 tokens"
    (cd "$root/bench" && python3 -c "
import json
from llama8b_common import make_checkpoint
cfg = json.load(open('../tests/data/llama3-8b-config.json')); cfg['num_hidden_layers'] = $layers
make_checkpoint(cfg, '$m', 'cuda', 0)" 2>&1 | tail -1)
    "$kiln" build "$m" --dtype bf16 --max-tokens 2048 --target sm_90 --stats -o "$m.engine" >"$out/profile_build.txt" 2>&1 \
      || { echo "FAIL: kiln build of the profile model" | tee -a "$summary"; }
    # GPU_PROFILE_ALT_ENV="NAME=VALUE ...": the same model built again with that environment (a
    # kcu_build knob, e.g. KILN_CUDA_GEMM90_ABOVE=512) and profiled beside the default: profile_alt_T.txt
    # or, with bin/kiln-alt (prepare's GPU_CHECK_ALT_REV), built by that revision's kiln
    local alt_kiln="$kiln" alt_what="${GPU_PROFILE_ALT_ENV:-}"
    if [ -z "$alt_what" ] && [ -x "$gpu/bin/kiln-alt" ]; then
      alt_kiln="$gpu/bin/kiln-alt" alt_what="kiln-alt (GPU_CHECK_ALT_REV)"
    fi
    if [ -n "$alt_what" ]; then
      # shellcheck disable=SC2086
      env ${GPU_PROFILE_ALT_ENV:-} "$alt_kiln" build "$m" --dtype bf16 --max-tokens 2048 --target sm_90 --stats \
        -o "$m.alt.engine" >"$out/profile_alt_build.txt" 2>&1 \
        || { echo "FAIL: kiln build of the profile model with $alt_what" | tee -a "$summary"; }
    fi
    local T ids e
    for T in 512 2048; do
      ids=$(python3 -c "print(','.join(str(i % 1000 + 5) for i in range($T)))")
      for e in "" alt; do
        local eng="$m.engine" tag="" 
        if [ -n "$e" ]; then
          [ -f "$m.alt.engine" ] || continue
          eng="$m.alt.engine" tag="_alt"
          echo "-- with $alt_what" | tee -a "$summary"
        fi
        "$kiln" run "$eng" --ids "$ids" -n 2 --profile >/dev/null 2>&1 # warm
        "$kiln" run "$eng" --ids "$ids" -n 2 --profile 2>&1 | tee "$out/profile${tag}_$T.txt" \
          | grep -A10 "prefill step ($T tokens; > [0-9]* tokens a step): device" | tee -a "$summary"
      done
    done
    # kiln bench on the same engine: its time to first token beside the profile's (the bench stage's
    # `kiln bench` of the 32-layer model measured 5 ms above its `kiln run --profile`, step 6)
    "$kiln" bench "$m.engine" --prompts 512,2048 --decode 0 --reps 10 --warmup 2 2>&1 | tee "$out/profile_bench.txt" \
      | grep -E 'first token|tokens' | tee -a "$summary"
    # a batched decode's kernels alone (32 sequences a step; the one-token steps in their own table), and
    # batch 1 and 8 after 512 positions (the decode table: steps of at most 8 tokens); the alt engine's too
    local b
    for e in "" alt; do
      local eng="$m.engine" tag=""
      if [ -n "$e" ]; then
        [ -f "$m.alt.engine" ] || continue
        eng="$m.alt.engine" tag="alt "
      fi
      "$kiln" bench "$eng" --prompts 1 --decode-prompt 1 --decode 16 --batch 32 --reps 1 --warmup 1 --profile \
        >"$out/profile_${tag:+alt_}batch32.txt" 2>&1
      grep -A10 "prefill steps (.*> 8 tokens a step): device" "$out/profile_${tag:+alt_}batch32.txt" \
        | sed "s/^/${tag}batch 32: /" | tee -a "$summary"
      for b in 1 8; do
        local bo=(--batch "$b")
        [ "$b" = 1 ] && bo=()
        "$kiln" bench "$eng" --prompts 1 --decode-prompt 512 --decode 16 "${bo[@]}" --reps 1 --warmup 1 --profile \
          >"$out/profile_${tag:+alt_}batch$b.txt" 2>&1
        grep -A12 "decode steps (.*<= 8 tokens a step): device" "$out/profile_${tag:+alt_}batch$b.txt" \
          | sed "s/^/${tag}batch $b: /" | tee -a "$summary"
      done
    done
    # the 8B shape's batch invariance (#11): test_session on this engine — a sequence decoded alone, among
    # 7 and among 31 others, bitwise (and its other checks: failures, draws, graphs)
    timeout 180 "$gpu/bin/test_session" "$m.engine" >"$out/profile_session.txt" 2>&1
    echo "8B-shaped ($layers layers) test_session exit $?: $(grep -E '^session:' "$out/profile_session.txt")" | tee -a "$summary"
    grep -E '^batch' "$out/profile_session.txt" | sed 's/^/  8B: /' | tee -a "$summary"
    # GPU_PROFILE_NCU="regex of kernel names": Nsight Compute on them (their first launches at 2048
    # tokens): throughput, warp states, and the warp-stall samples per SASS instruction as CSV (where a
    # kernel waits: bench/RESULTS.md, issue #10 step 4, found the epilogue's serialized loads so)
    if [ -n "${GPU_PROFILE_NCU:-}" ] && command -v ncu >/dev/null; then
      # GPU_PROFILE_NCU_ON=batch32: the kernels of a 32-sequence decode step instead of a prefill's
      local ncmd=("$kiln" run "$m.engine" --ids "$ids" -n 2)
      [ "${GPU_PROFILE_NCU_ON:-}" = batch32 ] && ncmd=("$kiln" bench "$m.engine" --prompts 1 --decode-prompt 1 \
        --decode 2 --batch 32 --reps 1 --warmup 0 --no-cuda-graphs)
      timeout 200 ncu --kernel-name "regex:$GPU_PROFILE_NCU" --launch-count "${GPU_PROFILE_NCU_COUNT:-2}" \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section MemoryWorkloadAnalysis --section SourceCounters "${ncmd[@]}" >"$out/ncu.txt" 2>&1
      timeout 200 ncu --kernel-name "regex:$GPU_PROFILE_NCU" --launch-count "${GPU_PROFILE_NCU_COUNT:-2}" \
        --section SourceCounters --page source --print-source sass --csv "${ncmd[@]}" \
        >"$out/ncu_sass.csv" 2>/dev/null && gzip -f "$out/ncu_sass.csv"
      grep -E "^  k_|Duration|Compute \(SM\)|Warp Cycles Per Issued|No Eligible" "$out/ncu.txt" | tee -a "$summary"
    fi
    rm -rf "$m" "$m.engine" "$m.alt.engine"
  fi
  if [[ $stages == *" clocks "* ]]; then
    local layers=${GPU_CLOCKS_LAYERS:-32} m="/dev/shm/gpu_check_clocks" smi
    echo "== clocks: Llama-3-8B's shape, $layers layers, 12 prefills of 2048 tokens back to back"
    (cd "$root/bench" && python3 -c "
import json
from llama8b_common import make_checkpoint
cfg = json.load(open('../tests/data/llama3-8b-config.json')); cfg['num_hidden_layers'] = $layers
make_checkpoint(cfg, '$m', 'cuda', 0)" 2>&1 | tail -1)
    "$kiln" build "$m" --dtype bf16 --max-tokens 2048 --target sm_90 -o "$m.engine" >/dev/null 2>&1 \
      || echo "FAIL: kiln build of the clocks model" | tee -a "$summary"
    rm -rf "$m"
    # the clock-event reasons' field is named clocks_throttle_reasons on older drivers
    for f in clocks_event_reasons.active clocks_throttle_reasons.active; do
      nvidia-smi --query-gpu=$f --format=csv,noheader >/dev/null 2>&1 && break
    done
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$f --format=csv -lms 20 \
      > "$out/clocks.csv" 2>&1 &
    smi=$!
    sleep 1
    "$kiln" bench "$m.engine" --prompts 2048,2048,2048,2048,2048,2048,2048,2048,2048,2048,2048,2048 --decode 0 \
      --reps 1 --warmup 0 --json > "$out/clocks_bench.json" 2>"$out/clocks_bench.err"
    sleep 1
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    python3 -c "
import json
r = json.load(open('$out/clocks_bench.json'))
print('clocks: 2048-token prefills in order (ms):', ' '.join('%.2f' % p['ttft_ms_median'] for p in r['prefill']))
" 2>&1 | tee -a "$summary"
    # samples by SM clock and reasons; the power's range
    awk -F', ' 'NR > 1 { print $2, $6 }' "$out/clocks.csv" | sort | uniq -c | sort -rn | head -12 \
      | sed 's/^/clocks: samples, SM clock, reasons: /' | tee -a "$summary"
    awk -F', ' 'NR > 1 { p = $4 + 0; if (p > max) max = p; if (min == "" || p < min) min = p }
      END { print "clocks: power draw from", min, "to", max, "W" }' "$out/clocks.csv" | tee -a "$summary"
    rm -f "$m.engine"
  fi
  if [[ $stages == *" kernels "* || $stages == *" gemm90 "* ]]; then
    echo "== the prefill kernels alone (cubins compiled by NVRTC on the build machine)"
    local b="$gpu/bin" c="$gpu/cubin"
    timeout 240 python3 "$root/bench/gemm90_vs_cublas.py" --kiln "$b/cuda_gemm90_check" --cubin "$c/gemm90_sm90a.cubin" \
      2>&1 | tee "$out/gemm90.log" | tail -30
    echo "gemm90_vs_cublas exit ${PIPESTATUS[0]}; $(grep 'cuda_gemm90_check: ' "$out/gemm90.log" | tail -1)" | tee -a "$summary"
    grep -E '^(qkv|o |gate|down|lm_head)' "$out/gemm90.log" >> "$summary"
  fi
  if [[ $stages == *" kernels "* || $stages == *" mm "* ]]; then
    local b="$gpu/bin" c="$gpu/cubin"
    "$b/cuda_mm_check" --gpu "$c/mm_sm90.cubin" > "$out/mm.log" 2>&1
    echo "cuda_mm_check --gpu exit $?: $(grep -c '^FAIL' "$out/mm.log") failing cases; $(tail -1 "$out/mm.log")" | tee -a "$summary"
    grep '^FAIL' "$out/mm.log" | head -5 | tee -a "$summary"
    # the decode matmuls: both kernels at T = 1, 8 (32 on tensor cores), and the 8B step's totals
    grep -E '^bench .*(decode|T=1 |T=8 |T=32 )' "$out/mm.log" | grep -v 'T=128' >> "$summary"
  fi
  if [[ $stages == *" probe "* ]]; then
    echo "== bench/gemv_probe.cu: batch-1 matrix-vector designs at the 8B shapes (nvcc here)"
    if nvcc -O3 -arch=sm_90a -std=c++17 -o "$out/gemv_probe" "$root/bench/gemv_probe.cu" >"$out/probe.log" 2>&1; then
      "$out/gemv_probe" >>"$out/probe.log" 2>&1
      echo "gemv_probe exit $?" | tee -a "$summary"
    else
      echo "gemv_probe: nvcc failed" | tee -a "$summary"
    fi
    rm -f "$out/gemv_probe"
    cat "$out/probe.log" >> "$summary"
  fi
  if [[ $stages == *" kernels "* || $stages == *" att "* ]]; then
    local b="$gpu/bin" c="$gpu/cubin"
    "$b/cuda_att_check" --gpu "$c/att_sm90.cubin" 2>&1 | tee "$out/att.log" | tail -40
    echo "cuda_att_check exit ${PIPESTATUS[0]}" | tee -a "$summary"
    grep -E 'ms|TFLOP' "$out/att.log" | tail -20 >> "$summary"
  fi
  echo "== summary ($((SECONDS - t_start)) s)"
  cat "$summary"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac

# cuda_lib.sh — what the CUDA tests share, sourced after tests/cli/lib.sh.
#
# The engines: tests/cuda/CMakeLists.txt makes one setup test per shared model and weight dtype,
# cuda_engines_<model>_<dtype> (cuda_engines.sh), which builds into ENGINES/<dtype>/ (ENGINES is
# the model's folder under the build tree, given to every test that needs them):
#   cuda.engine  kiln build --target sm_80,sm_90 --dtype <dtype> --precision exact (<dtype>-fast:
#                --precision fast) (the NVRTC compile; the exact bf16 and f16 engines for sm_90
#                alone, see CMakeLists.txt)
#   target       the --target it was built for
#   src/         its --emit-source output
#   kernels.so   that source compiled for the CPU with g++ (compile_kernels) for emu_libcuda
#   cpu.engine   kiln build --dtype <dtype> --precision ... for the CPU (the interpreter's engine)
# so that the tests that run or check the same engine (cuda_build_<model>, cuda_emu_golden_<model>*,
# cuda_runtime) compile it once, through ctest's FIXTURES_SETUP / FIXTURES_REQUIRED.

# model_args MODEL_DIR: kiln's inputs for a shared model, into the array `args`: the folder, or for
# a llama2.c checkpoint (no config.json) its .bin and its tokenizer.
model_args() {
  if [ -f "$1/config.json" ]; then
    args=("$1")
  else
    local ckpt tok
    ckpt=$(ls "$1"/*.bin | grep -v '/tok[^/]*\.bin$' | head -1)
    args=("$ckpt")
    tok=$(ls "$1"/tok*.bin 2>/dev/null | head -1)
    [ -n "$tok" ] && args+=(--tokenizer "$tok")
  fi
}

# compile_kernels SRC_DIR OUT.so: the generated CUDA C compiled for the CPU (emu_shim.h), with
# alignment checks: a GPU faults on a misaligned access that the CPU forgives.
compile_kernels() {
  "$KILN_GXX" -O2 -w -shared -fPIC -fno-strict-aliasing -fsanitize=alignment -fno-sanitize-recover=alignment \
    -include "$KILN_EMU_SHIM" -x c++ "$1"/*.cu -o "$2"
}

# have_engine DIR: DIR holds what cuda_engines.sh builds (the kernels when g++ is found); says
# what is missing otherwise (the setup test failed, or ran without NVRTC).
have_engine() {
  local f
  for f in cuda.engine target cpu.engine ${KILN_GXX:+kernels.so}; do
    [ -f "$1/$f" ] || { echo "FAIL: no $1/$f (the cuda_engines_* setup test builds it)"; return 1; }
  done
}

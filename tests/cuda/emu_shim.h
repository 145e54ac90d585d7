/*
 * emu_shim.h — compiles the CUDA C that kiln generates (codegen/cuda) as
 * plain C++ for the CPU, for tests/cuda/emu_libcuda.c: g++ -include this
 * header. Blocks run one after another and the threads of a block as
 * coroutines, so __shared__ arrays can be function statics and
 * __syncthreads() is a switch back to the emulator's scheduler.
 */
#ifndef KILN_EMU_SHIM_H
#define KILN_EMU_SHIM_H

#include <math.h>
#include <string.h>

extern "C" {
struct kemu_dim3 {
    unsigned x, y, z; /* as CUDA's uint3 */
};
/* Set by the emulator before it runs or resumes a thread. */
kemu_dim3 kemu_threadIdx, kemu_blockIdx, kemu_blockDim;
/* The emulator's barrier: suspends the calling thread until all of its block arrive. */
void (*kemu_sync_hook)(void);
}

#define threadIdx kemu_threadIdx
#define blockIdx kemu_blockIdx
#define blockDim kemu_blockDim
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(n)
#define __syncthreads() kemu_sync_hook()

static inline float __int_as_float(unsigned int u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif

/*
 * emu_shim.h — compiles the CUDA C that kiln generates (codegen/cuda) as
 * plain C++ for the CPU, for tests/cuda/emu_libcuda.c: g++ -include this
 * header. Blocks run one after another and the threads of a block as
 * coroutines, so __shared__ arrays can be function statics and
 * __syncthreads() is a switch back to the emulator's scheduler. Compile with
 * -fno-strict-aliasing: the kernels read weights and tiles through vector
 * types, as CUDA code does.
 */
#ifndef KILN_EMU_SHIM_H
#define KILN_EMU_SHIM_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
struct kemu_dim3 {
    unsigned x, y, z; /* as CUDA's uint3 */
};
/* Set by the emulator before it runs or resumes a thread. */
kemu_dim3 kemu_threadIdx, kemu_blockIdx, kemu_blockDim, kemu_gridDim;
/* The emulator's barrier: suspends the calling thread until all of its block arrive. */
void (*kemu_sync_hook)(void);
/* Set by the emulator: a new number for each block it runs (the shuffles' call counts restart). */
unsigned kemu_block_run;
}

/* The SMs the emulated GPU has (what %nsmid reads on a GPU): few, so that the engines' short test
 * prompts and longer steps take both of the attention's plans (kcu_fa_few_blocks). */
#define KEMU_SMS 4u

#define threadIdx kemu_threadIdx
#define blockIdx kemu_blockIdx
#define blockDim kemu_blockDim
#define gridDim kemu_gridDim
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(...)
#define __grid_constant__
#define __forceinline__ inline
#define __syncthreads() kemu_sync_hook()

static inline float __int_as_float(unsigned int u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float __uint_as_float(unsigned int u) { return __int_as_float(u); }
static inline unsigned int __float_as_uint(float f)
{
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
/* byte i of the result: byte (s >> 4i) & 7 of the eight bytes y:x (x the low four) */
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s)
{
    const unsigned long long b = (unsigned long long)y << 32 | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned int)(b >> (8 * ((s >> (4 * i)) & 7)) & 0xffu) << (8 * i);
    return r;
}

/* CUDA's 16-byte vector types, and the read-only load */
struct uint4 {
    unsigned int x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
template <typename V> static inline V __ldg(const V *p) { return *p; }

/* A warp shuffle: every thread of the block must call it together (kiln's
 * kernels do, with the same lane mask m), as they reach __syncthreads().
 * It is kemu_warp_publish's exchange (below): each value type has its own
 * arrays (function-local statics of the template), two used in turn, so one barrier a shuffle is enough: a
 * thread past this call's barrier writes the other array, and cannot write
 * this one again before every thread has reached the next call's barrier,
 * after reading this one. Each thread counts its calls in the block being
 * run (kemu_block_run tells a new block), which every thread of the block
 * makes alike. */
template <typename V> static inline const V *kemu_warp_publish(const V &v);
template <typename V> static inline V kemu_shfl_xor(V v, int m)
{
    return kemu_warp_publish(v)[(threadIdx.x ^ (unsigned)m) & 31u]; /* m < 32: a lane of the same warp */
}
/* The exchange under the emulated warp instructions of codegen/cuda/kcu_flash.cuh (mma.sync,
 * ldmatrix): each thread publishes v, and gets the values of the 32 lanes of its warp, lane 0
 * first, to gather what the instruction's layout gives it. Called as a shuffle (every thread of
 * the block together, the same two arrays in turn); the caller reads the lanes before its next
 * call. */
template <typename V> static inline const V *kemu_warp_publish(const V &v)
{
    static V lanes[2][1024];
    static unsigned run[1024], calls[1024];
    const unsigned t = threadIdx.x;
    if (run[t] != kemu_block_run) run[t] = kemu_block_run, calls[t] = 0;
    V *const l = lanes[calls[t]++ & 1];
    l[t] = v;
    __syncthreads();
    return l + (t & ~31u);
}
static inline float __shfl_xor_sync(unsigned mask, float v, int m) { return (void)mask, kemu_shfl_xor(v, m); }
static inline double __shfl_xor_sync(unsigned mask, double v, int m) { return (void)mask, kemu_shfl_xor(v, m); }
static inline int __shfl_xor_sync(unsigned mask, int v, int m) { return (void)mask, kemu_shfl_xor(v, m); }
/* A vote (kcu_moe_collect's): the warp's predicates, lane i's in bit i; called as a shuffle. */
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    const int *const l = kemu_warp_publish((int)(pred != 0));
    unsigned b = 0;
    for (unsigned i = 0; i < 32; i++) b |= (unsigned)(l[i] != 0) << i;
    return b & mask;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }

#endif

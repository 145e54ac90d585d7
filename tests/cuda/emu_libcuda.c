/*
 * emu_libcuda.c — a CPU stand-in for libcuda.so.1, so that the CUDA backend
 * (runtime/cuda/cuda_backend.c: loading, the arch check, KV storage, block
 * tables, launches, aliases) and the kernels kiln generates can be tested
 * where there is no GPU. Point the backend at it with
 * KILN_CUDA_LIB=/path/emu_libcuda.so, and at the generated kernels compiled
 * for the CPU (g++ -shared -include emu_shim.h k.cu) with
 * KILN_EMU_KERNELS=/path/k.so: cuModuleLoadData ignores the cubin and loads
 * that instead. KILN_EMU_CC="9.0" sets the compute capability reported.
 *
 * Device memory is host memory filled with 0xff bytes (NaN as floats) when
 * allocated, so a kernel that reads what nothing wrote shows NaN. Blocks run
 * in order; a block's threads are coroutines switched at each
 * __syncthreads(), which exercises the kernels' barriers as written. Each
 * thread slot has its own stack with a trampoline on it, made once
 * (makecontext/setcontext): it runs the kernel for the thread started in
 * that slot, then parks until the slot's next thread. Switches use GCC's
 * __builtin_setjmp/__builtin_longjmp: a few instructions, no system call
 * (unlike swapcontext, getcontext) and nothing a sanitizer intercepts
 * (AddressSanitizer wraps longjmp at a heavy cost per call); a thread that
 * waits or ends jumps straight to the next ready one. The switches are most
 * of the emulator's own time, so it makes few (emu_shim.h's shuffles take
 * one barrier each) and lays the threads' stacks out to keep them cheap.
 *
 * Streams run their work at once, in the order it is queued (the host
 * waits for nothing). A stream in capture mode records its launches
 * instead of running them (cuStreamBeginCapture): the graph is the list of
 * launches with their parameters copied, replayed in order by
 * cuGraphLaunch; any other work queued on a capturing stream fails, as the
 * backend must queue none. KILN_EMU_MEM sets the device's memory (bytes,
 * or with a K, M or G suffix; default 8G): cuMemAlloc fails with
 * CUDA_ERROR_OUT_OF_MEMORY past it and cuMemGetInfo reports what is left.
 * KILN_EMU_STATS=1 prints the launches, captures and graph launches at exit
 * (and how many launches ran a kernel named *_large),
 * and the size of every allocation, in order. Events record the host's
 * monotonic clock when they are recorded (the work before them has run by
 * then), so cuEventElapsedTime times the emulated kernels.
 *
 * A driver holds process-wide state, and so does this stand-in (the
 * statics below): it is a test fixture, not part of kiln.
 */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE /* its longjmp check rejects jumps between the coroutines' stacks */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

typedef struct emu_dim3 {
    unsigned x, y, z; /* as in emu_shim.h */
} emu_dim3;

/* Thread stacks lie STACK_STRIDE apart: a cache line more than their size, so that the tops of a
 * block's stacks, where its threads' frames are, fall in different cache sets (at a power-of-two
 * stride they would all compete for the same few, and every switch at a barrier would miss). */
enum { MAX_PARAMS = 24, MAX_THREADS = 1024, STACK_BYTES = 64 * 1024, STACK_STRIDE = STACK_BYTES + 64 };
enum { EMU_NOT_FOUND = 500, EMU_INVALID = 1, EMU_LAUNCH_FAILED = 719, EMU_OUT_OF_MEMORY = 2,
       EMU_ILLEGAL_STATE = 401, EMU_CAPTURE_UNSUPPORTED = 900 };
enum thread_state { READY, WAITING, DONE };
typedef void *emu_jmp[5]; /* a __builtin_setjmp buffer */

typedef void (*kernel24)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                         uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                         uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

static struct {
    void *so;                      /* the kernels, compiled for the CPU */
    emu_dim3 *tid, *bid, *bdim, *gdim; /* their threadIdx, blockIdx, blockDim, gridDim */
    void (**sync_hook)(void);      /* their __syncthreads() */
    unsigned *block_run;           /* their kemu_block_run: a new number for each block run */
    kernel24 fn;                   /* the kernel being run */
    uint64_t args[MAX_PARAMS];     /* its parameters, each in an 8-byte slot */
    emu_jmp sched;                 /* where the scheduler waits */
    ucontext_t start;              /* a slot's first context (its stack, trampoline) */
    emu_jmp resume[MAX_THREADS];   /* where each waiting thread continues */
    emu_jmp park[MAX_THREADS];     /* where each slot's trampoline waits for its next thread */
    int parked[MAX_THREADS];       /* 1 once the slot's trampoline exists */
    enum thread_state state[MAX_THREADS];
    int begun[MAX_THREADS];        /* 1 once thread t of the block being run has started */
    unsigned n_block;              /* threads in the block being run */
    char *stacks;                  /* MAX_THREADS stacks */
    unsigned current;              /* the thread running */
    int waited;                    /* a thread of the block being run reached a barrier */
    void *no_barrier[256];         /* kernels seen to run a whole block without a barrier */
    int n_no_barrier;              /* how many */
    int ctx_token;                 /* what the primary context points at */
    int loads;                     /* modules loaded and not unloaded (sessions may overlap) */
} emu;

int cuInit(unsigned flags) { return flags == 0 ? 0 : EMU_INVALID; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : EMU_INVALID; }
int cuDeviceGetName(char *name, int len, int dev) { snprintf(name, (size_t)len, "kiln CPU emulator"); return dev ? EMU_INVALID : 0; }

int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    const char *cc = getenv("KILN_EMU_CC");
    int major = 9, minor = 0;
    if (cc) sscanf(cc, "%d.%d", &major, &minor);
    if (attr == 75) *v = major;
    else if (attr == 76) *v = minor;
    else return EMU_INVALID;
    return dev ? EMU_INVALID : 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &emu.ctx_token; return dev ? EMU_INVALID : 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { return dev ? EMU_INVALID : 0; }
int cuCtxSetCurrent(void *ctx) { return ctx == &emu.ctx_token ? 0 : EMU_INVALID; }

/* ---- device memory: host memory behind a header that holds its size -------------------- */
enum { MEM_HEADER = 64 };
static struct {
    size_t limit;   /* the device's bytes (KILN_EMU_MEM), 0 until read */
    size_t used;    /* allocated now */
    size_t *sizes;  /* every allocation's size, in order (for KILN_EMU_STATS) */
    size_t n_sizes; /* how many */
} emu_mem;

static size_t mem_limit(void)
{
    if (emu_mem.limit) return emu_mem.limit;
    size_t limit = (size_t)8 << 30;
    const char *v = getenv("KILN_EMU_MEM");
    if (v && *v) {
        char *end;
        double n = strtod(v, &end);
        double scale = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
        if (n > 0) limit = (size_t)(n * scale);
    }
    return emu_mem.limit = limit;
}

int cuMemAlloc_v2(uint64_t *p, size_t bytes)
{
    if (bytes > mem_limit() - emu_mem.used) return EMU_OUT_OF_MEMORY;
    char *m = malloc(MEM_HEADER + (bytes ? bytes : 1));
    if (!m) return EMU_OUT_OF_MEMORY;
    memcpy(m, &bytes, sizeof bytes);
    memset(m + MEM_HEADER, 0xff, bytes);
    emu_mem.used += bytes;
    size_t *sizes = realloc(emu_mem.sizes, sizeof *sizes * (emu_mem.n_sizes + 1));
    if (sizes) emu_mem.sizes = sizes, emu_mem.sizes[emu_mem.n_sizes++] = bytes;
    *p = (uint64_t)(uintptr_t)(m + MEM_HEADER);
    return 0;
}

int cuMemFree_v2(uint64_t p)
{
    if (!p) return 0;
    char *m = (char *)(uintptr_t)p - MEM_HEADER;
    size_t bytes;
    memcpy(&bytes, m, sizeof bytes);
    emu_mem.used -= bytes;
    free(m);
    return 0;
}

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    *total = mem_limit();
    *free_bytes = *total - emu_mem.used;
    return 0;
}
int cuMemsetD8_v2(uint64_t p, unsigned char v, size_t n) { memset((void *)(uintptr_t)p, v, n); return 0; }
int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (const void *)(uintptr_t)src, n); return 0; }
int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* Continue at buf (saved by __builtin_setjmp, which may not share a function
 * with __builtin_longjmp). */
static __attribute__((noinline, noreturn)) void jump(void **buf) { __builtin_longjmp(buf, 1); }

static void trampoline(void);

/* Run thread t of the block: on from where it waits at a barrier, or from the start (on its
 * slot's trampoline, made the first time). Does not return. */
static __attribute__((noreturn)) void enter(unsigned t)
{
    emu.current = t;
    *emu.tid = (emu_dim3){t, 0, 0};
    if (emu.begun[t]) jump(emu.resume[t]);
    emu.begun[t] = 1;
    if (emu.parked[t]) jump(emu.park[t]); /* the slot's trampoline starts thread t */
    emu.parked[t] = 1;
    getcontext(&emu.start);
    emu.start.uc_stack.ss_sp = emu.stacks + (size_t)t * STACK_STRIDE;
    emu.start.uc_stack.ss_size = STACK_BYTES;
    emu.start.uc_link = NULL;
    makecontext(&emu.start, trampoline, 0);
    setcontext(&emu.start);
    abort(); /* setcontext returns only when it fails */
}

/* The thread before `first` has saved where it continues (at a barrier, or parked at its end):
 * run the next thread of the round that is ready, straight from thread to thread (one jump a
 * switch), or go back to the scheduler (run_block) when the round is over. The order is the
 * scheduler's: every ready thread, by index, once a round. */
static __attribute__((noreturn)) void run_from(unsigned first)
{
    for (unsigned t = first; t < emu.n_block; t++)
        if (emu.state[t] == READY) enter(t);
    jump(emu.sched);
}

static void emu_sync(void)
{
    unsigned t = emu.current;
    emu.state[t] = WAITING;
    emu.waited = 1;
    if (__builtin_setjmp(emu.resume[t]) == 0) run_from(t + 1);
}

int cuModuleLoadData(void **mod, const void *image)
{
    (void)image; /* a cubin: the CPU runs KILN_EMU_KERNELS instead */
    const char *path = getenv("KILN_EMU_KERNELS");
    if (!path) {
        fprintf(stderr, "emu_libcuda: KILN_EMU_KERNELS is not set\n");
        return EMU_INVALID;
    }
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "emu_libcuda: %s\n", dlerror());
        return EMU_INVALID;
    }
    emu.tid = dlsym(so, "kemu_threadIdx");
    emu.bid = dlsym(so, "kemu_blockIdx");
    emu.bdim = dlsym(so, "kemu_blockDim");
    emu.gdim = dlsym(so, "kemu_gridDim");
    emu.sync_hook = dlsym(so, "kemu_sync_hook");
    emu.block_run = dlsym(so, "kemu_block_run");
    if (!emu.tid || !emu.bid || !emu.bdim || !emu.gdim || !emu.sync_hook || !emu.block_run) {
        fprintf(stderr, "emu_libcuda: %s was not compiled with emu_shim.h\n", path);
        dlclose(so);
        return EMU_INVALID;
    }
    *emu.sync_hook = emu_sync;
    if (!emu.stacks) emu.stacks = malloc((size_t)MAX_THREADS * STACK_STRIDE);
    emu.so = so;
    emu.loads++;
    *mod = so;
    return 0;
}

int cuModuleUnload(void *mod)
{
    dlclose(mod);
    /* the same library again (dlopen counts): its state goes with the last unload */
    if (--emu.loads > 0) return 0;
    free(emu.stacks);
    memset(&emu, 0, sizeof emu);
    return 0;
}

int cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    *fn = dlsym(mod, name);
    return *fn ? 0 : EMU_NOT_FOUND;
}

/* A slot's trampoline, on its own stack: runs the kernel as the thread
 * started in the slot, then parks until the slot starts another. */
static void trampoline(void)
{
    volatile unsigned slot = emu.current; /* volatile: live across __builtin_setjmp */
    for (;;) {
        uint64_t *a = emu.args;
        emu.fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14],
               a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]);
        emu.state[slot] = DONE;
        if (__builtin_setjmp(emu.park[slot]) == 0) run_from(slot + 1);
    }
}

/* Run one block: every thread until it waits at a barrier or ends, again
 * and again until all have ended. Ended threads count as arrived. */
static void run_block(unsigned n)
{
    emu.n_block = n;
    ++*emu.block_run;
    for (unsigned t = 0; t < n; t++) emu.state[t] = READY, emu.begun[t] = 0;
    for (;;) {
        if (__builtin_setjmp(emu.sched) == 0) run_from(0); /* back here when a round is over */
        int waiting = 0;
        for (unsigned t = 0; t < n; t++)
            if (emu.state[t] == WAITING) emu.state[t] = READY, waiting = 1;
        if (!waiting) return;
    }
}

static struct {
    long launches;       /* kernels run */
    long captures;       /* graphs captured */
    long graph_launches; /* graphs replayed */
    long large_launches; /* launches (run or replayed) of kernels named *_large: the prefill variants of
                          * matmuls (and of attention, on tensor cores, when an engine has them) */
    long g90_launches;   /* launches of kernels named *_g90_*: the sm_90a matmuls' stand-ins */
    long tmaps;          /* tensor maps made */
    long pdl_launches;   /* launches through cuLaunchKernelEx with programmatic stream serialization */
} emu_stats;

/* 1 when fn is a kernel whose name holds "_g90_". */
static int is_g90_kernel(void *fn)
{
    Dl_info di;
    return dladdr(fn, &di) && di.dli_sname && strstr(di.dli_sname, "_g90_") != NULL;
}

/* cuTensorMapEncodeTiled: checks the arguments against what kcu_gemm90 (kcu_prelude.cuh) needs —
 * a 2-D bf16, f16 or uint8 tensor, 16-byte aligned base and row stride, boxes of one 128-byte
 * swizzle row (64 or 128 elements) by 8..256 rows, element strides 1, no interleave, 128-byte swizzle, zeros past the
 * edges — and records them in the map itself, as the emulated kernels read them (kcu_emu_tmap),
 * with the record's address in the map's first 8 bytes: the 8 bytes a parameter that
 * cuLaunchKernel passes. The map must stay where it is while kernels use it (the backend's do). */
struct emu_tmap {
    const void *base;
    unsigned long long dims[2], stride;
    unsigned box[2];
    int dtype;
};
int cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *base, const uint64_t *dims,
                           const uint64_t *strides, const unsigned *box, const unsigned *es, int interleave,
                           int swizzle, int l2, int oob)
{
    const unsigned esize = dtype == 0 ? 1 : 2; /* uint8 (one-byte codes), or f16 and bf16 */
    if (!map || ((uintptr_t)map % 128) || rank != 2 || (dtype != 0 && dtype != 6 && dtype != 9) || !base ||
        (uintptr_t)base % 16 || dims[0] == 0 || dims[1] == 0 || strides[0] % 16 || strides[0] < dims[0] * esize ||
        box[0] != 128 / esize || box[1] < 8 ||
        box[1] > 256 || es[0] != 1 || es[1] != 1 || interleave != 0 || swizzle != 3 || l2 != 3 || oob != 0)
        return EMU_INVALID;
    uint64_t *m = map;
    memset(m, 0, 128);
    struct emu_tmap *rec = (struct emu_tmap *)(m + 2);
    *rec = (struct emu_tmap){base, {dims[0], dims[1]}, strides[0], {box[0], box[1]}, dtype};
    m[0] = (uint64_t)(uintptr_t)rec;
    emu_stats.tmaps++;
    return 0;
}

/* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES up to the H200's 227 kB; nothing else. */
int cuFuncSetAttribute(void *fn, int attribute, int value)
{
    return fn && attribute == 8 && value >= 0 && value <= 232448 ? 0 : EMU_INVALID;
}

/* 1 when fn is a kernel whose name ends in _large. */
static int is_large_kernel(void *fn)
{
    Dl_info di;
    if (!dladdr(fn, &di) || !di.dli_sname) return 0;
    size_t n = strlen(di.dli_sname);
    return n > 6 && strcmp(di.dli_sname + n - 6, "_large") == 0;
}

/* Record the launch when stream is capturing (1), else 0 (below). */
static int capture_launch(void *stream, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **params);

int cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra)
{
    (void)shared;
    if (!fn || by != 1 || bz != 1 || bx == 0 || bx > MAX_THREADS || extra) return EMU_INVALID;
    if (capture_launch(stream, fn, gx, gy, gz, bx, params)) return 0; /* recorded, not run */
    emu_stats.launches++;
    emu_stats.large_launches += is_large_kernel(fn);
    emu_stats.g90_launches += is_g90_kernel(fn);
    emu.fn = (kernel24)fn;
    memset(emu.args, 0, sizeof emu.args);
    for (int i = 0; i < MAX_PARAMS && params[i]; i++) memcpy(&emu.args[i], params[i], 8);
    *emu.bdim = (emu_dim3){bx, 1, 1};
    *emu.gdim = (emu_dim3){gx, gy, gz};
    /* A kernel whose block (0,0,0) ran with no barrier has none (kiln's kernels
     * that have barriers reach them in that block; other blocks may end
     * early, e.g. a matmul's blocks with no tile): its threads then run as
     * plain calls. */
    int plain = 0;
    for (int i = 0; i < emu.n_no_barrier; i++) plain |= emu.no_barrier[i] == fn;
    uint64_t *a = emu.args;
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                *emu.bid = (emu_dim3){x, y, z};
                if (plain) {
                    for (unsigned t = 0; t < bx; t++) {
                        *emu.tid = (emu_dim3){t, 0, 0};
                        emu.fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                               a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]);
                    }
                    continue;
                }
                emu.waited = 0;
                run_block(bx);
                if (x == 0 && y == 0 && z == 0 && !emu.waited && emu.n_no_barrier < 256) {
                    emu.no_barrier[emu.n_no_barrier++] = fn;
                    plain = 1;
                }
            }
    return 0;
}

/* 1 when stream is capturing, the capture then spoilt (its end fails, as the driver's does after a
 * launch it refused); 0 when not capturing (below). */
static int capture_refuse(void *stream);

/* cuLaunchKernelEx's CUlaunchAttribute and CUlaunchConfig (cuda.h) */
typedef struct emu_launch_attr {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;
    } u;
} emu_launch_attr;
typedef struct emu_launch_config {
    unsigned grid[3], block[3], shared;
    void *stream;
    emu_launch_attr *attrs;
    unsigned n_attrs;
} emu_launch_config;

/* cuLaunchKernel from a launch configuration. The one attribute taken is programmatic stream
 * serialization (6), and only on a device of compute capability 9.0 or later, as the driver has it;
 * such launches are counted (run in order, as every launch here). */
int cuLaunchKernelEx(const emu_launch_config *c, void *fn, void **params, void **extra)
{
    if (!c || (c->n_attrs && !c->attrs)) return EMU_INVALID;
    int pdl = 0, major = 0;
    for (unsigned i = 0; i < c->n_attrs; i++) {
        if (c->attrs[i].id != 6 || cuDeviceGetAttribute(&major, 75, 0) != 0 || major < 9) return EMU_INVALID;
        pdl |= c->attrs[i].u.value != 0;
    }
    /* KILN_EMU_NO_PDL_CAPTURE=1: a driver before CUDA 12.3, whose graphs take no programmatic launches */
    const char *old_driver = getenv("KILN_EMU_NO_PDL_CAPTURE");
    if (pdl && old_driver && *old_driver == '1' && capture_refuse(c->stream)) return EMU_CAPTURE_UNSUPPORTED;
    int r = cuLaunchKernel(fn, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1], c->block[2], c->shared,
                           c->stream, params, extra);
    if (r == 0 && pdl) emu_stats.pdl_launches++;
    return r;
}

int cuGetErrorName(int r, const char **s)
{
    *s = r == EMU_OUT_OF_MEMORY         ? "CUDA_ERROR_OUT_OF_MEMORY"
         : r == EMU_NOT_FOUND           ? "CUDA_ERROR_NOT_FOUND"
         : r == EMU_ILLEGAL_STATE       ? "CUDA_ERROR_ILLEGAL_STATE"
         : r == EMU_CAPTURE_UNSUPPORTED ? "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
                                        : "CUDA_ERROR_INVALID_VALUE";
    return 0;
}

int cuGetErrorString(int r, const char **s)
{
    *s = r == EMU_OUT_OF_MEMORY         ? "out of memory"
         : r == EMU_NOT_FOUND           ? "named symbol not found"
         : r == EMU_ILLEGAL_STATE       ? "the operation is not permitted in the current state"
         : r == EMU_CAPTURE_UNSUPPORTED ? "operation not permitted when stream is capturing"
                                        : "invalid argument";
    return 0;
}

/* ---- streams and graphs ---------------------------------------------------------------------- */
typedef struct emu_launch {
    void *fn;                    /* the kernel */
    unsigned grid[3], block;     /* its shape */
    uint64_t args[MAX_PARAMS];   /* its parameters, copied at capture */
    int n_args;                  /* how many */
} emu_launch;

typedef struct emu_graph {
    emu_launch *launches; /* in order */
    int n, cap;           /* used, allocated */
    int broken;           /* a launch was refused while capturing: the capture's end fails */
} emu_graph;

typedef struct emu_stream {
    emu_graph *capture; /* the graph being recorded, or NULL */
} emu_stream;

static void print_stats(void) __attribute__((destructor));
static void print_stats(void)
{
    const char *v = getenv("KILN_EMU_STATS");
    if (v && *v == '1') {
        fprintf(stderr, "emu_libcuda: %ld kernel launches, %ld graphs captured, %ld graph launches\n",
                emu_stats.launches, emu_stats.captures, emu_stats.graph_launches);
        fprintf(stderr, "emu_libcuda: %ld launches of _large kernels\n", emu_stats.large_launches);
        fprintf(stderr, "emu_libcuda: %ld launches of _g90_ kernels, %ld tensor maps\n", emu_stats.g90_launches,
                emu_stats.tmaps);
        fprintf(stderr, "emu_libcuda: %ld launches overlapping the kernel before (programmatic)\n",
                emu_stats.pdl_launches);
        fprintf(stderr, "emu_libcuda: allocations (bytes):");
        for (size_t i = 0; i < emu_mem.n_sizes; i++) fprintf(stderr, " %zu", emu_mem.sizes[i]);
        fprintf(stderr, "\n");
    }
    free(emu_mem.sizes);
    emu_mem.sizes = NULL;
    emu_mem.n_sizes = 0;
}

static int capturing(void *stream) { return stream && ((emu_stream *)stream)->capture; }

static int capture_refuse(void *stream)
{
    if (!capturing(stream)) return 0;
    ((emu_stream *)stream)->capture->broken = 1;
    return 1;
}

static int capture_launch(void *stream, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **params)
{
    if (!capturing(stream)) return 0;
    emu_graph *g = ((emu_stream *)stream)->capture;
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 64;
        g->launches = realloc(g->launches, sizeof *g->launches * (size_t)g->cap);
    }
    emu_launch *l = &g->launches[g->n++];
    memset(l, 0, sizeof *l);
    l->fn = fn;
    l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
    l->block = bx;
    for (int i = 0; i < MAX_PARAMS && params[i]; i++) memcpy(&l->args[l->n_args++], params[i], 8);
    return 1;
}

int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    *stream = calloc(1, sizeof(emu_stream));
    return 0;
}

static void graph_free(emu_graph *g)
{
    if (!g) return;
    free(g->launches);
    free(g);
}

int cuStreamDestroy_v2(void *stream)
{
    if (!stream) return EMU_INVALID;
    graph_free(((emu_stream *)stream)->capture);
    free(stream);
    return 0;
}

int cuStreamSynchronize(void *stream) { return capturing(stream) ? EMU_CAPTURE_UNSUPPORTED : 0; }

int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *stream)
{
    return capturing(stream) ? EMU_CAPTURE_UNSUPPORTED : cuMemcpyHtoD_v2(dst, src, n);
}

int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *stream)
{
    return capturing(stream) ? EMU_CAPTURE_UNSUPPORTED : cuMemcpyDtoH_v2(dst, src, n);
}

int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void *stream)
{
    return capturing(stream) ? EMU_CAPTURE_UNSUPPORTED : cuMemcpyDtoD_v2(dst, src, n);
}

int cuMemsetD8Async(uint64_t p, unsigned char v, size_t n, void *stream)
{
    return capturing(stream) ? EMU_CAPTURE_UNSUPPORTED : cuMemsetD8_v2(p, v, n);
}

int cuStreamBeginCapture_v2(void *stream, int mode)
{
    (void)mode;
    if (!stream) return EMU_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (capturing(stream)) return EMU_ILLEGAL_STATE;
    ((emu_stream *)stream)->capture = calloc(1, sizeof(emu_graph));
    return 0;
}

int cuStreamEndCapture(void *stream, void **graph)
{
    if (!capturing(stream)) return EMU_ILLEGAL_STATE;
    emu_graph *g = ((emu_stream *)stream)->capture;
    ((emu_stream *)stream)->capture = NULL;
    if (g->broken) { /* the capture was invalidated: no graph */
        *graph = NULL;
        graph_free(g);
        return EMU_CAPTURE_UNSUPPORTED;
    }
    *graph = g;
    emu_stats.captures++;
    return 0;
}

int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags)
{
    (void)flags;
    const emu_graph *g = graph;
    emu_graph *x = calloc(1, sizeof *x);
    x->n = x->cap = g->n;
    x->launches = malloc(sizeof *x->launches * (size_t)(g->n ? g->n : 1));
    if (g->n) memcpy(x->launches, g->launches, sizeof *x->launches * (size_t)g->n);
    *exec = x;
    return 0;
}

int cuGraphLaunch(void *exec, void *stream)
{
    if (capturing(stream)) return EMU_CAPTURE_UNSUPPORTED;
    const emu_graph *x = exec;
    emu_stats.graph_launches++;
    for (int i = 0; i < x->n; i++) {
        emu_launch l = x->launches[i]; /* a copy: its parameters are read through pointers */
        void *params[MAX_PARAMS + 1] = {0};
        for (int a = 0; a < l.n_args; a++) params[a] = &l.args[a];
        int r = cuLaunchKernel(l.fn, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, 0, NULL, params, NULL);
        if (r) return r;
    }
    return 0;
}

int cuGraphExecDestroy(void *exec)
{
    graph_free(exec);
    return 0;
}

int cuGraphDestroy(void *graph)
{
    graph_free(graph);
    return 0;
}

/* ---- events: the host's clock when recorded (work runs when it is queued) ------------------- */
typedef struct emu_event {
    double ms;    /* CLOCK_MONOTONIC, in milliseconds, at the last record */
    int recorded; /* 1 after a record */
} emu_event;

int cuEventCreate(void **event, unsigned flags)
{
    if (flags != 0) return EMU_INVALID; /* timing events only: CU_EVENT_DEFAULT */
    *event = calloc(1, sizeof(emu_event));
    return *event ? 0 : EMU_OUT_OF_MEMORY;
}

int cuEventRecord(void *event, void *stream)
{
    if (!event) return EMU_INVALID;
    /* the backend times eager launches only: recording into a graph would be its bug */
    if (capturing(stream)) return EMU_CAPTURE_UNSUPPORTED;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    emu_event *e = event;
    e->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    e->recorded = 1;
    return 0;
}

int cuEventElapsedTime(float *ms, void *start, void *end)
{
    const emu_event *a = start, *b = end;
    if (!a || !b || !a->recorded || !b->recorded) return EMU_INVALID;
    *ms = (float)(b->ms - a->ms);
    return 0;
}

int cuEventDestroy_v2(void *event)
{
    free(event);
    return 0;
}

/*
 * membw.c — memory bandwidth of this machine, for bench/cpu_half.sh: each
 * of THREADS threads copies its own slice of a MIB-MiB buffer into another
 * (memcpy), and, apart, sums its slice of floats (a read loop, as a matmul
 * streams its weights); the best of 5 passes. Prints GB/s (10^9 bytes) of
 * memory traffic: a copy moves its bytes twice (read, then written), the sum
 * once.
 *
 *   membw [MIB [THREADS]]      (defaults: 512 MiB, 1 thread)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct slice {
    float *src, *dst; /* this thread's part of the two buffers */
    size_t n;         /* floats in it */
    int copy;         /* 1: copy src to dst; 0: sum src */
    float sum;        /* the read loop's result (kept so that it is not optimized away) */
} slice;

static void *run(void *p)
{
    slice *s = p;
    if (s->copy) {
        memcpy(s->dst, s->src, s->n * sizeof(float));
        return NULL;
    }
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= s->n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += s->src[i + l];
    for (int l = 0; l < 8; l++) s->sum += acc[l];
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best seconds of 5 passes over the buffers. */
static double best_pass(slice *s, int threads)
{
    double best = 1e30;
    pthread_t tid[64];
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, run, &s[i]);
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (mib < 1 || threads < 1 || threads > 64) return 2;
    size_t n = mib << 18; /* floats */
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    if (!a || !b) return 1;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023), b[i] = 0.0f; /* touch every page */
    slice s[64];
    for (int i = 0; i < threads; i++) {
        size_t lo = n * (size_t)i / (size_t)threads, hi = n * (size_t)(i + 1) / (size_t)threads;
        s[i] = (slice){a + lo, b + lo, hi - lo, 1, 0.0f};
    }
    double copy = best_pass(s, threads);
    for (int i = 0; i < threads; i++) s[i].copy = 0;
    double read = best_pass(s, threads);
    float sum = 0.0f;
    for (int i = 0; i < threads; i++) sum += s[i].sum;
    double bytes = (double)n * sizeof(float);
    printf("threads %d, %zu MiB: copy %.2f GB/s (read + write), read %.2f GB/s (sum %g)\n", threads, mib,
           2.0 * bytes / copy / 1e9, bytes / read / 1e9, (double)sum);
    free(a);
    free(b);
    return 0;
}

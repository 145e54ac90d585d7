/* clock.c — the one monotonic clock (support.h: ks_now_seconds). */
#include <time.h>

#include "support/support.h"

double ks_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

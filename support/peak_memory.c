/* peak_memory.c — the process's peak resident memory (ks_peak_memory). */
#include "support.h"

#include <sys/resource.h>

uint64_t ks_peak_memory(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss <= 0) return 0;
#if defined(__APPLE__)
    return (uint64_t)u.ru_maxrss; /* bytes there */
#else
    return (uint64_t)u.ru_maxrss * 1024u; /* kilobytes on Linux and the BSDs */
#endif
}

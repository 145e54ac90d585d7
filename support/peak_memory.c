/* peak_memory.c — the process's peak resident memory (ks_peak_memory).
 *
 * On Linux, getrusage's ru_maxrss is not this program's: execve keeps the high-water mark of the
 * memory it replaces (the kernel's signal->maxrss, set from the old mm in exec_mmap), so a kiln
 * started by a large process (a Python script that has just written a 16 GB checkpoint, say)
 * reports that process's resident memory, not its own. /proc/self/status's VmHWM is the high water
 * of this process's own address space, which starts empty at exec: it is read first, ru_maxrss only
 * where there is no /proc. */
#include "support.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* VmHWM from /proc/self/status, bytes; 0 when there is none. */
static uint64_t proc_hwm(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) {
            if (sscanf(line + 6, "%llu", &kb) != 1) kb = 0;
            break;
        }
    fclose(f);
    return (uint64_t)kb * 1024u; /* "VmHWM:   305088 kB" */
}

uint64_t ks_peak_memory(void)
{
    uint64_t hwm = proc_hwm();
    if (hwm) return hwm;
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss <= 0) return 0;
#if defined(__APPLE__)
    return (uint64_t)u.ru_maxrss; /* bytes there */
#else
    return (uint64_t)u.ru_maxrss * 1024u; /* kilobytes on Linux and the BSDs */
#endif
}

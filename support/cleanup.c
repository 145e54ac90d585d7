/*
 * cleanup.c — temp files removed when a signal ends the process.
 *
 * A build killed with Ctrl-C (SIGINT), SIGTERM or SIGHUP would otherwise
 * leave its half-written `*.tmp.<pid>` files, hundreds of megabytes each.
 * ks_outfile_open registers its temp file here and unregisters it once it is
 * renamed or removed; the handler that ks_cleanup_on_signals installs unlinks
 * what is registered, then lets the signal end the process as it would have
 * (the shell sees 128 + the signal number).
 *
 * The registry is the one exception to kiln's "no globals": a signal handler
 * gets no context argument, so what it must find is process-wide. It is kept
 * to the minimum: a fixed table of path pointers, set and cleared with
 * lock-free atomic stores (safe against the handler and between threads); the
 * handler only reads them and calls unlink and raise, which are
 * async-signal-safe. The strings belong to the registrants, who unregister
 * before freeing them.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "support.h"

_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "the signal handler needs lock-free pointer atomics");

/* Paths to unlink on a fatal signal; NULL: a free slot. The 64 temp files
 * kiln may have open at once (one per output, a handful in practice): a path
 * that finds no free slot is not cleaned up on a signal, nothing worse. */
static _Atomic(const char *) pending[64];

int ks_cleanup_add(const char *path)
{
    for (int i = 0; i < (int)(sizeof pending / sizeof pending[0]); i++) {
        const char *none = NULL;
        if (atomic_compare_exchange_strong(&pending[i], &none, path)) return i + 1;
    }
    return 0;
}

void ks_cleanup_remove(int id)
{
    if (id > 0) atomic_store(&pending[id - 1], NULL);
}

static void on_fatal_signal(int sig)
{
    int saved = errno;
    for (int i = 0; i < (int)(sizeof pending / sizeof pending[0]); i++) {
        const char *p = atomic_load(&pending[i]);
        if (p) unlink(p);
    }
    errno = saved;
    /* SA_RESETHAND restored the default action: the signal, blocked while
     * this handler runs, ends the process as soon as it returns */
    raise(sig);
}

int ks_cleanup_on_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {0};
        if (sigaction(sigs[i], NULL, &old) != 0) return -1;
        if (old.sa_handler == SIG_IGN) continue; /* nohup, or a background job: leave it ignored */
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        if (sigaction(sigs[i], &sa, NULL) != 0) return -1;
    }
    return 0;
}

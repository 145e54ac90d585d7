/* progress.c — a step's line on the terminal (compiler/progress.h). */
#include "compiler/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "\r" + the line + erase to the end of the line (ANSI EL), no newline. */
static void draw(kd_progress *p, double fraction, double t)
{
    if (fraction >= 0)
        fprintf(p->out, "\rkiln: %s %3.0f%%\033[K", p->step, fraction > 1 ? 100.0 : 100.0 * fraction);
    else
        fprintf(p->out, "\rkiln: %s ...\033[K", p->step);
    fflush(p->out);
    p->drawn = t;
    p->shown = 1;
}

void kd_progress_step(kd_progress *p, const char *step)
{
    if (!p || !p->out) return;
    kd_progress_done(p);
    snprintf(p->step, sizeof p->step, "%s", step);
    p->start = now();
    p->drawn = 0;
}

void kd_progress_show(kd_progress *p)
{
    if (!p || !p->out) return;
    draw(p, -1, now());
}

void kd_progress_update(kd_progress *p, double fraction)
{
    if (!p || !p->out) return;
    double t = now();
    if (t - p->start < 1.0 || (p->drawn > 0 && t - p->drawn < 0.1)) return;
    draw(p, fraction, t);
}

void kd_progress_done(kd_progress *p)
{
    if (!p || !p->out || !p->shown) return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->shown = 0;
    p->drawn = 0;
}

void kd_progress_erase(void *p) { kd_progress_done(p); }

/* progress.c — a step's line on the terminal (compiler/progress.h). */
#include "compiler/progress.h"

#include <stdio.h>
#include <string.h>

#include "support/support.h"

void kd_progress_line(char *buf, size_t cap, const char *step, double done, double total, double seconds)
{
    if (total <= 0) {
        snprintf(buf, cap, "kiln: %s ...", step);
        return;
    }
    char d[32], t[32], r[32];
    double rate = seconds > 0 ? done / seconds : 0;
    ks_human_bytes(done, d, sizeof d);
    ks_human_bytes(total, t, sizeof t);
    ks_human_bytes(rate, r, sizeof r);
    int n = snprintf(buf, cap, "kiln: %s %s of %s (%.0f%%)", step, d, t, done >= total ? 100.0 : 100.0 * done / total);
    if (n < 0 || (size_t)n >= cap || rate <= 0) return;
    snprintf(buf + n, cap - (size_t)n, ", %s/s, %.0f s left", r, done >= total ? 0.0 : (total - done) / rate);
}

/* "\r" + the line + erase to the end of the line (ANSI EL), no newline. */
static void draw(kd_progress *p, double fraction, double t)
{
    char line[256];
    if (p->total > 0)
        kd_progress_line(line, sizeof line, p->step, p->done, p->total, t - p->start);
    else if (fraction >= 0)
        snprintf(line, sizeof line, "kiln: %s %3.0f%%", p->step, fraction > 1 ? 100.0 : 100.0 * fraction);
    else
        kd_progress_line(line, sizeof line, p->step, 0, 0, 0);
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
    p->drawn = t;
    p->shown = 1;
}

void kd_progress_step(kd_progress *p, const char *step)
{
    if (!p || !p->out) return;
    kd_progress_done(p);
    snprintf(p->step, sizeof p->step, "%s", step);
    p->start = ks_now_seconds();
    p->drawn = 0;
    p->done = p->total = 0;
}

void kd_progress_show(kd_progress *p)
{
    if (!p || !p->out) return;
    draw(p, -1, ks_now_seconds());
}

void kd_progress_update(kd_progress *p, double fraction)
{
    if (!p || !p->out) return;
    double t = ks_now_seconds();
    if (t - p->start < 1.0 || (p->drawn > 0 && t - p->drawn < 0.1)) return;
    draw(p, fraction, t);
}

void kd_progress_bytes(kd_progress *p, double done, double total)
{
    if (!p || !p->out) return;
    p->done = done;
    p->total = total;
    kd_progress_update(p, total > 0 ? done / total : -1);
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

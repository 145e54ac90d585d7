/*
 * progress.h — what a long `kiln build` is doing, on a terminal.
 *
 * A build runs steps (compiling the description and its passes, compiling
 * CUDA kernels per architecture, writing the weights). A step that has
 * taken over a second shows one line on the terminal, redrawn in place
 * (`kiln: writing weights 45%`), and erased when the step ends; a step known
 * to be slow (NVRTC) shows its line at once. With no terminal (out NULL:
 * stderr is a file or a pipe) nothing is ever printed, so logs and tests see
 * only the messages.
 *
 *     kd_progress p = {.out = isatty(2) ? stderr : NULL};
 *     kd_progress_step(&p, "writing weights");
 *     for (...) kd_progress_update(&p, done / total);
 *     kd_progress_done(&p);
 *
 * Prefix: kd_ (driver).
 */
#ifndef KILN_PROGRESS_H
#define KILN_PROGRESS_H

#include <stdio.h>

typedef struct kd_progress {
    FILE *out;        /* the terminal; NULL: show nothing */
    char step[96];    /* what the current step does, e.g. "writing weights" */
    double start;     /* when it began, seconds (CLOCK_MONOTONIC) */
    double drawn;     /* when its line was last drawn; 0: not drawn */
    int shown;        /* a line is on the terminal, to erase */
    double done, total; /* bytes of the step done and in all (kd_progress_bytes); total 0: not by bytes */
} kd_progress;

/* Begin a step (ending the one before). Nothing is shown yet. p may be NULL
 * (here and below): then nothing happens. */
void kd_progress_step(kd_progress *p, const char *step);
/* Show the step's line now, however long it has run (a slow step). */
void kd_progress_show(kd_progress *p);
/* The step is fraction done (0 to 1; below 0: unknown); its line is drawn
 * once the step has run over a second, redrawn at most ten times a second. */
void kd_progress_update(kd_progress *p, double fraction);
/* The step has done `done` of `total` bytes: its line (once it has run over a second) says how
 * many, the rate and the time left: `kiln: writing weights 5.2 GiB of 16.0 GiB (33%), 1.8 GiB/s,
 * 6 s left`. */
void kd_progress_bytes(kd_progress *p, double done, double total);
/* That line's text (without "\r" and the erase) for a step that has done `done` of `total`
 * bytes in `seconds` (total 0: a fraction below 0 unknown, shown as "..."). */
void kd_progress_line(char *buf, size_t cap, const char *step, double done, double total, double seconds);
/* End the step: erase its line. */
void kd_progress_done(kd_progress *p);
/* Erase the line, if one is shown, for other output to take its place (a
 * kd_progress *, as ks_diag's before_print takes it); the next update draws
 * it again. */
void kd_progress_erase(void *p);

#endif

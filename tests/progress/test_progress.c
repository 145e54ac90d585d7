/* test_progress.c — the line a long build step shows on a terminal (kd_progress_line): bytes done
 * of all, the percentage, the rate and the time left; "..." when the size is unknown. */
#include "compiler/progress.h"
#include "tests/check.h"

static void line(const char *want, const char *step, double done, double total, double seconds)
{
    char buf[256];
    kd_progress_line(buf, sizeof buf, step, done, total, seconds);
    CHECK_TEXT(want, buf, want);
}

int main(void)
{
    const double MiB = 1024.0 * 1024.0, GiB = 1024.0 * MiB;
    line("kiln: writing weights 5.2 GiB of 15.6 GiB (33%), 1.7 GiB/s, 6 s left", "writing weights", 5.2 * GiB,
         15.6 * GiB, 5.2 / 1.7);
    line("kiln: writing weights 100.0 MiB of 100.0 MiB (100%), 50.0 MiB/s, 0 s left", "writing weights", 100 * MiB,
         100 * MiB, 2.0);
    line("kiln: writing weights 0 bytes of 1.0 GiB (0%)", "writing weights", 0, GiB, 1.5);
    line("kiln: compiling CUDA kernels for sm_90a ...", "compiling CUDA kernels for sm_90a", 0, 0, 3.0);
    return check_finish("test_progress");
}

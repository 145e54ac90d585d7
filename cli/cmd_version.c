/* cmd_version.c — `kiln version` (and `kiln --version`). */
#include <stdio.h>

#include "cli/commands.h"
#include "compiler/version.h"

static const char version_help[] =
    "usage: kiln version\n"
    "       kiln --version\n"
    "\n"
    "Print kiln's version (the one engine files record as kiln_version), the C\n"
    "compiler it was built with, and whether it was built with NVRTC (which\n"
    "kiln build --target sm_XX needs): its version and the architectures it\n"
    "compiles for.\n";

int kc_cmd_version(int argc, char **argv)
{
    kc_option opts[] = {{NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 0, &npos, version_help);
    if (rc) return rc < 0 ? 2 : 0;
    ks_buf b = {0};
    kd_version_describe(&b);
    fputs(ks_buf_cstr(&b), stdout);
    ks_buf_free(&b);
    return 0;
}

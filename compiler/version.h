/*
 * version.h — kiln's version: the one place it is written. The engines
 * record it (meta "kiln_version") and `kiln --version` prints it, with what
 * this kiln was built with.
 *
 * Prefix: kd_ (driver).
 */
#ifndef KILN_VERSION_H
#define KILN_VERSION_H

#include "support/support.h"

#define KD_VERSION "0.1.0"

/* `kiln 0.1.0`, then a line for the C compiler this kiln was built with and
 * one for NVRTC (its version and the architectures it compiles for, or that
 * there is none), into b. */
void kd_version_describe(ks_buf *b);

#endif

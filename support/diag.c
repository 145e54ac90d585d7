/* diag.c — diagnostics that point at the text (chibicc verror_at, jq
 * locfile_locate), and the internal-error path. */
#include "support.h"

#include <stdlib.h>
#include <string.h>

KS_NORETURN void ks_die(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln: internal error at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void emit(ks_diag *d, const char *s, size_t n)
{
    if (d->log) ks_buf_put(d->log, s, n);
    if (!d->quiet) {
        if (d->before_print) d->before_print(d->before_ctx);
        fwrite(s, 1, n, d->out ? d->out : stderr);
        fflush(d->out ? d->out : stderr);
    }
}

/* Append the source line `line` of src and a caret under column `col`. */
static void quote_line(ks_buf *b, const ks_source *src, int line, int col)
{
    if (!src || !src->text || line < 1) return;
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line && p < end; p++)
        if (*p == '\n') l++;
    if (p >= end && line > 1) return;
    const char *e = p;
    while (e < end && *e != '\n' && *e != '\r') e++;
    ks_buf_printf(b, "  %.*s\n  ", (int)(e - p), p);
    for (int i = 1; i < col && p + i - 1 < e; i++) ks_buf_puts(b, p[i - 1] == '\t' ? "\t" : " ");
    ks_buf_puts(b, "^\n");
}

static void report_at(ks_diag *d, const char *kind, const ks_source *src, int line, int col,
                      const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    ks_buf b = KS_BUF_TRY; /* an error about memory running out must not need much of it */
    const char *name = src && src->name ? src->name : "<input>";
    if (line > 0)
        ks_buf_printf(&b, "%s:%d:%d: %s: ", name, line, col > 0 ? col : 1, kind);
    else
        ks_buf_printf(&b, "%s: %s: ", name, kind);
    ks_buf_vprintf(&b, fmt, ap);
    ks_buf_puts(&b, "\n");
    if (line > 0) quote_line(&b, src, line, col > 0 ? col : 1);
    if (!b.failed) {
        emit(d, b.data, b.len);
    } else {
        /* out of memory: the message without the quoted line, as much of it as fits here */
        char small[512];
        int k = line > 0 ? snprintf(small, sizeof small, "%s:%d:%d: %s: ", name, line, col > 0 ? col : 1, kind)
                         : snprintf(small, sizeof small, "%s: %s: ", name, kind);
        size_t at = k < 0 ? 0 : (size_t)k < sizeof small - 2 ? (size_t)k : sizeof small - 2;
        small[at] = 0;
        vsnprintf(small + at, sizeof small - 1 - at, fmt, again);
        at = strlen(small);
        small[at++] = '\n';
        emit(d, small, at);
    }
    va_end(again);
    ks_buf_free(&b);
}

void ks_verror_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, va_list ap)
{
    d->errors++;
    report_at(d, "error", src, line, col, fmt, ap);
}

void ks_error_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror_at(d, src, line, col, fmt, ap);
    va_end(ap);
}

void ks_note_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_at(d, "note", src, line, col, fmt, ap);
    va_end(ap);
}

void ks_verror(ks_diag *d, const char *file, const char *fmt, va_list ap)
{
    ks_source src = {file, NULL, 0};
    d->errors++;
    report_at(d, "error", &src, 0, 0, fmt, ap);
}

void ks_error(ks_diag *d, const char *file, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, file, fmt, ap);
    va_end(ap);
}

void ks_warning(ks_diag *d, const char *file, const char *fmt, ...)
{
    ks_source src = {file, NULL, 0};
    va_list ap;
    va_start(ap, fmt);
    d->warnings++;
    report_at(d, "warning", &src, 0, 0, fmt, ap);
    va_end(ap);
}

void ks_diag_forward(ks_diag *d, const ks_diag *from)
{
    if (from->log && from->log->len) emit(d, from->log->data, from->log->len);
    d->errors += from->errors;
    d->warnings += from->warnings;
}

/* files.c — reading, mapping and atomically writing files. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (ks_mmap_release) */
#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

char *ks_read_file(ks_diag *d, const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ks_error(d, path, "cannot read: %s", strerror(errno));
        return NULL;
    }
    ks_buf b = KS_BUF_TRY;
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0 && ks_buf_put(&b, tmp, n) == 0) continue;
    int bad = ferror(f);
    fclose(f);
    if (bad || b.failed) {
        if (b.failed)
            ks_error(d, path, "cannot read: out of memory (allocating %zu bytes for its text)", b.failed);
        else
            ks_error(d, path, "cannot read: I/O error");
        ks_buf_free(&b);
        return NULL;
    }
    ks_buf_cstr(&b);
    if (!b.data) {
        ks_error(d, path, "cannot read: out of memory (allocating 1 byte for its text)");
        return NULL;
    }
    if (len_out) *len_out = b.len;
    return b.data;
}

int ks_mmap_open(ks_diag *d, const char *path, ks_mmap *m)
{
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ks_error(d, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ks_error(d, path, "cannot open: not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ks_error(d, path, "cannot map: %s", strerror(errno));
            close(fd);
            return -1;
        }
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void ks_mmap_release(const ks_mmap *m)
{
    /* a read-only private mapping is never dirty: MADV_DONTNEED only unmaps its pages */
    if (m->data) madvise((void *)m->data, m->size, MADV_DONTNEED);
}

void ks_mmap_close(ks_mmap *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

/* ---- output files ------------------------------------------------------------
 * What an output path names decides how it is written:
 *   a regular file, or nothing yet: a temp file beside it, renamed over it at
 *     commit (atomic: readers see the old file or the new one);
 *   a symlink: the same, beside the file the link names (the link stays a link);
 *   anything else (a device such as /dev/null, a FIFO, a terminal): written
 *     straight through; never replaced by a regular file. A writer that seeks
 *     (KS_OUT_SEEKABLE) writes an unlinked scratch file instead, copied into
 *     the target at commit. */

/* path with the symlinks of its last component followed, as many as there
 * are (a heap string); NULL with errno set when a link cannot be read or
 * there are too many. A dangling link gives the path it points at. */
static char *follow_links(const char *path)
{
    char *p = ks_xstrdup(path);
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(p, &st) != 0 || !S_ISLNK(st.st_mode)) return p;
        size_t cap = 256;
        char *link = NULL;
        ssize_t n;
        for (;;) {
            link = ks_xrealloc(link, cap);
            n = readlink(p, link, cap);
            if (n < 0 || (size_t)n < cap) break;
            cap *= 2;
        }
        if (n < 0) {
            int e = errno;
            free(link);
            free(p);
            errno = e;
            return NULL;
        }
        link[n] = 0;
        char *next;
        const char *slash = strrchr(p, '/');
        if (link[0] == '/' || !slash) {
            next = ks_xstrdup(link);
        } else {
            ks_buf b = {0};
            ks_buf_put(&b, p, (size_t)(slash - p) + 1);
            ks_buf_puts(&b, link);
            next = b.data;
        }
        free(link);
        free(p);
        p = next;
    }
    free(p);
    errno = ELOOP;
    return NULL;
}

static void outfile_clear(ks_outfile *o)
{
    ks_cleanup_remove(o->cleanup);
    free(o->path);
    free(o->target);
    free(o->tmp_path);
    memset(o, 0, sizeof *o);
}

/* A scratch file for a seeking writer whose target is not a regular file:
 * in $TMPDIR (or /tmp), unlinked at once, so it never outlives the process. */
static FILE *open_scratch(void)
{
    const char *dir = getenv("TMPDIR");
    char *tmpl = ks_path_join(dir && *dir ? dir : "/tmp", "kiln-out.XXXXXX");
    int fd = mkstemp(tmpl);
    if (fd >= 0) unlink(tmpl);
    free(tmpl);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w+b");
    if (!f) close(fd);
    return f;
}

/* Write o->path straight through (or through a scratch file for a seeking
 * writer): it is not a regular file, and is never replaced. */
static int open_through(ks_diag *d, ks_outfile *o, int flags)
{
    o->mode = flags & KS_OUT_SEEKABLE ? KS_OUT_COPY : KS_OUT_DIRECT;
    if (o->mode == KS_OUT_COPY) {
        o->f = open_scratch();
    } else {
        int fd = open(o->path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        o->f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (fd >= 0 && !o->f) close(fd);
    }
    if (!o->f) {
        ks_error(d, o->path, "cannot write: %s", strerror(errno));
        outfile_clear(o);
        return -1;
    }
    return 0;
}

int ks_outfile_open(ks_diag *d, ks_outfile *o, const char *path, int flags)
{
    memset(o, 0, sizeof *o);
    o->path = ks_xstrdup(path);
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (!exists && errno != ENOENT) {
        ks_error(d, path, "cannot write: %s", strerror(errno));
        outfile_clear(o);
        return -1;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        ks_error(d, path, "cannot write: %s", strerror(EISDIR));
        outfile_clear(o);
        return -1;
    }
    if (exists && !S_ISREG(st.st_mode)) return open_through(d, o, flags); /* a device, a FIFO, a socket */
    /* a regular file or nothing yet: a temp file beside the file the path names */
    o->mode = KS_OUT_RENAME;
    o->target = follow_links(path);
    if (!o->target) {
        ks_error(d, path, "cannot write: %s", strerror(errno));
        outfile_clear(o);
        return -1;
    }
    struct stat tst;
    if (exists && (stat(o->target, &tst) != 0 || tst.st_dev != st.st_dev || tst.st_ino != st.st_ino)) {
        /* a link that does not name its file by a path (/proc/self/fd/N of a deleted file): through */
        free(o->target);
        o->target = NULL;
        return open_through(d, o, flags);
    }
    ks_buf b = {0};
    ks_buf_printf(&b, "%s.tmp.%ld", o->target, (long)getpid());
    o->tmp_path = b.data;
    o->cleanup = ks_cleanup_add(o->tmp_path); /* before it exists: a signal never leaves it */
    int fd = open(o->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd >= 0 && exists) fchmod(fd, st.st_mode & 07777); /* the file keeps its mode */
    o->f = fd >= 0 ? fdopen(fd, "w+b") : NULL;
    if (!o->f) {
        ks_error(d, path, "cannot write: %s", strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(o->tmp_path);
        }
        outfile_clear(o);
        return -1;
    }
    return 0;
}

/* Copy the scratch file f into path (KS_OUT_COPY). 0, or -1 with errno. */
static int copy_into(FILE *f, const char *path)
{
    if (fflush(f) != 0 || fseek(f, 0, SEEK_SET) != 0) return -1;
    int out = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (out < 0) return -1;
    int in = fileno(f);
    if (lseek(in, 0, SEEK_SET) != 0) {
        close(out);
        return -1;
    }
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = errno;
            if (close(out) != 0 && n == 0) return -1;
            errno = e;
            return n == 0 ? 0 : -1;
        }
        for (ssize_t at = 0; at < n;) {
            ssize_t w = write(out, buf + at, (size_t)(n - at));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int e = w < 0 ? errno : EIO;
                close(out);
                errno = e;
                return -1;
            }
            at += w;
        }
    }
}

int ks_outfile_write(ks_outfile *o, const void *data, size_t n)
{
    if (o->err) return -1;
    if (n && fwrite(data, 1, n, o->f) != n) {
        o->err = errno ? errno : EIO;
        return -1;
    }
    return 0;
}

/* Record errno as o's error unless one came first; -1. */
static int failed(ks_outfile *o)
{
    if (!o->err) o->err = errno ? errno : EIO;
    return -1;
}

int ks_outfile_commit(ks_diag *d, ks_outfile *o)
{
    if (!o->err && ferror(o->f)) o->err = EIO; /* an fwrite that bypassed ks_outfile_write */
    errno = 0;
    if (!o->err && fflush(o->f) != 0) failed(o);
    if (!o->err && o->mode == KS_OUT_COPY && copy_into(o->f, o->path) != 0) failed(o);
    /* the bytes are on disk before the name points at them */
    if (!o->err && o->mode == KS_OUT_RENAME && fsync(fileno(o->f)) != 0) failed(o);
    if (fclose(o->f) != 0) failed(o);
    o->f = NULL;
    if (!o->err && o->mode == KS_OUT_RENAME && rename(o->tmp_path, o->target) != 0) failed(o);
    int rc = 0;
    if (o->err) {
        ks_error(d, o->path, "cannot write: %s", strerror(o->err));
        if (o->tmp_path) unlink(o->tmp_path);
        rc = -1;
    }
    outfile_clear(o);
    return rc;
}

void ks_outfile_abort(ks_outfile *o)
{
    if (o->f) fclose(o->f);
    if (o->tmp_path) unlink(o->tmp_path);
    outfile_clear(o);
}

char *ks_path_join(const char *dir, const char *name)
{
    ks_buf b = {0};
    size_t n = strlen(dir);
    ks_buf_puts(&b, dir);
    if (n && dir[n - 1] != '/') ks_buf_puts(&b, "/");
    ks_buf_puts(&b, name);
    return b.data;
}

int ks_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int ks_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

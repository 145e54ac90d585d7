/* files.c — reading, mapping and atomically writing files. */
#define _POSIX_C_SOURCE 200809L
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
    ks_buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) ks_buf_put(&b, tmp, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        ks_error(d, path, "cannot read: I/O error");
        ks_buf_free(&b);
        return NULL;
    }
    ks_buf_cstr(&b);
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

void ks_mmap_close(ks_mmap *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int ks_outfile_open(ks_diag *d, ks_outfile *o, const char *path)
{
    ks_buf b = {0};
    ks_buf_printf(&b, "%s.tmp.%ld", path, (long)getpid());
    o->path = ks_xstrdup(path);
    o->tmp_path = b.data;
    o->f = fopen(o->tmp_path, "wb");
    if (!o->f) {
        ks_error(d, path, "cannot write: %s", strerror(errno));
        free(o->path);
        free(o->tmp_path);
        o->path = o->tmp_path = NULL;
        return -1;
    }
    return 0;
}

int ks_outfile_commit(ks_diag *d, ks_outfile *o)
{
    int bad = ferror(o->f);
    if (fclose(o->f) != 0) bad = 1;
    o->f = NULL;
    if (bad || rename(o->tmp_path, o->path) != 0) {
        ks_error(d, o->path, "cannot write: %s", bad ? "I/O error" : strerror(errno));
        remove(o->tmp_path);
        free(o->path);
        free(o->tmp_path);
        o->path = o->tmp_path = NULL;
        return -1;
    }
    free(o->path);
    free(o->tmp_path);
    o->path = o->tmp_path = NULL;
    return 0;
}

void ks_outfile_abort(ks_outfile *o)
{
    if (o->f) fclose(o->f);
    if (o->tmp_path) remove(o->tmp_path);
    free(o->path);
    free(o->tmp_path);
    o->f = NULL;
    o->path = o->tmp_path = NULL;
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

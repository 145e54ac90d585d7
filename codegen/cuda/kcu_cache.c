/* kcu_cache.c — a folder of the cubins kcu_build has compiled (KILN_CUDA_CACHE),
 * so that a source compiled again for the same architecture is read back
 * instead: the same bytes, without NVRTC's time.
 *
 * A cubin depends on the source, the architecture, NVRTC's version and the
 * options (kcu_compile_id says those three), nothing else. An entry is one file,
 * <dir>/<64-bit hash of key, in hex>.cubin, holding the whole key (the compile's
 * id line, the source's length, the source) then the cubin: a hit compares the
 * key byte for byte, so a hash collision or a damaged entry is a miss, never a
 * wrong cubin. Entries are written whole through ks_outfile (a temp file renamed
 * over), so builds running at once may share the folder.
 *
 * Does not: evict (the folder grows; it is the tests' build tree's), lock, or
 * report — a cache that cannot be read or written is a miss, and the build
 * compiles as without it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/cuda/kcu.h"

/* The key: kcu_compile_id's line, the source's length, the source. */
static void cache_key(const char *src, const char *arch, ks_buf *key)
{
    kcu_compile_id(arch, key);
    size_t n = strlen(src);
    ks_buf_printf(key, "\n%zu\n", n);
    ks_buf_put(key, src, n);
}

/* The entry's path for key (a heap string). */
static char *entry_path(const char *dir, const ks_buf *key)
{
    char name[40];
    snprintf(name, sizeof name, "%016llx.cubin", (unsigned long long)ks_hash64(KS_HASH_SEED, key->data, key->len));
    return ks_path_join(dir, name);
}

int kcu_cache_get(const char *dir, const char *src, const char *arch, ks_buf *cubin)
{
    ks_buf key = {0}, log = {0};
    cache_key(src, arch, &key);
    char *path = entry_path(dir, &key);
    int hit = 0;
    if (ks_file_exists(path)) {
        ks_diag quiet = {.log = &log, .quiet = 1}; /* an unreadable entry is a miss */
        size_t len = 0;
        char *data = ks_read_file(&quiet, path, &len);
        if (data && len > key.len && memcmp(data, key.data, key.len) == 0) {
            ks_buf_put(cubin, data + key.len, len - key.len);
            hit = 1;
        }
        free(data);
    }
    free(path);
    ks_buf_free(&key);
    ks_buf_free(&log);
    return hit;
}

void kcu_cache_put(const char *dir, const char *src, const char *arch, const ks_buf *cubin)
{
    ks_buf key = {0}, log = {0};
    cache_key(src, arch, &key);
    char *path = entry_path(dir, &key);
    ks_diag quiet = {.log = &log, .quiet = 1}; /* a cache that cannot be written is no error */
    ks_outfile f;
    mkdir(dir, 0777); /* the folder itself, if it is not there yet (its parent must be) */
    if (ks_is_dir(dir) && ks_outfile_open(&quiet, &f, path, 0) == 0) {
        ks_outfile_write(&f, key.data, key.len);
        ks_outfile_write(&f, cubin->data, cubin->len);
        ks_outfile_commit(&quiet, &f);
    }
    free(path);
    ks_buf_free(&key);
    ks_buf_free(&log);
}

/*
 * json_locate.h — where a value sits in a JSON text. cJSON parses a
 * document but keeps no positions; a message about a config value ("eps
 * must be positive") should point at the value in config.json with a
 * caret, so this small scanner walks the text itself along a key path and
 * returns the line and column of the value's first byte.
 *
 *     ks_json_step path[] = {{"rope_scaling", 0}, {"factor", 0}};
 *     int line, col;
 *     if (ks_json_locate(text, len, path, 2, &line, &col) == 0)
 *         ks_error_at(d, &src, line, col, "factor must be positive");
 *
 * It agrees with cJSON where cJSON accepts the text: keys are compared after
 * their escapes are decoded (\uXXXX with surrogate pairs, to UTF-8), and of
 * duplicate keys the first wins (cJSON_GetObjectItemCaseSensitive's choice).
 * It does not validate the text: on text cJSON rejects it may find a place
 * or not, and never reads past len.
 *
 * Prefix: ks_ (support).
 */
#ifndef KILN_JSON_LOCATE_H
#define KILN_JSON_LOCATE_H

#include <stddef.h>
#include <stdint.h>

/* One step of a path: a member of an object, or an element of an array. */
typedef struct ks_json_step {
    const char *key; /* member name (decoded, NUL-terminated); NULL for an index step */
    int64_t index;   /* 0-based element of an array when key is NULL */
} ks_json_step;

/* The 1-based line and byte column of the value at steps[0..n) (n = 0: the
 * document itself). Returns 0, or -1 when the path leads nowhere (a key or
 * index that is not there, a step into a scalar) or the text is malformed
 * on the way. Nothing recurses: nesting depth costs no stack. */
int ks_json_locate(const char *text, size_t len, const ks_json_step *steps, size_t n, int *line, int *col);

#endif

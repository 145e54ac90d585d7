/*
 * test_json_locate.c — ks_json_locate: each case is a JSON text, a path and
 * the line:col expected (or "-" for not found).
 */
#include <stdlib.h>

#include "support/json_locate.h"

#include "tests/check.h"

/* Parse a path written "a.b[2].c" (keys without dots or brackets) into steps. */
static size_t parse_path(const char *path, ks_json_step *steps, char keys[][32])
{
    size_t n = 0;
    const char *p = path;
    while (*p) {
        if (*p == '.') p++;
        if (*p == '[') {
            steps[n].key = NULL;
            steps[n].index = strtoll(p + 1, (char **)&p, 10);
            p++; /* ']' */
        } else {
            size_t k = 0;
            while (*p && *p != '.' && *p != '[') keys[n][k++] = *p++;
            keys[n][k] = 0;
            steps[n].key = keys[n];
        }
        n++;
    }
    return n;
}

static void expect(int line, const char *text, const char *path, const char *want)
{
    ks_json_step steps[16];
    char keys[16][32];
    size_t n = parse_path(path, steps, keys);
    int l = 0, c = 0;
    char got[32];
    if (ks_json_locate(text, strlen(text), steps, n, &l, &c) == 0)
        snprintf(got, sizeof got, "%d:%d", l, c);
    else
        snprintf(got, sizeof got, "-");
    check_at(strcmp(got, want) == 0, __FILE__, line, "path '%s': got %s, want %s", path, got, want);
}
#define EXPECT(text, path, want) expect(__LINE__, text, path, want)

int main(void)
{
    const char *cfg = "{\n"
                      "  \"hidden_size\": 128,\n"
                      "  \"name\": \"a \\\" } ] , b\",\n"
                      "  \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0},\n"
                      "  \"eos_token_id\": [1, [2, {\"x\": 3}], 4],\n"
                      "  \"nul\": null,\n"
                      "  \"empty\": {}, \"none\": []\n"
                      "}\n";
    EXPECT(cfg, "", "1:1");
    EXPECT(cfg, "hidden_size", "2:18");
    EXPECT(cfg, "name", "3:11");
    EXPECT(cfg, "rope_scaling", "4:19");
    EXPECT(cfg, "rope_scaling.factor", "4:48");
    EXPECT(cfg, "rope_scaling.type", "4:28");
    EXPECT(cfg, "eos_token_id", "5:19");
    EXPECT(cfg, "eos_token_id[0]", "5:20");
    EXPECT(cfg, "eos_token_id[1][1].x", "5:33");
    EXPECT(cfg, "eos_token_id[2]", "5:38");
    EXPECT(cfg, "nul", "6:10");
    EXPECT(cfg, "none", "7:24");
    /* not there */
    EXPECT(cfg, "missing", "-");
    EXPECT(cfg, "eos_token_id[3]", "-");
    EXPECT(cfg, "eos_token_id[-1]", "-");
    EXPECT(cfg, "hidden_size.x", "-");   /* into a scalar */
    EXPECT(cfg, "hidden_size[0]", "-");
    EXPECT(cfg, "rope_scaling[0]", "-"); /* an index into an object */
    EXPECT(cfg, "eos_token_id.x", "-");  /* a key into an array */
    EXPECT(cfg, "empty.x", "-");
    EXPECT(cfg, "none[0]", "-");
    EXPECT(cfg, "nul.x", "-");
    /* the first of duplicate keys, as cJSON takes it */
    EXPECT("{\"a\": 1, \"a\": 2}", "a", "1:7");
    /* escaped keys compare decoded: \u00e9 is é (UTF-8 c3 a9), a surrogate pair U+1F600 */
    EXPECT("{\"caf\\u00e9\": 1}", "caf\xc3\xa9", "1:15");
    EXPECT("{\"\\ud83d\\ude00\": 7}", "\xf0\x9f\x98\x80", "1:18");
    EXPECT("{\"a\\nb\": 1, \"a\\/b\": 2}", "a/b", "1:21");
    EXPECT("{\"ab\": 1, \"a\": 2}", "a", "1:16");   /* a prefix is not the key */
    EXPECT("{\"a\": 1, \"ab\": 2}", "ab", "1:16");
    /* CRLF lines and tabs: columns count bytes */
    EXPECT("{\r\n\t\"x\":\t5\r\n}", "x", "2:7");
    /* malformed or cut texts: nothing past the end is read */
    EXPECT("{\"a\": [1, 2", "a[1]", "1:11");
    EXPECT("{\"a\": [1, 2", "b", "-");
    EXPECT("{\"a\": \"unterminated", "b", "-");
    EXPECT("{\"a\\u12\": 1}", "a", "-");
    EXPECT("{\"a\\ud800\": 1}", "a", "-");
    EXPECT("{\"a\" 1}", "a", "-");
    EXPECT("", "", "-");
    EXPECT("   ", "", "-");
    EXPECT("{\"a\": }", "a", "1:7");
    {
        /* deep nesting costs no stack */
        size_t depth = 100000;
        char *deep = ks_xmalloc(2 * depth + 32);
        size_t k = 0;
        for (size_t i = 0; i < depth; i++) deep[k++] = '[';
        for (size_t i = 0; i < depth; i++) deep[k++] = ']';
        strcpy(deep + k, "");
        char *doc = ks_xmalloc(2 * depth + 64);
        snprintf(doc, 2 * depth + 64, "{\"d\": %s, \"x\": 1}", deep);
        EXPECT(doc, "x", "1:200014");
        free(deep);
        free(doc);
    }
    ks_json_step none = {NULL, 0};
    int l, c;
    CHECK(ks_json_locate(NULL, 0, &none, 0, &l, &c) == -1);
    return check_finish("json_locate");
}

/*
 * test_chat_template.c — server/chat_template.c, two ways.
 *
 *   test_chat_template
 *       the checks below: syntax errors with their exact `name:LINE:COL` messages,
 *       raise_exception and other render errors, Jinja's whitespace control and scoping;
 *   test_chat_template TEMPLATE CASES.json
 *       renders each case of CASES.json with TEMPLATE and prints, per case,
 *           CASE <name> OK <bytes>\n<the rendered text>\n
 *       or  CASE <name> ERROR <bytes>\n<the message after "error: ">\n
 *       (the byte counts make the output unambiguous whatever the text holds);
 *       chat_template_check.py compares that with Python's jinja2 as transformers runs it.
 *
 * A case is {"name": "...", "messages": [{"role": "...", "content": "..."}, ...],
 * "bos_token": "...", "eos_token": "...", "add_generation_prompt": true|false}.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "server/chat_template.h"
#include "tests/check.h"

/* Render src on msgs; the text, or "ERROR: " and the messages. */
static const char *render_text(const char *src, const ksv_tpl_message *msgs, int n, const ksv_tpl_vars *vars,
                               ks_buf *out)
{
    sink s;
    sink_init(&s);
    ks_buf_clear(out);
    ksv_tpl *t = ksv_tpl_parse(src, strlen(src), "t.jinja", &s.d);
    if (!t || ksv_tpl_render(t, msgs, n, vars, out, &s.d) < 0) {
        ks_buf_clear(out);
        ks_buf_puts(out, "ERROR: ");
        ks_buf_puts(out, sink_text(&s));
    }
    ksv_tpl_free(t);
    sink_free(&s);
    return ks_buf_cstr(out);
}

static const ksv_tpl_message conv[] = {
    {"system", "Be brief."}, {"user", "  Hi  "}, {"assistant", "Hello!"}, {"user", "2+2?"}};
static const ksv_tpl_vars vars = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = 1};

#define RENDER(src) render_text((src), conv, 4, &vars, &out)

static void check_syntax_errors(void)
{
    static const struct {
        const char *src, *msg;
    } cases[] = {
        {"{{ 1 + }}", "t.jinja:1:8: error: expected an expression, got '}}'\n"},
        {"hello\n  {% if x %}\n  y\n", "t.jinja:2:6: error: 'if' is never closed (expected {% endif %})\n"},
        {"{% for m in messages %}{{ m }}{% endif %}",
         "t.jinja:1:34: error: unexpected 'endif'\n"},
        {"{% for m in messages %}{{ m }}", "t.jinja:1:4: error: 'for' is never closed (expected {% endfor %})\n"},
        {"{{ 'abc }}", "t.jinja:1:4: error: unterminated string\n"},
        {"ab\n{{ x", "t.jinja:2:1: error: unclosed '{{' (expected '}}')\n"},
        {"{# note", "t.jinja:1:1: error: unclosed comment (expected '#}')\n"},
        {"{{ x | nosuch }}", "t.jinja:1:8: error: unknown filter 'nosuch'\n"},
        {"{% if x is nosuch %}{% endif %}", "t.jinja:1:12: error: unknown test 'nosuch'\n"},
        {"{% macro f() %}{% endmacro %}", "t.jinja:1:4: error: the 'macro' tag is not supported\n"},
        {"{% frobnicate %}", "t.jinja:1:4: error: unknown tag 'frobnicate'\n"},
        {"{% break %}", "t.jinja:1:4: error: 'break' outside a for loop\n"},
        {"{{ a $ b }}", "t.jinja:1:6: error: unexpected character '$'\n"},
        {"{% set x %}", "t.jinja:1:4: error: 'set' is never closed (expected {% endset %})\n"},
        {"{{ x[1:2:3:4] }}", "t.jinja:1:11: error: a slice has at most two ':'\n"},
        {"{{ '\\x4' }}", "t.jinja:1:5: error: truncated \\x escape in a string\n"},
        {"{% if a %}{% else %}{% elif b %}{% endif %}", "t.jinja:1:24: error: unexpected 'elif'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sink s;
        sink_init(&s);
        ksv_tpl *t = ksv_tpl_parse(cases[i].src, strlen(cases[i].src), "t.jinja", &s.d);
        CHECK_MSG(t == NULL, "case %zu parsed", i);
        CHECK_MSG(s.d.errors == 1, "case %zu: %d errors", i, s.d.errors);
        CHECK_LOG(&s, cases[i].msg);
        ksv_tpl_free(t);
        sink_free(&s);
    }
    /* deep nesting is an error, not a crash */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k] = 0;
    sink s;
    sink_init(&s);
    CHECK(ksv_tpl_parse(deep, k, "t.jinja", &s.d) == NULL && s.d.errors == 1);
    sink_free(&s);
}

static void check_render(void)
{
    ks_buf out = {0};
    /* raise_exception: the template's message, located at the call */
    CHECK_STR(RENDER("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                     "{% endif %}"),
              "ERROR: t.jinja:1:44: error: System role not supported\n");
    /* render errors */
    CHECK_STR(RENDER("{{ nope.x }}"), "ERROR: t.jinja:1:4: error: 'nope' is undefined\n");
    CHECK_STR(RENDER("{{ 'a' + 1 }}"), "ERROR: t.jinja:1:8: error: unsupported operand type(s) for +: 'str' and 'int'\n");
    CHECK_STR(RENDER("{{ 'a'.nosuch() }}"), "ERROR: t.jinja:1:8: error: 'str object' has no attribute 'nosuch'\n");
    CHECK_STR(RENDER("{{ 1 // 0 }}"), "ERROR: t.jinja:1:6: error: integer division or modulo by zero\n");
    CHECK_STR(RENDER("{{ 'x' * 100000000000 }}"), "ERROR: t.jinja:1:8: error: string too long (over 67108864 bytes)\n");
    CHECK_STR(RENDER("{% set ns = 1 %}{% set ns.a = 2 %}"),
              "ERROR: t.jinja:1:20: error: cannot assign attribute on non-namespace object ('ns')\n");
    /* undefined: prints empty, false, length 0; defined tests */
    CHECK_STR(RENDER("[{{ nope }}|{{ nope is defined }}|{{ nope | length }}|{{ not nope }}]"), "[|False|0|True]");
    /* whitespace control with trim_blocks and lstrip_blocks */
    CHECK_STR(RENDER("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
    CHECK_STR(RENDER("a  {%- if true -%}  b  {%- endif %}  c"), "ab  c");
    CHECK_STR(RENDER("{{ 1 }}\n{# c #}\n{{ 2 }}"), "1\n2");
    /* scoping: a set in a loop lives for its iteration; namespaces carry values out */
    CHECK_STR(RENDER("{% set a = 0 %}{% for x in [1, 2, 3] %}{% if loop.first %}{% set a = 5 %}{% endif %}"
                     "{{ a }}{% endfor %}{{ a }}"),
              "5000");
    CHECK_STR(RENDER("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}"
                     "{% endfor %}{{ ns.n }}"),
              "25");
    /* loop variables, slices, filters, methods */
    CHECK_STR(RENDER("{% for m in messages[1:] %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}"
                     "{% endfor %}"),
              "1/3,2/3,3/3");
    CHECK_STR(RENDER("{{ messages[1].content.strip() }}|{{ 'abc'[::-1] }}|{{ [1, 2, 3][-1] }}|{{ 7 // 2 }}"
                     "{{ -7 // 2 }}{{ -7 % 3 }}|{{ 1 / 4 }}|{{ 'a,b'.split(',') }}"),
              "Hi|cba|3|3-42|0.25|['a', 'b']");
    CHECK_STR(RENDER("{{ {'b': [1, 2.5, none, true], 'a': 'x\"y'} | tojson }}"),
              "{\"b\": [1, 2.5, null, true], \"a\": \"x\\\"y\"}");
    CHECK_STR(RENDER("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }}"),
              "  Hi  |2+2?");
    CHECK_STR(RENDER("{% for m in messages if m.role != 'system' %}{% if loop.index > 2 %}{% break %}{% endif %}"
                     "{{ m.role[0] }}{% else %}none{% endfor %}"),
              "ua");
    ks_buf_free(&out);
}

/* ---- the driver of chat_template_check.py ---- */

static const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int render_cases(const char *tpl_path, const char *cases_path)
{
    ks_diag d = {0};
    size_t tlen, clen;
    char *text = ks_read_file(&d, tpl_path, &tlen), *cases_text = ks_read_file(&d, cases_path, &clen);
    if (!text || !cases_text) return 2;
    cJSON *cases = cJSON_ParseWithLength(cases_text, clen);
    if (!cJSON_IsArray(cases)) {
        fprintf(stderr, "%s: not a JSON array of cases\n", cases_path);
        return 2;
    }
    ks_buf log = {0};
    ks_diag quiet = {.quiet = 1, .log = &log};
    ksv_tpl *t = ksv_tpl_parse(text, tlen, tpl_path, &quiet);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "messages"), *m;
        int n = cJSON_GetArraySize(ms), i = 0;
        ksv_tpl_message *msgs = ks_xcalloc((size_t)(n ? n : 1), sizeof *msgs);
        cJSON_ArrayForEach(m, ms) msgs[i++] = (ksv_tpl_message){json_str(m, "role"), json_str(m, "content")};
        ksv_tpl_vars v = {json_str(c, "bos_token"), json_str(c, "eos_token"),
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"))};
        ks_buf out = {0};
        ks_buf_clear(&log);
        quiet.errors = 0;
        int ok = t && ksv_tpl_render(t, msgs, n, &v, &out, &quiet) == 0;
        const char *name = json_str(c, "name") ? json_str(c, "name") : "?";
        if (ok) {
            printf("CASE %s OK %zu\n", name, out.len);
            fwrite(out.data ? out.data : "", 1, out.len, stdout);
        } else {
            const char *msg = log.len ? ks_buf_cstr(&log) : "";
            const char *e = strstr(msg, "error: ");
            e = e ? e + 7 : msg;
            size_t len = strcspn(e, "\n");
            printf("CASE %s ERROR %zu\n%.*s", name, len, (int)len, e);
        }
        printf("\n");
        ks_buf_free(&out);
        free(msgs);
    }
    ksv_tpl_free(t);
    ks_buf_free(&log);
    cJSON_Delete(cases);
    free(text);
    free(cases_text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3) return render_cases(argv[1], argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [TEMPLATE CASES.json]\n", argv[0]);
        return 2;
    }
    check_syntax_errors();
    check_render();
    return check_finish("chat_template");
}

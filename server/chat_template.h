/*
 * chat_template.h — Hugging Face chat templates (the `chat_template` of a
 * tokenizer_config.json): a Jinja2 subset, parsed once and rendered for each
 * POST /v1/chat/completions into the prompt the model was trained on.
 *
 *     ksv_tpl *t = ksv_tpl_parse(text, len, "tokenizer_config.json", &diag);
 *     if (!t) ... the syntax error is in diag, as `name:LINE:COL: error: ...`
 *     ksv_tpl_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
 *     ksv_tpl_vars vars = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = 1};
 *     ks_buf prompt = KS_BUF_TRY;
 *     if (ksv_tpl_render(t, msgs, 2, &vars, &prompt, &diag) < 0)
 *         ... a render error (the template's raise_exception('...'), a type error) is in diag
 *     ksv_tpl_free(t);
 *
 * The environment is the one transformers' apply_chat_template builds:
 * trim_blocks and lstrip_blocks on, the loopcontrols extension ({% break %},
 * {% continue %}), `{% generation %}` blocks, globals raise_exception,
 * strftime_now, namespace and range, a tojson filter that is Python's
 * json.dumps(ensure_ascii=False), and the variables messages (a list of
 * mappings with 'role' and 'content'), tools and documents (none),
 * add_generation_prompt, bos_token and eos_token. Undefined values behave as
 * Jinja's default Undefined: they print as "" and are false, and using one
 * (an attribute of it, adding to it, calling it) is an error.
 *
 * The subset (what the chat templates of Llama 3 / 3.1, Qwen2 / ChatML,
 * Mistral Instruct, Gemma and Phi-3 use, and somewhat more):
 *   tags        {{ }}, {% %}, {# #}, with the whitespace control - and +
 *   statements  if / elif / else, for (one or more targets, `if` filter, else),
 *               set (a name, names, ns.attr, or a {% set x %}...{% endset %} block),
 *               break, continue, generation
 *   expressions literals (strings with Python escapes, integers, floats,
 *               true/false/none in either case, lists, tuples, dicts), names,
 *               a.b, a['b'], a[0], slices a[1:], a[::-1], calls with keyword
 *               arguments, + - * / // % ** ~, comparisons, in / not in,
 *               and / or / not, x if c else y, filters (|) and tests (is)
 *   filters     abs capitalize count d default first float int items join
 *               last length list lower map reject rejectattr replace reverse
 *               safe select selectattr string title tojson trim upper
 *   tests       boolean callable defined divisibleby eq equalto even false
 *               float ge gt in integer iterable le lower lt mapping ne none
 *               number odd sameas sequence string true undefined upper
 *               (and ==, !=, <, <=, >, >=)
 *   methods     strings: strip lstrip rstrip startswith endswith split upper
 *               lower title capitalize replace; mappings: items keys values
 *               get; loop.cycle
 * Not supported (a parse error names them): macros, call blocks, include,
 * import, extends, blocks, raw, recursive loops. Case mapping (lower, upper,
 * title, capitalize) is ASCII only; trim and strip know Unicode whitespace as
 * Python does; lengths, indices and slices of strings count code points.
 *
 * Rendering is bounded (steps, string sizes, list sizes, nesting) so that no
 * template can hang or exhaust the server; allocation is fallible throughout.
 *
 * Prefix: ksv_tpl_ (server).
 */
#ifndef KILN_SERVER_CHAT_TEMPLATE_H
#define KILN_SERVER_CHAT_TEMPLATE_H

#include <stddef.h>

#include "support/support.h"

typedef struct ksv_tpl ksv_tpl; /* a parsed template (owns its tree and a copy of its name) */

typedef struct ksv_tpl_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* the text; NULL renders as none */
} ksv_tpl_message;

typedef struct ksv_tpl_vars {
    const char *bos_token;     /* the tokenizer's beginning-of-sequence text; NULL or "" when it has none */
    const char *eos_token;     /* its end-of-sequence text; NULL or "" when it has none */
    int add_generation_prompt; /* 1: end with the header of the assistant's turn */
} ksv_tpl_vars;

/* Parse text[0..len) (NUL bytes allowed); name is where messages place it
 * (`name:LINE:COL: error: ...`). NULL after reporting a syntax error or out
 * of memory. */
ksv_tpl *ksv_tpl_parse(const char *text, size_t len, const char *name, ks_diag *d);

/* Render the conversation msgs[0..n_msgs) with vars (NULL: no tokens, no
 * generation prompt) and append the text to out. 0, or -1 after reporting a
 * render error (out is then left as it was). Reentrant: one parsed template
 * may render on several threads at once. */
int ksv_tpl_render(const ksv_tpl *t, const ksv_tpl_message *msgs, int n_msgs, const ksv_tpl_vars *vars,
                   ks_buf *out, ks_diag *d);

void ksv_tpl_free(ksv_tpl *t);

#endif

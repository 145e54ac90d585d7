/* fuzz_chat_template.c — bytes as a chat template (server/chat_template.h). A parse either fails
 * with exactly one error, or succeeds; then the template renders a fixed conversation, with and
 * without the generation prompt, and either gives text or fails with exactly one error. A crash,
 * hang, leak or sanitizer report is the bug. */
#include <string.h>

#include "server/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ksv_tpl_message msgs[] = {{"system", "You are terse."},
                                           {"user", "  Hello, how are you?  "},
                                           {"assistant", "Fine. {{ not a tag }} \xe3\x80\x80"},
                                           {"user", "And you?"}};
    ks_buf log = {0}, out = {0};
    ks_diag d = {.quiet = 1, .log = &log};
    ksv_tpl *t = ksv_tpl_parse((const char *)data, size, "fuzz.jinja", &d);
    if (t) {
        KS_ASSERT(d.errors == 0);
        for (int gen = 0; gen < 2; gen++) {
            ksv_tpl_vars vars = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = gen};
            int before = d.errors;
            size_t len = out.len;
            if (ksv_tpl_render(t, msgs, 4, &vars, &out, &d) < 0)
                KS_ASSERT(d.errors == before + 1 && out.len == len);
            else
                KS_ASSERT(d.errors == before);
        }
        ksv_tpl_free(t);
    } else {
        KS_ASSERT(d.errors == 1 && log.len > 0);
    }
    ks_buf_free(&log);
    ks_buf_free(&out);
    return 0;
}

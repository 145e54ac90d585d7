/* fuzz_completion_request.c — bytes as the body of a POST /v1/completions and of a POST
 * /v1/chat/completions (server/completion_request.h).
 * The parse either succeeds, with a prompt (text or ids in range), options in their ranges and at most
 * KSV_MAX_STOPS stop strings, or refuses with a 400, 413 or 503 status and a message. A crash, leak or
 * sanitizer report is the bug. */
#include <string.h>

#include "server/completion_request.h"
#include "support/support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ksv_limits lim = {.vocab = 32000, .max_context = 4096, .max_body = 1 << 16};
    ksv_completion c;
    char msg[256] = "";
    const int status = ksv_completion_parse((const char *)data, size, &lim, &c, msg, sizeof msg);
    if (status == 0) {
        KS_ASSERT((c.prompt != NULL) != (c.ids != NULL));
        for (int i = 0; i < c.n_ids; i++) KS_ASSERT(c.ids[i] >= 0 && c.ids[i] < lim.vocab);
        KS_ASSERT(c.n_ids <= lim.max_context && c.max_tokens >= 0 && c.max_tokens <= lim.max_context);
        KS_ASSERT(c.temperature >= 0 && c.temperature <= 2 && c.top_p > 0 && c.top_p <= 1 && c.top_k >= 0);
        KS_ASSERT(c.n_stops >= 0 && c.n_stops <= KSV_MAX_STOPS && c.logprobs >= -1 && c.logprobs <= 20);
        for (int i = 0; i < c.n_stops; i++) KS_ASSERT(c.stops[i] && c.stops[i][0]);
        ksv_completion_free(&c);
    } else {
        KS_ASSERT((status == 400 || status == 413 || status == 503) && msg[0]);
    }
    /* the same bytes as a chat's body: messages, each with a role and a content */
    const int chat = ksv_chat_parse((const char *)data, size, &lim, &c, msg, sizeof msg);
    if (chat == 0) {
        KS_ASSERT(c.n_messages >= 1 && c.n_messages <= KSV_MAX_MESSAGES && !c.prompt && !c.ids);
        for (int i = 0; i < c.n_messages; i++) KS_ASSERT(c.messages[i].role[0] && c.messages[i].content);
        ksv_completion_free(&c);
    } else {
        KS_ASSERT((chat == 400 || chat == 413 || chat == 503) && msg[0]);
    }
    return 0;
}

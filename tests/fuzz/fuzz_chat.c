/*
 * libFuzzer target: the chat-template renderer (src/engine/chat.c) on
 * arbitrary messages, for every family, with and without tools, plus the
 * family detection on arbitrary template text.
 *
 * Input: byte 0: family (bits 0-2), add_assistant (bit 3), tool format
 * (bit 4), a tool list (bit 5). The rest is split at NUL bytes into
 * fields: with bit 5 the first three are a tool's name, description and
 * parameters JSON; then pairs of role and content. A one-byte role picks
 * system/user/assistant/tool (others are passed through as given); an
 * assistant content starting with '{' becomes a tool call with those
 * arguments; a tool message answers "call_1".
 * Checked: a result or a message saying why not; the result is a string.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool/engine.h"
#include "engine/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FIELDS 64

static const char *const families[8] = {"chatml", "llama-2", "llama-3", "mistral",
                                        "zephyr", "gemma",   "phi-3",   "fallback"};
static const char *const roles[5] = {"system", "user", "assistant", "tool", "developer"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned flags = data[0];
    char *buf = malloc(size); /* fields, each NUL-terminated */
    if (!buf)
        abort();
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';

    /* the whole text as a template: detection must name a family */
    const char *fam = gpe_chat_detect(buf);
    if (!fam || !gpe_chat_family_name(fam))
        abort();
    (void)gpe_chat_template_supports_tools(buf);

    const char *f[MAX_FIELDS];
    size_t nf = 0;
    for (char *p = buf; p <= buf + size - 1 && nf < MAX_FIELDS; p += strlen(p) + 1)
        f[nf++] = p;

    size_t fi = 0;
    gpe_chat_tool tool = {0};
    size_t n_tools = 0;
    if ((flags & 32) && nf >= 3) {
        tool.name = f[0];
        tool.description = f[1][0] ? f[1] : NULL;
        tool.parameters = f[2][0] ? f[2] : NULL;
        n_tools = 1;
        fi = 3;
    }
    gpe_chat_msg msgs[MAX_FIELDS / 2];
    gpe_chat_msg_tools extra[MAX_FIELDS / 2];
    gpe_chat_tool_call calls[MAX_FIELDS / 2];
    size_t n = 0;
    for (; fi + 1 < nf; fi += 2, n++) {
        const char *role = f[fi];
        if (strlen(role) == 1)
            role = roles[(unsigned char)role[0] % 5];
        msgs[n] = (gpe_chat_msg){.role = role, .content = f[fi + 1]};
        extra[n] = (gpe_chat_msg_tools){0};
        if (strcmp(role, "assistant") == 0 && f[fi + 1][0] == '{') {
            calls[n] = (gpe_chat_tool_call){.id = "call_1", .name = "f", .arguments = f[fi + 1]};
            extra[n].tool_calls = &calls[n];
            extra[n].n_tool_calls = 1;
            msgs[n].content = NULL;
        } else if (strcmp(role, "tool") == 0) {
            extra[n].tool_call_id = "call_1";
        }
    }

    const char *family = families[flags & 7];
    char err[256] = "";
    char *out = gpe_chat_apply_format_tools(family, NULL, NULL, (flags & 16) != 0,
                                            n_tools ? &tool : NULL, n_tools, msgs, extra, n,
                                            (flags & 8) != 0, err, sizeof err);
    if (!out && !err[0])
        abort();
    if (out)
        (void)strlen(out);
    free(out);

    /* the plain renderer (no tool parts) on the same messages, when it can */
    bool plain = true;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].content)
            plain = false;
    if (plain) {
        err[0] = '\0';
        out = gpe_chat_apply_format(family, NULL, NULL, msgs, n, (flags & 8) != 0, err,
                                    sizeof err);
        if (!out && !err[0])
            abort();
        free(out);
    }
    free(buf);
    return 0;
}

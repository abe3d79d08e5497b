/*
 * chat_model: the model-level tool entry points (gpe_chat_supports_tools,
 * gpe_chat_apply_tools). Kept apart from chat.c so that chat.c stays free
 * of model symbols and its unit test links chat.c alone.
 */
#include "engine/chat.h"

#include <gpupool/engine.h>

#include <stdio.h>
#include <stdlib.h>

#include "engine/model.h"

bool gpe_chat_supports_tools(const gpe_model *m)
{
    if (!m)
        return false;
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    return gpe_chat_template_supports_tools(info.chat_template);
}

char *gpe_chat_apply_tools_status(const gpe_model *m, const gpe_chat_tool *tools,
                                  size_t n_tools, const gpe_chat_msg *msgs,
                                  const gpe_chat_msg_tools *extra, size_t n, bool add_assistant,
                                  char *err, size_t errlen, gpe_status *st)
{
    if (!m) {
        if (err && errlen)
            snprintf(err, errlen, "no model");
        if (st)
            *st = GPE_ERR_ARG;
        return NULL;
    }
    gpe_model_info info;
    gpe_model_get_info(m, &info);
    char *bos = gpe_special_text(m, info.bos), *eos = gpe_special_text(m, info.eos);
    char *out = NULL;
    if (!bos || !eos) {
        if (err && errlen)
            snprintf(err, errlen, "chat: out of memory rendering the prompt");
        if (st)
            *st = GPE_ERR_NOMEM;
    } else {
        out = gpe_chat_apply_format_tools_status(
            info.chat_format, bos, eos, gpe_chat_template_supports_tools(info.chat_template),
            tools, n_tools, msgs, extra, n, add_assistant, err, errlen, st);
    }
    free(bos);
    free(eos);
    return out;
}

char *gpe_chat_apply_tools(const gpe_model *m, const gpe_chat_tool *tools, size_t n_tools,
                           const gpe_chat_msg *msgs, const gpe_chat_msg_tools *extra, size_t n,
                           bool add_assistant, char *err, size_t errlen)
{
    return gpe_chat_apply_tools_status(m, tools, n_tools, msgs, extra, n, add_assistant, err,
                                       errlen, NULL);
}

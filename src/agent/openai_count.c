/* openai_count: see openai_count.h. */
#include "agent/openai_count.h"

#include <stdlib.h>
#include <string.h>

#include "common/gp_count.h"
#include "common/gp_json.h"
#include "common/gp_util.h"

json_t *oai_count_messages_body(const json_t *job, const char *model)
{
    const char *prompt = json_string_value(json_object_get(job, "prompt"));
    const json_t *msgs = json_object_get(job, "messages");
    json_t *out = json_pack("{s:s,s:[]}", "model", model, "messages");
    if (!out)
        return NULL;
    json_t *list = json_object_get(out, "messages");
    if (prompt) {
        json_array_append_new(list, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
        return out;
    }
    if (!json_is_array(msgs)) {
        json_decref(out);
        return NULL;
    }
    gp_buf sys;
    gp_buf_init(&sys);
    size_t i;
    const json_t *m;
    json_array_foreach((json_t *)msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        gp_buf t;
        gp_buf_init(&t);
        gp_count_content_text(json_object_get(m, "content"), &t);
        if (role && strcmp(role, "system") == 0) {
            if (sys.len && t.len)
                gp_buf_append(&sys, "\n", 1);
            gp_buf_append(&sys, t.data ? t.data : "", t.len);
        } else {
            bool assistant = role && strcmp(role, "assistant") == 0;
            if (assistant)
                gp_count_calls_text(m, &t);
            /* Anthropic content must not be empty. */
            json_t *s = json_stringn(t.len ? t.data : " ", t.len ? t.len : 1);
            if (s)
                json_array_append_new(list, json_pack("{s:s,s:o}", "role",
                                                      assistant ? "assistant" : "user",
                                                      "content", s));
        }
        gp_buf_free(&t);
    }
    if (sys.len) {
        json_t *s = json_stringn(sys.data, sys.len);
        if (s)
            json_object_set_new(out, "system", s);
    }
    gp_buf_free(&sys);
    if (json_array_size(list) == 0) /* only a system prompt: count it as the user's */
        json_array_append_new(list, json_pack("{s:s,s:O}", "role", "user", "content",
                                              json_object_get(out, "system")));
    return out;
}

json_t *oai_count_template_body(const json_t *job, const char *model)
{
    const json_t *msgs = json_object_get(job, "messages");
    const json_t *tools = json_object_get(job, "tools");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return NULL;
    json_t *out = json_pack("{s:s,s:O}", "model", model, "messages", msgs);
    if (out && json_is_array(tools) && json_array_size(tools) > 0)
        json_object_set(out, "tools", (json_t *)tools);
    return out;
}

char *oai_count_template_tokenize(const char *body, size_t len)
{
    /* (checked: a prompt with a byte dropped would be counted wrong) */
    json_t *o = gp_json_load_checked(body ? body : "", len, 0, NULL);
    const json_t *p = json_object_get(o, "prompt");
    char *out = NULL;
    if (json_is_string(p) && json_string_length(p) > 0) {
        json_t *req = json_pack("{s:O,s:b,s:b}", "content", p, "add_special", 1,
                                "parse_special", 1);
        out = req ? json_dumps(req, JSON_COMPACT) : NULL;
        json_decref(req);
    }
    json_decref(o);
    return out;
}

json_t *oai_count_tokenize_body(const json_t *job, const char *model)
{
    char *text = gp_count_text(job);
    json_t *t = text ? json_string(text) : NULL;
    free(text);
    if (!t)
        return NULL;
    json_t *out = json_pack("{s:s,s:o,s:b}", "model", model, "content", t, "add_special", 1);
    if (!out)
        return NULL;
    json_t *chat = oai_count_template_body(job, model);
    if (chat) {
        /* vLLM takes a body with messages as a chat (and no "prompt"). */
        json_object_set(out, "messages", json_object_get(chat, "messages"));
        json_t *tools = json_object_get(chat, "tools");
        if (tools)
            json_object_set(out, "tools", tools);
        json_object_set_new(out, "add_generation_prompt", json_true());
        json_decref(chat);
    } else {
        json_object_set(out, "prompt", json_object_get(out, "content"));
    }
    return out;
}

int oai_count_parse(oai_count_method m, const char *body, size_t len, long long *n,
                    bool *estimated)
{
    *estimated = false;
    json_t *o = gp_json_load_checked(body ? body : "", len, 0, NULL);
    int rc = -1;
    if (m == OAI_COUNT_MESSAGES) {
        const json_t *v = json_object_get(o, "input_tokens");
        if (json_is_integer(v) && json_integer_value(v) >= 0) {
            *n = json_integer_value(v);
            *estimated = json_is_true(json_object_get(json_object_get(o, "x_pool_meta"),
                                                      "estimated"));
            rc = 0;
        }
    } else if (m == OAI_COUNT_TOKENIZE || m == OAI_COUNT_TEMPLATE) {
        /* llama-server: {"tokens":[...]}; vLLM: {"count":n,"tokens":[...]} */
        const json_t *c = json_object_get(o, "count");
        const json_t *t = json_object_get(o, "tokens");
        if (json_is_integer(c) && json_integer_value(c) > 0) {
            *n = json_integer_value(c);
            rc = 0;
        } else if (json_is_array(t) && json_array_size(t) > 0) {
            *n = (long long)json_array_size(t);
            rc = 0;
        }
    }
    json_decref(o);
    return rc;
}

/* openai_count: see openai_count.h. */
#include "agent/openai_count.h"

#include <stdlib.h>
#include <string.h>

#include "common/gp_count.h"
#include "common/gp_json.h"
#include "common/gp_util.h"

/* The Anthropic form of msgs into out (its "messages" array list, and
 * "system"). 0, or -1 when memory ran out: every message must be there, a
 * body without one counts another prompt. (The texts are the job's UTF-8
 * strings joined: json_stringn fails only for memory.) */
static int anthropic_messages(json_t *out, json_t *list, const json_t *msgs)
{
    gp_buf sys, t;
    gp_buf_init(&sys);
    gp_buf_init(&t);
    int rc = 0;
    size_t i;
    const json_t *m;
    json_array_foreach((json_t *)msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        t.len = 0;
        if (gp_count_content_text(json_object_get(m, "content"), &t) < 0) {
            rc = -1;
            break;
        }
        if (role && strcmp(role, "system") == 0) {
            if ((sys.len && t.len && gp_buf_append(&sys, "\n", 1) < 0) ||
                gp_buf_append(&sys, t.data ? t.data : "", t.len) < 0)
                rc = -1;
        } else {
            bool assistant = role && strcmp(role, "assistant") == 0;
            if (assistant && gp_count_calls_text(m, &t) < 0) {
                rc = -1;
                break;
            }
            /* Anthropic content must not be empty. */
            json_t *s = json_stringn(t.len ? t.data : " ", t.len ? t.len : 1);
            rc = s ? json_array_append_new(list, json_pack("{s:s,s:o}", "role",
                                                           assistant ? "assistant" : "user",
                                                           "content", s))
                   : -1;
        }
        if (rc < 0)
            break;
    }
    if (rc == 0 && sys.len)
        rc = json_object_set_new(out, "system", json_stringn(sys.data, sys.len));
    /* only a system prompt: count it as the user's */
    json_t *only = json_object_get(out, "system");
    if (rc == 0 && json_array_size(list) == 0 && only)
        rc = json_array_append_new(list, json_pack("{s:s,s:O}", "role", "user", "content", only));
    gp_buf_free(&t);
    gp_buf_free(&sys);
    return rc;
}

json_t *oai_count_messages_body(const json_t *job, const char *model, bool *nomem)
{
    const char *prompt = json_string_value(json_object_get(job, "prompt"));
    const json_t *msgs = json_object_get(job, "messages");
    *nomem = false;
    if (!prompt && !json_is_array(msgs))
        return NULL;
    json_t *out = json_pack("{s:s,s:[]}", "model", model, "messages");
    json_t *list = json_object_get(out, "messages");
    int rc = !out ? -1
             : prompt ? json_array_append_new(list, json_pack("{s:s,s:s}", "role", "user",
                                                              "content", prompt))
                      : anthropic_messages(out, list, msgs);
    if (rc == 0)
        return out;
    json_decref(out);
    *nomem = true;
    return NULL;
}

json_t *oai_count_template_body(const json_t *job, const char *model, bool *nomem)
{
    const json_t *msgs = json_object_get(job, "messages");
    const json_t *tools = json_object_get(job, "tools");
    *nomem = false;
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return NULL;
    /* The tools are rendered into the prompt counted: a body without them
     * would count a shorter one. */
    json_t *out = json_pack("{s:s,s:O}", "model", model, "messages", msgs);
    if (out && json_is_array(tools) && json_array_size(tools) > 0 &&
        json_object_set(out, "tools", (json_t *)tools) < 0) {
        json_decref(out);
        out = NULL;
    }
    *nomem = !out;
    return out;
}

char *oai_count_template_tokenize(const char *body, size_t len, bool *nomem)
{
    /* (checked: a prompt with a byte dropped would be counted wrong) */
    json_error_t je;
    json_t *o = gp_json_load_checked(body ? body : "", len, 0, &je);
    *nomem = !o && json_error_code(&je) == json_error_out_of_memory;
    const json_t *p = json_object_get(o, "prompt");
    char *out = NULL;
    if (json_is_string(p) && json_string_length(p) > 0) {
        /* gp_json_dumps, not json_dumps: jansson 2.14's can leave out a key
         * ("content": llama-server counts no tokens; "add_special": a count
         * without the BOS) and still succeed. */
        json_t *req = json_pack("{s:O,s:b,s:b}", "content", p, "add_special", 1,
                                "parse_special", 1);
        out = req ? gp_json_dumps(req) : NULL;
        *nomem = !out; /* p is a string read from JSON: UTF-8 */
        json_decref(req);
    }
    json_decref(o);
    return out;
}

json_t *oai_count_tokenize_body(const json_t *job, const char *model, bool *nomem)
{
    *nomem = false;
    char *text = gp_count_text(job);
    if (!text) {
        /* NULL for a job with a prompt or messages: memory */
        *nomem = json_is_string(json_object_get(job, "prompt")) ||
                 json_is_array(json_object_get(job, "messages"));
        return NULL;
    }
    json_t *t = json_string(text);
    /* json_string refuses what is not UTF-8, else it failed for memory */
    *nomem = !t && gp_utf8_valid(text, strlen(text));
    free(text);
    if (!t)
        return NULL;
    json_t *out = json_pack("{s:s,s:o,s:b}", "model", model, "content", t, "add_special", 1);
    json_t *chat = out ? oai_count_template_body(job, model, nomem) : NULL;
    int rc = out && !*nomem ? 0 : -1;
    if (rc == 0 && chat) {
        /* vLLM takes a body with messages as a chat (and no "prompt"). */
        rc = json_object_set(out, "messages", json_object_get(chat, "messages"));
        json_t *tools = json_object_get(chat, "tools");
        if (rc == 0 && tools)
            rc = json_object_set(out, "tools", tools);
        if (rc == 0)
            rc = json_object_set_new(out, "add_generation_prompt", json_true());
    } else if (rc == 0) {
        rc = json_object_set(out, "prompt", json_object_get(out, "content"));
    }
    json_decref(chat);
    if (rc == 0)
        return out;
    json_decref(out);
    *nomem = true;
    return NULL;
}

int oai_count_parse(oai_count_method m, const char *body, size_t len, long long *n,
                    bool *estimated)
{
    *estimated = false;
    json_error_t je;
    json_t *o = gp_json_load_checked(body ? body : "", len, 0, &je);
    if (!o && json_error_code(&je) == json_error_out_of_memory)
        return OAI_COUNT_NOMEM;
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

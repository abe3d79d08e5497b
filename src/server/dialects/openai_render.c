/* openai_render: see openai_render.h. */
#include "server/dialects/openai_render.h"

#include <string.h>

#include "common/gp_json.h"
#include "server/dialects/poolmeta.h"

/* The open field of the text chunk template on the jansson path (an id
 * or model that is not UTF-8; the hand path needs no marker): never in a
 * real chunk, and if a model name holds it the template is refused and
 * chunks are built. */
#define TEXT_MARKER "@@gpupool-text@@"

static json_t *base_object(bool chat, bool chunk, const char *id, long long created,
                           const char *model)
{
    const char *object = chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                              : "text_completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", id, "object", object, "created",
                     (json_int_t)created, "model", model, "system_fingerprint", "gpupool");
}

/* The objects below are whole or NULL: a chunk or body with its text, a
 * tool call or its usage left out would tell the client another reply
 * than the model's (json_*_set_new take NULL as a failure too). */

json_t *gps_openai_chunk(bool chat, const char *id, long long created, const char *model,
                         const char *text, bool with_role, const char *finish_reason,
                         bool usage_null)
{
    json_t *o = base_object(chat, true, id, created, model);
    json_t *choice = json_object();
    if (!o || !choice || json_object_set_new(choice, "index", json_integer(0)) < 0)
        goto fail;
    if (chat) {
        json_t *delta = json_object();
        if (json_object_set_new(choice, "delta", delta) < 0 ||
            (with_role && json_object_set_new(delta, "role", json_string("assistant")) < 0) ||
            ((text || with_role) &&
             json_object_set_new(delta, "content", json_string(text ? text : "")) < 0))
            goto fail;
    } else if (json_object_set_new(choice, "text", json_string(text ? text : "")) < 0) {
        goto fail;
    }
    if (json_object_set_new(choice, "logprobs", json_null()) < 0 ||
        json_object_set_new(choice, "finish_reason",
                            finish_reason ? json_string(finish_reason) : json_null()) < 0)
        goto fail;
    json_t *choices = json_pack("[o]", choice);
    choice = NULL; /* the pack took it, whether it made the array or not */
    if (json_object_set_new(o, "choices", choices) < 0 ||
        (usage_null && json_object_set_new(o, "usage", json_null()) < 0))
        goto fail;
    return o;
fail:
    json_decref(choice);
    json_decref(o);
    return NULL;
}

static json_t *usage_object(long long p, long long c)
{
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)(p + c));
}

json_t *gps_openai_usage_chunk(bool chat, const char *id, long long created, const char *model,
                               long long prompt_tokens, long long completion_tokens)
{
    json_t *o = base_object(chat, true, id, created, model);
    if (o && (json_object_set_new(o, "choices", json_array()) < 0 ||
              json_object_set_new(o, "usage", usage_object(prompt_tokens, completion_tokens)) <
                  0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *gps_openai_response(bool chat, const char *id, long long created, const char *model,
                            const char *text, const char *finish_reason,
                            long long prompt_tokens, long long completion_tokens, json_t *meta)
{
    json_t *o = base_object(chat, false, id, created, model);
    json_t *choice = json_object();
    if (!o || !choice || json_object_set_new(choice, "index", json_integer(0)) < 0)
        goto fail;
    if (chat ? json_object_set_new(choice, "message",
                                   json_pack("{s:s,s:s,s:n}", "role", "assistant", "content",
                                             text ? text : "", "refusal")) < 0
             : json_object_set_new(choice, "text", json_string(text ? text : "")) < 0)
        goto fail;
    if (json_object_set_new(choice, "logprobs", json_null()) < 0 ||
        json_object_set_new(choice, "finish_reason",
                            json_string(finish_reason && *finish_reason ? finish_reason
                                                                        : "stop")) < 0)
        goto fail;
    json_t *choices = json_pack("[o]", choice);
    choice = NULL; /* the pack took it, whether it made the array or not */
    if (json_object_set_new(o, "choices", choices) < 0 ||
        json_object_set_new(o, "usage", usage_object(prompt_tokens, completion_tokens)) < 0)
        goto fail;
    return gps_pool_meta_attach(o, meta);
fail:
    json_decref(meta);
    json_decref(choice);
    json_decref(o);
    return NULL;
}

json_t *gps_tool_calls_openai(const gps_tool_calls *acc)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < acc->n; i++) {
        const gps_tool_call *c = &acc->v[i];
        json_t *args = json_stringn(c->args.data ? c->args.data : "", c->args.len);
        if (!args && !gp_utf8_valid(c->args.data ? c->args.data : "", c->args.len))
            args = json_string(""); /* arguments that are not UTF-8: shown empty */
        json_t *tc = args ? json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", c->id, "type", "function",
                                      "function", "name", c->name, "arguments", args)
                          : NULL;
        if (json_array_append_new(a, tc) < 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

/* Whether the frames can be written by hand: json_string refuses a string
 * that is not UTF-8, and then the jansson path below emits nothing, which
 * the hand path must not undo. */
static void check_plain(gps_oa_out *o)
{
    o->plain = gp_utf8_valid(o->id, strlen(o->id)) && gp_utf8_valid(o->model, strlen(o->model));
}

void gps_oa_out_init(gps_oa_out *o, bool chat, bool include_usage, const char *id,
                     long long created, const char *model)
{
    memset(o, 0, sizeof *o);
    o->chat = chat;
    o->include_usage = include_usage;
    gp_copy_str(o->id, sizeof o->id, id);
    o->created = created;
    gps_oa_out_set_model(o, model);
}

void gps_oa_out_set_model(gps_oa_out *o, const char *model)
{
    gp_copy_str(o->model, sizeof o->model, model);
    check_plain(o);
}

void gps_oa_out_clear(gps_oa_out *o)
{
    gps_sse_tpl_free(&o->text_tpl);
    o->tpl_tried = false;
}

/* The hand path: the bytes json_dumps wrote for the objects above, with
 * their keys in the same order, without building them (jansson's pack,
 * dump and free were ~14,000 instructions a chunk, and the text template
 * as many again: issue 24). Each returns 0 or -1 (ENOMEM). */

static int put(gp_buf *b, const char *lit)
{
    return gp_buf_append(b, lit, strlen(lit));
}

/* "data: " and a chunk's members before "choices" (base_object's). */
static int put_head(const gps_oa_out *o, gp_buf *b)
{
    const char *object = o->chat ? "chat.completion.chunk" : "text_completion";
    if (put(b, "data: {\"id\":") < 0 || gp_json_str_append(b, o->id) < 0 ||
        put(b, ",\"object\":\"") < 0 || put(b, object) < 0 || put(b, "\",\"created\":") < 0 ||
        gp_buf_append_int(b, o->created) < 0 || put(b, ",\"model\":") < 0 || gp_json_str_append(b, o->model) < 0)
        return -1;
    return put(b, ",\"system_fingerprint\":\"gpupool\",\"choices\":");
}

/* The members after the choice's text: logprobs, finish_reason (NULL:
 * null) and, with include_usage, the chunk's "usage": null. */
static int put_choice_tail(const gps_oa_out *o, gp_buf *b, const char *fr)
{
    if (put(b, ",\"logprobs\":null,\"finish_reason\":") < 0 ||
        (fr ? gp_json_str_append(b, fr) : put(b, "null")) < 0 || put(b, "}]") < 0)
        return -1;
    return o->include_usage ? put(b, ",\"usage\":null") : 0;
}

/* The text template's two halves (sse.h's gps_sse_tpl). */
static int plain_tpl(const gps_oa_out *o, gps_sse_tpl *t)
{
    gp_buf pre, post;
    gp_buf_init(&pre);
    gp_buf_init(&post);
    if (put_head(o, &pre) < 0 ||
        put(&pre, o->chat ? "[{\"index\":0,\"delta\":{\"content\":\"" : "[{\"index\":0,\"text\":\"") < 0 ||
        put(&post, o->chat ? "\"}" : "\"") < 0 || put_choice_tail(o, &post, NULL) < 0 ||
        put(&post, "}\n\n") < 0) {
        gp_buf_free(&pre);
        gp_buf_free(&post);
        return -1;
    }
    t->npre = pre.len;
    t->pre = gp_buf_steal(&pre);
    t->npost = post.len;
    t->post = gp_buf_steal(&post);
    return 0;
}

/* A frame written at the end of sse, or nothing (as gps_sse_format_json
 * leaves out what it could not dump). Returns 0, or -1 (ENOMEM: sse cut
 * back to at). */
static int plain_done(gp_buf *sse, size_t at, int rc)
{
    if (rc == 0 && gp_buf_append(sse, "}\n\n", 3) == 0)
        return 0;
    gp_buf_truncate(sse, at);
    return -1;
}

static void emit(gp_buf *sse, json_t *j)
{
    gps_sse_format_json(sse, NULL, NULL, j);
    json_decref(j);
}

/* A chunk with nothing in its choice but what the caller adds. */
static json_t *chunk(const gps_oa_out *o, const char *text, bool with_role, const char *fr)
{
    return gps_openai_chunk(o->chat, o->id, o->created, o->model, text, with_role, fr,
                            o->include_usage);
}

/* An id or model that is not UTF-8 (!o->plain) makes every chunk
 * object fail (json_pack refuses the string): such a stream's frames were
 * never written, and that is not out of memory. On the plain path a
 * chunk that cannot be built is. */

int gps_oa_open(gps_oa_out *o, gp_buf *sse)
{
    if (!o->chat || !o->plain)
        return 0; /* (not plain: the jansson chunk is refused, as before) */
    size_t at = sse->len;
    int rc = put_head(o, sse) < 0 ||
                     put(sse, "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}") < 0
                 ? -1
                 : put_choice_tail(o, sse, NULL);
    return plain_done(sse, at, rc);
}

/* gps_oa_text without the template (plain_tpl ran out of memory): the
 * chunk built and dumped. Text that is not UTF-8 goes as "" (json_stringn
 * refuses it), as before; anything else that fails is ENOMEM. */
static int text_slow(gps_oa_out *o, gp_buf *sse, const char *t, size_t n)
{
    if (!o->plain)
        return 0; /* the chunk is refused (id or model not UTF-8), as before */
    json_t *c = chunk(o, "", false, NULL);
    json_t *choice = json_array_get(json_object_get(c, "choices"), 0);
    json_t *where = o->chat ? json_object_get(choice, "delta") : choice;
    if (!where) {
        json_decref(c);
        return -1;
    }
    json_t *tx = json_stringn(t, n);
    if (!tx && gp_utf8_valid(t, n)) {
        json_decref(c);
        return -1;
    }
    if (tx && json_object_set_new(where, o->chat ? "content" : "text", tx) < 0) {
        json_decref(c);
        return -1;
    }
    int rc = gps_sse_format_json(sse, NULL, NULL, c);
    json_decref(c);
    return rc;
}

int gps_oa_text(gps_oa_out *o, gp_buf *sse, const char *t, size_t n)
{
    if (!o->tpl_tried) {
        /* Every text chunk of this stream is the same but for its text. */
        o->tpl_tried = true;
        if (o->plain) {
            if (plain_tpl(o, &o->text_tpl) < 0)
                o->text_tpl.pre = NULL;
            goto tried;
        }
        json_t *c = chunk(o, TEXT_MARKER, false, NULL);
        if (!c || gps_sse_tpl_init(&o->text_tpl, NULL, c, TEXT_MARKER) < 0)
            o->text_tpl.pre = NULL; /* (a model named like the marker) the slow path */
        json_decref(c);
    }
tried:
    if (o->text_tpl.pre)
        return gps_sse_tpl_emit(sse, &o->text_tpl, t, n); /* (cut back when it fails) */
    return text_slow(o, sse, t, n);
}

/* Whether a tool call chunk that could not be built was refused for a
 * string that is not UTF-8 (a frame json_pack never made, as before: 0)
 * or ran out of memory (-1). Only on the failure path. */
static int call_refused(const gps_oa_out *o, const gps_tool_calls *calls, int i, bool started,
                        const char *args)
{
    const char *a = args ? args : "";
    if (!o->plain || !gp_utf8_valid(a, strlen(a)) ||
        (started && (!gp_utf8_valid(calls->v[i].id, strlen(calls->v[i].id)) ||
                     !gp_utf8_valid(calls->v[i].name, strlen(calls->v[i].name)))))
        return 0;
    return -1;
}

int gps_oa_call(gps_oa_out *o, gp_buf *sse, const gps_tool_calls *calls, int i, bool started,
                const char *args)
{
    json_t *fn = json_pack("{s:s}", "arguments", args ? args : "");
    json_t *tc = json_pack("{s:i}", "index", i);
    json_t *c = NULL;
    if (!fn || !tc)
        goto fail;
    if (started && (json_object_set_new(tc, "id", json_string(calls->v[i].id)) < 0 ||
                    json_object_set_new(tc, "type", json_string("function")) < 0 ||
                    json_object_set_new(fn, "name", json_string(calls->v[i].name)) < 0))
        goto fail;
    json_t *f = fn;
    fn = NULL; /* set_new takes it, set or not */
    if (json_object_set_new(tc, "function", f) < 0)
        goto fail;
    c = gps_openai_chunk(true, o->id, o->created, o->model, NULL, false, NULL, o->include_usage);
    json_t *delta = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "delta");
    if (!delta)
        goto fail;
    json_t *arr = json_pack("[o]", tc);
    tc = NULL; /* the pack took it, whether it made the array or not */
    if (json_object_set_new(delta, "tool_calls", arr) < 0)
        goto fail;
    int rc = gps_sse_format_json(sse, NULL, NULL, c);
    json_decref(c);
    return rc;
fail:
    json_decref(fn);
    json_decref(tc);
    json_decref(c);
    return call_refused(o, calls, i, started, args);
}

/* gps_oa_close's frames by hand (o->plain, finish_reason UTF-8); meta: the
 * x_pool_meta object's text (NULL: none). 0, or -1 (ENOMEM: sse as it was). */
static int plain_close(gps_oa_out *o, gp_buf *sse, const char *fr, long long pt, long long ct,
                       const char *meta, size_t meta_len)
{
    size_t at0 = sse->len, at = at0;
    int rc = put_head(o, sse) < 0 ||
                     put(sse, o->chat ? "[{\"index\":0,\"delta\":{}" : "[{\"index\":0,\"text\":\"\"") < 0 ||
                     put_choice_tail(o, sse, fr) < 0 ||
                     (meta && (put(sse, ",\"x_pool_meta\":") < 0 ||
                               gp_buf_append(sse, meta, meta_len) < 0))
                 ? -1
                 : 0;
    if (plain_done(sse, at, rc) < 0)
        return -1;
    if (o->include_usage) {
        at = sse->len;
        rc = put_head(o, sse) < 0 || put(sse, "[],\"usage\":{\"prompt_tokens\":") < 0 ||
                     gp_buf_append_int(sse, pt) < 0 || put(sse, ",\"completion_tokens\":") < 0 ||
                     gp_buf_append_int(sse, ct) < 0 || put(sse, ",\"total_tokens\":") < 0 ||
                     gp_buf_append_int(sse, pt + ct) < 0 || put(sse, "}") < 0
                 ? -1
                 : 0;
        if (plain_done(sse, at, rc) < 0)
            return plain_done(sse, at0, -1);
    }
    if (gps_sse_format(sse, NULL, NULL, "[DONE]") < 0)
        return plain_done(sse, at0, -1);
    return 0;
}

static bool close_plain(const gps_oa_out *o, const char *finish_reason)
{
    return o->plain && (!finish_reason || gp_utf8_valid(finish_reason, strlen(finish_reason)));
}

int gps_oa_close(gps_oa_out *o, gp_buf *sse, const char *finish_reason, long long prompt_tokens,
                 long long completion_tokens, json_t *meta)
{
    /* The headers left with the first token: the last chunk tells which
     * agent finished and how many were tried (failover). */
    if (close_plain(o, finish_reason)) {
        gp_buf m;
        gp_buf_init(&m);
        int rc = meta && gp_json_dump_append(&m, meta) < 0
                     ? -1 /* (never a last chunk without its x_pool_meta) */
                     : plain_close(o, sse, finish_reason, prompt_tokens, completion_tokens,
                                   meta ? (m.data ? m.data : "") : NULL, m.len);
        gp_buf_free(&m);
        json_decref(meta);
        return rc;
    }
    /* The trees: an id, model or finish_reason that is not UTF-8 makes
     * json_pack refuse a chunk, which is left out as before; the usage
     * chunk and [DONE] of a plain stream are ENOMEM when they fail. */
    size_t at = sse->len;
    json_t *last = chunk(o, o->chat ? NULL : "", false, finish_reason);
    if (last)
        json_object_set_new(last, "x_pool_meta", meta);
    else
        json_decref(meta);
    emit(sse, last);
    if (o->include_usage) {
        json_t *u = gps_openai_usage_chunk(o->chat, o->id, o->created, o->model, prompt_tokens,
                                           completion_tokens);
        if (gps_sse_format_json(sse, NULL, NULL, u) < 0 && o->plain) {
            json_decref(u);
            return plain_done(sse, at, -1);
        }
        json_decref(u);
    }
    if (gps_sse_format(sse, NULL, NULL, "[DONE]") < 0)
        return plain_done(sse, at, -1);
    return 0;
}

int gps_oa_close_text(gps_oa_out *o, gp_buf *sse, const char *finish_reason,
                      long long prompt_tokens, long long completion_tokens, const char *meta,
                      size_t meta_len)
{
    if (close_plain(o, finish_reason))
        return plain_close(o, sse, finish_reason, prompt_tokens, completion_tokens, meta,
                           meta_len);
    /* id, model or finish_reason not UTF-8 (the frames go through
     * jansson): the tree. The meta is ours (valid JSON): not loaded is
     * out of memory, and the checked load never hands back a tree that
     * differs from it (jansson alone can drop a byte of a long string). */
    json_t *m = meta ? gp_json_load_checked(meta, meta_len, 0, NULL) : NULL;
    if (meta && !m)
        return -1;
    return gps_oa_close(o, sse, finish_reason, prompt_tokens, completion_tokens, m);
}

json_t *gps_oa_body(const gps_oa_out *o, const gps_tool_calls *calls, const char *text,
                    size_t text_len, const char *finish_reason, long long prompt_tokens,
                    long long completion_tokens, json_t *meta)
{
    json_t *body = gps_openai_response(o->chat, o->id, o->created, o->model, text ? text : "",
                                       finish_reason, prompt_tokens, completion_tokens, meta);
    if (body && o->chat && calls && calls->n > 0) {
        json_t *m = json_object_get(json_array_get(json_object_get(body, "choices"), 0),
                                    "message");
        /* OpenAI: content null when only tools were called */
        if (json_object_set_new(m, "tool_calls", gps_tool_calls_openai(calls)) < 0 ||
            (!text_len && json_object_set_new(m, "content", json_null()) < 0)) {
            json_decref(body);
            return NULL;
        }
    }
    return body;
}

const char *gps_oa_finish_reason(const char *job_reason, size_t n_calls)
{
    const char *fr = job_reason && job_reason[0] ? job_reason : "stop";
    if (n_calls > 0 && strcmp(fr, "length") != 0)
        fr = "tool_calls";
    return fr;
}

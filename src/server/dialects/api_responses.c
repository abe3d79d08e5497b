/* api_responses: POST /v1/responses (see api_responses.h). */
#include "server/dialects/api_responses.h"

#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/relay.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/resp_state.h"
#include "server/dialects/responses.h"
#include "server/dialects/toolcalls.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/metrics.h"

/* One client request: subscriber of its job (freed by the relay). */
typedef struct rs_stream {
    gps_relay rl;
    gps_relay_ctx *ctx;
    bool stream;
    json_t *echo;              /* request fields the response repeats (owned) */
    json_t *warnings;          /* the request's own warnings (owned), or NULL */
    gps_resp_out out;          /* the response built so far */
    gps_tool_calls calls;
    bool tools_ignored;
    /* store: what the saved response needs, and its owner's key. */
    gps_resp_state *state;     /* NULL: store false */
    json_t *messages;          /* the conversation sent (owned), or NULL */
    size_t n_instr;
    char key_id[65];
} rs_stream;

/* The routes' argument. */
typedef struct gps_responses {
    gps_relay_ctx *c;
    gps_resp_state *state;
} rs_api;

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);
static bool render_text(void *arg, gps_job *job, const char *text, size_t n);
static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev);

static void stream_free(void *arg)
{
    rs_stream *st = arg;
    gps_relay_clear(&st->rl);
    gps_tool_calls_free(&st->calls);
    gps_resp_out_clear(&st->out);
    json_decref(st->echo);
    json_decref(st->warnings);
    json_decref(st->messages);
    free(st);
}

static const gps_relay_ops OPS = {
    .api = "responses", /* metrics label: its own, not OpenAI's completions and chat */
    .dialect = GPS_DIALECT_OPENAI,
    .error_event = "error",
    .on_event = on_job_event,
    .free = stream_free,
    .render_text = render_text,
    .render_event = render_event,
};

#define TOOLS_IGNORED                                                                      \
    "tools were ignored: no live agent serving this model reports supports_tools"

/* x_pool_meta with the request's warnings (new reference). NULL: none
 * (gps_pool_meta_shown) or out of memory, which *oom tells: a meta with a
 * warning left out would hide a tool the request's tools lost. */
static json_t *meta_of(rs_stream *st, gps_job *job, bool *oom)
{
    json_t *meta = gps_pool_meta(job);
    *oom = !meta && gps_pool_meta_shown(job);
    json_t *list = json_object_get(meta, "warnings");
    size_t i;
    json_t *w;
    json_array_foreach(st->warnings, i, w)
    {
        if (meta && json_array_append(list, w) < 0)
            goto oom;
    }
    if (meta && st->tools_ignored &&
        json_array_append_new(list, json_string(TOOLS_IGNORED)) < 0)
        goto oom;
    return meta;
oom:
    json_decref(meta);
    *oom = true;
    return NULL;
}

/* meta_of's object as text in buf (gps_pool_meta_append: no tree; issue
 * 24): 0 with *mt the text, or NULL for none (as meta_of's NULL); -1 out
 * of memory. The request's warnings are distinct (each names its tool),
 * so listing each once is what meta_of's append does. */
static int meta_text(rs_stream *st, gps_job *job, gp_buf *buf, const char **mt)
{
    enum { MAXW = 16 };
    const char *extra[MAXW + 1];
    size_t n = 0, i;
    json_t *w;
    json_array_foreach(st->warnings, i, w)
    {
        if (n < MAXW && json_string_value(w))
            extra[n++] = json_string_value(w);
    }
    if (st->tools_ignored)
        extra[n++] = TOOLS_IGNORED;
    int rc = json_array_size(st->warnings) <= MAXW ? gps_pool_meta_append(buf, job, extra, n) : -1;
    if (rc < 0) { /* ENOMEM, or more warnings than listed here: the tree's dump */
        bool oom;
        json_t *meta = meta_of(st, job, &oom);
        gp_buf_truncate(buf, 0);
        rc = meta ? gp_json_dump_append(buf, meta) : oom ? -1 : 1;
        json_decref(meta);
        if (rc < 0)
            return -1;
    }
    *mt = rc == 0 ? (buf->data ? buf->data : "") : NULL;
    return 0;
}

/* store: keep the finished response for later references; obj: its
 * final object as text (gps_resp_render's; empty: none). */
static void save(rs_stream *st, const gp_buf *obj)
{
    if (!st->state)
        return;
    gp_buf ctx, items;
    gp_buf_init(&ctx);
    gp_buf_init(&items);
    if (gps_resp_context_text(&st->out, &st->calls, st->messages, st->n_instr, &ctx, &items) ==
        0)
        gps_resp_state_save(st->state, st->key_id, st->out.id, obj, &ctx, &items);
    gp_buf_free(&ctx);
    gp_buf_free(&items);
}

/* 0, or -1: the first events found no memory (the caller fails the
 * reply: gps_relay_fail_oom). */
static int ensure_started(rs_stream *st, gps_job *job)
{
    if (st->rl.s.started)
        return 0;
    gps_relay_start(&st->rl);
    return gps_resp_open(&st->out, &st->rl.s.out);
}

/* One event, rendered now. Returns true when the reply is complete. */
static bool handle_event(rs_stream *st, gps_job *job, gps_event_type type, json_t *ev)
{
    if (type == GPS_EV_TOOL_CALL) {
        bool started = false;
        int i = gps_tool_calls_add(&st->calls, ev, &started);
        if (i == GPS_TOOL_CALLS_OOM)
            return gps_relay_fail_oom(&st->rl);
        if (i < 0 || !st->stream)
            return false;
        if (ensure_started(st, job) < 0 ||
            gps_resp_call(&st->out, &st->rl.s.out, &st->calls, i, started,
                          json_string_value(json_object_get(ev, "arguments"))) < 0)
            return gps_relay_fail_oom(&st->rl);
        gps_relay_send_output(&st->rl);
        return false;
    }
    if (type == GPS_EV_END) {
        const char *fr = gps_job_finish_reason(job)[0] ? gps_job_finish_reason(job) : "stop";
        long long pt = gps_job_prompt_tokens(job), ct = gps_job_completion_tokens(job);
        /* The response is written as text once (issue 24): the store keeps
         * it, the client gets it with x_pool_meta added last. */
        gp_buf meta, fin;
        gp_buf_init(&meta);
        gp_buf_init(&fin);
        const char *mt = NULL;
        /* Out of memory: 500 (a stream: its error event), not a response
         * without its x_pool_meta or an empty body. */
        if (meta_text(st, job, &meta, &mt) < 0 || (st->stream && ensure_started(st, job) < 0)) {
            gps_relay_fail_oom(&st->rl);
        } else if (st->stream) {
            if (gps_resp_close_meta_text(&st->out, &st->rl.s.out, &st->calls, fr, pt, ct, mt,
                                         meta.len, st->state ? &fin : NULL) < 0) {
                gps_relay_fail_oom(&st->rl); /* the error event in place of the end */
            } else {
                save(st, &fin);
                gps_relay_end_stream(&st->rl);
            }
        } else {
            bool ok = gps_resp_whole(&st->out, &st->calls, gps_job_text(job),
                                     gps_job_text_len(job)) == 0 &&
                      gps_resp_render(&fin, &st->out, &st->calls, fr, pt, ct) == 0;
            if (ok)
                save(st, &fin);
            if (ok && gps_resp_render_meta_text(&fin, 0, mt, meta.len) == 0)
                gps_relay_end_body_text(&st->rl, fin.data, fin.len, true);
            else
                gps_relay_fail_oom(&st->rl);
        }
        gp_buf_free(&fin);
        gp_buf_free(&meta);
        return true;
    }
    if (type == GPS_EV_ERROR) {
        gps_relay_fail(&st->rl, ev, NULL);
        return true;
    }
    return false;
}

static bool render_text(void *arg, gps_job *job, const char *text, size_t n)
{
    rs_stream *st = arg;
    if (ensure_started(st, job) < 0 || gps_resp_text(&st->out, &st->rl.s.out, text, n) < 0)
        return gps_relay_fail_oom(&st->rl);
    gps_relay_send_output(&st->rl);
    return false;
}

static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev)
{
    return handle_event(arg, job, type, ev);
}

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    rs_stream *st = arg;
    if (!st->stream) {
        if (type != GPS_EV_TOKEN)
            handle_event(st, job, type, ev);
        return;
    }
    gps_relay_stream_event(&st->rl, job, type, ev);
}

/* Submit rq's job and relay it to r's client (rq's spec is moved). */
static void start(rs_api *api, gps_req *r, gps_resp_req *rq)
{
    gps_relay_ctx *c = api->c;
    rs_stream *st = calloc(1, sizeof *st);
    if (!st) {
        gps_resp_req_clear(rq);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    gps_relay_init(&st->rl, &OPS, st, c->jobs, c->metrics, r);
    st->ctx = c;
    st->stream = rq->stream;
    st->echo = rq->echo;
    st->warnings = rq->warnings;
    rq->echo = rq->warnings = NULL;
    if (rq->store && api->state) {
        st->state = api->state;
        st->messages = json_deep_copy(rq->spec.messages);
        st->n_instr = rq->n_instr;
        snprintf(st->key_id, sizeof st->key_id, "%s", r->key_id);
    }
    if (rq->spec.tools && !gps_model_takes_tools(gps_jobs_registry(c->jobs), rq->spec.model)) {
        /* No agent could take them: answer without tools rather than fail. */
        json_decref(rq->spec.tools);
        json_decref(rq->spec.tool_choice);
        rq->spec.tools = rq->spec.tool_choice = NULL;
        st->tools_ignored = true;
    }
    gps_resp_out_init(&st->out, rq->spec.model, st->echo);
    gps_job *job = gps_relay_submit(&st->rl, &rq->spec, r, c->request_timeout_sec + 30);
    gps_resp_req_clear(rq);
    if (!job) {
        stream_free(st);
        return;
    }
    /* The model that serves (a fallback may have taken the request). */
    snprintf(st->out.model, sizeof st->out.model, "%s", gps_job_model(job));
}

/* A request that refers to stored state, waiting for the store. The
 * gps_req is copied (the dispatcher's lives on its stack); its path is
 * not used after dispatch. */
typedef struct rs_wait {
    gps_held held;             /* held.req: NULL once the client left */
    gps_req req;
    gps_resp_req rq;
    rs_api *api;
} rs_wait;

static void resolved(void *arg, int status, json_t *prev_context, json_t *items)
{
    rs_wait *w = arg;
    gps_req *r = &w->req;
    char msg[512];
    const char *param = NULL;
    if (!w->held.req) {
        gps_relay_count_req(&OPS, w->api->c->metrics, r, "cancelled");
        goto done;
    }
    gps_held_release(&w->held);
    if (status != 0) {
        if (status > 0)
            snprintf(msg, sizeof msg, "Previous response with id '%.64s' not found.",
                     w->rq.prev_id);
        else
            snprintf(msg, sizeof msg, "%s",
                     status == -2 ? "out of memory" : "stored responses could not be read");
        gps_relay_refuse(&OPS, w->api->c->metrics, r, status > 0 ? 400 : 500,
                         status > 0 ? "previous_response_not_found" : "INTERNAL", msg,
                         status > 0 ? "previous_response_id" : NULL);
        goto done;
    }
    int rc = gps_resp_splice(&w->rq, prev_context, items, msg, sizeof msg, &param);
    if (rc < 0) {
        const char *code;
        int st = gps_parse_refusal(rc, &code); /* out of memory: 500, not the client's */
        gps_relay_refuse(&OPS, w->api->c->metrics, r, st, code, msg, st == 500 ? NULL : param);
        goto done;
    }
    start(w->api, r, &w->rq);
done:
    gps_resp_req_clear(&w->rq);
    free(w);
}

static void wait_for_state(rs_api *api, gps_req *r, gps_resp_req *rq)
{
    rs_wait *w = api->state ? calloc(1, sizeof *w) : NULL;
    if (!w) {
        gps_resp_req_clear(rq);
        gps_relay_refuse(&OPS, api->c->metrics, r, api->state ? 500 : 400,
                         api->state ? "INTERNAL" : "INVALID_REQUEST",
                         api->state ? "out of memory" : "this server keeps no responses",
                         api->state ? NULL : "previous_response_id");
        return;
    }
    w->req = *r;
    w->req.path = NULL;
    w->rq = *rq;
    w->api = api;
    memset(rq, 0, sizeof *rq);
    gps_held_start(&w->held, r->req, true, 0, NULL, NULL);
    if (gps_resp_state_fetch(api->state, r->key_id, &w->rq, resolved, w) < 0) {
        gps_held_release(&w->held);
        gps_relay_refuse(&OPS, api->c->metrics, r, 503, "SERVER_BUSY",
                         "stored responses cannot be reached now", NULL);
        gps_resp_req_clear(&w->rq);
        free(w);
    }
}

static void h_responses(gps_req *r, void *arg)
{
    rs_api *api = arg;
    json_t *body = gps_req_job_json(r);
    if (!body) {
        gps_relay_count_req(&OPS, api->c->metrics, r, "invalid_request");
        return;
    }
    gps_resp_req rq;
    char msg[512];
    const char *param = NULL;
    int rc = gps_resp_parse(body, &rq, msg, sizeof msg, &param);
    json_decref(body);
    if (rc < 0) {
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_relay_refuse(&OPS, api->c->metrics, r, status, code, msg, param);
        return;
    }
    if (rq.prev_id || rq.refs)
        wait_for_state(api, r, &rq);
    else
        start(api, r, &rq);
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v1/responses", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_responses, NULL},
};

gps_responses *gps_responses_new(gps_relay_ctx *c, gps_resp_state *st)
{
    rs_api *api = calloc(1, sizeof *api);
    if (!api)
        return NULL;
    api->c = c;
    api->state = st;
    return api;
}

void gps_responses_free(gps_responses *api)
{
    free(api);
}

int gps_responses_register(gps_http *h, gps_responses *api)
{
    if (gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], api) < 0)
        return -1;
    return api->state ? gps_resp_state_register(h, api->state) : 0;
}

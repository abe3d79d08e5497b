/* api_responses: POST /v1/responses (see api_responses.h). */
#include "server/dialects/api_responses.h"

#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/relay.h"
#include "server/dialects/reqcheck.h"
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
} rs_stream;

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);
static void on_writable(void *arg);
static void render_text(void *arg, gps_job *job, const char *text, size_t n);
static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev);

static long long behind(void *arg)
{
    return gps_relay_behind(&((rs_stream *)arg)->rl);
}

static void stream_free(void *arg)
{
    rs_stream *st = arg;
    gps_relay_clear(&st->rl);
    gps_tool_calls_free(&st->calls);
    gps_resp_out_clear(&st->out);
    json_decref(st->echo);
    json_decref(st->warnings);
    free(st);
}

static const gps_relay_ops OPS = {
    .api = "responses", /* metrics label: its own, not OpenAI's completions and chat */
    .dialect = GPS_DIALECT_OPENAI,
    .error_event = "error",
    .on_event = on_job_event,
    .writable = on_writable,
    .behind = behind,
    .free = stream_free,
    .render_text = render_text,
    .render_event = render_event,
};

static json_t *meta_of(rs_stream *st, gps_job *job)
{
    json_t *meta = gps_pool_meta(job);
    size_t i;
    json_t *w;
    json_array_foreach(st->warnings, i, w)
        json_array_append(json_object_get(meta, "warnings"), w);
    if (meta && st->tools_ignored)
        json_array_append_new(json_object_get(meta, "warnings"),
                              json_string("tools were ignored: no live agent serving this model "
                                          "reports supports_tools"));
    return meta;
}

static void ensure_started(rs_stream *st, gps_job *job)
{
    if (st->rl.started)
        return;
    gps_relay_start(&st->rl);
    gps_resp_open(&st->out, &st->rl.out);
    gps_metrics_ttft(st->ctx->metrics, OPS.api, job->spec.model,
                     (double)(gp_now_mono_us() - st->rl.start_us) / 1e6);
}

/* One event, rendered now. Returns true when st was freed. */
static bool handle_event(rs_stream *st, gps_job *job, gps_event_type type, json_t *ev)
{
    if (type == GPS_EV_TOOL_CALL) {
        bool started = false;
        int i = gps_tool_calls_add(&st->calls, ev, &started);
        if (i < 0 || !st->stream)
            return false;
        ensure_started(st, job);
        gps_resp_call(&st->out, &st->rl.out, &st->calls, i, started,
                      json_string_value(json_object_get(ev, "arguments")));
        gps_relay_send_output(&st->rl);
        return false;
    }
    if (type == GPS_EV_END) {
        const char *fr = job->finish_reason[0] ? job->finish_reason : "stop";
        if (st->stream) {
            ensure_started(st, job);
            gps_resp_close(&st->out, &st->rl.out, &st->calls, fr, job->prompt_tokens,
                           job->completion_tokens, meta_of(st, job));
            gps_relay_end_stream(&st->rl);
            return true;
        }
        json_t *body = gps_resp_object(&st->out, &st->calls, job->text.data, job->text.len, fr,
                                       job->prompt_tokens, job->completion_tokens,
                                       meta_of(st, job));
        if (job->first_token_us)
            gps_metrics_ttft(st->ctx->metrics, OPS.api, job->spec.model,
                             (double)(job->first_token_us - st->rl.start_us) / 1e6);
        gps_relay_end_body(&st->rl, body, true);
        return true;
    }
    if (type == GPS_EV_ERROR) {
        gps_relay_fail(&st->rl, ev, NULL);
        return true;
    }
    return false;
}

static void render_text(void *arg, gps_job *job, const char *text, size_t n)
{
    rs_stream *st = arg;
    ensure_started(st, job);
    gps_resp_text(&st->out, &st->rl.out, text, n);
    gps_relay_send_output(&st->rl);
}

static bool render_event(void *arg, gps_job *job, gps_event_type type, json_t *ev)
{
    return handle_event(arg, job, type, ev);
}

static void on_writable(void *arg)
{
    gps_relay_catch_up(&((rs_stream *)arg)->rl);
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

static void h_responses(gps_req *r, void *arg)
{
    gps_relay_ctx *c = arg;
    json_t *body = gps_req_job_json(r);
    if (!body) {
        gps_relay_count_req(&OPS, c->metrics, r, "invalid_request");
        return;
    }
    gps_resp_req rq;
    char msg[512];
    const char *param = NULL;
    int rc = gps_resp_parse(body, &rq, msg, sizeof msg, &param);
    json_decref(body);
    if (rc < 0) {
        gps_relay_refuse(&OPS, c->metrics, r, 400, "INVALID_REQUEST", msg, param);
        return;
    }
    rs_stream *st = calloc(1, sizeof *st);
    if (!st) {
        gps_resp_req_clear(&rq);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    gps_relay_init(&st->rl, &OPS, st, c->jobs, c->metrics, r);
    st->ctx = c;
    st->stream = rq.stream;
    st->echo = rq.echo;
    st->warnings = rq.warnings;
    rq.echo = rq.warnings = NULL;
    if (rq.spec.tools && !gps_model_takes_tools(gps_jobs_registry(c->jobs), rq.spec.model)) {
        /* No agent could take them: answer without tools rather than fail. */
        json_decref(rq.spec.tools);
        json_decref(rq.spec.tool_choice);
        rq.spec.tools = rq.spec.tool_choice = NULL;
        st->tools_ignored = true;
    }
    gps_resp_out_init(&st->out, rq.spec.model, st->echo);
    gps_job *job = gps_relay_submit(&st->rl, &rq.spec, r, c->request_timeout_sec + 30);
    if (!job) {
        stream_free(st);
        return;
    }
    /* The model that serves (a fallback may have taken the request). */
    snprintf(st->out.model, sizeof st->out.model, "%s", job->spec.model);
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v1/responses", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_responses, NULL},
};

int gps_responses_register(gps_http *h, gps_relay_ctx *c)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], c);
}

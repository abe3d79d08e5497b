/* relay: the client side of a relayed request, once (see relay.h). */
#include "server/dialects/relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/http.h>

#include "common/gp_log.h"
#include "server/http/errors.h"
#include "server/metrics.h"
#include "server/dialects/poolmeta.h"

static void count(const gps_relay_ops *ops, struct gps_metrics *m, const char *outcome,
                  uint64_t start_us)
{
    gps_metrics_request(m, ops->api, outcome, (double)(gp_now_mono_us() - start_us) / 1e6);
}

gps_relay_ctx *gps_relay_ctx_new(gps_jobs *jobs, struct gps_metrics *m, int request_timeout_sec)
{
    gps_relay_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->jobs = jobs;
    c->metrics = m;
    c->request_timeout_sec = request_timeout_sec;
    return c;
}

void gps_relay_ctx_free(gps_relay_ctx *c)
{
    free(c);
}

void gps_relay_count_req(const gps_relay_ops *ops, struct gps_metrics *m, gps_req *r,
                         const char *outcome)
{
    count(ops, m, outcome, r->start_us);
}

void gps_relay_refuse(const gps_relay_ops *ops, struct gps_metrics *m, gps_req *r, int status,
                      const char *code, const char *message, const char *param)
{
    gps_http_send_error(r->req, ops->dialect, status, code, message, param, r->correlation_id,
                        NULL);
    count(ops, m, code, r->start_us);
}

static void gone(void *arg);

/* The defaults are the cursor's (gps_relay_stream_event). */
static void stream_writable(void *arg)
{
    gps_relay *rl = arg;
    if (rl->ops->writable)
        rl->ops->writable(rl->owner);
    else
        gps_relay_catch_up(rl);
}

static long long stream_behind(void *arg)
{
    gps_relay *rl = arg;
    return rl->ops->behind ? rl->ops->behind(rl->owner) : gps_relay_behind(rl);
}

static const gps_stream_ops STREAM_OPS = {
    .writable = stream_writable,
    .behind = stream_behind,
    .gone = gone,
};

void gps_relay_init(gps_relay *rl, const gps_relay_ops *ops, void *owner, gps_jobs *jobs,
                    struct gps_metrics *m, gps_req *r)
{
    memset(rl, 0, sizeof *rl);
    rl->ops = ops;
    rl->owner = owner;
    rl->jobs = jobs;
    rl->metrics = m;
    gps_stream_init(&rl->s, &STREAM_OPS, rl, r->req, r->correlation_id);
    rl->start_us = r->start_us;
}

void gps_relay_count(gps_relay *rl, const char *outcome)
{
    count(rl->ops, rl->metrics, outcome, rl->start_us);
}

/* The client went away or was dropped as too slow (stream.h): cancel the
 * job; the agent learns it on its next upload. */
static void gone(void *arg)
{
    gps_relay *rl = arg;
    gp_log_write(GP_LOG_INFO, "client_disconnected", rl->s.corr,
                 json_pack("{s:s}", "job_id", rl->job ? gps_job_id(rl->job) : ""),
                 "client went away; cancelling its job");
    gps_relay_count(rl, rl->s.too_slow ? "client_too_slow" : "cancelled");
    if (rl->job) {
        gps_job_unsubscribe(rl->job, NULL, rl);
        gps_jobs_cancel(rl->jobs, rl->job, "client_disconnected");
        rl->job = NULL;
    }
    gps_stream_free_later(&rl->s, rl->ops->free);
}

/* Events reach the dialect only while its client is there. */
static void on_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    gps_relay *rl = arg;
    if (rl->s.req)
        rl->ops->on_event(job, type, ev, rl->owner);
}

gps_job *gps_relay_submit(gps_relay *rl, gps_job_spec *spec, gps_req *r, int timeout_sec)
{
    gps_submit_err e;
    gp_copy_str(spec->pool_via, sizeof spec->pool_via, r->pool_via);
    gps_job *job = gps_jobs_submit(rl->jobs, spec, r->correlation_id, r->key_id, &e);
    gps_job_spec_clear(spec);
    if (!job) {
        gps_send_error_retry(r->req, rl->ops->dialect, e.status, e.code, e.message,
                             e.status == 404 || e.status == 400 ? "model" : NULL, r->correlation_id,
                             e.retry_after_sec);
        gps_relay_count(rl, e.code);
        rl->s.req = NULL;
        return NULL;
    }
    rl->job = job;
    gp_copy_str(rl->s.job_id, sizeof rl->s.job_id, gps_job_id(job));
    rl->text_resets = gps_job_text_resets(job);
    gps_job_subscribe_cursor(job, on_event, rl);
    /* The connection may sit silent while the job is queued or the model
     * thinks: give it the whole request budget, not idle_timeout. */
    gps_stream_hold(&rl->s, timeout_sec);
    return job;
}

void gps_relay_start(gps_relay *rl)
{
    if (rl->s.started)
        return;
    gps_pool_headers(rl->s.req, rl->job);
    gps_stream_start(&rl->s);
}

bool gps_relay_blocked(gps_relay *rl)
{
    return gps_stream_blocked(&rl->s);
}

void gps_relay_send(gps_relay *rl)
{
    gps_stream_send(&rl->s);
}

void gps_relay_send_soon(gps_relay *rl)
{
    gps_stream_send_soon(&rl->s);
}

static void ttft(gps_relay *rl, uint64_t at_us)
{
    if (rl->ttft_done || !rl->job)
        return;
    rl->ttft_done = true;
    gps_metrics_ttft(rl->metrics, rl->ops->api, gps_job_model(rl->job),
                     (double)(at_us - rl->start_us) / 1e6);
}

void gps_relay_send_output(gps_relay *rl)
{
    if (!rl->ttft_done) /* (no clock read per token) */
        ttft(rl, gp_now_mono_us());
    /* Marked now: the client will have it before anything else happens
     * to the job (a failover must not start it over). */
    gps_job_mark_output_sent(rl->job);
    gps_relay_send_soon(rl);
}

/* A started stream's error event. An error body that cannot be built or
 * framed (out of memory: gps_error_body is whole or NULL) gives way to the
 * fixed out-of-memory error (http.h), static text framed into the output
 * once what is in it went out: the buffer keeps its storage, so after any
 * earlier frame this needs no allocation. Failing even that, the stream
 * ends without an error event (never with part of one). */
static void error_event(gps_relay *rl, int status, const char *code, const char *message,
                        int ra)
{
    json_t *body =
        gps_error_body_retry(rl->ops->dialect, status, code, message, NULL, rl->s.corr, ra);
    int rc = body ? gps_sse_format_json(&rl->s.out, rl->ops->error_event, NULL, body) : -1;
    json_decref(body);
    if (rc == 0)
        return;
    gps_stream_send(&rl->s);
    size_t at = rl->s.out.len;
    if (gps_sse_format(&rl->s.out, rl->ops->error_event, NULL, gps_http_oom_body) < 0) {
        gp_buf_truncate(&rl->s.out, at);
        gp_log_write(GP_LOG_ERROR, "stream_out_of_memory", rl->s.corr[0] ? rl->s.corr : NULL,
                     NULL, "a stream's %d %s error event could not be written: ended without it",
                     status, code);
    }
}

/* gps_relay_fail's sending, counting and finishing, with the error's
 * fields already chosen. */
static void fail_as(gps_relay *rl, int status, const char *code, const char *message, int ra)
{
    if (rl->s.started) {
        error_event(rl, status, code, message, ra);
        gps_stream_end(&rl->s);
    } else {
        gps_stream_release(&rl->s);
        gps_send_error_retry(rl->s.req, rl->ops->dialect, status, code, message, NULL,
                             rl->s.corr, ra);
    }
    gps_relay_count(rl, code);
    rl->s.req = NULL;
    gps_relay_finish(rl);
}

void gps_relay_fail(gps_relay *rl, const json_t *ev, const char *message)
{
    const char *code = json_string_value(json_object_get(ev, "code"));
    int status = (int)json_integer_value(json_object_get(ev, "status"));
    int ra = (int)json_integer_value(json_object_get(ev, "retry_after"));
    if (status < 400 || status > 599)
        status = 502;
    if (!code)
        code = "AGENT_ERROR";
    if (!message)
        message = json_string_value(json_object_get(ev, "message"));
    if (!message)
        message = "the job failed";
    fail_as(rl, status, code, message, ra);
}

bool gps_relay_fail_oom(gps_relay *rl)
{
    /* No event to build (that could fail the same): the fields as they are. */
    fail_as(rl, 500, "INTERNAL", "out of memory", 0);
    return true;
}

void gps_relay_end_stream(gps_relay *rl)
{
    gps_stream_end(&rl->s);
    gps_relay_count(rl, "ok");
    gps_relay_finish(rl);
}

/* One worker for both bodies: json (stolen) when set, else text. */
static void end_body(gps_relay *rl, json_t *json, const char *text, size_t n, bool pool_headers)
{
    if (pool_headers && rl->job)
        gps_pool_headers(rl->s.req, rl->job);
    if (rl->job && gps_job_first_token_us(rl->job))
        ttft(rl, gps_job_first_token_us(rl->job));
    gps_stream_release(&rl->s);
    if (text)
        gps_http_send_json_text(rl->s.req, 200, text, n);
    else
        gps_http_send_json(rl->s.req, 200, json);
    gps_relay_count(rl, "ok");
    rl->s.req = NULL;
    gps_relay_finish(rl);
}

void gps_relay_end_body(gps_relay *rl, json_t *body, bool pool_headers)
{
    end_body(rl, body, NULL, 0, pool_headers);
}

void gps_relay_end_body_text(gps_relay *rl, const char *body, size_t n, bool pool_headers)
{
    end_body(rl, NULL, body, n, pool_headers);
}

void gps_relay_finish(gps_relay *rl)
{
    if (rl->job)
        gps_job_unsubscribe(rl->job, NULL, rl);
    rl->job = NULL;
    gps_stream_free_later(&rl->s, rl->ops->free);
}

void gps_relay_clear(gps_relay *rl)
{
    for (size_t i = 0; i < rl->dn; i++)
        json_decref(rl->dv[i].ev);
    free(rl->dv);
    rl->dv = NULL;
    rl->dn = rl->dcap = 0;
    gps_stream_clear(&rl->s);
}

/* Text of a catch-up delta: large enough to drain quickly, small enough
 * that one event stays well under client_buffer_bytes. */
#define CATCHUP_SLICE (16 * 1024)

bool gps_relay_catch_up(gps_relay *rl)
{
    gps_job *job = rl->job;
    void *owner = rl->owner;
    while (rl->s.req) {
        size_t limit = rl->dn ? rl->dv[0].at : gps_job_text_len(job);
        if (rl->sent < limit) {
            if (gps_relay_blocked(rl))
                return false; /* ops->writable resumes */
            const char *at = gps_job_text(job) + rl->sent;
            size_t n = gps_sse_utf8_slice(at, limit - rl->sent, CATCHUP_SLICE);
            rl->sent += n; /* before rendering: it may finish the reply */
            if (rl->ops->render_text(owner, job, at, n))
                return true;
            continue;
        }
        if (!rl->dn)
            return false;
        struct gps_relay_deferred d = rl->dv[0];
        memmove(rl->dv, rl->dv + 1, --rl->dn * sizeof *rl->dv);
        bool freed = rl->ops->render_event(owner, job, d.type, d.ev);
        json_decref(d.ev);
        if (freed)
            return true;
    }
    return false;
}

void gps_relay_stream_event(gps_relay *rl, gps_job *job, gps_event_type type, json_t *ev)
{
    if (type == GPS_EV_TOKEN) {
        /* The token is the tail of job->text (jobs appends, then notifies;
         * ev may be NULL: a cursor subscriber reads the text). A text
         * dropped by a transparent requeue (jobs_failover.c jobs_fail_over,
         * nothing sent yet) starts the cursor over. */
        unsigned resets = gps_job_text_resets(job);
        if (resets != rl->text_resets) {
            rl->text_resets = resets;
            rl->sent = 0;
            for (size_t i = 0; i < rl->dn; i++)
                rl->dv[i].at = 0;
        }
        gps_relay_catch_up(rl);
        return;
    }
    if (type != GPS_EV_END && type != GPS_EV_ERROR && type != GPS_EV_TOOL_CALL)
        return;
    if (rl->dn == 0 && rl->sent >= gps_job_text_len(job)) {
        rl->ops->render_event(rl->owner, job, type, ev);
        return;
    }
    /* Text is still behind: this event follows it. */
    if (rl->dn == rl->dcap) {
        size_t cap = rl->dcap ? rl->dcap * 2 : 8;
        struct gps_relay_deferred *nv = realloc(rl->dv, cap * sizeof *nv);
        if (!nv) {
            /* An end, error or tool call that cannot wait its turn: the
             * reply fails (500, a stream's error event) rather than run
             * on without it. */
            gps_relay_fail_oom(rl);
            return;
        }
        rl->dv = nv;
        rl->dcap = cap;
    }
    rl->dv[rl->dn++] = (struct gps_relay_deferred){type, json_incref(ev),
                                                    gps_job_text_len(job)};
}

long long gps_relay_behind(const gps_relay *rl)
{
    return rl->job ? (long long)(gps_job_text_len(rl->job) - rl->sent) : 0;
}

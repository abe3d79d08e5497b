/*
 * agents_api_events.c: the agents' event uploads: POST
 * /agents/jobs/{id}/events (one job) and /agents/events (a batch, read on a
 * fast path without a tree when it has the agents' own shape).
 */
#include "server/agents_api_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/http/held.h"
#include "server/http/sse.h" /* gps_json_escape_append */
#include "server/metrics.h"
#include "server/upload_read.h"
#include "server/auth/auth.h"
#include "server/store/store.h"

/* Apply one job's events (already checked by gps_agent_events_check) and
 * say how it went, as the single-job route answers and as one entry of a
 * batch: *status 200 with cancel, or an error code, message and details. */
typedef struct apply_result {
    int status;
    const char *code;            /* NULL when 200 */
    char msg[256];
    bool cancel;
    long long expected_seq;      /* SEQ_GAP: >= 0 */
} apply_result;

static void apply_result_set(int rc, apply_result *out)
{
    switch (rc) {
    case 0:
        out->status = 200;
        break;
    case 404:
        out->status = 404;
        out->code = "JOB_NOT_FOUND";
        break;
    case 409:
        out->status = 409;
        out->code = out->expected_seq >= 0 ? "SEQ_GAP" : "NOT_ASSIGNED";
        break;
    case 500: /* out of memory: the agent sends the events again (jobs.h) */
        out->status = 500;
        out->code = "INTERNAL";
        break;
    default:
        out->status = 400;
        out->code = "INVALID_REQUEST";
        break;
    }
}

static void apply_job_events(gps_agents *g, const char *job_id, const char *agent_id,
                             const json_t *seq, const json_t *events, apply_result *out)
{
    memset(out, 0, sizeof *out);
    out->expected_seq = -1;
    int rc = gps_jobs_apply_checked_events(g->jobs, job_id, agent_id, json_integer_value(seq),
                                           (json_t *)events, &out->cancel, &out->expected_seq,
                                           out->msg, sizeof out->msg);
    apply_result_set(rc, out);
}

/* gpupool_agent_uploads_total{route} and the job entries they carried.
 * label: route="job" or route="batch", as gps_metrics_label writes it
 * (written out: a label built per upload was a tenth of a batch's own
 * cost). */
#define ROUTE_JOB "route=\"job\""
#define ROUTE_BATCH "route=\"batch\""
static void count_upload(gps_agents *g, const char *label, size_t entries)
{
    gps_metrics *m = gps_jobs_metrics(g->jobs);
    if (!m)
        return;
    gps_metrics_add(m, "agent_uploads_total", label, 1);
    gps_metrics_add(m, "agent_upload_entries_total", label, (double)entries);
}

/* A new instance is noticed on any request (its first may be an upload of
 * a job the old process had: refused when applied, as reassigned). */
static bool events_liveness(gps_agents *g, gps_req *r, json_t *body, const char *id)
{
    liveness lv;
    if (!agents_liveness_parse(g, r, body, &lv))
        return false;
    registry_agent *ra = registry_get(g->reg, id);
    if (ra && lv.instance) {
        lv.running = NULL;
        agents_liveness_apply(g, ra, &lv);
    }
    return true;
}

void agents_h_events(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    /* Every field and number first (agent_check.h): a bad value refuses
     * the whole upload, so none of its events is applied. */
    char field[96], emsg[256];
    if (gps_agent_events_check(body, field, sizeof field, emsg, sizeof emsg) < 0) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_EVENT", emsg, field);
        return;
    }
    const char *id = json_string_value(json_object_get(body, "agent_id"));
    if (!agents_key_allows(g, r, id) || !events_liveness(g, r, body, id)) {
        json_decref(body);
        return;
    }
    apply_result res;
    apply_job_events(g, r->params[0], id, json_object_get(body, "seq"),
                     json_object_get(body, "events"), &res);
    json_decref(body);
    count_upload(g, ROUTE_JOB, 1);
    if (res.status == 200)
        gps_http_send_json_text(r->req, 200,
                                res.cancel ? "{\"cancel\":true}" : "{\"cancel\":false}",
                                res.cancel ? 15 : 16);
    else if (res.expected_seq >= 0)
        gps_http_send_error(r->req, GPS_DIALECT_NATIVE, 409, "SEQ_GAP", res.msg, NULL,
                            r->correlation_id,
                            json_pack("{s:{s:I}}", "details", "expected_seq",
                                      (json_int_t)res.expected_seq));
    else
        gps_req_error(r, res.status, res.code, res.msg,
                      res.status == 400 ? "events" : NULL);
}

/* POST /agents/events: the events of several jobs of one agent in one
 * request (docs/protocol.md "Batched uploads"). Each entry is judged alone,
 * exactly as its own POST /agents/jobs/{id}/events would be (a bad entry
 * refuses that entry only), and the reply lists every entry's outcome in
 * order. One request instead of one per job: at 50 tokens/s per stream
 * the per-request cost, not the events, is what a server spends. */
#define MAX_BATCH_JOBS 1024

/* Append one reply entry (i: its index; res_e stolen, NULL on ENOMEM). */
static void batch_entry_append(gp_buf *out, size_t i, json_t *res_e)
{
    char *t = res_e ? gp_json_dumps(res_e) : NULL;
    json_decref(res_e);
    if (i > 0)
        gp_buf_append(out, ",", 1);
    if (t)
        gp_buf_append(out, t, strlen(t));
    else
        gp_buf_append(out, "null", 4);
    free(t);
}

/* Append {"job_id":jid,"status":200,"cancel":b}, what json_pack wrote. */
static void batch_ok_append(gp_buf *out, size_t i, const char *jid, size_t n, bool cancel)
{
    if (i > 0)
        gp_buf_append(out, ",", 1);
    static const char pre[] = "{\"job_id\":\"", yes[] = "\",\"status\":200,\"cancel\":true}",
                      no[] = "\",\"status\":200,\"cancel\":false}";
    gp_buf_append(out, pre, sizeof pre - 1);
    gps_json_escape_append(out, jid, n);
    if (cancel)
        gp_buf_append(out, yes, sizeof yes - 1);
    else
        gp_buf_append(out, no, sizeof no - 1);
}

/* The entry of an applied job: {"job_id":..,"status":200,"cancel":b} or
 * its error. */
static void batch_result_append(gp_buf *out, size_t i, const char *jid, size_t jid_len,
                                const apply_result *res)
{
    if (res->status == 200) {
        batch_ok_append(out, i, jid, jid_len, res->cancel);
        return;
    }
    json_t *res_e = json_pack("{s:s%,s:i,s:{s:s,s:s}}", "job_id", jid, jid_len, "status",
                              res->status, "error", "code", res->code, "message", res->msg);
    if (res_e && res->expected_seq >= 0)
        json_object_set_new(json_object_get(res_e, "error"), "details",
                            json_pack("{s:I}", "expected_seq", (json_int_t)res->expected_seq));
    batch_entry_append(out, i, res_e);
}

/* The hot path: a batch of the shape upload_read.h reads (token events; of
 * the liveness fields only "instance", as the agent sends it), applied
 * without a jansson tree per token. Each entry is judged and answered as
 * in the jansson path below: the reader takes only bodies every check of
 * that path accepts. Returns
 * false when the body is not of that shape (nothing was done: the caller
 * parses it with jansson), true when the request was answered. */
static bool batch_fast(gps_agents *g, gps_req *r)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    size_t n = in ? evbuffer_get_length(in) : 0;
    const char *body = n ? (const char *)evbuffer_pullup(in, -1) : NULL;
    gps_upload u;
    if (!body || !gps_upload_read(body, n, MAX_BATCH_JOBS, &u))
        return false;
    if (u.instance && !agents_instance_ok(u.instance, u.instance_len)) {
        gps_upload_free(&u); /* the jansson path words the error */
        return false;
    }
    if (!agents_key_allows(g, r, u.agent_id)) {
        gps_upload_free(&u);
        return true;
    }
    /* What events_liveness does with an upload whose only liveness field
     * is "instance", without an object to carry it. */
    registry_agent *ra = u.instance ? registry_get(g->reg, u.agent_id) : NULL;
    if (ra) {
        liveness lv = {.instance = u.instance};
        agents_liveness_apply(g, ra, &lv);
    }
    gp_buf out;
    gp_buf_init(&out);
    gp_buf_append(&out, "{\"jobs\":[", 9);
    bool applied = false;
    for (size_t i = 0; i < u.n_jobs; i++) {
        const gps_upload_job *jb = &u.jobs[i];
        apply_result res;
        memset(&res, 0, sizeof res);
        res.expected_seq = -1;
        int rc = gps_jobs_apply_upload(g->jobs, jb->job_id, u.agent_id, jb->seq,
                                       u.evs + jb->first, jb->n, &res.cancel, &res.expected_seq,
                                       res.msg, sizeof res.msg);
        applied |= rc == 0;
        apply_result_set(rc, &res);
        batch_result_append(&out, i, jb->job_id, jb->job_id_len, &res);
    }
    if (applied) /* agent activity, once per upload (gps_jobs_apply_upload) */
        registry_touch(g->reg, registry_get(g->reg, u.agent_id), gp_now_mono_ms());
    count_upload(g, ROUTE_BATCH, u.n_jobs);
    gps_upload_free(&u);
    if (gp_buf_append(&out, "]}", 2) < 0)
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
    else
        gps_http_send_json_text(r->req, 200, out.data, out.len);
    gp_buf_free(&out);
    return true;
}

void agents_h_events_batch(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (batch_fast(g, r))
        return;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *id = json_string_value(json_object_get(body, "agent_id"));
    json_t *jobs = json_object_get(body, "jobs");
    if (!id || !gp_uuid_valid(id)) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", "'agent_id' must be a UUID string",
                      "agent_id");
        return;
    }
    if (!json_is_array(jobs) || json_array_size(jobs) == 0 ||
        json_array_size(jobs) > MAX_BATCH_JOBS) {
        json_decref(body);
        char m[128];
        snprintf(m, sizeof m, "'jobs' must be an array of 1 to %d entries", MAX_BATCH_JOBS);
        gps_req_error(r, 400, "INVALID_REQUEST", m, "jobs");
        return;
    }
    if (!agents_key_allows(g, r, id) || !events_liveness(g, r, body, id)) {
        json_decref(body);
        return;
    }
    /* The reply is rendered as text: an entry that went well (the usual
     * one) is a few appends instead of a json_pack per entry and a dump
     * (an eighth of the server's instructions per relayed token). */
    gp_buf out;
    gp_buf_init(&out);
    gp_buf_append(&out, "{\"jobs\":[", 9);
    size_t i;
    json_t *e;
    json_array_foreach(jobs, i, e)
    {
        const char *jid = json_string_value(json_object_get(e, "job_id"));
        json_t *res_e = NULL;
        if (!json_is_object(e) || !jid || json_string_length(json_object_get(e, "job_id")) == 0 ||
            json_string_length(json_object_get(e, "job_id")) > 128) {
            res_e = json_pack("{s:o,s:i,s:{s:s,s:s,s:{s:s}}}", "job_id",
                              jid ? json_string(jid) : json_null(), "status", 400, "error",
                              "code", "INVALID_REQUEST", "message",
                              "each entry must be an object with a 'job_id' string of 1 to 128 "
                              "bytes, 'seq' and 'events'",
                              "details", "param", "job_id");
            batch_entry_append(&out, i, res_e);
            continue;
        }
        /* The entry as a single upload's body, for the same checks. */
        json_t *one = json_pack("{s:s,s:O,s:O}", "agent_id", id, "seq",
                                json_object_get(e, "seq") ? json_object_get(e, "seq")
                                                          : json_null(),
                                "events",
                                json_object_get(e, "events") ? json_object_get(e, "events")
                                                             : json_null());
        char field[96], emsg[256];
        if (!one || gps_agent_events_check(one, field, sizeof field, emsg, sizeof emsg) < 0) {
            res_e = json_pack("{s:s,s:i,s:{s:s,s:s,s:{s:s}}}", "job_id", jid, "status", 400,
                              "error", "code", "INVALID_EVENT", "message",
                              one ? emsg : "out of memory", "details", "param",
                              one ? field : "");
        } else {
            apply_result res;
            apply_job_events(g, jid, id, json_object_get(one, "seq"),
                             json_object_get(one, "events"), &res);
            batch_result_append(&out, i, jid, json_string_length(json_object_get(e, "job_id")),
                                &res);
            json_decref(one);
            continue;
        }
        json_decref(one);
        batch_entry_append(&out, i, res_e);
    }
    count_upload(g, ROUTE_BATCH, json_array_size(jobs));
    json_decref(body);
    if (gp_buf_append(&out, "]}", 2) < 0)
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
    else
        gps_http_send_json_text(r->req, 200, out.data, out.len);
    gp_buf_free(&out);
}

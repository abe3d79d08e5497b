/* agent_upload: the jobs' events to the server, one upload per job or batched. */
#include "agent/agent_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"

/* ======================================================================== */
/* /agents/jobs/{id}/events                                                 */
/* ======================================================================== */

/* The head of an events upload's body, as json_pack and add_liveness
 * would have rendered it: ids passed job_id_ok, agent ids and instances
 * are hex and dashes, so nothing needs escaping. */
static int body_head(gp_buf *b, agent *a)
{
    return gp_buf_append(b, "{\"agent_id\":\"", 13) < 0 ||
                   gp_buf_append(b, a->id, strlen(a->id)) < 0
               ? -1
               : gp_buf_append(b, "\"", 1);
}

static int body_tail(gp_buf *b, agent *a)
{
    return gp_buf_append(b, ",\"instance\":\"", 13) < 0 ||
                   gp_buf_append(b, a->instance, strlen(a->instance)) < 0 ||
                   gp_buf_append(b, "\"}", 2) < 0
               ? -1
               : 0;
}

/* Append `"seq":N,"events":[...]` for j's pending events and begin their
 * upload (a->mu held): the events go from the queue into the body in one
 * copy. 1, 0 (nothing to send) or -1 (ENOMEM; b as it was). */
static int body_events_locked(gp_buf *b, agent_job *j)
{
    size_t mark = b->len, seq = 0;
    if (!agent_evq_ready(&j->q))
        return 0;
    int rc = gp_buf_append(b, "\"seq\":", 6) < 0 ||
                     gp_buf_append_int(b, (long long)j->q.acked) < 0 ||
                     gp_buf_append(b, ",\"events\":[", 11) < 0
                 ? -1
                 : agent_evq_take_append(&j->q, MAX_BATCH_EVENTS, &seq, b);
    if (rc > 0 && gp_buf_append(b, "]", 1) < 0) {
        agent_evq_nack(&j->q);
        rc = -1;
    }
    if (rc <= 0)
        gp_buf_truncate(b, mark);
    return rc;
}

/* One upload of j's pending events to the server that assigned it. */
void ag_upload_start(agent *a, agent_job *j, uint64_t now)
{
    gp_buf b;
    gp_buf_init(&b);
    int rc = body_head(&b, a) < 0 || gp_buf_append(&b, ",", 1) < 0 ? -1 : 0;
    pthread_mutex_lock(&a->mu);
    if (rc == 0)
        rc = body_events_locked(&b, j);
    pthread_mutex_unlock(&a->mu);
    if (rc > 0 && body_tail(&b, a) < 0) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        pthread_mutex_unlock(&a->mu);
        rc = -1;
    }
    if (rc <= 0) {
        gp_buf_free(&b);
        if (rc < 0)
            ag_job_retry_at(a, j, now + 1000);
        else
            ag_job_seen(a, j, 0); /* not ready after all: never so while the loop sees right */
        return;
    }
    char path[64 + MAX_JOB_ID];
    snprintf(path, sizeof path, "/agents/jobs/%s/events", j->id);
    size_t len = b.len;
    j->upload = ag_req_start_text(a, j->srv, REQ_EVENTS, path, gp_buf_steal(&b), len,
                               (long)a->o->request_timeout_sec * 1000, j->correlation_id);
    if (!j->upload) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        pthread_mutex_unlock(&a->mu);
        ag_job_retry_at(a, j, gp_now_mono_ms() + 1000);
        return;
    }
    j->upload->job = j;
    ag_job_seen(a, j, 0); /* in flight: nothing to send until it is answered */
}

void ag_upload_done(agent *a, agent_job *j, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    j->upload = NULL;
    if (rc == CURLE_OK && status == 200) {
        pthread_mutex_lock(&a->mu);
        agent_evq_ack(&j->q);
        ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        j->failing_since_ms = 0;
        agent_backoff_reset(&j->ub);
        if (json_is_true(json_object_get(body, "cancel")) && !j->cancelled) {
            gp_log_write(GP_LOG_INFO, "job_cancel", j->correlation_id,
                         json_pack("{s:s}", "job_id", j->id), "server cancelled job %s", j->id);
            j->cancelled = true;
            ag_job_cancel(a, j);
        }
        return;
    }
    if (rc == CURLE_OK && status == 401) {
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        ag_auth_lost(a, "an events upload", status, body);
        return;
    }
    if (rc == CURLE_OK && status == 409 && strcmp(ag_error_code(body), "SEQ_GAP") == 0) {
        json_t *d = json_object_get(json_object_get(body, "error"), "details");
        json_int_t exp = json_integer_value(json_object_get(d, "expected_seq"));
        gp_log_warn("seq_gap", "job %s: server expects seq %lld; resending from there", j->id,
                    (long long)exp);
        pthread_mutex_lock(&a->mu);
        agent_evq_rewind(&j->q, exp > 0 ? (size_t)exp : 0);
        ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        return;
    }
    if (rc == CURLE_OK && status == 400 && !j->upload_refused) {
        /* The server refused what the events say (a value out of its
         * bounds): without a word the client would wait for the deadline
         * (issue 25). The refused events make way for an error event that
         * ends the job now, and the backend stops. */
        j->upload_refused = true;
        char msg[600];
        snprintf(msg, sizeof msg, "the server refused this job's events: %.500s",
                 ag_error_text(body));
        gp_log_write(GP_LOG_WARN, "upload_refused", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "error", ag_error_text(body)),
                     "server refused events for job %s (HTTP 400): failing it", j->id);
        pthread_mutex_lock(&a->mu);
        agent_evq_replace_rest(&j->q, json_pack("{s:s,s:s,s:s}", "type", "error", "code",
                                                "AGENT_UPLOAD_REFUSED", "message", msg));
        ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        ag_job_cancel(a, j);
        return;
    }
    if (rc == CURLE_OK && status >= 400 && status < 500 && status != 408 &&
        status != 429) {
        /* 404 JOB_NOT_FOUND / 409 NOT_ASSIGNED / 400: this job is not ours to
         * continue; stop it and send nothing more. */
        gp_log_write(GP_LOG_WARN, "job_dropped", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                     "server %s refused events for job %s: HTTP %ld %s", a->servers[j->srv],
                     j->id, status, ag_error_text(body));
        pthread_mutex_lock(&a->mu);
        agent_evq_nack(&j->q);
        ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
        pthread_mutex_unlock(&a->mu);
        j->cancelled = true;
        ag_job_cancel(a, j);
        return;
    }
    /* Transport error, 5xx, 408, 429: retry the same batch later. */
    pthread_mutex_lock(&a->mu);
    agent_evq_nack(&j->q);
    ag_job_link_locked(a, j); /* j->upload went: the loop looks again */
    pthread_mutex_unlock(&a->mu);
    if (!j->failing_since_ms)
        j->failing_since_ms = now;
    uint32_t d = agent_backoff_next(&j->ub, ag_rnd32());
    j->next_upload_ms = now + d;
    gp_log_write(GP_LOG_DEBUG, "upload_retry", j->correlation_id,
                 json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                 "job %s: events upload to %s failed (%s, HTTP %ld); retry in %u ms", j->id,
                 a->servers[j->srv], rc != CURLE_OK ? curl_easy_strerror(rc) : "ok", status, d);
    if (now - j->failing_since_ms > UPLOAD_GIVE_UP_MS) {
        gp_log_write(GP_LOG_WARN, "job_dropped", j->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", j->id, "server", a->servers[j->srv]),
                     "job %s: events could not be delivered to %s for %d s; giving up", j->id,
                     a->servers[j->srv], UPLOAD_GIVE_UP_MS / 1000);
        j->cancelled = true;
        ag_job_cancel(a, j);
    }
}

/* Batched uploads (docs/protocol.md "Batched uploads"): the pending events
 * of every job with some, in one POST /agents/events, one such request in
 * flight. Sent as soon as the previous one is answered, so at low load a
 * token waits no longer than with one upload per job, and under load
 * everything that accumulated during a round trip travels together. Each
 * entry's outcome goes through ag_upload_done as its own upload's would. */
#define BATCH_MAX_JOBS 1024            /* what the server takes in one (MAX_BATCH_JOBS) */
#define BATCH_MAX_BYTES (1u << 20)   /* then the rest waits for the next one */
/* How many jobs one batch carries: BATCH_JOBS, or a sixteenth of those
 * waiting when more than 1,024 wait (none waits more than ~16 round
 * trips), up to BATCH_MAX_JOBS. The server applies a batch in one
 * callback, writing to each job's client as it goes: at 1,000 paced
 * streams a batch of every waiting job (~175) kept its loop ~2 ms at a
 * time from new requests (first token p50 27 ms on relaybench's shared
 * core); at 64 the jobs left for the next batch gather their tokens, so
 * fewer, fuller writes reach the clients (server CPU 6.6 -> 5.3 s, first
 * token 3.9 ms, each token's delay after its stream's first p50 8 -> 20
 * ms, p99 41 -> 48 ms; docs/scaling.md "Twelfth round"). Urgent jobs
 * (first output, end) are at the front of a->bq: always in the next one. */
#define BATCH_JOBS 64

static size_t batch_jobs(const agent *a)
{
    size_t n = a->n_bq / 16;
    return n < BATCH_JOBS ? BATCH_JOBS : n > BATCH_MAX_JOBS ? BATCH_MAX_JOBS : n;
}

/* One POST /agents/events with the pending events of the jobs on a->bq,
 * in their order, up to BATCH_MAX_JOBS and BATCH_MAX_BYTES (the rest stay
 * for the next one); urgent_only: of its urgent jobs only, as a->urgent_req
 * (ag_batch_urgent_due), else as a->batch_req. A job is in one upload at a
 * time whichever request carries it, so its events keep their order and
 * the server's seq check is the same as with one batch. The body is
 * written straight from the queues under one lock:
 * {"agent_id":..,"jobs":[{"job_id":..,"seq":..,"events":[..]},..],
 * "instance":..}, byte for byte what the jansson tree of it dumped. */
void ag_batch_start(agent *a, uint64_t now, bool urgent_only)
{
    gp_buf b;
    gp_buf_init(&b);
    agent_job **jobs = calloc(a->n_bq ? a->n_bq : 1, sizeof *jobs);
    size_t k = 0;
    int rc = !jobs || body_head(&b, a) < 0 || gp_buf_append(&b, ",\"jobs\":[", 9) < 0 ? -1 : 0;
    pthread_mutex_lock(&a->mu);
    const size_t max_jobs = batch_jobs(a);
    for (agent_job *j = a->bq_head, *next; rc == 0 && j && k < max_jobs &&
                                          b.len < BATCH_MAX_BYTES; j = next) {
        size_t mark = b.len;
        next = j->bq_next;
        if (urgent_only && !j->seen_urgent)
            continue;
        if ((k && gp_buf_append(&b, ",", 1) < 0) || gp_buf_append(&b, "{\"job_id\":\"", 11) < 0 ||
            gp_buf_append(&b, j->id, strlen(j->id)) < 0 || gp_buf_append(&b, "\",", 2) < 0) {
            gp_buf_truncate(&b, mark);
            break;
        }
        int er = body_events_locked(&b, j);
        if (er > 0 && gp_buf_append(&b, "}", 1) < 0) {
            agent_evq_nack(&j->q);
            er = -1;
        }
        if (er <= 0) {
            gp_buf_truncate(&b, mark);
            if (er < 0)
                break;
            ag_job_seen(a, j, 0); /* not ready after all: never so while the loop sees right */
            continue;
        }
        jobs[k++] = j;
    }
    bool tail_ok = k > 0 && gp_buf_append(&b, "]", 1) == 0 && body_tail(&b, a) == 0;
    if (k > 0 && !tail_ok)
        for (size_t i = 0; i < k; i++)
            agent_evq_nack(&jobs[i]->q);
    pthread_mutex_unlock(&a->mu);
    req *r = NULL;
    if (tail_ok) {
        size_t len = b.len;
        r = ag_req_start_text(a, a->cur, REQ_EVENTS_BATCH, "/agents/events", gp_buf_steal(&b), len,
                           (long)a->o->request_timeout_sec * 1000, NULL);
        if (!r) {
            pthread_mutex_lock(&a->mu);
            for (size_t i = 0; i < k; i++)
                agent_evq_nack(&jobs[i]->q);
            pthread_mutex_unlock(&a->mu);
        }
    }
    gp_buf_free(&b);
    if (!r) {
        /* Nothing went: each job tries again in a second (as one upload would). */
        for (size_t i = 0; i < k; i++)
            ag_job_retry_at(a, jobs[i], now + 1000);
        free(jobs);
        return;
    }
    r->batch = jobs;
    r->n_batch = k;
    for (size_t i = 0; i < k; i++) {
        jobs[i]->upload = r;
        ag_job_seen(a, jobs[i], 0); /* in flight: off a->bq */
    }
    *(urgent_only ? &a->urgent_req : &a->batch_req) = r;
}

/* r was answered: it no longer holds back the next batch of its kind (one
 * left behind by server_switch is neither). */
static void batch_forget(agent *a, const req *r)
{
    if (a->batch_req == r)
        a->batch_req = NULL;
    if (a->urgent_req == r)
        a->urgent_req = NULL;
}

/* An urgent batch goes now: a batch is in flight (without this, any other
 * job's first output or end would wait for its round trip: under load tens
 * of ms for every new stream's first token, issue 24), no urgent batch is,
 * and some queued job is urgent (bq_add puts those first). */
bool ag_batch_urgent_due(const agent *a)
{
    return a->batch_req && !a->urgent_req && a->bq_head && a->bq_head->seen_urgent;
}

/* The usual 200 reply to a batch, as the server renders it:
 * {"jobs":[{"job_id":"<id>","status":200,"cancel":false|true},...]}, one
 * entry per job in the body's order. Read by comparing bytes, without a
 * jansson tree (the reply lists every job of the batch, up to every stream
 * the agent holds, on every upload: a tree and a json_pack per entry were
 * about a fifth of the agent at 100 paced streams). false: any other reply
 * (an error entry, another shape, an id that needs escaping); nothing was
 * done and ag_batch_done reads it with jansson. */
bool ag_batch_done_fast(agent *a, req *r)
{
    static const char pre[] = "{\"job_id\":\"", mid[] = "\",\"status\":200,\"cancel\":";
    const char *p = r->resp.data, *end = p + r->resp.len;
    if (!p || r->n_batch == 0 || r->resp.len < 10 || memcmp(p, "{\"jobs\":[", 9) != 0)
        return false;
    p += 9;
    /* Pass 1: check every entry; pass 2 acts, so a mismatch changes nothing. */
    for (int pass = 0; pass < 2; pass++) {
        const char *q = p;
        if (pass == 1)
            batch_forget(a, r); /* as ag_batch_done does first */
        for (size_t i = 0; i < r->n_batch; i++) {
            agent_job *j = r->batch[i];
            size_t idn = strlen(j->id);
            if (i > 0 && (q >= end || *q++ != ','))
                return false;
            if ((size_t)(end - q) < sizeof pre - 1 + idn + sizeof mid - 1 + 6 ||
                memcmp(q, pre, sizeof pre - 1) != 0 || memcmp(q + sizeof pre - 1, j->id, idn) != 0)
                return false;
            for (size_t k = 0; k < idn; k++)
                if ((unsigned char)j->id[k] < 0x20 || j->id[k] == '"' || j->id[k] == '\\')
                    return false; /* would have been escaped */
            q += sizeof pre - 1 + idn;
            if (memcmp(q, mid, sizeof mid - 1) != 0)
                return false;
            q += sizeof mid - 1;
            bool cancel = (size_t)(end - q) >= 5 && memcmp(q, "true}", 5) == 0;
            if (!cancel && ((size_t)(end - q) < 6 || memcmp(q, "false}", 6) != 0))
                return false;
            q += cancel ? 5 : 6;
            if (pass == 1) {
                json_t *one = cancel ? json_pack("{s:b}", "cancel", 1) : NULL;
                ag_upload_done(a, j, CURLE_OK, 200, one);
                json_decref(one);
            }
        }
        if (pass == 0 && (end - q != 2 || memcmp(q, "]}", 2) != 0))
            return false;
    }
    return true;
}

void ag_batch_done(agent *a, req *r, CURLcode rc, long status, json_t *body)
{
    batch_forget(a, r);
    json_t *list = json_object_get(body, "jobs");
    if (rc == CURLE_OK && status == 404 && !json_is_array(list)) {
        /* No such route after all (a server swapped for an older one):
         * back to one upload per job; nothing of this batch was applied. */
        gp_log_warn("events_batch_unsupported", "server has no POST /agents/events; uploading "
                    "per job");
        a->events_batch = false;
        for (size_t i = 0; i < r->n_batch; i++) {
            agent_job *j = r->batch[i];
            j->upload = NULL;
            pthread_mutex_lock(&a->mu);
            agent_evq_nack(&j->q);
            ag_job_link_locked(a, j);
            pthread_mutex_unlock(&a->mu);
        }
        return;
    }
    if (rc != CURLE_OK || status != 200 || !json_is_array(list)) {
        /* The whole request failed: each job as if its own upload had. */
        for (size_t i = 0; i < r->n_batch; i++)
            ag_upload_done(a, r->batch[i], rc, status, body);
        return;
    }
    for (size_t i = 0; i < r->n_batch; i++) {
        agent_job *j = r->batch[i];
        json_t *e = json_array_get(list, i);
        const char *jid = json_string_value(json_object_get(e, "job_id"));
        if (!jid || strcmp(jid, j->id) != 0) {
            /* A reply that does not line up: retry this job's events
             * (seq makes a resend harmless). */
            ag_upload_done(a, j, CURLE_RECV_ERROR, 0, NULL);
            continue;
        }
        long est = (long)json_integer_value(json_object_get(e, "status"));
        json_t *one = est == 200
                          ? json_pack("{s:O}", "cancel",
                                      json_object_get(e, "cancel") ? json_object_get(e, "cancel")
                                                                   : json_false())
                          : json_pack("{s:O}", "error",
                                      json_object_get(e, "error") ? json_object_get(e, "error")
                                                                  : json_object());
        ag_upload_done(a, j, CURLE_OK, est, one);
        json_decref(one);
    }
}

/* jobs_finish: a job's request-log row, and how a job ends (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stdio.h>
#include <string.h>

#include "common/gp_count.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/auth/limits.h"
#include "server/store/store.h"

/* May the store fold this job's row writes into each other
 * (gps_store_job_update.coalesce)? Not a native task's (its events and
 * checkpoints are ordered with the row: a restart reads them together) nor
 * a job handed off between servers (its handoffs row refers to it). */
static bool row_coalesces(const gps_job *job)
{
    return !(job->spec.api && strcmp(job->spec.api, "native") == 0) && !job->remote &&
           !job->offered && !job->spec.resume_id;
}

/* The request log. Prompts are stored only with log_prompts. */
void jobs_persist_insert(gps_jobs *j, gps_job *job)
{
    /* Native tasks keep their input: GET /v2/tasks/{id} and a later
     * resumption need it whatever log_prompts says. One write: the body
     * the dialect gave (spec.stored_request) goes into the insert itself,
     * never as a second update of the row. Taken from the spec: nothing
     * reads it after this. */
    json_t *req = job->spec.stored_request;
    job->spec.stored_request = NULL;
    if (!j->store || job->spec.handoff_proxy) {
        json_decref(req);
        return;
    }
    bool native = job->spec.api && strcmp(job->spec.api, "native") == 0;
    if (!req && (j->opts.log_prompts || native)) {
        req = json_object();
        if (job->spec.prompt)
            json_object_set_new(req, "prompt", json_string(job->spec.prompt));
        if (job->spec.messages)
            json_object_set(req, "messages", job->spec.messages);
        if (native)
            json_object_set_new(req, "max_tokens", json_integer(job->spec.max_tokens));
    }
    gps_store_job_row row = {
        .id = job->id,
        .api = job->spec.api ? job->spec.api : "openai",
        .kind = gps_job_kind_name(job->spec.kind),
        .model = job->spec.model,
        .key_id = job->key_id[0] ? job->key_id : NULL,
        .status = gps_job_state_name(job->state),
        .priority = job->spec.priority,
        .correlation_id = job->correlation_id,
        .has_seed = job->spec.has_seed,
        .seed = job->spec.seed,
        .created_at = job->created_wall_ms,
        .request = req,
        .coalesce = row_coalesces(job),
    };
    if (gps_store_job_insert_owned(j->store, row, j->owner_server) < 0)
        jobs_count(j, "db_errors_total", NULL, 1);
    else
        jobs_count(j, "db_writes_total", NULL, 1);
    json_decref(req);
}

/* Submit to end (a finished job's), as the request log and job_done say it. */
long long jobs_total_ms(const gps_job *job)
{
    return (long long)((job->finished_us - job->created_us) / 1000);
}

void jobs_persist(gps_jobs *j, gps_job *job)
{
    if (!j->store || job->row_lost || job->spec.handoff_proxy)
        return;
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(job->id);
    u.lease_attempt = job->lease_attempt;
    u.status = gps_job_state_name(job->state);
    u.agent_id = job->agent_id[0] ? job->agent_id : NULL;
    u.attempts = job->attempts;
    u.queue_ms = job->queue_ms;
    u.coalesce = row_coalesces(job);
    if (gps_job_terminal(job)) {
        u.prompt_tokens = job->prompt_tokens;
        u.completion_tokens = job->completion_tokens;
        if (job->first_token_us)
            u.ttft_ms = (long long)((job->first_token_us - job->created_us) / 1000);
        u.total_ms = jobs_total_ms(job);
        u.finish_reason = job->finish_reason[0] ? job->finish_reason : NULL;
        u.error_code = job->error_code[0] ? job->error_code : NULL;
        /* Only a row that does not coalesce takes a message (store.h):
         * native tasks', the rows read back to show it (GET /v2/tasks). */
        if (u.error_code && !u.coalesce)
            u.error_message = job->error_message;
        u.finished_at = gp_now_wall_ms();
    }
    if (gps_store_job_update_async(j->store, u) < 0)
        jobs_count(j, "db_errors_total", NULL, 1);
    else
        jobs_count(j, "db_writes_total", NULL, 1);
}

/* End the current assignment on the agent's books, once. */
void jobs_end_on_agent(gps_jobs *j, gps_job *job, bool ok)
{
    if (job->ended_on_agent || !job->agent_id[0])
        return;
    job->ended_on_agent = true;
    registry_agent *a = registry_get(j->reg, job->agent_id);
    if (a)
        registry_job_end(j->reg, a, ok, job->tokens_per_sec);
}

/* The oldest job of key_id held for max_concurrent (the job list is
 * newest first). O(jobs), and only run while the key has jobs waiting. */
static gps_job *oldest_held(gps_jobs *j, const char *key_id)
{
    gps_job *found = NULL;
    for (gps_job *x = j->head; x; x = x->next)
        if (x->held && !gps_job_terminal(x) && strcmp(x->key_id, key_id) == 0)
            found = x;
    return found;
}

/* A job of key_id left the scheduler: let the key's waiting jobs in, in
 * arrival order, while its limit allows. */
static void release_held(gps_jobs *j, const char *key_id)
{
    if (!j->limits || !key_id[0])
        return;
    gps_key_usage u;
    gps_limits_get_usage(j->limits, key_id, gp_now_wall_ms(), &u);
    while (u.waiting > 0 && gps_limits_may_start(j->limits, key_id)) {
        gps_job *h = oldest_held(j, key_id);
        if (!h)
            break;
        h->held = false;
        h->counted = true;
        gps_limits_waiting_add(j->limits, key_id, -1);
        gps_limits_started(j->limits, key_id);
        u.waiting--;
        jobs_place(j, h, 0);
    }
}

void jobs_finish(gps_jobs *j, gps_job *job, gps_job_state st)
{
    if (job->state == GPS_JOB_QUEUED && !job->held && !job->remote)
        sched_remove(j->sched, &job->sj);
    if (job->in_backoff) {
        event_del(job->retry_ev);
        job->in_backoff = false;
    }
    job->state = st;
    job->finished_us = gp_now_mono_us();
    jobs_list_to_done(j, job);
    if (j->n_live)
        j->n_live--;
    jobs_persist(j, job);
    if ((job->remote || job->offered) && j->handoff.ended)
        j->handoff.ended(j->handoff.arg, job);
    if (j->limits) {
        /* A count_tokens job reports the counted prompt as its usage: that
         * is an answer, not tokens the key spent. */
        jobs_release_reservation(job);
        if (job->spec.kind != GPS_JOB_COUNT_TOKENS)
            gps_limits_account(j->limits, job->key_id, job->prompt_tokens,
                               job->completion_tokens, gp_now_wall_ms());
        if (job->held) {
            job->held = false;
            gps_limits_waiting_add(j->limits, job->key_id, -1);
        }
        if (job->counted) {
            job->counted = false;
            gps_limits_ended(j->limits, job->key_id);
            /* After this job's subscribers had their say: release_held may
             * place jobs, which can deliver and notify. */
            release_held(j, job->key_id);
        }
    }
}

/* A job ended here while its agent holds it: off the agent's books, and
 * on the cancel list that tells the agent to stop it. */
static void leave_agent(gps_jobs *j, gps_job *job, bool ok)
{
    if (job->state != GPS_JOB_ASSIGNED && job->state != GPS_JOB_RUNNING)
        return;
    jobs_end_on_agent(j, job, ok);
    jobs_cancel_add(j, job->agent_id, job->id);
}

/* The error event a job ends with (new reference): code, message, the
 * status a dialect uses, retry_after when > 0; out of memory, the table's
 * own (INTERNAL, 500): never no event, which a subscriber would tell as
 * the agent's failure (relay.c: 502 AGENT_ERROR), nor one without its
 * retry_after. */
static json_t *error_event(gps_jobs *j, int status, const char *code, const char *message,
                           int retry_after)
{
    json_t *ev = json_pack("{s:s,s:s,s:s,s:i}", "type", "error", "code", code, "message",
                           message, "status", status);
    if (ev && retry_after > 0 &&
        json_object_set_new(ev, "retry_after", json_integer(retry_after)) != 0) {
        json_decref(ev);
        ev = NULL;
    }
    return ev ? ev : json_incref(j->oom_ev);
}

/* The code a job's subscribers are told with ev (error_event's): the
 * table's own INTERNAL when ev is its out-of-memory event, else code. */
static const char *told_code(const gps_jobs *j, const json_t *ev, const char *code)
{
    return ev == j->oom_ev ? "INTERNAL" : code;
}

/* Fail a job with an error event carrying the status a dialect uses. */
void jobs_fail_job(gps_jobs *j, gps_job *job, int status, const char *code,
                   const char *message, int retry_after)
{
    if (gps_job_terminal(job))
        return;
    /* Made before the row is written: the row records what the client is
     * told, the server's own INTERNAL when that is what it gets. */
    json_t *ev = error_event(j, status, code, message, retry_after);
    leave_agent(j, job, false);
    snprintf(job->error_code, sizeof job->error_code, "%s", told_code(j, ev, code));
    job->error_message = json_string_value(json_object_get(ev, "message"));
    jobs_finish(j, job, GPS_JOB_FAILED);
    job->error_message = NULL;
    gp_log_write(GP_LOG_WARN, "job_failed", job->correlation_id,
                 json_pack("{s:s,s:s,s:i,s:s}", "job_id", job->id, "code", code, "status",
                           status, "agent_id", job->agent_id),
                 "%s", message);
    jobs_notify(j, job, GPS_EV_ERROR, ev);
    json_decref(ev);
}

/* A job cancelled while an agent ran it: the agent had read the prompt,
 * and the key pays for it even when the agent never said its size (the
 * openai backend learns it from the upstream's final usage only): then the
 * documented estimate (common/gp_count.h). Returns true when estimated. */
static bool charge_prompt_of_cancelled(gps_job *job)
{
    if (job->state != GPS_JOB_RUNNING || job->prompt_tokens > 0 ||
        job->spec.kind == GPS_JOB_COUNT_TOKENS)
        return false;
    json_t *w = json_object();
    if (!w)
        return false;
    if (job->spec.prompt)
        json_object_set_new(w, "prompt", json_string(job->spec.prompt));
    if (job->spec.messages)
        json_object_set(w, "messages", job->spec.messages);
    long long n = gp_count_estimate(w);
    json_decref(w);
    if (n <= 0)
        return false;
    job->prompt_tokens = n;
    return true;
}

void gps_jobs_cancel(gps_jobs *j, gps_job *job, const char *reason)
{
    if (gps_job_terminal(job))
        return;
    json_t *ev = error_event(j, 499, "CANCELLED", "the job was cancelled", 0);
    bool estimated = charge_prompt_of_cancelled(job);
    leave_agent(j, job, true);
    snprintf(job->error_code, sizeof job->error_code, "%s", told_code(j, ev, "CANCELLED"));
    /* Out of memory the subscribers are told the server's own INTERNAL
     * (500), not a cancel: the row says the same, failed (as any job the
     * server failed), never cancelled with an INTERNAL code. The agent
     * still gets its cancel (leave_agent) and is not blamed. */
    job->error_message = json_string_value(json_object_get(ev, "message"));
    jobs_finish(j, job, ev == j->oom_ev ? GPS_JOB_FAILED : GPS_JOB_CANCELLED);
    job->error_message = NULL;
    gp_log_write(GP_LOG_INFO, "job_cancelled", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:I,s:I,s:b}", "job_id", job->id, "reason",
                           reason ? reason : "", "agent_id", job->agent_id, "prompt_tokens",
                           (json_int_t)job->prompt_tokens, "completion_tokens",
                           (json_int_t)job->completion_tokens, "prompt_estimated", estimated),
                 "job cancelled");
    jobs_notify(j, job, GPS_EV_ERROR, ev);
    json_decref(ev);
}

void gps_jobs_fail(gps_jobs *j, gps_job *job, int status, const char *code,
                   const char *message)
{
    jobs_fail_job(j, job, status, code, message, 0);
}

void gps_jobs_finish_early(gps_jobs *j, gps_job *job, const char *finish_reason)
{
    if (gps_job_terminal(job))
        return;
    snprintf(job->finish_reason, sizeof job->finish_reason, "%s",
             finish_reason ? finish_reason : "stop");
    json_t *ev = json_pack("{s:s,s:s,s:{s:I,s:I}}", "type", "end", "finish_reason",
                           job->finish_reason, "usage", "prompt_tokens",
                           (json_int_t)job->prompt_tokens, "completion_tokens",
                           (json_int_t)job->completion_tokens);
    if (!ev && jobs_wants_tree(job)) {
        /* A subscriber that reads the end's tree (a native task, a
         * hand-off's proxy) would never learn that the job ended: it
         * fails, the server's own failure. The cursor subscribers (the
         * relay) read the end from the job: NULL will do for them. */
        job->finish_reason[0] = '\0';
        jobs_fail_job(j, job, 500, "INTERNAL", "out of memory", 0);
        return;
    }
    leave_agent(j, job, true);
    jobs_finish(j, job, GPS_JOB_DONE);
    gp_log_write(GP_LOG_INFO, "job_done", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:I,s:I,s:s,s:b}", "job_id", job->id, "model",
                           job->spec.model, "agent_id", job->agent_id, "ms",
                           (json_int_t)jobs_total_ms(job),
                           "completion_tokens",
                           (json_int_t)job->completion_tokens, "finish_reason",
                           job->finish_reason, "early", 1),
                 "job finished by the server (stop sequence)");
    jobs_notify(j, job, GPS_EV_END, ev);
    json_decref(ev);
}

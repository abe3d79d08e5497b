/* jobs_assign: a job placed on an agent and handed to it (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stddef.h>
#include <stdio.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/metrics.h"

/*
 * The fields of the three log lines every job writes (job_submitted and
 * job_assigned at debug, job_done at info: one line a request at the
 * default level, as an access log; three were 9 % of the server's CPU at
 * 64 zero-delay clients, and journald drops a service's lines past 10,000
 * in 30 s): one object per line kind, kept by the table and refilled in
 * place, its keys made by the first line in the order its writer sets
 * them, rather than a json_pack per line (~7,000 instructions each; issue
 * 24). The line is the one the json_pack object wrote; a value jansson
 * refuses (not UTF-8) drops the fields, as a failed json_pack did.
 * jobs_log_fields returns the object to refill (borrowed),
 * jobs_lf_str/jobs_lf_int/jobs_lf_bool set one field and say whether it
 * took, jobs_log_fields_ref hands gp_log_write its reference.
 */
json_t *jobs_log_fields(json_t **slot)
{
    if (!*slot)
        *slot = json_object();
    return *slot;
}

bool jobs_lf_str(json_t *o, const char *k, const char *v)
{
    json_t *x = json_object_get(o, k);
    if (!v)
        return false;
    return x ? json_string_set(x, v) == 0 : json_object_set_new(o, k, json_string(v)) == 0;
}

bool jobs_lf_int(json_t *o, const char *k, long long v)
{
    json_t *x = json_object_get(o, k);
    return x ? json_integer_set(x, v) == 0 : json_object_set_new(o, k, json_integer(v)) == 0;
}

bool jobs_lf_bool(json_t *o, const char *k, bool v)
{
    return json_object_set_new(o, k, json_boolean(v)) == 0; /* (in place when there) */
}

json_t *jobs_log_fields_ref(json_t *o, bool ok)
{
    return o && ok ? json_incref(o) : NULL;
}

/* Mark job as given to agent a (the scheduler already counted the slot). */
static void mark_assigned(gps_jobs *j, gps_job *job, registry_agent *a)
{
    uint64_t now = gp_now_mono_us();
    if (job->state == GPS_JOB_QUEUED && job->queued_since_us)
        job->queue_ms += (long long)((now - job->queued_since_us) / 1000);
    job->state = GPS_JOB_ASSIGNED;
    job->attempts++;
    gp_copy_str(job->agent_id, sizeof job->agent_id, a->id);
    /* The file that serves it (x_pool_meta.model_sha256: what an operator
     * pinned, or what a client may want to check). */
    const char *dg = registry_agent_model_digest(a, job->spec.model);
    gp_copy_str(job->model_digest, sizeof job->model_digest, dg ? dg : "");
    job->assigned_us = now;
    /* Scheduling latency: submit to the first assignment (a requeue after
     * a failover is counted by failovers_total instead; a delivery that
     * found the long-poll gone is retried and not counted twice). */
    if (!job->sched_observed && j->metrics && now >= job->created_us) {
        job->sched_observed = true;
        gps_metrics_sched_latency(j->metrics, job->spec.model,
                                  job->spec.priority == GPS_PRIO_BATCH ? "batch" : "interactive",
                                  (double)(now - job->created_us) / 1e6);
    }
    job->last_event_us = now;
    job->ended_on_agent = false;
    job->delivery = 0;
    job->progress_done = job->progress_total = 0;
    job->agent_seq = 0;
    job->agent_bytes = 0;
    job->metrics_relayed = 0;
    jobs_continuation_plan(job, a);
    if (gp_log_enabled(GP_LOG_DEBUG)) {
        json_t *f = jobs_log_fields(&j->log_assigned);
        bool ok = f && jobs_lf_str(f, "job_id", job->id) && jobs_lf_str(f, "agent_id", a->id) &&
                  jobs_lf_int(f, "attempt", job->attempts) &&
                  jobs_lf_int(f, "queue_ms", job->queue_ms);
        gp_log_write(GP_LOG_DEBUG, "job_assigned", job->correlation_id, jobs_log_fields_ref(f, ok),
                     "job assigned");
    }
    jobs_persist(j, job);
}

/* After an assignment by sched: was it the prefix that chose the agent? */
static void note_prefix_route(gps_jobs *j, gps_job *job)
{
    if (!job->sj.prefix)
        return;
    job->prefix_units = job->sj.prefix_units;
    jobs_count(j, "prefix_routed_total",
               job->prefix_units > 0 ? "result=\"hit\"" : "result=\"miss\"", 1);
}

/* The scheduler gave an offered job (jobs.h, hand-off) a slot of agent a:
 * the offer is withdrawn first, since a peer may have claimed it already.
 * The slot goes back (registry and, with give_back, the scheduler: the
 * agent stays ready with it) and the job waits out of the scheduler for
 * the answer (gps_jobs_offer_withdrawn), at the front of its queue when it
 * comes back. false: no offer to withdraw, the caller dispatches now. */
bool jobs_withdraw_first(gps_jobs *j, gps_job *job, registry_agent *a, bool give_back)
{
    if (!job->offered)
        return false;
    if (!j->handoff.withdraw || !j->handoff.withdraw(j->handoff.arg, job)) {
        job->offered = false;
        return false;
    }
    job->withdrawing = true;
    snprintf(job->withdraw_agent, sizeof job->withdraw_agent, "%s", a->id);
    job->sj.agent = NULL;
    job->sj.front = true;
    registry_job_undo(j->reg, a);
    if (give_back)
        sched_agent_ready(j->sched, a, sched_agent_free_slots(j->sched, a) + 1);
    gp_log_write(GP_LOG_DEBUG, "job_handoff_withdrawing", job->correlation_id,
                 json_pack("{s:s,s:s}", "job_id", job->id, "agent_id", a->id),
                 "an agent here can take an offered job: withdrawing the offer first");
    return true;
}

/* The scheduler gave job to agent a, whose long-poll is parked: hand it
 * over now. When the long-poll turns out to be gone, or the job's wire
 * cannot be written (out of memory: the poll is answered 500 and the
 * agent polls again), give the slot back and put the job back at the head
 * of its queue, its attempt not counted: never assigned to an agent that
 * never got it, which only a failover would end (depth bounds the
 * retries). */
void jobs_deliver_to(gps_jobs *j, gps_job *job, registry_agent *a, int depth)
{
    note_prefix_route(j, job);
    mark_assigned(j, job, a);
    gp_buf arr;
    gp_buf_init(&arr);
    bool built = LIT(&arr, "[") == 0 &&
                 gps_job_wire_append(&arr, job, gp_now_mono_us(),
                                     j->opts.request_timeout_sec) == 0 &&
                 LIT(&arr, "]") == 0;
    long long rc = j->deliver ? j->deliver(a, built ? &arr : NULL, j->deliver_arg) : -1;
    gp_buf_free(&arr);
    if (rc >= 0 && !built)
        rc = -1; /* (a callback that took no jobs for a reply) */
    if (rc >= 0 && job->state == GPS_JOB_ASSIGNED)
        job->delivery = (uint64_t)rc;
    if (rc < 0) {
        job->attempts--;
        jobs_end_on_agent(j, job, true);
        job->agent_id[0] = '\0';
        job->sj.front = true; /* it was first in line when the agent was chosen */
        jobs_requeue_or_fail(j, job, depth);
    }
}

/* Submit to the scheduler (first time, after a failover, or when a job
 * held for its key's max_concurrent is let in). Issue 28: queued here, it
 * is offered to the other servers too, as at submit (withdrawn before an
 * agent here gets it); no agent here at all (the last one was lost), it
 * is handed to them only, where a live peer lists its model. */
void jobs_place(gps_jobs *j, gps_job *job, int depth)
{
    registry_agent *a = NULL;
    job->sj.agent = NULL;
    sched_result r = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
    if (r == SCHED_QUEUED) {
        job->state = GPS_JOB_QUEUED;
        if (!job->offered && j->handoff.withdraw && jobs_offerable(j, job, true))
            job->offered = j->handoff.offer(j->handoff.arg, job);
        return;
    }
    if (r == SCHED_NO_AGENT && !job->offered && jobs_offerable(j, job, false)) {
        job->state = GPS_JOB_QUEUED;
        job->remote = true; /* as at submit: the follower assigns it */
        j->handoff.offer(j->handoff.arg, job);
        return;
    }
    if (r == SCHED_ASSIGNED && a) {
        if (!jobs_withdraw_first(j, job, a, true))
            jobs_deliver_to(j, job, a, depth + 1);
        return;
    }
    int retry = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
    if (r == SCHED_QUEUE_FULL)
        jobs_fail_job(j, job, 503, "NO_CAPACITY", "queue full while failing over", retry);
    else
        jobs_fail_job(j, job, 503, "NO_AGENT", "no agent available for the model", retry);
}

void jobs_requeue_or_fail(gps_jobs *j, gps_job *job, int depth)
{
    if (depth > 4) {
        jobs_fail_job(j, job, 503, "NO_AGENT", "no agent could take the job", 1);
        return;
    }
    job->state = GPS_JOB_QUEUED;
    job->queued_since_us = gp_now_mono_us();
    jobs_place(j, job, depth);
}

size_t gps_jobs_take_for_agent(gps_jobs *j, registry_agent *a, int free_slots, uint64_t delivery,
                               gp_buf *out)
{
    /* (On ENOMEM the jobs written so far go out; the others stall on the
     * agent's books and fail over, as a short jansson array did.) */
    size_t taken = 0;
    LIT(out, "[");
    if (free_slots <= 0 || sched_agent_ready(j->sched, a, free_slots) < 0) {
        LIT(out, "]");
        return 0;
    }
    /* As many as the agent has free slots, in one reply: a burst reaches an
     * agent in one round trip instead of one per 64 jobs. */
    sched_job *picked[64];
    size_t left = (size_t)free_slots;
    uint64_t now = gp_now_mono_us();
    int withdrawing = 0; /* offered jobs picked: their slots stay the agent's */
    while (left > 0) {
        size_t max = left < 64 ? left : 64;
        size_t n = sched_dispatch(j->sched, a, picked, max, gp_now_mono_ms());
        for (size_t i = 0; i < n; i++) {
            gps_job *job = (gps_job *)((char *)picked[i] - offsetof(gps_job, sj));
            if (jobs_withdraw_first(j, job, a, false)) {
                withdrawing++;
                continue;
            }
            mark_assigned(j, job, a);
            job->delivery = delivery;
            size_t at = out->len;
            if ((taken && LIT(out, ",") < 0) ||
                gps_job_wire_append(out, job, now, j->opts.request_timeout_sec) != 0)
                gp_buf_truncate(out, at); /* (as json_array_append_new dropped a NULL wire) */
            else
                taken++;
        }
        if (n < max)
            break;
        left -= n;
    }
    /* The slots of the jobs being withdrawn go back to the agent (ready
     * with them while its long-poll is parked): a job withdrawn goes to it
     * at once; one that a peer claimed leaves the slot to the next job.
     * They count against this reply's slots, so that one free slot never
     * withdraws every offer queued for the model. */
    if (withdrawing > 0)
        sched_agent_ready(j->sched, a, sched_agent_free_slots(j->sched, a) + withdrawing);
    LIT(out, "]");
    return taken;
}

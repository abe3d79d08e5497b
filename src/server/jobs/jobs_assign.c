/* jobs_assign: a job placed on an agent and handed to it (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

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

/* job was marked assigned to a (mark_assigned) and never reached it: its
 * poll was gone, or the reply meant to carry it could not be written (out
 * of memory: a 500 went instead, and the agent polls again). Nothing
 * records an agent for it then, as if it had never been taken: a's slot
 * comes back with no outcome counted (a job never run is neither a success
 * nor a failure of a), the attempt is not counted, the row says queued
 * again, and it goes back to the head of its queue (it was first in line
 * when a was chosen). Otherwise it would sit assigned to an agent that
 * never got it until a failover, long after. The caller has made a
 * unready first: the job is never handed straight back to the agent that
 * could not take it (depth bounds the retries elsewhere). */
static void unassign_requeue(gps_jobs *j, gps_job *job, int depth)
{
    if (!job->ended_on_agent && job->agent_id[0]) {
        registry_agent *a = registry_get(j->reg, job->agent_id);
        if (a)
            registry_job_undo(j->reg, a);
    }
    job->ended_on_agent = true;
    job->agent_id[0] = '\0';
    job->attempts--;
    job->delivery = 0;
    job->state = GPS_JOB_QUEUED;
    jobs_persist(j, job);
    job->sj.front = true;
    jobs_requeue_or_fail(j, job, depth);
}

/* The scheduler gave job to agent a, whose long-poll is parked: hand it
 * over now. When the long-poll turns out to be gone, or the job's wire
 * cannot be written (out of memory: the poll is answered 500 and the
 * agent polls again), the job goes back to its queue (unassign_requeue). */
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
        sched_agent_unready(j->sched, a); /* (its poll is answered or gone) */
        unassign_requeue(j, job, depth);
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
    if (r == SCHED_ERROR) {
        /* The scheduler ran out of memory for the model's queue (a job
         * placed here is never malformed): the server's own failure, not
         * a fleet without an agent. */
        jobs_fail_job(j, job, 500, "INTERNAL", "out of memory", 0);
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

/* Take up to want queued jobs for a (ready in the scheduler), each marked
 * assigned to it, into jobs[] in the order the scheduler gave them. Offered
 * jobs are withdrawn first (jobs_withdraw_first): their slots stay a's, so
 * that, when nothing is taken, a stays ready with them (a job withdrawn
 * goes to it at once; one that a peer claimed leaves the slot to the next
 * job). They count against want, so that one free slot never withdraws
 * every offer queued for the model. */
static size_t take_jobs(gps_jobs *j, registry_agent *a, size_t want, gps_job **jobs)
{
    size_t n = 0, left = want;
    int withdrawing = 0;
    while (left > 0) {
        sched_job *picked[64];
        size_t max = left < 64 ? left : 64;
        size_t got = sched_dispatch(j->sched, a, picked, max, gp_now_mono_ms());
        for (size_t i = 0; i < got; i++) {
            gps_job *job = (gps_job *)((char *)picked[i] - offsetof(gps_job, sj));
            if (jobs_withdraw_first(j, job, a, false)) {
                withdrawing++;
                continue;
            }
            mark_assigned(j, job, a);
            jobs[n++] = job;
        }
        if (got < max)
            break;
        left -= got;
    }
    if (withdrawing > 0 && n == 0)
        sched_agent_ready(j->sched, a, sched_agent_free_slots(j->sched, a) + withdrawing);
    return n;
}

/* The JSON array of the wire objects of jobs[0..n) into out, as many
 * whole ones as memory allows, in order: returns how many (0: no array). */
static size_t write_wires(gps_jobs *j, gps_job **jobs, size_t n, gp_buf *out)
{
    uint64_t now = gp_now_mono_us();
    size_t k = 0;
    if (LIT(out, "[") < 0)
        return 0;
    for (; k < n; k++) {
        size_t at = out->len;
        if ((k && LIT(out, ",") < 0) ||
            gps_job_wire_append(out, jobs[k], now, j->opts.request_timeout_sec) != 0) {
            gp_buf_truncate(out, at);
            break;
        }
    }
    return k > 0 && LIT(out, "]") == 0 ? k : 0;
}

/* jobs[0..n), taken for a in queue order, were in no reply that went out:
 * back in their queues, still in that order. Each is placed first in line
 * (unassign_requeue), the earliest first, so that an agent ready now gets
 * the earliest it can run (the last first would hand a later job to it
 * and leave the earlier one waiting for the next poll). Those no agent
 * took were each put at the head, ahead of the ones before them: put
 * there again, the last first, so that they wait in their order. (A job
 * ended meanwhile, or on another agent's books, is not this reply's.) */
static void put_back(gps_jobs *j, registry_agent *a, gps_job **jobs, size_t n)
{
    size_t waiting = 0;
    for (size_t i = 0; i < n; i++) {
        gps_job *job = jobs[i];
        if (job->state != GPS_JOB_ASSIGNED || strcmp(job->agent_id, a->id) != 0)
            continue;
        unassign_requeue(j, job, 1);
        if (sched_job_queued(&job->sj))
            jobs[waiting++] = job; /* (reused: this one's slot is behind us) */
    }
    if (waiting < 2)
        return;
    for (size_t i = waiting; i-- > 0;) {
        /* Placing one may have ended or assigned another (a failure's
         * notification, a hand-off): only a job still waiting goes back. */
        if (jobs[i]->state != GPS_JOB_QUEUED || !sched_job_queued(&jobs[i]->sj))
            continue;
        sched_remove(j->sched, &jobs[i]->sj);
        jobs[i]->sj.front = true;
        jobs_place(j, jobs[i], 1);
    }
}

long gps_jobs_hand_out(gps_jobs *j, registry_agent *a, int free_slots, gps_jobs_deliver_fn reply,
                       void *arg)
{
    if (free_slots <= 0)
        return 0;
    if (free_slots > GPS_JOBS_TAKE_MAX)
        free_slots = GPS_JOBS_TAKE_MAX;
    if (sched_agent_ready(j->sched, a, free_slots) < 0) {
        /* (Never parked ready-less, where no job would reach it.) */
        sched_agent_unready(j->sched, a);
        reply(a, NULL, arg);
        return -1;
    }
    /* As many as the agent has free slots, in one reply: a burst reaches an
     * agent in one round trip instead of one per 64 jobs. */
    gps_job *jobs[GPS_JOBS_TAKE_MAX];
    size_t n = take_jobs(j, a, (size_t)free_slots, jobs);
    if (n == 0)
        return 0;
    /* Its poll is answered now; and a job put back below must not go
     * straight back to it. */
    sched_agent_unready(j->sched, a);
    gp_buf text;
    gp_buf_init(&text);
    size_t sent = write_wires(j, jobs, n, &text);
    long long rc = reply(a, sent ? &text : NULL, arg);
    gp_buf_free(&text);
    if (rc < 0 || !sent) {
        rc = -1;
        sent = 0;
    }
    for (size_t i = 0; i < sent; i++)
        jobs[i]->delivery = (uint64_t)rc;
    put_back(j, a, jobs + sent, n - sent);
    return rc < 0 ? -1 : (long)sent;
}

/* gps_jobs_take_for_agent's reply: the text appended to the caller's buffer. */
typedef struct take_text {
    gp_buf *out;
    uint64_t delivery;
} take_text;

static long long append_text(registry_agent *a, const gp_buf *jobs, void *arg)
{
    take_text *t = arg;
    (void)a;
    if (!jobs || gp_buf_append(t->out, jobs->data, jobs->len) < 0)
        return -1;
    return (long long)t->delivery;
}

long gps_jobs_take_for_agent(gps_jobs *j, registry_agent *a, int free_slots, uint64_t delivery,
                             gp_buf *out)
{
    take_text t = {out, delivery};
    size_t at = out->len;
    long n = gps_jobs_hand_out(j, a, free_slots, append_text, &t);
    if (n == 0 && LIT(out, "[]") < 0)
        gp_buf_truncate(out, at);
    return n;
}

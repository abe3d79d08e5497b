/* jobs_failover: failover, token-exact continuation, hand-off to other servers (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/metrics.h"

/* ---- token-exact continuation (docs/architecture.md "Failover") ---- */

/* Forget the generated ids (a requeue without output regenerates all). */
static void ids_reset(gps_job *job)
{
    job->n_gen_ids = 0;
    job->ids_ok = false;
    job->ids_digest[0] = '\0';
}

/* Room for n more ids: 1; 0 when the job keeps none (token-exact
 * continuation ended: an event without ids, or more ids than the request
 * allows); -1 out of memory, nothing changed: the caller refuses the event
 * (its upload is sent again), never a job that quietly continues from
 * text where its ids were token-exact. */
static int ids_room(gps_job *job, size_t n)
{
    if (!job->ids_ok)
        return 0;
    size_t cap = (size_t)(job->spec.max_tokens > 0 ? job->spec.max_tokens : 0) + MAX_TOKENS_SLACK;
    if (job->n_gen_ids + n > cap) {
        job->ids_ok = false;
        return 0;
    }
    if (job->n_gen_ids + n > job->cap_gen_ids) {
        size_t nc = job->cap_gen_ids ? job->cap_gen_ids : 64;
        while (nc < job->n_gen_ids + n)
            nc *= 2;
        int32_t *g = realloc(job->gen_ids, nc * sizeof *g);
        if (!g)
            return -1;
        job->gen_ids = g;
        job->cap_gen_ids = nc;
    }
    return 1;
}

/* jobs_ids_record for a token read without a tree (token_id -1: none). */
long long jobs_ids_record_one(gps_job *job, long long token_id)
{
    if (token_id < 0) {
        job->ids_ok = false;
        return 1;
    }
    int room = ids_room(job, 1);
    if (room < 0)
        return -1;
    if (room)
        job->gen_ids[job->n_gen_ids++] = (int32_t)token_id;
    return 1;
}

/* Keep the ids of a token event: token_ids (every token sampled since the
 * previous event) or token_id. An event without ids, or more ids than the
 * request allows, ends token-exact continuation for the job. Returns the
 * number of tokens the event stands for (>= 1), or -1 out of memory
 * (nothing recorded). */
long long jobs_ids_record(gps_job *job, const json_t *ev)
{
    const json_t *arr = json_object_get(ev, "token_ids");
    const json_t *one = json_object_get(ev, "token_id");
    size_t n = json_is_array(arr) ? json_array_size(arr) : json_is_integer(one) ? 1 : 0;
    if (n == 0) {
        job->ids_ok = false;
        return 1;
    }
    int room = ids_room(job, n);
    if (room <= 0)
        return room < 0 ? -1 : (long long)n;
    for (size_t i = 0; i < n; i++)
        job->gen_ids[job->n_gen_ids++] =
            (int32_t)json_integer_value(json_is_array(arr) ? json_array_get(arr, i) : one);
    return (long long)n;
}

const char *gps_job_ids_digest(const gps_job *job)
{
    return job && job->ids_ok && job->ids_digest[0] ? job->ids_digest : NULL;
}

/* A task resumed after a server restart with its token ids: they become
 * the job's generated ids, as if its earlier attempts had run here
 * (jobs_continuation_plan then picks tokens or text per agent). */
void jobs_resume_ids_take(gps_job *job)
{
    gps_job_spec *s = &job->spec;
    if (!s->resume_ids || !s->n_resume_ids || !s->resume_digest[0])
        return;
    job->gen_ids = s->resume_ids;
    job->n_gen_ids = job->cap_gen_ids = s->n_resume_ids;
    s->resume_ids = NULL;
    s->n_resume_ids = 0;
    job->ids_ok = true;
    snprintf(job->ids_digest, sizeof job->ids_digest, "%s", s->resume_digest);
}

/* Job assigned to agent a: track the digest its ids belong to and decide
 * how this attempt continues earlier output. Fresh output: the ids will
 * be a's. Earlier output: usable only when a serves the same file. */
void jobs_continuation_plan(gps_job *job, registry_agent *a)
{
    const char *d = registry_agent_model_digest(a, job->spec.model);
    bool fresh = job->text.len == 0 && job->n_gen_ids == 0 && job->continued_tokens == 0;
    if (fresh) {
        job->ids_ok = d != NULL;
        gp_copy_str(job->ids_digest, sizeof job->ids_digest, d ? d : "");
    } else if (!d || strcmp(d, job->ids_digest) != 0) {
        job->ids_ok = false;  /* another tokenizer's text follows: for good */
    }
    job->continuation_mode = NULL;
    if (job->continued_tokens > 0)
        job->continuation_mode = job->ids_ok && job->n_gen_ids > 0 ? "tokens" : "text";
}

typedef struct digest_q {
    const gps_job *job;
    sched *s;
    bool need_ready;      /* only agents with a free parked long-poll */
    char found[64];
} digest_q;

static void digest_cb(void *ud, registry_agent *a)
{
    digest_q *q = ud;
    if (q->found[0] || strcmp(a->id, q->job->exclude_agent) == 0)
        return;
    if (a->state != REGISTRY_HEALTHY &&
        (q->need_ready || (a->state != REGISTRY_SUSPECT && a->state != REGISTRY_REGISTERING)))
        return;
    const char *d = registry_agent_model_digest(a, q->job->spec.model);
    if (!d || strcmp(d, q->job->ids_digest) != 0)
        return;
    if (q->need_ready && sched_agent_free_slots(q->s, a) <= 0)
        return;
    snprintf(q->found, sizeof q->found, "%s", a->id);
}

/* An agent (not the lost one) serving the job's model from the file its
 * ids belong to: free right now (need_ready) or just live. O(agents), on
 * a failover only. */
static bool digest_agent(gps_jobs *j, const gps_job *job, bool need_ready, char out[64])
{
    digest_q q = {job, j->sched, need_ready, ""};
    registry_foreach(j->reg, digest_cb, &q);
    snprintf(out, 64, "%s", q.found);
    return q.found[0] != '\0';
}

/* ---- failover (docs/architecture.md "Failover") ---- */

long long gps_failover_backoff_ms(int attempts, int base_ms, int cap_ms, uint32_t rnd)
{
    if (attempts < 2 || base_ms <= 0 || cap_ms <= 0)
        return 0;
    long long d = base_ms;
    for (int i = 2; i < attempts && d < cap_ms; i++)
        d *= 2;
    if (d > cap_ms)
        d = cap_ms;
    long long half = d / 2;
    return half + (long long)(rnd % (uint32_t)(d - half + 1));
}

gps_fo_plan gps_failover_decide(const gps_fo_facts *f)
{
    gps_fo_plan p = {GPS_FO_FAIL_LOST, -1, 0};
    bool cont = f->output_sent && f->mode == GPS_FAILOVER_CONTINUE;
    /* Tool call pieces already went to the subscribers (who may have
     * buffered them even when the client saw nothing): neither a text
     * continuation nor a restart could avoid a broken or repeated call. */
    if (f->mode == GPS_FAILOVER_ERROR || (f->output_sent && !cont) || f->tools_relayed)
        return p;
    if (f->attempts >= f->max_attempts) {
        p.action = GPS_FO_FAIL_EXHAUSTED;
        return p;
    }
    p.action = cont ? GPS_FO_CONTINUE : GPS_FO_REQUEUE;
    if (!f->model_live && f->fallback_live >= 0)
        p.fallback = f->fallback_live;
    p.delay_ms = gps_failover_backoff_ms(f->attempts, f->backoff_base_ms, f->backoff_cap_ms,
                                         f->rnd);
    return p;
}

typedef struct other_agent_q {
    const char *model;
    const char *exclude;
    const gps_job *job;   /* NULL: any agent serving model counts */
    const char *job_exclude; /* the job's own excluded agent, where it still holds */
    bool with_suspect;
    bool found;
} other_agent_q;

static bool labels_held(const registry_agent *a, const gps_job *job)
{
    for (size_t i = 0; i < job->sj.n_labels; i++) {
        const char *v = registry_agent_label(a, job->sj.labels[i].key);
        if (!v || strcmp(v, job->sj.labels[i].value) != 0)
            return false;
    }
    return true;
}

/* Could a run job as model, readiness aside: what the scheduler asks of an
 * agent for it (sched.c agent_fits: tools, embeddings or generation for the
 * model, the job's labels). An agent serving the model without what the
 * job needs never gets it, so it must not keep the job from its fallback.
 * A strict prefer_agent is not looked at (the scheduler's default for it
 * is its own). */
static bool agent_takes_job(const registry_agent *a, const gps_job *job, const char *model)
{
    const sched_job *sj = &job->sj;
    if (sj->needs_tools && !registry_agent_takes_tools(a, model))
        return false;
    if (sj->needs_embeddings && !registry_agent_takes_embeddings(a, model))
        return false;
    if (sj->needs_generation && !registry_agent_generates(a, model))
        return false;
    return labels_held(a, job);
}

static void other_agent_cb(void *ud, registry_agent *a)
{
    other_agent_q *q = ud;
    if (!q->found && (!q->exclude || strcmp(a->id, q->exclude) != 0) &&
        (!q->job_exclude || strcmp(a->id, q->job_exclude) != 0) &&
        (a->state == REGISTRY_HEALTHY || a->state == REGISTRY_REGISTERING ||
         (q->with_suspect && a->state == REGISTRY_SUSPECT)) &&
        registry_agent_serves(a, q->model) && (!q->job || agent_takes_job(a, q->job, q->model)))
        q->found = true;
}

/* True when an agent other than exclude that can take work now (healthy,
 * registering) serves model for job (NULL: for any job): what moving a
 * job to a fallback model asks, on both sides (its model lost, a fallback
 * live). A SUSPECT agent does not count: an agent killed a moment ago
 * stays suspect until its heartbeat expires, and must not keep a job from
 * its fallback. job_exclude: the agent a queued job excludes (its earlier
 * attempt's), which the scheduler never gives it to; NULL where that
 * exclusion is about to change (a failover: exclude is the new one).
 * O(agents), on a failover or an agent's leaving only. */
static bool model_live_for(gps_jobs *j, const char *model, const char *exclude,
                           const gps_job *job, const char *job_exclude)
{
    other_agent_q q = {model, exclude, job, job_exclude, false, false};
    registry_foreach(j->reg, other_agent_cb, &q);
    return q.found;
}

static bool model_live(gps_jobs *j, const char *model, const char *exclude)
{
    return model_live_for(j, model, exclude, NULL, NULL);
}

/* Suspect agents count here: an agent's own upstream error fails over
 * only while another agent that may still be alive serves the model. */
bool jobs_other_agent_live(gps_jobs *j, const gps_job *job, const char *exclude)
{
    other_agent_q q = {job->spec.model, exclude, NULL, NULL, true, false};
    registry_foreach(j->reg, other_agent_cb, &q);
    return q.found;
}

/* The first model of job's chain, other than the one it runs on, that a
 * live agent (not exclude, nor job_exclude) can run job on: its chain
 * index, or -1. */
static int fallback_live_for(gps_jobs *j, const gps_job *job, const char *exclude,
                             const char *job_exclude)
{
    for (size_t i = 0; i < job->n_chain; i++)
        if (strcmp(job->chain[i], job->spec.model) != 0 &&
            model_live_for(j, job->chain[i], exclude, job, job_exclude))
            return (int)i;
    return -1;
}

int jobs_fallback_live(gps_jobs *j, const gps_job *job, const char *exclude)
{
    return fallback_live_for(j, job, exclude, NULL);
}

/* Make chain[idx] the model that serves job: it swaps places with
 * spec.model (as at submit), and requested_model names the model asked
 * for while another one serves. */
static void switch_model(gps_job *job, size_t idx)
{
    char *to = job->chain[idx];
    for (size_t i = 0; i < job->spec.n_fallback; i++) {
        if (job->spec.fallback_models[i] == to) {
            job->spec.fallback_models[i] = job->spec.model;
            job->spec.model = to;
            break;
        }
    }
    job->sj.model = job->spec.model;
    job->requested_model = job->chain[0] == job->spec.model ? NULL : job->chain[0];
}

/* Place a failover retry: prefer a free agent serving the file the job's
 * ids come from (token-exact), without waiting for one: a non-strict
 * preference for this placement only. */
static void retry_place(gps_jobs *j, gps_job *job)
{
    char same[64] = "";
    if (job->continued_tokens > 0 && job->ids_ok && job->n_gen_ids > 0)
        digest_agent(j, job, true, same);
    const char *pref = job->sj.prefer_agent;
    int strict = job->sj.prefer_strict;
    if (same[0] && strict != 1 && (!pref || strcmp(pref, job->exclude_agent) == 0)) {
        job->sj.prefer_agent = same;
        job->sj.prefer_strict = 0;
    }
    jobs_requeue_or_fail(j, job, 0);
    job->sj.prefer_agent = pref;
    job->sj.prefer_strict = strict;
}

static void log_fallback(const gps_job *job, const char *from, const char *when)
{
    gp_log_write(GP_LOG_WARN, "job_fallback", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:s}", "job_id", job->id, "from_model", from,
                           "model", job->spec.model, "when", when),
                 "no live agent can run the job under its model; moving it to a fallback model");
}

/* The backoff is over: place the retry, first moving the job to a
 * fallback model if its own lost every live agent meanwhile. */
static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_job *job = arg;
    gps_jobs *j = job->owner;
    job->in_backoff = false;
    if (gps_job_terminal(job))
        return;
    /* The backoff is queue time for the client (x_pool_meta.queue_ms). */
    uint64_t now = gp_now_mono_us();
    if (now > job->queued_since_us)
        job->queue_ms += (long long)((now - job->queued_since_us) / 1000);
    if (job->n_chain > 1 &&
        !model_live_for(j, job->spec.model, job->exclude_agent, job, NULL)) {
        int fb = jobs_fallback_live(j, job, job->exclude_agent);
        if (fb >= 0) {
            const char *from = job->spec.model;
            switch_model(job, (size_t)fb);
            log_fallback(job, from, "backoff");
        }
    }
    retry_place(j, job);
}

/* Retry job after delay_ms (0: now). Meanwhile it is QUEUED outside the
 * scheduler: queue_timeout, request_timeout and cancellation apply as to
 * any queued job (jobs_finish stops the timer). */
static void retry_after(gps_jobs *j, gps_job *job, long long delay_ms)
{
    if (delay_ms > 0 && j->base && !job->retry_ev)
        job->retry_ev = evtimer_new(j->base, retry_cb, job);
    if (delay_ms <= 0 || !job->retry_ev) {
        retry_place(j, job);
        return;
    }
    struct timeval tv = {(time_t)(delay_ms / 1000), (suseconds_t)(delay_ms % 1000) * 1000};
    job->state = GPS_JOB_QUEUED;
    job->queued_since_us = gp_now_mono_us();
    if (evtimer_add(job->retry_ev, &tv) < 0) {
        retry_place(j, job);
        return;
    }
    job->in_backoff = true;
}

static void remote_fail_over(gps_jobs *j, gps_job *job, const char *why);

/* The agent (or, for a handed-off job, the server) running the job was
 * lost and the job is not tried again: 502 AGENT_LOST. */
static void fail_lost(gps_jobs *j, gps_job *job, const char *runner, const char *why)
{
    char m[200];
    snprintf(m, sizeof m, "the %s running this job was lost (%s)%s", runner, why,
             job->client_saw_output ? " after output was sent" : "");
    jobs_count(j, "failovers_total", "mode=\"error\"", 1);
    jobs_fail_job(j, job, 502, "AGENT_LOST", m, 0);
}

/* A requeue: the attempt's output was never seen by the client, so it is
 * dropped and the next agent starts the reply afresh. */
static void discard_output(gps_job *job)
{
    job->agent_id[0] = '\0';
    gp_buf_truncate(&job->text, 0);
    job->text_resets++;
    job->completion_tokens = 0;
    job->continued_tokens = 0;
    job->first_token_us = 0;
    job->agent_seq = 0;
    ids_reset(job);
}

/* The job's agent is gone (dead, stalled, shut down, its upstream failed).
 * gps_failover_decide says what follows, from spec.failover, whether the
 * client already got output, the attempts and which models still have a
 * live agent:
 *   nothing sent, mode continue|restart: a transparent requeue; text the
 *     server alone had seen is dropped and regenerated;
 *   output sent, mode continue: a requeue with continuation = the text so
 *     far (relayed or held back alike: the job's text is exactly what the
 *     dialects were given), so the next agent produces only what follows
 *     and subscribers see one stream; a `failover` event tells them;
 *   otherwise (mode error, restart after output): AGENT_LOST.
 * Every retry excludes the lost agent, goes to the front of its queue and
 * counts against max_attempts; from the second on it waits a backoff; it
 * moves to a fallback model when no live agent serves the job's model. */
void jobs_fail_over(gps_jobs *j, gps_job *job, const char *why)
{
    if (job->state != GPS_JOB_ASSIGNED && job->state != GPS_JOB_RUNNING)
        return;
    if (job->remote) {
        remote_fail_over(j, job, why);
        return;
    }
    jobs_end_on_agent(j, job, false);
    jobs_cancel_add(j, job->agent_id, job->id);
    if (j->metrics)
        gps_metrics_attempt_lost(j->metrics, why);
    gps_fo_facts f = {
        .mode = job->spec.failover,
        .output_sent = job->client_saw_output,
        .tools_relayed = job->tool_bytes > 0,
        .attempts = job->attempts,
        .max_attempts = j->opts.max_attempts,
        .fallback_live = -1,
        .backoff_base_ms = j->opts.backoff_base_ms,
        .backoff_cap_ms = j->opts.backoff_cap_ms,
    };
    f.model_live = model_live_for(j, job->spec.model, job->agent_id, job, NULL);
    if (!f.model_live && job->n_chain > 1)
        f.fallback_live = jobs_fallback_live(j, job, job->agent_id);
    gp_random_bytes(&f.rnd, sizeof f.rnd);
    gps_fo_plan p = gps_failover_decide(&f);
    if (p.action == GPS_FO_FAIL_LOST) {
        fail_lost(j, job, "agent", why);
        return;
    }
    if (p.action == GPS_FO_FAIL_EXHAUSTED) {
        jobs_count(j, "failovers_total", "mode=\"exhausted\"", 1);
        jobs_fail_job(j, job, 503, "AGENT_LOST",
                      "the job's agents were lost; attempts exhausted", 1);
        return;
    }
    bool cont = p.action == GPS_FO_CONTINUE;
    const char *from_model = job->spec.model;
    if (p.fallback >= 0)
        switch_model(job, (size_t)p.fallback);
    gp_log_write(GP_LOG_WARN, "job_failover", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:i,s:s,s:I,s:s,s:I}", "job_id", job->id, "agent_id",
                           job->agent_id, "reason", why, "attempt", job->attempts, "mode",
                           cont ? "continue" : "requeue", "completion_tokens",
                           (json_int_t)job->completion_tokens, "model", job->spec.model,
                           "backoff_ms", (json_int_t)p.delay_ms),
                 cont ? "agent lost after output was sent; continuing on another agent"
                      : "agent lost before output reached the client; requeueing");
    if (p.fallback >= 0)
        log_fallback(job, from_model, "failover");
    jobs_count(j, "failovers_total", cont ? "mode=\"continue\"" : "mode=\"requeue\"", 1);
    snprintf(job->exclude_agent, sizeof job->exclude_agent, "%s", job->agent_id);
    job->sj.exclude_agent = job->exclude_agent;
    job->sj.front = true;
    if (cont) {
        job->continued_tokens = job->completion_tokens;
        /* tokens when the ids are usable and an agent with the same file
         * is live to take them (preferred by retry_place when free). */
        char same[64];
        bool tokens = job->ids_ok && job->n_gen_ids > 0 && digest_agent(j, job, false, same);
        json_t *ev = json_pack("{s:s,s:s,s:s,s:i,s:I,s:s}", "type", "failover", "from_agent",
                               job->agent_id, "reason", why, "attempt", job->attempts + 1,
                               "completion_tokens", (json_int_t)job->completion_tokens,
                               "continuation", tokens ? "tokens" : "text");
        if (ev && p.fallback >= 0 && /* the model that continues the stream */
            json_object_set_new(ev, "model", json_string(job->spec.model)) != 0) {
            json_decref(ev);
            ev = NULL;
        }
        if (!ev && jobs_wants_tree(job)) {
            /* A subscriber that reads the event (a native task's stream
             * numbers it, and tells its client that the tokens after it
             * continue the text) would go on without it: the job fails
             * instead, the server's own failure. The cursor subscribers
             * (the relay) take no failover event. */
            jobs_fail_job(j, job, 500, "INTERNAL", "out of memory", 0);
            return;
        }
        job->agent_id[0] = '\0';
        job->agent_seq = 0;
        /* Subscribers may not cancel here (they have nothing to say yet),
         * but if one does, the job is terminal and stays so. */
        jobs_notify(j, job, GPS_EV_FAILOVER, ev);
        json_decref(ev);
        if (gps_job_terminal(job))
            return;
    } else {
        discard_output(job);
    }
    retry_after(j, job, p.delay_ms);
}

/* ---- hand-off to another server (docs/scaling.md 3e) ---- */

void gps_jobs_set_handoff(gps_jobs *j, const gps_jobs_handoff *h)
{
    if (h)
        j->handoff = *h;
    else
        memset(&j->handoff, 0, sizeof j->handoff);
}

const json_t *gps_jobs_peer_models(gps_jobs *j)
{
    return j->handoff.peer_models ? j->handoff.peer_models(j->handoff.arg) : NULL;
}

bool gps_job_remote(const gps_job *job) { return job->remote; }

json_t *gps_job_constraints(const gps_job *job)
{
    static const char *const modes[] = {"continue", "restart", "error"};
    /* Whole or NULL: constraints short of a label or a fallback model
     * lost to out of memory would let another server run the job on an
     * agent its labels exclude. jansson's failed allocations are counted
     * (gp_json.h); any during the build gives none. */
    gp_json_init();
    unsigned long failed = gp_json_alloc_failures();
    const gps_job_spec *s = &job->spec;
    json_t *c = json_object(), *labels = json_object(), *fb = json_array();
    if (!c || !labels || !fb)
        goto err;
    for (size_t i = 0; i < s->n_labels; i++)
        json_object_set_new(labels, s->labels[i].key, json_string(s->labels[i].value));
    for (size_t i = 0; i < job->n_chain; i++)
        if (job->chain[i] != s->model)
            json_array_append_new(fb, json_string(job->chain[i]));
    if (json_object_size(labels))
        json_object_set(c, "labels", labels);
    if (json_array_size(fb))
        json_object_set(c, "fallback_models", fb);
    if (s->prefer_agent)
        json_object_set_new(c, "prefer_agent", json_string(s->prefer_agent));
    if ((size_t)s->failover < sizeof modes / sizeof modes[0])
        json_object_set_new(c, "failover", json_string(modes[s->failover]));
    json_object_set_new(c, "needs_tools", json_boolean(job->sj.needs_tools));
    json_object_set_new(c, "needs_embeddings", json_boolean(job->sj.needs_embeddings));
    json_object_set_new(c, "needs_generation", json_boolean(job->sj.needs_generation));
    if (gp_json_alloc_failures() != failed)
        goto err;
    json_decref(labels);
    json_decref(fb);
    return c;
err:
    json_decref(c);
    json_decref(labels);
    json_decref(fb);
    return NULL;
}

int gps_jobs_remote_assign(gps_jobs *j, gps_job *job, const char *server_id)
{
    if (job->offered && job->state == GPS_JOB_QUEUED && server_id) {
        /* A peer claimed it first: it leaves this server's queue (or, while
         * its withdraw is under way, the answer will be "claimed"). */
        sched_remove(j->sched, &job->sj);
        job->offered = false;
        job->remote = true;
    }
    if (!job->remote || job->state != GPS_JOB_QUEUED || !server_id)
        return -1;
    uint64_t now = gp_now_mono_us();
    if (job->queued_since_us && now > job->queued_since_us)
        job->queue_ms += (long long)((now - job->queued_since_us) / 1000);
    job->state = GPS_JOB_ASSIGNED;
    job->attempts++;
    snprintf(job->agent_id, sizeof job->agent_id, "%s", server_id);
    job->model_digest[0] = '\0';
    job->assigned_us = job->last_event_us = now;
    job->ended_on_agent = true; /* no agent of this server's registry to end */
    job->progress_done = job->progress_total = 0;
    job->agent_seq = 0;
    job->agent_bytes = 0;
    job->metrics_relayed = 0;
    gp_log_write(GP_LOG_INFO, "job_handoff_claimed", job->correlation_id,
                 json_pack("{s:s,s:s,s:i}", "job_id", job->id, "server_id", server_id,
                           "attempt", job->attempts),
                 "job claimed by server %s", server_id);
    jobs_persist(j, job);
    return 0;
}

/* A job offered again after its claimer's loss goes back into this
 * server's queue too when an agent here can take or queue it (it waited
 * here when first offered, or an agent for its model came since): the
 * first of a claim and a local agent takes it, as at submit. Else it stays
 * remote, offered only. */
static void requeue_offered(gps_jobs *j, gps_job *job)
{
    if (!j->handoff.withdraw)
        return;
    registry_agent *a = NULL;
    job->sj.agent = NULL;
    job->sj.front = true;
    sched_result r = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
    if (r != SCHED_ASSIGNED && r != SCHED_QUEUED)
        return;
    job->remote = false;
    job->offered = true;
    if (r == SCHED_ASSIGNED && a && !jobs_withdraw_first(j, job, a, true))
        jobs_deliver_to(j, job, a, 1);
}

/* The claimer of a remote job is gone (or stalled): offered again while
 * its client saw nothing, else the job ends as after a lost agent. */
static void remote_fail_over(gps_jobs *j, gps_job *job, const char *why)
{
    if (j->metrics)
        gps_metrics_attempt_lost(j->metrics, why);
    /* Offered again only when the claimer's row went back to waiting
     * (the follower saw it: "server_lost"); a stall here leaves the row
     * claimed by a server that may still write: the job ends. */
    if (job->client_saw_output || job->tool_bytes > 0 ||
        job->spec.failover == GPS_FAILOVER_ERROR || strcmp(why, "server_lost") != 0) {
        fail_lost(j, job, "server", why);
        return;
    }
    if (job->attempts >= j->opts.max_attempts) {
        jobs_count(j, "failovers_total", "mode=\"exhausted\"", 1);
        jobs_fail_job(j, job, 503, "AGENT_LOST",
                      "the job's servers were lost; attempts exhausted", 1);
        return;
    }
    gp_log_write(GP_LOG_WARN, "job_failover", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:i,s:s}", "job_id", job->id, "agent_id", job->agent_id,
                           "reason", why, "attempt", job->attempts, "mode", "handoff"),
                 "the server running this job was lost before output reached the client; "
                 "offered again");
    jobs_count(j, "failovers_total", "mode=\"requeue\"", 1);
    discard_output(job);
    job->state = GPS_JOB_QUEUED;
    job->queued_since_us = gp_now_mono_us();
    jobs_persist(j, job);
    requeue_offered(j, job);
}

void gps_jobs_remote_lost(gps_jobs *j, gps_job *job, const char *why)
{
    if (job->remote)
        jobs_fail_over(j, job, why);
}

/* The slot an agent kept for a job that went elsewhere meanwhile (a peer
 * claimed it, or it ended) takes the next job queued for that agent, while
 * its long-poll is parked: otherwise the agent would wait there for its
 * poll's timeout with work queued for it. */
static void refill(gps_jobs *j, const char *agent_id)
{
    registry_agent *a = registry_get(j->reg, agent_id);
    sched_job *picked[1];
    if (!a || sched_agent_free_slots(j->sched, a) <= 0 ||
        sched_dispatch(j->sched, a, picked, 1, gp_now_mono_ms()) != 1)
        return;
    gps_job *job = (gps_job *)((char *)picked[0] - offsetof(gps_job, sj));
    if (!jobs_withdraw_first(j, job, a, true))
        jobs_deliver_to(j, job, a, 1);
}

void gps_jobs_offer_withdrawn(gps_jobs *j, gps_job *job, bool withdrawn)
{
    if (!job->withdrawing)
        return;
    job->withdrawing = false;
    if (!job->remote && job->state == GPS_JOB_QUEUED) {
        job->offered = false;
        if (withdrawn) {
            jobs_place(j, job, 0);
            return;
        }
        job->remote = true; /* a peer's claim came first: the follower assigns it */
    }
    /* (else the follower saw the claim first, or the job ended) */
    refill(j, job->withdraw_agent);
}

/* ---- lost agents, and what an agent reports it runs ---- */

/* Queued job (in the scheduler) moves to the first model of its chain
 * that a live agent other than exclude serves, as a failover would: false
 * when none does (it stays queued). */
static bool move_queued(gps_jobs *j, gps_job *job, const char *exclude)
{
    int fb = fallback_live_for(j, job, exclude, job->sj.exclude_agent);
    if (fb < 0)
        return false;
    sched_remove(j->sched, &job->sj);
    uint64_t now = gp_now_mono_us();
    if (now > job->queued_since_us)
        job->queue_ms += (long long)((now - job->queued_since_us) / 1000);
    const char *from = job->spec.model;
    switch_model(job, (size_t)fb);
    log_fallback(job, from, "queued");
    retry_place(j, job);
    return true;
}

/* Jobs waiting in the queue of a model whose last live agent was agent_id
 * (a failover retry queued while another agent of its model was busy, a
 * job queued at submit) move to the first model of their chain with a live
 * agent, as a failover would. Only jobs with fallback_models are looked at
 * (O(jobs), plus O(agents) per such job). */
static void move_stranded(gps_jobs *j, const char *agent_id)
{
    gps_job *next;
    for (gps_job *job = j->head; job; job = next) {
        next = job->next; /* retry_place may finish job (finished list) */
        if (job->state != GPS_JOB_QUEUED || job->held || job->in_backoff ||
            job->n_chain < 2 || !sched_job_queued(&job->sj) ||
            model_live_for(j, job->spec.model, agent_id, job, job->sj.exclude_agent))
            continue;
        move_queued(j, job, agent_id);
    }
}

static gps_job *of_sched(sched_job *sj)
{
    return sj ? (gps_job *)((char *)sj - offsetof(gps_job, sj)) : NULL;
}

/* Is name still served for job, agent_id left out? Jobs that differ only
 * in what they need of an agent (no labels, no excluded agent of their
 * own) share one answer per walk: memo[their needs], -1 not asked yet. */
static bool name_live_for(gps_jobs *j, const char *name, const char *agent_id,
                          const gps_job *job, signed char memo[8])
{
    const sched_job *sj = &job->sj;
    if (sj->n_labels > 0 || (sj->exclude_agent && sj->exclude_agent[0]))
        return model_live_for(j, name, agent_id, job, sj->exclude_agent);
    int k = (sj->needs_tools ? 1 : 0) | (sj->needs_embeddings ? 2 : 0) |
            (sj->needs_generation ? 4 : 0);
    if (memo[k] < 0)
        memo[k] = model_live_for(j, name, agent_id, job, NULL) ? 1 : 0;
    return memo[k] > 0;
}

/* The queue of name (a model id or alias agent_id served; agent_id NULL:
 * a name no agent's list holds any more, every agent counts): its jobs
 * with a fallback that no other live agent can run as name move
 * (move_queued). "Can run" is the scheduler's: a job that carries tools
 * counts only agents taking tools for name, a job with labels only agents
 * with them, so a tools job moves while an agent without tools still
 * serves name. tools_only: name is still listed but lost a tools-taking
 * agent, only jobs with tools are looked at. A moved job lands under a
 * model it can run on, never back in this queue, and a job that stays is
 * passed over. Should placing or failing one job take the next out of the
 * queue too (a subscriber's doing), the walk starts over from the head.
 * O(queue + agents per distinct need), on these rare changes only. */
static void move_name(gps_jobs *j, const char *name, const char *agent_id, bool tools_only)
{
    bool any = model_live(j, name, agent_id); /* false: no job's answer can be yes */
    signed char memo[8];
    memset(memo, -1, sizeof memo);
    for (int p = 0; p < SCHED_PRIORITY_COUNT; p++) {
        sched_job *sj = sched_queue_first(j->sched, name, (sched_priority)p);
        while (sj) {
            sched_job *next = sched_queue_next(sj);
            gps_job *job = of_sched(sj);
            if (job->n_chain > 1 && (!tools_only || sj->needs_tools) &&
                (!any || !name_live_for(j, name, agent_id, job, memo)) &&
                move_queued(j, job, agent_id) && next && !sched_job_queued(next))
                next = sched_queue_first(j->sched, name, (sched_priority)p);
            sj = next;
        }
    }
}

void gps_jobs_agent_leaving(gps_jobs *j, const char *agent_id)
{
    registry_agent *a = registry_get(j->reg, agent_id);
    if (!a)
        return;
    /* Every name a served has its own queue (jobs queue under the name
     * they asked for); a's models cannot change during the walk (no
     * heartbeat runs inside it). */
    for (size_t i = 0; i < a->n_models; i++) {
        const registry_model_info *m = &a->models[i];
        for (size_t k = 0; k <= m->n_aliases; k++)
            move_name(j, k == 0 ? m->id : m->aliases[k - 1], agent_id, false);
    }
}

static void dropped_cb(void *ud, registry_agent *a, const char *name, bool tools_only)
{
    (void)a;
    /* a no longer lists name (or no longer takes tools for it): no
     * exclusion, a may well serve the fallback itself (it unloaded one
     * model of two), or name for jobs without tools. */
    move_name(ud, name, NULL, tools_only);
}

void gps_jobs_models_dropped(gps_jobs *j, const char *agent_id)
{
    registry_agent *a = registry_get(j->reg, agent_id);
    if (a)
        registry_models_dropped(j->reg, a, dropped_cb, j);
}

void gps_jobs_agent_lost(gps_jobs *j, const char *agent_id, const char *why)
{
    /* jobs_fail_over may place a job on another agent but never frees one; it
     * may finish it, which moves it to the finished list: take the next
     * live job first. */
    gps_job *next;
    for (gps_job *job = j->head; job; job = next) {
        next = job->next;
        if ((job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING) &&
            strcmp(job->agent_id, agent_id) == 0)
            jobs_fail_over(j, job, why);
    }
    move_stranded(j, agent_id);
}

static bool on_agent(const gps_job *job, const char *agent_id)
{
    return (job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING) &&
           strcmp(job->agent_id, agent_id) == 0;
}

size_t gps_jobs_agent_assigned(gps_jobs *j, const char *agent_id)
{
    size_t n = 0;
    for (gps_job *job = j->head; job; job = job->next)
        n += on_agent(job, agent_id);
    return n;
}

size_t gps_jobs_agent_report(gps_jobs *j, const char *agent_id, const json_t *running,
                             uint64_t seen)
{
    if (!json_is_array(running))
        return 0;
    uint64_t now = gp_now_mono_us();
    size_t ended = 0;
    /* Every listed job that exists is stamped with this report's number (a
     * lookup in the job table per id, nothing allocated: a set of up to
     * 1,024 ids built per poll cost a malloc per id); a job of the agent's
     * without the stamp was not listed. */
    uint64_t stamp = ++j->report_stamp;
    size_t i;
    const json_t *v;
    json_array_foreach(running, i, v) {
        const char *s = json_string_value(v);
        gps_job *job = s ? gps_jobs_find(j, s) : NULL;
        if (job)
            job->report_mark = stamp;
    }
    /* As in gps_jobs_agent_lost: jobs_fail_over may move job to the finished
     * list, so the next live job is taken first. */
    gps_job *next;
    for (gps_job *job = j->head; job; job = next) {
        next = job->next;
        if (!on_agent(job, agent_id))
            continue;
        if (job->report_mark == stamp) {
            job->last_event_us = now;
            continue;
        }
        /* Delivered in a reply the agent had processed before it made the
         * list, and not in it: the agent no longer has the job. */
        if (job->delivery && seen && job->delivery <= seen) {
            jobs_fail_over(j, job, "agent_dropped_job");
            ended++;
        }
    }
    return ended;
}

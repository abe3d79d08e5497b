/* jobs: the job table, its subscribers and cancellation records, timers, accessors (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/auth/limits.h"
#include "server/metrics.h"

/* At the first sweep after a finished job is no longer read it is freed,
 * and its done_rec answers a late upload from its agent for this long
 * (cancel:true, or 409 from another agent); after that the upload gets 404
 * JOB_NOT_FOUND, which stops the job on the agent just the same. */
#define KEEP_TERMINAL_US (60ull * 1000000ull)
#define CANCEL_KEEP_US (600ull * 1000000ull)
#define SWEEP_MS 250

typedef struct gps_job_sub {
    gps_job_event_fn fn;
    void *arg;
    bool dead;
    bool cursor; /* reads token text from the job's text: token events come without a tree */
    struct gps_job_sub *next;
} gps_job_sub;

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

const char *gps_job_state_name(gps_job_state s)
{
    static const char *n[] = {"queued", "assigned", "running", "done", "failed", "cancelled"};
    return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "unknown";
}

const char *gps_job_kind_name(gps_job_kind k)
{
    static const char *n[] = {"completion", "chat", "count_tokens", "embeddings"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "completion";
}

gps_event_type gps_event_type_parse(const char *s)
{
    /* Name -> type pairs rather than an index: GPS_EV_FAILOVER is made by
     * the server only, so an agent's "failover" event stays UNKNOWN. */
    static const struct {
        const char *name;
        gps_event_type type;
    } n[] = {{"started", GPS_EV_STARTED}, {"token", GPS_EV_TOKEN}, {"metrics", GPS_EV_METRICS},
             {"end", GPS_EV_END},         {"error", GPS_EV_ERROR},
             {"tool_call", GPS_EV_TOOL_CALL}, {"embedding", GPS_EV_EMBEDDING}};
    for (size_t i = 0; s && i < sizeof n / sizeof n[0]; i++)
        if (strcmp(s, n[i].name) == 0)
            return n[i].type;
    return GPS_EV_UNKNOWN;
}

void gps_job_spec_clear(gps_job_spec *s)
{
    free(s->model);
    free(s->prompt);
    json_decref(s->messages);
    json_decref(s->input);
    json_decref(s->tools);
    json_decref(s->tool_choice);
    json_decref(s->response_format);
    json_decref(s->stop);
    free(s->user);
    free(s->prefer_agent);
    free(s->session);
    free(s->tenant_sub);
    free(s->resume_id);
    free(s->resume_text);
    free(s->resume_ids);
    json_decref(s->stored_request);
    for (size_t i = 0; i < s->n_fallback; i++)
        free(s->fallback_models[i]);
    for (size_t i = 0; i < s->n_labels; i++) {
        free(s->labels[i].key);
        free(s->labels[i].value);
    }
    free(s->labels);
    const char *api = s->api;
    memset(s, 0, sizeof *s);
    s->api = api;
}

bool gps_job_terminal(const gps_job *job)
{
    return job->state == GPS_JOB_DONE || job->state == GPS_JOB_FAILED ||
           job->state == GPS_JOB_CANCELLED;
}

static uint32_t id_hash(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a 32 */
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 16777619u;
    return h;
}

static unsigned bucket_of(const char *id)
{
    return id_hash(id) % NBUCKETS;
}

gps_job *gps_jobs_find(gps_jobs *j, const char *id)
{
    for (gps_job *x = j->buckets[bucket_of(id)]; x; x = x->hnext)
        if (strcmp(x->id, id) == 0)
            return x;
    return NULL;
}

void jobs_table_insert(gps_jobs *j, gps_job *job)
{
    unsigned b = bucket_of(job->id);
    job->hnext = j->buckets[b];
    j->buckets[b] = job;
    job->next = j->head;
    job->prev = NULL;
    if (j->head)
        j->head->prev = job;
    j->head = job;
}

static bool has_live_subs(const gps_job *job);

/* Take job out of the list it is on (live or finished). */
static void list_unlink(gps_jobs *j, gps_job *job)
{
    gps_job **head = job->done ? &j->done_head : &j->head;
    if (job->prev)
        job->prev->next = job->next;
    else if (*head == job)
        *head = job->next;
    if (job->next)
        job->next->prev = job->prev;
    else if (job->done && j->done_tail == job)
        j->done_tail = job->prev;
    if (job->done)
        j->n_done--;
    job->prev = job->next = NULL;
}

/* A job became terminal: from the live list to the end of the finished one. */
void jobs_list_to_done(gps_jobs *j, gps_job *job)
{
    if (job->done)
        return;
    list_unlink(j, job);
    job->done = true;
    job->prev = j->done_tail;
    if (j->done_tail)
        j->done_tail->next = job;
    else
        j->done_head = job;
    j->done_tail = job;
    j->n_done++;
}

static void table_remove(gps_jobs *j, gps_job *job)
{
    gps_job **pp = &j->buckets[bucket_of(job->id)];
    while (*pp && *pp != job)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = job->hnext;
    list_unlink(j, job);
}

static unsigned rbucket_of(const char *id)
{
    return id_hash(id) % NRBUCKETS;
}

done_rec *jobs_done_rec_find(gps_jobs *j, const char *id)
{
    for (done_rec *r = j->rbuckets[rbucket_of(id)]; r; r = r->hnext)
        if (strcmp(r->id, id) == 0)
            return r;
    return NULL;
}

bool gps_jobs_find_record(gps_jobs *j, const char *id, gps_job_state *state, char *agent_id,
                          size_t agent_len)
{
    const done_rec *r = jobs_done_rec_find(j, id);
    if (!r)
        return false;
    *state = r->state;
    snprintf(agent_id, agent_len, "%s", r->agent_id);
    return true;
}

/* Free the oldest record. */
static void done_rec_drop_oldest(gps_jobs *j)
{
    done_rec *r = j->rhead;
    j->rhead = r->next;
    if (!j->rhead)
        j->rtail = NULL;
    done_rec **pp = &j->rbuckets[rbucket_of(r->id)];
    while (*pp != r)
        pp = &(*pp)->hnext;
    *pp = r->hnext;
    free(r);
    j->n_recs--;
}

/* A finished job nobody reads any more (its client has its answer; no
 * native task replays it from memory): free it, keeping its done_rec from
 * now.
 * Without memory for the record the late upload gets 404, which stops
 * the job on its agent just the same. */
static void retire(gps_jobs *j, gps_job *job, uint64_t now)
{
    done_rec *r = malloc(sizeof *r);
    if (r) {
        memcpy(r->id, job->id, sizeof r->id);
        snprintf(r->agent_id, sizeof r->agent_id, "%s", job->agent_id);
        r->state = job->state;
        r->retired_us = now; /* in this order on the list (done_recs_expire) */
        unsigned b = rbucket_of(r->id);
        r->hnext = j->rbuckets[b];
        j->rbuckets[b] = r;
        r->next = NULL;
        if (j->rtail)
            j->rtail->next = r;
        else
            j->rhead = r;
        j->rtail = r;
        j->n_recs++;
        if (j->n_recs > j->opts.max_records) /* memory bounded whatever the rate */
            done_rec_drop_oldest(j);
    }
    table_remove(j, job);
    jobs_job_free(job);
}

/* Free the records older than KEEP_TERMINAL_US (all: when now is 0). */
static void done_recs_expire(gps_jobs *j, uint64_t now)
{
    while (j->rhead && (!now || now - j->rhead->retired_us > KEEP_TERMINAL_US))
        done_rec_drop_oldest(j);
}

/* Give back what the job held against its key's daily budget (once). */
void jobs_release_reservation(gps_job *job)
{
    if (job->reserved_tokens > 0 && job->owner && job->owner->limits)
        gps_limits_release(job->owner->limits, job->key_id, job->reserved_tokens);
    job->reserved_tokens = 0;
}

void jobs_job_free(gps_job *job)
{
    jobs_release_reservation(job);
    gps_job_sub *s = job->subs;
    while (s) {
        gps_job_sub *n = s->next;
        free(s);
        s = n;
    }
    if (job->retry_ev)
        event_free(job->retry_ev);
    gps_job_spec_clear(&job->spec);
    gp_buf_free(&job->text);
    free(job->gen_ids);
    free(job->stop_sequence);
    json_decref(job->upstream_meta);
    gp_prefix_chain_free(&job->prefix_chain);
    free(job);
}

void jobs_count(gps_jobs *j, const char *name, const char *labels, double v)
{
    if (j->metrics)
        gps_metrics_add(j->metrics, name, labels, v);
}

/* ------------------------------------------------------------------ */
/* Subscribers                                                         */
/* ------------------------------------------------------------------ */

static int subscribe(gps_job *job, gps_job_event_fn fn, void *arg, bool cursor)
{
    gps_job_sub *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->fn = fn;
    s->arg = arg;
    s->cursor = cursor;
    s->next = job->subs;
    job->subs = s;
    return 0;
}

int gps_job_subscribe(gps_job *job, gps_job_event_fn fn, void *arg)
{
    return subscribe(job, fn, arg, false);
}

int gps_job_subscribe_cursor(gps_job *job, gps_job_event_fn fn, void *arg)
{
    return subscribe(job, fn, arg, true);
}

/* Whether a live subscriber reads an event's tree (not the job's text and
 * fields): a token's, or that of an event read without one (apply_one). */
bool jobs_wants_tree(const gps_job *job)
{
    for (const gps_job_sub *s = job->subs; s; s = s->next)
        if (!s->dead && !s->cursor)
            return true;
    return false;
}

void gps_job_unsubscribe(gps_job *job, gps_job_event_fn fn, void *arg)
{
    for (gps_job_sub *s = job->subs; s; s = s->next)
        if (s->arg == arg && (!fn || s->fn == fn))
            s->dead = true;
}

static bool has_live_subs(const gps_job *job)
{
    for (gps_job_sub *s = job->subs; s; s = s->next)
        if (!s->dead)
            return true;
    return false;
}

static void prune_subs(gps_job *job)
{
    gps_job_sub **pp = &job->subs;
    while (*pp) {
        if ((*pp)->dead) {
            gps_job_sub *d = *pp;
            *pp = d->next;
            free(d);
        } else {
            pp = &(*pp)->next;
        }
    }
}

/* Call every live subscriber. Dead ones are pruned only when no callback
 * chain is running (a callback may unsubscribe itself or another). */
void jobs_notify(gps_jobs *j, gps_job *job, gps_event_type type, json_t *ev)
{
    j->notify_depth++;
    for (gps_job_sub *s = job->subs; s; s = s->next)
        if (!s->dead)
            s->fn(job, type, ev, s->arg);
    j->notify_depth--;
    if (j->notify_depth == 0)
        prune_subs(job);
}

void gps_job_mark_output_sent(gps_job *job)
{
    job->client_saw_output = true;
}

void gps_job_set_lease_attempt(gps_job *job, int64_t attempt)
{
    job->lease_attempt = attempt;
}

void gps_job_mark_row_lost(gps_job *job)
{
    job->row_lost = true;
}

/* ------------------------------------------------------------------ */
/* Cancellation records                                                */
/* ------------------------------------------------------------------ */

/* Where agent_id's newest record is, or would go: the slot in its hash
 * chain (*slot NULL when it has none). O(agents with records in the
 * bucket). */
static cancel_rec **cancel_slot(gps_jobs *j, const char *agent_id)
{
    cancel_rec **pp = &j->cbuckets[id_hash(agent_id) % NCBUCKETS];
    while (*pp && strcmp((*pp)->agent_id, agent_id) != 0)
        pp = &(*pp)->hnext;
    return pp;
}

static cancel_rec *cancel_find(cancel_rec *first, const char *job_id)
{
    for (cancel_rec *c = first; c; c = c->same_next)
        if (strcmp(c->job_id, job_id) == 0)
            return c;
    return NULL;
}

/* Off its agent's list (slot: the agent's, from cancel_slot) and the age
 * list, and freed. */
static void cancel_drop(gps_jobs *j, cancel_rec **slot, cancel_rec *c)
{
    if (!c->same_prev) {
        /* The agent's first: the next one (if any) takes its chain place. */
        cancel_rec *n = c->same_next;
        if (n) {
            n->same_prev = NULL;
            n->hnext = c->hnext;
            *slot = n;
        } else {
            *slot = c->hnext;
        }
    } else {
        c->same_prev->same_next = c->same_next;
        if (c->same_next)
            c->same_next->same_prev = c->same_prev;
    }
    if (c->older)
        c->older->newer = c->newer;
    else
        j->cold = c->newer;
    if (c->newer)
        c->newer->older = c->older;
    else
        j->cnew = c->older;
    free(c);
}

/* Out of memory no record is made, as before: the agent is then told at
 * its next upload for the job instead of its next poll (cancel:true for a
 * cancelled or failed job, 409 for one that moved to another agent),
 * except a job the server finished early (stop string), which runs on to
 * its own end on the agent; the client's result is whole either way. */
void jobs_cancel_add(gps_jobs *j, const char *agent_id, const char *job_id)
{
    if (!agent_id || !*agent_id)
        return;
    cancel_rec **slot = cancel_slot(j, agent_id);
    if (cancel_find(*slot, job_id))
        return;
    cancel_rec *c = calloc(1, sizeof *c);
    if (!c)
        return;
    snprintf(c->agent_id, sizeof c->agent_id, "%s", agent_id);
    snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
    c->since_us = gp_now_mono_us();
    /* Newest first in its agent's list (the order the one list had). */
    cancel_rec *first = *slot;
    if (first) {
        c->hnext = first->hnext;
        first->hnext = NULL;
        first->same_prev = c;
        c->same_next = first;
    }
    *slot = c;
    /* Newest last in the age list: since_us never goes back. */
    c->older = j->cnew;
    if (j->cnew)
        j->cnew->newer = c;
    else
        j->cold = c;
    j->cnew = c;
}

bool jobs_cancel_take(gps_jobs *j, const char *agent_id, const char *job_id)
{
    cancel_rec **slot = cancel_slot(j, agent_id);
    cancel_rec *c = cancel_find(*slot, job_id);
    if (!c)
        return false;
    cancel_drop(j, slot, c);
    return true;
}

/* The records stay until gps_jobs_cancels_sent: a reply that cannot be
 * built or written must not lose them (the agent would go on generating
 * for a client that left). NULL when the array cannot be made whole. */
json_t *gps_jobs_pending_cancels(gps_jobs *j, const char *agent_id)
{
    json_t *out = json_array();
    for (const cancel_rec *c = *cancel_slot(j, agent_id); out && c; c = c->same_next) {
        if (json_array_append_new(out, json_pack("{s:s,s:s}", "type", "cancel", "job_id",
                                                 c->job_id)) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

void gps_jobs_cancels_sent(gps_jobs *j, const char *agent_id, const json_t *commands)
{
    size_t i;
    const json_t *cmd;
    json_array_foreach(commands, i, cmd)
    {
        const char *type = json_string_value(json_object_get(cmd, "type"));
        const char *id = json_string_value(json_object_get(cmd, "job_id"));
        if (type && id && strcmp(type, "cancel") == 0)
            jobs_cancel_take(j, agent_id, id);
    }
}

/* Records older than the keep, oldest first: the walk stops at the first
 * one kept, so a sweep costs the expired records, not all of them. */
static void cancels_expire(gps_jobs *j, uint64_t now)
{
    uint64_t keep = j->opts.cancel_keep_ms > 0 ? (uint64_t)j->opts.cancel_keep_ms * 1000ull
                                               : CANCEL_KEEP_US;
    /* Records added by this very sweep (a stalled job's agent, a
     * timeout) are newer than now: unsigned now - since would wrap. */
    while (j->cold && now > j->cold->since_us && now - j->cold->since_us > keep)
        cancel_drop(j, cancel_slot(j, j->cold->agent_id), j->cold);
}

/* ------------------------------------------------------------------ */
/* Timers                                                              */
/* ------------------------------------------------------------------ */

/* A timer every SWEEP_MS, never part of a poll: per tick it walks the
 * live jobs (timeouts, stalls), the finished ones not yet retired, and
 * only the expired ends of the two oldest-first record lists. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_jobs *j = arg;
    uint64_t now = gp_now_mono_us();
    uint64_t qt = (uint64_t)j->opts.queue_timeout_sec * 1000000ull;
    uint64_t rt = (uint64_t)j->opts.request_timeout_sec * 1000000ull;
    uint64_t stall = (uint64_t)j->opts.stall_timeout_sec * 1000000ull;
    gps_job *next;
    /* Finished jobs nobody reads any more become records: the ones
     * finished since the last sweep, and those a subscriber still read
     * then (a native task replaying from memory, a slow client) once it
     * has gone. The list holds only these, so the walk is short. */
    for (gps_job *job = j->done_head; job; job = next) {
        next = job->next;
        if (!has_live_subs(job))
            retire(j, job, now);
    }
    done_recs_expire(j, now);
    for (gps_job *job = j->head; job; job = next) {
        next = job->next;
        if (gps_job_terminal(job))
            continue; /* not yet moved (cannot happen: jobs_finish moves it) */
        if (now - job->created_us > rt) {
            jobs_fail_job(j, job, 504, "TIMEOUT", "the request timed out", 0);
            continue;
        }
        if (job->state == GPS_JOB_QUEUED && now - job->queued_since_us > qt) {
            int retry = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
            jobs_fail_job(j, job, 503, "QUEUE_TIMEOUT", "no agent took the job in time", retry);
            continue;
        }
        if ((job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING) &&
            now - job->last_event_us > stall)
            jobs_fail_over(j, job, "stalled");
    }
    cancels_expire(j, now);
}

gps_jobs *gps_jobs_new(struct event_base *base, const gps_jobs_opts *opts, registry *reg,
                       sched *s, struct gps_store *store, gps_metrics *metrics)
{
    gps_jobs *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->base = base;
    j->opts = *opts;
    if (!j->opts.max_records)
        j->opts.max_records = GPS_JOBS_MAX_RECORDS_DEFAULT;
    gp_random_bytes(j->tenant_secret, sizeof j->tenant_secret);
    j->reg = reg;
    j->sched = s;
    j->store = store;
    j->metrics = metrics;
    j->oom_ev = json_pack("{s:s,s:s,s:s,s:i}", "type", "error", "code", "INTERNAL", "message",
                          "out of memory", "status", 500);
    if (!j->oom_ev) {
        free(j);
        return NULL;
    }
    if (base) {
        j->sweep = event_new(base, -1, EV_PERSIST, sweep_cb, j);
        struct timeval tv = {0, SWEEP_MS * 1000};
        if (!j->sweep || event_add(j->sweep, &tv) < 0) {
            if (j->sweep)
                event_free(j->sweep);
            json_decref(j->oom_ev);
            free(j);
            return NULL;
        }
    }
    return j;
}

void gps_jobs_free(gps_jobs *j)
{
    if (!j)
        return;
    if (j->sweep)
        event_free(j->sweep);
    gps_job *lists[] = {j->head, j->done_head};
    for (size_t l = 0; l < 2; l++) {
        gps_job *job = lists[l];
        while (job) {
            gps_job *n = job->next;
            if (job->state == GPS_JOB_QUEUED && !job->held)
                sched_remove(j->sched, &job->sj);
            jobs_job_free(job);
            job = n;
        }
    }
    cancel_rec *c = j->cold;
    while (c) {
        cancel_rec *n = c->newer;
        free(c);
        c = n;
    }
    done_recs_expire(j, 0);
    json_decref(j->tok_id);
    json_decref(j->tok_ev);
    json_decref(j->oom_ev);
    json_decref(j->log_submitted);
    json_decref(j->log_assigned);
    json_decref(j->log_done);
    free(j);
}

void gps_jobs_set_limits(gps_jobs *j, gps_limits *l) { j->limits = l; }

void gps_jobs_set_owner_server(gps_jobs *j, const char *server_id)
{
    snprintf(j->owner_server, sizeof j->owner_server, "%s", server_id ? server_id : "");
}

void gps_jobs_set_deliver(gps_jobs *j, gps_jobs_deliver_fn fn, void *arg)
{
    j->deliver = fn;
    j->deliver_arg = arg;
}

registry *gps_jobs_registry(gps_jobs *j)
{
    return j->reg;
}

sched *gps_jobs_sched(gps_jobs *j)
{
    return j->sched;
}

gps_metrics *gps_jobs_metrics(gps_jobs *j)
{
    return j->metrics;
}

size_t gps_jobs_active(gps_jobs *j)
{
    return j->n_live;
}

static void queue_cb(void *ud, const char *model, size_t interactive, size_t batch)
{
    gps_metrics *m = ud;
    char l[320];
    gps_metrics_label(l, sizeof l, "model", model, "priority", "interactive", (char *)NULL);
    gps_metrics_set(m, "queue_depth", l, (double)interactive);
    gps_metrics_label(l, sizeof l, "model", model, "priority", "batch", (char *)NULL);
    gps_metrics_set(m, "queue_depth", l, (double)batch);
}

void gps_jobs_collect(gps_jobs *j, gps_metrics *m)
{
    gps_metrics_reset(m, "queue_depth");
    sched_foreach_queue(j->sched, queue_cb, m);
    size_t running = 0, held = j->n_done;
    for (gps_job *job = j->head; job; job = job->next) {
        held++;
        if (job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING)
            running++;
    }
    gps_metrics_set(m, "jobs_running", NULL, (double)running);
    gps_metrics_set(m, "jobs_in_memory", NULL, (double)held);
    gps_metrics_set(m, "job_records", NULL, (double)j->n_recs);
}

const char *gps_job_id(const gps_job *job)
{
    return job->id;
}

const char *gps_job_model(const gps_job *job)
{
    return job->spec.model;
}

const char *gps_job_requested_model(const gps_job *job)
{
    return job->requested_model;
}

const char *gps_job_text(const gps_job *job)
{
    return job->text.data ? job->text.data : "";
}

size_t gps_job_text_len(const gps_job *job)
{
    return job->text.len;
}

unsigned gps_job_text_resets(const gps_job *job)
{
    return job->text_resets;
}

const char *gps_job_finish_reason(const gps_job *job)
{
    return job->finish_reason;
}

const char *gps_job_stop_sequence(const gps_job *job)
{
    return job->stop_sequence;
}

long long gps_job_prompt_tokens(const gps_job *job)
{
    return job->prompt_tokens;
}

long long gps_job_completion_tokens(const gps_job *job)
{
    return job->completion_tokens;
}

bool gps_job_count_estimated(const gps_job *job)
{
    return job->count_estimated;
}

uint64_t gps_job_first_token_us(const gps_job *job)
{
    return job->first_token_us;
}

const char *gps_job_agent_id(const gps_job *job)
{
    return job->agent_id;
}

int gps_job_attempts(const gps_job *job)
{
    return job->attempts;
}

long long gps_job_queue_ms(const gps_job *job)
{
    return job->queue_ms;
}

uint64_t gps_job_assigned_us(const gps_job *job)
{
    return job->assigned_us;
}

uint64_t gps_job_finished_us(const gps_job *job)
{
    return job->finished_us;
}

const char *gps_job_model_digest(const gps_job *job)
{
    return job->model_digest;
}

long gps_job_prefix_units(const gps_job *job)
{
    return job->prefix_units;
}

json_t *gps_job_upstream_meta(const gps_job *job)
{
    return job->upstream_meta;
}

const char *gps_job_continuation_mode(const gps_job *job)
{
    return job->continuation_mode;
}

gps_job_state gps_job_state_of(const gps_job *job)
{
    return job->state;
}

gps_job_priority gps_job_priority_of(const gps_job *job)
{
    return job->spec.priority;
}

long long gps_job_seed(const gps_job *job)
{
    return job->spec.seed;
}

uint64_t gps_job_created_us(const gps_job *job)
{
    return job->created_us;
}

const char *gps_job_error_code(const gps_job *job)
{
    return job->error_code;
}

const char *gps_job_api(const gps_job *job)
{
    return job->spec.api;
}

gps_job_kind gps_job_kind_of(const gps_job *job)
{
    return job->spec.kind;
}

const char *gps_job_key_id(const gps_job *job)
{
    return job->key_id;
}

const char *gps_job_correlation_id(const gps_job *job)
{
    return job->correlation_id;
}

int64_t gps_job_created_wall_ms(const gps_job *job)
{
    return job->created_wall_ms;
}

const char *gps_job_session(const gps_job *job)
{
    return job->spec.session;
}

const char *gps_job_user(const gps_job *job)
{
    return job->spec.user;
}

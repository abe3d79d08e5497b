/* jobs: see jobs.h. */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_count.h"
#include "common/gp_log.h"
#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/auth/limits.h"
#include "server/store/store.h"
#include "server/metrics.h"
#include "server/http/ids.h"

#define NBUCKETS 4096          /* id hash; chains stay short for thousands of jobs */
#define NRBUCKETS 16384        /* finished-job records: at most 131,072 (max_records)
                                  is chains of 8, walked only by late uploads */
/* At the first sweep after a finished job is no longer read it is freed,
 * and its done_rec answers a late upload from its agent for this long
 * (cancel:true, or 409 from another agent); after that the upload gets 404
 * JOB_NOT_FOUND, which stops the job on the agent just the same. */
#define KEEP_TERMINAL_US (60ull * 1000000ull)
#define CANCEL_KEEP_US (600ull * 1000000ull)
#define SWEEP_MS 250
#define MAX_TOKENS_SLACK 64       /* tokens tolerated beyond max_tokens (stop-string holdback) */

typedef struct gps_job_sub {
    gps_job_event_fn fn;
    void *arg;
    bool dead;
    bool cursor; /* reads token text from the job's text: token events come without a tree */
    struct gps_job_sub *next;
} gps_job_sub;

/* A job an agent must be told to stop (client gone, timeout, failover away
 * from a stalled agent). Sent as a poll command and as cancel:true. */
typedef struct cancel_rec {
    char agent_id[64];
    char job_id[40];
    uint64_t since_us;
    struct cancel_rec *next;
} cancel_rec;

/* What is left of a finished job once nobody reads it (retire): what a
 * late upload from its agent needs to be answered cancel:true or 409,
 * ~150 bytes where the whole job was ~1.9 KiB. At thousands of requests a
 * second the jobs kept KEEP_TERMINAL_US were hundreds of MB, and the id
 * table's chains, walked by every upload entry, grew with them. */
typedef struct done_rec {
    struct done_rec *hnext;  /* id hash chain */
    struct done_rec *next;   /* in the order they finished */
    uint64_t retired_us;     /* kept KEEP_TERMINAL_US from then */
    gps_job_state state;
    char id[40];
    char agent_id[64];
} done_rec;

struct gps_jobs {
    struct event_base *base;
    json_t *tok_ev; /* the token event handed to subscribers for a read upload (reused) */
    json_t *tok_id; /* its token_id while it has one (a second reference) */
    json_t *tok_text; /* its "text" (borrowed from tok_ev) */
    uint64_t report_stamp; /* the last agent report (gps_jobs_agent_report) */
    /* The fields of the per-job log lines, refilled in place (log_fields). */
    json_t *log_submitted, *log_assigned, *log_done;
    gps_jobs_opts opts;
    unsigned char tenant_secret[32]; /* keys the tenant tags (random per process) */
    registry *reg;
    sched *sched;
    struct gps_store *store;
    char owner_server[40]; /* this server's id on a shared DB, "" otherwise */
    gps_metrics *metrics;
    gps_jobs_deliver_fn deliver;
    void *deliver_arg;
    gps_limits *limits;         /* borrowed, may be NULL */
    gps_jobs_handoff handoff;   /* hand-off hooks (all NULL: none) */
    gps_job *buckets[NBUCKETS];
    /* Two lists, so that what walks the jobs an agent or a queue has (per
     * poll, per long-poll, per sweep) never walks the finished ones kept
     * for KEEP_TERMINAL_US (at 900 requests/s, 270,000 of them): head is
     * the live jobs, newest first; done_head..done_tail the finished ones
     * in the order they finished, so that expiry only looks at the oldest. */
    gps_job *head;
    gps_job *done_head, *done_tail;
    size_t n_done;
    size_t n_live;
    done_rec *rbuckets[NRBUCKETS]; /* retired finished jobs, by id */
    done_rec *rhead, *rtail;    /* the same, oldest first (expiry) */
    size_t n_recs;
    cancel_rec *cancels;
    struct event *sweep;
    int notify_depth;           /* >0 while subscriber callbacks run */
};

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

static void table_insert(gps_jobs *j, gps_job *job)
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
static void list_to_done(gps_jobs *j, gps_job *job)
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

static done_rec *done_rec_find(gps_jobs *j, const char *id)
{
    for (done_rec *r = j->rbuckets[rbucket_of(id)]; r; r = r->hnext)
        if (strcmp(r->id, id) == 0)
            return r;
    return NULL;
}

bool gps_jobs_find_record(gps_jobs *j, const char *id, gps_job_state *state, char *agent_id,
                          size_t agent_len)
{
    const done_rec *r = done_rec_find(j, id);
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

static void job_free(gps_job *job);

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
    job_free(job);
}

/* Free the records older than KEEP_TERMINAL_US (all: when now is 0). */
static void done_recs_expire(gps_jobs *j, uint64_t now)
{
    while (j->rhead && (!now || now - j->rhead->retired_us > KEEP_TERMINAL_US))
        done_rec_drop_oldest(j);
}

/* Give back what the job held against its key's daily budget (once). */
static void release_reservation(gps_job *job)
{
    if (job->reserved_tokens > 0 && job->owner && job->owner->limits)
        gps_limits_release(job->owner->limits, job->key_id, job->reserved_tokens);
    job->reserved_tokens = 0;
}

/* The most tokens a new job may spend: its prompt (the documented
 * estimate, common/gp_count.h) plus max_tokens. A count_tokens job spends
 * none. */
static long long job_token_reserve(const gps_job_spec *spec)
{
    if (spec->kind == GPS_JOB_COUNT_TOKENS)
        return 0;
    long long n = spec->max_tokens > 0 ? spec->max_tokens : 0;
    json_t *w = json_object();
    if (w) {
        if (spec->prompt)
            json_object_set_new(w, "prompt", json_string(spec->prompt));
        if (spec->messages)
            json_object_set(w, "messages", spec->messages);
        if (spec->input)
            json_object_set(w, "input", spec->input);
        long long p = gp_count_estimate(w);
        json_decref(w);
        n += p > 0 ? p : 0;
    }
    return n;
}

static void job_free(gps_job *job)
{
    release_reservation(job);
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

static void count(gps_jobs *j, const char *name, const char *labels, double v)
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
 * fields): a token's, or that of an event read without one (notify_in). */
static bool wants_tree(const gps_job *job)
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
static void notify(gps_jobs *j, gps_job *job, gps_event_type type, json_t *ev)
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

static void cancel_add(gps_jobs *j, const char *agent_id, const char *job_id)
{
    if (!agent_id || !*agent_id)
        return;
    for (cancel_rec *c = j->cancels; c; c = c->next)
        if (strcmp(c->agent_id, agent_id) == 0 && strcmp(c->job_id, job_id) == 0)
            return;
    cancel_rec *c = calloc(1, sizeof *c);
    if (!c)
        return;
    snprintf(c->agent_id, sizeof c->agent_id, "%s", agent_id);
    snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
    c->since_us = gp_now_mono_us();
    c->next = j->cancels;
    j->cancels = c;
}

static bool cancel_take(gps_jobs *j, const char *agent_id, const char *job_id)
{
    for (cancel_rec **pp = &j->cancels; *pp; pp = &(*pp)->next) {
        cancel_rec *c = *pp;
        if (strcmp(c->agent_id, agent_id) == 0 && strcmp(c->job_id, job_id) == 0) {
            *pp = c->next;
            free(c);
            return true;
        }
    }
    return false;
}

json_t *gps_jobs_pending_cancels(gps_jobs *j, const char *agent_id)
{
    json_t *out = json_array();
    for (cancel_rec **pp = &j->cancels; *pp;) {
        cancel_rec *c = *pp;
        if (strcmp(c->agent_id, agent_id) == 0) {
            json_array_append_new(out,
                                  json_pack("{s:s,s:s}", "type", "cancel", "job_id", c->job_id));
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
    return out;
}

/* ------------------------------------------------------------------ */
/* Wire form                                                           */
/* ------------------------------------------------------------------ */

/* Token-exact continuation part of the wire (docs/protocol.md): the ids
 * generated so far, the digest they belong to and the sampler's state
 * (seed; draws taken = tokens sampled). The sampler seed goes with every
 * attempt, so the first attempt samples with the seed a continuation will
 * be given. */
static void wire_continuation(const gps_job *job, json_t *w)
{
    json_t *smp = json_pack("{s:I}", "seed", (json_int_t)job->sampler_seed);
    if (job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0) {
        json_t *ids = json_array();
        for (size_t i = 0; ids && i < job->n_gen_ids; i++)
            json_array_append_new(ids, json_integer(job->gen_ids[i]));
        json_object_set_new(w, "continuation_ids", ids);
        json_object_set_new(w, "continuation_digest", json_string(job->ids_digest));
        json_object_set_new(smp, "n_sampled", json_integer((json_int_t)job->n_gen_ids));
    }
    json_object_set_new(w, "sampler", smp);
}

json_t *gps_job_wire(const gps_job *job, uint64_t now_us, int request_timeout_sec)
{
    const gps_job_spec *s = &job->spec;
    /* A continuation attempt generates only what is left of the budget. */
    long long done = job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0
                         ? (long long)job->n_gen_ids
                         : job->continued_tokens;
    long long max_tokens = s->max_tokens - done;
    if (max_tokens < 1)
        max_tokens = 1;
    json_t *params = json_pack("{s:I,s:f,s:f,s:I}", "max_tokens", (json_int_t)max_tokens,
                               "temperature", s->temperature, "top_p", s->top_p, "top_k",
                               (json_int_t)s->top_k);
    json_object_set_new(params, "stop", s->stop ? json_deep_copy(s->stop) : json_array());
    json_object_set_new(params, "seed", s->has_seed ? json_integer(s->seed) : json_null());
    uint64_t budget_us = (uint64_t)request_timeout_sec * 1000000ull;
    uint64_t used = now_us > job->created_us ? now_us - job->created_us : 0;
    long long deadline_ms = used < budget_us ? (long long)((budget_us - used) / 1000) : 0;
    json_t *w = json_pack("{s:s,s:s,s:s,s:o,s:s,s:i,s:s,s:I}", "job_id", job->id, "kind",
                          gps_job_kind_name(s->kind), "model", s->model, "params", params,
                          "continuation",
                          job->continued_tokens > 0 && job->text.data ? job->text.data : "",
                          "attempt", job->attempts, "correlation_id",
                          job->correlation_id, "deadline_ms", (json_int_t)deadline_ms);
    json_object_set_new(w, "prompt", s->prompt ? json_string(s->prompt) : json_null());
    json_object_set_new(w, "messages", s->messages ? json_deep_copy(s->messages) : json_null());
    if (s->input)
        json_object_set_new(w, "input", json_deep_copy(s->input));
    if (s->tools) {
        json_object_set_new(w, "tools", json_deep_copy(s->tools));
        if (s->tool_choice)
            json_object_set_new(w, "tool_choice", json_deep_copy(s->tool_choice));
    }
    if (s->response_format)
        json_object_set_new(w, "response_format", json_deep_copy(s->response_format));
    if (s->user)
        json_object_set_new(w, "user", json_string(s->user));
    /* What an agent whose upstream is another pool passes on to it
     * (docs/protocol.md): the affinity key and a batch priority. */
    const char *session = s->session ? s->session : s->user;
    if (session)
        json_object_set_new(w, "session", json_string(session));
    if (s->priority == GPS_PRIO_BATCH)
        json_object_set_new(w, "priority", json_string("batch"));
    if (s->pool_via[0])
        json_object_set_new(w, "pool_via", json_string(s->pool_via));
    if (job->tenant[0])
        json_object_set_new(w, "tenant", json_string(job->tenant));
    if (s->prompt_tokens_first)
        json_object_set_new(w, "prompt_tokens_first", json_true());
    wire_continuation(job, w);
    return w;
}

/*
 * The same wire, written as text (issue 24, fourth round): building it as
 * a jansson tree (a json_pack per part, the messages and tools deep-copied)
 * and dumping it was about 50,000 instructions a job. The fields come in
 * gps_job_wire's order and as gp_json_dump_append writes them; the parts
 * that are JSON already (stop, messages, input, tools, response_format)
 * are dumped as they are. A string jansson would refuse (not UTF-8), a
 * missing model or a temperature that is not finite takes the jansson
 * path instead, where json_pack's and json_string's refusals decide what
 * is left (test_job_wire compares the two).
 */
#define LIT(b, s) gp_buf_append((b), (s), sizeof(s) - 1)

/* A real as json_real dumped it (jansson's own formatting). */
static int put_real(gp_buf *b, double d)
{
    json_t *r = json_real(d);
    int rc = r ? gp_json_dump_append(b, r) : -1;
    json_decref(r);
    return rc;
}

static bool utf8_ok(const char *s)
{
    return !s || gp_utf8_valid(s, strlen(s));
}

/* Every string of the wire is one jansson takes, and the numbers are. */
static bool wire_plain(const gps_job *job)
{
    const gps_job_spec *s = &job->spec;
    bool cont = job->continued_tokens > 0;
    return s->model && isfinite(s->temperature) && isfinite(s->top_p) && utf8_ok(job->id) &&
           utf8_ok(s->model) && (!cont || utf8_ok(job->text.data)) &&
           utf8_ok(job->correlation_id) &&
           utf8_ok(s->prompt) && utf8_ok(s->user) && utf8_ok(s->session) &&
           utf8_ok(s->pool_via) && utf8_ok(job->tenant) && utf8_ok(job->ids_digest);
}

/* ,"key":JSON (v borrowed). */
static int put_json(gp_buf *b, const char *key_lit, size_t klen, const json_t *v)
{
    return gp_buf_append(b, key_lit, klen) < 0 ? -1 : gp_json_dump_append(b, v);
}
#define PUT_JSON(b, k, v) put_json((b), (k), sizeof(k) - 1, (v))

static int wire_text(gp_buf *b, const gps_job *job, uint64_t now_us, int request_timeout_sec)
{
    const gps_job_spec *s = &job->spec;
    bool tokens = job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0;
    long long done = tokens ? (long long)job->n_gen_ids : job->continued_tokens;
    long long max_tokens = s->max_tokens - done;
    if (max_tokens < 1)
        max_tokens = 1;
    uint64_t budget_us = (uint64_t)request_timeout_sec * 1000000ull;
    uint64_t used = now_us > job->created_us ? now_us - job->created_us : 0;
    long long deadline_ms = used < budget_us ? (long long)((budget_us - used) / 1000) : 0;
    const char *cont = job->continued_tokens > 0 && job->text.data ? job->text.data : "";
    if (LIT(b, "{\"job_id\":") < 0 || gp_json_str_append(b, job->id) < 0 || LIT(b, ",\"kind\":") < 0 ||
        gp_json_str_append(b, gps_job_kind_name(s->kind)) < 0 || LIT(b, ",\"model\":") < 0 ||
        gp_json_str_append(b, s->model) < 0 || LIT(b, ",\"params\":{\"max_tokens\":") < 0 ||
        gp_buf_append_int(b, max_tokens) < 0 || LIT(b, ",\"temperature\":") < 0 ||
        put_real(b, s->temperature) < 0 || LIT(b, ",\"top_p\":") < 0 ||
        put_real(b, s->top_p) < 0 || LIT(b, ",\"top_k\":") < 0 || gp_buf_append_int(b, s->top_k) < 0 ||
        LIT(b, ",\"stop\":") < 0 || (s->stop ? gp_json_dump_append(b, s->stop) : LIT(b, "[]")) < 0 ||
        LIT(b, ",\"seed\":") < 0 || (s->has_seed ? gp_buf_append_int(b, s->seed) : LIT(b, "null")) < 0 ||
        LIT(b, "},\"continuation\":") < 0 || gp_json_str_append(b, cont) < 0 ||
        LIT(b, ",\"attempt\":") < 0 || gp_buf_append_int(b, job->attempts) < 0 ||
        LIT(b, ",\"correlation_id\":") < 0 || gp_json_str_append(b, job->correlation_id) < 0 ||
        LIT(b, ",\"deadline_ms\":") < 0 || gp_buf_append_int(b, deadline_ms) < 0 ||
        LIT(b, ",\"prompt\":") < 0 || (s->prompt ? gp_json_str_append(b, s->prompt) : LIT(b, "null")) < 0 ||
        LIT(b, ",\"messages\":") < 0 ||
        (s->messages ? gp_json_dump_append(b, s->messages) : LIT(b, "null")) < 0)
        return -1;
    if ((s->input && PUT_JSON(b, ",\"input\":", s->input) < 0) ||
        (s->tools && PUT_JSON(b, ",\"tools\":", s->tools) < 0) ||
        (s->tools && s->tool_choice && PUT_JSON(b, ",\"tool_choice\":", s->tool_choice) < 0) ||
        (s->response_format && PUT_JSON(b, ",\"response_format\":", s->response_format) < 0) ||
        (s->user && (LIT(b, ",\"user\":") < 0 || gp_json_str_append(b, s->user) < 0)))
        return -1;
    const char *session = s->session ? s->session : s->user;
    if ((session && (LIT(b, ",\"session\":") < 0 || gp_json_str_append(b, session) < 0)) ||
        (s->priority == GPS_PRIO_BATCH && LIT(b, ",\"priority\":\"batch\"") < 0) ||
        (s->pool_via[0] && (LIT(b, ",\"pool_via\":") < 0 || gp_json_str_append(b, s->pool_via) < 0)) ||
        (job->tenant[0] && (LIT(b, ",\"tenant\":") < 0 || gp_json_str_append(b, job->tenant) < 0)) ||
        (s->prompt_tokens_first && LIT(b, ",\"prompt_tokens_first\":true") < 0))
        return -1;
    if (tokens) {
        if (LIT(b, ",\"continuation_ids\":[") < 0)
            return -1;
        for (size_t i = 0; i < job->n_gen_ids; i++)
            if ((i && LIT(b, ",") < 0) || gp_buf_append_int(b, job->gen_ids[i]) < 0)
                return -1;
        if (LIT(b, "],\"continuation_digest\":") < 0 || gp_json_str_append(b, job->ids_digest) < 0)
            return -1;
    }
    if (LIT(b, ",\"sampler\":{\"seed\":") < 0 || gp_buf_append_int(b, job->sampler_seed) < 0 ||
        (tokens && (LIT(b, ",\"n_sampled\":") < 0 || gp_buf_append_int(b, (long long)job->n_gen_ids) < 0)))
        return -1;
    return LIT(b, "}}");
}

int gps_job_wire_append(gp_buf *out, const gps_job *job, uint64_t now_us,
                        int request_timeout_sec)
{
    size_t at = out->len;
    int rc;
    if (wire_plain(job)) {
        rc = wire_text(out, job, now_us, request_timeout_sec);
    } else {
        json_t *w = gps_job_wire(job, now_us, request_timeout_sec);
        rc = w ? gp_json_dump_append(out, w) : 1;
        json_decref(w);
    }
    if (rc != 0) {
        out->len = at;
        if (out->data)
            out->data[at] = '\0';
    }
    return rc < 0 ? -1 : rc;
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */
/* ------------------------------------------------------------------ */

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
static void persist_insert(gps_jobs *j, gps_job *job)
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
        count(j, "db_errors_total", NULL, 1);
    else
        count(j, "db_writes_total", NULL, 1);
    json_decref(req);
}

/* Submit to end (a finished job's), as the request log and job_done say it. */
static long long total_ms(const gps_job *job)
{
    return (long long)((job->finished_us - job->created_us) / 1000);
}

static void persist(gps_jobs *j, gps_job *job)
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
        u.total_ms = total_ms(job);
        u.finish_reason = job->finish_reason[0] ? job->finish_reason : NULL;
        u.error_code = job->error_code[0] ? job->error_code : NULL;
        u.finished_at = gp_now_wall_ms();
    }
    if (gps_store_job_update_async(j->store, u) < 0)
        count(j, "db_errors_total", NULL, 1);
    else
        count(j, "db_writes_total", NULL, 1);
}

/* End the current assignment on the agent's books, once. */
static void end_on_agent(gps_jobs *j, gps_job *job, bool ok)
{
    if (job->ended_on_agent || !job->agent_id[0])
        return;
    job->ended_on_agent = true;
    registry_agent *a = registry_get(j->reg, job->agent_id);
    if (a)
        registry_job_end(j->reg, a, ok, job->tokens_per_sec);
}

static void place(gps_jobs *j, gps_job *job, int depth);

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
        place(j, h, 0);
    }
}

static void finish(gps_jobs *j, gps_job *job, gps_job_state st)
{
    if (job->state == GPS_JOB_QUEUED && !job->held && !job->remote)
        sched_remove(j->sched, &job->sj);
    if (job->in_backoff) {
        event_del(job->retry_ev);
        job->in_backoff = false;
    }
    job->state = st;
    job->finished_us = gp_now_mono_us();
    list_to_done(j, job);
    if (j->n_live)
        j->n_live--;
    persist(j, job);
    if ((job->remote || job->offered) && j->handoff.ended)
        j->handoff.ended(j->handoff.arg, job);
    if (j->limits) {
        /* A count_tokens job reports the counted prompt as its usage: that
         * is an answer, not tokens the key spent. */
        release_reservation(job);
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

/* Fail a job with an error event carrying the status a dialect uses. */
static void fail_job(gps_jobs *j, gps_job *job, int status, const char *code,
                     const char *message, int retry_after)
{
    if (gps_job_terminal(job))
        return;
    bool on_agent = job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING;
    if (on_agent) {
        end_on_agent(j, job, false);
        cancel_add(j, job->agent_id, job->id);
    }
    snprintf(job->error_code, sizeof job->error_code, "%s", code);
    finish(j, job, GPS_JOB_FAILED);
    gp_log_write(GP_LOG_WARN, "job_failed", job->correlation_id,
                 json_pack("{s:s,s:s,s:i,s:s}", "job_id", job->id, "code", code, "status",
                           status, "agent_id", job->agent_id),
                 "%s", message);
    json_t *ev = json_pack("{s:s,s:s,s:s,s:i}", "type", "error", "code", code, "message",
                           message, "status", status);
    if (retry_after > 0)
        json_object_set_new(ev, "retry_after", json_integer(retry_after));
    notify(j, job, GPS_EV_ERROR, ev);
    json_decref(ev);
}

/* ---- token-exact continuation (docs/architecture.md "Failover") ---- */

/* Forget the generated ids (a requeue without output regenerates all). */
static void ids_reset(gps_job *job)
{
    job->n_gen_ids = 0;
    job->ids_ok = false;
    job->ids_digest[0] = '\0';
}

/* Keep the ids of a token event: token_ids (every token sampled since the
 * previous event) or token_id. An event without ids, or more ids than the
 * request allows, ends token-exact continuation for the job. Returns the
 * number of tokens the event stands for (>= 1). */
static bool ids_room(gps_job *job, size_t n)
{
    if (!job->ids_ok)
        return false;
    size_t cap = (size_t)(job->spec.max_tokens > 0 ? job->spec.max_tokens : 0) + MAX_TOKENS_SLACK;
    if (job->n_gen_ids + n > cap) {
        job->ids_ok = false;
        return false;
    }
    if (job->n_gen_ids + n > job->cap_gen_ids) {
        size_t nc = job->cap_gen_ids ? job->cap_gen_ids : 64;
        while (nc < job->n_gen_ids + n)
            nc *= 2;
        int32_t *g = realloc(job->gen_ids, nc * sizeof *g);
        if (!g) {
            job->ids_ok = false;
            return false;
        }
        job->gen_ids = g;
        job->cap_gen_ids = nc;
    }
    return true;
}

/* ids_record for a token read without a tree (token_id -1: none). */
static long long ids_record_one(gps_job *job, long long token_id)
{
    if (token_id < 0) {
        job->ids_ok = false;
        return 1;
    }
    if (ids_room(job, 1))
        job->gen_ids[job->n_gen_ids++] = (int32_t)token_id;
    return 1;
}

static long long ids_record(gps_job *job, const json_t *ev)
{
    const json_t *arr = json_object_get(ev, "token_ids");
    const json_t *one = json_object_get(ev, "token_id");
    size_t n = json_is_array(arr) ? json_array_size(arr) : json_is_integer(one) ? 1 : 0;
    if (n == 0) {
        job->ids_ok = false;
        return 1;
    }
    if (!ids_room(job, n))
        return (long long)n;
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
 * (continuation_plan then picks tokens or text per agent). */
static void resume_ids_take(gps_job *job)
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
static void continuation_plan(gps_job *job, registry_agent *a)
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

/* Mark job as given to agent a (the scheduler already counted the slot). */
/*
 * The fields of the three log lines every job writes (job_submitted and
 * job_assigned at debug, job_done at info: one line a request at the
 * default level, as an access log; three were 9 % of the server's CPU at
 * 64 zero-delay clients, and journald drops a service's lines past 10,000
 * in 30 s): one object per line kind, kept by the table and refilled in
 * place, its keys made by the first line in the order below, rather than
 * a json_pack per line (~7,000 instructions each; issue 24). The line is
 * the one the json_pack object wrote; a value jansson refuses (not UTF-8)
 * drops the fields, as a failed json_pack did. log_fields returns the object to
 * refill (borrowed), lf_str/lf_int/lf_bool set one field and say whether
 * it took, log_fields_ref hands gp_log_write its reference.
 */
static json_t *log_fields(json_t **slot)
{
    if (!*slot)
        *slot = json_object();
    return *slot;
}

static bool lf_str(json_t *o, const char *k, const char *v)
{
    json_t *x = json_object_get(o, k);
    if (!v)
        return false;
    return x ? json_string_set(x, v) == 0 : json_object_set_new(o, k, json_string(v)) == 0;
}

static bool lf_int(json_t *o, const char *k, long long v)
{
    json_t *x = json_object_get(o, k);
    return x ? json_integer_set(x, v) == 0 : json_object_set_new(o, k, json_integer(v)) == 0;
}

static bool lf_bool(json_t *o, const char *k, bool v)
{
    return json_object_set_new(o, k, json_boolean(v)) == 0; /* (in place when there) */
}

static json_t *log_fields_ref(json_t *o, bool ok)
{
    return o && ok ? json_incref(o) : NULL;
}

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
    continuation_plan(job, a);
    if (gp_log_enabled(GP_LOG_DEBUG)) {
        json_t *f = log_fields(&j->log_assigned);
        bool ok = f && lf_str(f, "job_id", job->id) && lf_str(f, "agent_id", a->id) &&
                  lf_int(f, "attempt", job->attempts) && lf_int(f, "queue_ms", job->queue_ms);
        gp_log_write(GP_LOG_DEBUG, "job_assigned", job->correlation_id, log_fields_ref(f, ok),
                     "job assigned");
    }
    persist(j, job);
}

static void requeue_or_fail(gps_jobs *j, gps_job *job, int depth);

/* A job's prompt-prefix tenant (gps_job.tenant): one per key, narrowed by
 * a downstream pool's tag (sub); "" when every request shares the cache
 * (scope pool, or no key and no sub: home mode is one tenant). Keyed with
 * a secret so an agent can neither read the key id out of the tag nor
 * forge another key's tag; a new process has a new secret (the agents'
 * caches then miss once per conversation). */
static void tenant_of(gps_jobs *j, const char *key_id, const char *sub, char out[33])
{
    out[0] = '\0';
    if (j->opts.prefix_cache_pool || (!key_id[0] && !(sub && *sub)))
        return;
    size_t kl = strlen(key_id), sl = sub ? strlen(sub) : 0;
    char *msg = malloc(kl + sl + 2);
    if (!msg) {
        /* never fall back to the shared tenant: a tag no one else has */
        gp_random_hex(out, 16);
        return;
    }
    memcpy(msg, key_id, kl);
    msg[kl] = '\n';
    memcpy(msg + kl + 1, sub ? sub : "", sl + 1);
    char h[65];
    gp_hmac_sha256_hex(j->tenant_secret, sizeof j->tenant_secret, msg, kl + 1 + sl, h);
    free(msg);
    memcpy(out, h, 32);
    out[32] = '\0';
}

/* The scheduler gave job to agent a, whose long-poll is parked: hand it
 * over now. When the long-poll turns out to be gone, give the slot back
 * and try elsewhere (depth bounds the retries). */
/* The job's prompt chain (gp_prefix.h), computed as an agent computes it
 * from the wire JSON, for the scheduler's prefix routing; only while some
 * agent advertises a prefix (the hashing costs a pass over the prompt). */
static void set_prefix_chain(gps_jobs *j, gps_job *job)
{
    if (job->spec.kind == GPS_JOB_COUNT_TOKENS || job->spec.kind == GPS_JOB_EMBED ||
        sched_prefix_entries(j->sched) == 0)
        return;
    json_t *w = json_object();
    if (!w)
        return;
    if (job->spec.prompt)
        json_object_set_new(w, "prompt", json_string(job->spec.prompt));
    if (job->spec.messages)
        json_object_set(w, "messages", job->spec.messages);
    if (job->spec.tools)
        json_object_set(w, "tools", job->spec.tools);
    if (job->spec.tool_choice)
        json_object_set(w, "tool_choice", job->spec.tool_choice);
    if (job->tenant[0])
        json_object_set_new(w, "tenant", json_string(job->tenant));
    if (gp_prefix_chain_of_job(w, &job->prefix_chain) == 0 && job->prefix_chain.units > 0)
        job->sj.prefix = &job->prefix_chain;
    json_decref(w);
}

/* After an assignment by sched: was it the prefix that chose the agent? */
static void note_prefix_route(gps_jobs *j, gps_job *job)
{
    if (!job->sj.prefix)
        return;
    job->prefix_units = job->sj.prefix_units;
    count(j, "prefix_routed_total", job->prefix_units > 0 ? "result=\"hit\"" : "result=\"miss\"",
          1);
}

/* The scheduler gave an offered job (jobs.h, hand-off) a slot of agent a:
 * the offer is withdrawn first, since a peer may have claimed it already.
 * The slot goes back (registry and, with give_back, the scheduler: the
 * agent stays ready with it) and the job waits out of the scheduler for
 * the answer (gps_jobs_offer_withdrawn), at the front of its queue when it
 * comes back. false: no offer to withdraw, the caller dispatches now. */
static bool withdraw_first(gps_jobs *j, gps_job *job, registry_agent *a, bool give_back)
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

static void deliver_to(gps_jobs *j, gps_job *job, registry_agent *a, int depth)
{
    note_prefix_route(j, job);
    mark_assigned(j, job, a);
    gp_buf arr;
    gp_buf_init(&arr);
    if (LIT(&arr, "[") < 0 ||
        gps_job_wire_append(&arr, job, gp_now_mono_us(), j->opts.request_timeout_sec) < 0 ||
        LIT(&arr, "]") < 0)
        arr.len = 0; /* (ENOMEM: handed over as nothing, as an empty array was) */
    long long rc = j->deliver ? j->deliver(a, &arr, j->deliver_arg) : -1;
    gp_buf_free(&arr);
    if (rc >= 0 && job->state == GPS_JOB_ASSIGNED)
        job->delivery = (uint64_t)rc;
    if (rc < 0) {
        job->attempts--;
        end_on_agent(j, job, true);
        job->agent_id[0] = '\0';
        requeue_or_fail(j, job, depth);
    }
}

static bool offerable(gps_jobs *j, const gps_job *job, bool queued);

/* Submit to the scheduler (first time, after a failover, or when a job
 * held for its key's max_concurrent is let in). Issue 28: queued here, it
 * is offered to the other servers too, as at submit (withdrawn before an
 * agent here gets it); no agent here at all (the last one was lost), it
 * is handed to them only, where a live peer lists its model. */
static void place(gps_jobs *j, gps_job *job, int depth)
{
    registry_agent *a = NULL;
    job->sj.agent = NULL;
    sched_result r = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
    if (r == SCHED_QUEUED) {
        job->state = GPS_JOB_QUEUED;
        if (!job->offered && j->handoff.withdraw && offerable(j, job, true))
            job->offered = j->handoff.offer(j->handoff.arg, job);
        return;
    }
    if (r == SCHED_NO_AGENT && !job->offered && offerable(j, job, false)) {
        job->state = GPS_JOB_QUEUED;
        job->remote = true; /* as at submit: the follower assigns it */
        j->handoff.offer(j->handoff.arg, job);
        return;
    }
    if (r == SCHED_ASSIGNED && a) {
        if (!withdraw_first(j, job, a, true))
            deliver_to(j, job, a, depth + 1);
        return;
    }
    int retry = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
    if (r == SCHED_QUEUE_FULL)
        fail_job(j, job, 503, "NO_CAPACITY", "queue full while failing over", retry);
    else
        fail_job(j, job, 503, "NO_AGENT", "no agent available for the model", retry);
}

static void requeue_or_fail(gps_jobs *j, gps_job *job, int depth)
{
    if (depth > 4) {
        fail_job(j, job, 503, "NO_AGENT", "no agent could take the job", 1);
        return;
    }
    job->state = GPS_JOB_QUEUED;
    job->queued_since_us = gp_now_mono_us();
    place(j, job, depth);
}

static void log_submitted(gps_jobs *j, const gps_job *job, bool held)
{
    if (!gp_log_enabled(GP_LOG_DEBUG))
        return;
    json_t *f = log_fields(&j->log_submitted);
    bool ok = f && lf_str(f, "job_id", job->id) && lf_str(f, "model", job->spec.model) &&
              lf_str(f, "kind", gps_job_kind_name(job->spec.kind)) &&
              lf_str(f, "api", job->spec.api ? job->spec.api : "") &&
              lf_str(f, "priority",
                     job->spec.priority == GPS_PRIO_BATCH ? "batch" : "interactive") &&
              lf_bool(f, "held", held);
    /* The affinity key (x_pool_options.session, else user): which
     * conversation a job belongs to, for an operator reading the log. */
    const char *session = job->spec.session ? job->spec.session : job->spec.user;
    if (ok && session && !lf_str(f, "session", session))
        json_object_del(f, "session"); /* (json_string refused it: the key left out) */
    else if (ok && !session)
        json_object_del(f, "session");
    gp_log_write(GP_LOG_DEBUG, "job_submitted", job->correlation_id, log_fields_ref(f, ok),
                 held ? "job submitted; waiting for a slot of its key (max_concurrent)"
                      : "job submitted");
}

/* The job's key is at its max_concurrent: keep the job QUEUED outside the
 * scheduler until one of the key's jobs ends (release_held). */
static gps_job *submit_held(gps_jobs *j, gps_job *job)
{
    table_insert(j, job);
    j->n_live++;
    job->state = GPS_JOB_QUEUED;
    job->held = true;
    gps_limits_waiting_add(j->limits, job->key_id, 1);
    if (job->spec.resume_id)
        persist(j, job);
    else
        persist_insert(j, job);
    log_submitted(j, job, true);
    return job;
}

/* Of the live agents serving a model: how many, and how many report it
 * embeddings_only (an encoder). */
typedef struct gen_probe {
    const char *model;
    int serving, encoders;
} gen_probe;

static void gen_probe_cb(void *ud, registry_agent *a)
{
    gen_probe *p = ud;
    if (a->state != REGISTRY_HEALTHY && a->state != REGISTRY_SUSPECT)
        return;
    for (size_t i = 0; i < a->n_models; i++)
        if (registry_model_info_named(&a->models[i], p->model)) {
            p->serving++;
            p->encoders += a->models[i].embeddings_only;
            return;
        }
}

/* A text-generation job (chat, completion, count_tokens aside) for a model
 * that only encoder agents serve can never run: a 400 naming the model,
 * rather than a job an agent would refuse. */
static bool refuse_generation(gps_jobs *j, const gps_job_spec *spec, gps_submit_err *err)
{
    if (spec->kind != GPS_JOB_CHAT && spec->kind != GPS_JOB_COMPLETION)
        return false;
    gen_probe p = { .model = spec->model };
    if (spec->model)
        registry_foreach(j->reg, gen_probe_cb, &p);
    if (p.serving == 0 || p.encoders < p.serving)
        return false;
    err->status = 400;
    err->code = "INVALID_REQUEST";
    snprintf(err->message, sizeof err->message,
             "model '%.100s' is an embeddings model (encoder only): it does not generate "
             "text; use it with /v1/embeddings", spec->model);
    return true;
}

/* May a job no agent here can take (or, queued, that waits in this
 * server's queue) go to another server? Native tasks have their own claim
 * across servers (api_tasks.c), a proxy runs where it was claimed, and a
 * resumed job's row exists already. */
static bool may_go_elsewhere(gps_jobs *j, const gps_job *job)
{
    return j->handoff.can_offer && j->handoff.offer && !job->spec.handoff_proxy &&
           !job->spec.resume_id && !(job->spec.api && strcmp(job->spec.api, "native") == 0);
}

static bool offerable(gps_jobs *j, const gps_job *job, bool queued)
{
    if (!may_go_elsewhere(j, job))
        return false;
    if (queued && j->handoff.can_offer_queued)
        return j->handoff.can_offer_queued(j->handoff.arg, job);
    return j->handoff.can_offer(j->handoff.arg, job);
}

size_t gps_jobs_offer_queued(gps_jobs *j)
{
    if (!j->handoff.withdraw || !j->handoff.offer)
        return 0;
    gps_job *tail = j->head;
    while (tail && tail->next)
        tail = tail->next;
    size_t n = 0;
    /* The list is newest first: from its tail, the oldest is offered first. */
    for (gps_job *x = tail; x; x = x->prev) {
        if (x->state != GPS_JOB_QUEUED || x->held || x->remote || x->offered ||
            x->withdrawing || !offerable(j, x, true))
            continue;
        x->offered = j->handoff.offer(j->handoff.arg, x);
        n += x->offered;
    }
    return n;
}

size_t gps_job_models(const gps_job *job, const char **names, size_t max)
{
    size_t n = 0;
    if (max > 0)
        names[n++] = job->spec.model;
    for (size_t i = 0; i < job->n_chain && n < max; i++)
        if (job->chain[i] != job->spec.model)
            names[n++] = job->chain[i];
    return n;
}

gps_job *gps_jobs_submit(gps_jobs *j, gps_job_spec *spec, const char *correlation_id,
                         const char *key_id, gps_submit_err *err)
{
    memset(err, 0, sizeof *err);
    if (refuse_generation(j, spec, err)) {
        gps_job_spec_clear(spec);
        return NULL;
    }
    long long reserve = 0;
    if (j->limits && !spec->resume_id && key_id && *key_id) {
        int retry = 0;
        reserve = job_token_reserve(spec);
        gps_limit_result lr =
            gps_limits_admit(j->limits, key_id, gp_now_wall_ms(), reserve, &retry);
        if (lr != GPS_LIMIT_OK) {
            if (j->metrics)
                gps_metrics_rate_limited(j->metrics, gps_limit_result_name(lr));
            gps_job_spec_clear(spec);
            err->status = 429;
            err->retry_after_sec = retry;
            if (lr == GPS_LIMIT_RPM) {
                err->code = "RATE_LIMITED";
                snprintf(err->message, sizeof err->message,
                         "this key's requests per minute are used up; retry in %d s", retry);
            } else {
                err->code = "TOKEN_LIMIT";
                snprintf(err->message, sizeof err->message,
                         "this key's tokens for today are used up; retry in %d s "
                         "(after 00:00 UTC)", retry);
            }
            gp_log_write(GP_LOG_INFO, "rate_limited", correlation_id,
                         json_pack("{s:s,s:s,s:i}", "key_id", key_id, "reason",
                                   gps_limit_result_name(lr), "retry_after", retry),
                         "request refused by the key's limits");
            return NULL;
        }
    }
    gps_job *job = calloc(1, sizeof *job);
    if (!job) {
        if (reserve > 0)
            gps_limits_release(j->limits, key_id, reserve);
        gps_job_spec_clear(spec);
        err->status = 500;
        err->code = "INTERNAL";
        snprintf(err->message, sizeof err->message, "out of memory");
        return NULL;
    }
    job->owner = j;
    if (spec->resume_id)
        snprintf(job->id, sizeof job->id, "%s", spec->resume_id);
    else
        gps_id_new("job_", job->id, sizeof job->id);
    gp_copy_str(job->correlation_id, sizeof job->correlation_id,
                correlation_id ? correlation_id : "");
    gp_copy_str(job->key_id, sizeof job->key_id, key_id ? key_id : "");
    tenant_of(j, job->key_id, spec->tenant_sub, job->tenant);
    job->reserved_tokens = reserve;
    job->spec = *spec;
    memset(spec, 0, sizeof *spec);
    spec->api = job->spec.api;
    gp_buf_init(&job->text);
    if (job->spec.resume_text && job->spec.resume_tokens > 0) {
        /* Continue where the previous server process stopped: the client
         * already has this text (its events are stored). */
        gp_buf_append(&job->text, job->spec.resume_text, strlen(job->spec.resume_text));
        job->completion_tokens = job->continued_tokens = job->spec.resume_tokens;
        job->client_saw_output = true;
        resume_ids_take(job);
    }
    if (job->spec.has_seed) {
        job->sampler_seed = job->spec.seed;
    } else {
        uint64_t r = gps_id_u64(); /* (no RAND_bytes per job: ids.h) */
        job->sampler_seed = (long long)(r >> 1);   /* JSON integers are signed */
    }
    job->created_us = gp_now_mono_us();
    job->created_wall_ms = gp_now_wall_ms();
    job->queued_since_us = job->created_us;

    job->sj.model = job->spec.model;
    /* The client's order, before a fallback below swaps the names. */
    job->chain[job->n_chain++] = job->spec.model;
    for (size_t i = 0; i < job->spec.n_fallback; i++)
        job->chain[job->n_chain++] = job->spec.fallback_models[i];
    job->sj.priority = job->spec.priority == GPS_PRIO_BATCH ? SCHED_BATCH : SCHED_INTERACTIVE;
    job->sj.prefer_agent = job->spec.prefer_agent;
    job->sj.prefer_strict = -1;
    job->sj.session = job->spec.session ? job->spec.session : job->spec.user;
    job->sj.labels = job->spec.labels;
    job->sj.n_labels = job->spec.n_labels;
    job->sj.needs_tools = job->spec.tools != NULL;
    job->sj.needs_embeddings = job->spec.kind == GPS_JOB_EMBED;
    /* a name served by encoders and decoders alike: text jobs skip the encoders */
    job->sj.needs_generation =
        job->spec.kind == GPS_JOB_CHAT || job->spec.kind == GPS_JOB_COMPLETION;
    set_prefix_chain(j, job);

    registry_agent *a = NULL;
    /* A count_tokens job is a short tokenizer call: it neither waits for
     * nor takes one of the key's max_concurrent places (a client counting
     * tokens beside its own long generation must not stall behind it). */
    bool concurrent = job->spec.kind != GPS_JOB_COUNT_TOKENS;
    if (j->limits && concurrent && !gps_limits_may_start(j->limits, job->key_id) &&
        registry_model_known(j->reg, job->spec.model))
        return submit_held(j, job);
    sched_result r = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
    if ((r == SCHED_NO_AGENT || r == SCHED_QUEUE_FULL) && job->spec.n_fallback) {
        /* fallback_models, in order: the first that can take or queue the
         * job serves it. spec.model becomes the serving model (the reply,
         * the request log and failover all use it); the requested name
         * moves into its slot. When none can, the first model's error is
         * the answer. */
        for (size_t i = 0; i < job->spec.n_fallback; i++) {
            job->sj.model = job->spec.fallback_models[i];
            sched_result rf = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
            if (rf == SCHED_ASSIGNED || rf == SCHED_QUEUED) {
                char *served = job->spec.fallback_models[i];
                job->spec.fallback_models[i] = job->spec.model;
                job->spec.model = served;
                job->requested_model = job->spec.fallback_models[i];
                r = rf;
                break;
            }
        }
        job->sj.model = job->spec.model;
    }
    switch (r) {
    case SCHED_ASSIGNED:
    case SCHED_QUEUED:
        break;
    case SCHED_QUEUE_FULL: {
        if (j->metrics)
            gps_metrics_rate_limited(j->metrics, "queue_full");
        uint64_t est = sched_estimated_wait_ms(j->sched, job->spec.model);
        err->status = 429;
        err->code = "QUEUE_FULL";
        err->retry_after_sec = est ? (int)((est + 999) / 1000) : 1;
        snprintf(err->message, sizeof err->message,
                 "the queue for model '%.100s' is full; retry later", job->spec.model);
        job_free(job);
        return NULL;
    }
    case SCHED_NO_AGENT:
        if (offerable(j, job, false)) {
            job->remote = true; /* handed to another server: see below */
            break;
        }
        if (registry_model_known(j->reg, job->spec.model)) {
            err->status = 503;
            err->code = "NO_AGENT";
            err->retry_after_sec = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
            snprintf(err->message, sizeof err->message,
                     "no agent is serving model '%.100s' right now; retry later",
                     job->spec.model);
        } else {
            err->status = 404;
            err->code = "MODEL_NOT_FOUND";
            snprintf(err->message, sizeof err->message,
                     "the model '%.100s' does not exist (no agent has served it)",
                     job->spec.model);
        }
        job_free(job);
        return NULL;
    default:
        err->status = 500;
        err->code = "INTERNAL";
        snprintf(err->message, sizeof err->message, "scheduler error");
        job_free(job);
        return NULL;
    }
    table_insert(j, job);
    j->n_live++;
    job->state = GPS_JOB_QUEUED;
    if (j->limits && job->key_id[0] && concurrent) {
        job->counted = true;
        gps_limits_started(j->limits, job->key_id);
    }
    if (job->spec.resume_id)
        persist(j, job); /* the row of the previous process: now queued again */
    else
        persist_insert(j, job);
    log_submitted(j, job, false);
    if (job->remote) /* after its row's insert: the offer's row refers to it */
        j->handoff.offer(j->handoff.arg, job);
    else if (r == SCHED_QUEUED && j->handoff.withdraw && offerable(j, job, true))
        job->offered = j->handoff.offer(j->handoff.arg, job); /* and stays queued here */
    else if (r == SCHED_QUEUED && j->handoff.withdraw && j->handoff.can_offer_queued &&
             may_go_elsewhere(j, job))
        gp_log_write(GP_LOG_INFO, "job_handoff_held", job->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", job->id, "model", job->spec.model),
                     "queued here; no other server has a free agent for it: offered once "
                     "one has");
    if (r == SCHED_ASSIGNED && a) {
        deliver_to(j, job, a, 1);
    } else {
        job->state = GPS_JOB_QUEUED;
    }
    return job;
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
    bool estimated = charge_prompt_of_cancelled(job);
    bool on_agent = job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING;
    if (on_agent) {
        end_on_agent(j, job, true);
        cancel_add(j, job->agent_id, job->id);
    }
    snprintf(job->error_code, sizeof job->error_code, "CANCELLED");
    finish(j, job, GPS_JOB_CANCELLED);
    gp_log_write(GP_LOG_INFO, "job_cancelled", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:I,s:I,s:b}", "job_id", job->id, "reason",
                           reason ? reason : "", "agent_id", job->agent_id, "prompt_tokens",
                           (json_int_t)job->prompt_tokens, "completion_tokens",
                           (json_int_t)job->completion_tokens, "prompt_estimated", estimated),
                 "job cancelled");
    json_t *ev = json_pack("{s:s,s:s,s:s,s:i}", "type", "error", "code", "CANCELLED", "message",
                           "the job was cancelled", "status", 499);
    notify(j, job, GPS_EV_ERROR, ev);
    json_decref(ev);
}

void gps_jobs_finish_early(gps_jobs *j, gps_job *job, const char *finish_reason)
{
    if (gps_job_terminal(job))
        return;
    bool on_agent = job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING;
    if (on_agent) {
        end_on_agent(j, job, true);
        cancel_add(j, job->agent_id, job->id);
    }
    snprintf(job->finish_reason, sizeof job->finish_reason, "%s",
             finish_reason ? finish_reason : "stop");
    finish(j, job, GPS_JOB_DONE);
    gp_log_write(GP_LOG_INFO, "job_done", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:I,s:I,s:s,s:b}", "job_id", job->id, "model",
                           job->spec.model, "agent_id", job->agent_id, "ms",
                           (json_int_t)total_ms(job),
                           "completion_tokens",
                           (json_int_t)job->completion_tokens, "finish_reason",
                           job->finish_reason, "early", 1),
                 "job finished by the server (stop sequence)");
    json_t *ev = json_pack("{s:s,s:s,s:{s:I,s:I}}", "type", "end", "finish_reason",
                           job->finish_reason, "usage", "prompt_tokens",
                           (json_int_t)job->prompt_tokens, "completion_tokens",
                           (json_int_t)job->completion_tokens);
    notify(j, job, GPS_EV_END, ev);
    json_decref(ev);
}

size_t gps_jobs_queue_position(gps_jobs *j, const gps_job *job)
{
    if (job->state != GPS_JOB_QUEUED)
        return 0;
    size_t ahead = 0;
    /* The table lists the newest job first: a job after this one in the
     * list came before it. That decides between two submitted in the
     * same microsecond (no longer rare since a submit writes no log line
     * at info). */
    bool past = false;
    for (const gps_job *x = j->head; x; x = x->next) {
        if (x == job) {
            past = true;
            continue;
        }
        if (x->state != GPS_JOB_QUEUED || strcmp(x->spec.model, job->spec.model))
            continue;
        if (x->spec.priority != job->spec.priority) {
            ahead += x->spec.priority < job->spec.priority; /* interactive goes first */
            continue;
        }
        if (x->sj.front != job->sj.front)
            ahead += x->sj.front;                           /* failover retries first */
        else if (x->queued_since_us != job->queued_since_us)
            ahead += x->queued_since_us < job->queued_since_us;
        else if (x->created_us != job->created_us)
            ahead += x->created_us < job->created_us;
        else
            ahead += past;
    }
    return ahead;
}

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
    bool with_suspect;
    bool found;
} other_agent_q;

static void other_agent_cb(void *ud, registry_agent *a)
{
    other_agent_q *q = ud;
    if (!q->found && strcmp(a->id, q->exclude) != 0 &&
        (a->state == REGISTRY_HEALTHY || a->state == REGISTRY_REGISTERING ||
         (q->with_suspect && a->state == REGISTRY_SUSPECT)) &&
        registry_agent_serves(a, q->model))
        q->found = true;
}

/* True when an agent other than exclude that can take work now (healthy,
 * registering) serves model: what moving a job to a fallback model asks.
 * A SUSPECT agent does not count: an agent killed a moment ago stays
 * suspect until its heartbeat expires, and must not keep a job from its
 * fallback. O(agents), on a failover only. */
static bool model_live(gps_jobs *j, const char *model, const char *exclude)
{
    other_agent_q q = {model, exclude, false, false};
    registry_foreach(j->reg, other_agent_cb, &q);
    return q.found;
}

/* Suspect agents count here: an agent's own upstream error fails over
 * only while another agent that may still be alive serves the model. */
static bool other_agent_live(gps_jobs *j, const gps_job *job, const char *exclude)
{
    other_agent_q q = {job->spec.model, exclude, true, false};
    registry_foreach(j->reg, other_agent_cb, &q);
    return q.found;
}

/* The first model of job's chain, other than the one it runs on, that a
 * live agent (not exclude) serves: its chain index, or -1. */
static int fallback_live(gps_jobs *j, const gps_job *job, const char *exclude)
{
    for (size_t i = 0; i < job->n_chain; i++)
        if (strcmp(job->chain[i], job->spec.model) != 0 &&
            model_live(j, job->chain[i], exclude))
            return (int)i;
    return -1;
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
    requeue_or_fail(j, job, 0);
    job->sj.prefer_agent = pref;
    job->sj.prefer_strict = strict;
}

static void log_fallback(const gps_job *job, const char *from, const char *when)
{
    gp_log_write(GP_LOG_WARN, "job_fallback", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:s}", "job_id", job->id, "from_model", from,
                           "model", job->spec.model, "when", when),
                 "no live agent serves the job's model; moving it to a fallback model");
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
    if (job->n_chain > 1 && !model_live(j, job->spec.model, job->exclude_agent)) {
        int fb = fallback_live(j, job, job->exclude_agent);
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
 * any queued job (finish stops the timer). */
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
static void remote_fail_over(gps_jobs *j, gps_job *job, const char *why);

/* The agent (or, for a handed-off job, the server) running the job was
 * lost and the job is not tried again: 502 AGENT_LOST. */
static void fail_lost(gps_jobs *j, gps_job *job, const char *runner, const char *why)
{
    char m[200];
    snprintf(m, sizeof m, "the %s running this job was lost (%s)%s", runner, why,
             job->client_saw_output ? " after output was sent" : "");
    count(j, "failovers_total", "mode=\"error\"", 1);
    fail_job(j, job, 502, "AGENT_LOST", m, 0);
}

/* A requeue: the attempt's output was never seen by the client, so it is
 * dropped and the next agent starts the reply afresh. */
static void discard_output(gps_job *job)
{
    job->agent_id[0] = '\0';
    job->text.len = 0;
    if (job->text.data)
        job->text.data[0] = '\0';
    job->text_resets++;
    job->completion_tokens = 0;
    job->continued_tokens = 0;
    job->first_token_us = 0;
    job->agent_seq = 0;
    ids_reset(job);
}

static void fail_over(gps_jobs *j, gps_job *job, const char *why)
{
    if (job->state != GPS_JOB_ASSIGNED && job->state != GPS_JOB_RUNNING)
        return;
    if (job->remote) {
        remote_fail_over(j, job, why);
        return;
    }
    end_on_agent(j, job, false);
    cancel_add(j, job->agent_id, job->id);
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
    f.model_live = model_live(j, job->spec.model, job->agent_id);
    if (!f.model_live && job->n_chain > 1)
        f.fallback_live = fallback_live(j, job, job->agent_id);
    gp_random_bytes(&f.rnd, sizeof f.rnd);
    gps_fo_plan p = gps_failover_decide(&f);
    if (p.action == GPS_FO_FAIL_LOST) {
        fail_lost(j, job, "agent", why);
        return;
    }
    if (p.action == GPS_FO_FAIL_EXHAUSTED) {
        count(j, "failovers_total", "mode=\"exhausted\"", 1);
        fail_job(j, job, 503, "AGENT_LOST", "the job's agents were lost; attempts exhausted", 1);
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
    count(j, "failovers_total", cont ? "mode=\"continue\"" : "mode=\"requeue\"", 1);
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
        if (p.fallback >= 0)   /* the model that continues the stream */
            json_object_set_new(ev, "model", json_string(job->spec.model));
        job->agent_id[0] = '\0';
        job->agent_seq = 0;
        /* Subscribers may not cancel here (they have nothing to say yet),
         * but if one does, the job is terminal and stays so. */
        notify(j, job, GPS_EV_FAILOVER, ev);
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
    persist(j, job);
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
    if (r == SCHED_ASSIGNED && a && !withdraw_first(j, job, a, true))
        deliver_to(j, job, a, 1);
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
        count(j, "failovers_total", "mode=\"exhausted\"", 1);
        fail_job(j, job, 503, "AGENT_LOST", "the job's servers were lost; attempts exhausted", 1);
        return;
    }
    gp_log_write(GP_LOG_WARN, "job_failover", job->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:i,s:s}", "job_id", job->id, "agent_id", job->agent_id,
                           "reason", why, "attempt", job->attempts, "mode", "handoff"),
                 "the server running this job was lost before output reached the client; "
                 "offered again");
    count(j, "failovers_total", "mode=\"requeue\"", 1);
    discard_output(job);
    job->state = GPS_JOB_QUEUED;
    job->queued_since_us = gp_now_mono_us();
    persist(j, job);
    requeue_offered(j, job);
}

void gps_jobs_remote_lost(gps_jobs *j, gps_job *job, const char *why)
{
    if (job->remote)
        fail_over(j, job, why);
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
    if (!withdraw_first(j, job, a, true))
        deliver_to(j, job, a, 1);
}

void gps_jobs_offer_withdrawn(gps_jobs *j, gps_job *job, bool withdrawn)
{
    if (!job->withdrawing)
        return;
    job->withdrawing = false;
    if (!job->remote && job->state == GPS_JOB_QUEUED) {
        job->offered = false;
        if (withdrawn) {
            place(j, job, 0);
            return;
        }
        job->remote = true; /* a peer's claim came first: the follower assigns it */
    }
    /* (else the follower saw the claim first, or the job ended) */
    refill(j, job->withdraw_agent);
}

/* Error codes an agent reports for a failure of its own, not of the
 * request: another agent may well succeed. DEVICE_ERROR and
 * INSUFFICIENT_VRAM: a gguf agent's GPU failed or ran out of memory
 * mid-job (it takes that GPU out of service and re-initialises it). */
static bool agent_side_error(const char *code)
{
    static const char *const codes[] = {"AGENT_SHUTDOWN", "UPSTREAM_ERROR", "UPSTREAM_TIMEOUT",
                                        "UPSTREAM_MALFORMED", "DEVICE_ERROR",
                                        "INSUFFICIENT_VRAM"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(code, codes[i]) == 0)
            return true;
    return false;
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
            model_live(j, job->spec.model, agent_id))
            continue;
        int fb = fallback_live(j, job, agent_id);
        if (fb < 0)
            continue;
        sched_remove(j->sched, &job->sj);
        uint64_t now = gp_now_mono_us();
        if (now > job->queued_since_us)
            job->queue_ms += (long long)((now - job->queued_since_us) / 1000);
        const char *from = job->spec.model;
        switch_model(job, (size_t)fb);
        log_fallback(job, from, "queued");
        retry_place(j, job);
    }
}

void gps_jobs_agent_lost(gps_jobs *j, const char *agent_id, const char *why)
{
    /* fail_over may place a job on another agent but never frees one; it
     * may finish it, which moves it to the finished list: take the next
     * live job first. */
    gps_job *next;
    for (gps_job *job = j->head; job; job = next) {
        next = job->next;
        if ((job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING) &&
            strcmp(job->agent_id, agent_id) == 0)
            fail_over(j, job, why);
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
    /* As in gps_jobs_agent_lost: fail_over may move job to the finished
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
            fail_over(j, job, "agent_dropped_job");
            ended++;
        }
    }
    return ended;
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
            if (withdraw_first(j, job, a, false)) {
                withdrawing++;
                continue;
            }
            mark_assigned(j, job, a);
            job->delivery = delivery;
            size_t at = out->len;
            if ((taken && LIT(out, ",") < 0) ||
                gps_job_wire_append(out, job, now, j->opts.request_timeout_sec) != 0)
                out->len = at; /* (as json_array_append_new dropped a NULL wire) */
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

/* ------------------------------------------------------------------ */
/* Agent events                                                        */
/* ------------------------------------------------------------------ */

/* Bytes one attempt of job may send (jobs.h): what max_tokens tokens can
 * plausibly take, within the operator's cap. */
static long long event_budget(const gps_jobs *j, const gps_job *job)
{
    long long cap = j->opts.max_job_event_bytes > 0 ? j->opts.max_job_event_bytes
                                                    : GPS_JOBS_MAX_EVENT_BYTES_DEFAULT;
    /* An embed job's vectors are sized by its inputs, not max_tokens. */
    if (job->spec.kind == GPS_JOB_EMBED)
        return cap;
    long long mt = job->spec.max_tokens > 0 ? job->spec.max_tokens : 0;
    if (mt > GPS_AGENT_MAX_TOKENS)
        mt = GPS_AGENT_MAX_TOKENS;
    long long b = GPS_JOBS_EVENT_BYTES_BASE + (mt + MAX_TOKENS_SLACK) * GPS_JOBS_EVENT_BYTES_PER_TOKEN;
    return b < cap ? b : cap;
}

static void output_too_large(gps_jobs *j, gps_job *job, const char *what)
{
    char m[160];
    snprintf(m, sizeof m, "the agent sent more %s than the request allows", what);
    count(j, "agent_events_dropped_total", "reason=\"too_large\"", 1);
    fail_job(j, job, 502, "AGENT_OUTPUT_TOO_LARGE", m, 0);
}

static bool is_progress(const json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    return type && strcmp(type, "progress") == 0;
}

/* Prefill progress: proof of life, not output. Only the latest counts are
 * kept (never the event buffer: a long prefill must not grow memory) and
 * nothing is relayed. */
static void apply_progress(gps_job *job, const json_t *ev, const gps_event_in *in)
{
    const json_t *d = json_object_get(ev, "prompt_tokens_done");
    const json_t *t = json_object_get(ev, "prompt_tokens_total");
    bool plain = in && in->plain; /* (the check bounded both counts: >= 0) */
    long long dv = plain ? in->progress_done : json_is_integer(d) ? json_integer_value(d) : -1;
    long long tv = plain ? in->progress_total : json_is_integer(t) ? json_integer_value(t) : -1;
    if (dv >= 0)
        job->progress_done = dv;
    if (tv >= 0) {
        job->progress_total = tv;
        /* An attempt that continues nothing counts the client's prompt:
         * the usage if this agent is lost before its end (item 7). */
        if (job->continued_tokens == 0 && job->progress_total > 0)
            job->prompt_tokens = job->progress_total;
    }
}

/* usage.prompt_tokens is the client's prompt, whatever an attempt was
 * given (issue 10 item 7). An attempt that continues earlier output was
 * given the prompt plus that output (as token ids, or as text it
 * re-tokenized), and reports that count pt: keep the client's count when
 * an earlier attempt reported it, else take the continued tokens off
 * (exact for a token continuation, about right for a text one). */
static long long client_prompt(const gps_job *job, long long pt)
{
    if (job->continued_tokens <= 0)
        return pt;
    if (job->prompt_tokens > 0)
        return job->prompt_tokens;
    return pt > job->continued_tokens ? pt - job->continued_tokens : pt;
}

/* notify for an event that came as a tree (ev) or as the fields of a
 * plain one (in): a plain event's tree is parsed from its text only for a
 * subscriber that reads trees (native tasks, a handoff proxy); the relay
 * reads the job's fields. */
static void notify_in(gps_jobs *j, gps_job *job, gps_event_type t, json_t *ev,
                      const gps_event_in *in)
{
    if (ev || !in || !in->plain || !wants_tree(job)) {
        notify(j, job, t, ev);
        return;
    }
    json_t *tree = gp_json_loadb(in->raw, in->raw_len); /* (NULL on ENOMEM) */
    notify(j, job, t, tree);
    json_decref(tree);
}

/* Apply one checked event (agent_check.h): ev, or without a tree the
 * fields of a plain event (in->plain; upload_read.c read and checked it
 * as the checker reads its tree). Nothing of ev is kept: what a
 * subscriber needs it copies during notify. in (or NULL): the reader's
 * record, whose bytes is the event's compact size. */
static void apply_one(gps_jobs *j, gps_job *job, json_t *ev, const gps_event_in *in)
{
    bool plain = in && in->plain;
    gps_event_type t = plain ? in->type
                             : gps_event_type_parse(
                                   json_string_value(json_object_get(ev, "type")));
    uint64_t now = gp_now_mono_us();
    job->last_event_us = now;
    /* Every event counts, unknown ones too: 40 uploads of 3.5 MB of
     * "metrics" on a max_tokens=10 job must not be 140 MB. */
    job->agent_bytes += (long long)(in && in->bytes ? in->bytes : gp_json_compact_size(ev));
    if (job->agent_bytes > event_budget(j, job)) {
        output_too_large(j, job, "event data");
        return;
    }
    if (plain ? in->progress : is_progress(ev)) {
        apply_progress(job, ev, in);
        return;
    }
    switch (t) {
    case GPS_EV_STARTED:
        job->state = GPS_JOB_RUNNING;
        notify_in(j, job, t, ev, in);
        break;
    case GPS_EV_TOKEN: {
        job->state = GPS_JOB_RUNNING;
        const char *text = json_string_value(json_object_get(ev, "text"));
        /* The text of all attempts together stays within one attempt's
         * budget: a failover continues the same text. */
        if ((long long)(job->text.len + strlen(text)) > event_budget(j, job) ||
            job->completion_tokens >= job->spec.max_tokens + MAX_TOKENS_SLACK) {
            /* A misbehaving agent must not grow server memory without bound. */
            output_too_large(j, job, "output");
            break;
        }
        gp_buf_append(&job->text, text, strlen(text));
        /* an event may stand for several tokens (text held back by the
         * agent's stop matcher comes with a later token) */
        job->completion_tokens += ids_record(job, ev);
        if (!job->first_token_us)
            job->first_token_us = now;
        count(j, "tokens_generated_total", NULL, 1);
        notify(j, job, t, ev);
        break;
    }
    case GPS_EV_TOOL_CALL: {
        job->state = GPS_JOB_RUNNING;
        const char *a = json_string_value(json_object_get(ev, "arguments"));
        job->tool_bytes += a ? strlen(a) : 0;
        job->tool_bytes += 64; /* id, name: count every piece */
        if ((long long)job->tool_bytes > event_budget(j, job)) {
            output_too_large(j, job, "tool call data");
            break;
        }
        if (!job->first_token_us)
            job->first_token_us = now;
        notify(j, job, t, ev);
        break;
    }
    case GPS_EV_EMBEDDING:
        /* Only an embed job's subscriber (api_embeddings.c) keeps them. */
        if (job->spec.kind != GPS_JOB_EMBED)
            break;
        job->state = GPS_JOB_RUNNING;
        notify(j, job, t, ev);
        break;
    case GPS_EV_METRICS: {
        json_t *tps = json_object_get(ev, "tokens_per_sec");
        if (plain ? in->has_tps : json_is_number(tps))
            job->tokens_per_sec = plain ? in->tokens_per_sec : json_number_value(tps);
        json_t *pt = json_object_get(ev, "prompt_tokens");
        long long ptv = plain                                                 ? in->prompt_tokens
                        : json_is_integer(pt) && json_integer_value(pt) >= 0 ? json_integer_value(pt)
                                                                              : -1;
        if (ptv >= 0)
            job->prompt_tokens = client_prompt(job, ptv);
        /* An openai agent whose upstream has no count endpoint estimated
         * (docs/agent.md "Counting tokens"): the reply says so. */
        json_t *ce = json_object_get(ev, "count_estimated");
        if (plain ? in->count_estimated : json_is_number(ce) && json_number_value(ce) != 0)
            job->count_estimated = true;
        /* Subscribers (native tasks) record what they are given: relay a
         * bounded number per attempt; later ones only update the counts. */
        if (job->metrics_relayed >= GPS_JOBS_MAX_METRICS_RELAYED) {
            count(j, "agent_events_dropped_total", "reason=\"metrics\"", 1);
            break;
        }
        job->metrics_relayed++;
        notify_in(j, job, t, ev, in);
        break;
    }
    case GPS_EV_END: {
        const char *fr = plain ? in->finish_reason
                               : json_string_value(json_object_get(ev, "finish_reason"));
        gp_copy_str(job->finish_reason, sizeof job->finish_reason,
                    fr && strcmp(fr, "length") == 0       ? "length"
                    : fr && strcmp(fr, "tool_calls") == 0 ? "tool_calls"
                                                          : "stop");
        /* The stop string the agent stopped on (agent_check bounded it):
         * the Anthropic dialect reports it as stop_sequence. */
        const char *ss = plain ? in->stop_sequence
                               : json_string_value(json_object_get(ev, "stop_sequence"));
        free(job->stop_sequence);
        job->stop_sequence = ss ? strdup(ss) : NULL;
        json_t *um = json_object_get(ev, "upstream_meta");
        json_decref(job->upstream_meta);
        job->upstream_meta = json_is_object(um) ? json_incref(um) : NULL;
        json_t *u = json_object_get(ev, "usage");
        json_t *pt = json_object_get(u, "prompt_tokens");
        json_t *ct = json_object_get(u, "completion_tokens");
        long long ptv = plain                                                 ? in->prompt_tokens
                        : json_is_integer(pt) && json_integer_value(pt) >= 0 ? json_integer_value(pt)
                                                                              : -1;
        long long ctv = plain                                                 ? in->completion_tokens
                        : json_is_integer(ct) && json_integer_value(ct) >= 0 ? json_integer_value(ct)
                                                                              : -1;
        if (ptv >= 0)
            job->prompt_tokens = client_prompt(job, ptv);
        /* usage counts this attempt; earlier attempts' tokens come first. */
        if (ctv >= 0)
            job->completion_tokens = job->continued_tokens + ctv;
        end_on_agent(j, job, true);
        finish(j, job, GPS_JOB_DONE);
        if (gp_log_enabled(GP_LOG_INFO)) {
            json_t *f = log_fields(&j->log_done);
            bool ok = f && lf_str(f, "job_id", job->id) && lf_str(f, "model", job->spec.model) &&
                      lf_str(f, "agent_id", job->agent_id) &&
                      lf_int(f, "ms", total_ms(job)) &&
                      lf_int(f, "prompt_tokens", job->prompt_tokens) &&
                      lf_int(f, "completion_tokens", job->completion_tokens) &&
                      lf_str(f, "finish_reason", job->finish_reason);
            gp_log_write(GP_LOG_INFO, "job_done", job->correlation_id, log_fields_ref(f, ok),
                         "job finished");
        }
        notify_in(j, job, t, ev, in);
        break;
    }
    case GPS_EV_ERROR: {
        const char *code = json_string_value(json_object_get(ev, "code"));
        const char *message = json_string_value(json_object_get(ev, "message"));
        char c[64];
        snprintf(c, sizeof c, "%s", code ? code : "AGENT_ERROR");
        /* The agent's own failure (drain timeout, its upstream died): fail
         * over like a lost agent. AGENT_SHUTDOWN always (the agent is
         * going away, as if lost); upstream failures only when another
         * live agent serves the model, else the agent's error stands. */
        if (job->spec.failover != GPS_FAILOVER_ERROR && agent_side_error(c) &&
            job->attempts < j->opts.max_attempts &&
            (!job->client_saw_output || job->spec.failover == GPS_FAILOVER_CONTINUE) &&
            (strcmp(c, "AGENT_SHUTDOWN") == 0 || other_agent_live(j, job, job->agent_id) ||
             fallback_live(j, job, job->agent_id) >= 0)) {
            char lost[64];
            snprintf(lost, sizeof lost, "%s", job->agent_id);
            fail_over(j, job, c);
            /* It reported the job over itself: nothing to cancel. */
            cancel_take(j, lost, job->id);
            break;
        }
        /* The agent is still alive and reports the job failed: do not keep
         * a cancel record for it. */
        end_on_agent(j, job, false);
        /* The request itself was at fault (prompt longer than the context,
         * input the model refuses): a client error, not a bad gateway. */
        int status = strcmp(c, "CONTEXT_OVERFLOW") == 0 || strcmp(c, "INVALID_REQUEST") == 0
                         ? 400
                         : 502;
        fail_job(j, job, status, c, message ? message : "the agent reported an error", 0);
        cancel_take(j, job->agent_id, job->id);
        break;
    }
    default:
        /* Unknown types (a newer agent): accepted so that the job goes on,
         * counted in the byte budget above, neither kept nor relayed. */
        count(j, "agent_events_dropped_total", "reason=\"unknown_type\"", 1);
        break;
    }
}

/* The token event handed to subscribers, set to e's text and id in place:
 * subscribers read a token event's text and id only and keep no reference
 * (they copy), so one object with one string (and one integer) serves every
 * token, its values overwritten; made anew should any of them ever be kept.
 * NULL when out of memory. */
static json_t *token_event(gps_jobs *j, const gps_event_in *e)
{
    json_t *ev = j->tok_ev;
    json_t *text = j->tok_text; /* ev's "text", not looked up per token */
    if (ev && (ev->refcount > 1 || !text || text->refcount > 1 ||
               (j->tok_id && j->tok_id->refcount > 2))) {
        json_decref(j->tok_id);
        j->tok_id = NULL;
        json_decref(ev);
        ev = j->tok_ev = NULL;
        text = j->tok_text = NULL;
    }
    if (!ev) {
        ev = j->tok_ev = json_pack("{s:s,s:s}", "type", "token", "text", "");
        if (!ev)
            return NULL;
        text = j->tok_text = json_object_get(ev, "text");
    }
    if (json_string_setn_nocheck(text, e->text, e->len) < 0)
        return NULL;
    /* Native tasks keep a token's id for a token-exact resume. */
    if (e->token_id >= 0 && j->tok_id) {
        json_integer_set(j->tok_id, e->token_id);
    } else if (e->token_id >= 0) {
        json_t *id = json_integer(e->token_id);
        if (!id || json_object_set_nocheck(ev, "token_id", id) < 0) {
            json_decref(id);
            return NULL;
        }
        j->tok_id = id; /* ev's reference and this one */
    } else if (j->tok_id) {
        json_object_del(ev, "token_id");
        json_decref(j->tok_id);
        j->tok_id = NULL;
    }
    return ev;
}

/* A token read without a tree (gps_event_in): what apply_one does for a
 * token event, from its fields. Returns whether it was generated (counted
 * by the caller, once per upload). */
/* now: the upload's arrival (apply_events reads the clock once for all
 * its events; a clock read per token was a tenth of this function). */
static bool apply_token(gps_jobs *j, gps_job *job, const gps_event_in *e, uint64_t now)
{
    job->last_event_us = now;
    job->agent_bytes += (long long)e->bytes;
    if (job->agent_bytes > event_budget(j, job)) {
        output_too_large(j, job, "event data");
        return false;
    }
    job->state = GPS_JOB_RUNNING;
    if ((long long)(job->text.len + e->len) > event_budget(j, job) ||
        job->completion_tokens >= job->spec.max_tokens + MAX_TOKENS_SLACK) {
        output_too_large(j, job, "output");
        return false;
    }
    gp_buf_append(&job->text, e->text, e->len);
    job->completion_tokens += ids_record_one(job, e->token_id);
    if (!job->first_token_us)
        job->first_token_us = now;
    /* Cursor subscribers (the relay) read the text just appended: the
     * event's tree, and its string's allocation, only for the others. */
    if (!wants_tree(job)) {
        notify(j, job, GPS_EV_TOKEN, NULL);
        return true;
    }
    json_t *ev = token_event(j, e);
    if (ev)
        notify(j, job, GPS_EV_TOKEN, ev);
    return true;
}

static int apply_events(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                        json_t *events, const gps_event_in *in, size_t n_in, bool checked,
                        bool *cancel, long long *expected_seq, char *msg, size_t msglen)
{
    *cancel = false;
    *expected_seq = -1;
    gps_job *job = gps_jobs_find(j, job_id);
    if (!job) {
        done_rec *r = done_rec_find(j, job_id);
        if (!r) {
            snprintf(msg, msglen, "unknown job '%.60s'", job_id);
            return 404;
        }
        /* Finished and retired: answered as the whole job would be. */
        bool had_cancel = cancel_take(j, agent_id, job_id);
        if (strcmp(r->agent_id, agent_id) != 0) {
            snprintf(msg, msglen, "job '%.60s' is not assigned to this agent", job_id);
            return 409;
        }
        *cancel = r->state != GPS_JOB_DONE || had_cancel;
        return 0;
    }
    if (strcmp(job->agent_id, agent_id) != 0) {
        snprintf(msg, msglen, "job '%.60s' is not assigned to this agent", job_id);
        cancel_take(j, agent_id, job_id);
        return 409;
    }
    if (gps_job_terminal(job)) {
        /* A job the server finished early (stop sequence) still has a
         * cancel record: the agent must stop generating. */
        bool had_cancel = cancel_take(j, agent_id, job_id);
        *cancel = job->state != GPS_JOB_DONE || had_cancel;
        return 0;
    }
    /* The caller checked the body (gps_agent_events_check): every field
     * and number is within bounds, so nothing below can overflow. */
    if (seq < 0 || (!in && !json_is_array(events))) {
        snprintf(msg, msglen, "'seq' must be >= 0 and 'events' an array");
        return 400;
    }
    size_t n = in ? n_in : json_array_size(events);
    char field[96];
    for (size_t i = 0; i < n && !checked; i++) /* for callers that did not check */
        if (gps_agent_event_check(json_array_get(events, i), i, field, sizeof field, msg,
                                  msglen) < 0)
            return 400;
    if (seq > job->agent_seq) {
        *expected_seq = job->agent_seq;
        snprintf(msg, msglen, "seq %lld is beyond the %lld events received", seq,
                 job->agent_seq);
        return 409;
    }
    /* A read upload's caller touches the agent once for all its entries
     * (a registry lookup per entry was a tenth of an entry's cost). */
    if (!in)
        registry_touch(j->reg, registry_get(j->reg, agent_id), gp_now_mono_ms());
    /* Any accepted upload is agent activity, even a retry of events
     * already applied: the stall timer measures the agent's silence. */
    job->last_event_us = gp_now_mono_us();
    long long generated = 0; /* tokens read without a tree: counted once below */
    for (size_t i = (size_t)(job->agent_seq - seq); i < n; i++) {
        job->agent_seq++;
        bool token = in && !in[i].ev && !in[i].plain;
        if (token)
            generated += apply_token(j, job, &in[i], job->last_event_us);
        else
            apply_one(j, job, in ? in[i].ev : json_array_get(events, i), in ? &in[i] : NULL);
        if (gps_job_terminal(job))
            break;
        /* Only an event of another kind (the agent's error) fails the job
         * over; a token never moves it, so no compare per token. */
        if (!token && strcmp(job->agent_id, agent_id) != 0) {
            count(j, "tokens_generated_total", NULL, (double)generated);
            return 0; /* failed over away from this agent by its own error */
        }
    }
    if (generated)
        count(j, "tokens_generated_total", NULL, (double)generated);
    if (job->state == GPS_JOB_CANCELLED || job->state == GPS_JOB_FAILED) {
        /* Failed by the agent's own error event: nothing to cancel. */
        *cancel = job->state == GPS_JOB_CANCELLED || cancel_take(j, agent_id, job_id);
    } else if (job->state == GPS_JOB_DONE) {
        *cancel = cancel_take(j, agent_id, job_id); /* finished early by the server */
    }
    return 0;
}

int gps_jobs_apply_events(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          json_t *events, bool *cancel, long long *expected_seq, char *msg,
                          size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, events, NULL, 0, false, cancel, expected_seq,
                        msg, msglen);
}

int gps_jobs_apply_checked_events(gps_jobs *j, const char *job_id, const char *agent_id,
                                  long long seq, json_t *events, bool *cancel,
                                  long long *expected_seq, char *msg, size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, events, NULL, 0, true, cancel, expected_seq,
                        msg, msglen);
}

int gps_jobs_apply_upload(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          const gps_event_in *evs, size_t n, bool *cancel,
                          long long *expected_seq, char *msg, size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, NULL, evs, n, true, cancel, expected_seq, msg,
                        msglen);
}

/* ------------------------------------------------------------------ */
/* Timers                                                              */
/* ------------------------------------------------------------------ */

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
            continue; /* not yet moved (cannot happen: finish moves it) */
        if (now - job->created_us > rt) {
            fail_job(j, job, 504, "TIMEOUT", "the request timed out", 0);
            continue;
        }
        if (job->state == GPS_JOB_QUEUED && now - job->queued_since_us > qt) {
            int retry = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
            fail_job(j, job, 503, "QUEUE_TIMEOUT", "no agent took the job in time", retry);
            continue;
        }
        if ((job->state == GPS_JOB_ASSIGNED || job->state == GPS_JOB_RUNNING) &&
            now - job->last_event_us > stall)
            fail_over(j, job, "stalled");
    }
    for (cancel_rec **pp = &j->cancels; *pp;) {
        /* Records added by this very sweep (a stalled job's agent, a
         * timeout) are newer than now: unsigned now - since would wrap. */
        if (now > (*pp)->since_us && now - (*pp)->since_us > CANCEL_KEEP_US) {
            cancel_rec *c = *pp;
            *pp = c->next;
            free(c);
        } else {
            pp = &(*pp)->next;
        }
    }
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
    if (base) {
        j->sweep = event_new(base, -1, EV_PERSIST, sweep_cb, j);
        struct timeval tv = {0, SWEEP_MS * 1000};
        if (!j->sweep || event_add(j->sweep, &tv) < 0) {
            if (j->sweep)
                event_free(j->sweep);
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
            job_free(job);
            job = n;
        }
    }
    cancel_rec *c = j->cancels;
    while (c) {
        cancel_rec *n = c->next;
        free(c);
        c = n;
    }
    done_recs_expire(j, 0);
    json_decref(j->tok_id);
    json_decref(j->tok_ev);
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

/* handoff: see handoff.h. */
#include "server/handoff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/registry.h"
#include "server/fleet/sched.h"
#include "server/timer.h"

#define BATCH_MS 20       /* a relay batch waits at most this long ... */
#define BATCH_MAX 32      /* ... or for this many events */
#define CLAIM_MAX 16      /* offers taken by one claim */
#define PEEK_MAX 64       /* offers looked at before a claim */
#define LABELS_MAX 16     /* x_pool_options.labels: at most 16 (reqcheck.c) */

/* LISTEN/NOTIFY channels (gps_store_listen): a new offer (payload: its
 * model; "" after a sweep gave claimed rows back), and something new about
 * one job (payload: its id): a relayed batch, its claim, its end. */
#define CH_OFFER "gps_handoff_offer"
#define CH_JOB "gps_handoff_job"
/* A server's free slots changed (payload: its id; migration 0013): the
 * others read them now and offer what waits in their queues. */
#define CH_FREE "gps_handoff_free"
#define PEER_OLD_SLOTS 1000000 /* a peer that never wrote servers.free: as before */

/* An offered job this server follows (the client's server). */
typedef struct follow {
    struct follow *next;
    struct gps_handoff *h;
    char job_id[40];
    char server[40];      /* the claimer followed ("" none) */
    int64_t attempt;      /* the attempt followed (0: none) */
    int64_t known;        /* the row's attempt as last read */
    long long seen;       /* events of that attempt applied */
    bool reading;         /* a read in flight */
    bool withdraw;        /* the job is queued here too and an agent here chose it:
                             the offer is to be withdrawn (again after an error) */
    bool withdrawing;     /* that delete in flight */
    bool again;           /* woken while reading: read again after it */
    bool gone;            /* the job ended, or its offer was withdrawn: freed once
                             no store op is in flight */
} follow;

/* A claimed job run here (the claimer's side). */
typedef struct proxy {
    struct proxy *next;
    struct gps_handoff *h;
    char job_id[40];
    int64_t attempt;
    gps_job *job;         /* the local job while subscribed, else NULL */
    json_t *pending;      /* events not yet written */
    long long next_idx;   /* index of pending's first event in this attempt */
    uint64_t born_us;     /* monotonic: when the claim gave it */
    struct event *timer;  /* the batch timer */
    bool writing;         /* a batch write in flight */
    bool ended;           /* the terminal event is in pending (or written) */
    bool output;          /* an output event was relayed (the first goes at once) */
    bool done;            /* nothing more to write: freed once idle */
    /* An event could not be queued (out of memory): the job ends here with
     * oom_ev (INTERNAL, held from the proxy's start so that it needs no
     * allocation then) as its last relayed event. */
    bool oom;
    bool oom_queued;      /* oom_ev is in pending (or written) */
    json_t *oom_ev;
} proxy;

struct gps_handoff {
    struct event_base *base;
    gps_store *store;
    gps_jobs *jobs;
    char id[40];
    int period_ms, models_ms, queue_timeout_sec, request_timeout_sec;
    struct event *tick, *models_tick;
    gps_store_listener *listener; /* NULL: polls only */
    json_t *peer_models;  /* object: name -> true, what the other live servers serve */
    json_t *peer_free;    /* array of {m, l, n} (or {m, any, n}): what their free
                             ready agents could take now (migration 0013) */
    long long peer_free_slots; /* the sum of peer_free's n */
    json_t *free_sent;    /* what this server last wrote as its own (NULL: never) */
    bool gate;            /* servers.free exists: queued jobs are offered only where
                             a peer has a free agent that fits */
    follow *follows;
    proxy *proxies;
    bool claiming, mine_reading, peers_reading, sweeping, stopped;
    bool claim_again, mine_again, peers_again; /* woken while that read was in flight */
    uint64_t mine_sent_us;
};

/* A JSON text read back from the shared database (a spec, a relayed
 * batch, a peer's models): a new reference, or NULL for a text that is
 * not JSON, or NULL with *oom set when an allocation failed during the
 * load. jansson's own load could then have dropped a byte from a long
 * string and succeeded (a prompt, a token changed), or refused a valid
 * text; each caller says what it does instead. */
static json_t *db_json(const char *text, bool *oom)
{
    json_error_t je;
    /* gp_json_loadb: gp_json_read first, then the checked load for what
     * it declines (jansson's lexer can also read and write past its token
     * buffer when that cannot grow). */
    json_t *v = gp_json_loadb(text, strlen(text), &je);
    *oom = !v && json_error_code(&je) == json_error_out_of_memory;
    return v;
}

/* ------------------------------------------------------------------ */
/* The wire object back to a spec (the claimer's side)                 */
/* ------------------------------------------------------------------ */

/* A copy of the wire's string v (NULL when it is not one); *oom set when
 * the copy failed: the spec would lack what the offer holds. */
static char *dup_str(const json_t *v, bool *oom)
{
    char *s = json_is_string(v) ? strdup(json_string_value(v)) : NULL;
    *oom |= json_is_string(v) && !s;
    return s;
}

/* The same for a member of any type (null and absent: NULL). */
static json_t *copy_of(const json_t *v, bool *oom)
{
    json_t *c = v && !json_is_null(v) ? json_deep_copy(v) : NULL;
    *oom |= v && !json_is_null(v) && !c;
    return c;
}

/* The offer's constraints (gps_job_constraints) into spec: the claimer's
 * scheduler honours them as the offering server's would have. */
static int constraints_to_spec(const json_t *c, gps_job_spec *spec)
{
    json_t *labels = json_object_get(c, "labels"), *fb = json_object_get(c, "fallback_models");
    size_t n = json_is_object(labels) ? json_object_size(labels) : 0;
    if (n) {
        spec->labels = calloc(n, sizeof *spec->labels);
        if (!spec->labels)
            return -1;
        const char *k;
        json_t *v;
        json_object_foreach(labels, k, v)
        {
            if (!json_is_string(v))
                continue;
            registry_label *l = &spec->labels[spec->n_labels++];
            l->key = strdup(k);
            l->value = strdup(json_string_value(v));
            if (!l->key || !l->value)
                return -1;
        }
    }
    size_t i;
    json_t *v;
    json_array_foreach(fb, i, v)
    {
        if (json_is_string(v) && spec->n_fallback < GPS_MAX_FALLBACK_MODELS &&
            !(spec->fallback_models[spec->n_fallback++] = strdup(json_string_value(v))))
            return -1;
    }
    bool oom = false;
    spec->prefer_agent = dup_str(json_object_get(c, "prefer_agent"), &oom);
    const char *mode = json_string_value(json_object_get(c, "failover"));
    spec->failover = !mode || strcmp(mode, "continue") == 0 ? GPS_FAILOVER_CONTINUE
                     : strcmp(mode, "restart") == 0         ? GPS_FAILOVER_RESTART
                                                            : GPS_FAILOVER_ERROR;
    return oom ? -1 : 0;
}

int gps_handoff_spec_from_wire(const json_t *w, gps_job_spec *spec, char *err, size_t errlen)
{
    memset(spec, 0, sizeof *spec);
    const char *kind = json_string_value(json_object_get(w, "kind"));
    const char *model = json_string_value(json_object_get(w, "model"));
    json_t *params = json_object_get(w, "params");
    if (!kind || !model || !json_is_object(params)) {
        snprintf(err, errlen, "the offer's spec lacks kind, model or params");
        return -1;
    }
    spec->kind = strcmp(kind, "chat") == 0           ? GPS_JOB_CHAT
                 : strcmp(kind, "count_tokens") == 0 ? GPS_JOB_COUNT_TOKENS
                 : strcmp(kind, "embeddings") == 0   ? GPS_JOB_EMBED
                                                     : GPS_JOB_COMPLETION;
    spec->api = "openai";
    /* Every copy checked: a spec short of a member the offer holds (its
     * prompt, its messages) would run another request under the job's id. */
    bool oom = false;
    spec->model = strdup(model);
    oom |= !spec->model;
    spec->prompt = dup_str(json_object_get(w, "prompt"), &oom);
    spec->messages = copy_of(json_object_get(w, "messages"), &oom);
    spec->input = copy_of(json_object_get(w, "input"), &oom);
    spec->tools = copy_of(json_object_get(w, "tools"), &oom);
    spec->tool_choice = copy_of(json_object_get(w, "tool_choice"), &oom);
    spec->response_format = copy_of(json_object_get(w, "response_format"), &oom);
    spec->max_tokens = json_integer_value(json_object_get(params, "max_tokens"));
    spec->temperature = json_number_value(json_object_get(params, "temperature"));
    spec->top_p = json_number_value(json_object_get(params, "top_p"));
    spec->top_k = json_integer_value(json_object_get(params, "top_k"));
    json_t *stop = json_object_get(params, "stop");
    spec->stop = json_is_array(stop) && json_array_size(stop) ? copy_of(stop, &oom) : NULL;
    json_t *seed = json_object_get(params, "seed");
    if (json_is_integer(seed)) {
        spec->has_seed = true;
        spec->seed = json_integer_value(seed);
    }
    spec->user = dup_str(json_object_get(w, "user"), &oom);
    spec->session = dup_str(json_object_get(w, "session"), &oom);
    const char *prio = json_string_value(json_object_get(w, "priority"));
    spec->priority = prio && strcmp(prio, "batch") == 0 ? GPS_PRIO_BATCH : GPS_PRIO_INTERACTIVE;
    const char *via = json_string_value(json_object_get(w, "pool_via"));
    if (via)
        snprintf(spec->pool_via, sizeof spec->pool_via, "%s", via);
    /* The offering server's tenant tag narrows this one's (no key here):
     * two tenants there stay two tenants in this server's prefix caches. */
    spec->tenant_sub = dup_str(json_object_get(w, "tenant"), &oom);
    spec->prompt_tokens_first = json_is_true(json_object_get(w, "prompt_tokens_first"));
    spec->failover = GPS_FAILOVER_CONTINUE;
    if (oom || constraints_to_spec(json_object_get(w, "constraints"), spec) != 0) {
        snprintf(err, errlen, "out of memory");
        return -2;
    }
    if (spec->max_tokens < 1) {
        snprintf(err, errlen, "the offer's spec has no model or max_tokens");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The offering side: offer, follow, end                               */
/* ------------------------------------------------------------------ */

static follow *follow_find(gps_handoff *h, const char *job_id)
{
    for (follow *f = h->follows; f; f = f->next)
        if (!f->gone && strcmp(f->job_id, job_id) == 0)
            return f;
    return NULL;
}

/* Does a live peer serve the job's model or one of its fallbacks? */
static bool can_offer(void *arg, const gps_job *job)
{
    gps_handoff *h = arg;
    const char *names[1 + GPS_MAX_FALLBACK_MODELS];
    size_t n = h->stopped ? 0 : gps_job_models(job, names, 1 + GPS_MAX_FALLBACK_MODELS);
    for (size_t i = 0; i < n; i++)
        if (json_object_get(h->peer_models, names[i]))
            return true;
    return false;
}

/* Offers of this server not claimed yet: each may take one of the peers'
 * free slots. */
static long long waiting_offers(const gps_handoff *h)
{
    long long n = 0;
    for (const follow *f = h->follows; f; f = f->next)
        n += !f->gone && f->attempt == 0;
    return n;
}

/* Does one of the peers' free entries fit: a name of the job's, and its
 * labels (an old peer's entry: labels unknown, taken as met)? */
static bool entry_fits(const json_t *e, const char *const *names, size_t n, const json_t *labels)
{
    if (json_integer_value(json_object_get(e, "n")) <= 0)
        return false;
    const json_t *m = json_object_get(e, "m"), *v;
    bool named = false;
    size_t i;
    json_array_foreach(m, i, v)
    {
        for (size_t k = 0; k < n && !named; k++)
            named = json_is_string(v) && strcmp(json_string_value(v), names[k]) == 0;
    }
    if (!named || json_is_true(json_object_get(e, "any")))
        return named;
    const json_t *have = json_object_get(e, "l");
    const char *key;
    json_object_foreach((json_t *)labels, key, v)
    {
        const char *got = json_string_value(json_object_get(have, key));
        if (!got || !json_is_string(v) || strcmp(got, json_string_value(v)) != 0)
            return false;
    }
    return true;
}

/* A job waiting in this server's queue is offered only while some live
 * peer has a free agent that fits it (model or fallback, labels), and not
 * beyond the peers' free slots: in a busy cluster no row is written that
 * no peer could claim, and no withdraw is paid before a local dispatch.
 * gps_jobs_offer_queued offers the rest when a peer frees up. Without
 * migration 0013 as before: whenever a peer serves the model. */
static bool can_offer_queued(void *arg, const gps_job *job)
{
    gps_handoff *h = arg;
    if (h->stopped || !h->gate)
        return can_offer(arg, job);
    if (h->peer_free_slots <= waiting_offers(h))
        return false;
    const char *names[1 + GPS_MAX_FALLBACK_MODELS];
    size_t n = gps_job_models(job, names, 1 + GPS_MAX_FALLBACK_MODELS);
    json_t *c = gps_job_constraints(job);
    const json_t *labels = json_object_get(c, "labels"), *e;
    bool fits = false;
    size_t i;
    json_array_foreach(h->peer_free, i, e)
    {
        if ((fits = entry_fits(e, names, n, labels)))
            break;
    }
    json_decref(c);
    return fits;
}

static bool offer(void *arg, gps_job *job)
{
    gps_handoff *h = arg;
    int64_t now = gp_now_wall_ms();
    json_t *w = gps_job_wire(job, gp_now_mono_us(), h->request_timeout_sec);
    json_t *c = gps_job_constraints(job);
    follow *f = calloc(1, sizeof *f);
    if (w && c)
        json_object_set_new(w, "constraints", c);
    else
        json_decref(c);
    if (!w || !c || !f ||
        gps_store_handoff_offer(h->store, gps_job_id(job), gps_job_model(job), w, h->id, now,
                                now + (int64_t)h->queue_timeout_sec * 1000) != 0) {
        /* Not offered: a remote job waits out its queue timeout, a queued
         * one stays in this server's queue only. */
        gp_log_error("handoff_offer_failed", "job %s could not be offered", gps_job_id(job));
        json_decref(w);
        free(f);
        return false;
    }
    json_decref(w);
    gps_store_notify(h->store, CH_OFFER, gps_job_model(job)); /* after the offer commits */
    snprintf(f->job_id, sizeof f->job_id, "%s", gps_job_id(job));
    f->h = h;
    f->next = h->follows;
    h->follows = f;
    bool queued = !gps_job_remote(job);
    gp_log_write(GP_LOG_INFO, "job_handoff_offered", gps_job_correlation_id(job),
                 json_pack("{s:s,s:s,s:b}", "job_id", gps_job_id(job), "model",
                           gps_job_model(job), "queued_here", queued),
                 queued ? "the agents here are busy: queued here and offered to the other "
                          "servers, the first to take it runs it"
                        : "no agent here serves the model: offered to the other servers");
    return true;
}

/* The answer to a withdraw: the job goes to the agent here, or to the
 * peer that claimed it first (the follower assigns it). */
static void withdraw_done(void *arg, int status, const gps_store_cells *res)
{
    follow *f = arg;
    gps_handoff *h = f->h;
    f->withdrawing = false;
    if (h->stopped || f->gone)
        return;
    gps_job *job = gps_jobs_find(h->jobs, f->job_id);
    if (!job || gps_job_terminal(job)) {
        f->gone = true;
        return;
    }
    if (status != 0 || !res)
        return; /* unknown: asked again at the next tick (f->withdraw stays) */
    f->withdraw = false;
    bool withdrawn = res->changes > 0;
    if (withdrawn)
        f->gone = true; /* nothing left to follow */
    gp_log_write(GP_LOG_INFO, withdrawn ? "job_handoff_withdrawn" : "job_handoff_withdraw_late",
                 gps_job_correlation_id(job), json_pack("{s:s}", "job_id", f->job_id),
                 withdrawn ? "offer withdrawn: an agent here runs the job"
                           : "a peer claimed the offer first: it runs the job");
    gps_jobs_offer_withdrawn(h->jobs, job, withdrawn);
}

static void withdraw_send(follow *f)
{
    if (f->withdrawing || f->gone)
        return;
    if (gps_store_handoff_withdraw_async(f->h->store, f->job_id, withdraw_done, f) == 0)
        f->withdrawing = true;
}

static bool withdraw(void *arg, gps_job *job)
{
    gps_handoff *h = arg;
    follow *f = h->stopped ? NULL : follow_find(h, gps_job_id(job));
    if (!f)
        return false;
    f->withdraw = true;
    withdraw_send(f); /* on failure: again at the next tick */
    return true;
}

static void ended(void *arg, gps_job *job)
{
    gps_handoff *h = arg;
    follow *f = follow_find(h, gps_job_id(job));
    if (!f)
        return;
    f->gone = true;
    /* Done: the row goes. Otherwise (cancelled, failed, timed out) it is
     * marked cancelled: a waiting offer is never claimed, a claimer stops. */
    bool done = gps_job_state_of(job) == GPS_JOB_DONE;
    gps_store_handoff_end(h->store, f->job_id, done);
    if (!done)
        gps_store_notify(h->store, CH_JOB, f->job_id); /* the claimer stops now */
}

/* Apply the batches of the attempt followed (rows in first_seq order). */
static void follow_apply(gps_handoff *h, follow *f, const gps_store_cells *res)
{
    for (size_t i = 0; i < res->nrows; i++) {
        const char *fs = res->cell[i * res->ncols + 3], *evs = res->cell[i * res->ncols + 4];
        if (!fs || !evs)
            continue;
        long long first = atoll(fs);
        if (first / GPS_HANDOFF_SEQ_BASE != f->attempt)
            continue; /* another attempt's: never applied */
        long long idx = first % GPS_HANDOFF_SEQ_BASE;
        bool oom;
        json_t *events = db_json(evs, &oom);
        if (oom) {
            /* Neither applied nor refused (a batch that is not JSON is
             * refused below, as before): f->seen stays, so the next read
             * (the next tick, or a notification) reads this batch again. */
            gp_log_warn("handoff_batch_deferred",
                        "job %s: out of memory reading a relayed batch; read again later",
                        f->job_id);
            break;
        }
        bool cancel = false;
        long long expected = -1;
        char msg[160];
        int rc = json_is_array(events)
                     ? gps_jobs_apply_events(h->jobs, f->job_id, f->server, idx, events, &cancel,
                                             &expected, msg, sizeof msg)
                     : 400;
        size_t n = json_array_size(events);
        json_decref(events);
        if (rc == 0 && idx + (long long)n > f->seen)
            f->seen = idx + (long long)n;
        if (rc == 409 && expected >= 0) {
            f->seen = expected;
            break;
        }
        if (rc != 0) {
            gp_log_write(GP_LOG_WARN, "handoff_batch_refused", NULL,
                         json_pack("{s:s,s:i,s:s}", "job_id", f->job_id, "status", rc,
                                   "message", msg),
                         "a relayed batch was not applied");
            break;
        }
        gps_job *job = gps_jobs_find(h->jobs, f->job_id);
        if (!job || gps_job_terminal(job))
            break;
    }
}

/* The follower's read: the row's state decides, then the batches. */
static void follow_result(follow *f, int status, const gps_store_cells *res)
{
    gps_handoff *h = f->h;
    if (h->stopped || f->gone || status != 0 || !res || res->ncols < 5 || res->nrows == 0)
        return;
    gps_job *job = gps_jobs_find(h->jobs, f->job_id);
    if (!job || gps_job_terminal(job)) {
        f->gone = true;
        return;
    }
    const char *state = res->cell[0], *by = res->cell[1];
    int64_t attempt = res->cell[2] ? atoll(res->cell[2]) : 0;
    f->known = attempt;
    bool claimed = state && strcmp(state, "claimed") == 0 && by;
    /* The claimer followed is gone: its row went back to waiting (the
     * sweep), or another server holds a newer attempt already. */
    if (f->attempt > 0 && (!claimed || attempt != f->attempt)) {
        gp_log_write(GP_LOG_WARN, "handoff_server_lost", NULL,
                     json_pack("{s:s,s:s,s:I}", "job_id", f->job_id, "server_id", f->server,
                               "attempt", (json_int_t)f->attempt),
                     "the server running a handed-off job is gone");
        f->attempt = 0;
        f->seen = 0;
        f->server[0] = '\0';
        gps_jobs_remote_lost(h->jobs, job, "server_lost");
        if (gps_job_terminal(job))
            return;
    }
    if (state && strcmp(state, "cancelled") == 0) {
        gps_jobs_cancel(h->jobs, job, "handoff_cancelled");
        return;
    }
    if (!claimed)
        return;
    if (f->attempt == 0) {
        if (gps_jobs_remote_assign(h->jobs, job, by) != 0)
            return;
        f->attempt = attempt;
        f->seen = 0;
        snprintf(f->server, sizeof f->server, "%s", by);
    }
    follow_apply(h, f, res);
}

static void follow_done(void *arg, int status, const gps_store_cells *res);

/* Read f's row and new batches now, or right after the read in flight
 * (a notification may announce what that read started too early to see). */
static void follow_one(gps_handoff *h, follow *f)
{
    if (f->gone)
        return;
    if (f->reading) {
        f->again = true;
        return;
    }
    f->again = false;
    long long from = f->attempt > 0 ? f->attempt * GPS_HANDOFF_SEQ_BASE + f->seen
                                    : (f->known + 1) * GPS_HANDOFF_SEQ_BASE;
    if (gps_store_handoff_follow_async(h->store, f->job_id, from, follow_done, f) == 0)
        f->reading = true;
}

static void follow_done(void *arg, int status, const gps_store_cells *res)
{
    follow *f = arg;
    f->reading = false;
    follow_result(f, status, res);
    if (f->again && !f->h->stopped)
        follow_one(f->h, f);
}

static void follow_all(gps_handoff *h)
{
    for (follow *f = h->follows; f; f = f->next) {
        if (f->withdraw)
            withdraw_send(f);
        if (!f->reading)
            follow_one(h, f);
    }
}

/* ------------------------------------------------------------------ */
/* The claimer's side: claim, relay back, ownership                    */
/* ------------------------------------------------------------------ */

static void proxy_flush(proxy *p);

static void claim(gps_handoff *h);

static void publish_free(gps_handoff *h, bool force);

static void proxy_drop_sub(proxy *p);

static void batch_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    proxy_flush(arg);
}

/* An event relay_cb could not queue (out of memory). It cannot be left
 * out: the next batch would number past it and the offering server's
 * client would miss it (a token gone from the middle of its text). Nor can
 * it be refused: the jobs module applied it before telling its subscribers
 * (gps_job_event_fn returns nothing), so the agent will not send it again.
 * The job ends here instead, cancelled (its agent stops), and the offering
 * server sees this server's own out of memory (INTERNAL) after the events
 * relayed before it. */
static void relay_oom(proxy *p, gps_job *job)
{
    p->oom = true;
    p->ended = true; /* before the cancel: its error event is not relayed */
    gp_log_write(GP_LOG_WARN, "handoff_relay_oom", NULL,
                 json_pack("{s:s,s:I}", "job_id", p->job_id, "attempt", (json_int_t)p->attempt),
                 "an event of a handed-off job could not be relayed: the job fails here");
    if (!gps_job_terminal(job))
        gps_jobs_cancel(p->h->jobs, job, "handoff_relay_oom");
    proxy_flush(p);
}

static void relay_cb(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    proxy *p = arg;
    if (p->done || p->ended || type == GPS_EV_FAILOVER || !ev)
        return; /* a failover here is this server's affair: the text goes on */
    json_t *c = json_deep_copy(ev);
    if (!c || json_array_append_new(p->pending, c) != 0) {
        relay_oom(p, job);
        return;
    }
    bool first = false;
    if (type == GPS_EV_TOKEN || type == GPS_EV_TOOL_CALL || type == GPS_EV_EMBEDDING) {
        gps_job_mark_output_sent(job); /* the client may have it: no transparent restart */
        first = !p->output;
        p->output = true;
    }
    if (type == GPS_EV_END || type == GPS_EV_ERROR || gps_job_terminal(job))
        p->ended = true;
    /* The first output goes at once: waiting for a batch would add up to
     * BATCH_MS to the client's time to first token. */
    if (p->ended || first || json_array_size(p->pending) >= BATCH_MAX) {
        proxy_flush(p);
    } else if (!evtimer_pending(p->timer, NULL)) {
        struct timeval tv = {0, BATCH_MS * 1000};
        evtimer_add(p->timer, &tv);
    }
}

/* Stop the proxy's job here (its row is no longer this server's). */
static void proxy_lost(proxy *p, const char *why)
{
    gps_handoff *h = p->h;
    if (!p->done)
        gp_log_write(GP_LOG_WARN, "handoff_lost", NULL,
                     json_pack("{s:s,s:I,s:s}", "job_id", p->job_id, "attempt",
                               (json_int_t)p->attempt, "reason", why),
                     "a handed-off job is no longer this server's: cancelled here");
    p->done = true;
    json_array_clear(p->pending);
    gps_job *job = p->job;
    proxy_drop_sub(p);
    if (job && !gps_job_terminal(job))
        gps_jobs_cancel(h->jobs, job, "handoff_lost");
}

static void flush_done(void *arg, int status, const gps_store_cells *res)
{
    (void)res;
    proxy *p = arg;
    p->writing = false;
    if (p->h->stopped || p->done)
        return;
    if (status != 0) {
        proxy_lost(p, "relay_refused");
        return;
    }
    if (json_array_size(p->pending) || (p->oom && !p->oom_queued))
        proxy_flush(p);
    else if (p->ended) {
        p->done = true;
        proxy_drop_sub(p);
        claim(p->h); /* its slot is free: an offer may be waiting */
        publish_free(p->h, false); /* or one may wait in a peer's queue, not offered */
    }
}

static void proxy_flush(proxy *p)
{
    if (p->writing || p->done)
        return;
    if (p->oom && !p->oom_queued) {
        if (json_array_append(p->pending, p->oom_ev) != 0) {
            struct timeval tv = {0, BATCH_MS * 1000}; /* ENOMEM: again soon */
            evtimer_add(p->timer, &tv);
            return;
        }
        p->oom_queued = true;
    }
    size_t n = json_array_size(p->pending);
    if (n == 0)
        return;
    long long first = p->attempt * GPS_HANDOFF_SEQ_BASE + p->next_idx;
    if (gps_store_handoff_events_async(p->h->store, p->job_id, p->h->id, p->attempt, first,
                                       first + (long long)n - 1, p->pending, flush_done,
                                       p) != 0) {
        struct timeval tv = {0, BATCH_MS * 1000}; /* ENOMEM: again soon */
        evtimer_add(p->timer, &tv);
        return;
    }
    p->writing = true;
    gps_store_notify(p->h->store, CH_JOB, p->job_id); /* after the batch commits */
    p->next_idx += (long long)n;
    json_array_clear(p->pending);
    evtimer_del(p->timer);
}

static void proxy_drop_sub(proxy *p)
{
    if (p->job)
        gps_job_unsubscribe(p->job, relay_cb, p);
    p->job = NULL;
}

static proxy *proxy_new(gps_handoff *h, const char *job_id, int64_t attempt)
{
    proxy *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->pending = json_array();
    p->oom_ev = json_pack("{s:s,s:s,s:s}", "type", "error", "code", "INTERNAL", "message",
                          "out of memory");
    p->timer = evtimer_new(h->base, batch_tick, p);
    if (!p->pending || !p->oom_ev || !p->timer) {
        json_decref(p->pending);
        json_decref(p->oom_ev);
        if (p->timer)
            event_free(p->timer);
        free(p);
        return NULL;
    }
    p->h = h;
    snprintf(p->job_id, sizeof p->job_id, "%s", job_id);
    p->attempt = attempt;
    p->born_us = gp_now_mono_us();
    p->next = h->proxies;
    h->proxies = p;
    return p;
}

static void proxy_free(proxy *p)
{
    proxy_drop_sub(p);
    event_free(p->timer);
    json_decref(p->pending);
    json_decref(p->oom_ev);
    free(p);
}

/* Run one claimed offer here; a spec this server cannot run goes back as
 * the job's error (the offering server fails it). */
static void run_claimed(gps_handoff *h, const char *job_id, const char *spec_txt,
                        int64_t attempt)
{
    proxy *p = proxy_new(h, job_id, attempt);
    if (!p)
        return; /* the row stays claimed: the offering server's stall timer ends it */
    bool oom = false;
    int rc;
    json_t *w = spec_txt ? db_json(spec_txt, &oom) : NULL;
    gps_job_spec spec;
    gps_submit_err err = {0};
    char why[160] = "";
    gps_job *job = NULL;
    if (gps_jobs_find(h->jobs, job_id)) {
        snprintf(why, sizeof why, "the job is already known here");
        memset(&spec, 0, sizeof spec);
    } else if (oom) {
        /* This server's failure, told as the submit's own out of memory
         * below is (INTERNAL), not as a spec the offer lacks
         * (HANDOFF_FAILED): a spec that is not JSON is refused that way,
         * as before. */
        err.code = "INTERNAL";
        snprintf(why, sizeof why, "out of memory");
        memset(&spec, 0, sizeof spec);
    } else if ((rc = gps_handoff_spec_from_wire(w, &spec, why, sizeof why)) == 0) {
        spec.resume_id = strdup(job_id);
        spec.handoff_proxy = true;
        if (spec.resume_id)
            job = gps_jobs_submit(h->jobs, &spec,
                                  json_string_value(json_object_get(w, "correlation_id")), NULL,
                                  &err);
        if (!job)
            snprintf(why, sizeof why, "%.150s", err.code ? err.message : "out of memory");
        if (!job && !err.code)
            err.code = "INTERNAL";
    } else if (rc == -2) {
        err.code = "INTERNAL"; /* as the spec's own load: why says out of memory */
    }
    gps_job_spec_clear(&spec);
    json_decref(w);
    if (job && gps_job_subscribe(job, relay_cb, p) == 0) {
        p->job = job;
        gp_log_write(GP_LOG_INFO, "job_handoff_running", gps_job_correlation_id(job),
                     json_pack("{s:s,s:I}", "job_id", job_id, "attempt", (json_int_t)attempt),
                     "running a job handed over by another server");
        return;
    }
    if (job) { /* it could not be followed here: out of memory */
        gps_jobs_cancel(h->jobs, job, "handoff_failed");
        err.code = "INTERNAL";
        snprintf(why, sizeof why, "out of memory");
    }
    json_array_append_new(p->pending,
                          json_pack("{s:s,s:s,s:s}", "type", "error", "code",
                                    err.code ? err.code : "HANDOFF_FAILED", "message", why));
    p->ended = true;
    proxy_flush(p);
}

static void claim_done(void *arg, int status, const gps_store_cells *res)
{
    gps_handoff *h = arg;
    h->claiming = false;
    if (h->stopped)
        return;
    for (size_t i = 0; status == 0 && res && res->ncols >= 3 && i < res->nrows; i++) {
        const char *id = res->cell[i * res->ncols], *spec = res->cell[i * res->ncols + 1];
        const char *att = res->cell[i * res->ncols + 2];
        if (!id || !att)
            continue;
        run_claimed(h, id, spec, atoll(att));
        gps_store_notify(h->store, CH_JOB, id); /* the offering server sees the claim */
    }
    if (h->claim_again)
        claim(h);
}

/* What this server's agents could take now: the names their free ready
 * slots serve (object name -> true) and how many slots. */
typedef struct free_acc {
    sched *s;
    json_t *names;
    int slots;
    bool all;             /* every healthy agent's names, free or not */
    bool oom;             /* a name could not be added */
} free_acc;

static void free_cb(void *ud, registry_agent *a)
{
    free_acc *acc = ud;
    if (a->state != REGISTRY_HEALTHY)
        return;
    if (!acc->all) {
        int n = sched_agent_is_ready(acc->s, a) ? sched_agent_free_slots(acc->s, a) : 0;
        if (n <= 0)
            return;
        acc->slots += n;
    }
    for (size_t i = 0; i < a->n_models && !acc->oom; i++) {
        acc->oom = json_object_set_new(acc->names, a->models[i].id, json_true()) != 0;
        for (size_t k = 0; k < a->models[i].n_aliases && !acc->oom; k++)
            acc->oom = json_object_set_new(acc->names, a->models[i].aliases[k], json_true()) != 0;
    }
}

/* The names of acc (free_cb's), whole, or NULL on ENOMEM: written as this
 * server's (models_tick; the next tick writes them again), a list short of
 * a model would keep the peers from offering its jobs here (refused 404
 * where no agent of theirs serves it); claimed, its offers never looked
 * at. */
static json_t *names_array(const free_acc *acc)
{
    if (!acc->names || acc->oom)
        return NULL;
    json_t *arr = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(acc->names, k, v)
    {
        if (!arr || json_array_append_new(arr, json_string(k)) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

typedef struct entries_acc {
    sched *s;
    json_t *by_key;       /* {m, l} as sorted JSON text -> {m, l, n} */
    bool oom;             /* an entry, or part of one, could not be made */
} entries_acc;

/* One free agent's {m, l} (new reference), or NULL on ENOMEM. */
static json_t *entry_of(const registry_agent *a)
{
    json_t *m = json_array(), *l = json_object();
    bool ok = m && l;
    for (size_t i = 0; ok && i < a->n_models; i++) {
        ok = json_array_append_new(m, json_string(a->models[i].id)) == 0;
        for (size_t k = 0; ok && k < a->models[i].n_aliases; k++)
            ok = json_array_append_new(m, json_string(a->models[i].aliases[k])) == 0;
    }
    for (size_t i = 0; ok && i < a->n_labels; i++)
        ok = json_object_set_new(l, a->labels[i].key, json_string(a->labels[i].value)) == 0;
    if (!ok) {
        json_decref(m);
        json_decref(l);
        return NULL;
    }
    return json_pack("{s:o,s:o}", "m", m, "l", l);
}

static void entries_cb(void *ud, registry_agent *a)
{
    entries_acc *acc = ud;
    int n = a->state == REGISTRY_HEALTHY && sched_agent_is_ready(acc->s, a)
                ? sched_agent_free_slots(acc->s, a)
                : 0;
    if (n <= 0 || acc->oom)
        return;
    json_t *e = entry_of(a);
    /* The key must be the entry's whole text: jansson's own dump can leave
     * a member out and succeed when out of memory, and two agents'
     * different labels would then be counted as one entry. */
    char *key = e ? gp_json_dumps_checked(e, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_t *have = key ? json_object_get(acc->by_key, key) : NULL;
    if (!key)
        acc->oom = true;
    else if (have)
        acc->oom = json_object_set_new(have, "n", json_integer(json_integer_value(
                                                      json_object_get(have, "n")) + n)) != 0;
    else
        acc->oom = json_object_set_new(e, "n", json_integer(n)) != 0 ||
                   json_object_set(acc->by_key, key, e) != 0;
    free(key);
    json_decref(e);
}

/* What this server's free ready agents could take now (migration 0013):
 * one {m, l, n} per distinct names and labels, n their free slots. New
 * reference; NULL on ENOMEM (never a list short of an agent: the peers
 * would count its slots out; publish_free writes again at the next
 * tick). */
static json_t *free_entries(gps_handoff *h)
{
    entries_acc acc = {.s = gps_jobs_sched(h->jobs), .by_key = json_object()};
    json_t *arr = json_array();
    bool ok = acc.by_key && arr;
    if (ok) {
        registry_foreach(gps_jobs_registry(h->jobs), entries_cb, &acc);
        ok = !acc.oom;
        const char *k;
        json_t *v;
        json_object_foreach(ok ? acc.by_key : NULL, k, v)
        {
            if (json_array_append(arr, v) != 0) {
                ok = false;
                break;
            }
        }
    }
    json_decref(acc.by_key);
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

/* Write this server's free entries when they changed (always with force:
 * the models' period), and tell the others at once: a peer waiting with
 * queued jobs offers them now rather than at its next read. */
static void publish_free(gps_handoff *h, bool force)
{
    if (!h->gate)
        return;
    json_t *now = free_entries(h);
    if (!now)
        return;
    bool changed = !h->free_sent || !json_equal(now, h->free_sent);
    if ((changed || force) && gps_store_server_free(h->store, h->id, now) == 0) {
        if (changed)
            gps_store_notify(h->store, CH_FREE, h->id); /* after the write commits */
        json_decref(h->free_sent);
        h->free_sent = now;
        return;
    }
    json_decref(now);
}

/* Which of the offers looked at (rows of job_id, model, constraints) a
 * free ready agent here can take, its constraints met (labels, tools,
 * embeddings, generation; one that prefers an agent only where that agent
 * is and is free: it never runs on another server's agent in its stead),
 * at most one per free slot and CLAIM_MAX in all. */
typedef struct fit_acc {
    sched *s;
    const sched_job *job;
    json_t *taken;        /* agent id -> slots given to offers so far */
    registry_agent *found;
} fit_acc;

static void fit_cb(void *ud, registry_agent *a)
{
    fit_acc *acc = ud;
    if (acc->found || !sched_agent_is_ready(acc->s, a))
        return;
    json_int_t used = json_integer_value(json_object_get(acc->taken, a->id));
    if (sched_agent_free_slots(acc->s, a) - used > 0 && sched_agent_fits(acc->s, a, acc->job))
        acc->found = a;
}

static json_t *fitting(gps_handoff *h, const gps_store_cells *res)
{
    fit_acc acc = {.s = gps_jobs_sched(h->jobs), .taken = json_object()};
    json_t *ids = json_array();
    for (size_t i = 0; acc.taken && ids && i < res->nrows && json_array_size(ids) < CLAIM_MAX;
         i++) {
        const char *id = res->cell[i * res->ncols], *model = res->cell[i * res->ncols + 1];
        const char *ctext = res->cell[i * res->ncols + 2];
        bool oom = false;
        json_t *c = ctext ? db_json(ctext, &oom) : NULL;
        /* Constraints that are not JSON (a damaged row) read as none, as
         * before. Out of memory leaves the offer for a later look (the
         * next tick, or another server): read as none, its labels and
         * preferred agent would be ignored and the job claimed for an
         * agent they exclude. */
        if (oom)
            continue;
        registry_label labels[LABELS_MAX];
        sched_job sj = {.model = model, .labels = labels, .prefer_strict = 1};
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(c, "labels"), k, v)
        {
            if (json_is_string(v) && sj.n_labels < LABELS_MAX)
                labels[sj.n_labels++] = (registry_label){(char *)k, (char *)json_string_value(v)};
        }
        sj.prefer_agent = json_string_value(json_object_get(c, "prefer_agent"));
        sj.needs_tools = json_is_true(json_object_get(c, "needs_tools"));
        sj.needs_embeddings = json_is_true(json_object_get(c, "needs_embeddings"));
        sj.needs_generation = json_is_true(json_object_get(c, "needs_generation"));
        acc.job = &sj;
        acc.found = NULL;
        if (id && model)
            registry_foreach(gps_jobs_registry(h->jobs), fit_cb, &acc);
        /* A server that serves only a fallback runs the job under it (the
         * local submit falls back as for a request of its own). */
        size_t fi;
        json_t *fv;
        json_array_foreach(json_object_get(c, "fallback_models"), fi, fv)
        {
            if (acc.found || !id || !json_is_string(fv))
                break;
            sj.model = json_string_value(fv);
            registry_foreach(gps_jobs_registry(h->jobs), fit_cb, &acc);
        }
        json_decref(c);
        if (acc.found) {
            /* The slot is counted before the offer is listed, and out of
             * memory ends the look with the offers counted so far: an
             * offer listed without its slot counted would let the next
             * one take the same slot (more claimed than this server can
             * run). The others wait for the next look. */
            json_int_t used = json_integer_value(json_object_get(acc.taken, acc.found->id));
            if (json_object_set_new(acc.taken, acc.found->id, json_integer(used + 1)) != 0 ||
                json_array_append_new(ids, json_string(id)) != 0)
                break;
        }
    }
    json_decref(acc.taken);
    return ids;
}

static void peek_done(void *arg, int status, const gps_store_cells *res)
{
    gps_handoff *h = arg;
    h->claiming = false;
    if (h->stopped)
        return;
    json_t *ids = status == 0 && res && res->ncols >= 3 && res->nrows ? fitting(h, res) : NULL;
    if (json_array_size(ids) &&
        gps_store_handoff_claim_ids_async(h->store, h->id, gp_now_wall_ms(), ids, claim_done,
                                          h) == 0)
        h->claiming = true;
    json_decref(ids);
    if (!h->claiming && h->claim_again)
        claim(h); /* woken during the look: it may have missed that offer */
}

/* Look at the waiting offers of the models this server's free slots
 * serve, then claim those its agents can take (peek_done): two round
 * trips, so that an offer whose constraints no free agent here meets is
 * never claimed (and left for a server, the offering one included, that
 * can run it). */
static void claim(gps_handoff *h)
{
    if (h->claiming) {
        h->claim_again = true; /* the claim in flight may not see a new offer */
        return;
    }
    h->claim_again = false;
    free_acc acc = {.s = gps_jobs_sched(h->jobs), .names = json_object()};
    if (!acc.names)
        return;
    registry_foreach(gps_jobs_registry(h->jobs), free_cb, &acc);
    json_t *models = acc.slots > 0 ? names_array(&acc) : NULL;
    json_decref(acc.names);
    if (!models)
        return;
    if (json_array_size(models) &&
        gps_store_handoff_peek_async(h->store, h->id, gp_now_wall_ms(), models, PEEK_MAX,
                                     peek_done, h) == 0)
        h->claiming = true;
    json_decref(models);
}

static void check_mine(gps_handoff *h);

/* Which claimed rows are still this server's: a proxy whose row was
 * cancelled, or taken back (this server's lease lapsed), stops. Only the
 * proxies claimed before the read was queued are judged. */
static void mine_done(void *arg, int status, const gps_store_cells *res)
{
    gps_handoff *h = arg;
    h->mine_reading = false;
    if (h->stopped)
        return;
    for (proxy *p = h->proxies; status == 0 && res && p; p = p->next) {
        if (p->done || p->born_us >= h->mine_sent_us)
            continue;
        bool mine = false;
        for (size_t i = 0; i < res->nrows && !mine; i++) {
            const char *id = res->cell[i * res->ncols], *att = res->cell[i * res->ncols + 1];
            mine = id && att && strcmp(id, p->job_id) == 0 && atoll(att) == p->attempt;
        }
        if (!mine)
            proxy_lost(p, "not_claimed");
    }
    if (h->mine_again)
        check_mine(h);
}

static void check_mine(gps_handoff *h)
{
    bool any = false;
    for (proxy *p = h->proxies; p && !any; p = p->next)
        any = !p->done;
    if (!any)
        return;
    if (h->mine_reading) {
        h->mine_again = true;
        return;
    }
    h->mine_again = false;
    h->mine_sent_us = gp_now_mono_us();
    if (gps_store_handoff_mine_async(h->store, h->id, mine_done, h) == 0)
        h->mine_reading = true;
}

/* Free what has ended and has no store op in flight. */
static void reap(gps_handoff *h)
{
    for (follow **pf = &h->follows; *pf;) {
        follow *f = *pf;
        if (f->gone && !f->reading && !f->withdrawing) {
            *pf = f->next;
            free(f);
        } else {
            pf = &f->next;
        }
    }
    for (proxy **pp = &h->proxies; *pp;) {
        proxy *p = *pp;
        if (p->done && !p->writing) {
            *pp = p->next;
            proxy_free(p);
        } else {
            pp = &p->next;
        }
    }
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_handoff *h = arg;
    reap(h);
    claim(h);
    publish_free(h, false);
    follow_all(h);
    check_mine(h);
}

static void read_peers(gps_handoff *h);

/* A notification (gps_store_listen): do now what the poll would do at its
 * next tick, for what it names only. channel NULL: the listener (re)starts
 * and may have missed some: everything, as a tick. Every server hears
 * every job's notifications (one channel): those of jobs it neither
 * follows nor runs cost a look at its lists, O(follows + proxies). */
static void woken(void *arg, const char *channel, const char *payload)
{
    gps_handoff *h = arg;
    if (h->stopped)
        return;
    if (!channel) {
        tick(-1, 0, h);
    } else if (strcmp(channel, CH_OFFER) == 0) {
        claim(h);
        if (!payload || !*payload)
            follow_all(h); /* a sweep gave rows back: their claimer is gone */
    } else if (strcmp(channel, CH_FREE) == 0) {
        if (!payload || strcmp(payload, h->id) != 0)
            read_peers(h); /* then what waits here is offered where it fits */
    } else if (strcmp(channel, CH_JOB) == 0 && payload) {
        follow *f = follow_find(h, payload);
        if (f)
            follow_one(h, f);
        for (proxy *p = h->proxies; p; p = p->next) {
            if (!p->done && strcmp(p->job_id, payload) == 0) {
                check_mine(h);
                break;
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* Models, peers and the sweep                                         */
/* ------------------------------------------------------------------ */

static void peers_done(void *arg, int status, const gps_store_cells *res)
{
    gps_handoff *h = arg;
    h->peers_reading = false;
    if (!h->stopped && h->peers_again)
        read_peers(h); /* its answer comes after this one: that one decides */
    if (h->stopped || status != 0 || !res)
        return;
    json_t *names = json_object(), *free_arr = json_array();
    long long slots = 0;
    bool oom = !names || !free_arr;
    for (size_t i = 0; !oom && i < res->nrows; i++) {
        /* A peer's models or free entries that are not JSON (a damaged
         * row) read as none, as before; out of memory drops this read
         * whole, as a failed one (the next models tick reads again):
         * peers short of a model would have its jobs refused here. */
        const char *mtext = res->cell[i * res->ncols];
        const char *ftext = res->ncols >= 2 ? res->cell[i * res->ncols + 1] : NULL;
        bool oom_f = false;
        json_t *arr = mtext ? db_json(mtext, &oom) : NULL;
        json_t *fr = ftext && !oom ? db_json(ftext, &oom_f) : NULL;
        oom |= oom_f;
        size_t k;
        json_t *v;
        json_array_foreach(arr, k, v)
        {
            if (!oom && json_is_string(v))
                oom = json_object_set_new(names, json_string_value(v), json_true()) != 0;
        }
        if (!oom && json_is_array(fr)) {
            json_array_foreach(fr, k, v)
            {
                json_int_t n = json_integer_value(json_object_get(v, "n"));
                if (!oom && n > 0 && json_is_array(json_object_get(v, "m"))) {
                    oom = json_array_append(free_arr, v) != 0;
                    slots += n;
                }
            }
        } else if (!oom && json_is_array(arr)) {
            /* A server of an older version: its free slots unknown, as before. */
            oom = json_array_append_new(free_arr, json_pack("{s:O,s:b,s:i}", "m", arr, "any", 1,
                                                            "n", PEER_OLD_SLOTS)) != 0;
            slots += PEER_OLD_SLOTS;
        }
        json_decref(fr);
        json_decref(arr);
    }
    if (oom) {
        json_decref(names);
        json_decref(free_arr);
        return;
    }
    if (slots != h->peer_free_slots)
        gp_log_write(GP_LOG_DEBUG, "handoff_peers_free", NULL,
                     json_pack("{s:s,s:I}", "server_id", h->id, "slots", (json_int_t)slots),
                     "the other live servers' free agents have %lld slots", slots);
    json_decref(h->peer_free);
    h->peer_free = free_arr;
    h->peer_free_slots = slots;
    if (!json_equal(names, h->peer_models)) {
        free_acc all = {.names = names};
        json_t *arr = names_array(&all);
        gp_log_write(GP_LOG_INFO, "handoff_peers", NULL,
                     json_pack("{s:s,s:o}", "server_id", h->id, "models",
                               arr ? arr : json_array()),
                     "the other live servers serve %zu models", json_object_size(names));
    }
    json_decref(h->peer_models);
    h->peer_models = names;
    /* A peer has room: what waits here and was not offered is, now. */
    if (h->gate && h->peer_free_slots > waiting_offers(h)) {
        size_t n = gps_jobs_offer_queued(h->jobs);
        if (n)
            gp_log_write(GP_LOG_INFO, "handoff_queued_offered", NULL,
                         json_pack("{s:s,s:I}", "server_id", h->id, "jobs", (json_int_t)n),
                         "another server has free agents: %zu jobs waiting here offered", n);
    }
}

static void read_peers(gps_handoff *h)
{
    if (h->peers_reading) {
        h->peers_again = true; /* that read may predate the change announced */
        return;
    }
    h->peers_again = false;
    if (gps_store_handoff_peers_async(h->store, h->id, gp_now_wall_ms(), peers_done, h) == 0)
        h->peers_reading = true;
}

static const json_t *peer_models(void *arg)
{
    gps_handoff *h = arg;
    return h->peer_models;
}

static void sweep_done(void *arg, int status, const gps_store_cells *res)
{
    gps_handoff *h = arg;
    h->sweeping = false;
    if (status == 0 && res && res->changes > 0 && !h->stopped)
        gps_store_notify(h->store, CH_OFFER, ""); /* waiting again: claim them */
    if (status == 0 && res && res->changes > 0)
        gp_log_write(GP_LOG_INFO, "handoffs_orphaned", NULL,
                     json_pack("{s:s,s:I}", "server_id", h->id, "handoffs",
                               (json_int_t)res->changes),
                     "%lld handed-off jobs of servers that are gone offered again",
                     (long long)res->changes);
}

static void models_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_handoff *h = arg;
    free_acc acc = {.s = gps_jobs_sched(h->jobs), .names = json_object(), .all = true};
    if (acc.names) {
        registry_foreach(gps_jobs_registry(h->jobs), free_cb, &acc);
        json_t *mine = names_array(&acc);
        if (mine)
            gps_store_server_models(h->store, h->id, mine);
        json_decref(mine);
        json_decref(acc.names);
    }
    publish_free(h, true);
    int64_t now = gp_now_wall_ms();
    if (!h->peers_reading &&
        gps_store_handoff_peers_async(h->store, h->id, now, peers_done, h) == 0)
        h->peers_reading = true;
    if (!h->sweeping && gps_store_handoff_sweep_async(h->store, now, sweep_done, h) == 0)
        h->sweeping = true;
}

/* ------------------------------------------------------------------ */
/* Life                                                                */
/* ------------------------------------------------------------------ */

gps_handoff *gps_handoff_start(struct event_base *base, gps_store *store, gps_jobs *jobs,
                               const gps_handoff_opts *o)
{
    gps_handoff *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->base = base;
    h->store = store;
    h->jobs = jobs;
    snprintf(h->id, sizeof h->id, "%s", o->server_id ? o->server_id : "");
    h->models_ms = o->models_ms > 0 ? o->models_ms : 2000;
    h->queue_timeout_sec = o->queue_timeout_sec > 0 ? o->queue_timeout_sec : 60;
    h->request_timeout_sec = o->request_timeout_sec > 0 ? o->request_timeout_sec : 600;
    h->peer_models = json_object();
    h->peer_free = json_array();
    h->gate = gps_store_has_server_free(store);
    /* Woken by the database: the tick only catches what a notification
     * missed. Without a listener (ENOMEM) it is the only way: fast. */
    static const char *const channels[] = {CH_OFFER, CH_JOB, CH_FREE, NULL};
    h->listener = gps_store_listen(store, base, channels, woken, h);
    h->period_ms = o->period_ms > 0 ? o->period_ms : h->listener ? 1000 : 100;
    h->tick = gps_timer_every(base, h->period_ms, tick, h);
    h->models_tick = gps_timer_every(base, h->models_ms, models_tick, h);
    if (!h->peer_models || !h->peer_free || !h->tick || !h->models_tick) {
        gps_handoff_stop(h);
        gps_handoff_free(h);
        return NULL;
    }
    gps_jobs_handoff hooks = {.can_offer = can_offer, .can_offer_queued = can_offer_queued,
                              .offer = offer, .withdraw = withdraw,
                              .ended = ended, .peer_models = peer_models, .arg = h};
    gps_jobs_set_handoff(jobs, &hooks);
    models_tick(-1, 0, h); /* announce the models, read the peers now */
    gp_log_write(GP_LOG_INFO, "handoff_started", NULL,
                 json_pack("{s:s,s:i,s:b}", "server_id", h->id, "period_ms", h->period_ms,
                           "listening", h->listener != NULL),
                 "jobs no free agent here can take are offered to the other servers");
    return h;
}

void gps_handoff_stop(gps_handoff *h)
{
    if (!h || h->stopped)
        return;
    h->stopped = true;
    gps_store_listener_free(h->listener);
    h->listener = NULL;
    if (h->tick)
        event_del(h->tick);
    if (h->models_tick)
        event_del(h->models_tick);
    gps_jobs_set_handoff(h->jobs, NULL);
    for (proxy *p = h->proxies; p; p = p->next) {
        evtimer_del(p->timer);
        proxy_drop_sub(p);
    }
}

void gps_handoff_free(gps_handoff *h)
{
    if (!h)
        return;
    while (h->follows) {
        follow *f = h->follows;
        h->follows = f->next;
        free(f);
    }
    while (h->proxies) {
        proxy *p = h->proxies;
        h->proxies = p->next;
        p->job = NULL; /* the jobs are gone by now */
        proxy_free(p);
    }
    if (h->tick)
        event_free(h->tick);
    if (h->models_tick)
        event_free(h->models_tick);
    json_decref(h->peer_models);
    json_decref(h->peer_free);
    json_decref(h->free_sent);
    free(h);
}

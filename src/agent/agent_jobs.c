/* agent_jobs: small helpers, the event sink the backends call, /agents/work (job_begin). */
#include "agent/agent_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_json.h"
#include "common/gp_log.h"

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

uint32_t ag_rnd32(void)
{
    uint32_t r;
    gp_random_bytes(&r, sizeof r);
    return r;
}

static bool job_id_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= MAX_JOB_ID)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* A job by id: a hash, not a walk of every job per assigned job or
 * cancel (issue 24). */
agent_job *ag_job_find(agent *a, const char *id)
{
    agent_idnode *nd = agent_idtab_find(&a->jtab, id);
    return nd ? (agent_job *)((char *)nd - offsetof(agent_job, hnode)) : NULL;
}

/* The backend's slots (backend.h): all of them, and those it offers now. */
void ag_slot_counts(agent *a, int *total, int *usable)
{
    if (a->be->ops->slots) {
        a->be->ops->slots(a->be, total, usable);
        if (*total < 1)
            *total = 1;
        return;
    }
    *total = *usable = a->o->slots > 0 ? (int)a->o->slots : 1;
}

/* Jobs the backend still runs (a counter: jobs_review). */
int ag_busy_slots(agent *a)
{
    return a->n_running;
}

/* Ask the backend to stop a job (once). */
void ag_job_cancel(agent *a, agent_job *j)
{
    if (j->cancel_sent)
        return;
    j->cancel_sent = true;
    a->be->ops->job_cancel(a->be, j->id);
}

/* ======================================================================== */
/* Event sink (the loop's thread or a backend's)                            */
/* ======================================================================== */

/* Another thread: make the loop run a turn. */
void ag_loop_wake_fd(agent *a)
{
    uint64_t one = 1;
    while (write(a->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* Wake the loop after queueing events (issue 24). One wakeup until the
 * loop has looked: a zero-delay upstream hands the backend 64 tokens in one
 * read, which cost 64 writes, 64 polls and 64 reads on the loop thread (73
 * send calls per request under strace) when each woke it. The loop clears
 * the flag before it scans the queues, so an event pushed after the scan
 * always wakes it again. On the loop's own thread (a backend bound to the
 * loop: bind_loop) there is no system call. `between` (the release that
 * ends a backend's callback, which brackets its sink calls, for events
 * that are not urgent) runs the turn there and then. Otherwise the turn's
 * event is made active: at AGENT_PRI_NEW it sends the loop back to
 * epoll_wait after the callback running now, ahead of the relaying
 * callbacks still queued, and that pass also takes the server's replies
 * (a long-poll's new jobs, an upload's answer that lets the next first
 * outputs go). At 1,000 paced streams each such pass re-reports every
 * stream still readable (level-triggered): worth it for a first output or
 * an end, not for every token (time to first token p50 2.6-2.8 ms, against
 * 14-19 ms with every wake inline and 11.5-12 ms with only first outputs
 * active, on one core shared with the server: docs/scaling.md, ninth
 * round). */
static void loop_wake_now(agent *a, bool between)
{
    if (atomic_exchange(&a->wake_sent, true))
        return;
    if (!atomic_load(&a->looping) || !pthread_equal(pthread_self(), a->loop_th))
        ag_loop_wake_fd(a);
    else if (between && !a->in_turn)
        ag_loop_turn(a);
    else
        event_active(a->turn_ev, EV_TIMEOUT, 0);
}

/* agent_sink_hold/release (backend.h): per thread (the loop's or a backend's). */
static _Thread_local int hold_depth;
static _Thread_local agent *held_wake; /* the agent to wake at the release */
static _Thread_local bool held_urgent;  /* and a wake among them was WAKE_URGENT */

static void loop_wake(agent *a, wake_kind kind)
{
    if (kind == WAKE_NONE)
        return;
    if (hold_depth == 0) {
        loop_wake_now(a, false);
        return;
    }
    if (held_wake && held_wake != a) {
        loop_wake_now(held_wake, false); /* two agents in one process (tests) */
        held_urgent = false;
    }
    held_wake = a;
    held_urgent |= kind == WAKE_URGENT;
}

void agent_sink_hold(void)
{
    hold_depth++;
}

void agent_sink_release(void)
{
    if (hold_depth == 0 || --hold_depth > 0)
        return;
    agent *a = held_wake;
    bool urgent = held_urgent;
    held_wake = NULL;
    held_urgent = false;
    if (a)
        loop_wake_now(a, !urgent);
}

/* Put j on the loop's list of jobs to look at (a->mu held; either thread). */
void ag_job_link_locked(agent *a, agent_job *j)
{
    if (j->dirty)
        return;
    j->dirty = true;
    j->dirty_next = a->dirty;
    a->dirty = j;
}

/* j's queue changed from `before` (agent_evq_flags) with a->mu held; or it
 * ended (terminal). The loop looks only at jobs linked on a->dirty, so a
 * change it must act on links j; a push that adds no flag (an upload of
 * j's is in flight, or j already waits for one) tells it nothing new
 * (issue 24: every paced token woke the loop into a walk of every job).
 * WAKE_NONE for a change the loop is bound to see anyway before acting
 * (a->lazy_srv, a->lazy_urgent_srv); WAKE_URGENT for an end, a queue that
 * just broke (an end too, and its backend is to stop: jobs_review), or a
 * first output that can go now; else WAKE_SOON. */
static wake_kind job_note_locked(agent *a, agent_job *j, unsigned before, bool terminal)
{
    unsigned gained = agent_evq_flags(&j->q) & ~before;
    if (!gained && !terminal)
        return WAKE_NONE;
    ag_job_link_locked(a, j);
    if (terminal || (gained & AGENT_EVQ_BROKEN) ||
        ((gained & AGENT_EVQ_URGENT) && a->lazy_urgent_srv != j->srv))
        return WAKE_URGENT;
    return a->lazy_srv != j->srv ? WAKE_SOON : WAKE_NONE;
}

/* Queue ev (reference stolen; NULL: it could not be built, which breaks
 * the queue: agent_evq_push); output: a token or a tool call (the job's
 * first one is marked: agent_evq_mark_output). */
static void sink_push_ev(agent_job *j, json_t *ev, bool output)
{
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    if (agent_evq_push(&j->q, ev) == 0 && output)
        agent_evq_mark_output(&j->q);
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

static void sink_push(agent_job *j, json_t *ev)
{
    sink_push_ev(j, ev, false);
}

static void sink_push_output(agent_job *j, json_t *ev)
{
    sink_push_ev(j, ev, true);
}

static void sink_started(void *ctx)
{
    sink_push(ctx, json_pack("{s:s}", "type", "started"));
}

/* A token event is queued as its compact JSON text, rendered straight
 * into the job's queue (agent_evq_push_token): an object per token and its
 * size walk and dump were a third of the agent's instructions per relayed
 * request, a jansson string per token and its free an eighth of the rest
 * (issue 24). */
static void sink_token(void *ctx, const char *text, size_t len, int32_t token_id)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    if (agent_evq_push_token(&j->q, text, len, token_id) == 0)
        agent_evq_mark_output(&j->q);
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

/* ev with key set to v (stolen), or NULL (ev freed) when that failed for
 * want of memory: the event is lost whole, never sent without a part of
 * it, and NULL breaks the job's queue (agent_evq_push). NULL ev: NULL. */
static json_t *ev_set(json_t *ev, const char *key, json_t *v)
{
    if (ev && json_object_set_new(ev, key, v) == 0) /* v NULL: -1 */
        return ev;
    if (!ev)
        json_decref(v);
    json_decref(ev);
    return NULL;
}

/* [ids...] as a new array, or NULL (out of memory). */
static json_t *id_array(const int32_t *ids, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_integer(ids[i])) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    return arr;
}

/* A token event with the ids of every token sampled since the previous
 * token event (docs/protocol.md): token_id is the last, token_ids all of
 * them when there is more than one. */
static void sink_token_ids(void *ctx, const char *text, size_t len, const int32_t *ids,
                           size_t n_ids)
{
    /* Text that is not UTF-8 is U+FFFD (as agent_evq_token_json has it);
     * any NULL here is memory: the event is lost, which breaks the queue. */
    json_t *t = text && gp_utf8_valid(text, len) ? json_stringn(text, len)
                                                : json_string("\xef\xbf\xbd");
    json_t *ev = json_pack("{s:s,s:o}", "type", "token", "text", t);
    if (n_ids > 0)
        ev = ev_set(ev, "token_id", json_integer(ids[n_ids - 1]));
    if (n_ids > 1)
        ev = ev_set(ev, "token_ids", id_array(ids, n_ids));
    sink_push_output(ctx, ev);
}

/* m (borrowed) with "type":"metrics" set, rendered from m itself
 * (agent_evq_push_typed): a deep copy per request was a quarter of it. */
static void sink_metrics(void *ctx, json_t *m)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    unsigned before = agent_evq_flags(&j->q);
    agent_evq_push_typed(&j->q, m, "metrics");
    wake_kind wake = job_note_locked(a, j, before, false);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, wake);
}

/* ev with key set to the string s (ev_set), or as it is when s is NULL or
 * not UTF-8 (json_string refuses it: left out, as it always was). */
static json_t *ev_set_str(json_t *ev, const char *key, const char *s)
{
    return s && gp_utf8_valid(s, strlen(s)) ? ev_set(ev, key, json_string(s)) : ev;
}

static void sink_tool_call(void *ctx, int index, const char *id, const char *name,
                           const char *args, size_t args_len)
{
    /* Arguments that are not UTF-8 are "" (as they were); a NULL event is
     * memory: the call is lost, which breaks the queue. */
    if (!args || !gp_utf8_valid(args, args_len)) {
        args = "";
        args_len = 0;
    }
    json_t *ev = json_pack("{s:s,s:i,s:s%}", "type", "tool_call", "index", index, "arguments",
                           args, args_len);
    ev = ev_set_str(ev, "id", id);
    ev = ev_set_str(ev, "name", name);
    sink_push_output(ctx, ev);
}

static void sink_progress(void *ctx, long long done, long long total)
{
    sink_push(ctx, json_pack("{s:s,s:I,s:I}", "type", "progress", "prompt_tokens_done",
                             (json_int_t)done, "prompt_tokens_total", (json_int_t)total));
}

/* {"type":"embedding","index":i,"embedding":base64 of dim little-endian
 * float32} (docs/protocol.md "Embeddings"; the hosts are little-endian). */
static void sink_embedding(void *ctx, int index, const float *v, int dim)
{
    char *b64 = gp_base64_encode(v, (size_t)dim * sizeof *v);
    json_t *ev = b64 ? json_pack("{s:s,s:i,s:s}", "type", "embedding", "index", index,
                                 "embedding", b64)
                     : NULL;
    free(b64);
    sink_push(ctx, ev);
}

/* A value the job's end event is to carry could not be kept for want of
 * memory: an end without it would be a quietly wrong success (no
 * stop_sequence, no upstream_meta), so the job's queue breaks instead, as
 * a failed push breaks it (agent_evq_push(NULL)): the job ends with
 * AGENT_OUT_OF_MEMORY, fails over, and its backend is stopped. */
static void sink_lost(agent_job *j)
{
    sink_push(j, NULL);
}

static void sink_stop_sequence(void *ctx, const char *seq)
{
    agent_job *j = ctx;
    char *copy = seq ? strdup(seq) : NULL;
    if (seq && !copy) {
        sink_lost(j);
        return;
    }
    pthread_mutex_lock(&j->a->mu);
    free(j->stop_seq);
    j->stop_seq = copy;
    pthread_mutex_unlock(&j->a->mu);
}

/* What the server accepts of upstream values (src/server/fleet/agent_check.h:
 * GPS_AGENT_MAX_UPSTREAM_META, GPS_AGENT_MAX_TOKENS). An upstream beyond
 * them would make the server refuse the whole upload: such values are
 * dropped here, with a warning (issue 25). */
#define AGENT_MAX_UPSTREAM_META 4096
#define AGENT_MAX_TOKENS 1000000000LL

static void sink_upstream_meta(void *ctx, json_t *meta)
{
    agent_job *j = ctx;
    json_t *copy = json_is_object(meta) ? json_deep_copy(meta) : NULL;
    size_t n = copy ? json_dumpb(copy, NULL, 0, JSON_COMPACT) : 0;
    /* An object that could not be copied, or measured (its dump is never
     * empty: "{}" at least), is memory: not a value to drop. */
    if (json_is_object(meta) && n == 0) {
        json_decref(copy);
        sink_lost(j);
        return;
    }
    if (n > AGENT_MAX_UPSTREAM_META) {
        gp_log_write(GP_LOG_WARN, "upstream_value_dropped", j->correlation_id,
                     json_pack("{s:s,s:s,s:I}", "job_id", j->id, "field", "x_pool_meta",
                               "bytes", (json_int_t)n),
                     "the upstream's x_pool_meta is over %d bytes: not passed on",
                     AGENT_MAX_UPSTREAM_META);
        json_decref(copy);
        copy = NULL;
    }
    pthread_mutex_lock(&j->a->mu);
    json_decref(j->upstream_meta);
    j->upstream_meta = copy;
    pthread_mutex_unlock(&j->a->mu);
}

/* A token count from the upstream, or -1 (unknown) when absurd. */
static long long sane_count(agent_job *j, const char *field, long long v)
{
    if (v <= AGENT_MAX_TOKENS)
        return v;
    gp_log_write(GP_LOG_WARN, "upstream_value_dropped", j->correlation_id,
                 json_pack("{s:s,s:s,s:I}", "job_id", j->id, "field", field, "value",
                           (json_int_t)v),
                 "the upstream reported %lld %s: not passed on", v, field);
    return -1;
}

/* The end event's usage: the counts known (>= 0). NULL: out of memory. */
static json_t *end_usage(long long pt, long long ct)
{
    json_t *u = json_object();
    if (pt >= 0)
        u = ev_set(u, "prompt_tokens", json_integer(pt));
    if (ct >= 0)
        u = ev_set(u, "completion_tokens", json_integer(ct));
    return u;
}

static void sink_end(void *ctx, const char *finish_reason, long long pt, long long ct)
{
    agent_job *j = ctx;
    pt = sane_count(j, "prompt_tokens", pt);
    ct = sane_count(j, "completion_tokens", ct);
    const char *fr = "stop";
    if (finish_reason && strcmp(finish_reason, "length") == 0)
        fr = "length";
    else if (finish_reason && strcmp(finish_reason, "tool_calls") == 0)
        fr = "tool_calls";
    json_t *ev = json_pack("{s:s,s:s,s:o}", "type", "end", "finish_reason", fr, "usage",
                           end_usage(pt, ct));
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    if (j->stop_seq && strcmp(fr, "stop") == 0)
        ev = ev_set_str(ev, "stop_sequence", j->stop_seq);
    if (ev && j->upstream_meta) {
        ev = ev_set(ev, "upstream_meta", j->upstream_meta);
        j->upstream_meta = NULL;
    }
    agent_evq_push(&j->q, ev); /* NULL: the end is lost, the queue ends broken */
    j->backend_done = true;
    job_note_locked(a, j, 0, true);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, WAKE_URGENT);
}

static void sink_error(void *ctx, const char *code, const char *message)
{
    agent_job *j = ctx;
    agent *a = j->a;
    pthread_mutex_lock(&a->mu);
    /* A stop we caused is reported for what it is, not as a cancellation. */
    if (j->stop_shutdown) {
        code = "AGENT_SHUTDOWN";
        message = "the agent shut down before the job finished";
    } else if (j->stop_deadline) {
        code = "TIMEOUT";
        message = "the job ran past its deadline";
    }
    json_t *ev = json_pack("{s:s,s:s,s:s}", "type", "error", "code", code ? code : "INTERNAL_ERROR",
                           "message", message ? message : "");
    agent_evq_push(&j->q, ev); /* NULL: the queue ends broken (AGENT_OUT_OF_MEMORY) */
    j->backend_done = true;
    job_note_locked(a, j, 0, true);
    pthread_mutex_unlock(&a->mu);
    loop_wake(a, WAKE_URGENT);
}

/* ======================================================================== */
/* /agents/work                                                             */
/* ======================================================================== */

void ag_job_free(agent_job *j)
{
    agent_evq_free(&j->q);
    free(j->stop_seq);
    json_decref(j->upstream_meta);
    free(j->correlation_id);
    free(j);
}

static void job_begin(agent *a, json_t *jj)
{
    const char *jid = json_string_value(json_object_get(jj, "job_id"));
    if (!job_id_ok(jid)) {
        gp_log_error("job_invalid", "work reply holds a job without a valid job_id; skipped");
        return;
    }
    if (ag_job_find(a, jid)) {
        gp_log_warn("job_duplicate", "job %s was assigned twice; keeping the running one", jid);
        return;
    }
    /* Room for one more job in the loop's structures first, so that
     * nothing about a running job can fail for want of memory later. */
    size_t want = a->n_jobs + 1;
    if (want > a->review_cap) {
        size_t cap = a->review_cap ? a->review_cap * 2 : 64;
        agent_job **rv = realloc(a->review, cap * sizeof *rv);
        if (!rv)
            return;
        a->review = rv;
        a->review_cap = cap;
    }
    if (agent_timers_reserve(&a->deadlines, want) < 0 ||
        agent_timers_reserve(&a->retries, want) < 0 || agent_idtab_reserve(&a->jtab, want) < 0)
        return;
    agent_job *j = calloc(1, sizeof *j);
    if (!j)
        return;
    snprintf(j->id, sizeof j->id, "%s", jid);
    j->a = a;
    j->srv = a->cur;
    agent_evq_init(&j->q);
    agent_backoff_init(&j->ub, 200, 5000);
    const char *cid = json_string_value(json_object_get(jj, "correlation_id"));
    j->correlation_id = cid ? strdup(cid) : NULL;
    json_int_t dl = json_integer_value(json_object_get(jj, "deadline_ms"));
    if (dl > 0) {
        j->deadline_ms = gp_now_mono_ms() + (uint64_t)dl;
        agent_timers_set(&a->deadlines, &j->dl_timer, j->deadline_ms);
    }
    j->next = a->jobs;
    if (a->jobs)
        a->jobs->prev = j;
    a->jobs = j;
    agent_idtab_add(&a->jtab, &j->hnode, j->id); /* room: reserved above */
    a->live_dirty = true;
    a->n_jobs++;
    a->n_running++;

    if (gp_log_enabled(GP_LOG_INFO)) /* a json_pack per job otherwise thrown away */
        gp_log_write(GP_LOG_INFO, "job_start", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id), "starting job %s", j->id);
    agent_job_sink sink = {
        .ctx = j,
        .started = sink_started,
        .token = sink_token,
        .token_ids = sink_token_ids,
        .metrics = sink_metrics,
        .tool_call = sink_tool_call,
        .progress = sink_progress,
        .embedding = sink_embedding,
        .end = sink_end,
        .stop_sequence = sink_stop_sequence,
        .upstream_meta = sink_upstream_meta,
        .error = sink_error,
    };
    char err[256] = "";
    int rc;
    const char *rft = json_string_value(
        json_object_get(json_object_get(jj, "response_format"), "type"));
    if (rft && strcmp(rft, "text") != 0 && !a->be->ops->structured_output) {
        /* Never the unconstrained text in place of what was asked. */
        gp_log_write(GP_LOG_WARN, "job_rejected", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id),
                     "backend %s does not apply response_format", a->be->ops->name);
        /* INVALID_REQUEST: the server answers 400 with this message */
        char why[160];
        snprintf(why, sizeof why, "response_format json_object/json_schema is not supported by "
                 "this agent's %s backend", a->be->ops->name);
        sink_error(j, "INVALID_REQUEST", why);
    } else if ((rc = a->be->ops->job_start(a->be, jj, &sink, err, sizeof err)) != 0) {
        /* Out of memory is ours, not the job's: AGENT_OUT_OF_MEMORY fails
         * it over (as a broken queue does), where INVALID_REQUEST would be
         * the client's 400 for a request that was fine. */
        bool oom = rc == AGENT_JOB_START_NOMEM;
        gp_log_write(oom ? GP_LOG_ERROR : GP_LOG_WARN, oom ? "job_out_of_memory" : "job_rejected",
                     j->correlation_id, json_pack("{s:s}", "job_id", j->id),
                     "backend %s job: %s", oom ? "could not start the" : "rejected", err);
        /* No callback will come: report it ourselves. */
        sink_error(j, oom ? "AGENT_OUT_OF_MEMORY" : "INVALID_REQUEST",
                   err[0] ? err : "the backend could not start the job");
    } else if (a->jobs_stopped) {
        /* Assigned while we were already stopping: hand it back at once
         * (AGENT_SHUTDOWN) rather than run it past our exit. */
        pthread_mutex_lock(&a->mu);
        j->stop_shutdown = true;
        pthread_mutex_unlock(&a->mu);
        ag_job_cancel(a, j);
    }
}

/* The backend's prefix_cache facts (gguf), or NULL: sent with every
 * long-poll too, so that the server routes a conversation's next turn by
 * what the slots hold now, not at the last heartbeat. New reference.
 * Facts that memory ran out making are left out (NULL), never sent in
 * part: a deploy backend cut short keeps its first model's prefix_cache,
 * whose slot numbers collide with the others'. Without it the server keeps
 * the picture it had (prefix routing is a preference); the long-poll goes
 * all the same, as the agent's liveness channel (docs/protocol.md). */
static json_t *prefix_facts(agent *a)
{
    if (!a->be->ops->poll_facts)
        return NULL;
    json_t *tmp = json_object();
    if (!tmp)
        return NULL;
    if (a->be->ops->poll_facts(a->be, tmp) < 0) {
        json_decref(tmp);
        return NULL;
    }
    json_t *pc = json_incref(json_object_get(tmp, "prefix_cache"));
    json_decref(tmp);
    return pc;
}

/*
 * How often a long-poll lists the jobs the agent holds (running_jobs, with
 * delivery_seen), once it holds more than a few. The list tells the server
 * nothing it lacks unless a job vanished without its end (the server learns
 * every end from the uploads), and its stall timers run for a minute; but a
 * busy agent re-parks after every reply, and at 1,000 paced streams each of
 * hundreds of long-polls a second carried 1,000 ids (~40 KB) that the server
 * parsed and judged against every job: 13 % of its CPU. So: every long-poll
 * while the list is short, else one a second at most (docs/protocol.md
 * "Liveness"). /agents/poll always lists them. "Short" counts the jobs of
 * every server (n_jobs): an agent busy elsewhere throttles a short list to
 * the current server too, which only delays a lost job's end there.
 */
#define AGENT_LIVE_LIST_MS 1000
/* A long-poll that could not be made (out of memory) is tried again after
 * this long (ag_work_start). */
#define AGENT_WORK_RETRY_MS 100
#define AGENT_LIVE_LIST_SMALL 16

/* running_jobs of the server polled now as JSON text (without brackets),
 * rebuilt only when a job came or went or the server changed: a jansson
 * array of every job, dumped on every long-poll, was ~8,000 instructions a
 * relayed request at 64 streams (issue 24). 0 or -1 (ENOMEM). */
static int live_ids_text(agent *a)
{
    if (!a->live_dirty)
        return 0;
    a->live_ids.len = 0;
    bool first = true;
    for (agent_job *j = a->jobs; j; j = j->next) {
        if (j->srv != a->cur) /* another server's jobs mean nothing here */
            continue;
        /* An id passed job_id_ok: nothing in it to escape. */
        if ((!first && gp_buf_append(&a->live_ids, ",", 1) < 0) ||
            gp_buf_append(&a->live_ids, "\"", 1) < 0 ||
            gp_buf_append(&a->live_ids, j->id, strlen(j->id)) < 0 ||
            gp_buf_append(&a->live_ids, "\"", 1) < 0)
            return -1; /* stays dirty: rebuilt next time */
        first = false;
    }
    a->live_dirty = false;
    return 0;
}

/* The long-poll's body as json_pack and add_liveness made it, written as
 * text: {"agent_id":..,"free_slots":N,"instance":..,"running_jobs":[..],
 * "delivery_seen":..,"prefix_cache":{..}}; running_jobs and delivery_seen
 * only when the list is due (AGENT_LIVE_LIST_MS). Owned text, or NULL when
 * memory ran out: never a member cut short (a running job left out of the
 * list would have its attempt ended under it). The list and the prefix
 * facts count as sent only once the body is whole. */
char *ag_work_body(agent *a, int free_slots, size_t *len)
{
    gp_buf b;
    gp_buf_init(&b);
    json_t *pc = prefix_facts(a);
    uint64_t now = gp_now_mono_ms();
    bool list = a->n_jobs <= AGENT_LIVE_LIST_SMALL || a->live_sent_ms == 0 ||
                now - a->live_sent_ms >= AGENT_LIVE_LIST_MS;
    int rc = (list && live_ids_text(a) < 0) || gp_buf_append(&b, "{\"agent_id\":", 12) < 0 ||
                     gp_json_str_append(&b, a->id) < 0 ||
                     gp_buf_append(&b, ",\"free_slots\":", 14) < 0 ||
                     gp_buf_append_int(&b, free_slots) < 0 ||
                     gp_buf_append(&b, ",\"instance\":", 12) < 0 ||
                     gp_json_str_append(&b, a->instance) < 0
                 ? -1
                 : 0;
    if (rc == 0 && list) {
        rc = gp_buf_append(&b, ",\"running_jobs\":[", 17) < 0 ||
                     gp_buf_append(&b, a->live_ids.data ? a->live_ids.data : "",
                                   a->live_ids.len) < 0 ||
                     gp_buf_append(&b, "]", 1) < 0
                 ? -1
                 : 0;
    }
    if (rc == 0 && list && a->delivery_seen[0])
        rc = gp_buf_append(&b, ",\"delivery_seen\":", 17) < 0 ||
                     gp_json_str_append(&b, a->delivery_seen) < 0
                 ? -1
                 : 0;
    if (rc == 0 && pc)
        rc = gp_buf_append(&b, ",\"prefix_cache\":", 16) < 0 || gp_json_dump_append(&b, pc) < 0
                 ? -1
                 : 0;
    if (rc < 0 || gp_buf_append(&b, "}", 1) < 0) {
        json_decref(pc);
        gp_buf_free(&b);
        return NULL;
    }
    if (list)
        a->live_sent_ms = now ? now : 1;
    if (pc)
        a->prefix_reported = json_is_true(json_object_get(pc, "enabled"));
    json_decref(pc);
    *len = b.len;
    return gp_buf_steal(&b);
}

void ag_work_start(agent *a, int free_slots)
{
    size_t len = 0;
    char *body = ag_work_body(a, free_slots, &len);
    long timeout = (long)a->work_wait_ms + 15000; /* the server holds it up to work_wait */
    a->work_req = ag_req_start_text(a, a->cur, REQ_WORK, "/agents/work", body, len, timeout, NULL);
    a->work_free = free_slots;
    /* Short of memory for the body or the request: again soon. While no
     * long-poll is parked the server counts agent_disconnect_grace_ms
     * (default 1000) before it ends our running jobs: the retry must
     * come well inside it. */
    if (!a->work_req)
        a->next_work_ms = gp_now_mono_ms() + AGENT_WORK_RETRY_MS;
}

/* The jobs of a 200 work reply, and its delivery token (echoed from now
 * on: every job it carried is in our list before the token is sent). */
static void work_jobs(agent *a, json_t *body)
{
    json_t *jobs = json_object_get(body, "jobs");
    size_t i;
    json_t *jj;
    json_array_foreach(jobs, i, jj) job_begin(a, jj);
    const char *d = json_string_value(json_object_get(body, "delivery"));
    if (d && strlen(d) < sizeof a->delivery_seen)
        snprintf(a->delivery_seen, sizeof a->delivery_seen, "%s", d);
}

/* A replaced long-poll came back: normally the server's 204; jobs are
 * taken if the server answered it with some before the new one arrived. */
void ag_work_stale_done(agent *a, CURLcode rc, long status, json_t *body)
{
    if (rc == CURLE_OK && status == 200)
        work_jobs(a, body);
}

void ag_work_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    if (rc == CURLE_OK && status == 400 && a->work_free == 0 && !a->no_liveness &&
        strstr(ag_error_text(body), "free_slots")) {
        /* An older server: no liveness long-poll while busy (as before). */
        gp_log_info("liveness_unsupported", "server refused a busy agent's long-poll (%s); "
                    "a crash while busy is noticed by its stall timeout only", ag_error_text(body));
        a->no_liveness = true;
        a->next_work_ms = now;
        return;
    }
    if (rc != CURLE_OK || status >= 500 || status == 0) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        ag_server_unreachable(a, "work", d);
        a->next_poll_ms = now; /* find out whether the server is back (and re-register) */
        return;
    }
    if (status == 204) {
        a->next_work_ms = now;
        return;
    }
    if (status == 401) { /* e.g. KEY_REVOKED: the parked poll ended at revocation */
        ag_auth_lost(a, "/agents/work", status, body);
        return;
    }
    if (status != 200) {
        /* Unknown agent (server lost us), bad key, ...: re-register first. */
        gp_log_warn("work_rejected", "server rejected /agents/work: HTTP %ld %s", status,
                    ag_error_text(body));
        a->registered = false;
        a->next_poll_ms = now;
        a->next_work_ms = now + agent_backoff_next(&a->backoff, ag_rnd32());
        return;
    }
    work_jobs(a, body);
    a->next_work_ms = now;
}

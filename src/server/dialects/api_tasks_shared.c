/*
 * api_tasks_shared.c: native tasks across servers sharing one database
 * (docs/scaling.md "Native tasks across servers"): a follower streams a
 * task another server runs from the store's event log; leases, claims of
 * expired ones, cancels asked through the row, and LISTEN/NOTIFY wake-ups.
 */
#include "server/dialects/api_tasks_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <limits.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"

/* ------------------------------------------------------------------ */
/* Several servers on one database (docs/scaling.md "Native tasks     */
/* across servers")                                                    */
/* ------------------------------------------------------------------ */

void tasks_follow_free(follow *f)
{
    gps_stream_clear(&f->s);
    free(f);
}

static void follow_unlink(gps_tasks *g, follow *f)
{
    for (follow **pp = &g->follows; *pp; pp = &(*pp)->fnext)
        if (*pp == f) {
            *pp = f->fnext;
            break;
        }
    f->fnext = NULL;
}

/* The terminal event went out (or the task is gone): end the reply. */
static void follow_end(follow *f)
{
    if (f->g)
        follow_unlink(f->g, f);
    gps_stream_end(&f->s);
    tasks_follow_free(f);
}

static bool is_terminal_type(const char *type)
{
    return type && (strcmp(type, "end") == 0 || strcmp(type, "error") == 0);
}

int tasks_follow_frame_batch(follow *f, const char *text)
{
    /* The log holds the owner's dumps (valid JSON): a batch that does not
     * load is out of memory, and the checked load refuses a tree built
     * while an allocation failed (jansson 2.14 can drop a byte of a long
     * string and succeed: an event's text quietly changed). */
    json_t *arr = text ? gp_json_load_checked(text, strlen(text), 0, NULL) : NULL;
    int rc = text && !arr ? -1 : 0;
    size_t i;
    json_t *ev;
    json_array_foreach(arr, i, ev)
    {
        long long seq = (long long)json_integer_value(json_object_get(ev, "seq"));
        if (seq < f->next)
            continue;
        if (seq != f->next)
            break;
        if (seq > f->after && tasks_sse_frame(&f->s.out, ev) < 0) {
            rc = -1; /* f->next stays: the next read frames it */
            break;
        }
        f->next++;
        if (is_terminal_type(json_string_value(json_object_get(ev, "type")))) {
            rc = 1;
            break;
        }
    }
    json_decref(arr);
    return rc;
}

/* Run follow_tick every follow_ms while there is something to read. */
static void follow_ev_start(gps_tasks *g)
{
    int ms = g->follow_ms > 0 ? g->follow_ms : FOLLOW_MS;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!event_pending(g->follow_ev, EV_TIMEOUT, NULL))
        event_add(g->follow_ev, &tv);
}

static void follow_done(void *arg, int status, const gps_store_cells *res)
{
    follow *f = arg;
    f->polling = false;
    if (f->gone || !f->g) {
        if (f->g)
            follow_unlink(f->g, f);
        tasks_follow_free(f);
        return;
    }
    if (status < 0 || !res)
        return; /* the next read tries again */
    if (res->nrows == 0) {
        follow_end(f); /* the task is gone (purged) */
        return;
    }
    int rc = 0;
    long long before = f->next;
    /* Out of memory (-1) stops at the event not framed: the next read
     * (every follow_ms) starts there. */
    for (size_t r = 0; r < res->nrows && rc == 0; r++)
        rc = tasks_follow_frame_batch(f, res->cell[r * res->ncols + 1]);
    bool terminal = rc > 0;
    gps_stream_send(&f->s);
    bool finished = res->cell[0] != NULL;
    if (f->next > before)
        f->finished_polls = 0; /* the log still grows */
    if (terminal || (finished && ++f->finished_polls > FOLLOW_FINISHED_POLLS)) {
        follow_end(f);
        return;
    }
    if (f->rewake) {
        f->rewake = false;
        f->polling = gps_store_task_follow_async(f->g->store, f->id, f->next - 1, follow_done,
                                                 f) == 0;
    }
}

static void cwait_unlink(cwait *w)
{
    if (w->g)
        for (cwait **pp = &w->g->cwaits; *pp; pp = &(*pp)->next)
            if (*pp == w) {
                *pp = w->next;
                break;
            }
    w->g = NULL;
}

/* Answer (when the client is still there and status is not 0) and free.
 * A NULL body with a status is its builder out of memory: a 500. */
void tasks_cwait_end(cwait *w, int status, json_t *body)
{
    cwait_unlink(w);
    gps_held_release(&w->held);
    if (w->held.req && status > 0)
        gps_http_send_json(w->held.req, status, body);
    else
        json_decref(body);
    free(w);
}

static void cwait_error(cwait *w, int status, const char *code, const char *msg, int retry)
{
    cwait_unlink(w);
    gps_held_release(&w->held);
    if (w->held.req)
        gps_send_error_retry(w->held.req, GPS_DIALECT_NATIVE, status, code, msg, NULL, w->corr,
                             retry);
    free(w);
}

/* The row, read whole once it is finished (or the deadline passed): the
 * status a DELETE on its owner would have answered. */
static void cwait_got(void *arg, int status, const gps_store_job_info *j)
{
    cwait *w = arg;
    w->polling = false;
    if (status != 0 || !j) {
        if (status > 0)
            cwait_error(w, 404, "JOB_NOT_FOUND", "no such task", 0);
        else
            cwait_error(w, 500, "INTERNAL", "the task store could not be read", 0);
        return;
    }
    json_t *o = tasks_status_cold(j);
    if (o && w->reply_status == 202)
        json_object_set_new(o, "cancel_requested", json_true());
    tasks_cwait_end(w, w->reply_status, o);
}

static void cwait_finish(cwait *w, int reply_status)
{
    w->reply_status = reply_status;
    w->polling = gps_store_job_get_async(w->g->store, w->id, cwait_got, w) == 0;
    if (!w->polling)
        cwait_error(w, 500, "INTERNAL", "the task store could not be read", 0);
}

static void cwait_polled(void *arg, int status, const gps_store_cells *res)
{
    cwait *w = arg;
    w->polling = false;
    if (!w->g || !w->held.req) {
        tasks_cwait_end(w, 0, NULL);
        return;
    }
    if (status < 0 || !res)
        return; /* the next tick reads again */
    if (res->nrows == 0)
        cwait_error(w, 404, "JOB_NOT_FOUND", "no such task", 0);
    else if (res->cell[0])
        cwait_finish(w, 200);
}

/* The cancel was asked (committed), or not (the task had finished). */
static void cwait_asked(void *arg, int status, const gps_store_cells *res)
{
    cwait *w = arg;
    w->polling = false;
    if (!w->g || !w->held.req) {
        tasks_cwait_end(w, 0, NULL);
        return;
    }
    if (status != 0 || !res) {
        cwait_error(w, 503, "SERVER_BUSY",
                    "the cancel could not be written to the database; retry, here or on another "
                    "server",
                    1);
        return;
    }
    if (res->changes == 0) {
        cwait_finish(w, 200); /* finished meanwhile: its final status */
        return;
    }
    gp_log_write(GP_LOG_INFO, "task_cancel_asked", w->corr, json_pack("{s:s}", "job_id", w->id),
                 "native task run by another server: cancel asked through the database");
    gps_store_notify(w->g->store, CH_TASK_CANCEL, ""); /* its owner reads it at once */
    /* Its owner reads the asks every CLAIM_MS; an owner that is gone
     * leaves it to the server that claims its lease. */
    w->deadline_us = gp_now_mono_us() + w->g->lease_us + 10000000ull;
    follow_ev_start(w->g);
}

static void cwaits_poll(gps_tasks *g, uint64_t now)
{
    cwait *next;
    for (cwait *w = g->cwaits; w; w = next) {
        next = w->next;
        if (w->polling || !w->deadline_us)
            continue;
        if (!w->held.req)
            tasks_cwait_end(w, 0, NULL);
        else if (now >= w->deadline_us)
            cwait_finish(w, 202);
        else
            w->polling = gps_store_task_follow_async(g->store, w->id, LLONG_MAX, cwait_polled,
                                                     w) == 0;
    }
}

/* A DELETE of an unfinished task another server runs: ask it through the
 * row. Takes req over; false (req untouched) on ENOMEM or a full queue. */
bool tasks_cwait_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                       const char *corr)
{
    cwait *w = calloc(1, sizeof *w);
    if (!w)
        return false;
    w->g = g;
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->corr, sizeof w->corr, "%s", corr);
    if (gps_store_task_cancel_request_async(g->store, id, gp_now_wall_ms(), cwait_asked, w) < 0) {
        free(w);
        return false;
    }
    w->polling = true;
    /* The connection's timeout covers the longest wait (cwait_asked). */
    gps_held_start(&w->held, req, false, (int)(g->lease_us / 1000000u) + 20, NULL, NULL);
    w->next = g->cwaits;
    g->cwaits = w;
    return true;
}

static void follow_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gps_tasks *g = arg;
    for (follow *f = g->follows; f; f = f->fnext) {
        if (f->polling)
            continue;
        f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done, f) ==
                     0;
    }
    cwaits_poll(g, gp_now_mono_us());
    if (!g->follows && !g->cwaits)
        event_del(g->follow_ev);
}

static void follow_gone(void *arg)
{
    follow *f = arg;
    if (f->polling) {
        /* The read in flight frees it. */
        f->gone = true;
        return;
    }
    if (f->g)
        follow_unlink(f->g, f);
    tasks_follow_free(f);
}

static const gps_stream_ops FOLLOW_OPS = {
    .gone = follow_gone,
};

/* Follow a task that another server runs: out holds the stored events
 * framed so far (seqs up to next - 1). Takes req over; false (req
 * untouched) when this server does not follow (one server, ENOMEM). */
bool tasks_follow_start(gps_tasks *g, struct evhttp_request *req, const char *id,
                        const char *corr, long long next, long long after, gp_buf *out)
{
    if (!g->follow_ev)
        return false;
    follow *f = calloc(1, sizeof *f);
    if (!f)
        return false;
    f->g = g;
    f->next = next;
    f->after = after;
    snprintf(f->id, sizeof f->id, "%s", id);
    gps_stream_init(&f->s, &FOLLOW_OPS, f, req, corr);
    snprintf(f->s.job_id, sizeof f->s.job_id, "%s", id);
    gps_stream_start(&f->s);
    gp_buf_append(&f->s.out, out->data ? out->data : "", out->len);
    f->fnext = g->follows;
    g->follows = f;
    gps_stream_hold(&f->s, g->request_timeout_sec + 30);
    gps_stream_send(&f->s);
    /* One read now: a notification of what committed after out was read
     * came before this follow existed. */
    f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done, f) == 0;
    follow_ev_start(g);
    return true;
}

static pend *pend_new(gps_tasks *g, int64_t attempt)
{
    pend *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->g = g;
    p->attempt = attempt;
    p->next = g->pends;
    g->pends = p;
    return p;
}

/* Unlinks p; returns its gps_tasks (NULL: orphaned) and frees p. */
static gps_tasks *pend_take(pend *p)
{
    gps_tasks *g = p->g;
    if (g)
        for (pend **pp = &g->pends; *pp; pp = &(*pp)->next)
            if (*pp == p) {
                *pp = p->next;
                break;
            }
    free(p);
    return g;
}

/* The task's lease went to another server (this one stalled or was cut
 * off past it, and its event writes are refused): stop running it here
 * without touching its row, and end its streams without a terminal event
 * (clients reconnect with Last-Event-ID, to any server, and follow the log
 * its new holder writes). */
static void task_lost(gps_tasks *g, task *t, int64_t now_attempt)
{
    gp_log_write(GP_LOG_WARN, "task_lease_lost", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "attempt",
                           (json_int_t)t->lease_attempt, "lease_attempt",
                           (json_int_t)now_attempt),
                 "native task taken over by another server: stopped here");
    gps_job *job = t->job;
    if (job) {
        gps_job_unsubscribe(job, tasks_on_job_event, t);
        t->job = NULL;
        gps_job_mark_row_lost(job);
        gps_jobs_cancel(g->jobs, job, "lease_lost");
    }
    tasks_free(g, t);
}

static void lease_checked(void *arg, int status, const gps_store_cells *res)
{
    pend *p = arg;
    char id[40];
    snprintf(id, sizeof id, "%s", p->id);
    gps_tasks *g = pend_take(p);
    task *t = g ? tasks_find(g, id) : NULL;
    if (!t)
        return;
    t->lease_checking = false;
    if (status != 0 || !res)
        return; /* the database is away: the write is tried again */
    const char *at = res->nrows ? res->cell[0] : NULL;
    int64_t now_attempt = at ? strtoll(at, NULL, 10) : 0;
    if (now_attempt != t->lease_attempt)
        task_lost(g, t, now_attempt);
}

/* After a fenced write failed: is the lease still this server's? */
void tasks_lease_check(task *t)
{
    gps_tasks *g = t->owner;
    if (t->lease_checking)
        return;
    pend *p = pend_new(g, t->lease_attempt);
    if (!p)
        return;
    snprintf(p->id, sizeof p->id, "%s", t->id);
    t->lease_checking = gps_store_task_lease_async(g->store, t->id, lease_checked, p) == 0;
    if (!t->lease_checking)
        pend_take(p);
}

/* Cancel a task held here: a DELETE here, or one answered by another
 * server and asked through the row. */
void tasks_cancel(gps_tasks *g, task *t)
{
    if (t->job)
        gps_jobs_cancel(g->jobs, t->job, "api_delete"); /* no-op when already terminal */
    else if (!t->terminal)
        tasks_restore_fail(g, t, "CANCELLED", "the task was cancelled");
}

/* A cancel asked through the row (a DELETE another server answered). */
static void task_cancel_asked(gps_tasks *g, task *t)
{
    gp_log_write(GP_LOG_INFO, "task_cancelled_remote", t->corr,
                 json_pack("{s:s}", "job_id", t->id),
                 "native task cancelled by a DELETE answered by another server");
    tasks_cancel(g, t);
}

/* The cancels other servers asked for tasks this server holds. */
static void cancels_read(void *arg, int status, const gps_store_cells *res)
{
    gps_tasks *g = pend_take(arg);
    if (!g)
        return;
    g->cancels_reading = false;
    for (size_t r = 0; status == 0 && res && r < res->nrows; r++) {
        const char *id = res->cell[r * res->ncols];
        task *t = id ? tasks_find(g, id) : NULL;
        if (!t || t->terminal)
            continue; /* being claimed (read next time), or ending */
        task_cancel_asked(g, t);
    }
}

/* Read the cancels asked of this server's tasks, while it runs any. */
static void cancels_tick(gps_tasks *g, uint64_t now)
{
    if (!g->row_cancels || g->cancels_reading || now < g->cancels_due_us)
        return;
    g->cancels_due_us = now + CLAIM_MS * 1000ull;
    bool running = false;
    for (task *t = g->head; t && !running; t = t->next)
        running = !t->terminal;
    pend *p = running ? pend_new(g, 0) : NULL;
    if (!p)
        return;
    g->cancels_reading = gps_store_task_cancels_async(g->store, g->server_id, cancels_read, p) ==
                         0;
    if (!g->cancels_reading)
        pend_take(p);
}

/* A task this server claimed, read whole: resume it as a restart does. */
static void claimed_job(void *arg, int status, const gps_store_job_info *j)
{
    pend *p = arg;
    int64_t attempt = p->attempt;
    bool cancel = p->cancel;
    gps_tasks *g = pend_take(p);
    if (!g || status != 0 || !j)
        return; /* not ours to run after all: its lease expires again */
    int rc = tasks_restore(g, j, attempt);
    if (rc == -2) {
        /* Out of memory: not failed for it. The lease is not renewed
         * here, so it expires and the claim loop takes the task again. */
        gp_log_write(GP_LOG_WARN, "task_claim_oom", j->correlation_id,
                     json_pack("{s:s,s:I}", "job_id", j->id, "attempt", (json_int_t)attempt),
                     "a claimed native task could not be read into memory (out of memory): "
                     "claimed again when its lease expires");
        return;
    }
    if (rc < 0) {
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(j->id);
        u.lease_attempt = attempt;
        u.status = "failed";
        u.error_code = "SERVER_RESTART";
        u.error_message = "the task's server was lost and the task could not be resumed";
        u.finished_at = gp_now_wall_ms();
        gps_store_job_update_async(g->store, u);
        return;
    }
    task *t = tasks_find(g, j->id);
    gp_log_write(GP_LOG_INFO, "task_claimed", t->corr,
                 json_pack("{s:s,s:I,s:I}", "job_id", t->id, "attempt", (json_int_t)attempt,
                           "events", (json_int_t)gps_tlog_count(t->log)),
                 "native task taken over from a server whose lease expired");
    if (cancel)
        task_cancel_asked(g, t); /* before it runs again */
}

/* A claimed task's cancel mark read (its owner died with a DELETE asked):
 * then the task itself. */
static void claim_cancel_read(void *arg, int status, const gps_store_cells *res)
{
    pend *p = arg;
    if (!p->g) {
        pend_take(p);
        return;
    }
    p->cancel = status == 0 && res && res->nrows > 0 && res->cell[0];
    if (gps_store_job_get_async(p->g->store, p->id, claimed_job, p) < 0)
        pend_take(p);
}

static void claim_done(void *arg, int status, const gps_store_cells *res)
{
    gps_tasks *g = pend_take(arg);
    if (!g)
        return;
    g->claiming = false;
    for (size_t r = 0; status == 0 && res && r < res->nrows; r++) {
        const char *id = res->cell[r * res->ncols];
        const char *at = res->cell[r * res->ncols + 1];
        int64_t attempt = at ? strtoll(at, NULL, 10) : 0;
        if (!id)
            continue;
        task *t = tasks_find(g, id);
        if (t && !t->terminal)
            /* Ours once, its lease lapsed (a stalled loop, the database
             * away) and maybe another server wrote the log meanwhile: the
             * stored log is the truth, not this copy. */
            task_lost(g, t, attempt);
        else if (t)
            continue; /* ended here; its row update is on its way */
        pend *p = pend_new(g, attempt);
        if (!p)
            continue;
        snprintf(p->id, sizeof p->id, "%s", id);
        if (g->row_cancels ? gps_store_task_cancel_get_async(g->store, id, claim_cancel_read, p) < 0
                           : gps_store_job_get_async(g->store, id, claimed_job, p) < 0)
            pend_take(p);
    }
}

static void models_cb(void *ud, registry_agent *a)
{
    json_t *names = ud;
    if (a->state != REGISTRY_HEALTHY)
        return;
    for (size_t i = 0; i < a->n_models; i++) {
        json_array_append_new(names, json_string(a->models[i].id));
        for (size_t k = 0; k < a->models[i].n_aliases; k++)
            json_array_append_new(names, json_string(a->models[i].aliases[k]));
    }
}

/* Renew this server's leases; claim expired ones of the models its agents
 * serve (a server without such an agent leaves them to one that has). */
void tasks_shared_tick(gps_tasks *g, uint64_t now)
{
    int64_t wall = gp_now_wall_ms();
    int64_t lease_ms = (int64_t)(g->lease_us / 1000);
    if (now >= g->renew_due_us) {
        gps_store_task_renew(g->store, g->server_id, wall + lease_ms);
        g->renew_due_us = now + g->lease_us / 3;
    }
    cancels_tick(g, now);
    if (g->claiming || now < g->claim_due_us)
        return;
    g->claim_due_us = now + CLAIM_MS * 1000ull;
    json_t *models = json_array();
    if (models)
        registry_foreach(gps_jobs_registry(g->jobs), models_cb, models);
    pend *p = json_array_size(models) ? pend_new(g, 0) : NULL;
    if (p) {
        g->claiming = gps_store_task_claim_async(g->store, g->server_id, wall + lease_ms, wall,
                                                 models, CLAIM_MAX, claim_done, p) == 0;
        if (!g->claiming)
            pend_take(p);
    }
    json_decref(models);
}

/* A notification (gps_store_listen): read now what it names, unless a
 * read of it is in flight already (the poll brings what that one missed).
 * channel NULL (the listener (re)started): the polls go on as ever. */
static void tasks_woken(void *arg, const char *channel, const char *payload)
{
    gps_tasks *g = arg;
    if (!channel || !payload)
        return;
    if (strcmp(channel, CH_TASK_CANCEL) == 0) {
        g->cancels_due_us = 0;
        cancels_tick(g, gp_now_mono_us());
        return;
    }
    if (strcmp(channel, CH_TASK_JOB) != 0)
        return;
    for (follow *f = g->follows; f; f = f->fnext) {
        if (f->gone || strcmp(f->id, payload) != 0)
            continue;
        if (f->polling) {
            /* the read in flight may have begun before this write
             * committed: dropping the wake-up left the follower to its
             * poll (a hang where polls are off) */
            f->rewake = true;
            continue;
        }
        f->polling = gps_store_task_follow_async(g->store, f->id, f->next - 1, follow_done,
                                                 f) == 0;
    }
    uint64_t now = gp_now_mono_us();
    for (cwait *w = g->cwaits; w; w = w->next)
        if (!w->polling && w->deadline_us && w->held.req && now < w->deadline_us &&
            strcmp(w->id, payload) == 0)
            w->polling = gps_store_task_follow_async(g->store, w->id, LLONG_MAX, cwait_polled,
                                                     w) == 0;
}

void gps_tasks_set_follow_ms(gps_tasks *g, int ms)
{
    if (g && ms > 0)
        g->follow_ms = ms;
}

int gps_tasks_set_shared(gps_tasks *g, const char *server_id, int lease_sec)
{
    if (!g || !g->base || !g->gated || !server_id || !*server_id ||
        !gps_store_has_task_leases(g->store))
        return -1;
    g->follow_ev = event_new(g->base, -1, EV_PERSIST, follow_tick, g);
    if (!g->follow_ev)
        return -1;
    g->shared = true;
    g->row_cancels = gps_store_has_task_cancel(g->store);
    snprintf(g->server_id, sizeof g->server_id, "%s", server_id);
    g->lease_us = (uint64_t)(lease_sec > 0 ? lease_sec : DEFAULT_LEASE_SEC) * 1000000ull;
    static const char *const channels[] = {CH_TASK_JOB, CH_TASK_CANCEL, NULL};
    g->listener = gps_store_listen(g->store, g->base, channels, tasks_woken, g);
    return 0;
}

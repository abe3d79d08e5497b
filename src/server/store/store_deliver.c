/*
 * store_deliver.c: read results, and durability notices, handed back to
 * the loop thread through the store's eventfd.
 */
#include "server/store/store_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Read results, delivered on the loop thread                               */
/* ------------------------------------------------------------------------ */

json_t *store_col_json(const row *r, int i, size_t flags, bool *oom)
{
    *oom = false;
    if (r->v[i].t != V_TEXT)
        return NULL;
    /* gp_json's reader, never jansson's lexer (which can read and write
     * past its token buffer when that buffer cannot grow); one read with
     * the site's flags. */
    json_error_t e;
    json_t *v = gp_json_load_checked(r->v[i].s, r->v[i].len, flags, &e);
    *oom = !v && json_error_code(&e) == json_error_out_of_memory;
    return v;
}

int store_job_info_from_row(const row *r, gps_store_job_info *ji, json_t **request)
{
    memset(ji, 0, sizeof(*ji));
    ji->id = rs(r, 0);
    ji->api = rs(r, 1);
    ji->kind = rs(r, 2);
    ji->model = rs(r, 3);
    ji->key_id = rs(r, 4);
    ji->agent_id = rs(r, 5);
    ji->status = rs(r, 6);
    ji->priority = (int)ri(r, 7, 0);
    ji->attempts = (int)ri_count(r, 8, 0, 1000);
    ji->prompt_tokens = ri_count(r, 9, -1, STORE_MAX_COUNT);
    ji->completion_tokens = ri_count(r, 10, -1, STORE_MAX_COUNT);
    ji->queue_ms = ri_count(r, 11, -1, STORE_MAX_COUNT);
    ji->ttft_ms = ri_count(r, 12, -1, STORE_MAX_COUNT);
    ji->total_ms = ri_count(r, 13, -1, STORE_MAX_COUNT);
    ji->finish_reason = rs(r, 14);
    ji->error_code = rs(r, 15);
    ji->correlation_id = rs(r, 16);
    ji->has_seed = r->v[17].t == V_INT;
    ji->seed = ri(r, 17, 0);
    ji->created_at = ri(r, 18, 0);
    ji->finished_at = ri(r, 19, 0);
    ji->error_message = r->n > JOB_COL_ERROR_MESSAGE ? rs(r, JOB_COL_ERROR_MESSAGE) : NULL;
    /* A request text that is not JSON (a row edited by hand) reads as no
     * request, as it always did. Out of memory is the read's failure
     * instead: a native task resumed from a request missing, or read with a
     * byte dropped, would run another request under the same id. */
    bool oom;
    *request = store_col_json(r, 20, JSON_DECODE_ANY, &oom);
    if (oom)
        return -1;
    ji->request = *request;
    ji->checkpoint_text = r->v[21].t == V_TEXT ? r->v[21].s : NULL;
    ji->checkpoint_len = r->v[21].t == V_TEXT ? r->v[21].len : 0;
    ji->checkpoint_seq = ri(r, 22, -1);
    return 0;
}

/* The event log as it is read (store_events_collect). */
typedef struct events_acc {
    json_t *all;   /* the batches so far, concatenated (NULL: none yet) */
    bool oom;
} events_acc;

/* Appends one stored batch to the log. A batch that is not a JSON array
 * ends the log there (replay must never skip a seq); out of memory stops
 * the read as a failure (the log would be cut short, or a batch read with
 * a byte dropped: a replay that differs from what ran). */
static int append_batch(void *arg, const row *r)
{
    events_acc *a = arg;
    json_t *batch = store_col_json(r, 0, 0, &a->oom);
    if (!json_is_array(batch)) {
        json_decref(batch);
        return 1;
    }
    if (!a->all)
        a->all = json_array();
    a->oom = !a->all || json_array_extend(a->all, batch) < 0;
    json_decref(batch);
    return a->oom;
}

int store_events_collect(conn *c, const char *job_id, json_t **events)
{
    *events = NULL;
    if (!job_id || !store_conn_stmt(c, K_EVENTS_GET))
        return 0;
    events_acc a = {0};
    opb b;
    store_b_spec(&b, K_EVENTS_GET, "t", job_id);
    int stopped = 0;
    /* A failed step fails the read as it does the job row's own (the log
     * would otherwise end early, unseen), and so does out of memory. */
    int rc = b.oom ? -2
                   : store_stmt_exec(c, K_EVENTS_GET, b.v, b.nv, append_batch, &a, &stopped,
                                     NULL);
    store_b_release(&b);
    if (rc == 0 && a.oom)
        rc = -2;
    if (rc != 0) {
        json_decref(a.all);
        return rc;
    }
    *events = a.all;
    return 0;
}

/* F_CELLS results: every row's columns as text, row-major. */
static void deliver_cells(op *o)
{
    gps_store_cells res = {.changes = o->changes};
    const char **cell = NULL;
    if (o->status == 0 && o->nrows) {
        res.ncols = (size_t)o->rows[0]->n;
        cell = calloc(o->nrows * res.ncols, sizeof *cell);
        if (!cell) {
            o->cells_cb(o->arg, -1, NULL);
            return;
        }
        for (size_t i = 0; i < o->nrows; i++)
            for (size_t c = 0; c < res.ncols; c++)
                cell[i * res.ncols + c] = rs(o->rows[i], (int)c);
        res.nrows = o->nrows;
    }
    res.cell = cell;
    o->cells_cb(o->arg, o->status, o->status == 0 ? &res : NULL);
    free(cell);
}

/* The reads of the servers' shared state (servers, keys, usage): rows
 * turned into the caller's structs, borrowed for the callback. */
static void deliver_shared(op *o)
{
    if (o->kind == K_SERVER_BEAT) {
        o->status_cb(o->arg, o->status);
        return;
    }
    size_t n = o->status == 0 ? o->nrows : 0;
    size_t sz = o->kind == K_SERVER_LIST ? sizeof(gps_store_server_row)
                : o->kind == K_KEYS_GET  ? sizeof(gps_store_key_row)
                                         : sizeof(gps_store_usage_row);
    void *v = n ? calloc(n, sz) : NULL;
    int status = n && !v ? -1 : o->status;
    for (size_t i = 0; v && i < n; i++) {
        const row *r = o->rows[i];
        if (o->kind == K_SERVER_LIST)
            ((gps_store_server_row *)v)[i] = (gps_store_server_row){
                .id = rs(r, 0), .name = rs(r, 1), .url = rs(r, 2), .pid = ri(r, 3, 0),
                .version = rs(r, 4), .started_at = ri(r, 5, 0), .heartbeat_at = ri(r, 6, 0),
                .lease_until = ri(r, 7, 0), .stopped_at = ri(r, 8, 0)};
        else if (o->kind == K_KEYS_GET)
            ((gps_store_key_row *)v)[i] = (gps_store_key_row){
                .id = rs(r, 0), .hash = rs(r, 1), .role = rs(r, 2),
                .name = rs(r, 3) ? rs(r, 3) : "", .agent_id = rs(r, 4),
                .created_at = ri(r, 5, 0), .expires_at = ri(r, 6, 0),
                .revoked_at = ri(r, 7, 0), .last_used_at = ri(r, 8, 0), .rpm = ri(r, 9, 0),
                .tokens_per_day = ri(r, 10, 0), .max_concurrent = ri(r, 11, 0),
                .max_uses = ri(r, 12, 0), .uses = ri(r, 13, 0)};
        else
            ((gps_store_usage_row *)v)[i] = (gps_store_usage_row){
                .key_id = rs(r, 0), .requests = ri(r, 1, 0), .prompt_tokens = ri(r, 2, 0),
                .completion_tokens = ri(r, 3, 0), .rate_limited = ri(r, 4, 0)};
    }
    if (status != 0)
        n = 0;
    if (o->kind == K_SERVER_LIST)
        o->servers_cb(o->arg, status, v, n);
    else if (o->kind == K_KEYS_GET)
        o->keys_cb(o->arg, status, v, n);
    else
        o->usage_cb(o->arg, status, o->v[0].i, v, n);
    free(v);
}

static void deliver(op *o)
{
    if (o->kind == K_JOB_GET) {
        if (o->status == 0 && o->result) {
            gps_store_job_info ji;
            json_t *req;
            if (store_job_info_from_row(o->result, &ji, &req) < 0) {
                o->job_cb(o->arg, -1, NULL); /* out of memory: as a failed read */
                return;
            }
            ji.events = o->events;
            o->job_cb(o->arg, 0, &ji);
            json_decref(req);
        } else {
            o->job_cb(o->arg, o->status, NULL);
        }
    } else if (o->kind == K_PING) {
        o->ping_cb(o->arg, o->status == 0, o->status == 0 ? "ok" : o->msg);
    } else if (store_stmts[o->kind].flags & F_CELLS) {
        deliver_cells(o);
    } else if (o->kind == K_SERVER_BEAT || o->kind == K_SERVER_LIST || o->kind == K_KEYS_GET ||
               o->kind == K_USAGE_GET) {
        deliver_shared(o);
    } else if (o->kind == K_JOB_LIST) {
        gps_store_job_info *jobs = o->nrows ? calloc(o->nrows, sizeof *jobs) : NULL;
        if (o->nrows && !jobs) {
            o->jobs_cb(o->arg, -1, NULL, 0);
            return;
        }
        for (size_t i = 0; i < o->nrows; i++) {
            json_t *req; /* NULL: the list reads no request (K_JOB_LIST), so cannot fail */
            (void)store_job_info_from_row(o->rows[i], &jobs[i], &req);
        }
        o->jobs_cb(o->arg, o->status, o->status == 0 ? jobs : NULL,
                   o->status == 0 ? o->nrows : 0);
        free(jobs);
    } else if (o->status_cb) {
        o->status_cb(o->arg, o->status); /* a write whose caller waits (deployments) */
    }
}

void store_deliver_all(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    op *list = s->dhead;
    s->dhead = s->dtail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        op *next = list->next;
        deliver(list);
        json_decref(list->events);
        store_rows_free(list);
        free(list->result);
        free(list);
        list = next;
    }
}

/* The loop's side of wake_fd: read results ready and/or job_events
 * committed (or failed). Runs on the loop thread. */
void store_on_wake(evutil_socket_t fd, short what, void *arg)
{
    gps_store *s = arg;
    uint64_t n;
    (void)what;
    /* Read before looking at the queue: a wake sent after this read
     * (wake_sent cleared below) makes the fd readable again. */
    if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN && errno != EINTR)
        gp_log_write(GP_LOG_ERROR, "store_wake_read_failed", NULL, NULL,
                     "store: reading the DB thread's wake-up: %s", strerror(errno));
    pthread_mutex_lock(&s->mu);
    s->wake_sent = false;
    bool commit = s->pend_commit;
    s->pend_commit = false;
    gps_store_commit_fn fn = s->commit_fn;
    void *farg = s->commit_arg;
    uint64_t done = s->events_done_seq;
    bool failed = s->events_failed;
    if (commit)
        s->events_failed = false;
    pthread_mutex_unlock(&s->mu);
    store_deliver_all(s);
    if (commit && fn)
        fn(farg, done, failed);
}

bool gps_store_has_job_events(gps_store *s)
{
    return s && s->w.ok[K_EVENTS_ADD];
}

void gps_store_set_commit_cb(gps_store *s, gps_store_commit_fn fn, void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->commit_fn = fn;
    s->commit_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

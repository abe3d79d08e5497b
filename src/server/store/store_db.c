/*
 * store_db.c: the DB thread: an op run on its connection, and group
 * transactions committed at their deadline (group commit).
 */
#include "server/store/store_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* Row handlers of the DB thread's reads: the op collects its rows. */
static int keep_first_row(void *arg, const row *r)
{
    op *o = arg;
    o->result = store_row_dup(r);
    return o->result ? 1 : -1;
}

static int append_row(void *arg, const row *src)
{
    op *o = arg;
    row **grown = realloc(o->rows, (o->nrows + 1) * sizeof *grown);
    if (!grown)
        return -1;
    o->rows = grown;
    row *r = store_row_dup(src);
    if (!r)
        return -1;
    o->rows[o->nrows++] = r;
    return 0;
}

/* Run one op on the DB thread. Returns true when it was a write that
 * succeeded, false otherwise (reads return false; *failed tells a failed
 * write). */
static bool run_op(gps_store *s, op *o, bool *failed)
{
    conn *c = &s->w;
    *failed = false;
    if (!store_conn_stmt(c, o->kind)) {
        /* An optional statement this DB's schema does not support. */
        *failed = true;
        if (o->status_cb)
            o->status = -1;   /* no lease (no deployment row) without the table */
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s}", "op", store_stmts[o->kind].name),
                     "store op %s is not supported by this database's schema",
                     store_stmts[o->kind].name);
        return false;
    }
    int stopped;
    int64_t changes = 0;
    switch (o->kind) {
    case K_JOB_GET: {
        /* With the error message where the schema has it (migration 0014). */
        int k = store_conn_stmt(c, K_JOB_GET_MSG) ? K_JOB_GET_MSG : K_JOB_GET;
        int rc = store_stmt_exec(c, k, o->v, o->nv, keep_first_row, o, &stopped, NULL);
        o->status = rc != 0 || stopped < 0 ? -1 : o->result ? 0 : 1;
        if (o->status == 0 && store_events_collect(c, o->v[0].s, &o->events) < 0) {
            /* A job without its event log (or with part of it) would be
             * replayed short: the read fails as it does for the row's own
             * failed step. */
            o->status = -1;
            free(o->result);
            o->result = NULL;
        }
        return false;
    }
    case K_JOB_LIST:
    case K_SERVER_LIST:
    case K_KEYS_GET:
    case K_USAGE_GET:
    case K_RESP_GET:
    case K_RESP_ITEMS_GET:
    case K_RESP_DELETE:
    case K_TASK_CLAIM:
    case K_TASK_FOLLOW:
    case K_TASK_LEASE_GET:
    case K_JOBS_FAIL_ORPHANS:
    case K_HANDOFF_PEERS:
    case K_HANDOFF_PEERS_FREE:
    case K_HANDOFF_CLAIM:
    case K_HANDOFF_PEEK:
    case K_HANDOFF_CLAIM_IDS:
    case K_HANDOFF_WITHDRAW:
    case K_HANDOFF_EVENTS:
    case K_HANDOFF_FOLLOW:
    case K_HANDOFF_MINE:
    case K_HANDOFF_SWEEP:
    case K_TASK_CANCEL_REQ:
    case K_TASK_CANCELS:
    case K_TASK_CANCEL_GET:
        o->status =
            store_stmt_exec(c, o->kind, o->v, o->nv, append_row, o, &stopped, &changes) == 0 &&
                    stopped == 0
                ? 0
                : -1;
        o->changes = o->kind == K_RESP_DELETE || o->kind == K_JOBS_FAIL_ORPHANS ||
                             o->kind == K_HANDOFF_SWEEP || o->kind == K_HANDOFF_WITHDRAW ||
                             o->kind == K_TASK_CANCEL_REQ
                         ? changes
                         : 0;
        if (o->status)
            store_rows_free(o);
        return false;
    case K_PING:
        o->status =
            store_stmt_exec(c, o->kind, o->v, o->nv, NULL, NULL, &stopped, NULL) == 0 ? 0 : -1;
        if (o->status)
            snprintf(o->msg, sizeof(o->msg), "%s", store_conn_err(c));
        return false;
    default:
        break;
    }
    if (store_stmt_exec(c, o->kind, o->v, o->nv, NULL, NULL, &stopped, &changes) != 0) {
        *failed = true;
        o->status = -1;   /* a heartbeat's caller learns it (server_beat) */
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s, s:s}", "op", store_stmts[o->kind].name, "engine",
                               s->eng->name),
                     "store write %s failed: %s", store_stmts[o->kind].name, store_conn_err(c));
        return false;
    }
    if ((o->kind == K_PURGE || o->kind == K_RESP_PURGE) && changes >= PURGE_CHUNK) {
        /* More to delete: go again after whatever queued meanwhile, so a
         * big purge never holds one long transaction. */
        opb b;
        store_b_spec(&b, o->kind, "i", o->v[0].i);
        op *again = store_b_pack(&b);
        if (again) {
            pthread_mutex_lock(&s->mu);
            store_enqueue_locked(s, again, again, 1);
            pthread_mutex_unlock(&s->mu);
        }
    }
    return true;
}

static void timespec_in_us(struct timespec *ts, uint64_t us_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(us_from_now / 1000000);
    ts->tv_nsec += (long)(us_from_now % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* A read: its caller waits for the result (committed first). */
bool store_op_is_read(const op *o)
{
    return o->kind == K_JOB_GET || o->kind == K_PING || o->kind == K_JOB_LIST ||
           o->kind == K_SERVER_BEAT || o->kind == K_SERVER_LIST || o->kind == K_KEYS_GET ||
           o->kind == K_USAGE_GET || (store_stmts[o->kind].flags & F_CELLS) ||
           o->status_cb; /* a write whose caller waits for its outcome */
}

/* DB thread: wake the loop (store_on_wake). An eventfd write cannot block
 * (the counter would have to reach 2^64 - 1) nor fail but for a bug. */
static void wake_loop(gps_store *s)
{
    uint64_t one = 1;
    while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

/* Under mu, in a group transaction whose queue is not empty: true when
 * the DB thread may leave what is queued until the commit deadline. A
 * request-log row was inserted at once when its write was the first of a
 * group, and its assignment and end updates, queued a millisecond later,
 * could no longer fold into it: at low load every row cost three
 * statements (issue 24). Every write of a group commits at its deadline
 * whenever it runs, so running the foldable ones there delays nothing;
 * anything else queued (a read, native task events or writes, an op
 * queued ahead), a flush, a read or events already in the group (commit
 * now) or a full batch runs the queue at once, in order. */
static bool db_hold(const gps_store *s, bool commit_soon)
{
    return !commit_soon && !s->flush_waiters && !s->stop && s->q_nowait == 0 &&
           s->stats.queue_depth - s->stats.rows_waiting < (uint64_t)s->batch_max;
}

/* The DB thread                                                            */
/* ------------------------------------------------------------------------ */

/* What one group transaction did (store_db_main). */
typedef struct group {
    uint64_t writes_ok, writes_failed, n, last_seq;
    bool has_read, has_events, events_failed;
    bool begun;                /* BEGIN ran (group_begin) */
    bool waited;               /* waited for the deadline with ops queued */
    bool in_tx;                /* and opened a transaction */
    op *done_head, *done_tail; /* finished reads, for the loop */
} group;

/* Called with mu held, returns with it held: open the group's
 * transaction, once, before its first op runs. Not earlier: a group whose
 * ops are all held runs nothing, and an empty transaction still took
 * SQLite's write lock (two round trips on PostgreSQL). On SQLite, BEGIN
 * IMMEDIATE takes the write lock now (waiting up to busy_timeout if a CLI
 * holds it) so that statement errors later are about the statement, not
 * the lock; nothing is taken off the queue meanwhile. */
static void group_begin(gps_store *s, group *g)
{
    if (g->begun)
        return;
    g->begun = true;
    pthread_mutex_unlock(&s->mu);
    char err[256] = "";
    g->in_tx = store_exec_simple(&s->w, s->eng->begin_sql, err, sizeof(err)) == 0;
    if (!g->in_tx)
        gp_log_write(GP_LOG_ERROR, "store_begin_failed", NULL, NULL,
                     "store: BEGIN failed (%s); writing without a transaction", err);
    pthread_mutex_lock(&s->mu);
}

/* Run o in the group (mu not held); a read is kept for the loop, anything
 * else freed. */
static void group_run(gps_store *s, group *g, op *o)
{
    bool failed;
    bool ok = run_op(s, o->fold ? o->fold : o, &failed);
    g->writes_ok += ok ? 1 + o->folds : 0;
    g->writes_failed += failed ? 1 + o->folds : 0;
    if (o->kind == K_EVENTS_ADD || o->kind == K_EVENTS_ADD_FENCED) {
        g->has_events = true;
        g->events_failed |= !ok;
    }
    g->n++;
    if (store_op_is_read(o)) {
        g->has_read = true;
        o->next = NULL;
        if (g->done_tail)
            g->done_tail->next = o;
        else
            g->done_head = o;
        g->done_tail = o;
    } else {
        free(o->fold);
        free(o);
    }
}

/* Called with mu held, returns with it held: run the held writes due now
 * (all: every one), as many as the group has room for. */
static void group_run_held(gps_store *s, group *g, bool all)
{
    if (!s->hhead)
        return;
    if (!g->begun) {
        /* The transaction first, then the take: held writes stay counted
         * in the backlog, and open to folding, while BEGIN waits for the
         * lock. Only this thread takes held writes: what is due now is
         * still due after BEGIN. */
        if (!all && !store_held_due_locked(s, gp_now_mono_us()))
            return;
        group_begin(s, g);
    }
    uint64_t room = g->n < (uint64_t)s->batch_max ? (uint64_t)s->batch_max - g->n : 1;
    op *chain = store_held_take_locked(s, gp_now_mono_us(), all, room);
    if (!chain)
        return;
    pthread_mutex_unlock(&s->mu);
    while (chain) {
        op *o = chain;
        chain = o->next;
        group_run(s, g, o);
    }
    pthread_mutex_lock(&s->mu);
}

/* Fill one group transaction (mu held on entry and exit): run what is
 * queued, in order, until the queue is empty and the commit is due, or
 * batch_max ops ran, or an op queued ahead ran. */
static void group_fill(gps_store *s, group *g)
{
    uint64_t deadline = gp_now_mono_us() + (uint64_t)s->commit_interval_ms * 1000;
    for (;;) {
        if (!s->qhead || db_hold(s, g->has_read || g->has_events)) {
            /* Commit now when someone waits for it (flush, a read,
             * native task events: their clients get them only once
             * committed) or we are stopping; else keep the transaction
             * open for more writes until the deadline. Ops queued while a
             * COMMIT runs still share the next one. Foldable writes may
             * wait here too (db_hold): at the deadline they run and
             * commit, and so do the held writes then due (a row that
             * ended while the DB thread was idle too: committing it at
             * once made a second commit for every group at one client). */
            uint64_t now = gp_now_mono_us();
            bool commit_now = s->flush_waiters || s->stop || g->has_read || g->has_events ||
                              now >= deadline;
            if (commit_now && !s->qhead) {
                group_run_held(s, g, false);
                if (!s->qhead || g->n >= (uint64_t)s->batch_max)
                    break;
                continue; /* queued while the held ran: they join this commit */
            }
            if (commit_now)
                goto take;
            struct timespec ts;
            timespec_in_us(&ts, deadline - now);
            if (s->qhead && !g->waited) {
                g->waited = true;
                s->stats.deadline_waits++;
            }
            s->tx_waiting = true;
            pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
            s->tx_waiting = false;
            continue;
        }
    take:;
        op *o = s->qhead;
        /* What concerns jobs (a read, a table-wide write, a native
         * task's) runs after every held write: ops run in enqueue order
         * but for the held rows, which the rest does not concern. */
        if (store_held_runs_first(s, o)) {
            group_run_held(s, g, true);
            if (g->n >= (uint64_t)s->batch_max)
                break;
            continue;
        }
        /* Due held writes (ended, hold over, a flush or the stop waiting)
         * run before the next op: under a queue that never empties they
         * would otherwise wait for an op that concerns jobs, and a flush
         * with them. */
        if (store_held_due_locked(s, gp_now_mono_us())) {
            uint64_t n0 = g->n;
            group_run_held(s, g, false);
            if (g->n >= (uint64_t)s->batch_max)
                break;
            if (g->n > n0)
                continue;
        }
        if (!g->begun && !store_would_hold(s, o)) {
            group_begin(s, g); /* mu released: look at the queue again */
            continue;
        }
        s->qhead = o->next;
        if (!s->qhead)
            s->qtail = NULL;
        if (!o->may_wait)
            s->q_nowait--;
        if (o->seq > s->seq_taken)
            s->seq_taken = o->seq;
        if (store_held_add_locked(s, o, gp_now_mono_us()))
            continue;
        s->stats.queue_depth--;
        if (o->pending)
            store_pend_del(s, o); /* nothing folds into it once taken */
        if (o->in_usage)
            store_usage_del_locked(s, o);
        pthread_mutex_unlock(&s->mu);
        bool ahead = o->seq == 0; /* queued ahead (store_enqueue_front): commit now */
        if (!ahead)
            g->last_seq = o->seq;
        group_run(s, g, o);
        pthread_mutex_lock(&s->mu);
        /* Past the deadline, what is queued still joins this commit (the
         * writes that waited for it without a wake, see store_enqueue_locked);
         * batch_max bounds the group. */
        if (g->n >= (uint64_t)s->batch_max || ahead)
            break;
    }
}

/* After a group's COMMIT (mu held): every op taken so far is committed
 * but for the held writes, the oldest of which bounds what a flush may
 * count as done. */
static uint64_t seq_committed_locked(const gps_store *s)
{
    if (s->hhead && s->hhead->seq && s->hhead->seq - 1 < s->seq_taken)
        return s->hhead->seq - 1;
    return s->seq_taken;
}

/* Under mu, nothing queued: wait for work (ops, a held write coming due,
 * a flush or the stop). */
static void db_idle_wait(gps_store *s)
{
    while (!s->qhead && !s->stop) {
        uint64_t now = gp_now_mono_us();
        if (store_held_due_locked(s, now))
            return;
        s->db_idle = true;
        if (s->hhead) {
            struct timespec ts;
            timespec_in_us(&ts, s->hhead->hold_until_us - now);
            pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
        } else {
            pthread_cond_wait(&s->cv_work, &s->mu);
        }
        s->db_idle = false;
    }
}

/* After a group's COMMIT (or its failure), mu not held; returns with mu
 * held: count it, publish what is done, hand finished reads to the loop. */
static void db_committed(gps_store *s, group *g, bool commit_ok, uint64_t commit_us,
                         const char *err)
{
    bool in_tx = g->in_tx;
    /* A heartbeat (a cancel request, an operator's deployment change)
     * holds only once its transaction is committed. */
    for (op *o = g->done_head; o && in_tx && !commit_ok; o = o->next)
        if (o->status_cb || o->kind == K_TASK_CANCEL_REQ)
            o->status = -1;
    pthread_mutex_lock(&s->mu);
    if (g->n == 0) {
        /* Every op taken was held: no transaction, nothing to count. */
    } else if (commit_ok) {
        s->stats.ops_committed += g->writes_ok;
        s->stats.ops_failed += g->writes_failed;
        s->stats.batches++;
        s->stats.statements += g->n;
        s->stats.last_batch_ops = g->n;
        s->stats.last_commit_us = commit_us;
        if (commit_us > s->stats.max_commit_us)
            s->stats.max_commit_us = commit_us;
        s->stats.last_commit_wall_ms = gp_now_wall_ms();
        s->last_commit_ok = true;
    } else {
        s->stats.ops_failed += g->writes_ok + g->writes_failed;
        s->stats.commit_failures++;
        s->last_commit_ok = false;
        snprintf(s->last_error, sizeof(s->last_error), "last commit failed: %s", err);
    }
    uint64_t done = seq_committed_locked(s);
    if (done > s->seq_done)
        s->seq_done = done;
    bool notify = false, notify_commit = false;
    if (g->has_events) {
        /* Not past a held write of lower seq (store.h: every op up to it
         * executed). The events op drained the older ones, so its own
         * seq stays covered. */
        s->events_done_seq = g->last_seq < done ? g->last_seq : done;
        s->events_failed |= g->events_failed || !commit_ok;
        notify_commit = s->wake_fd >= 0;
    }
    if (g->done_head) {
        if (s->dtail)
            s->dtail->next = g->done_head;
        else
            s->dhead = g->done_head;
        s->dtail = g->done_tail;
        notify = s->wake_fd >= 0;
    }
    if (notify_commit)
        s->pend_commit = true;
    /* One write per batch at most, and none while the loop has a wake
     * it has not read yet: it looks at dhead and pend_commit after
     * reading, under mu, so it sees this batch too. */
    bool wake = (notify || notify_commit) && !s->wake_sent;
    if (wake)
        s->wake_sent = true;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    if (wake)
        wake_loop(s);
    pthread_mutex_lock(&s->mu);
}

void *store_db_main(void *arg)
{
    gps_store *s = arg;
    char err[256];

    pthread_mutex_lock(&s->mu);
    for (;;) {
        db_idle_wait(s);
        if (!s->qhead && !s->hhead && s->stop)
            break;
        group g;
        memset(&g, 0, sizeof(g));
        group_fill(s, &g); /* opens the transaction before its first op (group_begin) */
        pthread_mutex_unlock(&s->mu);

        bool commit_ok = true;
        uint64_t commit_us = 0;
        err[0] = '\0';
        if (g.in_tx) {
            uint64_t t0 = gp_now_mono_us();
            if (store_exec_simple(&s->w, "COMMIT", err, sizeof(err)) != 0) {
                commit_ok = false;
                gp_log_write(GP_LOG_ERROR, "store_commit_failed", NULL,
                             json_pack("{s:I}", "ops", (json_int_t)g.n),
                             "store: COMMIT of %llu ops failed: %s", (unsigned long long)g.n, err);
                store_exec_simple(&s->w, "ROLLBACK", NULL, 0);
            }
            commit_us = gp_now_mono_us() - t0;
        }
        db_committed(s, &g, commit_ok, commit_us, err);
    }
    s->thread_alive = false;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

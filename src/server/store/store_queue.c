/*
 * store_queue.c: the queue between the loop and the DB thread: ops
 * appended (folded where they may), the queue's cap, and the op builders
 * the async writers and readers use.
 */
#include "server/store/store_priv.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* Append a chain of count ops. Caller holds mu. */
void store_enqueue_locked(gps_store *s, op *first, op *last, size_t count)
{
    for (op *o = first; o; o = o->next) {
        o->seq = ++s->seq_enqueued;
        s->q_nowait += !o->may_wait;
        if (o->kind == K_USAGE_GET)
            store_usage_seal_locked(s);
    }
    last->next = NULL;
    if (s->qtail)
        s->qtail->next = first;
    else
        s->qhead = first;
    s->qtail = last;
    s->stats.queue_depth += count;
    s->stats.ops_enqueued += count;
    /* Wake the DB thread for the first write of a group, for what someone
     * waits on (reads, native task events), and at batch_max. A plain write
     * that finds a transaction open and waiting for its deadline waits with
     * it: it is committed at that deadline either way, and a wake per write
     * (three per relayed request: insert, assign, finish) was a futex call
     * and a context switch each on the loop's core (issue 24). */
    bool urgent = !s->tx_waiting ||
                  s->stats.queue_depth - s->stats.rows_waiting >= (uint64_t)s->batch_max;
    for (op *o = first; o && !urgent; o = o->next)
        urgent = store_op_is_read(o) || o->kind == K_EVENTS_ADD || o->kind == K_EVENTS_ADD_FENCED;
    if (urgent)
        pthread_cond_signal(&s->cv_work);
}

void store_free_chain(op *o)
{
    while (o) {
        op *next = o->next;
        store_rows_free(o);
        free(o->result);
        free(o->fold);
        free(o);
        o = next;
    }
}

/* Queue a chain of ops (linked by next). Writes (droppable) are refused
 * beyond queue_max. Takes ownership of the chain in every case. *seq_out
 * (may be NULL) gets the last op's seq: read under the lock, since the DB
 * thread may free the op as soon as it is queued. row: 0 any op; 1 a job
 * row's write, 2 one that may fold (store_fold_locked); ENQ_USAGE a usage add. */
int store_enqueue_ex(gps_store *s, op *first, bool droppable, uint64_t *seq_out, int row)
{
    if (!first)
        return -1;
    size_t count = 1;
    op *last = first;
    while (last->next) {
        last = last->next;
        count++;
    }
    op *pend_hit = NULL; /* store_fold_locked's look-up, for store_fold_miss_locked */
    pthread_mutex_lock(&s->mu);
    bool folded = row == ENQ_USAGE
                      ? s->thread_alive && store_usage_fold_locked(s, first)
                      : row && s->thread_alive && store_fold_locked(s, first, row > 1, &pend_hit);
    if (folded) {
        pthread_mutex_unlock(&s->mu);
        store_free_chain(first);
        return 0;
    }
    if (!s->thread_alive || (droppable && s->stats.queue_depth + count > s->queue_max)) {
        bool alive = s->thread_alive;
        s->stats.drops += count;
        uint64_t drops = s->stats.drops;
        int64_t now = gp_now_wall_ms();
        bool log = now - s->last_drop_log_ms >= 1000;
        if (log)
            s->last_drop_log_ms = now;
        pthread_mutex_unlock(&s->mu);
        if (log && alive)
            gp_log_write(GP_LOG_ERROR, "store_queue_full", NULL,
                         json_pack("{s:I, s:I}", "drops_total", (json_int_t)drops, "queue_max",
                                   (json_int_t)s->queue_max),
                         "store: write queue full (%zu ops), dropping writes", s->queue_max);
        else if (log)
            gp_log_write(GP_LOG_ERROR, "store_queue_full", NULL,
                         json_pack("{s:I}", "drops_total", (json_int_t)drops),
                         "store: DB thread not running, dropping writes");
        store_free_chain(first);
        return -1;
    }
    bool usage = row == ENQ_USAGE;
    bool reg = row && !usage && store_fold_miss_locked(s, first, row > 1, pend_hit);
    /* a row op is one op; a usage add, too, and it may wait for the
     * deadline as a foldable row write does (db_hold) */
    first->may_wait = reg || usage;
    store_enqueue_locked(s, first, last, count);
    if (reg)
        store_pend_add(s, first);
    if (usage)
        store_usage_add_locked(s, first);
    if (seq_out)
        *seq_out = s->seq_enqueued;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int enqueue_seq(gps_store *s, op *first, bool droppable, uint64_t *seq_out)
{
    return store_enqueue_ex(s, first, droppable, seq_out, 0);
}

int store_enqueue(gps_store *s, op *first, bool droppable)
{
    return enqueue_seq(s, first, droppable, NULL);
}

/* Queue one op ahead of everything waiting: the server's heartbeat, whose
 * lease must not run out behind a backlog of request-log writes (servers
 * sharing the DB would take its tasks over, and it would stop admitting,
 * with the database reachable all along). It takes no seq: flushes wait
 * for the ops queued before them, which this one does not reorder. */
int store_enqueue_front(gps_store *s, op *o)
{
    pthread_mutex_lock(&s->mu);
    if (!s->thread_alive) {
        pthread_mutex_unlock(&s->mu);
        store_free_chain(o);
        return -1;
    }
    /* A renewal of the same leases still waiting (the database slow or
     * away) takes the new expiry instead of another place in the queue:
     * they would pile up, one per renewal period, as long as it is away.
     * The ops queued ahead are the first ones (seq 0), a few at most. */
    for (op *q = s->qhead; o->kind == K_TASK_RENEW && q && q->seq == 0; q = q->next)
        if (q->kind == K_TASK_RENEW && q->nv == o->nv && q->v[0].s && o->v[0].s &&
            strcmp(q->v[0].s, o->v[0].s) == 0) {
            q->v[1].i = o->v[1].i;
            pthread_mutex_unlock(&s->mu);
            store_free_chain(o);
            return 0;
        }
    o->seq = 0;
    o->may_wait = false;
    s->q_nowait++;
    o->next = s->qhead;
    s->qhead = o;
    if (!s->qtail)
        s->qtail = o;
    s->stats.queue_depth++;
    s->stats.ops_enqueued++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void store_count_drop(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->stats.drops++;
    pthread_mutex_unlock(&s->mu);
}

/* Queue a write (droppable); *seq_out as enqueue_seq. Releases b. */
int store_enqueue_b(gps_store *s, opb *b, uint64_t *seq_out)
{
    op *o = store_b_pack(b);
    if (!o) {
        store_count_drop(s);
        return -1;
    }
    return enqueue_seq(s, o, true, seq_out);
}

/* Queue a write of statement kind, its values by bind spec (store_b_spec). */
int store_write_op(gps_store *s, int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    store_b_vspec(&b, kind, spec, ap);
    va_end(ap);
    return store_enqueue_b(s, &b, NULL);
}

/* Queue a write of a job row (store_write_op): coalesce as
 * gps_store_job_update.coalesce (store_fold_locked). */
int store_row_op(gps_store *s, bool coalesce, int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    store_b_vspec(&b, kind, spec, ap);
    va_end(ap);
    op *o = store_b_pack(&b);
    if (!o) {
        store_count_drop(s);
        return -1;
    }
    return store_enqueue_ex(s, o, true, NULL, coalesce ? 2 : 1);
}

/* A read op of statement kind, its values by bind spec (new, caller owns;
 * NULL on ENOMEM). The caller sets its callback and queues it (reads are
 * never dropped). */
op *store_read_op(int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    store_b_vspec(&b, kind, spec, ap);
    va_end(ap);
    return store_b_pack(&b);
}

/*
 * store_fold.c: what the queue keeps open while it waits, under the
 * store's lock: request-log row writes folded into the row's first queued
 * write (the pending table), usage adds folded by key, and row writes held
 * back after the queue for their row's end (held rows).
 */
#include "server/store/store_priv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Folding job-row writes                                                   */
/* ------------------------------------------------------------------------ */

/* A request-log row was three statements (insert at submit, update at
 * assignment, update at the end: ~20,000 instructions each on SQLite, a
 * fifth of the server's cost per request; issue 24). Writes run at the
 * group commit that follows them, so the updates of a row whose earlier
 * write still waits in the queue fold into that write: the row is written
 * once, whole, by the statement that was queued first, and ends as if
 * every write had run, at the commit it would have had. Only writes the
 * caller marks coalesce fold (no other op of the store concerns that row:
 * no native task events, checkpoints or handoffs to stay ordered with).
 * Guarded by mu: the DB thread takes an op out of the table as it takes
 * it off the queue. */
static size_t pend_slot(const char *id)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h & (PEND_BUCKETS - 1);
}

static op *pend_find(gps_store *s, const char *id)
{
    for (op *o = s->pend[pend_slot(id)]; o; o = o->pnext)
        if (strcmp(o->v[0].s, id) == 0)
            return o;
    return NULL;
}

void store_pend_add(gps_store *s, op *o)
{
    op **b = &s->pend[pend_slot(o->v[0].s)];
    o->pnext = *b;
    *b = o;
    o->pending = true;
}

void store_pend_del(gps_store *s, op *o)
{
    for (op **pp = &s->pend[pend_slot(o->v[0].s)]; *pp; pp = &(*pp)->pnext)
        if (*pp == o) {
            *pp = o->pnext;
            break;
        }
    o->pnext = NULL;
    o->pending = false;
}

/* Usage adds (K_USAGE_ADD: ?1 key, ?2 day, ?3..?6 counts added). A key's
 * adds are sums, so one queued for the same key and day while another
 * still waits in the queue adds its counts into it instead of queueing a
 * statement of its own: with API keys every request queued two (its
 * admission and its accounting), two of its three statements at 64
 * clients on one key (issue 24). Never across a read of key_usage
 * (store_usage_seal_locked): a server merging the other servers' counts keeps
 * what it added after queueing the read on top of what the read returns,
 * so an add folded into an op before the read would count twice. All
 * under mu; the DB thread takes an op out of the table as it takes it off
 * the queue. */
#define USAGE_CEILING 2305843009213693951LL /* INT64_MAX / 4, as the SQL's MIN */

static size_t usage_slot(const char *key_id)
{
    return pend_slot(key_id) & (USAGE_BUCKETS - 1);
}

/* Under mu: fold o (a usage add) into the one queued for its key and day;
 * true when it did (o is then the caller's to free). */
bool store_usage_fold_locked(gps_store *s, const op *o)
{
    for (op *q = s->usage[usage_slot(o->v[0].s)]; q; q = q->unext)
        if (q->v[1].i == o->v[1].i && strcmp(q->v[0].s, o->v[0].s) == 0) {
            for (int i = 2; i < 6; i++) {
                int64_t a = q->v[i].i, b = o->v[i].i;
                q->v[i].i = b > 0 && a > USAGE_CEILING - b ? USAGE_CEILING : a + b;
            }
            q->folds++;
            s->stats.ops_enqueued++;
            return true;
        }
    return false;
}

void store_usage_add_locked(gps_store *s, op *o)
{
    op **b = &s->usage[usage_slot(o->v[0].s)];
    o->unext = *b;
    *b = o;
    o->in_usage = true;
}

void store_usage_del_locked(gps_store *s, op *o)
{
    for (op **pp = &s->usage[usage_slot(o->v[0].s)]; *pp; pp = &(*pp)->unext)
        if (*pp == o) {
            *pp = o->unext;
            break;
        }
    o->unext = NULL;
    o->in_usage = false;
}

/* Under mu: a read of key_usage is being queued: nothing queued after it
 * folds into an add queued before it. */
void store_usage_seal_locked(gps_store *s)
{
    for (size_t i = 0; i < USAGE_BUCKETS; i++) {
        for (op *o = s->usage[i], *next; o; o = next) {
            next = o->unext;
            o->unext = NULL;
            o->in_usage = false;
        }
        s->usage[i] = NULL;
    }
}

/* Column of K_JOB_INSERT_ROW that K_JOB_UPDATE's value j (1..11) sets. */
static int row_col_of_update(int j) { return j == 1 ? 5 : 10 + j; }

/* The op that does what base (a job insert, K_JOB_INSERT_ROW or
 * K_JOB_UPDATE) and then update u (K_JOB_UPDATE of the same row) do: an
 * insert becomes K_JOB_INSERT_ROW with the update's columns, an update one
 * update (K_JOB_UPDATE sets what is not NULL: the later value wins). New,
 * NULL on ENOMEM. */
static op *fold_pack(const op *base, const op *u)
{
    bool ins = base->kind != K_JOB_UPDATE;
    opb b;
    memset(&b, 0, sizeof(b));
    b.kind = ins ? K_JOB_INSERT_ROW : K_JOB_UPDATE;
    b.nv = ins ? 22 : 12;
    for (int i = 0; i < base->nv && i < b.nv; i++)
        b.v[i] = base->v[i]; /* borrowed: store_b_pack copies */
    if (ins && b.v[13].t == V_NULL) {
        b.v[13].t = V_INT;   /* attempts: NOT NULL DEFAULT 0 */
        b.v[13].i = 0;
    }
    for (int j = 1; j < u->nv && j < 12; j++)
        if (u->v[j].t != V_NULL)
            b.v[ins ? row_col_of_update(j) : j] = u->v[j];
    return store_b_pack(&b);
}

static bool row_ended(const op *o);

/* Under mu, for a job-row write o (coalesce as the caller said): true
 * when o folded into the row's pending write (o is then the caller's to
 * free). Tried before the queue_max check: a fold takes no place in the
 * queue, and a row's end refused there would leave the row unfinished for
 * good while held writes fill the queue. *found gets the row's pending
 * write (or NULL) for store_fold_miss_locked, which runs under the same hold of
 * mu: one look-up a write. */
bool store_fold_locked(gps_store *s, op *o, bool coalesce, op **found)
{
    *found = NULL;
    if (!s->pend)
        return false;
    op *p = *found = pend_find(s, o->v[0].s);
    if (p && coalesce && o->kind == K_JOB_UPDATE) {
        op *m = fold_pack(p->fold ? p->fold : p, o);
        if (m) {
            free(p->fold);
            p->fold = m;
            p->folds++;
            s->stats.ops_enqueued++;
            if (p->held && row_ended(p)) {
                /* The row ended: its held write is due. A group waiting
                 * for its deadline runs it there; an idle DB thread is
                 * woken (low load: a wake a request costs nothing). */
                s->held_ready = true;
                if (s->db_idle)
                    pthread_cond_signal(&s->cv_work);
            }
            return true;
        }
    }
    return false;
}

/* Under mu, a job-row write o that did not fold is about to be queued
 * (p: its row's pending write, as store_fold_locked found it): returns whether
 * it enters the pending table once queued. */
bool store_fold_miss_locked(gps_store *s, op *o, bool coalesce, op *p)
{
    if (!s->pend)
        return false;
    if (p) {
        store_pend_del(s, p); /* o is queued after it: nothing later folds across o */
        if (p->held)
            s->held_drain = true; /* and p runs before o (group_fill) */
    }
    return coalesce && (o->kind == K_JOB_UPDATE || s->w.ok[K_JOB_INSERT_ROW]);
}

/* ------------------------------------------------------------------------ */
/* Held rows                                                                */
/* ------------------------------------------------------------------------ */

/* Has the row's end (finished_at) reached this write, itself or folded? */
static bool row_ended(const op *o)
{
    const op *w = o->fold ? o->fold : o;
    return (w->kind == K_JOB_INSERT_ROW && w->v[21].t != V_NULL) ||
           (w->kind == K_JOB_UPDATE && w->v[11].t != V_NULL);
}

/* Would o, taken off the queue now, be held (store_held_add_locked)? */
bool store_would_hold(const gps_store *s, const op *o)
{
    return s->row_hold_us && o->pending && !row_ended(o);
}

/* Under mu, o just taken off the queue: hold it back instead of running
 * it? A request-log row write open to folding whose row has not ended
 * waits up to row_hold_ms on the held list, still in the pending table, so
 * that the row's later writes fold into it (folding within one group
 * missed every request longer than the group: 1.87 statements a request
 * at 64 zero-delay streams, issue 24). */
bool store_held_add_locked(gps_store *s, op *o, uint64_t now)
{
    if (!store_would_hold(s, o))
        return false;
    o->held = true;
    o->hold_until_us = now + s->row_hold_us;
    o->hnext = NULL;
    if (s->htail)
        s->htail->hnext = o;
    else
        s->hhead = o;
    s->htail = o;
    s->stats.rows_held++;
    s->stats.rows_waiting++; /* still in queue_depth: the backlog counts it */
    return true;
}

/* Under mu: may o run while row writes are held? Not when it concerns
 * jobs (F_BESIDE), nor when a write of a held row could not fold
 * (held_drain): the held writes run first, so that o sees them. */
bool store_held_runs_first(const gps_store *s, const op *o)
{
    return s->hhead &&
           (s->held_drain || (!o->may_wait && !(store_stmts[o->kind].flags & F_BESIDE)));
}

/* Under mu: is a held write due to run (its row ended, its hold is over,
 * or a flush or the stop wants everything written)? */
bool store_held_due_locked(const gps_store *s, uint64_t now)
{
    return s->hhead && (s->held_ready || s->held_drain || s->flush_waiters || s->stop ||
                        now >= s->hhead->hold_until_us);
}

/* Under mu: take off the held list (and out of the pending table: nothing
 * folds into them any more) the writes due now, or all of them, at most
 * max (what is left of the group's batch_max); returns them chained by
 * next, in the order they were held. What the cap leaves stays due. */
op *store_held_take_locked(gps_store *s, uint64_t now, bool all, uint64_t max)
{
    all = all || s->held_drain || s->flush_waiters || s->stop;
    op *run = NULL, **tail = &run;
    op *keep = NULL, *keep_tail = NULL;
    uint64_t taken = 0;
    bool capped = false;
    for (op *o = s->hhead, *next; o; o = next) {
        next = o->hnext;
        o->hnext = NULL;
        bool due = all || row_ended(o) || now >= o->hold_until_us;
        if (due && taken >= max)
            capped = true;
        if (due && !capped) {
            o->held = false;
            if (o->pending)
                store_pend_del(s, o);
            o->next = NULL;
            *tail = o;
            tail = &o->next;
            taken++;
            s->stats.rows_waiting--;
            s->stats.queue_depth--;
        } else {
            if (keep_tail)
                keep_tail->hnext = o;
            else
                keep = o;
            keep_tail = o;
        }
    }
    s->hhead = keep;
    s->htail = keep_tail;
    if (!capped) {
        s->held_ready = false;
        s->held_drain = false;
    }
    return run;
}

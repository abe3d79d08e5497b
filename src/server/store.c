/*
 * store.c: SQLite persistence behind a DB thread (contract in store.h).
 *
 * Layout, low level to high level:
 *   - values and ops: every write is "bind these values to prepared
 *     statement K and step it", packed in one allocation by a builder on
 *     the caller's thread;
 *   - the queue and the DB thread (group commit);
 *   - read results handed back to the loop through an event;
 *   - opening: pragmas, migrations, statements;
 *   - the public async writers, readers and the synchronous loads.
 */
#include "server/store.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Embedded migrations                                                      */
/* ------------------------------------------------------------------------ */

struct migration {
    int version;
    const char *name;
    const char *sql;
};

#include "store_migrations.inc"

#define N_EMBEDDED (sizeof(embedded_migrations) / sizeof(embedded_migrations[0]))

int gps_store_schema_version(void)
{
    int v = 0;
    for (size_t i = 0; i < N_EMBEDDED; i++)
        if (embedded_migrations[i].version > v)
            v = embedded_migrations[i].version;
    return v;
}

/* ------------------------------------------------------------------------ */
/* Statements                                                               */
/* ------------------------------------------------------------------------ */

enum {
    K_AGENT_UPSERT = 0,
    K_AGENT_STATE,
    K_MODELS_CLEAR,
    K_MODEL_INSERT,
    K_AGENT_DELETE,
    K_JOB_INSERT,
    K_JOB_UPDATE,
    K_CHECKPOINT,
    K_PURGE,
    K_KEY_INSERT,
    K_KEY_REVOKE,
    K_KEY_USED,
    K_KEY_BIND,
    K_JOB_GET,
    K_PING,
    K_EVENTS_ADD,   /* optional: needs migration 0002 (job_events) */
    K_EVENTS_GET,   /* optional, idem */
    K_KEY_LIMITS,   /* optional: needs migration 0003 (key limits, usage) */
    K_KEY_USES,     /* optional, idem */
    K_USAGE_ADD,    /* optional, idem */
    K_JOB_LIST,     /* admin API: filtered request log (read) */
    K_COUNT
};

/* Statements a DB migrated by an older or custom migration set may lack:
 * their op then fails (logged) instead of the open failing. */
#define K_OPTIONAL(k)                                                               \
    ((k) == K_EVENTS_ADD || (k) == K_EVENTS_GET || (k) == K_KEY_LIMITS || \
     (k) == K_KEY_USES || (k) == K_USAGE_ADD)

#define JOB_COLUMNS                                                                          \
    "j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, j.attempts, " \
    "j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, j.total_ms, "              \
    "j.finish_reason, j.error_code, j.correlation_id, j.seed, j.created_at, j.finished_at, " \
    "j.request, c.text, c.last_seq "                                                         \
    "FROM jobs j LEFT JOIN job_checkpoints c ON c.job_id = j.id "

#define PURGE_CHUNK 1000

static const struct {
    const char *name;   /* for logs */
    const char *sql;
} stmts[K_COUNT] = {
    [K_AGENT_UPSERT] = {"agent_upsert",
        "INSERT INTO agents (id, name, version, platform, state, labels, facts, key_id, "
        "first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9) "
        "ON CONFLICT(id) DO UPDATE SET name = excluded.name, version = excluded.version, "
        "platform = excluded.platform, state = excluded.state, labels = excluded.labels, "
        "facts = excluded.facts, key_id = COALESCE(excluded.key_id, agents.key_id), "
        "last_seen = excluded.last_seen"},
    [K_AGENT_STATE] = {"agent_state",
        "UPDATE agents SET state = ?2, "
        "last_seen = CASE WHEN ?3 > 0 THEN ?3 ELSE last_seen END WHERE id = ?1"},
    [K_MODELS_CLEAR] = {"agent_models_clear", "DELETE FROM agent_models WHERE agent_id = ?1"},
    [K_MODEL_INSERT] = {"agent_model_insert",
        "INSERT OR REPLACE INTO agent_models (agent_id, model, aliases, quantization, "
        "context_length, vram_bytes, loaded) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
    [K_AGENT_DELETE] = {"agent_delete", "DELETE FROM agents WHERE id = ?1"},
    [K_JOB_INSERT] = {"job_insert",
        "INSERT INTO jobs (id, api, kind, model, key_id, status, priority, correlation_id, "
        "seed, created_at, request) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"},
    [K_JOB_UPDATE] = {"job_update",
        "UPDATE jobs SET status = COALESCE(?2, status), agent_id = COALESCE(?3, agent_id), "
        "attempts = COALESCE(?4, attempts), prompt_tokens = COALESCE(?5, prompt_tokens), "
        "completion_tokens = COALESCE(?6, completion_tokens), "
        "queue_ms = COALESCE(?7, queue_ms), ttft_ms = COALESCE(?8, ttft_ms), "
        "total_ms = COALESCE(?9, total_ms), finish_reason = COALESCE(?10, finish_reason), "
        "error_code = COALESCE(?11, error_code), finished_at = COALESCE(?12, finished_at) "
        "WHERE id = ?1"},
    [K_CHECKPOINT] = {"checkpoint",
        "INSERT INTO job_checkpoints (job_id, text, last_seq, updated_at) "
        "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(job_id) DO UPDATE SET text = excluded.text, "
        "last_seq = excluded.last_seq, updated_at = excluded.updated_at"},
    [K_PURGE] = {"purge_jobs",
        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE finished_at IS NOT NULL "
        "AND finished_at < ?1 LIMIT 1000)"},
    [K_KEY_INSERT] = {"key_insert",
        "INSERT INTO api_keys (id, hash, role, name, agent_id, created_at, expires_at, "
        "revoked_at, last_used_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"},
    [K_KEY_REVOKE] = {"key_revoke",
        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL"},
    [K_KEY_USED] = {"key_used", "UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1"},
    [K_KEY_BIND] = {"key_bind",
        "UPDATE api_keys SET agent_id = ?2 WHERE id = ?1 AND agent_id IS NULL"},
    [K_JOB_GET] = {"job_get", "SELECT " JOB_COLUMNS "WHERE j.id = ?1"},
    [K_PING] = {"ping", "SELECT count(*) FROM schema_migrations"},
    [K_EVENTS_ADD] = {"job_events_add",
        "INSERT OR REPLACE INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5)"},
    [K_EVENTS_GET] = {"job_events_get",
        "SELECT events FROM job_events WHERE job_id = ?1 ORDER BY first_seq"},
    [K_KEY_LIMITS] = {"key_limits",
        "UPDATE api_keys SET rpm = ?2, tokens_per_day = ?3, max_concurrent = ?4, "
        "max_uses = ?5 WHERE id = ?1"},
    [K_KEY_USES] = {"key_uses", "UPDATE api_keys SET uses = ?2 WHERE id = ?1"},
    [K_USAGE_ADD] = {"key_usage_add",
        "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, completion_tokens, "
        "rate_limited) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(key_id, day) DO UPDATE "
        /* Saturating (limits.c's ceiling, INT64_MAX/4): SQLite turns an
         * overflowing sum into a REAL; MIN makes it an integer again. */
        "SET requests = MIN(requests + excluded.requests, 2305843009213693951), "
        "prompt_tokens = MIN(prompt_tokens + excluded.prompt_tokens, 2305843009213693951), "
        "completion_tokens = MIN(completion_tokens + excluded.completion_tokens, "
        "2305843009213693951), "
        "rate_limited = MIN(rate_limited + excluded.rate_limited, 2305843009213693951)"},
    /* Same column layout as JOB_COLUMNS (job_info_from_row reads by
     * index) without the request and the checkpoint text: a list of up to
     * 1000 rows should not copy every prompt. NULL filters match all. */
    [K_JOB_LIST] = {"job_list",
        "SELECT j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, "
        "j.attempts, j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, "
        "j.total_ms, j.finish_reason, j.error_code, j.correlation_id, j.seed, "
        "j.created_at, j.finished_at, NULL, NULL, NULL FROM jobs j "
        "WHERE (?1 IS NULL OR j.status = ?1) AND (?2 IS NULL OR j.model = ?2) "
        "AND (?3 IS NULL OR j.agent_id = ?3) AND (?4 IS NULL OR j.key_id = ?4) "
        "AND (?5 IS NULL OR j.created_at < ?5) "
        "ORDER BY j.created_at DESC, j.id DESC LIMIT ?6"},
};

/* ------------------------------------------------------------------------ */
/* Values and ops                                                           */
/* ------------------------------------------------------------------------ */

enum { V_NULL = 0, V_INT, V_TEXT };

typedef struct val {
    int t;
    int64_t i;
    const char *s;   /* V_TEXT: len bytes + NUL, inside the owning allocation */
    size_t len;
} val;

/* A row copied out of a statement: n values, strings packed after them. */
typedef struct row {
    int n;
    val v[];
} row;

typedef struct op {
    struct op *next;
    uint64_t seq;
    int kind;                  /* K_* */
    /* reads */
    gps_store_job_fn job_cb;
    gps_store_ping_fn ping_cb;
    void *arg;
    int status;                /* job_get: 0 found, 1 none, -1 error; ping: 0 ok */
    row *result;               /* job_get: the row (owned) */
    json_t *events;            /* job_get: the stored event log (owned), or NULL */
    gps_store_jobs_fn jobs_cb; /* job_list */
    row **rows;                /* job_list: nrows rows (owned) */
    size_t nrows;
    char msg[160];             /* ping: failure text */
    int nv;
    val v[];
} op;

static void rows_free(op *o)
{
    for (size_t i = 0; i < o->nrows; i++)
        free(o->rows[i]);
    free(o->rows);
    o->rows = NULL;
    o->nrows = 0;
}

#define MAXV 16

/* Builder: values borrowed from the caller (or owned temporaries from
 * json_dumps), packed into one op by b_pack. */
typedef struct opb {
    int kind;
    int nv;
    val v[MAXV];
    char *owned[MAXV];
    int nowned;
    bool oom;
} opb;

static void b_init(opb *b, int kind)
{
    memset(b, 0, sizeof(*b));
    b->kind = kind;
}

static val *b_slot(opb *b)
{
    if (b->nv >= MAXV) {   /* programming error: MAXV too small for a statement */
        b->oom = true;
        return NULL;
    }
    val *v = &b->v[b->nv++];
    memset(v, 0, sizeof(*v));
    return v;
}

static void b_null(opb *b) { b_slot(b); }

static void b_int(opb *b, int64_t i)
{
    val *v = b_slot(b);
    if (v) {
        v->t = V_INT;
        v->i = i;
    }
}

/* Integer, or NULL when negative ("unchanged"/"unknown" in the API). */
static void b_int_nn(opb *b, int64_t i)
{
    if (i < 0)
        b_null(b);
    else
        b_int(b, i);
}

/* Integer, or NULL when zero ("never"). */
static void b_int_nz(opb *b, int64_t i)
{
    if (i == 0)
        b_null(b);
    else
        b_int(b, i);
}

static void b_textn(opb *b, const char *s, size_t len)
{
    val *v = b_slot(b);
    if (v && s) {
        v->t = V_TEXT;
        v->s = s;
        v->len = len;
    }
}

static void b_text(opb *b, const char *s) { b_textn(b, s, s ? strlen(s) : 0); }

static void b_json(opb *b, const json_t *j)
{
    if (!j) {
        b_null(b);
        return;
    }
    char *txt = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt) {
        b->oom = true;
        b_null(b);
        return;
    }
    b->owned[b->nowned++] = txt;
    b_text(b, txt);
}

static void b_release(opb *b)
{
    for (int i = 0; i < b->nowned; i++)
        free(b->owned[i]);
    b->nowned = 0;
}

/* Pack the builder into one allocation (new op, caller owns). NULL on
 * ENOMEM. Releases the builder's temporaries in both cases. */
static op *b_pack(opb *b)
{
    op *o = NULL;
    if (b->oom)
        goto done;
    size_t total = sizeof(op) + (size_t)b->nv * sizeof(val);
    for (int i = 0; i < b->nv; i++)
        if (b->v[i].t == V_TEXT)
            total += b->v[i].len + 1;
    o = calloc(1, total);
    if (!o)
        goto done;
    o->kind = b->kind;
    o->nv = b->nv;
    char *p = (char *)&o->v[b->nv];
    for (int i = 0; i < b->nv; i++) {
        o->v[i] = b->v[i];
        if (b->v[i].t == V_TEXT) {
            memcpy(p, b->v[i].s, b->v[i].len);
            p[b->v[i].len] = '\0';
            o->v[i].s = p;
            p += b->v[i].len + 1;
        }
    }
done:
    b_release(b);
    return o;
}

/* Copy the current row of st (new, caller frees). NULL on ENOMEM. */
static row *row_copy(sqlite3_stmt *st)
{
    int n = sqlite3_column_count(st);
    size_t total = sizeof(row) + (size_t)n * sizeof(val);
    for (int i = 0; i < n; i++) {
        int t = sqlite3_column_type(st, i);
        if (t == SQLITE_TEXT || t == SQLITE_BLOB)
            total += (size_t)sqlite3_column_bytes(st, i) + 1;
    }
    row *r = calloc(1, total);
    if (!r)
        return NULL;
    r->n = n;
    char *p = (char *)&r->v[n];
    for (int i = 0; i < n; i++) {
        int t = sqlite3_column_type(st, i);
        if (t == SQLITE_NULL) {
            r->v[i].t = V_NULL;
        } else if (t == SQLITE_INTEGER || t == SQLITE_FLOAT) {
            r->v[i].t = V_INT;
            r->v[i].i = sqlite3_column_int64(st, i);
        } else {
            const void *data = t == SQLITE_TEXT ? (const void *)sqlite3_column_text(st, i)
                                                : sqlite3_column_blob(st, i);
            size_t len = (size_t)sqlite3_column_bytes(st, i);
            if (len && data)
                memcpy(p, data, len);
            p[len] = '\0';
            r->v[i].t = V_TEXT;
            r->v[i].s = p;
            r->v[i].len = len;
            p += len + 1;
        }
    }
    return r;
}

static const char *rs(const row *r, int i) { return r->v[i].t == V_TEXT ? r->v[i].s : NULL; }
static int64_t ri(const row *r, int i, int64_t dflt)
{
    return r->v[i].t == V_INT ? r->v[i].i : dflt;
}

/* A count read back (tokens, attempts, ms): a row out of range (written
 * before the server bounded what agents report, or edited by hand) is
 * clamped into 0..max so that no reader's sum overflows; NULL stays dflt. */
static int64_t ri_count(const row *r, int i, int64_t dflt, int64_t max)
{
    if (r->v[i].t != V_INT)
        return dflt;
    return r->v[i].i < 0 ? dflt : r->v[i].i > max ? max : r->v[i].i;
}
#define STORE_MAX_COUNT (1LL << 40)

/* ------------------------------------------------------------------------ */
/* The store                                                                */
/* ------------------------------------------------------------------------ */

struct gps_store {
    char *path;
    sqlite3 *db;                 /* write connection: DB thread only (after open) */
    sqlite3 *sdb;                /* synchronous connection: owner thread, lazily opened */
    sqlite3_stmt *st[K_COUNT];   /* prepared on db */
    int busy_timeout_ms;
    int commit_interval_ms;
    int batch_max;
    size_t queue_max;

    struct event_base *base;
    struct event *ev_done;       /* activated by the DB thread: read results ready */
    struct event *ev_commit;     /* activated by the DB thread: job_events committed */

    pthread_t thread;
    bool thread_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;      /* DB thread waits for ops */
    pthread_cond_t cv_done;      /* flushers wait for commits */
    /* everything below is guarded by mu */
    op *qhead, *qtail;
    op *dhead, *dtail;           /* finished reads awaiting delivery on the loop */
    bool stop;
    bool thread_alive;
    int flush_waiters;
    uint64_t seq_enqueued;
    uint64_t seq_done;           /* every op with seq <= this is executed and committed */
    /* Durability notification (gps_store_set_commit_cb). */
    gps_store_commit_fn commit_fn;
    void *commit_arg;
    uint64_t events_done_seq;    /* last op of the last transaction with job_events */
    bool events_failed;          /* a failure since the last notification */
    bool last_commit_ok;
    char last_error[320];
    int64_t last_drop_log_ms;
    gps_store_stats stats;
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Bind op values to st (already reset). SQLITE_OK or an error code. */
static int bind_vals(sqlite3_stmt *st, const val *v, int nv)
{
    for (int i = 0; i < nv; i++) {
        int rc;
        if (v[i].t == V_INT)
            rc = sqlite3_bind_int64(st, i + 1, v[i].i);
        else if (v[i].t == V_TEXT)
            rc = sqlite3_bind_text(st, i + 1, v[i].s, (int)v[i].len, SQLITE_STATIC);
        else
            rc = sqlite3_bind_null(st, i + 1);
        if (rc != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK;
}

static int exec_simple(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        seterr(err, errlen, "%s", msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* DB thread                                                                */
/* ------------------------------------------------------------------------ */

static void enqueue_locked(gps_store *s, op *first, op *last, size_t count);

/* Run one op on the DB thread. Returns true when it was a write that
 * succeeded, false otherwise (reads return false; *failed tells a failed write). */
static json_t *events_collect(sqlite3_stmt *st, const char *job_id);

static bool run_op(gps_store *s, op *o, bool *failed)
{
    sqlite3_stmt *st = s->st[o->kind];
    *failed = false;
    if (!st) {
        /* An optional statement this DB's schema does not support. */
        *failed = true;
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s}", "op", stmts[o->kind].name),
                     "store op %s is not supported by this database's schema",
                     stmts[o->kind].name);
        return false;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    int rc = bind_vals(st, o->v, o->nv);
    if (o->kind == K_JOB_GET) {
        if (rc == SQLITE_OK)
            rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            o->result = row_copy(st);
            o->status = o->result ? 0 : -1;
        } else {
            o->status = rc == SQLITE_DONE ? 1 : -1;
        }
        sqlite3_reset(st);
        if (o->status == 0)
            o->events = events_collect(s->st[K_EVENTS_GET], o->v[0].s);
        return false;
    }
    if (o->kind == K_JOB_LIST) {
        o->status = 0;
        while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            row **grown = realloc(o->rows, (o->nrows + 1) * sizeof *grown);
            row *r = row_copy(st);
            if (grown)
                o->rows = grown;
            if (!grown || !r) {
                free(r);
                rc = SQLITE_NOMEM;
                break;
            }
            o->rows[o->nrows++] = r;
            rc = SQLITE_OK;
        }
        if (rc != SQLITE_DONE) {
            o->status = -1;
            rows_free(o);
        }
        sqlite3_reset(st);
        return false;
    }
    if (o->kind == K_PING) {
        if (rc == SQLITE_OK)
            rc = sqlite3_step(st);
        o->status = rc == SQLITE_ROW ? 0 : -1;
        if (o->status)
            snprintf(o->msg, sizeof(o->msg), "%s", sqlite3_errmsg(s->db));
        sqlite3_reset(st);
        return false;
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) {
        *failed = true;
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s, s:i}", "op", stmts[o->kind].name, "sqlite_code", rc),
                     "store write %s failed: %s", stmts[o->kind].name, sqlite3_errmsg(s->db));
        sqlite3_reset(st);
        return false;
    }
    if (o->kind == K_PURGE && sqlite3_changes(s->db) >= PURGE_CHUNK) {
        /* More to delete: go again after whatever queued meanwhile, so a
         * big purge never holds one long transaction. */
        opb b;
        b_init(&b, K_PURGE);
        b_int(&b, o->v[0].i);
        op *again = b_pack(&b);
        if (again) {
            pthread_mutex_lock(&s->mu);
            enqueue_locked(s, again, again, 1);
            pthread_mutex_unlock(&s->mu);
        }
    }
    sqlite3_reset(st);
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

static void *db_main(void *arg)
{
    gps_store *s = arg;
    char err[256];

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->qhead && !s->stop)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (!s->qhead && s->stop)
            break;
        pthread_mutex_unlock(&s->mu);

        /* One group transaction: BEGIN IMMEDIATE takes the write lock now
         * (waiting up to busy_timeout if a CLI holds it) so that statement
         * errors later are about the statement, not the lock. */
        err[0] = '\0';
        bool in_tx = exec_simple(s->db, "BEGIN IMMEDIATE", err, sizeof(err)) == SQLITE_OK;
        if (!in_tx)
            gp_log_write(GP_LOG_ERROR, "store_begin_failed", NULL, NULL,
                         "store: BEGIN failed (%s); writing without a transaction", err);
        uint64_t t_start = gp_now_mono_us();
        uint64_t deadline = t_start + (uint64_t)s->commit_interval_ms * 1000;
        uint64_t writes_ok = 0, writes_failed = 0, n = 0, last_seq = 0;
        bool has_read = false, has_events = false, events_failed = false;
        op *done_head = NULL, *done_tail = NULL;

        pthread_mutex_lock(&s->mu);
        for (;;) {
            if (!s->qhead) {
                /* Commit now when someone waits for it (flush, a read,
                 * native task events: their clients get them only once
                 * committed) or we are stopping; else keep the transaction
                 * open for more writes until the deadline. Ops queued
                 * while a COMMIT runs still share the next one. */
                if (s->flush_waiters || s->stop || has_read || has_events)
                    break;
                uint64_t now = gp_now_mono_us();
                if (now >= deadline)
                    break;
                struct timespec ts;
                timespec_in_us(&ts, deadline - now);
                pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
                continue;
            }
            op *o = s->qhead;
            s->qhead = o->next;
            if (!s->qhead)
                s->qtail = NULL;
            s->stats.queue_depth--;
            pthread_mutex_unlock(&s->mu);

            bool failed;
            bool ok = run_op(s, o, &failed);
            writes_ok += ok;
            writes_failed += failed;
            if (o->kind == K_EVENTS_ADD) {
                has_events = true;
                events_failed |= !ok;
            }
            n++;
            last_seq = o->seq;
            if (o->kind == K_JOB_GET || o->kind == K_PING || o->kind == K_JOB_LIST) {
                has_read = true;
                o->next = NULL;
                if (done_tail)
                    done_tail->next = o;
                else
                    done_head = o;
                done_tail = o;
            } else {
                free(o);
            }
            pthread_mutex_lock(&s->mu);
            if (n >= (uint64_t)s->batch_max || gp_now_mono_us() >= deadline)
                break;
        }
        pthread_mutex_unlock(&s->mu);

        bool commit_ok = true;
        uint64_t commit_us = 0;
        err[0] = '\0';
        if (in_tx) {
            uint64_t t0 = gp_now_mono_us();
            if (exec_simple(s->db, "COMMIT", err, sizeof(err)) != SQLITE_OK) {
                commit_ok = false;
                gp_log_write(GP_LOG_ERROR, "store_commit_failed", NULL,
                             json_pack("{s:I}", "ops", (json_int_t)n),
                             "store: COMMIT of %llu ops failed: %s", (unsigned long long)n, err);
                exec_simple(s->db, "ROLLBACK", NULL, 0);
            }
            commit_us = gp_now_mono_us() - t0;
        }

        pthread_mutex_lock(&s->mu);
        if (commit_ok) {
            s->stats.ops_committed += writes_ok;
            s->stats.ops_failed += writes_failed;
            s->stats.batches++;
            s->stats.last_batch_ops = n;
            s->stats.last_commit_us = commit_us;
            if (commit_us > s->stats.max_commit_us)
                s->stats.max_commit_us = commit_us;
            s->stats.last_commit_wall_ms = gp_now_wall_ms();
            s->last_commit_ok = true;
        } else {
            s->stats.ops_failed += writes_ok + writes_failed;
            s->stats.commit_failures++;
            s->last_commit_ok = false;
            snprintf(s->last_error, sizeof(s->last_error), "last commit failed: %s", err);
        }
        if (last_seq > s->seq_done)
            s->seq_done = last_seq;
        bool notify = false, notify_commit = false;
        if (has_events) {
            s->events_done_seq = last_seq;
            s->events_failed |= events_failed || !commit_ok;
            notify_commit = s->ev_commit != NULL;
        }
        if (done_head) {
            if (s->dtail)
                s->dtail->next = done_head;
            else
                s->dhead = done_head;
            s->dtail = done_tail;
            notify = s->ev_done != NULL;
        }
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
        /* event_active is thread-safe once the base is notifiable
         * (evthread_use_pthreads before event_base_new). */
        if (notify)
            event_active(s->ev_done, EV_READ, 0);
        if (notify_commit)
            event_active(s->ev_commit, EV_READ, 0);
        pthread_mutex_lock(&s->mu);
    }
    s->thread_alive = false;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Append a chain of count ops. Caller holds mu. */
static void enqueue_locked(gps_store *s, op *first, op *last, size_t count)
{
    for (op *o = first; o; o = o->next)
        o->seq = ++s->seq_enqueued;
    last->next = NULL;
    if (s->qtail)
        s->qtail->next = first;
    else
        s->qhead = first;
    s->qtail = last;
    s->stats.queue_depth += count;
    s->stats.ops_enqueued += count;
    pthread_cond_signal(&s->cv_work);
}

static void free_chain(op *o)
{
    while (o) {
        op *next = o->next;
        rows_free(o);
        free(o->result);
        free(o);
        o = next;
    }
}

/* Queue a chain of ops (linked by next). Writes (droppable) are refused
 * beyond queue_max. Takes ownership of the chain in every case. *seq_out
 * (may be NULL) gets the last op's seq: read under the lock, since the DB
 * thread may free the op as soon as it is queued. */
static int enqueue_seq(gps_store *s, op *first, bool droppable, uint64_t *seq_out)
{
    if (!first)
        return -1;
    size_t count = 1;
    op *last = first;
    while (last->next) {
        last = last->next;
        count++;
    }
    pthread_mutex_lock(&s->mu);
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
        free_chain(first);
        return -1;
    }
    enqueue_locked(s, first, last, count);
    if (seq_out)
        *seq_out = s->seq_enqueued;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int enqueue(gps_store *s, op *first, bool droppable)
{
    return enqueue_seq(s, first, droppable, NULL);
}

static int enqueue_b(gps_store *s, opb *b)
{
    op *o = b_pack(b);
    if (!o) {
        pthread_mutex_lock(&s->mu);
        s->stats.drops++;
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    return enqueue(s, o, true);
}

/* ------------------------------------------------------------------------ */
/* Read results, delivered on the loop thread                               */
/* ------------------------------------------------------------------------ */

static void job_info_from_row(const row *r, gps_store_job_info *ji, json_t **request)
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
    *request = NULL;
    if (r->v[20].t == V_TEXT)
        *request = json_loadb(r->v[20].s, r->v[20].len, JSON_DECODE_ANY, NULL);
    ji->request = *request;
    ji->checkpoint_text = r->v[21].t == V_TEXT ? r->v[21].s : NULL;
    ji->checkpoint_len = r->v[21].t == V_TEXT ? r->v[21].len : 0;
    ji->checkpoint_seq = ri(r, 22, -1);
}

/* The stored event log of job_id: one array of {seq, type, data}, the
 * batches concatenated in seq order (new reference), or NULL when there is
 * none (or st is NULL: no job_events table). A batch that does not parse
 * ends the log there: replay must never skip a seq. */
static json_t *events_collect(sqlite3_stmt *st, const char *job_id)
{
    if (!st || !job_id)
        return NULL;
    json_t *all = NULL;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (sqlite3_bind_text(st, 1, job_id, -1, SQLITE_TRANSIENT) != SQLITE_OK)
        return NULL;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *txt = (const char *)sqlite3_column_text(st, 0);
        int n = sqlite3_column_bytes(st, 0);
        json_t *batch = txt ? json_loadb(txt, (size_t)n, 0, NULL) : NULL;
        if (!json_is_array(batch)) {
            json_decref(batch);
            break;
        }
        if (!all)
            all = json_array();
        if (!all || json_array_extend(all, batch) < 0) {
            json_decref(batch);
            break;
        }
        json_decref(batch);
    }
    sqlite3_reset(st);
    return all;
}

static void deliver(op *o)
{
    if (o->kind == K_JOB_GET) {
        if (o->status == 0 && o->result) {
            gps_store_job_info ji;
            json_t *req;
            job_info_from_row(o->result, &ji, &req);
            ji.events = o->events;
            o->job_cb(o->arg, 0, &ji);
            json_decref(req);
        } else {
            o->job_cb(o->arg, o->status, NULL);
        }
    } else if (o->kind == K_PING) {
        o->ping_cb(o->arg, o->status == 0, o->status == 0 ? "ok" : o->msg);
    } else if (o->kind == K_JOB_LIST) {
        gps_store_job_info *jobs = o->nrows ? calloc(o->nrows, sizeof *jobs) : NULL;
        if (o->nrows && !jobs) {
            o->jobs_cb(o->arg, -1, NULL, 0);
            return;
        }
        for (size_t i = 0; i < o->nrows; i++) {
            json_t *req;
            job_info_from_row(o->rows[i], &jobs[i], &req); /* request is NULL here */
        }
        o->jobs_cb(o->arg, o->status, o->status == 0 ? jobs : NULL,
                   o->status == 0 ? o->nrows : 0);
        free(jobs);
    }
}

static void deliver_all(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    op *list = s->dhead;
    s->dhead = s->dtail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        op *next = list->next;
        deliver(list);
        json_decref(list->events);
        rows_free(list);
        free(list->result);
        free(list);
        list = next;
    }
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    deliver_all(arg);
}

/* job_events committed (or failed): tell the listener, on the loop. */
static void on_commit(evutil_socket_t fd, short what, void *arg)
{
    gps_store *s = arg;
    pthread_mutex_lock(&s->mu);
    gps_store_commit_fn fn = s->commit_fn;
    void *farg = s->commit_arg;
    uint64_t done = s->events_done_seq;
    bool failed = s->events_failed;
    s->events_failed = false;
    pthread_mutex_unlock(&s->mu);
    if (fn)
        fn(farg, done, failed);
}

bool gps_store_has_job_events(gps_store *s)
{
    return s && s->st[K_EVENTS_ADD] != NULL;
}

void gps_store_set_commit_cb(gps_store *s, gps_store_commit_fn fn, void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->commit_fn = fn;
    s->commit_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* Opening and migrations                                                   */
/* ------------------------------------------------------------------------ */

/* Pragmas shared by both connections. */
static int conn_setup(sqlite3 *db, int busy_ms, const char *path, char *err, size_t errlen)
{
    char msg[256] = "";
    sqlite3_busy_timeout(db, busy_ms);
    sqlite3_extended_result_codes(db, 1);
    /* The first statement reads the header: a file that is not SQLite
     * fails here with SQLITE_NOTADB. */
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        int prim = rc & 0xff;
        if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT)
            seterr(err, errlen, "%s: not a SQLite database or corrupted (%s)", path,
                   sqlite3_errmsg(db));
        else
            seterr(err, errlen, "%s: cannot open database: %s", path, sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    const char *mode = (const char *)sqlite3_column_text(st, 0);
    bool wal = mode && strcmp(mode, "wal") == 0;
    sqlite3_finalize(st);
    if (!wal) {
        seterr(err, errlen, "%s: cannot switch the database to WAL mode", path);
        return -1;
    }
    if (exec_simple(db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", msg,
                    sizeof(msg)) != SQLITE_OK) {
        seterr(err, errlen, "%s: %s", path, msg);
        return -1;
    }
    return 0;
}

static sqlite3 *conn_open(const char *path, int busy_ms, char *err, size_t errlen)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        seterr(err, errlen, "%s: cannot open database: %s", path,
               db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }
    if (conn_setup(db, busy_ms, path, err, errlen) != 0) {
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

typedef struct mig_set {
    struct migration *m;
    char **owned;          /* strings read from a directory */
    size_t n, nowned;
} mig_set;

static void mig_set_free(mig_set *ms)
{
    for (size_t i = 0; i < ms->nowned; i++)
        free(ms->owned[i]);
    free(ms->owned);
    free(ms->m);
    memset(ms, 0, sizeof(*ms));
}

static int mig_cmp(const void *a, const void *b)
{
    const struct migration *x = a, *y = b;
    return (x->version > y->version) - (x->version < y->version);
}

/* Parse "NNNN_name.sql": version or -1. name_out gets "name". */
static int mig_name_parse(const char *fn, char *name_out, size_t name_len)
{
    size_t len = strlen(fn);
    if (len < 10 || strcmp(fn + len - 4, ".sql") != 0 || fn[4] != '_')
        return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        if (fn[i] < '0' || fn[i] > '9')
            return -1;
        v = v * 10 + (fn[i] - '0');
    }
    size_t nl = len - 9;
    if (nl == 0 || nl >= name_len)
        return -1;
    for (size_t i = 0; i < nl; i++) {
        char c = fn[5 + i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return -1;
    }
    memcpy(name_out, fn + 5, nl);
    name_out[nl] = '\0';
    return v;
}

static int mig_own(mig_set *ms, char *str)
{
    char **p = realloc(ms->owned, (ms->nowned + 1) * sizeof(*p));
    if (!p) {
        free(str);
        return -1;
    }
    ms->owned = p;
    ms->owned[ms->nowned++] = str;
    return 0;
}

static int mig_load(mig_set *ms, const char *dir, char *err, size_t errlen)
{
    memset(ms, 0, sizeof(*ms));
    if (!dir) {
        ms->m = calloc(N_EMBEDDED, sizeof(*ms->m));
        if (!ms->m)
            goto oom;
        memcpy(ms->m, embedded_migrations, sizeof(embedded_migrations));
        ms->n = N_EMBEDDED;
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d) {
        seterr(err, errlen, "migrations directory %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        char name[128];
        if (de->d_name[0] == '.' || strlen(de->d_name) < 4 ||
            strcmp(de->d_name + strlen(de->d_name) - 4, ".sql") != 0)
            continue;
        int v = mig_name_parse(de->d_name, name, sizeof(name));
        if (v <= 0) {
            seterr(err, errlen, "migrations directory %s: %s is not named NNNN_name.sql", dir,
                   de->d_name);
            closedir(d);
            goto fail;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        size_t len;
        char *sql = gp_read_file(path, &len, 16 << 20);
        if (!sql) {
            seterr(err, errlen, "%s: %s", path, strerror(errno));
            closedir(d);
            goto fail;
        }
        char *nm = strdup(name);
        struct migration *nm_arr = realloc(ms->m, (ms->n + 1) * sizeof(*ms->m));
        if (mig_own(ms, sql) != 0 || !nm || mig_own(ms, nm) != 0 || !nm_arr) {
            if (nm_arr)
                ms->m = nm_arr;
            closedir(d);
            goto oom;
        }
        ms->m = nm_arr;
        ms->m[ms->n++] = (struct migration){v, nm, sql};
    }
    closedir(d);
    if (ms->n == 0) {
        seterr(err, errlen, "migrations directory %s holds no NNNN_name.sql file", dir);
        goto fail;
    }
    qsort(ms->m, ms->n, sizeof(*ms->m), mig_cmp);
    for (size_t i = 1; i < ms->n; i++)
        if (ms->m[i].version == ms->m[i - 1].version) {
            seterr(err, errlen, "migrations directory %s: version %04d appears twice", dir,
                   ms->m[i].version);
            goto fail;
        }
    return 0;
oom:
    seterr(err, errlen, "out of memory loading migrations");
fail:
    mig_set_free(ms);
    return -1;
}

/* Current schema version inside the open transaction (0 = fresh), -1 on error. */
static int schema_current(sqlite3 *db, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(db, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", -1,
                           &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    else
        seterr(err, errlen, "reading schema_migrations: %s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return v;
}

/* Apply pending migrations, one transaction each. Re-reads the version
 * inside each transaction so two processes opening the same fresh DB (the
 * server and a `keys create`) do not both apply one. */
static int migrate(sqlite3 *db, const char *path, const mig_set *ms, char *err, size_t errlen)
{
    char msg[512] = "";
    if (exec_simple(db,
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                    "applied_at INTEGER NOT NULL)",
                    msg, sizeof(msg)) != SQLITE_OK) {
        seterr(err, errlen, "%s: creating schema_migrations: %s", path, msg);
        return -1;
    }
    int known = ms->n ? ms->m[ms->n - 1].version : 0;
    for (;;) {
        if (exec_simple(db, "BEGIN IMMEDIATE", msg, sizeof(msg)) != SQLITE_OK) {
            seterr(err, errlen, "%s: %s", path, msg);
            return -1;
        }
        int cur = schema_current(db, msg, sizeof(msg));
        if (cur < 0) {
            seterr(err, errlen, "%s: %s", path, msg);
            goto rollback;
        }
        if (cur > known) {
            seterr(err, errlen,
                   "%s: database schema version %d is newer than this binary knows (%d); "
                   "refusing to open it (use a newer gpupool-server)",
                   path, cur, known);
            goto rollback;
        }
        const struct migration *next = NULL;
        for (size_t i = 0; i < ms->n && !next; i++)
            if (ms->m[i].version > cur)
                next = &ms->m[i];
        if (!next) {
            exec_simple(db, "COMMIT", NULL, 0);
            return 0;
        }
        if (exec_simple(db, next->sql, msg, sizeof(msg)) != SQLITE_OK) {
            seterr(err, errlen, "%s: migration %04d_%s failed: %s", path, next->version,
                   next->name, msg);
            goto rollback;
        }
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db,
                                    "INSERT INTO schema_migrations (version, name, applied_at) "
                                    "VALUES (?1, ?2, ?3)",
                                    -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_int(st, 1, next->version);
            sqlite3_bind_text(st, 2, next->name, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, gp_now_wall_ms());
            rc = sqlite3_step(st);
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE) {
            seterr(err, errlen, "%s: recording migration %04d: %s", path, next->version,
                   sqlite3_errmsg(db));
            goto rollback;
        }
        if (exec_simple(db, "COMMIT", msg, sizeof(msg)) != SQLITE_OK) {
            seterr(err, errlen, "%s: committing migration %04d: %s", path, next->version, msg);
            goto rollback;
        }
        gp_log_write(GP_LOG_INFO, "store_migration_applied", NULL,
                     json_pack("{s:i, s:s}", "version", next->version, "name", next->name),
                     "applied migration %04d_%s", next->version, next->name);
    }
rollback:
    exec_simple(db, "ROLLBACK", NULL, 0);
    return -1;
}

gps_store *gps_store_open(const char *path, struct event_base *base, const gps_store_opts *opts,
                          char *err, size_t errlen)
{
    gps_store *s = NULL;
    mig_set ms = {0};
    bool mu_ok = false;

    if (!path || !*path) {
        seterr(err, errlen, "no database path given");
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (!s || !(s->path = strdup(path))) {
        seterr(err, errlen, "out of memory");
        goto fail;
    }
    s->commit_interval_ms = opts && opts->commit_interval_ms > 0 ? opts->commit_interval_ms : 5;
    s->batch_max = opts && opts->batch_max > 0 ? opts->batch_max : 64;
    s->queue_max = opts && opts->queue_max > 0 ? opts->queue_max : 100000;
    s->busy_timeout_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms : 5000;
    s->base = base;
    s->last_commit_ok = true;

    if (mig_load(&ms, opts ? opts->migrations_dir : NULL, err, errlen) != 0)
        goto fail;
    s->db = conn_open(path, s->busy_timeout_ms, err, errlen);
    if (!s->db)
        goto fail;
    if (migrate(s->db, path, &ms, err, errlen) != 0)
        goto fail;
    for (int k = 0; k < K_COUNT; k++) {
        if (sqlite3_prepare_v3(s->db, stmts[k].sql, -1, SQLITE_PREPARE_PERSISTENT, &s->st[k],
                               NULL) != SQLITE_OK) {
            if (K_OPTIONAL(k)) {
                s->st[k] = NULL;
                continue;
            }
            seterr(err, errlen, "%s: preparing %s: %s (schema out of step with the binary?)",
                   path, stmts[k].name, sqlite3_errmsg(s->db));
            goto fail;
        }
    }

    if (base) {
        s->ev_done = event_new(base, -1, 0, on_done, s);
        s->ev_commit = event_new(base, -1, 0, on_commit, s);
        if (!s->ev_done || !s->ev_commit) {
            seterr(err, errlen, "event_new failed");
            goto fail;
        }
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, &ca);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_condattr_destroy(&ca);
    mu_ok = true;
    s->thread_alive = true;
    if (pthread_create(&s->thread, NULL, db_main, s) != 0) {
        s->thread_alive = false;
        seterr(err, errlen, "cannot start the DB thread: %s", strerror(errno));
        goto fail;
    }
    s->thread_started = true;
    mig_set_free(&ms);
    return s;

fail:
    mig_set_free(&ms);
    if (s) {
        if (s->ev_done)
            event_free(s->ev_done);
        if (s->ev_commit)
            event_free(s->ev_commit);
        for (int k = 0; k < K_COUNT; k++)
            sqlite3_finalize(s->st[k]);
        sqlite3_close(s->db);
        if (mu_ok) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv_work);
            pthread_cond_destroy(&s->cv_done);
        }
        free(s->path);
        free(s);
    }
    return NULL;
}

void gps_store_close(gps_store *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* Reads finished after the loop stopped: deliver them here so their
     * args are not leaked. */
    deliver_all(s);
    if (s->ev_done)
        event_free(s->ev_done);
    if (s->ev_commit)
        event_free(s->ev_commit);
    for (int k = 0; k < K_COUNT; k++)
        sqlite3_finalize(s->st[k]);
    sqlite3_close(s->db);
    sqlite3_close(s->sdb);
    free_chain(s->qhead);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s->path);
    free(s);
}

int gps_store_flush(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->seq_enqueued;
    s->flush_waiters++;
    pthread_cond_signal(&s->cv_work);
    while (s->seq_done < target && s->thread_alive)
        pthread_cond_wait(&s->cv_done, &s->mu);
    s->flush_waiters--;
    int rc = s->seq_done >= target && s->last_commit_ok ? 0 : -1;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void gps_store_get_stats(gps_store *s, gps_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

bool gps_store_healthy(gps_store *s, char *msg, size_t msglen)
{
    pthread_mutex_lock(&s->mu);
    bool ok = s->thread_alive && s->last_commit_ok;
    if (!ok)
        seterr(msg, msglen, "%s", !s->thread_alive ? "DB thread not running" : s->last_error);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Async writes                                                             */
/* ------------------------------------------------------------------------ */

int gps_store_agent_upsert(gps_store *s, gps_store_agent_row r)
{
    if (!r.id || !r.state)
        return -1;
    opb b;
    b_init(&b, K_AGENT_UPSERT);
    b_text(&b, r.id);
    b_text(&b, r.name);
    b_text(&b, r.version);
    b_text(&b, r.platform);
    b_text(&b, r.state);
    if (r.labels)
        b_json(&b, r.labels);
    else
        b_text(&b, "{}");
    b_json(&b, r.facts);
    b_text(&b, r.key_id);
    b_int(&b, r.last_seen);
    return enqueue_b(s, &b);
}

int gps_store_agent_state(gps_store *s, const char *agent_id, const char *state,
                          int64_t last_seen)
{
    if (!agent_id || !state)
        return -1;
    opb b;
    b_init(&b, K_AGENT_STATE);
    b_text(&b, agent_id);
    b_text(&b, state);
    b_int(&b, last_seen);
    return enqueue_b(s, &b);
}

int gps_store_agent_models(gps_store *s, const char *agent_id, const gps_store_model_row *models,
                           size_t n)
{
    if (!agent_id || (n && !models))
        return -1;
    opb b;
    b_init(&b, K_MODELS_CLEAR);
    b_text(&b, agent_id);
    op *head = b_pack(&b), *tail = head;
    if (!head)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        const gps_store_model_row *m = &models[i];
        if (!m->model)
            continue;
        json_t *al = json_array();
        for (size_t k = 0; al && k < m->n_aliases; k++)
            if (m->aliases[k])
                json_array_append_new(al, json_string(m->aliases[k]));
        b_init(&b, K_MODEL_INSERT);
        b_text(&b, agent_id);
        b_text(&b, m->model);
        if (al)
            b_json(&b, al);
        else
            b.oom = true;
        json_decref(al);
        b_text(&b, m->quantization);
        b_int_nz(&b, m->context_length);
        b_int_nz(&b, m->vram_bytes);
        b_int(&b, m->loaded ? 1 : 0);
        op *o = b_pack(&b);
        if (!o)
            goto oom;
        tail->next = o;
        tail = o;
    }
    /* One chain: the delete and the inserts land in the same transaction
     * unless the batch boundary falls between them (then the next commit
     * follows within milliseconds). */
    return enqueue(s, head, true);
oom:
    free_chain(head);
    pthread_mutex_lock(&s->mu);
    s->stats.drops++;
    pthread_mutex_unlock(&s->mu);
    return -1;
}

int gps_store_agent_delete(gps_store *s, const char *agent_id)
{
    if (!agent_id)
        return -1;
    opb b;
    b_init(&b, K_AGENT_DELETE);
    b_text(&b, agent_id);
    return enqueue_b(s, &b);
}

int gps_store_job_insert(gps_store *s, gps_store_job_row r)
{
    if (!r.id || !r.api || !r.model || !r.status)
        return -1;
    opb b;
    b_init(&b, K_JOB_INSERT);
    b_text(&b, r.id);
    b_text(&b, r.api);
    b_text(&b, r.kind);
    b_text(&b, r.model);
    b_text(&b, r.key_id);
    b_text(&b, r.status);
    b_int(&b, r.priority);
    b_text(&b, r.correlation_id);
    if (r.has_seed)
        b_int(&b, r.seed);
    else
        b_null(&b);
    b_int(&b, r.created_at);
    b_json(&b, r.request);
    return enqueue_b(s, &b);
}

int gps_store_job_update_async(gps_store *s, gps_store_job_update u)
{
    if (!u.id)
        return -1;
    opb b;
    b_init(&b, K_JOB_UPDATE);
    b_text(&b, u.id);
    b_text(&b, u.status);
    b_text(&b, u.agent_id);
    b_int_nn(&b, u.attempts);
    b_int_nn(&b, u.prompt_tokens);
    b_int_nn(&b, u.completion_tokens);
    b_int_nn(&b, u.queue_ms);
    b_int_nn(&b, u.ttft_ms);
    b_int_nn(&b, u.total_ms);
    b_text(&b, u.finish_reason);
    b_text(&b, u.error_code);
    if (u.finished_at > 0)
        b_int(&b, u.finished_at);
    else
        b_null(&b);
    return enqueue_b(s, &b);
}

int gps_store_checkpoint(gps_store *s, const char *job_id, const char *text, size_t len,
                         long long last_seq)
{
    if (!job_id || (len && !text))
        return -1;
    opb b;
    b_init(&b, K_CHECKPOINT);
    b_text(&b, job_id);
    b_textn(&b, text ? text : "", len);
    b_int(&b, last_seq);
    b_int(&b, gp_now_wall_ms());
    return enqueue_b(s, &b);
}

int gps_store_job_events(gps_store *s, const char *job_id, const json_t *events)
{
    return gps_store_job_events_seq(s, job_id, events, NULL);
}

int gps_store_job_events_seq(gps_store *s, const char *job_id, const json_t *events,
                             uint64_t *op_seq)
{
    size_t n = json_array_size(events);
    if (!job_id || n == 0)
        return -1;
    opb b;
    b_init(&b, K_EVENTS_ADD);
    b_text(&b, job_id);
    b_int(&b, json_integer_value(json_object_get(json_array_get(events, 0), "seq")));
    b_int(&b, json_integer_value(json_object_get(json_array_get(events, n - 1), "seq")));
    b_json(&b, events);
    b_int(&b, gp_now_wall_ms());
    op *o = b_pack(&b);
    if (!o) {
        pthread_mutex_lock(&s->mu);
        s->stats.drops++;
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    return enqueue_seq(s, o, true, op_seq);
}

int gps_store_purge_jobs(gps_store *s, int64_t before_wall_ms)
{
    opb b;
    b_init(&b, K_PURGE);
    b_int(&b, before_wall_ms);
    return enqueue_b(s, &b);
}

static void b_key_row(opb *b, const gps_store_key_row *r)
{
    b_init(b, K_KEY_INSERT);
    b_text(b, r->id);
    b_text(b, r->hash);
    b_text(b, r->role);
    b_text(b, r->name ? r->name : "");
    b_text(b, r->agent_id);
    b_int(b, r->created_at);
    b_int_nz(b, r->expires_at);
    b_int_nz(b, r->revoked_at);
    b_int_nz(b, r->last_used_at);
}

/* Run one op's statement synchronously (CLI paths); releases b. */
static sqlite3_stmt *sync_prepare(gps_store *s, const char *sql, char *err, size_t errlen);
static sqlite3 *sync_db(gps_store *s, char *err, size_t errlen);

static int sync_run(gps_store *s, opb *b, const char *what, char *err, size_t errlen)
{
    sqlite3_stmt *st = sync_prepare(s, stmts[b->kind].sql, err, errlen);
    if (!st) {
        b_release(b);
        return -1;
    }
    int rc = bind_vals(st, b->v, b->nv);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    b_release(b);
    int ret = 0;
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: %s: %s", s->path, what, sqlite3_errmsg(s->sdb));
        ret = -1;
    }
    sqlite3_finalize(st);
    return ret;
}

static bool key_row_has_extras(const gps_store_key_row *r)
{
    return r->rpm || r->tokens_per_day || r->max_concurrent || r->max_uses;
}

static void b_key_limits(opb *b, const char *key_id, int64_t rpm, int64_t tokens_per_day,
                         int64_t max_concurrent, int64_t max_uses)
{
    b_init(b, K_KEY_LIMITS);
    b_text(b, key_id);
    b_int(b, rpm);
    b_int(b, tokens_per_day);
    b_int(b, max_concurrent);
    b_int(b, max_uses);
}

int gps_store_key_insert(gps_store *s, gps_store_key_row r)
{
    if (!r.id || !r.hash || !r.role)
        return -1;
    opb b;
    b_key_row(&b, &r);
    if (enqueue_b(s, &b) != 0)
        return -1;
    /* Limits are a second statement (migration 0003) so that the insert
     * itself works on any schema; both land in the same FIFO, in order. */
    if (!key_row_has_extras(&r))
        return 0;
    b_key_limits(&b, r.id, r.rpm, r.tokens_per_day, r.max_concurrent, r.max_uses);
    return enqueue_b(s, &b);
}

int gps_store_key_limits(gps_store *s, const char *key_id, int64_t rpm, int64_t tokens_per_day,
                         int64_t max_concurrent, int64_t max_uses)
{
    if (!key_id)
        return -1;
    opb b;
    b_key_limits(&b, key_id, rpm, tokens_per_day, max_concurrent, max_uses);
    return enqueue_b(s, &b);
}

int gps_store_key_uses(gps_store *s, const char *key_id, int64_t uses)
{
    if (!key_id)
        return -1;
    opb b;
    b_init(&b, K_KEY_USES);
    b_text(&b, key_id);
    b_int(&b, uses);
    return enqueue_b(s, &b);
}

int gps_store_usage_add(gps_store *s, const char *key_id, int64_t day, int64_t requests,
                        int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    if (!key_id || !*key_id)
        return -1;
    opb b;
    b_init(&b, K_USAGE_ADD);
    b_text(&b, key_id);
    b_int(&b, day);
    b_int(&b, requests);
    b_int(&b, prompt_tokens);
    b_int(&b, completion_tokens);
    b_int(&b, rate_limited);
    return enqueue_b(s, &b);
}

int gps_store_key_revoke(gps_store *s, const char *key_id, int64_t revoked_at)
{
    if (!key_id)
        return -1;
    opb b;
    b_init(&b, K_KEY_REVOKE);
    b_text(&b, key_id);
    b_int(&b, revoked_at);
    return enqueue_b(s, &b);
}

int gps_store_key_used(gps_store *s, const char *key_id, int64_t used_at)
{
    if (!key_id)
        return -1;
    opb b;
    b_init(&b, K_KEY_USED);
    b_text(&b, key_id);
    b_int(&b, used_at);
    return enqueue_b(s, &b);
}

int gps_store_key_bind_agent(gps_store *s, const char *key_id, const char *agent_id)
{
    if (!key_id || !agent_id)
        return -1;
    opb b;
    b_init(&b, K_KEY_BIND);
    b_text(&b, key_id);
    b_text(&b, agent_id);
    return enqueue_b(s, &b);
}

/* ------------------------------------------------------------------------ */
/* Async reads                                                              */
/* ------------------------------------------------------------------------ */

int gps_store_job_get_async(gps_store *s, const char *id, gps_store_job_fn cb, void *arg)
{
    if (!s->ev_done || !id || !cb)
        return -1;
    opb b;
    b_init(&b, K_JOB_GET);
    b_text(&b, id);
    op *o = b_pack(&b);
    if (!o)
        return -1;
    o->job_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

int gps_store_ping_async(gps_store *s, gps_store_ping_fn cb, void *arg)
{
    if (!s->ev_done || !cb)
        return -1;
    opb b;
    b_init(&b, K_PING);
    op *o = b_pack(&b);
    if (!o)
        return -1;
    o->ping_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

/* ------------------------------------------------------------------------ */
/* Synchronous connection: start-up loads and CLI writes                    */
/* ------------------------------------------------------------------------ */

static sqlite3 *sync_db(gps_store *s, char *err, size_t errlen)
{
    if (!s->sdb)
        s->sdb = conn_open(s->path, s->busy_timeout_ms, err, errlen);
    return s->sdb;
}

/* Prepare sql on the sync connection. NULL with err on failure. */
static sqlite3_stmt *sync_prepare(gps_store *s, const char *sql, char *err, size_t errlen)
{
    sqlite3 *db = sync_db(s, err, errlen);
    if (!db)
        return NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        seterr(err, errlen, "%s: %s", s->path, sqlite3_errmsg(db));
        return NULL;
    }
    return st;
}

/* The models of one agent, as rows pointing into copies kept here. */
typedef struct models_tmp {
    gps_store_model_row *m;
    row **rows;              /* the copied result rows (strings) */
    json_t *keep;            /* parsed alias arrays (alias strings) */
    const char ***aliases;   /* per model, array of alias pointers */
    size_t n;
} models_tmp;

static void models_tmp_free(models_tmp *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->rows[i]);
        free(t->aliases[i]);
    }
    free(t->rows);
    free(t->aliases);
    free(t->m);
    json_decref(t->keep);
    memset(t, 0, sizeof(*t));
}

static int load_models(gps_store *s, sqlite3_stmt *st, const char *agent_id, models_tmp *t,
                       char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    t->keep = json_array();
    if (!t->keep)
        goto oom;
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_TRANSIENT);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        size_t k = t->n;
        gps_store_model_row *m = realloc(t->m, (k + 1) * sizeof(*m));
        if (m)
            t->m = m;
        row **rows = realloc(t->rows, (k + 1) * sizeof(*rows));
        if (rows)
            t->rows = rows;
        const char ***al = realloc(t->aliases, (k + 1) * sizeof(*al));
        if (al)
            t->aliases = al;
        if (!m || !rows || !al)
            goto oom;
        row *r = row_copy(st);
        if (!r)
            goto oom;
        t->rows[k] = r;
        t->aliases[k] = NULL;
        t->n++;
        json_t *aj = rs(r, 1) ? json_loads(rs(r, 1), 0, NULL) : NULL;
        size_t na = 0;
        if (json_is_array(aj) && json_array_size(aj)) {
            t->aliases[k] = calloc(json_array_size(aj), sizeof(char *));
            if (!t->aliases[k]) {
                json_decref(aj);
                goto oom;
            }
            for (size_t i = 0; i < json_array_size(aj); i++)
                if (json_is_string(json_array_get(aj, i)))
                    t->aliases[k][na++] = json_string_value(json_array_get(aj, i));
        }
        if (aj)
            json_array_append_new(t->keep, aj);   /* keeps the alias strings alive */
        t->m[k] = (gps_store_model_row){
            .model = rs(r, 0) ? rs(r, 0) : "",
            .aliases = t->aliases[k],
            .n_aliases = na,
            .quantization = rs(r, 2),
            .context_length = ri(r, 3, 0),
            .vram_bytes = ri(r, 4, 0),
            .loaded = ri(r, 5, 0) != 0,
        };
    }
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: reading agent_models: %s", s->path, sqlite3_errmsg(s->sdb));
        return -1;
    }
    return 0;
oom:
    seterr(err, errlen, "out of memory");
    return -1;
}

int gps_store_load_agents(gps_store *s, gps_store_agent_fn cb, void *arg, char *err,
                          size_t errlen)
{
    int ret = -1;
    sqlite3_stmt *st = sync_prepare(s,
                                    "SELECT id, name, version, platform, state, key_id, labels, "
                                    "facts, first_seen, last_seen FROM agents ORDER BY id",
                                    err, errlen);
    sqlite3_stmt *mst = st ? sync_prepare(s,
                                          "SELECT model, aliases, quantization, context_length, "
                                          "vram_bytes, loaded FROM agent_models "
                                          "WHERE agent_id = ?1 ORDER BY model",
                                          err, errlen)
                           : NULL;
    if (!mst)
        goto done;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        row *r = row_copy(st);
        if (!r) {
            seterr(err, errlen, "out of memory");
            goto done;
        }
        gps_store_agent_info a = {0};
        a.id = rs(r, 0);
        a.name = rs(r, 1);
        a.version = rs(r, 2);
        a.platform = rs(r, 3);
        a.state = rs(r, 4);
        a.key_id = rs(r, 5);
        a.labels = rs(r, 6) ? json_loads(rs(r, 6), 0, NULL) : NULL;
        if (!json_is_object(a.labels)) {
            json_decref(a.labels);
            a.labels = json_object();
        }
        a.facts = rs(r, 7) ? json_loads(rs(r, 7), JSON_DECODE_ANY, NULL) : NULL;
        a.first_seen = ri(r, 8, 0);
        a.last_seen = ri(r, 9, 0);
        models_tmp mt;
        int cbrc = -1;
        if (!a.id) {
            memset(&mt, 0, sizeof(mt));
            seterr(err, errlen, "%s: agent row without id", s->path);
        } else if (load_models(s, mst, a.id, &mt, err, errlen) == 0) {
            a.models = mt.m;
            a.n_models = mt.n;
            cbrc = cb(arg, &a);
        }
        models_tmp_free(&mt);
        json_decref(a.labels);
        json_decref(a.facts);
        free(r);
        if (cbrc != 0) {
            ret = cbrc;
            goto done;
        }
    }
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: reading agents: %s", s->path, sqlite3_errmsg(s->sdb));
        goto done;
    }
    ret = 0;
done:
    sqlite3_finalize(st);
    sqlite3_finalize(mst);
    return ret;
}

int gps_store_load_keys(gps_store *s, gps_store_key_fn cb, void *arg, char *err, size_t errlen)
{
    int ret = -1;
    /* A DB migrated by a custom set without 0003 has no limit columns:
     * then every key loads as unlimited. */
    bool extras = true;
    sqlite3_stmt *st = sync_prepare(s,
                                    "SELECT id, hash, role, name, agent_id, created_at, "
                                    "expires_at, revoked_at, last_used_at, rpm, "
                                    "tokens_per_day, max_concurrent, max_uses, uses "
                                    "FROM api_keys ORDER BY created_at, id",
                                    err, errlen);
    if (!st) {
        extras = false;
        st = sync_prepare(s,
                          "SELECT id, hash, role, name, agent_id, created_at, "
                          "expires_at, revoked_at, last_used_at FROM api_keys "
                          "ORDER BY created_at, id",
                          err, errlen);
    }
    if (!st)
        return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        row *r = row_copy(st);
        if (!r) {
            seterr(err, errlen, "out of memory");
            goto done;
        }
        gps_store_key_row k = {
            .id = rs(r, 0),
            .hash = rs(r, 1),
            .role = rs(r, 2),
            .name = rs(r, 3) ? rs(r, 3) : "",
            .agent_id = rs(r, 4),
            .created_at = ri(r, 5, 0),
            .expires_at = ri(r, 6, 0),
            .revoked_at = ri(r, 7, 0),
            .last_used_at = ri(r, 8, 0),
            .rpm = extras ? ri(r, 9, 0) : 0,
            .tokens_per_day = extras ? ri(r, 10, 0) : 0,
            .max_concurrent = extras ? ri(r, 11, 0) : 0,
            .max_uses = extras ? ri(r, 12, 0) : 0,
            .uses = extras ? ri(r, 13, 0) : 0,
        };
        int cbrc = k.id && k.hash && k.role ? cb(arg, &k) : 0;
        free(r);
        if (cbrc != 0) {
            ret = cbrc;
            goto done;
        }
    }
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: reading api_keys: %s", s->path, sqlite3_errmsg(s->sdb));
        goto done;
    }
    ret = 0;
done:
    sqlite3_finalize(st);
    return ret;
}

int gps_store_load_unfinished_jobs(gps_store *s, gps_store_job_load_fn cb, void *arg, char *err,
                                   size_t errlen)
{
    int ret = -1;
    sqlite3_stmt *st = sync_prepare(
        s, "SELECT " JOB_COLUMNS "WHERE j.finished_at IS NULL ORDER BY j.created_at, j.id", err,
        errlen);
    if (!st)
        return -1;
    /* Optional (no job_events table before migration 0002). */
    sqlite3_stmt *ev_st = NULL;
    if (sqlite3_prepare_v2(s->sdb, stmts[K_EVENTS_GET].sql, -1, &ev_st, NULL) != SQLITE_OK) {
        sqlite3_finalize(ev_st);
        ev_st = NULL;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        row *r = row_copy(st);
        if (!r) {
            seterr(err, errlen, "out of memory");
            goto done;
        }
        gps_store_job_info ji;
        json_t *req;
        job_info_from_row(r, &ji, &req);
        if (ev_st)
            ji.events = events_collect(ev_st, ji.id);
        int cbrc = cb(arg, &ji);
        json_decref(req);
        json_decref(ji.events);
        free(r);
        if (cbrc != 0) {
            ret = cbrc;
            goto done;
        }
    }
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: reading jobs: %s", s->path, sqlite3_errmsg(s->sdb));
        goto done;
    }
    ret = 0;
done:
    sqlite3_finalize(ev_st);
    sqlite3_finalize(st);
    return ret;
}

int gps_store_key_insert_sync(gps_store *s, const gps_store_key_row *row_in, char *err,
                              size_t errlen)
{
    if (!row_in || !row_in->id || !row_in->hash || !row_in->role) {
        seterr(err, errlen, "key row needs id, hash and role");
        return -1;
    }
    opb b;
    b_key_row(&b, row_in);
    bool extras = key_row_has_extras(row_in);
    /* Key and limits in one transaction: a key never exists without the
     * limits it was created with. */
    sqlite3 *db = extras ? sync_db(s, err, errlen) : NULL;
    if (extras && (!db || sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)) {
        if (db)
            seterr(err, errlen, "%s: inserting key: %s", s->path, sqlite3_errmsg(db));
        b_release(&b);
        return -1;
    }
    int ret = sync_run(s, &b, "inserting key", err, errlen);
    if (ret == 0 && extras) {
        b_key_limits(&b, row_in->id, row_in->rpm, row_in->tokens_per_day,
                     row_in->max_concurrent, row_in->max_uses);
        ret = sync_run(s, &b, "setting key limits", err, errlen);
    }
    if (extras && sqlite3_exec(db, ret == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL) !=
                      SQLITE_OK && ret == 0) {
        seterr(err, errlen, "%s: inserting key: %s", s->path, sqlite3_errmsg(db));
        ret = -1;
    }
    return ret;
}

int gps_store_load_usage(gps_store *s, int64_t day, gps_store_usage_fn cb, void *arg, char *err,
                         size_t errlen)
{
    sqlite3_stmt *st = sync_prepare(s,
                                    "SELECT key_id, requests, prompt_tokens, completion_tokens, "
                                    "rate_limited FROM key_usage WHERE day = ?1",
                                    err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, day);
    int rc, ret = -1;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        if (id && cb(arg, id, day, sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2),
                     sqlite3_column_int64(st, 3), sqlite3_column_int64(st, 4)) != 0)
            break;
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        seterr(err, errlen, "%s: reading key_usage: %s", s->path, sqlite3_errmsg(s->sdb));
    else
        ret = 0;
    sqlite3_finalize(st);
    return ret;
}

int gps_store_key_revoke_sync(gps_store *s, const char *key_id, int64_t revoked_at, char *err,
                              size_t errlen)
{
    sqlite3_stmt *st = sync_prepare(s, stmts[K_KEY_REVOKE].sql, err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, key_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, revoked_at);
    int rc = sqlite3_step(st);
    int ret;
    if (rc != SQLITE_DONE) {
        seterr(err, errlen, "%s: revoking key: %s", s->path, sqlite3_errmsg(s->sdb));
        ret = -1;
    } else {
        ret = sqlite3_changes(s->sdb) > 0 ? 0 : 1;
    }
    sqlite3_finalize(st);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* Admin API: the request log, filtered (async read)                        */
/* ------------------------------------------------------------------------ */

int gps_store_jobs_list_async(gps_store *s, const gps_store_job_filter *f, gps_store_jobs_fn cb,
                              void *arg)
{
    if (!s->ev_done || !f || !cb || f->limit < 1)
        return -1;
    opb b;
    b_init(&b, K_JOB_LIST);
    b_text(&b, f->status);   /* NULL binds NULL: "any" */
    b_text(&b, f->model);
    b_text(&b, f->agent_id);
    b_text(&b, f->key_id);
    b_int_nz(&b, f->before);
    b_int(&b, f->limit);
    op *o = b_pack(&b);
    if (!o)
        return -1;
    o->jobs_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

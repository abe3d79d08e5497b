/*
 * store.c: persistence behind a DB thread (contract in store.h): opening
 * a store (the engine for the path or URI, migrations, the statements
 * prepared), closing, flushing, its health and counters.
 *
 * The module, engine-neutral part, low level to high level (the shared
 * types and helpers are in store_priv.h, private to these files):
 *   - store_stmts.c: the statement table;
 *   - store_op.c: values, ops and the bind spec; connections and stmt_exec;
 *   - store_fold.c: job-row writes folded while they wait, held rows;
 *   - store_db.c: the DB thread and its group commit;
 *   - store_queue.c: the queue the loop's writes and reads go through;
 *   - store_deliver.c: read results handed back to the loop;
 *   - store.c (this file): opening, migrations, closing;
 *   - store_write.c, store_read.c: the public async writers and readers;
 *   - store_sync.c: start-up loads and CLI writes, on the owner thread.
 * A database engine is a table of operations (store_engine.h):
 * store_sqlite.c, store_pg.c.
 *
 * One way to run SQL. Every statement is a row of the table `store_stmts`
 * (name, flags, SQL). Its values are built by one bind spec (store_b_spec:
 * "ttjz" = text, text, JSON, integer-or-NULL) into an op, and run by
 * store_stmt_exec (bind, step every row into a row handler, reset), either
 * on the DB thread (writes and reads queued by the loop: group commit) or
 * on the owner thread's own connection (migrations, start-up loads, CLI
 * writes: sync_exec). Only transaction control and migration scripts go
 * through the engine's script(). A statement's SQL is portable (SQLite's
 * dialect, which PostgreSQL shares for most of what the store runs); where
 * the two differ (INSERT OR REPLACE, json_each, MIN as a scalar, ...) the
 * row carries PostgreSQL's own text beside it.
 */
#include "server/store/store_priv.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
/* Opening and migrations                                                   */
/* ------------------------------------------------------------------------ */

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
        store_seterr(err, errlen, "migrations directory %s: %s", dir, strerror(errno));
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
            store_seterr(err, errlen, "migrations directory %s: %s is not named NNNN_name.sql", dir,
                         de->d_name);
            closedir(d);
            goto fail;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        size_t len;
        char *sql = gp_read_file(path, &len, 16 << 20);
        if (!sql) {
            store_seterr(err, errlen, "%s: %s", path, strerror(errno));
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
        store_seterr(err, errlen, "migrations directory %s holds no NNNN_name.sql file", dir);
        goto fail;
    }
    qsort(ms->m, ms->n, sizeof(*ms->m), mig_cmp);
    for (size_t i = 1; i < ms->n; i++)
        if (ms->m[i].version == ms->m[i - 1].version) {
            store_seterr(err, errlen, "migrations directory %s: version %04d appears twice", dir,
                         ms->m[i].version);
            goto fail;
        }
    return 0;
oom:
    store_seterr(err, errlen, "out of memory loading migrations");
fail:
    mig_set_free(ms);
    return -1;
}

static int read_int(void *arg, const row *r)
{
    *(int *)arg = (int)ri(r, 0, -1);
    return 0;
}

/* Current schema version inside the open transaction (0 = fresh), -1 on error. */
static int schema_current(conn *c, char *err, size_t errlen)
{
    int v = -1, stopped;
    if (store_stmt_exec(c, K_SCHEMA_VERSION, NULL, 0, read_int, &v, &stopped, NULL) != 0 || v < 0) {
        store_seterr(err, errlen, "reading schema_migrations: %s", store_conn_err(c));
        return -1;
    }
    return v;
}

/* A migration's script in c's engine's dialect, run. 0 or -1 with msg. */
static int migration_run(conn *c, const char *sql, char *msg, size_t msglen)
{
    char *mine = c->eng->migration_sql(sql);
    if (!mine) {
        store_seterr(msg, msglen, "out of memory");
        return -1;
    }
    int rc = store_exec_simple(c, mine, msg, msglen);
    free(mine);
    return rc;
}

/* Apply the newer migrations of ms, one transaction each. The engine's
 * migrate_begin_sql serialises servers that open one DB at the same time
 * (SQLite: the write lock; PostgreSQL: a lock on schema_migrations). */
static int migrate(conn *c, const char *path, const mig_set *ms, char *err, size_t errlen)
{
    char msg[512] = "";
    if (migration_run(c,
                      "CREATE TABLE IF NOT EXISTS schema_migrations ("
                      "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                      "applied_at INTEGER NOT NULL)",
                      msg, sizeof(msg)) != 0) {
        store_seterr(err, errlen, "%s: creating schema_migrations: %s", path, msg);
        return -1;
    }
    int known = ms->n ? ms->m[ms->n - 1].version : 0;
    for (;;) {
        if (store_exec_simple(c, c->eng->migrate_begin_sql, msg, sizeof(msg)) != 0) {
            store_seterr(err, errlen, "%s: %s", path, msg);
            return -1;
        }
        int cur = schema_current(c, msg, sizeof(msg));
        if (cur < 0) {
            store_seterr(err, errlen, "%s: %s", path, msg);
            goto rollback;
        }
        if (cur > known) {
            store_seterr(err, errlen,
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
            store_exec_simple(c, "COMMIT", NULL, 0);
            return 0;
        }
        if (migration_run(c, next->sql, msg, sizeof(msg)) != 0) {
            store_seterr(err, errlen, "%s: migration %04d_%s failed: %s", path, next->version,
                         next->name, msg);
            goto rollback;
        }
        opb b;
        store_b_spec(&b, K_MIGRATION_RECORD, "iti", (int64_t)next->version, next->name,
                     (int64_t)gp_now_wall_ms());
        int stopped;
        int rc = store_stmt_exec(c, K_MIGRATION_RECORD, b.v, b.nv, NULL, NULL, &stopped, NULL);
        store_b_release(&b);
        if (rc != 0) {
            store_seterr(err, errlen, "%s: recording migration %04d: %s", path, next->version,
                         store_conn_err(c));
            goto rollback;
        }
        if (store_exec_simple(c, "COMMIT", msg, sizeof(msg)) != 0) {
            store_seterr(err, errlen, "%s: committing migration %04d: %s", path, next->version,
                         msg);
            goto rollback;
        }
        gp_log_write(GP_LOG_INFO, "store_migration_applied", NULL,
                     json_pack("{s:i, s:s}", "version", next->version, "name", next->name),
                     "applied migration %04d_%s", next->version, next->name);
    }
rollback:
    store_exec_simple(c, "ROLLBACK", NULL, 0);
    return -1;
}

static bool is_pg_uri(const char *db)
{
    return strncmp(db, "postgresql://", 13) == 0 || strncmp(db, "postgres://", 11) == 0;
}

/* db for messages and logs (new string, caller frees; NULL on ENOMEM): a
 * URI loses the password of its user:password@ part. */
static char *db_label(const char *db)
{
    const char *scheme = strstr(db, "://");
    const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - (scheme + 3))) : NULL;
    if (!colon)
        return strdup(db);
    size_t head = (size_t)(colon - db);
    char *out = malloc(head + strlen(at) + 1);
    if (out) {
        memcpy(out, db, head);
        strcpy(out + head, at);
    }
    return out;
}

/* The engine for db: PostgreSQL for a postgresql:// (or postgres://) URI,
 * SQLite for anything else (a path). *label gets db_label(db). NULL with
 * err when this binary has no such engine. */
static const gps_store__engine *engine_for(const char *db, char **label, char *err,
                                           size_t errlen)
{
    const gps_store__engine *eng = is_pg_uri(db) ? gps_store__pg() : &gps_store__sqlite;
    *label = db_label(db);
    if (!*label) {
        store_seterr(err, errlen, "out of memory");
        return NULL;
    }
    if (!eng)
        store_seterr(err, errlen,
                     "%s: this gpupool-server was built without libpq, so it cannot use a "
                     "PostgreSQL database (install libpq-dev, rebuild; or give a file path for "
                     "SQLite)",
                     *label);
    return eng;
}

void gps_store_db_label(const char *db, char *out, size_t outlen)
{
    char *l = db ? db_label(db) : NULL;
    store_seterr(out, outlen, "%s", l ? l : "");
    free(l);
}

bool gps_store_db_is_file(const char *db) { return db && !is_pg_uri(db); }

gps_store *gps_store_open(const char *path, struct event_base *base, const gps_store_opts *opts,
                          char *err, size_t errlen)
{
    gps_store *s = NULL;
    mig_set ms = {0};
    bool mu_ok = false;

    if (!path || !*path) {
        store_seterr(err, errlen, "no database path given");
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (s)
        s->wake_fd = -1;
    if (!s || !(s->target = strdup(path))) {
        store_seterr(err, errlen, "out of memory");
        goto fail;
    }
    if (!(s->eng = engine_for(path, &s->path, err, errlen)))
        goto fail;
    s->w.eng = s->r.eng = s->eng;
    s->commit_interval_ms = opts && opts->commit_interval_ms > 0 ? opts->commit_interval_ms : 5;
    s->batch_max = opts && opts->batch_max > 0 ? opts->batch_max : 512;
    int hold_ms = opts && opts->row_hold_ms ? opts->row_hold_ms : GPS_STORE_ROW_HOLD_MS;
    s->row_hold_us = hold_ms > 0 ? (uint64_t)hold_ms * 1000 : 0;
    s->queue_max = opts && opts->queue_max > 0 ? opts->queue_max : 100000;
    s->busy_timeout_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms : 5000;
    s->base = base;
    s->last_commit_ok = true;

    if (mig_load(&ms, opts ? opts->migrations_dir : NULL, err, errlen) != 0)
        goto fail;
    s->w.h = s->eng->conn_open(s->target, s->path, s->busy_timeout_ms, K_COUNT, err,
                                 errlen);
    if (!s->w.h)
        goto fail;
    if (migrate(&s->w, s->path, &ms, err, errlen) != 0)
        goto fail;
    /* Every statement of the DB thread, now: a schema the binary cannot
     * use is refused here, and the thread never prepares (so that
     * gps_store_has_job_events may read w.ok from the loop). */
    for (int k = 0; k < K_COUNT; k++) {
        if (store_stmts[k].flags & F_SYNC)
            continue;
        if (!store_conn_stmt(&s->w, k) && !(store_stmts[k].flags & F_OPT)) {
            store_seterr(err, errlen, "%s: preparing %s: %s (schema out of step with the binary?)",
                         s->path, store_stmts[k].name, store_conn_err(&s->w));
            goto fail;
        }
    }
    for (int k = 0; k < K_COUNT; k++)
        s->w.tried[k] = true;

    if (base) {
        s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (s->wake_fd < 0) {
            store_seterr(err, errlen, "eventfd: %s", strerror(errno));
            goto fail;
        }
        s->ev_wake = event_new(base, s->wake_fd, EV_READ | EV_PERSIST, store_on_wake, s);
        if (!s->ev_wake || event_add(s->ev_wake, NULL) != 0) {
            store_seterr(err, errlen, "event_new failed");
            goto fail;
        }
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    s->pend = calloc(PEND_BUCKETS, sizeof(*s->pend)); /* NULL: writes never fold */
    pthread_cond_init(&s->cv_work, &ca);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_condattr_destroy(&ca);
    mu_ok = true;
    s->thread_alive = true;
    if (pthread_create(&s->thread, NULL, store_db_main, s) != 0) {
        s->thread_alive = false;
        store_seterr(err, errlen, "cannot start the DB thread: %s", strerror(errno));
        goto fail;
    }
    s->thread_started = true;
    mig_set_free(&ms);
    return s;

fail:
    mig_set_free(&ms);
    if (s) {
        if (s->ev_wake)
            event_free(s->ev_wake);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        store_conn_close(&s->w);
        if (mu_ok) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv_work);
            pthread_cond_destroy(&s->cv_done);
        }
        free(s->path);
        free(s->target);
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
    store_deliver_all(s);
    gps_store__listen_detach(s->listen_hub);
    if (s->ev_wake)
        event_free(s->ev_wake);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    store_conn_close(&s->w);
    store_conn_close(&s->r);
    store_free_chain(s->qhead);
    for (op *o = s->hhead; o; o = o->hnext)
        o->next = o->hnext;
    store_free_chain(s->hhead); /* none after a stop: the DB thread ran them */
    free(s->pend);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s->path);
    free(s->target);
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

int gps_store_backlog(gps_store *s, char *msg, size_t msglen)
{
    pthread_mutex_lock(&s->mu);
    uint64_t depth = s->stats.queue_depth, drops = s->stats.drops;
    pthread_mutex_unlock(&s->mu);
    uint64_t high = s->queue_max - s->queue_max / 4, low = s->queue_max / 2;
    if (!s->backlog && depth >= high) {
        s->backlog = true;
        gp_log_write(GP_LOG_ERROR, "store_backlog", NULL,
                     json_pack("{s:I,s:I,s:I}", "queue_depth", (json_int_t)depth, "queue_max",
                               (json_int_t)s->queue_max, "drops_total", (json_int_t)drops),
                     "store: %llu ops queued (the database is slow or away): refusing new "
                     "work until fewer than %llu are", (unsigned long long)depth,
                     (unsigned long long)low);
    } else if (s->backlog && depth < low) {
        s->backlog = false;
        gp_log_write(GP_LOG_INFO, "store_backlog_cleared", NULL,
                     json_pack("{s:I}", "queue_depth", (json_int_t)depth),
                     "store: the queue is down to %llu ops: admitting new work again",
                     (unsigned long long)depth);
    }
    if (!s->backlog)
        return 0;
    snprintf(msg, msglen,
             "this server's database is not keeping up (%llu writes queued): it admits no new "
             "work until they are written; retry, here or on another server",
             (unsigned long long)depth);
    return 1;
}

bool gps_store_healthy(gps_store *s, char *msg, size_t msglen)
{
    pthread_mutex_lock(&s->mu);
    bool ok = s->thread_alive && s->last_commit_ok;
    if (!ok)
        store_seterr(msg, msglen, "%s", !s->thread_alive ? "DB thread not running" : s->last_error);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/*
 * store_sqlite.c: the SQLite engine of the store (store_engine.h). One
 * file, WAL, synchronous=NORMAL, foreign keys on; statements prepared once
 * per connection (SQLITE_PREPARE_PERSISTENT) and reset after each run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "server/store/store_engine.h"

/* Transaction control (BEGIN IMMEDIATE, COMMIT, ROLLBACK) runs twice per
 * group commit: kept prepared, since sqlite3_exec parses it each time
 * (~7,500 instructions a parse, a fifth of a commit; issue 24). */
#define TX_CACHE 4

typedef struct sconn {
    sqlite3 *db;
    sqlite3_stmt **st;   /* nstmt statements, NULL until prepared */
    int nstmt;
    sqlite3_stmt *tx_st[TX_CACHE]; /* tx_stmt's statements, NULL until used */
    bool nomem;          /* the last sq_exec failed for want of memory of its own
                            (SQLite's message would be "not an error") */
} sconn;

static int simple(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK && err && errlen)
        snprintf(err, errlen, "%s", msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return rc == SQLITE_OK ? 0 : -1;
}

/* Pragmas of every connection. */
static int setup(sqlite3 *db, int busy_ms, const char *path, char *err, size_t errlen)
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
            snprintf(err, errlen, "%s: not a SQLite database or corrupted (%s)", path,
                     sqlite3_errmsg(db));
        else
            snprintf(err, errlen, "%s: cannot open database: %s", path, sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    const char *mode = (const char *)sqlite3_column_text(st, 0);
    bool wal = mode && strcmp(mode, "wal") == 0;
    sqlite3_finalize(st);
    if (!wal) {
        snprintf(err, errlen, "%s: cannot switch the database to WAL mode", path);
        return -1;
    }
    if (simple(db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", msg, sizeof(msg))) {
        snprintf(err, errlen, "%s: %s", path, msg);
        return -1;
    }
    return 0;
}

static void sq_close(void *arg)
{
    sconn *c = arg;
    if (!c)
        return;
    for (int k = 0; k < c->nstmt; k++)
        sqlite3_finalize(c->st[k]);
    for (int k = 0; k < TX_CACHE; k++)
        sqlite3_finalize(c->tx_st[k]);
    free(c->st);
    sqlite3_close(c->db);
    free(c);
}

static void *sq_open(const char *path, const char *label, int busy_ms, int nstmt, char *err,
                     size_t errlen)
{
    (void)label; /* a path holds no secret */
    sconn *c = calloc(1, sizeof(*c));
    if (!c || !(c->st = calloc((size_t)nstmt, sizeof(*c->st)))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    c->nstmt = nstmt;
    int rc = sqlite3_open_v2(path, &c->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: cannot open database: %s", path,
                 c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        goto fail;
    }
    if (setup(c->db, busy_ms, path, err, errlen) != 0)
        goto fail;
    return c;
fail:
    sq_close(c);
    return NULL;
}

static int sq_prepare(void *arg, int k, const char *sql, const char *sql_pg)
{
    (void)sql_pg;
    sconn *c = arg;
    c->nomem = false;
    if (c->st[k])
        return 0;
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &c->st[k], NULL) !=
        SQLITE_OK) {
        sqlite3_finalize(c->st[k]);
        c->st[k] = NULL;
        return -1;
    }
    return 0;
}

/* The current row of st as a borrowed view in r (r->n cells). */
static void row_view(sqlite3_stmt *st, gps_store__row *r)
{
    for (int i = 0; i < r->n; i++) {
        gps_store__val *v = &r->v[i];
        int t = sqlite3_column_type(st, i);
        memset(v, 0, sizeof(*v));
        if (t == SQLITE_INTEGER || t == SQLITE_FLOAT) {
            v->t = GPS_STORE__INT;
            v->i = sqlite3_column_int64(st, i);
        } else if (t != SQLITE_NULL) {
            /* text (and a blob, read as text): sqlite3_column_text gives it
             * a terminating NUL. */
            const char *s = (const char *)sqlite3_column_text(st, i);
            v->t = GPS_STORE__TEXT;
            v->s = s ? s : "";
            v->len = s ? (size_t)sqlite3_column_bytes(st, i) : 0;
        }
    }
}

static int sq_exec(void *arg, int k, const gps_store__val *v, int nv, gps_store__row_fn each,
                   void *earg, int *stopped, int64_t *changes)
{
    sconn *c = arg;
    sqlite3_stmt *st = c->st[k];
    gps_store__row *r = NULL;
    *stopped = 0;
    *changes = 0;
    c->nomem = false;
    if (!st)
        return -1;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    /* A bind spec that does not match its statement is a bug: refuse it
     * loudly rather than run with parameters left NULL. */
    if (nv != sqlite3_bind_parameter_count(st))
        return -1;
    int rc = SQLITE_OK;
    for (int i = 0; i < nv && rc == SQLITE_OK; i++) {
        if (v[i].t == GPS_STORE__INT)
            rc = sqlite3_bind_int64(st, i + 1, v[i].i);
        else if (v[i].t == GPS_STORE__TEXT)
            rc = sqlite3_bind_text(st, i + 1, v[i].s, (int)v[i].len, SQLITE_STATIC);
        else
            rc = sqlite3_bind_null(st, i + 1);
    }
    if (each) {
        int n = sqlite3_column_count(st);
        r = calloc(1, sizeof(*r) + (size_t)n * sizeof(r->v[0]));
        if (!r) {
            rc = SQLITE_NOMEM;
            c->nomem = true;
        } else {
            r->n = n;
        }
    }
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW && each) {
            row_view(st, r);
            if ((*stopped = each(earg, r)) != 0)
                rc = SQLITE_DONE;
        }
    }
    free(r);
    *changes = sqlite3_changes(c->db);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* The cached statement of a transaction-control string (one statement,
 * no ';'), prepared on first use; NULL for anything else (run by
 * sqlite3_exec). Only the store's own constant strings come here. */
static sqlite3_stmt *tx_stmt(sconn *c, const char *sql)
{
    static const char *const known[TX_CACHE] = {"BEGIN IMMEDIATE", "COMMIT", "ROLLBACK",
                                                "BEGIN"};
    for (int k = 0; k < TX_CACHE; k++) {
        if (strcmp(sql, known[k]) != 0)
            continue;
        if (!c->tx_st[k] && sqlite3_prepare_v3(c->db, known[k], -1, SQLITE_PREPARE_PERSISTENT,
                                               &c->tx_st[k], NULL) != SQLITE_OK) {
            sqlite3_finalize(c->tx_st[k]);
            c->tx_st[k] = NULL;
        }
        return c->tx_st[k];
    }
    return NULL;
}

static int sq_script(void *arg, const char *sql, char *err, size_t errlen)
{
    sconn *c = arg;
    c->nomem = false;
    sqlite3_stmt *st = tx_stmt(c, sql);
    if (!st)
        return simple(c->db, sql, err, errlen);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE && err && errlen)
        snprintf(err, errlen, "%s", sqlite3_errmsg(c->db));
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

static const char *sq_errmsg(void *arg)
{
    sconn *c = arg;
    if (c && c->nomem)
        return "out of memory";
    return c && c->db ? sqlite3_errmsg(c->db) : "no connection";
}

/* migrations/ is written in SQLite's dialect: run as is. */
static char *sq_migration_sql(const char *sql) { return strdup(sql); }

const gps_store__engine gps_store__sqlite = {
    .name = "sqlite",
    .conn_open = sq_open,
    .conn_close = sq_close,
    .prepare = sq_prepare,
    .exec = sq_exec,
    .script = sq_script,
    .errmsg = sq_errmsg,
    .migration_sql = sq_migration_sql,
    .begin_sql = "BEGIN IMMEDIATE",
    .migrate_begin_sql = "BEGIN IMMEDIATE",
};

/*
 * store_engine.h: what the store's engine-neutral core (store.c and the
 * files it lists: the statement table, the queue, the DB thread, group
 * commit, callbacks on the loop, migrations) needs of a database engine. Internal to
 * src/server/store: callers only see store.h.
 *
 * A backend is one table of operations (gps_store__engine) over an opaque
 * connection. store_sqlite.c implements it on SQLite, store_pg.c on libpq;
 * store_pg_none.c stands in for the latter when libpq was absent at build
 * time, so that the core never needs an #ifdef.
 *
 * Names: gps_store__ (two underscores) marks what crosses files inside
 * the module and is not part of store.h.
 */
#ifndef GPS_STORE_ENGINE_H
#define GPS_STORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/store/store.h"

/* A bound parameter or a result cell. */
enum { GPS_STORE__NULL = 0, GPS_STORE__INT, GPS_STORE__TEXT };
typedef struct gps_store__val {
    int t;
    int64_t i;
    const char *s;   /* TEXT: len bytes + NUL */
    size_t len;
} gps_store__val;

/* A result row: n values. What an engine hands to a row handler is
 * borrowed for that call only (it points into the engine's buffers). */
typedef struct gps_store__row {
    int n;
    gps_store__val v[];
} gps_store__row;

/* Called with each result row; returns 0 to go on, non-zero to stop. */
typedef int (*gps_store__row_fn)(void *arg, const gps_store__row *r);

typedef struct gps_store__engine {
    const char *name;    /* "sqlite", "postgresql": logs and errors */
    /* A connection to target (a path, or a URI), ready for statements
     * 0..nstmt-1 (new; conn_close frees it). busy_ms: how long to wait for
     * a lock another process holds. NULL with err, which names the DB by
     * label (target without a password), never by target. */
    void *(*conn_open)(const char *target, const char *label, int busy_ms, int nstmt, char *err,
                       size_t errlen);
    void (*conn_close)(void *c);
    /* Prepare statement k once. sql is the portable text (SQLite's
     * dialect, parameters ?1..?N); sql_pg, when not NULL, PostgreSQL's own
     * text of the same statement (same parameters, same result columns).
     * 0, or -1 when this DB's schema cannot run it (errmsg says why). */
    int (*prepare)(void *c, int k, const char *sql, const char *sql_pg);
    /* Run prepared statement k with v[0..nv) bound to ?1..?nv: each
     * result row to each (NULL: rows ignored). 0 when done (*stopped is
     * each's non-zero value if it stopped, else 0), -1 on error (errmsg).
     * *changes: rows the statement inserted, updated or deleted. Inside a
     * transaction a failed statement leaves the transaction usable (the
     * rest of a group commit still commits). */
    int (*exec)(void *c, int k, const gps_store__val *v, int nv, gps_store__row_fn each,
                void *arg, int *stopped, int64_t *changes);
    /* Run SQL without parameters (transaction control, a migration's
     * script). 0, or -1 with err. */
    int (*script)(void *c, const char *sql, char *err, size_t errlen);
    /* The last error on c (never NULL). */
    const char *(*errmsg)(void *c);
    /* A migration file's text as this engine runs it (new string, caller
     * frees; NULL on ENOMEM). */
    char *(*migration_sql)(const char *sql);
    /* Starts a write transaction (SQLite: take the write lock now). */
    const char *begin_sql;
    /* Starts a migration's transaction, serialised with other processes
     * migrating the same DB. */
    const char *migrate_begin_sql;
} gps_store__engine;

extern const gps_store__engine gps_store__sqlite;
/* The libpq engine, or NULL when this binary was built without libpq. */
const gps_store__engine *gps_store__pg(void);
/* store.h's listeners: one connection per store (the hub) to target (a
 * postgresql:// URI; label names it in logs) for all of them, made on the
 * first listener and closed with the last one. *slot is the store's
 * pointer to its hub (NULL before the first listener, cleared when the hub
 * goes); gps_store__listen_detach(hub) at the store's close, after which
 * the hub lives on, on its own, until its last listener is freed.
 * store_listen_pg.c, or NULL without libpq (store_pg_none.c). Other
 * arguments as gps_store_listen. */
typedef struct gps_store__listen_hub gps_store__listen_hub;
gps_store_listener *gps_store__listener_new(gps_store__listen_hub **slot, const char *target,
                                            const char *label, struct event_base *base,
                                            const char *const *channels,
                                            gps_store_notify_fn fn, void *arg);
void gps_store__listen_detach(gps_store__listen_hub *hub);

#endif

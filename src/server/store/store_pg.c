/*
 * store_pg.c: the PostgreSQL engine of the store (store_engine.h), on
 * libpq. Synchronous libpq calls on the DB thread (the loop never waits on
 * them, as with SQLite) and on the owner thread's own connection.
 *
 * Statements: the table's portable SQL (or its PostgreSQL text) with ?N
 * turned into $N, prepared on the server per parameter signature and run
 * with parameters: integers are sent typed int8 and text typed text, so
 * that PostgreSQL never guesses int4 for a millisecond time; a NULL is
 * left untyped for PostgreSQL to infer. Never SQL built from data: every
 * value is a parameter. prepare() checks once (an unnamed PQprepare) that
 * the DB's schema can run a statement. Each run is one pipeline (libpq
 * >= 14): one round trip.
 *
 * A failed statement aborts a PostgreSQL transaction, where SQLite goes on
 * with the next one; the store's group commit relies on the latter (one
 * bad write must not lose its batch), so inside a transaction every
 * statement runs after a SAVEPOINT and a failure rolls back to it.
 *
 * A connection found broken (the server restarted) is reset before the
 * next statement: the op that saw the failure fails, the next ones work.
 */
#include <ctype.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "server/store/store_engine.h"

/* Type OIDs (server/catalog/pg_type_d.h, stable across versions). */
enum { OID_BOOL = 16, OID_INT8 = 20, OID_INT2 = 21, OID_INT4 = 23, OID_TEXT = 25,
       OID_OID = 26, OID_FLOAT4 = 700, OID_FLOAT8 = 701, OID_NUMERIC = 1700 };

/* Server-side prepared statements, per statement and per parameter
 * signature (which parameters are integers, text, NULL: a NULL is sent
 * untyped, so each mix is its own plan). A statement whose signatures
 * outnumber the slots runs unprepared (PQsendQueryParams). */
#define SIG_SLOTS 4
typedef struct psig {
    uint64_t sig;        /* 2 bits per parameter */
    unsigned name;       /* prepared as "gps<name>"; 0 = slot free */
} psig;

typedef struct pconn {
    PGconn *pg;
    char **sql;          /* nstmt statements in PostgreSQL's text, NULL until prepared */
    psig (*sigs)[SIG_SLOTS];   /* nstmt x SIG_SLOTS */
    unsigned next_name;  /* names are never reused (a failed pipeline may leave one) */
    int nstmt;
    int busy_ms;         /* lock_timeout, set again on every new session */
    char err[512];
} pconn;

static void set_err(pconn *c, const char *what, const char *msg)
{
    snprintf(c->err, sizeof(c->err), "%s%s%s", what, *what ? ": " : "", msg ? msg : "");
    size_t n = strlen(c->err);
    while (n && (c->err[n - 1] == '\n' || c->err[n - 1] == ' '))
        c->err[--n] = '\0';
}

/* PostgreSQL's notices (IF NOT EXISTS "skipping", ...) are not errors. */
static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static int session_setup(pconn *c);

/* A broken connection (server restart, network) is re-established before
 * use; false when that fails too. An idle connection that PostgreSQL
 * closed (a restart terminates every session) is only found by reading
 * it: PQconsumeInput reads what is pending without sending anything, so
 * no statement is ever sent twice. */
static bool alive(pconn *c)
{
    /* Nothing is in flight here, so what is readable is PostgreSQL's word
     * that it ended the session (an error, then end of file): read it
     * until libpq sees the end, a few reads at most. */
    for (int i = 0; i < 4 && PQstatus(c->pg) == CONNECTION_OK; i++) {
        struct pollfd p = {.fd = PQsocket(c->pg), .events = POLLIN};
        if (p.fd < 0 || poll(&p, 1, 0) != 1 || !PQconsumeInput(c->pg))
            break;
    }
    if (PQstatus(c->pg) == CONNECTION_OK)
        return true;
    PQreset(c->pg);
    if (PQstatus(c->pg) != CONNECTION_OK) {
        set_err(c, "PostgreSQL connection lost", PQerrorMessage(c->pg));
        return false;
    }
    /* A new session: the server forgot every prepared statement. */
    memset(c->sigs, 0, (size_t)c->nstmt * sizeof(*c->sigs));
    return session_setup(c) == 0;
}

static int command(pconn *c, const char *sql);

/* What each new session needs: notices kept off stderr, and
 * busy_timeout's counterpart (how long a statement waits for a lock
 * another server holds before failing). */
static int session_setup(pconn *c)
{
    char set[64];
    PQsetNoticeProcessor(c->pg, quiet, NULL);
    snprintf(set, sizeof(set), "SET lock_timeout = %d", c->busy_ms);
    return command(c, set);
}

/* Run a parameterless command; 0 or -1 (c->err). */
static int command(pconn *c, const char *sql)
{
    PGresult *res = PQexec(c->pg, sql);
    ExecStatusType st = PQresultStatus(res);
    int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : -1;
    if (rc)
        set_err(c, "", PQresultErrorMessage(res));
    PQclear(res);
    return rc;
}

static void pg_close(void *arg)
{
    pconn *c = arg;
    if (!c)
        return;
    for (int k = 0; c->sql && k < c->nstmt; k++)
        free(c->sql[k]);
    free(c->sql);
    free(c->sigs);
    PQfinish(c->pg);
    free(c);
}

static void *pg_open(const char *uri, const char *label, int busy_ms, int nstmt, char *err,
                     size_t errlen)
{
    pconn *c = calloc(1, sizeof(*c));
    if (!c || !(c->sql = calloc((size_t)nstmt, sizeof(*c->sql))) ||
        !(c->sigs = calloc((size_t)nstmt, sizeof(*c->sigs)))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    c->nstmt = nstmt;
    c->busy_ms = busy_ms;
    /* A 10 s connect timeout unless the URI sets one (its parameters come
     * after, and win): without one, a reconnect to an unreachable host
     * holds the DB thread for minutes. */
    const char *const keys[] = {"connect_timeout", "dbname", NULL};
    const char *const vals[] = {"10", uri, NULL};
    c->pg = PQconnectdbParams(keys, vals, 1);
    if (!c->pg || PQstatus(c->pg) != CONNECTION_OK) {
        set_err(c, "cannot connect to PostgreSQL", c->pg ? PQerrorMessage(c->pg) : "no memory");
        snprintf(err, errlen, "%s: %s", label, c->err);
        goto fail;
    }
    if (session_setup(c) != 0) {
        snprintf(err, errlen, "%s: %s", label, c->err);
        goto fail;
    }
    return c;
fail:
    pg_close(c);
    return NULL;
}

/* sql with each ?N parameter (outside quotes) written $N (new string). */
static char *dollar_params(const char *sql)
{
    char *out = strdup(sql);
    bool quoted = false;
    for (char *p = out; p && *p; p++) {
        if (*p == '\'')
            quoted = !quoted;
        else if (!quoted && *p == '?' && isdigit((unsigned char)p[1]))
            *p = '$';
    }
    return out;
}

static bool in_tx(pconn *c) { return PQtransactionStatus(c->pg) == PQTRANS_INTRANS; }

static int pg_prepare(void *arg, int k, const char *sql, const char *sql_pg)
{
    pconn *c = arg;
    if (c->sql[k])
        return 0;
    char *text = dollar_params(sql_pg ? sql_pg : sql);
    if (!text) {
        set_err(c, "", "out of memory");
        return -1;
    }
    if (!alive(c)) {
        free(text);
        return -1;
    }
    /* A statement the schema cannot run must not abort the caller's
     * transaction. */
    bool sp = in_tx(c);
    if (sp && command(c, "SAVEPOINT gps_prepare") != 0) {
        free(text);
        return -1;
    }
    PGresult *res = PQprepare(c->pg, "", text, 0, NULL);
    int rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -1;
    if (rc)
        set_err(c, "", PQresultErrorMessage(res));
    PQclear(res);
    if (sp)
        command(c, rc ? "ROLLBACK TO SAVEPOINT gps_prepare" : "RELEASE SAVEPOINT gps_prepare");
    if (rc)
        free(text);
    else
        c->sql[k] = text;
    return rc;
}

static bool int_type(Oid t)
{
    return t == OID_INT8 || t == OID_INT4 || t == OID_INT2 || t == OID_OID || t == OID_BOOL ||
           t == OID_NUMERIC || t == OID_FLOAT4 || t == OID_FLOAT8;
}

/* Hand each row of res to each through one borrowed view. */
static int rows_each(PGresult *res, gps_store__row_fn each, void *arg, int *stopped)
{
    int n = PQnfields(res), nrows = PQntuples(res);
    gps_store__row *r = calloc(1, sizeof(*r) + (size_t)n * sizeof(r->v[0]));
    if (!r)
        return -1;
    r->n = n;
    for (int i = 0; i < nrows && !*stopped; i++) {
        for (int f = 0; f < n; f++) {
            gps_store__val *v = &r->v[f];
            memset(v, 0, sizeof(*v));
            if (PQgetisnull(res, i, f))
                continue;
            const char *s = PQgetvalue(res, i, f);
            if (int_type(PQftype(res, f))) {
                v->t = GPS_STORE__INT;
                v->i = PQftype(res, f) == OID_BOOL ? (*s == 't') : strtoll(s, NULL, 10);
            } else {
                v->t = GPS_STORE__TEXT;
                v->s = s;
                v->len = (size_t)PQgetlength(res, i, f);
            }
        }
        *stopped = each(arg, r);
    }
    free(r);
    return 0;
}

#define PG_MAXV 32

/* The prepared-statement slot of k for sig: *fresh when it must be
 * prepared first; NULL when every slot holds another signature. */
static psig *sig_slot(pconn *c, int k, uint64_t sig, bool *fresh)
{
    psig *free_slot = NULL;
    *fresh = false;
    for (int i = 0; i < SIG_SLOTS; i++) {
        psig *p = &c->sigs[k][i];
        if (p->name && p->sig == sig)
            return p;
        if (!p->name && !free_slot)
            free_slot = p;
    }
    if (free_slot) {
        free_slot->sig = sig;
        free_slot->name = ++c->next_name;
        *fresh = true;
    }
    return free_slot;
}

/* Read the results of a pipeline of n commands and its sync. The last
 * command's result is returned (caller clears it), the others checked:
 * NULL with c->err when one failed. */
static PGresult *pipeline_results(pconn *c, int n)
{
    PGresult *last = NULL;
    bool failed = false;
    for (int i = 0; i < n; i++) {
        PGresult *res = PQgetResult(c->pg);
        ExecStatusType st = PQresultStatus(res);
        bool ok = res && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK);
        if (!ok && !failed && st != PGRES_PIPELINE_ABORTED) {
            set_err(c, "", res ? PQresultErrorMessage(res) : PQerrorMessage(c->pg));
            failed = true;
        }
        if (i == n - 1 && ok && !failed)
            last = res;
        else
            PQclear(res);
        while ((res = PQgetResult(c->pg)) && PQresultStatus(res) != PGRES_PIPELINE_SYNC)
            PQclear(res);   /* the end of this command's results */
        if (res) {          /* a sync already: the connection broke off the pipeline */
            PQclear(res);
            PQclear(last);
            set_err(c, "", PQerrorMessage(c->pg));
            return NULL;
        }
    }
    PGresult *sync = PQgetResult(c->pg);
    if (PQresultStatus(sync) != PGRES_PIPELINE_SYNC && !failed) {
        set_err(c, "", PQerrorMessage(c->pg));
        failed = true;
    }
    PQclear(sync);
    if (failed) {
        PQclear(last);
        return NULL;
    }
    return last;
}

/* One round trip per statement: the SAVEPOINT (inside a transaction), the
 * Parse of a new signature and the statement itself go out as one
 * pipeline. */
static PGresult *run_pipeline(pconn *c, int k, int nv, const Oid *types,
                              const char *const *values, bool sp)
{
    uint64_t sig = 0;
    for (int i = 0; i < nv; i++)
        sig |= (uint64_t)(types[i] == OID_INT8 ? 1 : types[i] == OID_TEXT ? 2 : 0) << (2 * i);
    bool fresh;
    psig *slot = sig_slot(c, k, sig, &fresh);
    char name[24];
    snprintf(name, sizeof(name), "gps%u", slot ? slot->name : 0);
    int n = 0;
    bool sent = PQenterPipelineMode(c->pg) == 1;
    if (sent && sp) {
        sent = PQsendQueryParams(c->pg, "SAVEPOINT gps_op", 0, NULL, NULL, NULL, NULL, 0) == 1;
        n++;
    }
    if (sent && fresh) {
        sent = PQsendPrepare(c->pg, name, c->sql[k], nv, types) == 1;
        n++;
    }
    if (sent) {
        sent = (slot ? PQsendQueryPrepared(c->pg, name, nv, values, NULL, NULL, 0)
                     : PQsendQueryParams(c->pg, c->sql[k], nv, types, values, NULL, NULL, 0)) ==
               1;
        n++;
    }
    if (sent)
        sent = PQpipelineSync(c->pg) == 1;
    PGresult *res = NULL;
    if (sent)
        res = pipeline_results(c, n);
    else
        set_err(c, "", PQerrorMessage(c->pg));
    PQexitPipelineMode(c->pg);
    if (!res && fresh)
        slot->name = 0;   /* prepare again next time, under a new name */
    return res;
}

static int pg_exec(void *arg, int k, const gps_store__val *v, int nv, gps_store__row_fn each,
                   void *earg, int *stopped, int64_t *changes)
{
    pconn *c = arg;
    Oid types[PG_MAXV];
    const char *values[PG_MAXV];
    char nums[PG_MAXV][24];
    *stopped = 0;
    *changes = 0;
    if (!c->sql[k] || nv > PG_MAXV || !alive(c))
        return -1;
    for (int i = 0; i < nv; i++) {
        types[i] = v[i].t == GPS_STORE__INT ? OID_INT8 : v[i].t == GPS_STORE__TEXT ? OID_TEXT : 0;
        values[i] = NULL;
        if (v[i].t == GPS_STORE__INT) {
            snprintf(nums[i], sizeof(nums[i]), "%lld", (long long)v[i].i);
            values[i] = nums[i];
        } else if (v[i].t == GPS_STORE__TEXT) {
            values[i] = v[i].s;
        }
    }
    bool sp = in_tx(c);
    PGresult *res = run_pipeline(c, k, nv, types, values, sp);
    int rc = -1;
    if (res) {
        const char *ct = PQcmdTuples(res);
        *changes = ct && *ct ? strtoll(ct, NULL, 10) : 0;
        rc = each && PQresultStatus(res) == PGRES_TUPLES_OK ? rows_each(res, each, earg, stopped)
                                                            : 0;
        if (rc)
            set_err(c, "", "out of memory");
    }
    PQclear(res);
    /* The savepoint is left in place on success (released with the
     * transaction): no round trip for it. */
    if (sp && PQtransactionStatus(c->pg) == PQTRANS_INERROR)
        command(c, "ROLLBACK TO SAVEPOINT gps_op");
    return rc;
}

static int pg_script(void *arg, const char *sql, char *err, size_t errlen)
{
    pconn *c = arg;
    int rc = alive(c) ? command(c, sql) : -1;
    if (rc && err && errlen)
        snprintf(err, errlen, "%s", c->err);
    return rc;
}

static const char *pg_errmsg(void *arg)
{
    pconn *c = arg;
    return c ? c->err : "no connection";
}

static bool word_at(const char *p, const char *start, const char *w)
{
    size_t n = strlen(w);
    return strncmp(p, w, n) == 0 && (p == start || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) &&
           !(isalnum((unsigned char)p[n]) || p[n] == '_');
}

/* migrations/ is written in a portable subset of SQL (docs/persistence.md
 * "One schema, two engines"); what PostgreSQL needs differently is
 * rewritten here, outside quotes: INTEGER is BIGINT (SQLite's INTEGER
 * holds 64 bits: times in ms, token counts), and SQLite's WITHOUT ROWID
 * table option is dropped. The result is never longer than sql. */
static char *pg_migration_sql(const char *sql)
{
    char *out = malloc(strlen(sql) + 1), *o = out;
    bool quoted = false;
    for (const char *p = sql; out && *p;) {
        if (!quoted && p[0] == '-' && p[1] == '-') {
            /* a comment, to the end of its line: its words and quotes
             * ("the agent's") are prose */
            size_t n = strcspn(p, "\n");
            memcpy(o, p, n);
            o += n;
            p += n;
            continue;
        }
        if (*p == '\'')
            quoted = !quoted;
        if (!quoted && word_at(p, sql, "INTEGER")) {
            memcpy(o, "BIGINT", 6);
            o += 6;
            p += 7;
        } else if (!quoted && word_at(p, sql, "WITHOUT ROWID")) {
            p += 13;
        } else {
            *o++ = *p++;
        }
    }
    if (out)
        *o = '\0';
    return out;
}

static const gps_store__engine engine = {
    .name = "postgresql",
    .conn_open = pg_open,
    .conn_close = pg_close,
    .prepare = pg_prepare,
    .exec = pg_exec,
    .script = pg_script,
    .errmsg = pg_errmsg,
    .migration_sql = pg_migration_sql,
    .begin_sql = "BEGIN",
    /* Two servers starting on one fresh DB: the second waits for the
     * first's migration, then finds it applied. */
    .migrate_begin_sql = "BEGIN; LOCK TABLE schema_migrations IN SHARE ROW EXCLUSIVE MODE",
};

const gps_store__engine *gps_store__pg(void) { return &engine; }

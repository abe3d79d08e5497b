/*
 * store_op.c: an op's values and the bind spec that builds them, rows
 * copied out of an engine, and a connection's statements (stmt_exec, the
 * one way a statement runs).
 */
#include "server/store/store_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Values and ops                                                           */
/* ------------------------------------------------------------------------ */

void store_rows_free(op *o)
{
    for (size_t i = 0; i < o->nrows; i++)
        free(o->rows[i]);
    free(o->rows);
    o->rows = NULL;
    o->nrows = 0;
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

static void b_textn(opb *b, const char *s, size_t len)
{
    val *v = b_slot(b);
    if (v && s) {
        v->t = V_TEXT;
        v->s = s;
        v->len = len;
    }
}

static void b_int(opb *b, int64_t i)
{
    val *v = b_slot(b);
    if (v) {
        v->t = V_INT;
        v->i = i;
    }
}

/* The values of statement kind, from a bind spec: one character per
 * parameter ?1, ?2, ... in order, each taking its argument(s):
 *   t  const char *           text (NULL binds NULL)
 *   T  const char *, size_t   text of that length (NULL binds NULL)
 *   i  int64_t                integer
 *   n  int64_t                integer, NULL when negative ("unchanged", "unknown")
 *   z  int64_t                integer, NULL when zero ("never", "none")
 *   j  const json_t *         compact JSON text (NULL binds NULL)
 *   -                         NULL (no argument)
 * Integers are read as int64_t: callers cast. Text is borrowed until
 * store_b_pack or store_b_release; JSON is serialised here (owned by b). */
void store_b_vspec(opb *b, int kind, const char *spec, va_list ap)
{
    memset(b, 0, sizeof(*b));
    b->kind = kind;
    for (const char *c = spec; *c; c++) {
        switch (*c) {
        case 't': {
            const char *t = va_arg(ap, const char *);
            b_textn(b, t, t ? strlen(t) : 0);
            break;
        }
        case 'T': {
            const char *t = va_arg(ap, const char *);
            size_t len = va_arg(ap, size_t);
            b_textn(b, t, len);
            break;
        }
        case 'i':
        case 'n':
        case 'z': {
            int64_t i = va_arg(ap, int64_t);
            if ((*c == 'n' && i < 0) || (*c == 'z' && i == 0))
                b_slot(b);
            else
                b_int(b, i);
            break;
        }
        case 'j': {
            const json_t *j = va_arg(ap, const json_t *);
            /* gp_json_dump_append writes json_dumps' bytes at a fraction of
             * its cost: a stored Responses reply (3 values, the loop's
             * thread) was ~200,000 instructions through json_dumps. */
            gp_buf d;
            gp_buf_init(&d);
            char *txt = NULL;
            if (j && gp_json_dump_append(&d, j) == 0 && gp_buf_append(&d, "", 0) == 0)
                txt = gp_buf_steal(&d);
            gp_buf_free(&d);
            if (j && !txt)
                b->oom = true;
            if (txt)
                b->owned[b->nowned++] = txt;
            b_textn(b, txt, txt ? strlen(txt) : 0);
            break;
        }
        default:   /* '-' */
            b_slot(b);
            break;
        }
    }
}

void store_b_spec(opb *b, int kind, const char *spec, ...)
{
    va_list ap;
    va_start(ap, spec);
    store_b_vspec(b, kind, spec, ap);
    va_end(ap);
}

void store_b_release(opb *b)
{
    for (int i = 0; i < b->nowned; i++)
        free(b->owned[i]);
    b->nowned = 0;
}

/* Pack the builder into one allocation (new op, caller owns). NULL on
 * ENOMEM. Releases the builder's temporaries in both cases. */
op *store_b_pack(opb *b)
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
    store_b_release(b);
    return o;
}

/* Copy a row an engine lent (new, caller frees). NULL on ENOMEM. */
row *store_row_dup(const row *src)
{
    int n = src->n;
    size_t total = sizeof(row) + (size_t)n * sizeof(val);
    for (int i = 0; i < n; i++)
        if (src->v[i].t == V_TEXT)
            total += src->v[i].len + 1;
    row *r = calloc(1, total);
    if (!r)
        return NULL;
    r->n = n;
    char *p = (char *)&r->v[n];
    for (int i = 0; i < n; i++) {
        r->v[i] = src->v[i];
        if (src->v[i].t == V_TEXT) {
            if (src->v[i].len)
                memcpy(p, src->v[i].s, src->v[i].len);
            p[src->v[i].len] = '\0';
            r->v[i].s = p;
            p += src->v[i].len + 1;
        }
    }
    return r;
}

/* ------------------------------------------------------------------------ */
/* The store                                                                */
/* ------------------------------------------------------------------------ */

void store_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Is statement k of the table prepared on c (on first use)? false when
 * this DB's schema cannot run it (errmsg(c) says why, on the first try). */
bool store_conn_stmt(conn *c, int k)
{
    if (!c->tried[k]) {
        c->tried[k] = true;
        c->ok[k] = c->eng->prepare(c->h, k, store_stmts[k].sql, store_stmts[k].pg) == 0;
    }
    return c->ok[k];
}

void store_conn_close(conn *c)
{
    if (c->h)
        c->eng->conn_close(c->h);
    const gps_store__engine *eng = c->eng;
    memset(c, 0, sizeof(*c));
    c->eng = eng;
}

const char *store_conn_err(conn *c) { return c->h ? c->eng->errmsg(c->h) : "no connection"; }

/* The one way a statement runs, on the DB thread and the owner thread
 * alike: prepare k if needed, bind v[0..nv) to ?1..?nv, each row to each
 * (NULL: rows are ignored). 0 (every row, or *stopped = each's non-zero
 * value) or -1 (store_conn_err says why). *changes (may be NULL): rows changed. */
int store_stmt_exec(conn *c, int k, const val *v, int nv, row_fn each, void *arg, int *stopped,
                    int64_t *changes)
{
    int64_t ch = 0;
    *stopped = 0;
    if (!store_conn_stmt(c, k))
        return -1;
    int rc = c->eng->exec(c->h, k, v, nv, each, arg, stopped, &ch);
    if (changes)
        *changes = ch;
    return rc;
}

int store_exec_simple(conn *c, const char *sql, char *err, size_t errlen)
{
    return c->eng->script(c->h, sql, err, errlen);
}

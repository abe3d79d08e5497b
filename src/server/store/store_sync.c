/*
 * store_sync.c: start-up loads and CLI writes, run on the owner thread's
 * own connection (not the DB thread's).
 */
#include "server/store/store_priv.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Synchronous: start-up loads and CLI writes, on the owner thread          */
/* ------------------------------------------------------------------------ */

static conn *sync_conn(gps_store *s, char *err, size_t errlen)
{
    if (!s->r.h)
        s->r.h = s->eng->conn_open(s->target, s->path, s->busy_timeout_ms, K_COUNT, err,
                                 errlen);
    return s->r.h ? &s->r : NULL;
}

void gps_store_sync_close(gps_store *s)
{
    if (s)
        store_conn_close(&s->r);
}

/* Run statement kind with its values by bind spec on the owner thread's
 * connection, each row to each (may be NULL). Returns 0, each's non-zero
 * value (it stopped; it set err if it failed), or -1 with err
 * ("<path>: <what>: <SQLite's message>"). */
static int sync_exec(gps_store *s, row_fn each, void *arg, const char *what, char *err,
                     size_t errlen, int kind, const char *spec, ...)
{
    conn *c = sync_conn(s, err, errlen);
    if (!c)
        return -1;
    opb b;
    va_list ap;
    va_start(ap, spec);
    store_b_vspec(&b, kind, spec, ap);
    va_end(ap);
    int ret = -1, stopped = 0;
    if (b.oom)
        store_seterr(err, errlen, "%s: %s: out of memory", s->path, what);
    else if (store_stmt_exec(c, kind, b.v, b.nv, each, arg, &stopped, &s->sync_changes) != 0)
        store_seterr(err, errlen, "%s: %s: %s", s->path, what, store_conn_err(c));
    else
        ret = stopped;
    store_b_release(&b);
    return ret;
}

/* ---- agents ---- */

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

/* One agent_models row into t; 1 (stop) on ENOMEM. An alias list that is
 * not JSON (a damaged row) reads as none, as before; out of memory stops
 * the load instead: a model restored without its aliases would answer
 * "not found" for them. */
static int model_row(void *arg, const row *src)
{
    models_tmp *t = arg;
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
    row *r = m && rows && al ? store_row_dup(src) : NULL;
    if (!r)
        return 1;
    t->rows[k] = r;
    t->aliases[k] = NULL;
    t->n++;
    bool oom;
    json_t *aj = store_col_json(r, 1, 0, &oom);
    if (oom)
        return 1;
    /* keep holds the alias strings the row points to: kept first, so that
     * none is pointed to after a failed append freed it. */
    if (aj && json_array_append_new(t->keep, aj) != 0)
        return 1;
    size_t na = 0;
    if (json_is_array(aj) && json_array_size(aj)) {
        t->aliases[k] = calloc(json_array_size(aj), sizeof(char *));
        if (!t->aliases[k])
            return 1;
        for (size_t i = 0; i < json_array_size(aj); i++)
            if (json_is_string(json_array_get(aj, i)))
                t->aliases[k][na++] = json_string_value(json_array_get(aj, i));
    }
    t->m[k] = (gps_store_model_row){
        .model = rs(r, 0) ? rs(r, 0) : "",
        .aliases = t->aliases[k],
        .n_aliases = na,
        .quantization = rs(r, 2),
        .context_length = ri(r, 3, 0),
        .vram_bytes = ri(r, 4, 0),
        .loaded = ri(r, 5, 0) != 0,
    };
    return 0;
}

typedef struct load_ctx {
    gps_store *s;
    union {                  /* the caller's callback, of the load's type */
        gps_store_agent_fn agent;
        gps_store_key_fn key;
        gps_store_job_load_fn job;
        gps_store_usage_fn usage;
        gps_store_pin_fn pin;
        gps_store_deploy_fn deploy;
        gps_store_replica_fn replica;
    } cb;
    void *arg;
    char *err;
    size_t errlen;
    bool extras;             /* keys: the 0003 columns are there */
    int64_t day;             /* usage */
} load_ctx;

static int agent_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    /* A copy: the models are read (another statement) before the callback. */
    row *r = store_row_dup(src);
    if (!r) {
        store_seterr(c->err, c->errlen, "out of memory");
        return -1;
    }
    gps_store_agent_info a = {
        .id = rs(r, 0),
        .name = rs(r, 1),
        .version = rs(r, 2),
        .platform = rs(r, 3),
        .state = rs(r, 4),
        .key_id = rs(r, 5),
        .first_seen = ri(r, 8, 0),
        .last_seen = ri(r, 9, 0),
    };
    /* Labels that are not a JSON object, or facts that are not JSON (a
     * damaged row), read as none, as before. Out of memory fails the load
     * as a failed step does: an agent restored with {} for the labels it
     * has would be another agent. */
    bool oom_labels, oom_facts;
    a.labels = store_col_json(r, 6, 0, &oom_labels);
    if (!json_is_object(a.labels) && !oom_labels) {
        json_decref(a.labels);
        a.labels = json_object();
        oom_labels = !a.labels;
    }
    a.facts = store_col_json(r, 7, JSON_DECODE_ANY, &oom_facts);
    models_tmp mt = {.keep = json_array()};
    int ret = -1;
    if (!a.id) {
        store_seterr(c->err, c->errlen, "%s: agent row without id", c->s->path);
    } else if (!mt.keep || oom_labels || oom_facts) {
        store_seterr(c->err, c->errlen, "out of memory");
    } else {
        /* -1: err says why */
        int mrc = sync_exec(c->s, model_row, &mt, "reading agent_models", c->err, c->errlen,
                            K_LOAD_MODELS, "t", a.id);
        if (mrc > 0)
            store_seterr(c->err, c->errlen, "out of memory");
        if (mrc == 0) {
            a.models = mt.m;
            a.n_models = mt.n;
            ret = c->cb.agent(c->arg, &a);
        }
    }
    models_tmp_free(&mt);
    json_decref(a.labels);
    json_decref(a.facts);
    free(r);
    return ret;
}

int gps_store_load_agents(gps_store *s, gps_store_agent_fn cb, void *arg, char *err,
                          size_t errlen)
{
    load_ctx c = {.s = s, .cb.agent = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, agent_row, &c, "reading agents", err, errlen, K_LOAD_AGENTS, "");
}

/* ---- keys ---- */

static int key_row(void *arg, const row *r)
{
    load_ctx *c = arg;
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
        .rpm = c->extras ? ri(r, 9, 0) : 0,
        .tokens_per_day = c->extras ? ri(r, 10, 0) : 0,
        .max_concurrent = c->extras ? ri(r, 11, 0) : 0,
        .max_uses = c->extras ? ri(r, 12, 0) : 0,
        .uses = c->extras ? ri(r, 13, 0) : 0,
    };
    return k.id && k.hash && k.role ? c->cb.key(c->arg, &k) : 0;
}

int gps_store_load_keys(gps_store *s, gps_store_key_fn cb, void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.key = cb, .arg = arg, .err = err, .errlen = errlen};
    conn *sc = sync_conn(s, err, errlen);
    if (!sc)
        return -1;
    /* A DB migrated by a custom set without 0003 has no limit columns:
     * then every key loads as unlimited. */
    c.extras = store_conn_stmt(sc, K_LOAD_KEYS);
    return sync_exec(s, key_row, &c, "reading api_keys", err, errlen,
                     c.extras ? K_LOAD_KEYS : K_LOAD_KEYS_BASE, "");
}

int gps_store_key_insert_sync(gps_store *s, const gps_store_key_row *row_in, char *err,
                              size_t errlen)
{
    if (!row_in || !row_in->id || !row_in->hash || !row_in->role) {
        store_seterr(err, errlen, "key row needs id, hash and role");
        return -1;
    }
    bool extras = store_key_row_has_extras(row_in);
    /* Key and limits in one transaction: a key never exists without the
     * limits it was created with. */
    conn *c = extras ? sync_conn(s, err, errlen) : NULL;
    char msg[256] = "";
    if (extras && (!c || store_exec_simple(c, s->eng->begin_sql, msg, sizeof(msg)) != 0)) {
        if (c)
            store_seterr(err, errlen, "%s: inserting key: %s", s->path, msg);
        return -1;
    }
    int ret = sync_exec(s, NULL, NULL, "inserting key", err, errlen, K_KEY_INSERT, KEY_ROW_SPEC,
                        KEY_ROW_ARGS(row_in));
    if (ret == 0 && extras)
        ret = sync_exec(s, NULL, NULL, "setting key limits", err, errlen, K_KEY_LIMITS,
                        KEY_LIMITS_SPEC, row_in->id, row_in->rpm, row_in->tokens_per_day,
                        row_in->max_concurrent, row_in->max_uses);
    if (extras && store_exec_simple(c, ret == 0 ? "COMMIT" : "ROLLBACK", msg, sizeof(msg)) != 0 &&
        ret == 0) {
        store_seterr(err, errlen, "%s: inserting key: %s", s->path, msg);
        ret = -1;
    }
    return ret;
}

int gps_store_key_revoke_sync(gps_store *s, const char *key_id, int64_t revoked_at, char *err,
                              size_t errlen)
{
    if (sync_exec(s, NULL, NULL, "revoking key", err, errlen, K_KEY_REVOKE, "ti", key_id,
                  revoked_at) != 0)
        return -1;
    return s->sync_changes > 0 ? 0 : 1;
}

/* ---- unfinished jobs, usage ---- */

static int job_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    /* A copy: the event log is read (another statement) before the callback. */
    row *r = store_row_dup(src);
    if (!r) {
        store_seterr(c->err, c->errlen, "out of memory");
        return -1;
    }
    gps_store_job_info ji;
    json_t *req = NULL;
    int ret = -1, erc;
    /* Out of memory, or the event log's failed step, fails the load (the
     * job is not restored from a request or a log that differs from what
     * was stored); job_events itself is optional (migration 0002). */
    if (store_job_info_from_row(r, &ji, &req) < 0)
        store_seterr(c->err, c->errlen, "%s: reading jobs: out of memory", c->s->path);
    else if ((erc = store_events_collect(&c->s->r, ji.id, &ji.events)) < 0)
        store_seterr(c->err, c->errlen, "%s: reading job_events of %s: %s", c->s->path, ji.id,
                     erc == -2 ? "out of memory" : store_conn_err(&c->s->r));
    else
        ret = c->cb.job(c->arg, &ji);
    json_decref(req);
    json_decref(ji.events);
    free(r);
    return ret;
}

int gps_store_load_unfinished_jobs(gps_store *s, gps_store_job_load_fn cb, void *arg, char *err,
                                   size_t errlen)
{
    load_ctx c = {.s = s, .cb.job = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, job_row, &c, "reading jobs", err, errlen, K_LOAD_JOBS, "");
}

static int usage_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    const char *id = rs(r, 0);
    if (!id)
        return 0;
    return c->cb.usage(c->arg, id, c->day, ri(r, 1, 0), ri(r, 2, 0), ri(r, 3, 0), ri(r, 4, 0));
}

int gps_store_load_usage(gps_store *s, int64_t day, gps_store_usage_fn cb, void *arg, char *err,
                         size_t errlen)
{
    load_ctx c = {.s = s, .cb.usage = cb, .arg = arg, .err = err, .errlen = errlen, .day = day};
    return sync_exec(s, usage_row, &c, "reading key_usage", err, errlen, K_LOAD_USAGE, "i", day);
}

/* ---- model pins ---- */

int gps_store_pin_set(gps_store *s, const char *name, const char *sha256, int64_t created_at,
                      const char *created_by)
{
    if (!name || !sha256)
        return -1;
    return store_write_op(s, K_PIN_SET, "ttit", name, sha256, created_at, created_by);
}

int gps_store_pin_delete(gps_store *s, const char *name)
{
    if (!name)
        return -1;
    return store_write_op(s, K_PIN_DELETE, "t", name);
}

/* status_write: with the deployments, below. */
static int status_write(gps_store *s, op *o, gps_store_status_fn cb, void *arg);

int gps_store_pin_set_async(gps_store *s, const char *name, const char *sha256,
                            int64_t created_at, const char *created_by, gps_store_status_fn cb,
                            void *arg)
{
    if (!s || !s->ev_wake || !name || !sha256 || !cb)
        return -1;
    return status_write(s, store_read_op(K_PIN_SET, "ttit", name, sha256, created_at, created_by),
                        cb, arg);
}

int gps_store_pin_delete_async(gps_store *s, const char *name, gps_store_status_fn cb, void *arg)
{
    if (!s || !s->ev_wake || !name || !cb)
        return -1;
    return status_write(s, store_read_op(K_PIN_DELETE, "t", name), cb, arg);
}

bool gps_store_has_pins(gps_store *s)
{
    return s && s->w.ok[K_PIN_SET] && s->w.ok[K_PIN_DELETE];
}

static int pin_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    const char *name = rs(r, 0), *sha = rs(r, 1);
    if (!name || !sha)
        return 0;
    return c->cb.pin(c->arg, name, sha, ri(r, 2, 0), rs(r, 3));
}

int gps_store_load_pins(gps_store *s, gps_store_pin_fn cb, void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.pin = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, pin_row, &c, "reading model_pins", err, errlen, K_LOAD_PINS, "");
}

/* ---- deployments ---- */

int gps_store_deploy_put(gps_store *s, const gps_store_deploy_row *d)
{
    if (!d || !d->name || !d->source)
        return -1;
    return store_write_op(s, K_DEPLOY_PUT, "tttitiit", d->name, d->source, d->sha256,
                          (int64_t)d->replicas, d->labels_json ? d->labels_json : "{}",
                          (int64_t)d->bytes, d->created_at, d->created_by);
}

int gps_store_deploy_delete(gps_store *s, const char *name)
{
    if (!name)
        return -1;
    return store_write_op(s, K_DEPLOY_DELETE, "t", name);
}

/* An operator's change: its caller waits for the outcome (not dropped,
 * status_cb: committed at once and delivered as a read is). */
static int status_write(gps_store *s, op *o, gps_store_status_fn cb, void *arg)
{
    if (!o)
        return -1;
    o->status_cb = cb;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

int gps_store_deploy_put_async(gps_store *s, const gps_store_deploy_row *d,
                               gps_store_status_fn cb, void *arg)
{
    if (!s || !s->ev_wake || !d || !d->name || !d->source || !cb)
        return -1;
    return status_write(s,
                        store_read_op(K_DEPLOY_PUT, "tttitiit", d->name, d->source, d->sha256,
                                      (int64_t)d->replicas,
                                      d->labels_json ? d->labels_json : "{}", (int64_t)d->bytes,
                                      d->created_at, d->created_by),
                        cb, arg);
}

int gps_store_deploy_delete_async(gps_store *s, const char *name, gps_store_status_fn cb,
                                  void *arg)
{
    if (!s || !s->ev_wake || !name || !cb)
        return -1;
    return status_write(s, store_read_op(K_DEPLOY_DELETE, "t", name), cb, arg);
}

/* Either table there: the schema has migration 0007, and a load that then
 * fails (the other table gone) is a failure, not a server without
 * deployments (whose agents would unload what they hold). */
bool gps_store_has_deployments(gps_store *s)
{
    return s && (s->w.ok[K_DEPLOY_PUT] || s->w.ok[K_REPLICA_PUT]);
}

int gps_store_replica_put(gps_store *s, const gps_store_replica_row *r)
{
    if (!r || !r->deployment || !r->agent_id || !r->state)
        return -1;
    return store_write_op(s, K_REPLICA_PUT, "ttttiiii", r->deployment, r->agent_id, r->state,
                          r->reason, (int64_t)r->bytes, (int64_t)r->total, (int64_t)r->rate,
                          r->updated_at);
}

int gps_store_replica_delete(gps_store *s, const char *deployment, const char *agent_id)
{
    if (!deployment || !agent_id)
        return -1;
    return store_write_op(s, K_REPLICA_DELETE, "tt", deployment, agent_id);
}

static int deploy_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    gps_store_deploy_row d = {
        .name = rs(r, 0),
        .source = rs(r, 1),
        .sha256 = rs(r, 2),
        .replicas = (int)ri(r, 3, 0),
        .labels_json = rs(r, 4),
        .bytes = ri(r, 5, 0),
        .created_at = ri(r, 6, 0),
        .created_by = rs(r, 7),
    };
    if (!d.name || !d.source)
        return 0;
    return c->cb.deploy(c->arg, &d);
}

static int replica_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    gps_store_replica_row r = {
        .deployment = rs(src, 0),
        .agent_id = rs(src, 1),
        .state = rs(src, 2),
        .reason = rs(src, 3),
        .bytes = ri(src, 4, 0),
        .total = ri(src, 5, 0),
        .rate = ri(src, 6, 0),
        .updated_at = ri(src, 7, 0),
    };
    if (!r.deployment || !r.agent_id || !r.state)
        return 0;
    return c->cb.replica(c->arg, &r);
}

int gps_store_load_deployments(gps_store *s, gps_store_deploy_fn dcb, gps_store_replica_fn rcb,
                               void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.deploy = dcb, .arg = arg, .err = err, .errlen = errlen};
    if (sync_exec(s, deploy_row, &c, "reading deployments", err, errlen, K_LOAD_DEPLOYS, "") < 0)
        return -1;
    c.cb.replica = rcb;
    return sync_exec(s, replica_row, &c, "reading deployment_replicas", err, errlen,
                     K_LOAD_REPLICAS, "");
}

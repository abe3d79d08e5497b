/* deploy: see deploy.h. */
#include "server/fleet/deploy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/gps_strmap.h"
#include "server/store/store.h"

typedef enum { R_ASSIGNED, R_DOWNLOADING, R_LOADING, R_READY, R_FAILED, R_NSTATES } rstate;

static const char *const rstate_names[R_NSTATES] = {"assigned", "downloading", "loading",
                                                    "ready", "failed"};

static int rstate_parse(const char *s)
{
    for (int i = 0; s && i < R_NSTATES; i++)
        if (strcmp(s, rstate_names[i]) == 0)
            return i;
    return -1;
}

/* One replica: where it was placed and what its agent last said. */
typedef struct replica {
    char agent_id[37];
    rstate state;
    char reason[256];          /* "" none */
    int64_t bytes, total, rate; /* download: bytes so far of total, bytes/s */
    int64_t updated_at;        /* wall ms of the last state change */
} replica;

typedef struct deployment {
    char *name, *source, *sha256;  /* sha256 NULL: not checked */
    int replicas;                  /* desired */
    json_t *labels;                /* object (owned) */
    int64_t bytes;                 /* file size, 0 unknown */
    int64_t created_at;
    char *created_by;              /* may be NULL */
    replica *r;
    size_t nr, cap;
    json_t *refusals;              /* the last placement's refusals while short, else NULL */
} deployment;

/* An admin change waiting for its row's commit (gps_store_deploy_put_async
 * or _delete_async): applied to the table in change_done, or dropped when
 * the write failed. Owned by the store's callback; the module only lists
 * it, so that a second change of the name waits, and a write of its own
 * (a size learnt, a replica's state) neither undoes nor resurrects it. */
typedef enum { C_CREATE, C_SCALE, C_REMOVE } change_kind;
typedef struct change {
    struct change *next;
    gps_deploy *d;                 /* NULL once the module is freed */
    change_kind kind;
    char *name;
    deployment *p;                 /* C_CREATE: built, not in the table yet */
    int replicas;                  /* C_SCALE: the new count */
    gps_deploy_done_fn done;
    void *arg;
} change;

/* What an agent said in its poll's "deploy" object. */
typedef struct agent_dep {
    int capacity;                  /* models it may hold */
    int64_t memory_free, disk_free;
} agent_dep;

struct gps_deploy {
    registry *reg;
    struct gps_store *store;
    uint64_t grace_ms;
    uint64_t started_ms;
    deployment **v;
    size_t n, cap;                 /* cap >= n + creating: a commit never allocates */
    size_t creating;               /* C_CREATE changes waiting */
    change *changes;               /* waiting for their commit */
    smap agents;                   /* agent id -> agent_dep (agents that take deployments) */
};

/* ------------------------------------------------------------------ */
/* Table                                                               */
/* ------------------------------------------------------------------ */

static void dep_free(deployment *p)
{
    if (!p)
        return;
    free(p->name);
    free(p->source);
    free(p->sha256);
    free(p->created_by);
    json_decref(p->labels);
    json_decref(p->refusals);
    free(p->r);
    free(p);
}

static deployment *dep_find(const gps_deploy *d, const char *name, size_t *idx)
{
    for (size_t i = 0; name && i < d->n; i++)
        if (strcmp(d->v[i]->name, name) == 0) {
            if (idx)
                *idx = i;
            return d->v[i];
        }
    return NULL;
}

static replica *replica_find(deployment *p, const char *agent_id)
{
    for (size_t i = 0; i < p->nr; i++)
        if (strcmp(p->r[i].agent_id, agent_id) == 0)
            return &p->r[i];
    return NULL;
}

static replica *replica_add(deployment *p, const char *agent_id, rstate st, int64_t now_wall)
{
    if (p->nr == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 4;
        replica *nr = realloc(p->r, nc * sizeof *nr);
        if (!nr)
            return NULL;
        p->r = nr;
        p->cap = nc;
    }
    replica *r = &p->r[p->nr++];
    memset(r, 0, sizeof *r);
    snprintf(r->agent_id, sizeof r->agent_id, "%s", agent_id);
    r->state = st;
    r->updated_at = now_wall;
    return r;
}

/* The labels as the row holds them: compact, keys sorted. NULL when out of
 * memory: jansson's own dump can then leave a label out and succeed, and
 * the deployment restored from that row would be placed on agents its
 * labels exclude. */
static char *labels_text(const json_t *labels)
{
    return gp_json_dumps_checked(labels, JSON_COMPACT | JSON_SORT_KEYS);
}

static change *change_of(const gps_deploy *d, const char *name)
{
    for (change *c = d->changes; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

/* The row of p, its labels as labels_text made them; replicas: the count
 * to write. */
static gps_store_deploy_row dep_row(const deployment *p, int replicas, const char *labels)
{
    return (gps_store_deploy_row){p->name, p->source, p->sha256, replicas, labels,
                                  p->bytes, p->created_at, p->created_by};
}

/* A change the server made itself (a download's size learnt): not written
 * when out of memory, logged as any failed write-through is. With a scale
 * waiting for its commit the row gets the new count (it lands after the
 * scale's row and would otherwise undo it); with a removal waiting, none
 * (it would put the row back). */
static void persist_dep(gps_deploy *d, const deployment *p)
{
    if (!d->store)
        return;
    const change *c = change_of(d, p->name);
    if (c && c->kind == C_REMOVE)
        return;
    char *labels = labels_text(p->labels);
    gps_store_deploy_row row = dep_row(p, c ? c->replicas : p->replicas, labels);
    if (!labels)
        gp_log_warn("deploy_store_failed", "deployment %s not written to the DB: out of memory",
                    p->name);
    else if (gps_store_deploy_put(d->store, &row) < 0)
        gp_log_warn("deploy_store_failed", "deployment %s not written to the DB", p->name);
    free(labels);
}

/* A replica's row (the server's own change: a failure is logged). None
 * while its deployment's removal waits: the row would name a deployment
 * being deleted. */
static void persist_replica(gps_deploy *d, const deployment *p, const replica *r)
{
    const change *c = d->store ? change_of(d, p->name) : NULL;
    if (!d->store || (c && c->kind == C_REMOVE))
        return;
    gps_store_replica_row row = {p->name, r->agent_id, rstate_names[r->state],
                                 r->reason[0] ? r->reason : NULL, r->bytes, r->total, r->rate,
                                 r->updated_at};
    if (gps_store_replica_put(d->store, &row) < 0)
        gp_log_warn("deploy_store_failed", "replica of %s on %s not written to the DB", p->name,
                    r->agent_id);
}

/* Drop replica i of p (it leaves the agent's desired set: the agent
 * unloads it at its next poll). */
static void replica_drop(gps_deploy *d, deployment *p, size_t i)
{
    if (d->store && gps_store_replica_delete(d->store, p->name, p->r[i].agent_id) < 0)
        gp_log_warn("deploy_store_failed", "removal of a replica of %s not written to the DB",
                    p->name);
    memmove(&p->r[i], &p->r[i + 1], (p->nr - i - 1) * sizeof p->r[0]);
    p->nr--;
}

static size_t active_count(const deployment *p)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nr; i++)
        n += p->r[i].state != R_FAILED;
    return n;
}

static int on_agent(const gps_deploy *d, const char *agent_id)
{
    int n = 0;
    for (size_t i = 0; i < d->n; i++) {
        replica *r = replica_find(d->v[i], agent_id);
        n += r && r->state != R_FAILED;
    }
    return n;
}

gps_deploy *gps_deploy_new(registry *reg, struct gps_store *store, uint64_t grace_ms,
                           uint64_t now_ms)
{
    gps_deploy *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->reg = reg;
    d->store = store;
    d->grace_ms = grace_ms;
    d->started_ms = now_ms;
    return d;
}

void gps_deploy_free(gps_deploy *d)
{
    if (!d)
        return;
    /* Changes still waiting are the store's to finish (at its close):
     * they find the module gone. */
    for (change *c = d->changes; c; c = c->next)
        c->d = NULL;
    for (size_t i = 0; i < d->n; i++)
        dep_free(d->v[i]);
    free(d->v);
    smap_free(&d->agents, free);
    free(d);
}

/* ------------------------------------------------------------------ */
/* Validation                                                          */
/* ------------------------------------------------------------------ */

/* Printable UTF-8 of 1..max bytes (gps_agent_text_ok: no controls, no
 * bidi overrides: it reaches operators' terminals), none of the bytes in
 * `bad`. */
static bool text_ok(const char *s, size_t max, const char *bad)
{
    size_t n = s ? strlen(s) : 0;
    if (!s || !gps_agent_text_ok(s, n, max))
        return false;
    for (size_t i = 0; i < n; i++)
        if (strchr(bad, s[i]))
            return false;
    return true;
}

#define FAIL(p, ...)                                                                           \
    do {                                                                                       \
        snprintf(msg, msglen, __VA_ARGS__);                                                    \
        *param = (p);                                                                          \
        return -1;                                                                             \
    } while (0)

static int parse_labels(const json_t *l, char *msg, size_t msglen, const char **param)
{
    if (!l || json_is_null(l))
        return 0;
    if (!json_is_object(l) || json_object_size(l) > 64)
        FAIL("labels", "'labels' must be an object of at most 64 string labels");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)l, k, v)
    {
        if (!text_ok(k, 256, "") || !json_is_string(v) || !text_ok(json_string_value(v), 256, ""))
            FAIL("labels", "'labels': each name and value must be 1 to 256 printable bytes");
    }
    return 0;
}

int gps_deploy_parse(const json_t *body, gps_deploy_spec *spec, char *msg, size_t msglen,
                     const char **param)
{
    memset(spec, 0, sizeof *spec);
    spec->replicas = 1;
    spec->name = json_string_value(json_object_get(body, "name"));
    spec->source = json_string_value(json_object_get(body, "source"));
    /* The name is a model id clients use and a path segment of
     * /admin/deployments/{name}. */
    if (!text_ok(spec->name, 128, " /?#%\\\"'"))
        FAIL("name", "'name' must be 1 to 128 printable bytes without spaces, '/', '?', '#', "
                     "'%%' or quotes (it is the model name clients use)");
    const char *src = spec->source;
    if (!text_ok(src, 2048, " \"'\\") ||
        (strncmp(src, "http://", 7) != 0 && strncmp(src, "https://", 8) != 0 &&
         strncmp(src, "hf:", 3) != 0))
        FAIL("source", "'source' must be an http:// or https:// URL or "
                       "hf:OWNER/REPO/FILE.gguf[@REVISION] (at most 2048 bytes)");
    const json_t *rv = json_object_get(body, "replicas");
    if (rv && !json_is_null(rv)) {
        if (!json_is_integer(rv) || json_integer_value(rv) < 0 ||
            json_integer_value(rv) > GPS_DEPLOY_REPLICAS_MAX)
            FAIL("replicas", "'replicas' must be an integer from 0 to %d",
                 GPS_DEPLOY_REPLICAS_MAX);
        spec->replicas = (int)json_integer_value(rv);
    }
    const json_t *sv = json_object_get(body, "sha256");
    if (sv && !json_is_null(sv)) {
        const char *s = json_string_value(sv);
        if (!s || strlen(s) != 64 || strspn(s, "0123456789abcdefABCDEF") != 64)
            FAIL("sha256", "'sha256' must be 64 hex digits");
        for (int i = 0; i <= 64; i++)
            spec->sha_buf[i] = (char)(s[i] >= 'A' && s[i] <= 'F' ? s[i] + 32 : s[i]);
        spec->sha256 = spec->sha_buf;
    }
    const json_t *bv = json_object_get(body, "bytes");
    if (bv && !json_is_null(bv)) {
        if (!json_is_integer(bv) || json_integer_value(bv) < 0 ||
            json_integer_value(bv) > (1LL << 50))
            FAIL("bytes", "'bytes' must be the file size, an integer from 0 to 2^50");
        spec->bytes = json_integer_value(bv);
    }
    spec->labels = json_object_get(body, "labels");
    if (parse_labels(spec->labels, msg, msglen, param) < 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Admin changes and the start-up load                                 */
/* ------------------------------------------------------------------ */

/* A deployment, not in the table yet (labels stolen, NULL: {}). */
static deployment *dep_build(const char *name, const char *source, const char *sha,
                             int replicas, json_t *labels, int64_t bytes, int64_t created_at,
                             const char *created_by)
{
    deployment *p = calloc(1, sizeof *p);
    if (!p) {
        json_decref(labels);
        return NULL;
    }
    p->name = strdup(name);
    p->source = strdup(source);
    p->sha256 = sha ? strdup(sha) : NULL;
    p->created_by = created_by ? strdup(created_by) : NULL;
    p->labels = labels ? labels : json_object();
    p->replicas = replicas;
    p->bytes = bytes;
    p->created_at = created_at;
    if (!p->name || !p->source || (sha && !p->sha256) || (created_by && !p->created_by) ||
        !p->labels) {
        dep_free(p);
        return NULL;
    }
    return p;
}

/* Room in the table for one more than the table and the creations
 * waiting hold. 0 or -1 (ENOMEM). */
static int dep_reserve(gps_deploy *d)
{
    if (d->n + d->creating < d->cap)
        return 0;
    size_t nc = d->cap ? d->cap * 2 : 8;
    deployment **nv = realloc(d->v, nc * sizeof *nv);
    if (!nv)
        return -1;
    d->v = nv;
    d->cap = nc;
    return 0;
}

static deployment *dep_new(gps_deploy *d, const char *name, const char *source, const char *sha,
                           int replicas, json_t *labels /* stolen */, int64_t bytes,
                           int64_t created_at, const char *created_by)
{
    if (d->n + d->creating >= GPS_DEPLOY_MAX || dep_reserve(d) < 0) {
        json_decref(labels);
        return NULL;
    }
    deployment *p = dep_build(name, source, sha, replicas, labels, bytes, created_at,
                              created_by);
    if (p)
        d->v[d->n++] = p;
    return p;
}

static void change_free(change *c)
{
    if (!c)
        return;
    dep_free(c->p);
    free(c->name);
    free(c);
}

static void change_unlink(gps_deploy *d, change *c)
{
    for (change **pp = &d->changes; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return;
        }
}

/* Apply a committed change (no allocation: a creation's place was
 * reserved). */
static void change_apply(gps_deploy *d, change *c)
{
    size_t i;
    deployment *p = dep_find(d, c->name, &i);
    switch (c->kind) {
    case C_CREATE:
        d->v[d->n++] = c->p;
        gp_log_info("deploy_created", "deployment %s: %s, %d replica(s)", c->p->name,
                    c->p->source, c->p->replicas);
        c->p = NULL;
        break;
    case C_SCALE:
        if (!p)
            break; /* (one change of a name at a time: it is there) */
        p->replicas = c->replicas;
        for (size_t k = p->nr; k-- > 0;)
            if (p->r[k].state == R_FAILED)
                replica_drop(d, p, k);
        json_decref(p->refusals);
        p->refusals = NULL;
        gp_log_info("deploy_scaled", "deployment %s: %d replica(s)", p->name, p->replicas);
        break;
    case C_REMOVE:
        if (!p)
            break;
        gp_log_info("deploy_removed", "deployment %s removed (%zu replica(s) unload)", p->name,
                    p->nr);
        dep_free(p);
        memmove(&d->v[i], &d->v[i + 1], (d->n - i - 1) * sizeof d->v[0]);
        d->n--;
        break;
    }
}

/* The store's answer for a change (loop thread; at the store's close,
 * maybe after the module is gone). */
static void change_done(void *arg, int status)
{
    change *c = arg;
    gps_deploy *d = c->d;
    if (d) {
        change_unlink(d, c);
        d->creating -= c->kind == C_CREATE;
        if (status == 0)
            change_apply(d, c);
        else
            gp_log_warn("deploy_store_failed", "deployment %s: the %s was not written to the DB; "
                        "nothing changed", c->name, c->kind == C_CREATE ? "creation"
                        : c->kind == C_SCALE ? "scale" : "removal");
    }
    if (c->done)
        c->done(c->arg, d, d && status == 0 ? 0 : -1);
    change_free(c);
}

/* Queue c's write (p: the deployment whose row it writes, NULL for a
 * removal) and list c; without a store, apply it at once. Takes c. */
static int change_start(gps_deploy *d, change *c, const deployment *p)
{
    if (!d->store) {
        c->d = d;
        change_apply(d, c);
        if (c->done)
            c->done(c->arg, d, 0);
        change_free(c);
        return 0;
    }
    int rc;
    if (c->kind == C_REMOVE) {
        rc = gps_store_deploy_delete_async(d->store, c->name, change_done, c);
    } else {
        char *labels = labels_text(p->labels);
        if (!labels) {
            change_free(c);
            return -1;
        }
        gps_store_deploy_row row = dep_row(p, c->replicas, labels);
        rc = gps_store_deploy_put_async(d->store, &row, change_done, c);
        free(labels);
    }
    if (rc < 0) {
        change_free(c);
        return -5;
    }
    c->d = d;
    c->next = d->changes;
    d->changes = c;
    d->creating += c->kind == C_CREATE;
    return 0;
}

static change *change_new(change_kind kind, const char *name, int replicas,
                          gps_deploy_done_fn done, void *arg)
{
    change *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = strdup(name);
    if (!c->name) {
        free(c);
        return NULL;
    }
    c->kind = kind;
    c->replicas = replicas;
    c->done = done;
    c->arg = arg;
    return c;
}

int gps_deploy_create(gps_deploy *d, const gps_deploy_spec *s, int64_t now_wall,
                      const char *created_by, gps_deploy_done_fn done, void *arg)
{
    if (dep_find(d, s->name, NULL))
        return -2;
    if (change_of(d, s->name))
        return -4;
    if (d->n + d->creating >= GPS_DEPLOY_MAX)
        return -3;
    json_t *labels = s->labels && json_is_object(s->labels) ? json_deep_copy(s->labels)
                                                            : json_object();
    change *c = labels && dep_reserve(d) == 0
                    ? change_new(C_CREATE, s->name, s->replicas, done, arg)
                    : NULL;
    if (!c) {
        json_decref(labels);
        return -1;
    }
    /* The deployment is whole before its row is queued: out of memory is
     * the request's failure with nothing changed. */
    c->p = dep_build(s->name, s->source, s->sha256, s->replicas, labels, s->bytes, now_wall,
                     created_by);
    if (!c->p) {
        change_free(c);
        return -1;
    }
    return change_start(d, c, c->p);
}

int gps_deploy_scale(gps_deploy *d, const char *name, int replicas, gps_deploy_done_fn done,
                     void *arg)
{
    deployment *p = dep_find(d, name, NULL);
    if (!p)
        return change_of(d, name) ? -4 : 1;
    if (change_of(d, name))
        return -4;
    change *c = change_new(C_SCALE, name, replicas, done, arg);
    return c ? change_start(d, c, p) : -1;
}

int gps_deploy_remove(gps_deploy *d, const char *name, gps_deploy_done_fn done, void *arg)
{
    if (!dep_find(d, name, NULL))
        return change_of(d, name) ? -4 : 1;
    if (change_of(d, name))
        return -4;
    change *c = change_new(C_REMOVE, name, 0, done, arg);
    return c ? change_start(d, c, NULL) : -1;
}

/* A deployment row from the store. Labels that are not a JSON object (a
 * row edited by hand) skip the row, as before; out of memory fails the
 * load instead (-1): the deployment is not silently dropped, nor read with
 * a label changed. */
static int load_dep(void *arg, const gps_store_deploy_row *row)
{
    gps_deploy *d = arg;
    const char *text = row->labels_json ? row->labels_json : "{}";
    json_error_t je;
    json_t *labels = gp_json_loadb(text, strlen(text), &je);
    if (!labels && json_error_code(&je) == json_error_out_of_memory)
        return -1;
    if (!json_is_object(labels) || dep_find(d, row->name, NULL)) {
        json_decref(labels);
        gp_log_warn("db_deploy_skipped", "deployments row '%s' is not valid; ignored", row->name);
        return 0;
    }
    if (!dep_new(d, row->name, row->source, row->sha256, row->replicas < 0 ? 0 : row->replicas,
                 labels, row->bytes, row->created_at, row->created_by))
        return -1;
    return 0;
}

static int load_replica(void *arg, const gps_store_replica_row *row)
{
    gps_deploy *d = arg;
    deployment *p = dep_find(d, row->deployment, NULL);
    int st = rstate_parse(row->state);
    if (!p || st < 0 || strlen(row->agent_id) > 36 || replica_find(p, row->agent_id))
        return 0;
    replica *r = replica_add(p, row->agent_id, (rstate)st, row->updated_at);
    if (!r)
        return -1;
    snprintf(r->reason, sizeof r->reason, "%s", row->reason ? row->reason : "");
    r->bytes = row->bytes;
    r->total = row->total;
    r->rate = row->rate;
    return 0;
}

int gps_deploy_load(gps_deploy *d, struct gps_store *store, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    int rc = gps_store_load_deployments(store, load_dep, load_replica, d, err, errlen);
    if (rc == 0)
        return 0;
    /* The store says why when a step failed; a callback's -1 is ENOMEM.
     * What was read goes: part of the table would have its agents unload
     * the rest. */
    if (errlen && !err[0])
        snprintf(err, errlen, "reading deployments: out of memory");
    for (size_t i = 0; i < d->n; i++)
        dep_free(d->v[i]);
    d->n = 0;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Placement and reconciliation                                        */
/* ------------------------------------------------------------------ */

/* An agent gone (dead, offline, or unknown to the registry) for longer
 * than the grace, counted from its transition: its replicas move. The
 * server's own start counts as a sighting, so a restart never moves what
 * agents still hold. */
static bool agent_gone(const gps_deploy *d, const char *agent_id, uint64_t now_ms)
{
    const registry_agent *a = registry_get(d->reg, agent_id);
    uint64_t seen = d->started_ms;
    if (a) {
        if (a->state != REGISTRY_DEAD && a->state != REGISTRY_OFFLINE)
            return false;
        if (a->state_since_ms > seen) /* dead (or offline) since */
            seen = a->state_since_ms;
    }
    return now_ms >= seen + d->grace_ms;
}

static bool labels_match(const deployment *p, const registry_agent *a, char *why, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach(p->labels, k, v)
    {
        const char *have = registry_agent_label(a, k);
        if (!have || strcmp(have, json_string_value(v)) != 0) {
            snprintf(why, n, "labels do not match: wants %s=%s, has %s", k,
                     json_string_value(v), have ? have : "none");
            return false;
        }
    }
    return true;
}

#define MIB(x) ((long long)((x) >> 20))

/* Room for the file: its size plus a tenth (context, scratch) in free
 * memory (the CPU backend) or free VRAM on one GPU (CUDA). Unknown size:
 * the agent checks once it knows (and fails the replica if it must). */
static bool fits(const deployment *p, const agent_dep *ad, const registry_agent *a, char *why,
                 size_t n)
{
    if (p->bytes <= 0)
        return true;
    int64_t need = p->bytes + p->bytes / 10;
    if (ad->memory_free >= need)
        return true;
    long long best = -1;
    for (int i = 0; i < a->hw.n_gpus; i++) {
        if (a->hw.gpus[i].vram_free >= need)
            return true;
        if (a->hw.gpus[i].vram_free > best)
            best = a->hw.gpus[i].vram_free;
    }
    snprintf(why, n, "does not fit: needs about %lld MiB; %lld MiB memory free%s", MIB(need),
             MIB(ad->memory_free), best >= 0 ? "" : ", no GPU");
    if (best >= 0) {
        size_t l = strlen(why);
        snprintf(why + l, n - l, ", at most %lld MiB VRAM free on one GPU", MIB(best));
    }
    return false;
}

typedef struct cand {
    const registry_agent *a;
    int held;
    int64_t mem;
} cand;

typedef struct place_ctx {
    gps_deploy *d;
    deployment *p;
    cand *c;
    size_t nc;
    json_t *refusals;
} place_ctx;

static void refuse(place_ctx *x, const registry_agent *a, const char *why)
{
    json_array_append_new(x->refusals, json_pack("{s:s,s:s,s:s}", "agent_id", a->id, "agent",
                                                 a->name ? a->name : "", "reason", why));
}

/* Is agent a a candidate for x->p? Refusals say why not. */
static void consider(void *ud, registry_agent *a)
{
    place_ctx *x = ud;
    char why[300];
    const agent_dep *ad = smap_get(&x->d->agents, a->id);
    const replica *r = replica_find(x->p, a->id);
    int held = on_agent(x->d, a->id);
    if (!ad) {
        refuse(x, a, "not offered to deployments (started with --model or --upstream, or an "
                     "older agent)");
        return;
    }
    if (r && r->state != R_FAILED)
        return; /* holds one already: not a refusal */
    if (r) {
        snprintf(why, sizeof why, "failed this deployment: %s", r->reason);
        refuse(x, a, why);
    } else if (a->state != REGISTRY_HEALTHY) {
        snprintf(why, sizeof why, "not healthy (%s)", registry_state_name(a->state));
        refuse(x, a, why);
    } else if (!labels_match(x->p, a, why, sizeof why)) {
        refuse(x, a, why);
    } else if (held >= ad->capacity) {
        snprintf(why, sizeof why, "holds %d deployed model(s), its capacity", held);
        refuse(x, a, why);
    } else if (fits(x->p, ad, a, why, sizeof why)) {
        cand *nc = realloc(x->c, (x->nc + 1) * sizeof *nc);
        if (!nc)
            return;
        x->c = nc;
        x->c[x->nc++] = (cand){a, held, ad->memory_free};
    } else {
        refuse(x, a, why);
    }
}

static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->held != b->held)
        return a->held < b->held ? -1 : 1;
    if (a->mem != b->mem)
        return a->mem > b->mem ? -1 : 1;
    return strcmp(a->a->id, b->a->id);
}

static void place(gps_deploy *d, deployment *p, size_t need, int64_t now_wall)
{
    place_ctx x = {d, p, NULL, 0, json_array()};
    if (!x.refusals)
        return;
    registry_foreach(d->reg, consider, &x);
    if (x.nc > 1)
        qsort(x.c, x.nc, sizeof *x.c, cand_cmp);
    size_t took = 0;
    for (size_t i = 0; i < x.nc && took < need; i++) {
        replica *r = replica_add(p, x.c[i].a->id, R_ASSIGNED, now_wall);
        if (!r)
            break;
        persist_replica(d, p, r);
        took++;
        gp_log_info("deploy_placed", "deployment %s: replica placed on agent %s (%s)", p->name,
                    x.c[i].a->id, x.c[i].a->name ? x.c[i].a->name : "");
    }
    free(x.c);
    bool was_short = p->refusals != NULL;
    json_decref(p->refusals);
    p->refusals = NULL;
    if (took < need) {
        if (!was_short) /* once per shortage, not per poll */
            gp_log_warn("deploy_unplaced", "deployment %s: %zu replica(s) fit nowhere (%zu "
                        "agent(s) refused)", p->name, need - took, json_array_size(x.refusals));
        p->refusals = x.refusals;
    } else {
        json_decref(x.refusals);
    }
}

/* Over the desired count: drop replicas that are not ready first, newest
 * first. */
static void shrink(gps_deploy *d, deployment *p, size_t over)
{
    for (int pass = 0; pass < 2 && over > 0; pass++)
        for (size_t i = p->nr; i-- > 0 && over > 0;) {
            if (p->r[i].state == R_FAILED || (pass == 0 && p->r[i].state == R_READY))
                continue;
            gp_log_info("deploy_unplaced_replica", "deployment %s: replica on agent %s "
                        "removed (scaled down)", p->name, p->r[i].agent_id);
            replica_drop(d, p, i);
            over--;
        }
}

void gps_deploy_reconcile(gps_deploy *d, uint64_t now_ms, int64_t now_wall)
{
    for (size_t k = 0; k < d->n; k++) {
        deployment *p = d->v[k];
        for (size_t i = p->nr; i-- > 0;) {
            if (p->r[i].state == R_FAILED || !agent_gone(d, p->r[i].agent_id, now_ms))
                continue;
            gp_log_warn("deploy_replica_moved", "deployment %s: agent %s gone for longer than "
                        "the grace (%llu ms): its replica moves", p->name, p->r[i].agent_id,
                        (unsigned long long)d->grace_ms);
            replica_drop(d, p, i);
        }
        size_t active = active_count(p);
        if (active > (size_t)p->replicas)
            shrink(d, p, active - (size_t)p->replicas);
        else if (active < (size_t)p->replicas)
            place(d, p, (size_t)p->replicas - active, now_wall);
        else if (p->refusals) {
            json_decref(p->refusals);
            p->refusals = NULL;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Agents' polls                                                       */
/* ------------------------------------------------------------------ */

static int64_t num(const json_t *o, const char *k, int64_t max)
{
    const json_t *v = json_object_get(o, k);
    int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v)
                : json_is_real(v) ? (int64_t)json_real_value(v) : 0;
    return x < 0 ? 0 : x > max ? max : x;
}

/* One entry of the agent's deploy.models: a replica's progress. True when
 * its state changed (a failure frees a place: reconcile now). */
static bool apply_report(gps_deploy *d, const registry_agent *a, const json_t *m,
                         int64_t now_wall)
{
    deployment *p = dep_find(d, json_string_value(json_object_get(m, "name")), NULL);
    replica *r = p ? replica_find(p, a->id) : NULL;
    int st = rstate_parse(json_string_value(json_object_get(m, "state")));
    if (!r || st < 0 || r->state == R_FAILED)
        return false;
    const char *reason = json_string_value(json_object_get(m, "reason"));
    r->bytes = num(m, "bytes", 1LL << 50);
    r->total = num(m, "total", 1LL << 50);
    r->rate = num(m, "rate", 1LL << 40);
    if (r->total > 0 && p->bytes <= 0) {
        p->bytes = r->total; /* the first download's Content-Length: now placement can
                                check the fit for the replicas still to place */
        persist_dep(d, p);
    }
    bool changed = r->state != (rstate)st ||
                   (reason && strncmp(reason, r->reason, sizeof r->reason - 1) != 0);
    if (!changed)
        return false;
    gp_log_info("deploy_replica_state", "deployment %s on agent %s: %s -> %s%s%s", p->name,
                a->id, rstate_names[r->state], rstate_names[st], reason ? ": " : "",
                reason ? reason : "");
    r->state = (rstate)st;
    /* It is shown to operators and logged: printable text only. */
    if (reason && !gps_agent_text_ok(reason, strlen(reason), GPS_AGENT_MAX_MESSAGE))
        reason = "(the agent's reason was not printable text)";
    snprintf(r->reason, sizeof r->reason, "%s", reason ? reason : "");
    r->updated_at = now_wall;
    persist_replica(d, p, r);
    return true;
}

/* A replica the agent held (downloading, loading, ready) and no longer
 * lists: it restarted and starts over from the poll reply. Shown as
 * assigned again rather than as the state it lost. */
static void forget_unreported(gps_deploy *d, const registry_agent *a, const json_t *models,
                              int64_t now_wall)
{
    for (size_t k = 0; k < d->n; k++) {
        deployment *p = d->v[k];
        replica *r = replica_find(p, a->id);
        if (!r || r->state == R_FAILED || r->state == R_ASSIGNED)
            continue;
        bool listed = false;
        for (size_t i = 0; i < json_array_size(models) && i < 64 && !listed; i++) {
            const char *n = json_string_value(json_object_get(json_array_get(models, i), "name"));
            listed = n && strcmp(n, p->name) == 0;
        }
        if (listed)
            continue;
        gp_log_info("deploy_replica_state", "deployment %s on agent %s: %s -> assigned (the "
                    "agent no longer reports it: restarted?)", p->name, a->id,
                    rstate_names[r->state]);
        r->state = R_ASSIGNED;
        r->reason[0] = '\0';
        r->bytes = r->total = r->rate = 0;
        r->updated_at = now_wall;
        persist_replica(d, p, r);
    }
}

/* What agent_id must hold, whole or NULL (out of memory): a deployment
 * left out would be unloaded. Each append takes its value, NULL included. */
static json_t *held_json(const gps_deploy *d, const char *agent_id)
{
    json_t *want = json_array();
    for (size_t k = 0; want && k < d->n; k++) {
        const deployment *p = d->v[k];
        const replica *r = replica_find((deployment *)p, agent_id);
        if (!r || r->state == R_FAILED)
            continue;
        if (json_array_append_new(want, json_pack("{s:s,s:s,s:s?,s:I}", "name", p->name,
                                                  "source", p->source, "sha256", p->sha256,
                                                  "bytes", (json_int_t)p->bytes)) < 0) {
            json_decref(want);
            want = NULL;
        }
    }
    return want;
}

int gps_deploy_agent_poll(gps_deploy *d, const registry_agent *a, const json_t *body,
                          uint64_t now_ms, int64_t now_wall, json_t **out)
{
    *out = NULL;
    const json_t *dj = json_object_get(body, "deploy");
    if (!json_is_object(dj)) {
        /* Restarted with --model or --upstream: it holds none of ours now;
         * its replicas go elsewhere at once. */
        free(smap_del(&d->agents, a->id));
        for (size_t k = 0; k < d->n; k++) {
            deployment *p = d->v[k];
            for (size_t i = p->nr; i-- > 0;)
                if (strcmp(p->r[i].agent_id, a->id) == 0) {
                    gp_log_warn("deploy_replica_moved", "deployment %s: agent %s no longer "
                                "takes deployments: its replica moves", p->name, a->id);
                    replica_drop(d, p, i);
                }
        }
        return 0;
    }
    agent_dep *ad = smap_get(&d->agents, a->id);
    bool changed = !ad; /* a new agent may take what is short */
    if (!ad) {
        ad = calloc(1, sizeof *ad);
        if (!ad || !smap_put(&d->agents, a->id, ad)) {
            free(ad);
            return -1;
        }
    }
    ad->capacity = (int)num(dj, "capacity", 64);
    if (ad->capacity < 1)
        ad->capacity = 1;
    ad->memory_free = num(dj, "memory_free", 1LL << 50);
    ad->disk_free = num(dj, "disk_free", 1LL << 50);
    const json_t *models = json_object_get(dj, "models");
    for (size_t i = 0; i < json_array_size(models) && i < 64; i++)
        changed |= apply_report(d, a, json_array_get(models, i), now_wall);
    forget_unreported(d, a, models, now_wall);
    /* Otherwise the tick's reconcile (once a second) is enough: a poll
     * stays O(deployments) however many agents there are. */
    if (changed)
        gps_deploy_reconcile(d, now_ms, now_wall);
    *out = held_json(d, a->id);
    return *out ? 0 : -1;
}

void gps_deploy_agent_forget(gps_deploy *d, const char *agent_id)
{
    free(smap_del(&d->agents, agent_id));
}

/* ------------------------------------------------------------------ */
/* Views                                                               */
/* ------------------------------------------------------------------ */

/* The views below are whole or NULL (out of memory): a replica, a refusal
 * or a deployment left out would read as none (an operator scales up what
 * is there). Each set and append takes its value, NULL included, and
 * json_pack refuses a NULL "o" (taking the others). */
static json_t *replica_json(const gps_deploy *d, const replica *r)
{
    const registry_agent *a = registry_get(d->reg, r->agent_id);
    json_t *j = json_pack("{s:s,s:s?,s:s,s:s?,s:I,s:I,s:I,s:I}", "agent_id", r->agent_id,
                          "agent", a ? a->name : NULL, "state", rstate_names[r->state],
                          "reason", r->reason[0] ? r->reason : NULL, "bytes",
                          (json_int_t)r->bytes, "total", (json_int_t)r->total, "rate",
                          (json_int_t)r->rate, "updated_at", (json_int_t)r->updated_at);
    int bad = 0;
    if (j && r->state == R_DOWNLOADING && r->rate > 0 && r->total > r->bytes)
        bad += json_object_set_new(j, "eta_sec",
                                   json_integer((r->total - r->bytes) / r->rate)) < 0;
    if (j && a)
        bad += json_object_set_new(j, "agent_state",
                                   json_string(registry_state_name(a->state))) < 0;
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *dep_json(const gps_deploy *d, const deployment *p)
{
    json_t *placed = json_array();
    size_t ready = 0;
    for (size_t i = 0; placed && i < p->nr; i++) {
        if (json_array_append_new(placed, replica_json(d, &p->r[i])) < 0) {
            json_decref(placed);
            placed = NULL; /* (json_pack refuses it below) */
        }
        ready += p->r[i].state == R_READY;
    }
    size_t active = active_count(p);
    json_t *j = json_pack("{s:s,s:s,s:s?,s:i,s:O,s:I,s:I,s:s?,s:I,s:I,s:o}", "name", p->name,
                          "source", p->source, "sha256", p->sha256, "replicas", p->replicas,
                          "labels", p->labels, "bytes", (json_int_t)p->bytes, "created_at",
                          (json_int_t)p->created_at, "created_by", p->created_by, "ready",
                          (json_int_t)ready, "unplaced",
                          (json_int_t)(active < (size_t)p->replicas
                                           ? (size_t)p->replicas - active : 0),
                          "placed", placed);
    if (j && p->refusals && json_object_set(j, "refusals", p->refusals) < 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

typedef struct local_ctx {
    const gps_deploy *d;
    json_t *out; /* NULL once an append failed (out of memory) */
} local_ctx;

/* Models of agents that do not take deployments (--model, --upstream):
 * listed, never moved. */
static void add_local(void *ud, registry_agent *a)
{
    local_ctx *x = ud;
    if (!x->out || smap_get(&x->d->agents, a->id))
        return;
    for (size_t i = 0; x->out && i < a->n_models; i++)
        if (json_array_append_new(x->out,
                                  json_pack("{s:s,s:s,s:s?,s:s}", "model", a->models[i].id,
                                            "agent_id", a->id, "agent", a->name, "agent_state",
                                            registry_state_name(a->state))) < 0) {
            json_decref(x->out);
            x->out = NULL;
        }
}

json_t *gps_deploy_list(const gps_deploy *d)
{
    json_t *l = json_array();
    local_ctx x = {d, json_array()};
    for (size_t i = 0; l && i < d->n; i++)
        if (json_array_append_new(l, dep_json(d, d->v[i])) < 0) {
            json_decref(l);
            l = NULL;
        }
    if (x.out)
        registry_foreach(d->reg, add_local, &x);
    if (!l || !x.out) {
        json_decref(l);
        json_decref(x.out);
        return NULL;
    }
    return json_pack("{s:o,s:o}", "deployments", l, "local", x.out);
}

json_t *gps_deploy_get(const gps_deploy *d, const char *name, bool *found)
{
    const deployment *p = dep_find(d, name, NULL);
    *found = p != NULL;
    return p ? dep_json(d, p) : NULL;
}

/* pins: model attestation (see pins.h). */
#include "server/fleet/pins.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/gps_strmap.h"
#include "server/store/store.h"

struct change;

typedef struct pin {
    char sha256[65];
    int64_t created_at;
    char *created_by;      /* may be NULL */
    bool live;             /* false: a creation waiting for its row's commit */
    struct change *change; /* the admin change of this name waiting, or NULL */
} pin;

/* An admin change waiting for its row's commit: applied in change_done
 * when the store says the row holds, else dropped. Owned by the store's
 * callback. A creation's pin sits in the map (not live) from the start, so
 * that applying it never allocates; a replacement's pin waits here. */
typedef enum { C_CREATE, C_REPLACE, C_REMOVE } change_kind;
typedef struct change {
    gps_pins *p;   /* NULL once the table is freed */
    change_kind kind;
    char *name;
    pin *next;     /* C_REPLACE: the pin that replaces (owned) */
    gps_pins_done_fn done;
    void *arg;
} change;

struct gps_pins {
    smap pins;      /* name -> pin* (live, or a creation waiting) */
    size_t waiting; /* creations waiting in pins (not counted, not listed) */
    smap refused;   /* agent_id -> json_t* (array) */
};

static void pin_free(void *v)
{
    pin *x = v;
    if (!x)
        return;
    if (x->change) /* the table is going: the store finishes the change */
        x->change->p = NULL;
    free(x->created_by);
    free(x);
}

static void json_free(void *v)
{
    json_decref(v);
}

gps_pins *gps_pins_new(void)
{
    return calloc(1, sizeof(gps_pins));
}

void gps_pins_free(gps_pins *p)
{
    if (!p)
        return;
    smap_free(&p->pins, pin_free);
    smap_free(&p->refused, json_free);
    free(p);
}

bool gps_pins_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] <= ' ' || (unsigned char)name[i] == 0x7f)
            return false;
    return true;
}

bool gps_pins_sha_ok(const char *s)
{
    return gp_hex64_ok(s);
}

static pin *pin_new(const char *sha256, int64_t created_at, const char *created_by)
{
    pin *x = calloc(1, sizeof(*x));
    if (!x || (created_by && !(x->created_by = strdup(created_by)))) {
        pin_free(x);
        return NULL;
    }
    memcpy(x->sha256, sha256, 65);
    x->created_at = created_at;
    return x;
}

/* Whether a pin of name may be set now: 0 with *old the pin it replaces
 * (NULL: a new one), -1 a bad name or sha256, -4 a change of that name
 * waits for the store, -2 the table is full. Both setters admit alike. */
static int pin_admit(gps_pins *p, const char *name, const char *sha256, pin **old)
{
    if (!gps_pins_name_ok(name) || !gps_pins_sha_ok(sha256))
        return -1;
    *old = smap_get(&p->pins, name);
    if (*old && (*old)->change)
        return -4;
    if (!*old && p->pins.n >= GPS_PINS_MAX)
        return -2;
    return 0;
}

int gps_pins_set(gps_pins *p, const char *name, const char *sha256, int64_t created_at,
                 const char *created_by)
{
    pin *old;
    int rc = pin_admit(p, name, sha256, &old);
    if (rc < 0)
        return rc;
    pin *x = pin_new(sha256, created_at, created_by);
    if (!x)
        return -1;
    x->live = true;
    if (!smap_put(&p->pins, name, x)) {
        pin_free(x);
        return -1;
    }
    pin_free(old); /* smap_put replaced its value */
    return 0;
}

int gps_pins_delete(gps_pins *p, const char *name)
{
    pin *x = smap_get(&p->pins, name);
    if (!x)
        return 1;
    if (x->change)
        return -4;
    smap_del(&p->pins, name);
    pin_free(x);
    return 0;
}

const char *gps_pins_get(const gps_pins *p, const char *name)
{
    const pin *x = smap_get(&p->pins, name);
    return x && x->live ? x->sha256 : NULL;
}

size_t gps_pins_count(const gps_pins *p)
{
    return p->pins.n - p->waiting;
}

/* ------------------------------------------------------------------ */
/* Admin changes (written before they are applied) and the load        */
/* ------------------------------------------------------------------ */

static void change_free(change *c)
{
    pin_free(c->next);
    free(c->name);
    free(c);
}

/* Apply a committed change, or drop a refused one (no allocation). */
static void change_finish(gps_pins *p, change *c, bool ok)
{
    smap_node *nd = smap_find(&p->pins, c->name);
    pin *x = nd ? nd->val : NULL;
    if (!x)
        return; /* (a name with a change waiting stays in the map: not reached) */
    x->change = NULL;
    if (c->kind == C_CREATE) {
        p->waiting--;
        if (ok) {
            x->live = true;
        } else {
            smap_del(&p->pins, c->name);
            pin_free(x);
        }
    } else if (ok && c->kind == C_REPLACE) {
        nd->val = c->next;
        c->next = NULL;
        pin_free(x);
    } else if (ok) {
        smap_del(&p->pins, c->name);
        pin_free(x);
    }
    if (ok)
        gp_log_info(c->kind == C_REMOVE ? "pin_removed" : "pin_set", "pin of %s %s", c->name,
                    c->kind == C_REMOVE ? "removed" : "set");
    else
        gp_log_warn("pin_store_failed", "pin of %s: the %s was not written to the DB; nothing "
                    "changed", c->name, c->kind == C_REMOVE ? "removal" : "change");
}

/* The store's answer for a change (loop thread; at the store's close,
 * maybe after the table is gone). */
static void change_done(void *arg, int status)
{
    change *c = arg;
    gps_pins *p = c->p;
    if (p)
        change_finish(p, c, status == 0);
    if (c->done)
        c->done(c->arg, p, p && status == 0 ? 0 : -1);
    change_free(c);
}

static change *change_new(change_kind kind, const char *name, gps_pins_done_fn done, void *arg)
{
    change *c = calloc(1, sizeof *c);
    if (!c || !(c->name = strdup(name))) {
        free(c);
        return NULL;
    }
    c->kind = kind;
    c->done = done;
    c->arg = arg;
    return c;
}

int gps_pins_put(gps_pins *p, struct gps_store *store, const char *name, const char *sha256,
                 int64_t created_at, const char *created_by, gps_pins_done_fn done, void *arg)
{
    if (!store) {
        int rc = gps_pins_set(p, name, sha256, created_at, created_by);
        if (rc == 0 && done)
            done(arg, p, 0);
        return rc;
    }
    pin *old;
    int rc = pin_admit(p, name, sha256, &old);
    if (rc < 0)
        return rc;
    /* Everything the commit needs exists before the row is queued: out of
     * memory is the request's failure with nothing changed, and applying
     * the change never allocates. */
    change *c = change_new(old ? C_REPLACE : C_CREATE, name, done, arg);
    pin *x = c ? pin_new(sha256, created_at, created_by) : NULL;
    if (!x)
        goto oom;
    if (old) {
        x->live = true; /* listed once it replaces old */
        c->next = x;
    } else if (!smap_put(&p->pins, name, x)) {
        pin_free(x);
        goto oom;
    }
    if (gps_store_pin_set_async(store, name, sha256, created_at, created_by, change_done, c) < 0) {
        if (!old) {
            smap_del(&p->pins, name);
            pin_free(x);
        }
        change_free(c);
        return -5;
    }
    c->p = p;
    p->waiting += !old;
    (old ? old : x)->change = c;
    return 0;
oom:
    if (c)
        change_free(c);
    return -1;
}

int gps_pins_remove(gps_pins *p, struct gps_store *store, const char *name,
                    gps_pins_done_fn done, void *arg)
{
    if (!store) {
        int rc = gps_pins_delete(p, name);
        if (rc == 0 && done)
            done(arg, p, 0);
        return rc;
    }
    pin *x = smap_get(&p->pins, name);
    if (!x)
        return 1;
    if (x->change)
        return -4;
    change *c = change_new(C_REMOVE, name, done, arg);
    if (!c)
        return -1;
    if (gps_store_pin_delete_async(store, name, change_done, c) < 0) {
        change_free(c);
        return -5;
    }
    c->p = p;
    x->change = c;
    return 0;
}

typedef struct load_ctx {
    gps_pins *p;
    char *err;
    size_t errlen;
} load_ctx;

/* A row from the store. One that is not a valid pin (edited by hand) is
 * logged and skipped; out of memory or a full table stops the load. */
static int load_pin(void *arg, const char *name, const char *sha256, int64_t created_at,
                    const char *created_by)
{
    load_ctx *l = arg;
    if (!gps_pins_name_ok(name) || !gps_pins_sha_ok(sha256)) {
        gp_log_warn("db_pin_skipped", "model_pins row '%.256s' is not a valid pin; ignored",
                    name);
        return 0;
    }
    int rc = gps_pins_set(l->p, name, sha256, created_at, created_by);
    if (rc == -2 && l->errlen)
        snprintf(l->err, l->errlen, "reading model_pins: more than %d pins", GPS_PINS_MAX);
    return rc == 0 ? 0 : -1;
}

int gps_pins_load(gps_pins *p, struct gps_store *store, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    load_ctx l = {p, err, errlen};
    if (gps_store_load_pins(store, load_pin, &l, err, errlen) == 0)
        return 0;
    /* The store says why when a step failed; else a row's -1 was ENOMEM
     * (or said why). What was read goes: part of the pins would let an
     * agent serve a model whose pin was not read. */
    if (errlen && !err[0])
        snprintf(err, errlen, "reading model_pins: out of memory");
    smap_free(&p->pins, pin_free);
    memset(&p->pins, 0, sizeof p->pins);
    p->waiting = 0;
    return -1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

json_t *gps_pins_list(const gps_pins *p)
{
    size_t n = p->pins.n, k = 0, i;
    json_t **v = calloc(n ? n : 1, sizeof(*v));
    json_t *out = json_array();
    if (!v || !out)
        goto oom;
    for (smap_node *nd = smap_first(&p->pins, &i); nd; nd = smap_next(&p->pins, nd, &i)) {
        const pin *x = nd->val;
        if (!x->live)
            continue; /* a creation waiting for its commit */
        v[k] = json_pack("{s:s,s:s,s:I,s:s?}", "name", nd->key, "sha256", x->sha256,
                         "created_at", (json_int_t)x->created_at, "created_by", x->created_by);
        if (!v[k])
            goto oom;
        k++;
    }
    qsort(v, k, sizeof(*v), by_name);
    for (size_t j = 0; j < k; j++) {
        if (json_array_append_new(out, v[j]) < 0) {
            v[j] = NULL;
            for (size_t m = j + 1; m < k; m++)
                json_decref(v[m]);
            k = 0;
            goto oom;
        }
    }
    free(v);
    return out;
oom:
    for (size_t j = 0; j < k; j++)
        json_decref(v[j]);
    free(v);
    json_decref(out);
    return NULL;
}

/* The first of m's names (id, then aliases) that is pinned to a digest m
 * does not have; NULL when every pinned name matches (or none is pinned). */
static const char *mismatch(const gps_pins *p, const registry_model_info *m, const char **want)
{
    for (size_t i = 0; i <= m->n_aliases; i++) {
        const char *name = i == 0 ? m->id : m->aliases[i - 1];
        const char *w = name ? gps_pins_get(p, name) : NULL;
        if (w && (!m->digest || strcmp(w, m->digest) != 0)) {
            *want = w;
            return name;
        }
    }
    return NULL;
}

size_t gps_pins_filter(gps_pins *p, registry_facts *f)
{
    json_t *refused = NULL;
    size_t dropped = 0;
    for (size_t i = 0; p->pins.n && i < f->n_models;) {
        const registry_model_info *m = &f->models[i];
        const char *want = NULL;
        const char *name = mismatch(p, m, &want);
        if (!name) {
            i++;
            continue;
        }
        char reason[400];
        if (m->digest)
            snprintf(reason, sizeof reason, "model file sha256 %.12s... does not match the "
                     "pin of '%.256s' (%.12s...)", m->digest, name, want);
        else
            snprintf(reason, sizeof reason, "the agent reports no sha256 for its model file: "
                     "'%.256s' is pinned", name);
        if (!refused)
            refused = json_array();
        json_array_append_new(refused, json_pack("{s:s,s:s,s:s,s:s?,s:s}", "model", m->id,
                                                 "name", name, "expected", want, "got",
                                                 m->digest, "reason", reason));
        registry_facts_drop_model(f, i);
        dropped++;
    }
    json_t *old = smap_get(&p->refused, f->agent_id);
    /* Logged when what is refused changes, not at every poll. */
    if (refused && !(old && json_equal(old, refused)))
        gp_log_write(GP_LOG_WARN, "model_refused", NULL,
                     json_pack("{s:s,s:O}", "agent_id", f->agent_id, "refused", refused),
                     "agent %s: %zu model(s) refused by a pin", f->agent_id, dropped);
    else if (!refused && old)
        gp_log_write(GP_LOG_INFO, "model_refusal_cleared", NULL,
                     json_pack("{s:s}", "agent_id", f->agent_id),
                     "agent %s: no model refused any more", f->agent_id);
    if (refused && smap_put(&p->refused, f->agent_id, refused)) {
        json_decref(old);
    } else {
        /* None refused (or no memory to say so): nothing kept. */
        json_decref(refused);
        if (old) {
            smap_del(&p->refused, f->agent_id);
            json_decref(old);
        }
    }
    return dropped;
}

json_t *gps_pins_refused(const gps_pins *p, const char *agent_id)
{
    return smap_get(&p->refused, agent_id);
}

void gps_pins_forget(gps_pins *p, const char *agent_id)
{
    json_t *old = smap_get(&p->refused, agent_id);
    if (old) {
        smap_del(&p->refused, agent_id);
        json_decref(old);
    }
}

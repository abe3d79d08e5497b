/* pins: model attestation (see pins.h). */
#include "server/fleet/pins.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/gps_strmap.h"

typedef struct pin {
    char sha256[65];
    int64_t created_at;
    char *created_by; /* may be NULL */
} pin;

struct gps_pins {
    smap pins;    /* name -> pin* */
    smap refused; /* agent_id -> json_t* (array) */
};

static void pin_free(void *v)
{
    pin *x = v;
    if (x)
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

int gps_pins_set(gps_pins *p, const char *name, const char *sha256, int64_t created_at,
                 const char *created_by)
{
    if (!gps_pins_name_ok(name) || !gps_pins_sha_ok(sha256))
        return -1;
    pin *old = smap_get(&p->pins, name);
    if (!old && p->pins.n >= GPS_PINS_MAX)
        return -2;
    pin *x = calloc(1, sizeof(*x));
    if (!x || (created_by && !(x->created_by = strdup(created_by)))) {
        pin_free(x);
        return -1;
    }
    memcpy(x->sha256, sha256, 65);
    x->created_at = created_at;
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
    smap_del(&p->pins, name);
    pin_free(x);
    return 0;
}

const char *gps_pins_get(const gps_pins *p, const char *name)
{
    const pin *x = smap_get(&p->pins, name);
    return x ? x->sha256 : NULL;
}

size_t gps_pins_count(const gps_pins *p)
{
    return p->pins.n;
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

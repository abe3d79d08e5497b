/*
 * registry: agents, health state machine and model index (see registry.h).
 */
#include "server/fleet/registry.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/gps_strmap.h"

#define MAX_MODELS 256
#define MAX_ALIASES 64
#define MAX_LABELS 64
#define MAX_STR GPS_AGENT_MAX_NAME
#define MAX_SLOTS 4096
#define MAX_CONTEXT (1LL << 30)  /* tokens */
#define MAX_BYTES (1LL << 50)    /* vram_bytes, bytes: 1 PiB */

enum { LIST_NONE = 0, LIST_LIVE = 1, LIST_SUSPECT = 2 };

typedef struct agent_list {
    registry_agent *head, *tail;
} agent_list;

/* One name in the model index. Entries are never deleted: "known" means
 * ever served since start-up. */
typedef struct model_ent {
    int64_t created_wall_ms;
    size_t live;          /* live agents listing the name (id or alias) */
    size_t live_as_id;    /* of those, listing it as the public id */
    size_t live_tools;    /* of those, taking tools for it (supports_tools) */
    uint32_t mark;        /* registry_models_dropped: listed now by the agent looked at */
    uint32_t mark_tools;  /* ... through a model taking tools */
} model_ent;

struct registry {
    registry_config cfg;
    smap agents;          /* agent_id -> registry_agent* */
    smap models;          /* name -> model_ent* */
    agent_list live;      /* REGISTERING/HEALTHY/DRAINING, ordered by last_seen */
    agent_list suspect;   /* SUSPECT, ordered by last_seen */
    size_t state_count[REGISTRY_STATE_COUNT];
    uint32_t mark_gen;    /* the last model_ent.mark handed out */
};

static const char *const state_names[REGISTRY_STATE_COUNT] = {
    "registering", "healthy", "suspect", "dead", "draining", "offline",
};

const char *registry_state_name(registry_state s)
{
    return (unsigned)s < REGISTRY_STATE_COUNT ? state_names[s] : "unknown";
}

void registry_config_default(registry_config *c)
{
    memset(c, 0, sizeof(*c));
    c->poll_interval_ms = 15000;
    c->grace_ms = 5000;
    c->agent_timeout_ms = 90000;
    c->ramp_ms = 60000;
}

/* ================================================================ facts */

static void model_info_free(registry_model_info *m)
{
    free(m->id);
    for (size_t i = 0; i < m->n_aliases; i++)
        free(m->aliases[i]);
    free(m->aliases);
    free(m->quantization);
    free(m->architecture);
    free(m->digest);
}

static void models_free(registry_model_info *models, size_t n)
{
    for (size_t i = 0; i < n; i++)
        model_info_free(&models[i]);
    free(models);
}

static void labels_free(registry_label *labels, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(labels[i].key);
        free(labels[i].value);
    }
    free(labels);
}

void registry_facts_free(registry_facts *f)
{
    if (!f)
        return;
    free(f->name);
    free(f->version);
    free(f->platform);
    models_free(f->models, f->n_models);
    labels_free(f->labels, f->n_labels);
    free(f->prefix.slots);
    json_decref(f->raw);
    memset(f, 0, sizeof(*f));
}

void registry_facts_drop_model(registry_facts *f, size_t i)
{
    if (!f || i >= f->n_models)
        return;
    model_info_free(&f->models[i]);
    memmove(&f->models[i], &f->models[i + 1], (f->n_models - i - 1) * sizeof(f->models[0]));
    f->n_models--;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Optional string field: absent/null -> *out NULL. 0 ok, -1 bad type/size,
 * -2 ENOMEM. */
static int opt_str(const json_t *obj, const char *key, char **out)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    /* Printable text only: names reach operators' terminals (gpupoolctl). */
    if (!json_is_string(v) || (json_string_length(v) > 0 && !gps_agent_name_ok(v, MAX_STR)))
        return -1;
    *out = strdup(json_string_value(v));
    return *out ? 0 : -2;
}

/* Optional non-negative integer field. */
static int opt_int(const json_t *obj, const char *key, long long *out, long long max)
{
    const json_t *v = json_object_get(obj, key);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return -1;
    *out = json_integer_value(v);
    return 0;
}

/* A non-empty printable name of at most MAX_STR bytes (agent_check.h). */
static bool good_name(const json_t *v)
{
    return gps_agent_name_ok(v, MAX_STR);
}

/* models[].digest: absent/null, or the file's sha256 as 64 lowercase hex
 * characters (anything else would make two different files look equal, or
 * never equal). */
static int parse_digest(const json_t *m, size_t idx, registry_model_info *out, char *err,
                        size_t errlen)
{
    const json_t *d = json_object_get(m, "digest");
    if (!d || json_is_null(d))
        return 0;
    const char *s = json_string_value(d);
    bool ok = s && json_string_length(d) == 64;
    for (size_t i = 0; ok && i < 64; i++)
        ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
    if (!ok)
        return fail(err, errlen, "models[%zu].digest: must be a SHA-256 in 64 lowercase hex "
                                 "characters", idx);
    if (!(out->digest = strdup(s)))
        return fail(err, errlen, "out of memory");
    return 0;
}

static int parse_model(const json_t *m, size_t idx, registry_model_info *out, char *err,
                       size_t errlen)
{
    if (!json_is_object(m))
        return fail(err, errlen, "models[%zu]: must be an object", idx);
    const json_t *id = json_object_get(m, "id");
    if (!good_name(id))
        return fail(err, errlen, "models[%zu].id: must be a non-empty printable string of at most %d bytes",
                    idx, MAX_STR);
    if (!(out->id = strdup(json_string_value(id))))
        return fail(err, errlen, "out of memory");
    const json_t *al = json_object_get(m, "aliases");
    if (al && !json_is_null(al)) {
        if (!json_is_array(al) || json_array_size(al) > MAX_ALIASES)
            return fail(err, errlen, "models[%zu].aliases: must be an array of at most %d strings",
                        idx, MAX_ALIASES);
        size_t n = json_array_size(al);
        if (n) {
            out->aliases = calloc(n, sizeof(char *));
            if (!out->aliases)
                return fail(err, errlen, "out of memory");
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *a = json_array_get(al, i);
            if (!good_name(a))
                return fail(err, errlen, "models[%zu].aliases[%zu]: must be a non-empty printable string of "
                            "at most %d bytes", idx, i, MAX_STR);
            if (!(out->aliases[i] = strdup(json_string_value(a))))
                return fail(err, errlen, "out of memory");
            out->n_aliases = i + 1;
        }
    }
    int r;
    if ((r = opt_str(m, "quantization", &out->quantization)) ||
        (r = opt_str(m, "architecture", &out->architecture)))
        return fail(err, errlen, r == -2 ? "out of memory"
                                         : "models[%zu]: quantization/architecture must be printable strings of at most %d bytes",
                    idx, MAX_STR);
    if (opt_int(m, "context_length", &out->context_length, MAX_CONTEXT) < 0)
        return fail(err, errlen, "models[%zu].context_length: must be an integer from 0 to %lld",
                    idx, MAX_CONTEXT);
    if (opt_int(m, "vram_bytes", &out->vram_bytes, MAX_BYTES) < 0)
        return fail(err, errlen, "models[%zu].vram_bytes: must be an integer from 0 to %lld", idx,
                    MAX_BYTES);
    if (opt_int(m, "bytes", &out->bytes, MAX_BYTES) < 0)
        return fail(err, errlen, "models[%zu].bytes: must be an integer from 0 to %lld", idx,
                    MAX_BYTES);
    const json_t *ld = json_object_get(m, "loaded");
    out->loaded = true;
    if (ld && !json_is_null(ld)) {
        if (!json_is_boolean(ld))
            return fail(err, errlen, "models[%zu].loaded: must be a boolean", idx);
        out->loaded = json_is_true(ld);
    }
    /* Lenient like the dialects were: anything but true is false. */
    out->supports_tools = json_is_true(json_object_get(m, "supports_tools"));
    out->supports_embeddings = json_is_true(json_object_get(m, "supports_embeddings"));
    out->embeddings_only = json_is_true(json_object_get(m, "embeddings_only"));
    return parse_digest(m, idx, out, err, errlen);
}

/* "prefix_cache" (optional): counters and per-slot descriptors, bounded
 * by MAX_SLOTS entries of gp_prefix_desc's own bounds. */
#define MAX_PREFIX_COUNT 1000000000000000LL
static int parse_prefix(const json_t *pc, int slots_total, registry_prefix *out, char *err,
                        size_t errlen)
{
    if (!pc || json_is_null(pc))
        return 0;
    if (!json_is_object(pc))
        return fail(err, errlen, "prefix_cache: must be an object");
    out->reported = true;
    out->enabled = json_is_true(json_object_get(pc, "enabled"));
    if (opt_int(pc, "lookups", &out->lookups, MAX_PREFIX_COUNT) < 0 ||
        opt_int(pc, "hits", &out->hits, MAX_PREFIX_COUNT) < 0 ||
        opt_int(pc, "tokens_saved", &out->tokens_saved, MAX_PREFIX_COUNT) < 0 ||
        opt_int(pc, "tokens_computed", &out->tokens_computed, MAX_PREFIX_COUNT) < 0)
        return fail(err, errlen, "prefix_cache: lookups, hits, tokens_saved and "
                                 "tokens_computed must be integers from 0 to %lld",
                    MAX_PREFIX_COUNT);
    const json_t *slots = json_object_get(pc, "slots");
    if (!slots || json_is_null(slots))
        return 0;
    if (!json_is_array(slots) || json_array_size(slots) > (size_t)slots_total)
        return fail(err, errlen, "prefix_cache.slots: must be an array of at most slots.total "
                    "(%d) entries", slots_total);
    size_t n = json_array_size(slots);
    if (n && !(out->slots = calloc(n, sizeof *out->slots)))
        return fail(err, errlen, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *sl = json_array_get(slots, i);
        registry_prefix_slot *ps = &out->slots[i];
        long long slot, tokens;
        const json_t *desc = json_object_get(sl, "prefix");
        if (!json_is_object(sl) || !json_is_integer(json_object_get(sl, "slot")) ||
            opt_int(sl, "slot", &slot, MAX_SLOTS - 1) < 0 ||
            opt_int(sl, "tokens", &tokens, 1LL << 32) < 0 ||
            (desc && !json_is_null(desc) && gp_prefix_desc_parse(desc, &ps->desc) < 0))
            return fail(err, errlen, "prefix_cache.slots[%zu]: must be {slot, busy, tokens, "
                        "prefix: {kind, units, points: [{n, h}] (at most %d)}}", i,
                        GP_PREFIX_MAX_POINTS);
        ps->slot = (int)slot;
        ps->tokens = tokens;
        ps->busy = json_is_true(json_object_get(sl, "busy"));
        out->n_slots = i + 1;
    }
    return 0;
}

int registry_agent_set_prefix(registry_agent *a, const json_t *pc, char *err, size_t errlen)
{
    if (!pc || json_is_null(pc))
        return 0;
    registry_prefix p = {0};
    if (parse_prefix(pc, a->slots_total > 0 ? a->slots_total : 1, &p, err, errlen) < 0) {
        free(p.slots);
        return -1;
    }
    free(a->prefix.slots);
    a->prefix = p;
    a->prefix_gen++;
    return 0;
}

long registry_agent_prefix_match(const registry_agent *a, const gp_prefix_chain *req,
                                 int *slot, long long *tokens)
{
    long best = 0;
    for (size_t i = 0; a && i < a->prefix.n_slots; i++) {
        const registry_prefix_slot *ps = &a->prefix.slots[i];
        if (ps->busy)
            continue;
        long u = gp_prefix_match(req, &ps->desc);
        if (u > best) {
            best = u;
            if (slot)
                *slot = ps->slot;
            if (tokens)
                *tokens = ps->tokens;
        }
    }
    return best;
}

int registry_facts_parse(const json_t *body, registry_facts *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(body))
        return fail(err, errlen, "body: must be a JSON object");
    if (json_dumpb(body, NULL, 0, JSON_COMPACT) > GPS_AGENT_MAX_FACTS_BYTES)
        return fail(err, errlen, "body: a poll is at most %d bytes of JSON",
                    GPS_AGENT_MAX_FACTS_BYTES);
    /* Only the known fields are kept as the agent's facts (and stored). */
    out->raw = gps_agent_facts_kept(body, err, errlen);
    if (!out->raw)
        return -1;

    const json_t *id = json_object_get(body, "agent_id");
    if (!json_is_string(id) || !gp_uuid_valid(json_string_value(id)))
        return fail(err, errlen, "agent_id: required, must be a UUID string");
    memcpy(out->agent_id, json_string_value(id), 36);
    out->agent_id[36] = '\0';

    int r;
    if ((r = opt_str(body, "name", &out->name)) || (r = opt_str(body, "version", &out->version)) ||
        (r = opt_str(body, "platform", &out->platform)))
        return fail(err, errlen, r == -2 ? "out of memory"
                                         : "name/version/platform: must be printable strings of "
                                           "at most 256 bytes (no control characters)");

    const json_t *models = json_object_get(body, "models");
    if (!json_is_array(models))
        return fail(err, errlen, "models: required, must be an array (may be empty)");
    if (json_array_size(models) > MAX_MODELS)
        return fail(err, errlen, "models: at most %d entries", MAX_MODELS);
    size_t nm = json_array_size(models);
    if (nm) {
        out->models = calloc(nm, sizeof(*out->models));
        if (!out->models)
            return fail(err, errlen, "out of memory");
    }
    for (size_t i = 0; i < nm; i++) {
        out->n_models = i + 1;   /* so that a half-filled entry is freed */
        if (parse_model(json_array_get(models, i), i, &out->models[i], err, errlen) < 0)
            return -1;
    }

    const json_t *slots = json_object_get(body, "slots");
    const json_t *tot = json_is_object(slots) ? json_object_get(slots, "total") : NULL;
    if (!json_is_integer(tot) || json_integer_value(tot) < 1 ||
        json_integer_value(tot) > MAX_SLOTS)
        return fail(err, errlen, "slots.total: required, an integer from 1 to %d", MAX_SLOTS);
    out->slots_total = (int)json_integer_value(tot);
    long long busy;
    if (opt_int(slots, "busy", &busy, MAX_SLOTS) < 0)
        return fail(err, errlen, "slots.busy: must be an integer from 0 to %d", MAX_SLOTS);
    out->slots_busy = (int)busy;

    long long qd;
    if (opt_int(body, "queue_depth", &qd, 1000000) < 0)
        return fail(err, errlen, "queue_depth: must be an integer from 0 to 1000000");
    out->queue_depth = (int)qd;

    const json_t *kv = json_object_get(body, "kv_cache_utilization");
    if (kv && !json_is_null(kv)) {
        if (!json_is_number(kv) || json_number_value(kv) < 0 || json_number_value(kv) > 1)
            return fail(err, errlen, "kv_cache_utilization: must be a number from 0 to 1");
        out->kv_cache_utilization = json_number_value(kv);
    }

    const json_t *labels = json_object_get(body, "labels");
    if (labels && !json_is_null(labels)) {
        if (!json_is_object(labels) || json_object_size(labels) > MAX_LABELS)
            return fail(err, errlen, "labels: must be an object of at most %d string values",
                        MAX_LABELS);
        size_t n = json_object_size(labels);
        if (n) {
            out->labels = calloc(n, sizeof(*out->labels));
            if (!out->labels)
                return fail(err, errlen, "out of memory");
        }
        const char *k;
        const json_t *v;
        size_t i = 0;
        json_object_foreach((json_t *)labels, k, v) {
            if (!gps_agent_text_ok(k, strlen(k), MAX_STR))
                return fail(err, errlen, "labels: a label name must be printable text of 1 to %d "
                            "bytes", MAX_STR);
            if (!good_name(v))
                return fail(err, errlen, "labels.%.64s: must be a non-empty printable string of "
                            "at most %d bytes", k, MAX_STR);
            out->labels[i].key = strdup(k);
            out->labels[i].value = strdup(json_string_value(v));
            out->n_labels = ++i;
            if (!out->labels[i - 1].key || !out->labels[i - 1].value)
                return fail(err, errlen, "out of memory");
        }
    }

    if (gps_agent_hw_check(body, err, errlen) < 0)
        return -1;
    hw_facts_parse(body, &out->hw);
    if (parse_prefix(json_object_get(body, "prefix_cache"), out->slots_total, &out->prefix, err,
                     errlen) < 0)
        return -1;

    const json_t *st = json_object_get(body, "status");
    if (st && !json_is_null(st)) {
        const char *s = json_is_string(st) ? json_string_value(st) : "";
        if (strcmp(s, "online") == 0)
            out->draining = false;
        else if (strcmp(s, "draining") == 0)
            out->draining = true;
        else
            return fail(err, errlen, "status: must be \"online\" or \"draining\"");
    }
    return 0;
}

/* =========================================================== agent lists */

static agent_list *list_of(registry *reg, int id)
{
    return id == LIST_LIVE ? &reg->live : id == LIST_SUSPECT ? &reg->suspect : NULL;
}

static void list_unlink(registry *reg, registry_agent *a)
{
    agent_list *l = list_of(reg, a->list_id);
    if (!l)
        return;
    if (a->lprev)
        a->lprev->lnext = a->lnext;
    else
        l->head = a->lnext;
    if (a->lnext)
        a->lnext->lprev = a->lprev;
    else
        l->tail = a->lprev;
    a->lprev = a->lnext = NULL;
    a->list_id = LIST_NONE;
}

/* Insert keeping the list ordered by last_seen. Starts from the tail: the
 * usual case (a heartbeat, or an agent just gone suspect) lands there, so
 * this is O(1) in practice. */
static void list_insert(registry *reg, registry_agent *a, int id)
{
    agent_list *l = list_of(reg, id);
    registry_agent *after = l->tail;
    while (after && after->last_seen_ms > a->last_seen_ms)
        after = after->lprev;
    a->lprev = after;
    a->lnext = after ? after->lnext : l->head;
    if (a->lnext)
        a->lnext->lprev = a;
    else
        l->tail = a;
    if (after)
        after->lnext = a;
    else
        l->head = a;
    a->list_id = id;
}

bool registry_agent_has_slots(const registry_agent *a)
{
    return a->state == REGISTRY_HEALTHY || a->state == REGISTRY_DRAINING ||
           a->state == REGISTRY_SUSPECT;
}

int registry_agent_slots_busy(const registry_agent *a)
{
    return a->active > a->slots_busy ? a->active : a->slots_busy;
}

/* ========================================================== model index */

static model_ent *model_get_or_add(registry *reg, const char *name, int64_t wall_ms)
{
    model_ent *e = smap_get(&reg->models, name);
    if (e)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->created_wall_ms = wall_ms;
    if (!smap_put(&reg->models, name, e)) {
        free(e);
        return NULL;
    }
    return e;
}

/* Make sure every name the agent lists is known. -1 on ENOMEM. */
static int index_note(registry *reg, const registry_model_info *m, size_t n, int64_t wall_ms)
{
    for (size_t i = 0; i < n; i++) {
        if (!model_get_or_add(reg, m[i].id, wall_ms))
            return -1;
        for (size_t j = 0; j < m[i].n_aliases; j++)
            if (!model_get_or_add(reg, m[i].aliases[j], wall_ms))
                return -1;
    }
    return 0;
}

/* Add (+1) or remove (-1) the agent's names from the live counts. Names
 * were noted before, so lookups cannot fail. */
static void index_count(registry *reg, const registry_agent *a, int d)
{
    for (size_t i = 0; i < a->n_models; i++) {
        int t = a->models[i].supports_tools ? d : 0;
        model_ent *e = smap_get(&reg->models, a->models[i].id);
        if (e) {
            e->live += d;
            e->live_as_id += d;
            e->live_tools += t;
        }
        for (size_t j = 0; j < a->models[i].n_aliases; j++) {
            e = smap_get(&reg->models, a->models[i].aliases[j]);
            if (e) {
                e->live += d;
                e->live_tools += t;
            }
        }
    }
}

static bool state_is_live(registry_state s)
{
    return s == REGISTRY_REGISTERING || s == REGISTRY_HEALTHY || s == REGISTRY_SUSPECT;
}

/* ====================================================== state machine */

static void set_state(registry *reg, registry_agent *a, registry_state ns, const char *reason,
                      uint64_t now)
{
    registry_state old = a->state;
    if (old == ns)
        return;
    bool live = state_is_live(ns);
    if (live != a->in_index) {
        index_count(reg, a, live ? +1 : -1);
        a->in_index = live;
    }
    reg->state_count[old]--;
    reg->state_count[ns]++;
    a->state = ns;
    a->state_since_ms = now;
    /* A dead or offline agent's hardware facts say nothing true any more:
     * forget them (the next poll brings new ones). */
    if (ns == REGISTRY_DEAD || ns == REGISTRY_OFFLINE) {
        json_decref(a->facts);
        a->facts = NULL;
    }

    int want = LIST_NONE;
    if (ns == REGISTRY_REGISTERING || ns == REGISTRY_HEALTHY || ns == REGISTRY_DRAINING)
        want = LIST_LIVE;
    else if (ns == REGISTRY_SUSPECT)
        want = LIST_SUSPECT;
    if (want != a->list_id) {
        list_unlink(reg, a);
        if (want != LIST_NONE)
            list_insert(reg, a, want);
    }
    if (reg->cfg.listener)
        reg->cfg.listener(reg->cfg.listener_ud, a, old, ns, reason, now);
}

registry *registry_create(const registry_config *cfg)
{
    registry *reg = calloc(1, sizeof(*reg));
    if (!reg)
        return NULL;
    if (cfg)
        reg->cfg = *cfg;
    else
        registry_config_default(&reg->cfg);
    if (reg->cfg.ramp_ms == 0)
        reg->cfg.ramp_ms = 1;
    return reg;
}

static void agent_free(registry_agent *a)
{
    free(a->name);
    free(a->version);
    free(a->platform);
    models_free(a->models, a->n_models);
    models_free(a->models_before, a->n_models_before);
    labels_free(a->labels, a->n_labels);
    free(a->prefix.slots);
    json_decref(a->facts);
    free(a);
}

static void agent_free_cb(void *v)
{
    agent_free(v);
}

void registry_destroy(registry *reg)
{
    if (!reg)
        return;
    smap_free(&reg->agents, agent_free_cb);
    smap_free(&reg->models, free);
    free(reg);
}

/* True when the names (ids and aliases, in order), their supports_tools or
 * the labels differ: what the model index and the scheduler's rings hold. */
static bool names_differ(const registry_agent *a, const registry_facts *f)
{
    if (a->n_models != f->n_models || a->n_labels != f->n_labels)
        return true;
    for (size_t i = 0; i < f->n_models; i++) {
        const registry_model_info *x = &a->models[i], *y = &f->models[i];
        if (strcmp(x->id, y->id) != 0 || x->n_aliases != y->n_aliases ||
            x->supports_tools != y->supports_tools)
            return true;
        for (size_t j = 0; j < x->n_aliases; j++)
            if (strcmp(x->aliases[j], y->aliases[j]) != 0)
                return true;
    }
    for (size_t i = 0; i < f->n_labels; i++)
        if (strcmp(a->labels[i].key, f->labels[i].key) != 0 ||
            strcmp(a->labels[i].value, f->labels[i].value) != 0)
            return true;
    return false;
}

#define SWAP_FIELD(dst, src) do { \
        __typeof__(dst) _t = (dst); (dst) = (src); (src) = _t; } while (0)

registry_agent *registry_heartbeat(registry *reg, registry_facts *f, uint64_t now_ms,
                                   int64_t wall_ms)
{
    if (!gp_uuid_valid(f->agent_id))
        return NULL;
    if (index_note(reg, f->models, f->n_models, wall_ms) < 0)
        return NULL;
    registry_agent *a = smap_get(&reg->agents, f->agent_id);
    if (!a) {
        a = calloc(1, sizeof(*a));
        if (!a)
            return NULL;
        memcpy(a->id, f->agent_id, sizeof(a->id));
        if (!smap_put(&reg->agents, a->id, a)) {
            free(a);
            return NULL;
        }
        a->state = REGISTRY_REGISTERING;
        a->registered_ms = now_ms;
        a->state_since_ms = now_ms;
        a->last_seen_ms = now_ms;
        reg->state_count[REGISTRY_REGISTERING]++;
        list_insert(reg, a, LIST_LIVE);
    }

    /* Swap the new facts in; the old ones go back into f and are freed by
     * the caller's registry_facts_free. */
    bool changed = names_differ(a, f);
    if (changed && a->in_index)
        index_count(reg, a, -1);
    SWAP_FIELD(a->name, f->name);
    SWAP_FIELD(a->version, f->version);
    SWAP_FIELD(a->platform, f->platform);
    SWAP_FIELD(a->models, f->models);
    SWAP_FIELD(a->n_models, f->n_models);
    SWAP_FIELD(a->labels, f->labels);
    SWAP_FIELD(a->n_labels, f->n_labels);
    SWAP_FIELD(a->facts, f->raw);
    SWAP_FIELD(a->prefix, f->prefix);
    a->hw = f->hw;
    if (a->prefix.reported || f->prefix.reported)
        a->prefix_gen++;
    if (changed) {
        if (a->in_index)
            index_count(reg, a, +1);
        a->models_gen++;
        /* The replaced list (now in f) is kept for registry_models_dropped,
         * unless an older one still waits there: the names lost since then
         * are what counts, and f's list is freed below. */
        if (!a->models_before && f->n_models > 0) {
            SWAP_FIELD(a->models_before, f->models);
            SWAP_FIELD(a->n_models_before, f->n_models);
        }
    }
    a->slots_total = f->slots_total > 0 ? f->slots_total : 1;
    a->slots_busy = f->slots_busy;
    a->queue_depth = f->queue_depth;
    a->kv_cache_utilization = f->kv_cache_utilization;
    a->agent_drain = f->draining;
    registry_facts_free(f);   /* releases the previous facts, now in f */

    a->last_seen_ms = now_ms;
    if (a->list_id == LIST_LIVE) {   /* move to the tail: newest last_seen */
        list_unlink(reg, a);
        list_insert(reg, a, LIST_LIVE);
    }

    registry_state target =
        (a->admin_drain || a->agent_drain) ? REGISTRY_DRAINING : REGISTRY_HEALTHY;
    switch (a->state) {
    case REGISTRY_REGISTERING:
        set_state(reg, a, target, "registered", now_ms);
        break;
    case REGISTRY_HEALTHY:
    case REGISTRY_DRAINING:
        set_state(reg, a, target, target == REGISTRY_DRAINING ? "drain" : "undrain", now_ms);
        break;
    case REGISTRY_SUSPECT:
        a->ramp_start_ms = now_ms ? now_ms : 1;
        set_state(reg, a, target, "heartbeat", now_ms);
        break;
    case REGISTRY_DEAD:
    case REGISTRY_OFFLINE:
    default:
        a->ramp_start_ms = now_ms ? now_ms : 1;
        set_state(reg, a, target, "reregistered", now_ms);
        break;
    }
    return a;
}

static void mark_name(registry *reg, const char *name, uint32_t mark, bool tools)
{
    model_ent *e = smap_get(&reg->models, name);
    if (e) {
        e->mark = mark;
        if (tools)
            e->mark_tools = mark;
    }
}

/* Every name of the list a lists now gets mark, and mark_tools too where
 * a takes tools for it. */
static void mark_names(registry *reg, const registry_agent *a, uint32_t mark)
{
    for (size_t i = 0; i < a->n_models; i++) {
        bool t = a->models[i].supports_tools;
        mark_name(reg, a->models[i].id, mark, t);
        for (size_t k = 0; k < a->models[i].n_aliases; k++)
            mark_name(reg, a->models[i].aliases[k], mark, t);
    }
}

/* name was listed (with tools: took tools for it): not listed now, or
 * listed but no more with tools. */
static void dropped_name(registry *reg, registry_agent *a, const char *name, bool tools,
                         uint32_t mark, registry_name_fn fn, void *ud)
{
    const model_ent *e = smap_get(&reg->models, name);
    if (!e || e->mark != mark)
        fn(ud, a, name, false);
    else if (tools && e->mark_tools != mark)
        fn(ud, a, name, true);
}

void registry_models_dropped(registry *reg, registry_agent *a, registry_name_fn fn, void *ud)
{
    registry_model_info *before = a ? a->models_before : NULL;
    if (!before)
        return;
    size_t n = a->n_models_before;
    a->models_before = NULL;
    a->n_models_before = 0;
    /* One mark per call instead of a set of the names: O(names) lookups,
     * nothing allocated. 0 is every entry's first mark: skipped. */
    if (++reg->mark_gen == 0)
        ++reg->mark_gen;
    uint32_t mark = reg->mark_gen;
    mark_names(reg, a, mark);
    for (size_t i = 0; i < n; i++) {
        bool t = before[i].supports_tools;
        dropped_name(reg, a, before[i].id, t, mark, fn, ud);
        for (size_t k = 0; k < before[i].n_aliases; k++)
            dropped_name(reg, a, before[i].aliases[k], t, mark, fn, ud);
    }
    models_free(before, n);
}

void registry_touch(registry *reg, registry_agent *a, uint64_t now_ms)
{
    if (!a || now_ms < a->last_seen_ms)
        return;
    a->last_seen_ms = now_ms;
    if (a->list_id == LIST_LIVE) {
        list_unlink(reg, a);
        list_insert(reg, a, LIST_LIVE);
    } else if (a->list_id == LIST_SUSPECT) {
        /* Still suspect (only a poll revives), but DEAD moves later. */
        list_unlink(reg, a);
        list_insert(reg, a, LIST_SUSPECT);
    }
}

bool registry_mark_suspect(registry *reg, registry_agent *a, uint64_t now_ms, const char *reason)
{
    if (!a)
        return false;
    if (a->state != REGISTRY_HEALTHY && a->state != REGISTRY_DRAINING &&
        a->state != REGISTRY_REGISTERING)
        return false;
    set_state(reg, a, REGISTRY_SUSPECT, reason ? reason : "poll_disconnected", now_ms);
    return true;
}

bool registry_note_instance(registry_agent *a, const char *instance)
{
    if (!a || !instance || !*instance || strcmp(a->instance, instance) == 0)
        return false;
    bool replaced = a->instance[0] != '\0';
    snprintf(a->instance, sizeof a->instance, "%s", instance);
    return replaced;
}

void registry_set_drain(registry *reg, registry_agent *a, bool on, uint64_t now_ms)
{
    if (!a)
        return;
    a->admin_drain = on;
    if (on && a->state == REGISTRY_HEALTHY)
        set_state(reg, a, REGISTRY_DRAINING, "drain", now_ms);
    else if (!on && a->state == REGISTRY_DRAINING && !a->agent_drain)
        set_state(reg, a, REGISTRY_HEALTHY, "undrain", now_ms);
}

void registry_deregister(registry *reg, registry_agent *a, uint64_t now_ms)
{
    if (a)
        set_state(reg, a, REGISTRY_OFFLINE, "deregistered", now_ms);
}

void registry_remove(registry *reg, registry_agent *a)
{
    if (!a)
        return;
    list_unlink(reg, a);
    if (a->in_index)
        index_count(reg, a, -1);
    reg->state_count[a->state]--;
    smap_del(&reg->agents, a->id);
    agent_free(a);
}

registry_agent *registry_get(const registry *reg, const char *agent_id)
{
    return agent_id ? smap_get(&reg->agents, agent_id) : NULL;
}

size_t registry_tick(registry *reg, uint64_t now_ms)
{
    size_t n = 0;
    uint64_t late = reg->cfg.poll_interval_ms + reg->cfg.grace_ms;
    /* Overdue live agents are at the head; stop at the first on-time one. */
    while (reg->live.head && now_ms > reg->live.head->last_seen_ms &&
           now_ms - reg->live.head->last_seen_ms > late) {
        set_state(reg, reg->live.head, REGISTRY_SUSPECT, "missed_heartbeat", now_ms);
        n++;
    }
    while (reg->suspect.head && now_ms >= reg->suspect.head->last_seen_ms &&
           now_ms - reg->suspect.head->last_seen_ms >= reg->cfg.agent_timeout_ms) {
        set_state(reg, reg->suspect.head, REGISTRY_DEAD, "timeout", now_ms);
        n++;
    }
    return n;
}

uint64_t registry_next_deadline(const registry *reg)
{
    uint64_t d = UINT64_MAX;
    if (reg->live.head)
        d = reg->live.head->last_seen_ms + reg->cfg.poll_interval_ms + reg->cfg.grace_ms + 1;
    if (reg->suspect.head) {
        uint64_t s = reg->suspect.head->last_seen_ms + reg->cfg.agent_timeout_ms;
        if (s < d)
            d = s;
    }
    return d;
}

double registry_agent_weight(const registry *reg, const registry_agent *a, uint64_t now_ms)
{
    if (!a->ramp_start_ms || now_ms <= a->ramp_start_ms)
        return a->ramp_start_ms ? 0.0 : 1.0;
    uint64_t el = now_ms - a->ramp_start_ms;
    if (el >= reg->cfg.ramp_ms)
        return 1.0;
    return (double)el / (double)reg->cfg.ramp_ms;
}

double registry_agent_reliability(const registry_agent *a)
{
    return ((double)a->jobs_done + 1.0) / ((double)a->jobs_done + (double)a->jobs_failed + 2.0);
}

/* The model of a that answers to name (id or alias), optionally only among
 * those that take tools; NULL when none. */
static const registry_model_info *model_named(const registry_agent *a, const char *name,
                                         bool tools_only)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < a->n_models; i++) {
        if (tools_only && !a->models[i].supports_tools)
            continue;
        if (registry_model_info_named(&a->models[i], name))
            return &a->models[i];
    }
    return NULL;
}

bool registry_agent_serves(const registry_agent *a, const char *name)
{
    return model_named(a, name, false) != NULL;
}

const char *registry_agent_model_digest(const registry_agent *a, const char *name)
{
    const registry_model_info *m = model_named(a, name, false);
    return m ? m->digest : NULL;
}

bool registry_agent_takes_tools(const registry_agent *a, const char *name)
{
    return model_named(a, name, true) != NULL;
}

bool registry_agent_takes_embeddings(const registry_agent *a, const char *name)
{
    const registry_model_info *m = model_named(a, name, false);
    return m && m->supports_embeddings;
}

bool registry_agent_generates(const registry_agent *a, const char *name)
{
    const registry_model_info *m = model_named(a, name, false);
    return m && !m->embeddings_only;
}

const char *registry_agent_label(const registry_agent *a, const char *key)
{
    for (size_t i = 0; i < a->n_labels; i++)
        if (strcmp(a->labels[i].key, key) == 0)
            return a->labels[i].value;
    return NULL;
}

void registry_job_begin(registry *reg, registry_agent *a)
{
    if (a)
        a->active++;
}

void registry_job_end(registry *reg, registry_agent *a, bool ok, double tokens_per_sec)
{
    if (!a)
        return;
    if (a->active > 0)
        a->active--;
    if (ok)
        a->jobs_done++;
    else
        a->jobs_failed++;
    if (tokens_per_sec > 0)
        a->tokens_per_sec = a->tokens_per_sec > 0
                                ? 0.7 * a->tokens_per_sec + 0.3 * tokens_per_sec
                                : tokens_per_sec;
}

void registry_job_undo(registry *reg, registry_agent *a)
{
    (void)reg;
    if (a && a->active > 0)
        a->active--;
}

void registry_foreach(const registry *reg, void (*fn)(void *ud, registry_agent *a), void *ud)
{
    size_t i;
    for (smap_node *n = smap_first(&reg->agents, &i); n; n = smap_next(&reg->agents, n, &i))
        fn(ud, n->val);
}

size_t registry_count(const registry *reg)
{
    return reg->agents.n;
}

size_t registry_count_state(const registry *reg, registry_state s)
{
    return (unsigned)s < REGISTRY_STATE_COUNT ? reg->state_count[s] : 0;
}

/* ========================================================== model index */

bool registry_model_info_named(const registry_model_info *mi, const char *name)
{
    if (strcmp(mi->id, name) == 0)
        return true;
    for (size_t k = 0; k < mi->n_aliases; k++)
        if (strcmp(mi->aliases[k], name) == 0)
            return true;
    return false;
}

bool registry_model_known(const registry *reg, const char *name)
{
    return name && smap_get(&reg->models, name) != NULL;
}

size_t registry_model_live_count(const registry *reg, const char *name)
{
    const model_ent *e = name ? smap_get(&reg->models, name) : NULL;
    return e ? e->live : 0;
}

size_t registry_model_tools_count(const registry *reg, const char *name)
{
    const model_ent *e = name ? smap_get(&reg->models, name) : NULL;
    return e ? e->live_tools : 0;
}

long long registry_model_min_context(const registry *reg, const char *name)
{
    long long ctx = 0;
    size_t it;
    for (smap_node *n = smap_first(&reg->agents, &it); n; n = smap_next(&reg->agents, n, &it)) {
        const registry_agent *a = n->val;
        if (!state_is_live(a->state))
            continue;
        for (size_t i = 0; i < a->n_models; i++) {
            const registry_model_info *mi = &a->models[i];
            if (!registry_model_info_named(mi, name))
                continue;
            if (mi->context_length > 0 && (ctx == 0 || mi->context_length < ctx))
                ctx = mi->context_length;
            break;
        }
    }
    return ctx;
}

long long registry_model_slots(const registry *reg, const char *name)
{
    long long slots = 0;
    size_t it;
    for (smap_node *n = smap_first(&reg->agents, &it); n; n = smap_next(&reg->agents, n, &it)) {
        const registry_agent *a = n->val;
        if (a->state == REGISTRY_HEALTHY && registry_agent_serves(a, name))
            slots += a->slots_total > 0 ? a->slots_total : 1;
    }
    return slots;
}

int registry_model_note(registry *reg, const char *name, int64_t created_wall_ms)
{
    model_ent *e = smap_get(&reg->models, name);
    if (e) {
        if (created_wall_ms < e->created_wall_ms)
            e->created_wall_ms = created_wall_ms;
        return 0;
    }
    return model_get_or_add(reg, name, created_wall_ms) ? 0 : -1;
}

static int entry_cmp(const void *x, const void *y)
{
    return strcmp(((const registry_model_entry *)x)->id, ((const registry_model_entry *)y)->id);
}

int registry_models_list(const registry *reg, registry_model_entry **list, size_t *n)
{
    size_t i, cnt = 0;
    *n = 0;
    *list = NULL;
    for (smap_node *nd = smap_first(&reg->models, &i); nd; nd = smap_next(&reg->models, nd, &i))
        if (((model_ent *)nd->val)->live_as_id > 0)
            cnt++;
    if (!cnt)
        return 0;
    registry_model_entry *out = calloc(cnt, sizeof(*out));
    if (!out)
        return -1;
    size_t k = 0;
    for (smap_node *nd = smap_first(&reg->models, &i); nd; nd = smap_next(&reg->models, nd, &i)) {
        model_ent *e = nd->val;
        if (e->live_as_id > 0 && k < cnt) {
            out[k].id = nd->key;
            out[k].created_wall_ms = e->created_wall_ms;
            out[k].live_agents = e->live_as_id;
            k++;
        }
    }
    qsort(out, k, sizeof(*out), entry_cmp);
    *n = k;
    *list = out;
    return 0;
}

void registry_models_foreach(const registry *reg,
                             void (*fn)(void *ud, const char *name, size_t live_agents),
                             void *ud)
{
    size_t i;
    for (smap_node *nd = smap_first(&reg->models, &i); nd; nd = smap_next(&reg->models, nd, &i))
        fn(ud, nd->key, ((const model_ent *)nd->val)->live);
}

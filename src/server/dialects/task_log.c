/* task_log: see task_log.h. */
#include "server/dialects/task_log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

/* A run's offsets are 32-bit: past this many text bytes (or ids) a new
 * run starts. */
#define RUN_MAX 0x7fffffffu
/* What one jansson event costs, roughly (for gps_tlog_bytes). */
#define JSON_EVENT_BYTES 512

typedef struct entry {
    size_t first;                 /* index of its first event */
    size_t n;                     /* events it holds (1 unless a token run) */
    json_t *ev;                   /* one event; NULL for a token run */
    /* A token run: token k's text is text[ends[k-1]..ends[k]), its ids
     * ids[id_ends[k-1]..id_ends[k]) (ends[-1] = id_ends[-1] = 0). */
    char *text;
    size_t len, cap;
    uint32_t *ends, *id_ends;
    size_t cap_tok;
    int32_t *ids;
    size_t n_ids, cap_ids;
} entry;

struct gps_tlog {
    entry *e;
    size_t n, cap;                /* entries */
    size_t count;                 /* events */
    /* The terminal event kept for out of memory (gps_tlog_append_oom),
     * built with the log, its seq set when it is appended; NULL once
     * appended. While it is here, e has room for one more entry than the
     * log holds, so that appending it allocates nothing. */
    json_t *oom_ev;
};

static int grow(void **p, size_t *cap, size_t need, size_t sz);

gps_tlog *gps_tlog_new(void)
{
    gps_tlog *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->oom_ev = json_pack("{s:i,s:s,s:{s:s,s:s}}", "seq", 0, "type", "error", "data", "code",
                          "INTERNAL", "message", "out of memory");
    if (!l->oom_ev || grow((void **)&l->e, &l->cap, 1, sizeof(entry)) < 0) {
        json_decref(l->oom_ev);
        free(l);
        return NULL;
    }
    return l;
}

static void entry_clear(entry *e)
{
    json_decref(e->ev);
    free(e->text);
    free(e->ends);
    free(e->id_ends);
    free(e->ids);
}

void gps_tlog_free(gps_tlog *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        entry_clear(&l->e[i]);
    free(l->e);
    json_decref(l->oom_ev);
    free(l);
}

size_t gps_tlog_count(const gps_tlog *l)
{
    return l ? l->count : 0;
}

size_t gps_tlog_bytes(const gps_tlog *l)
{
    if (!l)
        return 0;
    size_t b = sizeof *l + l->cap * sizeof(entry);
    for (size_t i = 0; i < l->n; i++) {
        const entry *e = &l->e[i];
        b += e->ev ? JSON_EVENT_BYTES
                   : e->cap + e->cap_tok * 2 * sizeof(uint32_t) + e->cap_ids * sizeof(int32_t);
    }
    return b;
}

size_t gps_tlog_text_bytes(const gps_tlog *l, size_t from, size_t to)
{
    size_t b = 0;
    if (!l)
        return 0;
    if (to > l->count)
        to = l->count;
    for (size_t i = 0; i < l->n && from < to; i++) {
        const entry *e = &l->e[i];
        size_t lo = e->first, hi = e->first + e->n;
        if (hi <= from)
            continue;
        if (lo >= to)
            break;
        size_t a = from > lo ? from - lo : 0, z = (to < hi ? to : hi) - lo;
        if (e->ev)
            b += json_string_length(json_object_get(json_object_get(e->ev, "data"), "text"));
        else
            b += e->ends[z - 1] - (a ? e->ends[a - 1] : 0);
    }
    return b;
}

/* Grow *p (of *cap elements of size sz) to hold need; 0 or -1. */
static int grow(void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * sz);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static entry *entry_new(gps_tlog *l)
{
    /* ... and one more for the reserved event (gps_tlog_append_oom). */
    if (grow((void **)&l->e, &l->cap, l->n + 1 + (l->oom_ev ? 1 : 0), sizeof(entry)) < 0)
        return NULL;
    entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    e->first = l->count;
    return e;
}

int gps_tlog_append(gps_tlog *l, const char *type, json_t *data, json_t *hidden)
{
    json_t *ev = json_pack("{s:I,s:s,s:o}", "seq", (json_int_t)l->count + 1, "type", type,
                           "data", data ? data : json_object());
    /* The hidden fields are part of the event (what a restart resumes
     * from): an event without them is not appended. */
    bool whole = ev && (!json_is_object(hidden) || gp_json_update_missing(ev, hidden) == 0);
    json_decref(hidden);
    entry *e = whole ? entry_new(l) : NULL;
    if (!e) {
        json_decref(ev);
        return -1;
    }
    e->ev = ev;
    e->n = 1;
    l->n++;
    l->count++;
    return 0;
}

int gps_tlog_append_oom(gps_tlog *l)
{
    if (!l || !l->oom_ev || l->n >= l->cap)
        return -1;
    /* The value in place: json_integer would allocate. */
    json_integer_set(json_object_get(l->oom_ev, "seq"), (json_int_t)l->count + 1);
    entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    e->first = l->count;
    e->ev = l->oom_ev;
    e->n = 1;
    l->oom_ev = NULL;
    l->n++;
    l->count++;
    return 0;
}

int gps_tlog_append_token(gps_tlog *l, const char *text, size_t len, const int32_t *ids,
                          size_t n_ids)
{
    entry *e = l->n ? &l->e[l->n - 1] : NULL;
    bool fresh = !e || e->ev || e->len + len > RUN_MAX || e->n_ids + n_ids > RUN_MAX;
    entry tmp;
    if (fresh) {
        memset(&tmp, 0, sizeof tmp);
        tmp.first = l->count;
        e = &tmp;
    }
    /* Grow everything first: a failure leaves the run as it was. */
    if (grow((void **)&e->text, &e->cap, e->len + len + 1, 1) < 0)
        goto oom;
    size_t ct = e->cap_tok;
    if (grow((void **)&e->ends, &ct, e->n + 1, sizeof(uint32_t)) < 0)
        goto oom;
    ct = e->cap_tok;
    if (grow((void **)&e->id_ends, &ct, e->n + 1, sizeof(uint32_t)) < 0)
        goto oom;
    e->cap_tok = ct;
    if (n_ids && grow((void **)&e->ids, &e->cap_ids, e->n_ids + n_ids, sizeof(int32_t)) < 0)
        goto oom;
    if (fresh && !entry_new(l))
        goto oom;
    memcpy(e->text + e->len, text, len);
    e->len += len;
    e->text[e->len] = '\0';
    if (n_ids)
        memcpy(e->ids + e->n_ids, ids, n_ids * sizeof *ids);
    e->n_ids += n_ids;
    e->ends[e->n] = (uint32_t)e->len;
    e->id_ends[e->n] = (uint32_t)e->n_ids;
    e->n++;
    if (fresh) {
        l->e[l->n] = tmp;
        l->n++;
    }
    l->count++;
    return 0;
oom:
    /* A grown buffer of a fresh run is not in the log yet. */
    if (fresh)
        entry_clear(&tmp);
    return -1;
}

/* A token event that a run can hold: data exactly {"text": string}, and
 * hidden members at most "ids" (an array of integers). */
static bool is_plain_token(const json_t *ev, const char *type)
{
    if (strcmp(type, "token") != 0)
        return false;
    const json_t *data = json_object_get(ev, "data");
    if (!json_is_object(data) || json_object_size(data) != 1 ||
        !json_is_string(json_object_get(data, "text")))
        return false;
    size_t extra = json_object_size(ev) - 3;
    const json_t *ids = json_object_get(ev, "ids");
    if (extra > 1 || (extra == 1 && !json_is_array(ids)))
        return false;
    size_t i;
    const json_t *v;
    json_array_foreach(ids, i, v) if (!json_is_integer(v)) return false;
    return true;
}

int gps_tlog_append_stored(gps_tlog *l, const json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type || !json_object_get(ev, "seq") || !json_object_get(ev, "data"))
        return -1;
    if (is_plain_token(ev, type)) {
        const json_t *text = json_object_get(json_object_get(ev, "data"), "text");
        const json_t *arr = json_object_get(ev, "ids");
        size_t n = json_array_size(arr);
        int32_t *ids = n ? malloc(n * sizeof *ids) : NULL;
        if (n && !ids)
            return -1;
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
        int rc = gps_tlog_append_token(l, json_string_value(text), json_string_length(text),
                                       ids, n);
        free(ids);
        return rc;
    }
    json_t *hidden = json_deep_copy(ev);
    /* (gps_tlog_append takes NULL data for {}: not the stored event) */
    json_t *data = json_deep_copy(json_object_get(ev, "data"));
    if (!hidden || !data) {
        json_decref(hidden);
        json_decref(data);
        return -1;
    }
    json_object_del(hidden, "seq");
    json_object_del(hidden, "type");
    json_object_del(hidden, "data");
    return gps_tlog_append(l, type, data, hidden);
}

/* The entry holding event i (i < count). */
static const entry *entry_of(const gps_tlog *l, size_t i)
{
    size_t lo = 0, hi = l->n; /* e[lo].first <= i < e[hi].first */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->e[mid].first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return &l->e[lo];
}

json_t *gps_tlog_get(const gps_tlog *l, size_t i)
{
    if (!l || i >= l->count)
        return NULL;
    const entry *e = entry_of(l, i);
    if (e->ev)
        return json_incref(e->ev);
    size_t k = i - e->first;
    size_t t0 = k ? e->ends[k - 1] : 0, i0 = k ? e->id_ends[k - 1] : 0;
    json_t *ev = json_pack("{s:I,s:s,s:{s:s%}}", "seq", (json_int_t)i + 1, "type", "token",
                           "data", "text", e->text + t0, (size_t)e->ends[k] - t0);
    if (ev && e->id_ends[k] > i0) {
        json_t *ids = json_array();
        /* An id that could not be added is the event's failure, not an
         * event with fewer ids (a restart would resume from them). */
        for (size_t j = i0; ids && j < e->id_ends[k]; j++)
            if (json_array_append_new(ids, json_integer(e->ids[j])) < 0) {
                json_decref(ids);
                ids = NULL;
            }
        if (!ids || json_object_set_new(ev, "ids", ids) < 0) {
            json_decref(ev);
            return NULL;
        }
    }
    return ev;
}

const char *gps_tlog_type(const gps_tlog *l, size_t i)
{
    if (!l || i >= l->count)
        return NULL;
    const entry *e = entry_of(l, i);
    return e->ev ? json_string_value(json_object_get(e->ev, "type")) : "token";
}

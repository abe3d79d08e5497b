/* prefix_index: checkpoint -> slots (see prefix_index.h). */
#include "server/fleet/prefix_index.h"

#include <stdio.h>
#include <stdlib.h>

#include "server/fleet/gps_strmap.h"

/* "kind\x1fn\x1fhash": kind <= 8, n <= 20 digits, hash GP_PREFIX_HEX. */
#define KEY_MAX 64

typedef struct bucket {
    pidx_entry *head, *tail;
    size_t n;
    char key[KEY_MAX];
} bucket;

struct pidx_entry {
    pidx_entry *prev, *next;   /* in its bucket, oldest-taken first */
    bucket *b;
    void *ud;
    long units;                /* the whole chain the slot holds */
};

struct pidx {
    smap buckets;
    size_t n;
};

static void key_of(char *buf, const char *kind, long n, const char *h)
{
    snprintf(buf, KEY_MAX, "%s\x1f%ld\x1f%s", kind, n, h);
}

static void link_tail(bucket *b, pidx_entry *e)
{
    e->b = b;
    e->next = NULL;
    e->prev = b->tail;
    if (b->tail)
        b->tail->next = e;
    else
        b->head = e;
    b->tail = e;
    b->n++;
}

static void unlink_entry(pidx_entry *e)
{
    bucket *b = e->b;
    if (e->prev)
        e->prev->next = e->next;
    else
        b->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        b->tail = e->prev;
    b->n--;
    e->prev = e->next = NULL;
}

pidx *pidx_create(void)
{
    return calloc(1, sizeof(pidx));
}

void pidx_destroy(pidx *x)
{
    if (!x)
        return;
    /* Owners free their own arrays; the buckets are the index's. */
    smap_free(&x->buckets, free);
    free(x);
}

void pidx_owner_clear(pidx *x, pidx_owner *o)
{
    for (size_t i = 0; i < o->n; i++) {
        pidx_entry *e = &o->ents[i];
        if (!e->b)
            continue;
        bucket *b = e->b;
        unlink_entry(e);
        x->n--;
        if (b->n == 0) {
            smap_del(&x->buckets, b->key);
            free(b);
        }
    }
    free(o->ents);
    o->ents = NULL;
    o->n = 0;
}

int pidx_owner_set(pidx *x, pidx_owner *o, void *ud, const registry_prefix *prefix)
{
    pidx_owner_clear(x, o);
    size_t want = 0;
    for (size_t s = 0; prefix && s < prefix->n_slots; s++)
        if (prefix->slots[s].desc.kind[0])
            want += (size_t)prefix->slots[s].desc.n_pts;
    if (!want)
        return 0;
    o->ents = calloc(want, sizeof *o->ents);
    if (!o->ents)
        return -1;
    for (size_t s = 0; s < prefix->n_slots; s++) {
        const registry_prefix_slot *ps = &prefix->slots[s];
        const gp_prefix_desc *d = &ps->desc;
        if (!d->kind[0])
            continue;
        for (int p = 0; p < d->n_pts; p++) {
            char key[KEY_MAX];
            key_of(key, d->kind, d->pts[p].n, d->pts[p].h);
            bucket *b = smap_get(&x->buckets, key);
            if (!b) {
                if (!(b = calloc(1, sizeof *b)))
                    goto oom;
                snprintf(b->key, sizeof b->key, "%s", key);
                if (!smap_put(&x->buckets, key, b)) {
                    free(b);
                    goto oom;
                }
            }
            pidx_entry *e = &o->ents[o->n++];
            e->ud = ud;
            e->units = d->units;
            link_tail(b, e);
            x->n++;
        }
    }
    return 0;
oom:
    pidx_owner_clear(x, o);
    return -1;
}

/* The unit counts a lookup probes, deepest first: U .. U-PIDX_RECENT+1,
 * then the powers of two below. Returns how many (at most PIDX_RECENT + 64). */
static size_t depths(long units, long *out)
{
    size_t k = 0;
    long lo = units - PIDX_RECENT + 1;
    for (long n = units; n >= 1 && n >= lo; n--)
        out[k++] = n;
    long p = 1;
    while (p * 2 < lo && p * 2 > 0)
        p *= 2;
    for (; p >= 1 && p < lo; p /= 2)
        out[k++] = p;
    return k;
}

long pidx_route(pidx *x, const gp_prefix_chain *req, bool (*accept)(void *ctx, void *ud),
                void *ctx, void **ud_out)
{
    *ud_out = NULL;
    if (!x || !req || req->units <= 0 || x->n == 0)
        return 0;
    long ns[PIDX_RECENT + 64];
    size_t nd = depths(req->units, ns);
    for (size_t i = 0; i < nd; i++) {
        long n = ns[i];
        char key[KEY_MAX];
        key_of(key, req->kind, n, req->h[n - 1]);
        bucket *b = smap_get(&x->buckets, key);
        if (!b)
            continue;
        size_t visit = 0;
        for (pidx_entry *e = b->head; e && visit < PIDX_VISIT; e = e->next, visit++) {
            if ((n < 2 && n != e->units) || !accept(ctx, e->ud))
                continue;
            /* Rotate: equal matches (a prompt many conversations share)
             * take turns instead of piling onto one agent. */
            unlink_entry(e);
            link_tail(b, e);
            *ud_out = e->ud;
            return n;
        }
    }
    return 0;
}

size_t pidx_size(const pidx *x)
{
    return x ? x->n : 0;
}

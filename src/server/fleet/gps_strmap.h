/*
 * gps_strmap: a small string -> pointer hash map (separate chaining, FNV-1a,
 * doubling when the load factor passes 1), header-only for the registry and
 * the scheduler. Keys are copied into the node; values are borrowed (the
 * map never frees them unless asked through smap_free's callback).
 *
 * Expected O(1) get/put/del. Not thread-safe.
 */
#ifndef GPS_STRMAP_H
#define GPS_STRMAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct smap_node {
    struct smap_node *next;
    uint64_t hash;
    void *val;
    char key[];          /* NUL-terminated copy */
} smap_node;

typedef struct smap {
    smap_node **b;
    size_t nb;           /* power of two, or 0 before the first put */
    size_t n;
} smap;

static inline uint64_t smap_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;           /* FNV-1a 64 offset basis */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;                     /* FNV-1a 64 prime */
    }
    return h;
}

static inline smap_node *smap_find(const smap *m, const char *key)
{
    if (!m->nb)
        return NULL;
    uint64_t h = smap_hash(key);
    for (smap_node *n = m->b[h & (m->nb - 1)]; n; n = n->next)
        if (n->hash == h && strcmp(n->key, key) == 0)
            return n;
    return NULL;
}

static inline void *smap_get(const smap *m, const char *key)
{
    smap_node *n = smap_find(m, key);
    return n ? n->val : NULL;
}

static inline int smap_grow(smap *m)
{
    size_t nb = m->nb ? m->nb * 2 : 16;
    smap_node **b = calloc(nb, sizeof(*b));
    if (!b)
        return -1;
    for (size_t i = 0; i < m->nb; i++) {
        smap_node *n = m->b[i];
        while (n) {
            smap_node *next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    free(m->b);
    m->b = b;
    m->nb = nb;
    return 0;
}

/* Insert or replace. Returns the node (its key stays valid until the entry
 * is deleted), or NULL on ENOMEM. */
static inline smap_node *smap_put(smap *m, const char *key, void *val)
{
    smap_node *n = smap_find(m, key);
    if (n) {
        n->val = val;
        return n;
    }
    if (m->n >= m->nb && smap_grow(m) < 0)
        return NULL;
    size_t len = strlen(key);
    n = malloc(sizeof(*n) + len + 1);
    if (!n)
        return NULL;
    memcpy(n->key, key, len + 1);
    n->hash = smap_hash(key);
    n->val = val;
    n->next = m->b[n->hash & (m->nb - 1)];
    m->b[n->hash & (m->nb - 1)] = n;
    m->n++;
    return n;
}

/* Remove key; returns its value (or NULL when absent). */
static inline void *smap_del(smap *m, const char *key)
{
    if (!m->nb)
        return NULL;
    uint64_t h = smap_hash(key);
    for (smap_node **pp = &m->b[h & (m->nb - 1)]; *pp; pp = &(*pp)->next) {
        smap_node *n = *pp;
        if (n->hash == h && strcmp(n->key, key) == 0) {
            void *v = n->val;
            *pp = n->next;
            free(n);
            m->n--;
            return v;
        }
    }
    return NULL;
}

/* Free all nodes, calling fn(val) on each value first when fn is given. */
static inline void smap_free(smap *m, void (*fn)(void *val))
{
    for (size_t i = 0; i < m->nb; i++) {
        smap_node *n = m->b[i];
        while (n) {
            smap_node *next = n->next;
            if (fn)
                fn(n->val);
            free(n);
            n = next;
        }
    }
    free(m->b);
    m->b = NULL;
    m->nb = m->n = 0;
}

/* Iterate: for (smap_node *n = smap_first(m, &i); n; n = smap_next(m, n, &i)).
 * The map must not change during the walk. */
static inline smap_node *smap_next_bucket(const smap *m, size_t *i)
{
    for (; *i < m->nb; (*i)++)
        if (m->b[*i])
            return m->b[*i];
    return NULL;
}
static inline smap_node *smap_first(const smap *m, size_t *i)
{
    *i = 0;
    return smap_next_bucket(m, i);
}
static inline smap_node *smap_next(const smap *m, smap_node *n, size_t *i)
{
    if (n->next)
        return n->next;
    (*i)++;
    return smap_next_bucket(m, i);
}

#endif

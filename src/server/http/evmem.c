/* evmem: libevent's allocator with an emergency reserve (evmem.h). */
#include "server/http/evmem.h"

#include <stdatomic.h>
#include <stdlib.h>

#include <event2/event.h>

/* The reserve is a plain malloc'd block: spending it is free(), so the
 * retry's memory comes from malloc like any other and libevent's free
 * (plain free) is right for every pointer we hand out. */
static _Atomic(void *) reserve;
static atomic_bool low;
static size_t reserve_size;
static void (*_Atomic low_fn)(void *);
static void *_Atomic low_arg;

/* An allocation failed: give the reserve back to malloc, once. Returns
 * whether there was one to give (the caller then retries). */
static bool spend_reserve(void)
{
    void *r = atomic_exchange(&reserve, NULL);
    if (!r)
        return false;
    free(r);
    atomic_store(&low, true);
    void (*fn)(void *) = atomic_load(&low_fn);
    if (fn)
        fn(atomic_load(&low_arg));
    return true;
}

/* An allocation as large as the reserve would not be helped by it (and
 * libevent handles those failing: buffers' growth); the reserve is kept
 * for the small ones it does not handle. */
static void *evmem_malloc(size_t n)
{
    void *p = malloc(n);
    if (p || n >= reserve_size || !spend_reserve())
        return p;
    return malloc(n);
}

/* realloc leaves p as it was when it fails: the retry may take it again. */
static void *evmem_realloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (q || n == 0 || n >= reserve_size || !spend_reserve())
        return q;
    return realloc(p, n);
}

int gps_evmem_init(size_t reserve_bytes)
{
    void *r = reserve_bytes ? malloc(reserve_bytes) : NULL;
    if (!r)
        return -1;
    reserve_size = reserve_bytes;
    atomic_store(&reserve, r);
    atomic_store(&low, false);
    event_set_mem_functions(evmem_malloc, evmem_realloc, free);
    return 0;
}

bool gps_evmem_low(void)
{
    return atomic_load_explicit(&low, memory_order_relaxed);
}

int gps_evmem_restore(void)
{
    if (!atomic_load(&low))
        return 0;
    void *r = malloc(reserve_size);
    if (!r)
        return -1;
    /* low is cleared before the block is published: a failure in another
     * thread after the publication sets it again, never the reverse. */
    atomic_store(&low, false);
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&reserve, &none, r)) {
        free(r); /* another thread restored it first */
        return 0;
    }
    return 1;
}

void gps_evmem_on_low(void (*fn)(void *arg), void *arg)
{
    atomic_store(&low_arg, arg);
    atomic_store(&low_fn, fn);
}

size_t gps_evmem_reserve_bytes(void)
{
    return reserve_size;
}

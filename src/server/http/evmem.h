/*
 * evmem: libevent's allocator, with an emergency reserve.
 *
 * libevent 2.1.12 does not survive some of its own allocation failures:
 * bufferevent_setwatermark goes on with the NULL of a callback entry it
 * could not allocate (every connection's first request sets a high
 * watermark: http_conn.c http_conn_detach), evhttp frees a half-made
 * connection when its set-up runs short (evhttp_connection_base_bufferevent_new)
 * and answers a bare HTML 400 when its parser cannot allocate. None of that
 * is reachable from our code, so libevent's allocations must not fail.
 *
 * gps_evmem_init installs malloc/realloc/free for libevent that keep a
 * block of reserve_bytes aside: when an allocation fails, the block goes
 * back to malloc and the allocation is tried once more, so the libevent
 * path that cannot handle a NULL gets its memory. Memory is then "low"
 * until the block can be allocated again (gps_evmem_restore); meanwhile
 * the http layer accepts no new connection (http.c, "Memory low"): a
 * second failure finds no reserve and gets libevent's plain NULL.
 *
 * The fast path is malloc itself; the reserve's hand-over is atomic, so
 * the allocator itself is safe from any thread; the hook the http layer
 * installs (gps_evmem_on_low) is not: it sets plain flags and activates an
 * event without libevent's locks, which holds because the server's
 * libevent runs on the loop thread alone (docs/architecture.md "Threads").
 * An allocation as large as the reserve is not retried: the reserve would
 * not cover it, and libevent handles those failing (a buffer's growth).
 */
#ifndef GPS_EVMEM_H
#define GPS_EVMEM_H

#include <stdbool.h>
#include <stddef.h>

/* What the server keeps aside: far more than any one of libevent's
 * allocations on a connection's path (a bufferevent, an evhttp connection
 * or request, an evbuffer chain of a read). */
#define GPS_EVMEM_RESERVE_BYTES (256u * 1024u)

/* Install the allocator with a reserve of reserve_bytes (> 0). Call before
 * any other libevent call (event_set_mem_functions' rule), once. Returns 0,
 * or -1 when the reserve cannot be allocated (the allocator is then not
 * installed). */
int gps_evmem_init(size_t reserve_bytes);

/* The reserve was spent and is not back yet. */
bool gps_evmem_low(void);

/* Try to allocate the reserve again: 1 when it was allocated now (memory is
 * no longer low), 0 when it was held already, -1 when there is still no
 * memory for it. */
int gps_evmem_restore(void);

/* fn(arg) runs once each time the reserve is spent, right after, on the
 * thread that allocated and inside libevent's allocator: it must not
 * allocate nor call libevent, except event_active() on an event of the
 * calling loop (what http.c does). NULL removes it. */
void gps_evmem_on_low(void (*fn)(void *arg), void *arg);

/* The reserve's size (0 before gps_evmem_init), for logs. */
size_t gps_evmem_reserve_bytes(void);

#endif

/*
 * store_pg_none.c: built instead of store_pg.c when libpq was not found at
 * configure time. The store then refuses a postgresql:// database with a
 * message saying so (store.c, engine_for) and SQLite works as ever.
 */
#include <stddef.h>

#include "server/store/store_engine.h"

const gps_store__engine *gps_store__pg(void) { return NULL; }

gps_store_listener *gps_store__listener_new(gps_store__listen_hub **slot, const char *target,
                                            const char *label, struct event_base *base,
                                            const char *const *channels,
                                            gps_store_notify_fn fn, void *arg)
{
    (void)slot;
    (void)target;
    (void)label;
    (void)base;
    (void)channels;
    (void)fn;
    (void)arg;
    return NULL;
}

void gps_store__listen_detach(gps_store__listen_hub *hub) { (void)hub; }

void gps_store_listener_free(gps_store_listener *l) { (void)l; }

/*
 * store_pg_none.c: built instead of store_pg.c when libpq was not found at
 * configure time. The store then refuses a postgresql:// database with a
 * message saying so (store.c, engine_for) and SQLite works as ever.
 */
#include <stddef.h>

#include "server/store/store_engine.h"

const gps_store__engine *gps_store__pg(void) { return NULL; }

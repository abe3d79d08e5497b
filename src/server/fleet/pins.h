/*
 * pins: model attestation. An operator pins a model name (a public id or an
 * alias) to the sha256 of the file that must serve it; an agent whose model
 * for that name reports another digest, or none, is refused for that model:
 * the model is dropped from its poll facts before the registry sees them,
 * so nothing is ever routed to it, and the refusal (with its reason) is kept
 * per agent for `agents list` (docs/admin.md "Model pins").
 *
 * The table is the server's in-memory truth (loaded from the store at
 * start-up; an admin change is applied once the database holds it); a
 * change applies to each agent at its next poll. Bounded: at most GPS_PINS_MAX pins; refusals are
 * kept per agent that has some (replaced at every poll, forgotten with the
 * agent). Not thread-safe (the event loop's).
 */
#ifndef GPS_PINS_H
#define GPS_PINS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "server/fleet/registry.h"

#define GPS_PINS_MAX 4096

typedef struct gps_pins gps_pins;

gps_pins *gps_pins_new(void);
void gps_pins_free(gps_pins *p);

/* True for a name a pin may have (1..256 printable bytes, no spaces) and a
 * digest (64 lower-case hex). */
bool gps_pins_name_ok(const char *name);
bool gps_pins_sha_ok(const char *sha256);

/* Pin name to sha256 in the table alone, at once (replacing an earlier
 * pin of name): the start-up load's and the tests'. created_by may be
 * NULL. Returns 0, -1 on a bad name or digest or ENOMEM, -2 when the table
 * is full, -4 when an admin change of name waits for its commit. */
int gps_pins_set(gps_pins *p, const char *name, const char *sha256, int64_t created_at,
                 const char *created_by);
/* Returns 0 when removed, 1 when there was no such pin, -4 as above. */
int gps_pins_delete(gps_pins *p, const char *name);

/* An operator's change (the admin API). With a store, it is applied to the
 * table only once its row is committed (gps_store_pin_set_async): until
 * then the table is as it was, and a write that fails leaves it so, the
 * operator told (500) rather than answered with a pin the database lacks
 * (gone at the next restart). Returns 0 when the change was accepted: done
 * then runs exactly once, later on the loop thread (at once, before the
 * return, without a store), with rc 0 (applied: p is the table) or -1 (the
 * write failed; nothing changed), and p NULL when the table was freed
 * meanwhile (the server stopping). done may be NULL. Otherwise done never
 * runs:
 *   put: -1 a bad name or digest, or ENOMEM, -2 the table is full,
 *   delete: 1 no such pin,
 *   both: -4 another change of that name is being written (retry),
 *         -5 the store refused to queue the write (out of memory, or its
 *         DB thread is gone). */
struct gps_store;
typedef void (*gps_pins_done_fn)(void *arg, gps_pins *p, int rc);
int gps_pins_put(gps_pins *p, struct gps_store *store, const char *name, const char *sha256,
                 int64_t created_at, const char *created_by, gps_pins_done_fn done, void *arg);
int gps_pins_remove(gps_pins *p, struct gps_store *store, const char *name,
                    gps_pins_done_fn done, void *arg);

/* Start-up load: the whole model_pins table, or -1 with err (the step
 * that failed, out of memory, more rows than GPS_PINS_MAX) and the table
 * left empty: a server must not attest with part of its pins (an agent
 * would serve a model whose pin was not read). A row that is not a valid
 * pin (edited by hand) is skipped and logged. */
int gps_pins_load(gps_pins *p, struct gps_store *store, char *err, size_t errlen);
/* The digest name is pinned to, or NULL. Borrowed until the next change. */
const char *gps_pins_get(const gps_pins *p, const char *name);
size_t gps_pins_count(const gps_pins *p);
/* [{name, sha256, created_at, created_by}] sorted by name (new reference),
 * NULL on ENOMEM. */
json_t *gps_pins_list(const gps_pins *p);

/* Apply the pins to one poll's facts: every model with a pinned name (id or
 * alias) whose digest differs from the pin, or is missing, is dropped from
 * f->models. The refusals ([{model, name, expected, got, reason}]) replace
 * what was kept for f->agent_id (none kept when there are none). Returns
 * the number of models dropped. */
size_t gps_pins_filter(gps_pins *p, registry_facts *f);
/* What gps_pins_filter refused for agent_id at its last poll (borrowed), or
 * NULL when nothing was. */
json_t *gps_pins_refused(const gps_pins *p, const char *agent_id);
/* The agent was removed: drop what was kept for it. */
void gps_pins_forget(gps_pins *p, const char *agent_id);

#endif

/*
 * pins: model attestation. An operator pins a model name (a public id or an
 * alias) to the sha256 of the file that must serve it; an agent whose model
 * for that name reports another digest, or none, is refused for that model:
 * the model is dropped from its poll facts before the registry sees them,
 * so nothing is ever routed to it, and the refusal (with its reason) is kept
 * per agent for `agents list` (docs/admin.md "Model pins").
 *
 * The table is the server's in-memory truth (loaded from the store at
 * start-up, written through by the admin API); a change applies to each
 * agent at its next poll. Bounded: at most GPS_PINS_MAX pins; refusals are
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

/* Pin name to sha256 (replacing an earlier pin of name). created_by may be
 * NULL. Returns 0, -1 on a bad name or digest or ENOMEM, -2 when the table
 * is full. */
int gps_pins_set(gps_pins *p, const char *name, const char *sha256, int64_t created_at,
                 const char *created_by);
/* Returns 0 when removed, 1 when there was no such pin. */
int gps_pins_delete(gps_pins *p, const char *name);
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

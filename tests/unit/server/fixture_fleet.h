/*
 * fixture_fleet: the server's fleet side for unit tests of the jobs module
 * (jobs + scheduler + registry on a real event base, no HTTP, no store):
 * agents made by a real poll body, jobs submitted, taken and fed events
 * through the public functions, deliveries to a parked long-poll recorded.
 *
 * Used by test_jobs_submit.c, test_failover_plan.c, test_jobs_tokens.c and
 * test_liveness.c. Failures are cmocka assertions (the caller's test
 * stops there).
 */
#ifndef FIXTURE_FLEET_H
#define FIXTURE_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/jobs/jobs.h"
/* The jobs tests inspect and build jobs by hand: struct gps_job's fields. */
#include "server/jobs/jobs_internal.h"
#include "server/fleet/registry.h"
#include "server/fleet/sched.h"

typedef struct fleet {
    struct event_base *base;
    bool own_base;
    registry *reg;
    sched *s;
    gps_jobs *jobs;
    /* What the deliver callback saw (jobs assigned to a parked poll). */
    int delivered;                 /* calls */
    registry_agent *delivered_to;  /* agent of the last call */
    json_t *delivery;              /* the last call's array of wire objects (owned) */
    int refused;                   /* calls without jobs (not written): answered 500 */
} fleet;

/* The jobs options most tests use: queue 10, timeouts 60 s, 3 attempts,
 * poll 1 s, no backoff. */
gps_jobs_opts fleet_opts(void);
/* o NULL: fleet_opts(). rc NULL: registry defaults with grace_ms 0 (a
 * test's clock does not move). Installs the recording deliver callback:
 * an agent made ready and then given a job is unready again. */
void fleet_init(fleet *f, const gps_jobs_opts *o, const registry_config *rc);
/* The same on the caller's base (borrowed: fleet_free leaves it), for a
 * test that makes something the registry reports to (agents_api) first,
 * or that needs a store (borrowed, may be NULL). */
void fleet_init_on(fleet *f, struct event_base *base, const gps_jobs_opts *o,
                   const registry_config *rc, struct gps_store *store);
void fleet_free(fleet *f);

/* Agent number i (id 00000000-0000-4000-8000-<i as 12 hex digits>,
 * name "a<i>") polls with one model (digest NULL = none) and slots
 * total slots at now_ms. Returns the registry's agent (borrowed). */
registry_agent *fleet_agent(fleet *f, int i, const char *model, const char *digest, int slots,
                            uint64_t now_ms);

/* A completion spec for model ("hello", max_tokens, temperature 0, top_p
 * 1, api "openai"): the caller adds what it needs and submits it. */
gps_job_spec fleet_spec(const char *model, long long max_tokens);
/* Submit spec (moved in) and assert it was accepted. */
gps_job *fleet_submit(fleet *f, gps_job_spec *spec);

/* Agent a asks for one job and gets exactly one: its wire object (new
 * reference). The agent is unready afterwards (its poll is answered). */
json_t *fleet_take(fleet *f, registry_agent *a);
/* The same, the reply numbered delivery (gps_jobs_take_for_agent). */
json_t *fleet_take_numbered(fleet *f, registry_agent *a, uint64_t delivery);
/* Agent a uploads events (a JSON array text) for job from seq: the
 * return of gps_jobs_apply_events. */
int fleet_apply(fleet *f, gps_job *job, registry_agent *a, long long seq, const char *events);

/* Run the event loop until pred(arg) holds or deadline_ms (of the real
 * clock) pass: returns what pred said last. For the jobs module's own
 * timers (sweep, backoff); nothing here races another process. */
bool fleet_run_until(fleet *f, bool (*pred)(void *arg), void *arg, int deadline_ms);

#endif

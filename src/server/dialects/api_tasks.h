/*
 * api_tasks: the native task API (asynchronous jobs with a replayable
 * event stream).
 *
 *   POST   /v2/tasks              -> 202 {job_id, status, queue_position, events_url, seed}
 *   GET    /v2/tasks/{id}         -> status; result, usage, timings, agent, attempts when done
 *   GET    /v2/tasks/{id}/events  -> SSE: "id: <seq>", "event: <type>", data JSON
 *   DELETE /v2/tasks/{id}         -> cancel (idempotent), terminal code CANCELLED
 *
 * Events of a task, numbered from 1 in one sequence: queued {position,
 * estimated_wait_ms} (again each time the position changes), started
 * {agent_id, attempt}, token {text}, metrics {...}, failover {from_agent,
 * reason, attempt, completion_tokens} (see below), then exactly one of
 * end {finish_reason, usage, text} or error {code, message}.
 *
 * Every event is kept in memory while the task is hot (until task_hot_sec,
 * default 5 minutes, after its end): a reconnect with Last-Event-ID
 * (header, or the last_event_id query parameter) replays exactly the
 * events after it, then continues live (never an id <= Last-Event-ID, also
 * one beyond the current end). The events are written to the store's
 * job_events (async, group-committed, one batch in flight per task) and
 * go to clients only once committed (store.h durability notification), so
 * an id once sent means the same event forever: once the task left
 * memory, or after a crash and restart, the same events come from the
 * store and the numbering continues after the last one sent. The whole request
 * with its seed is stored too: at start-up gps_tasks_restore resubmits
 * unfinished tasks under their id (docs/persistence.md).
 *
 * A task holds a subscription on its job: tokens are durable to the client
 * as soon as they are recorded, so a lost agent after the first token is
 * never a silent requeue that would repeat text: with failover "continue"
 * (the default) a `failover` event is recorded and another agent continues
 * the text (`started` again, then more tokens); with "restart" or "error"
 * the task ends with AGENT_LOST. Errors use the native shape {"error":{"code","message","details",
 * "correlation_id"}}.
 */
#ifndef GPS_API_TASKS_H
#define GPS_API_TASKS_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/jobs/jobs.h"

/* Validate a POST /v2/tasks body into spec (api "native"; kind completion
 * for prompt, chat for messages). A missing seed is generated and recorded
 * (has_seed set). Returns 0, or -1 with msg and *param (static, or NULL),
 * or GPS_PARSE_OOM (reqcheck.h) with msg and no param; on error spec holds
 * nothing to free. */
int gps_tasks_parse(const json_t *body, gps_job_spec *spec, char *msg, size_t msglen,
                    const char **param);

/* Parse a Last-Event-ID value: 0 for NULL/empty, the number, or -1 when
 * it is not a non-negative integer. */
long long gps_tasks_last_event_id(const char *s);

struct gps_http;
struct gps_store;
struct gps_metrics;
typedef struct gps_tasks gps_tasks;
/* jobs, store (may be NULL), metrics are borrowed. NULL on ENOMEM. */
gps_tasks *gps_tasks_new(struct event_base *base, gps_jobs *jobs, struct gps_store *store,
                         struct gps_metrics *metrics, int request_timeout_sec);
/* Free after the HTTP server; before the jobs table. */
void gps_tasks_free(gps_tasks *t);
int gps_tasks_register(struct gps_http *h, gps_tasks *t);
/* How long a finished task stays in memory (replay from memory, then from
 * the store); <= 0 restores the default of 300 s (config task_hot_sec). */
void gps_tasks_set_hot_sec(gps_tasks *t, int sec);
/* ... and only while the finished tasks in memory hold at most n events
 * together: past it the oldest finished ones (whose events are in the
 * store, with no open stream) go cold early; the newest finished task
 * stays, whatever its size. 0 = no cap (config task_hot_max_events). */
void gps_tasks_set_hot_max_events(gps_tasks *t, size_t n);
/* Tasks in memory and the events they hold (for /metrics; walks them). */
void gps_tasks_memory(const gps_tasks *t, size_t *tasks, size_t *events);

struct gps_auth;
/* With auth on, a task created while auth was off (no owner key) is
 * visible only to admin keys; auth (borrowed) tells a key's role. Without
 * it such tasks are visible to no key at all once auth is on. */
void gps_tasks_set_auth(gps_tasks *t, struct gps_auth *auth);

/* Several servers on one database (a PostgreSQL store whose schema has the
 * lease columns, migration 0010; docs/scaling.md "Native tasks across
 * servers"). This server, under server_id (unique per process), holds the
 * tasks it runs with a lease of lease_sec seconds that it renews; a task
 * whose lease expired (its server died) is claimed by one server that
 * serves its model, which resumes it from the stored log as a restart
 * does; its event writes are fenced by the claim's attempt. A task that is
 * not in memory is followed from the store (polled every FOLLOW_MS) until
 * its terminal event. At start-up, gps_tasks_restore then leaves native
 * tasks to the claim. Returns 0, or -1 when the store cannot (SQLite keeps
 * the one-server behaviour). */
int gps_tasks_set_shared(gps_tasks *t, const char *server_id, int lease_sec);
/* How often (ms, > 0) a follower or a cancel waiter reads the store when no
 * notification came (LISTEN/NOTIFY wakes them at once; this poll catches a
 * notification lost). Default FOLLOW_MS (100). */
void gps_tasks_set_follow_ms(gps_tasks *t, int ms);

struct gps_store_job_info;
/* Start-up recovery: take over an unfinished native task read from the
 * store (request, seed and event log). It is resubmitted from the tick
 * under the same id and seed, its events continuing their numbering; one
 * that had produced tokens continues from that text (a `failover` event
 * with reason SERVER_RESTART comes first). It fails with its submit error
 * when no agent takes it within request_timeout_sec. Returns 0 when taken,
 * -1 when j is not a restorable native task (the caller fails it), -2 out
 * of memory (nothing restored, nothing written: the task must not be
 * failed for it). Shared (gps_tasks_set_shared): 0 for every native task,
 * left to the claim. */
int gps_tasks_restore(gps_tasks *t, const struct gps_store_job_info *j);
/* Start-up recovery: read the unfinished jobs of the previous run from the
 * store (gps_tasks_new's); restore each native task (gps_tasks_restore)
 * and mark every other row, a native one that cannot be restored (damaged)
 * included, failed with SERVER_RESTART, unless others_swept (a database
 * several servers share, whose orphan sweep fails the rows of servers that
 * are gone). Returns 0, or -1 with a message in err when the rows could
 * not be read or a native task could not be restored for lack of memory:
 * the server must not start then. No task was failed for it, and the rows
 * not read yet are left as they are: the next start reads them again. */
int gps_tasks_restore_unfinished(gps_tasks *t, bool others_swept, char *err, size_t errlen);

#endif

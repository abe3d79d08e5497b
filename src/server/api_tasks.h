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
 * Every event is kept in memory while the task is hot (until 5 minutes
 * after its end): a reconnect with Last-Event-ID (header, or the
 * last_event_id query parameter) replays exactly the events after it.
 * When the task is terminal its text and last seq are written to
 * job_checkpoints, so once it left memory the server replays its terminal
 * event (end carries the whole text) from the store.
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

#include <stddef.h>

#include <event2/event.h>
#include <jansson.h>

#include "server/jobs.h"

/* Validate a POST /v2/tasks body into spec (api "native"; kind completion
 * for prompt, chat for messages). A missing seed is generated and recorded
 * (has_seed set). Returns 0, or -1 with msg and *param (static, or NULL);
 * on error spec holds nothing to free. */
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

#endif

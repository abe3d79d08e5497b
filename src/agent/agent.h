/*
 * agent: the agent's protocol loop (docs/protocol.md), one thread.
 *
 * The thread that calls agent_run runs a libevent loop. One libcurl multi
 * handle, driven from it (curl_multi_socket_action), carries every request
 * to the server, so a parked /agents/work long-poll, the /agents/poll
 * heartbeat and the per-job event uploads proceed concurrently over reused
 * connections. A backend that binds to the loop (bind_loop, backend.h: the
 * openai backend) runs its jobs there too; others run threads of their own.
 * Either hands events over through the job sinks (agent_job_sink in
 * backend.h): they lock the agent's mutex, append to the job's event queue
 * and, when that gives the loop something new to do (the first event to
 * send, the first output, the end), link the job on the loop's list of
 * changed jobs and wake it: from another thread through an eventfd; on
 * the loop's own thread, at the release that ends a backend's callback,
 * by running the loop's turn there and then (plain tokens) or by making
 * its turn event active (a first output or an end: see loop_wake_now).
 * The loop takes that list once a turn and never walks every job on a
 * wake-up; deadlines and upload retries wait in timer heaps.
 *
 *   agent *a = agent_create(&opts, backend, err, sizeof err);
 *   // another thread (signals): agent_stop(a, false) to drain, true to quit
 *   int rc = agent_run(a);     // returns when drained or stopped: exit code
 *   agent_destroy(a);
 */
#ifndef AGENT_AGENT_H
#define AGENT_AGENT_H

#include <stdbool.h>
#include <stddef.h>

#include "agent/agent_config.h"
#include "agent/backend.h"

typedef struct agent agent;

/* New agent. Loads (or creates) the agent_id in the state dir. Takes
 * ownership of backend (destroyed by agent_destroy, also on failure). Options
 * are borrowed and must outlive the agent. NULL with err set on failure. */
agent *agent_create(const agent_options *o, agent_backend *backend, char *err, size_t errlen);
/* Run until stopped. Returns 0 after a graceful drain, 1 on a hard stop. */
int agent_run(agent *a);
/* Thread-safe (not async-signal-safe: call it from a signal thread).
 * hard=false: drain (announce "draining", take no work, let jobs finish up
 * to drain-timeout-sec, then exit). hard=true: stop jobs now and exit. */
void agent_stop(agent *a, bool hard);
void agent_destroy(agent *a);
const char *agent_id(const agent *a);

#endif

/*
 * backend_deploy: the deploy backend's retry schedule and the two calls its
 * test drives it with (tests/unit/agent/test_agent_deploy.c). The backend
 * itself is made with agent_backend_deploy_create (backend.h).
 *
 * A deployment whose download failed for now (the network, the source's
 * 5xx) or whose load ran out of memory is tried again after
 * DEPLOY_RETRY_FIRST_S seconds, doubling up to DEPLOY_RETRY_MAX_S, at most
 * DEPLOY_RETRY_TRIES times in a row; the count starts again once the
 * model is ready (docs/agent.md "Deployed models").
 */
#ifndef AGENT_BACKEND_DEPLOY_H
#define AGENT_BACKEND_DEPLOY_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/backend.h"

#define DEPLOY_RETRY_FIRST_S 5u
#define DEPLOY_RETRY_MAX_S 160u
#define DEPLOY_RETRY_TRIES 10

/* Wait (up to timeout_ms) until the deploy backend b's worker has nothing
 * to do now: every wanted model ready, failed, or waiting for its retry
 * to come due. False on the timeout. For tests: they wait on this event
 * instead of sleeping and polling the states. */
bool agent_backend_deploy_wait_idle(agent_backend *b, unsigned timeout_ms);

/* Stop b's retry clock where it is (until then the monotonic clock): from
 * then on only agent_backend_deploy_advance moves it, so that a test can
 * tell a retry's due time to the millisecond. */
void agent_backend_deploy_hold_clock(agent_backend *b);

/* Move b's retry clock on by ms (holding it first if it was not held) and
 * wake its worker, so that a test sees a backoff end without waiting it
 * out. */
void agent_backend_deploy_advance(agent_backend *b, uint64_t ms);

#endif

/*
 * toolcalls: tool calls put together from an agent's tool_call events, the
 * same for every dialect (each renders them in its own shape: OpenAI's
 * message.tool_calls, Anthropic's tool_use blocks).
 */
#ifndef GPS_TOOLCALLS_H
#define GPS_TOOLCALLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/fleet/registry.h"

/* The first event of call i (i == n) carries id and name. */
typedef struct gps_tool_call {
    char *id;
    char *name;
    gp_buf args;             /* the arguments JSON text so far */
} gps_tool_call;
typedef struct gps_tool_calls {
    gps_tool_call *v;
    size_t n;
} gps_tool_calls;
/* Apply one tool_call event. Returns the call's index; -1 when the event
 * does not fit (an index that skips ahead, a new call without a name): the
 * caller ignores it; GPS_TOOL_CALLS_OOM when memory ran out: the caller
 * fails the reply (a call or its arguments left out would go unnoticed).
 * *started: this event began a call. */
#define GPS_TOOL_CALLS_OOM (-2)
int gps_tool_calls_add(gps_tool_calls *acc, const json_t *ev, bool *started);
void gps_tool_calls_free(gps_tool_calls *acc);

/* True when at least one live agent serving model reports
 * "supports_tools": true for it. A job carrying tools (sched_job
 * needs_tools) is then scheduled on such agents only. O(1). */
bool gps_model_takes_tools(registry *reg, const char *model);

#endif

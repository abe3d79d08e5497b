/*
 * api_tasks_parse.c: a /v2/tasks body into a job spec, and the
 * Last-Event-ID a reconnecting client sends (pure, no socket).
 */
#include "server/dialects/api_tasks_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"
#include "server/dialects/reqcheck.h"
#include "server/http/errors.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h"
#include "server/http/textcheck.h"

/* ------------------------------------------------------------------ */
/* Parsing                                                             */
/* ------------------------------------------------------------------ */

int gps_tasks_parse(const json_t *body, gps_job_spec *s, char *msg, size_t msglen,
                    const char **param)
{
    memset(s, 0, sizeof *s);
    gps_spec_defaults(s, "native");
    *param = NULL;
    msg[0] = '\0';
    int rc = -1;
    if (!json_is_object(body))
        GPS_FAIL(NULL, "request body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) > 256)
        GPS_FAIL("model", "'model' is required: a non-empty string of at most 256 bytes");
    s->model = strdup(json_string_value(model));

    const json_t *p = json_object_get(body, "prompt");
    const json_t *m = json_object_get(body, "messages");
    if (!gps_absent(p) && !gps_absent(m))
        GPS_FAIL("prompt", "give either 'prompt' or 'messages', not both");
    if (!gps_absent(p)) {
        if (!json_is_string(p))
            GPS_FAIL("prompt", "'prompt' must be a string");
        s->kind = GPS_JOB_COMPLETION;
        s->prompt = strdup(json_string_value(p));
    } else if (!gps_absent(m)) {
        if (!json_is_array(m) || json_array_size(m) == 0)
            GPS_FAIL("messages", "'messages' must be a non-empty array");
        s->kind = GPS_JOB_CHAT;
        s->messages = json_array();
        if (!s->messages)
            GPS_FAIL_OOM();
        size_t i;
        json_t *e;
        json_array_foreach(m, i, e)
        {
            const char *role = json_string_value(json_object_get(e, "role"));
            const json_t *c = json_object_get(e, "content");
            if (!role || (strcmp(role, "system") && strcmp(role, "user") &&
                          strcmp(role, "assistant")))
                GPS_FAIL("messages", "messages[%zu].role must be system, user or assistant", i);
            if (!json_is_string(c))
                GPS_FAIL("messages", "messages[%zu].content must be a string", i);
            /* A message lost would have the model answer another conversation. */
            if (json_array_append_new(s->messages,
                                      json_pack("{s:s,s:O}", "role", role, "content", c)) < 0)
                GPS_FAIL_OOM();
        }
    } else {
        GPS_FAIL("prompt", "'prompt' or 'messages' is required");
    }

    const json_t *mt = json_object_get(body, "max_tokens");
    if (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
        json_integer_value(mt) > GPS_MAX_TOKENS_LIMIT)
        GPS_FAIL("max_tokens", "'max_tokens' is required: an integer between 1 and %d",
             GPS_MAX_TOKENS_LIMIT);
    s->max_tokens = json_integer_value(mt);
    GPS_TRY(gps_sampling_parse(body, s, 2, MAX_STOP, msg, msglen, param));
    if (gps_seed_parse(json_object_get(body, "seed"), s) < 0)
        GPS_FAIL("seed", "'seed' must be an integer");
    if (!s->has_seed) {
        /* Recorded with the job so the run can be reproduced. */
        uint32_t r;
        gp_random_bytes(&r, sizeof r);
        s->seed = (long long)(r & 0x7fffffff);
    }
    s->has_seed = true;
    if (gps_priority_parse(json_object_get(body, "priority"), &s->priority) < 0)
        GPS_FAIL("priority", "'priority' must be \"interactive\" or \"batch\"");
    const json_t *sid = json_object_get(body, "session_id");
    if (!gps_absent(sid)) {
        if (!json_is_string(sid) || json_string_length(sid) == 0 || json_string_length(sid) > 256)
            GPS_FAIL("session_id", "'session_id' must be a non-empty string of at most 256 bytes");
        s->session = strdup(json_string_value(sid));
        if (!s->session) /* the affinity key: not dropped silently */
            GPS_FAIL_OOM();
    }
    GPS_TRY(gps_pool_options_parse(json_object_get(body, "x_pool_options"), s, msg, msglen,
                                   param));
    if (!s->model || (s->kind == GPS_JOB_COMPLETION && !s->prompt) ||
        (s->kind == GPS_JOB_CHAT && !s->messages))
        GPS_FAIL_OOM();
    return 0;
fail:
    gps_job_spec_clear(s);
    return rc;
}

long long gps_tasks_last_event_id(const char *s)
{
    if (!s || !*s)
        return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0)
        return -1;
    return v;
}

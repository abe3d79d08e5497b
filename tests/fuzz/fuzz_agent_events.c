/*
 * libFuzzer target: the agent event upload validator (agent_check.h) over
 * arbitrary bytes parsed as JSON, plus the poll's hardware facts check and
 * the printable-name rule on every string found. Invariants beyond "no
 * crash": a refusal always names a field and says why; an accepted upload
 * holds only end-event usage counts within GPS_AGENT_MAX_TOKENS (what
 * jobs.c sums) and events of at most GPS_AGENT_MAX_EVENT_BYTES.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/fleet/agent_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_counts(const json_t *body)
{
    const json_t *events = json_object_get(body, "events");
    size_t i;
    const json_t *ev;
    json_array_foreach(events, i, ev) {
        /* Unknown types are dropped unread (jobs.c): only end's usage is summed. */
        const char *type = json_string_value(json_object_get(ev, "type"));
        const json_t *u = type && strcmp(type, "end") == 0 ? json_object_get(ev, "usage") : NULL;
        const char *k[] = {"prompt_tokens", "completion_tokens"};
        for (int j = 0; j < 2; j++) {
            const json_t *v = json_object_get(u, k[j]);
            if (json_is_integer(v) &&
                (json_integer_value(v) < 0 || json_integer_value(v) > GPS_AGENT_MAX_TOKENS))
                abort();
        }
        if (json_dumpb(ev, NULL, 0, JSON_COMPACT) > GPS_AGENT_MAX_EVENT_BYTES)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *body = json_loadb((const char *)data, size, 0, &je);
    if (!body)
        return 0;
    char field[96], msg[256];
    field[0] = msg[0] = '\0';
    if (gps_agent_events_check(body, field, sizeof field, msg, sizeof msg) < 0) {
        if (!field[0] || !msg[0] || !strstr(msg, field))
            abort();
    } else {
        check_counts(body);
    }
    msg[0] = '\0';
    if (gps_agent_hw_check(body, msg, sizeof msg) < 0 && !msg[0])
        abort();
    const char *k;
    json_t *v;
    if (json_is_object(body))
        json_object_foreach(body, k, v) {
            (void)gps_agent_text_ok(k, strlen(k), GPS_AGENT_MAX_NAME);
            (void)gps_agent_name_ok(v, GPS_AGENT_MAX_NAME);
        }
    json_decref(body);
    return 0;
}

/* toolcalls: tool calls put together from agent events (see toolcalls.h). */
#include "server/dialects/toolcalls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gps_tool_calls_add(gps_tool_calls *acc, const json_t *ev, bool *started)
{
    *started = false;
    const json_t *ix = json_object_get(ev, "index");
    if (!json_is_integer(ix) || json_integer_value(ix) < 0 ||
        json_integer_value(ix) > (json_int_t)acc->n)
        return -1; /* calls come in index order */
    size_t i = (size_t)json_integer_value(ix);
    const char *args = json_string_value(json_object_get(ev, "arguments"));
    if (i == acc->n) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        const char *id = json_string_value(json_object_get(ev, "id"));
        if (!name)
            return -1;
        gps_tool_call *v = realloc(acc->v, (acc->n + 1) * sizeof *v);
        if (!v)
            return GPS_TOOL_CALLS_OOM;
        acc->v = v;
        gps_tool_call *c = &v[acc->n];
        char made[32];
        snprintf(made, sizeof made, "call_%zu", i);
        c->id = strdup(id ? id : made);
        c->name = strdup(name);
        gp_buf_init(&c->args);
        if (!c->id || !c->name) {
            free(c->id);
            free(c->name);
            return GPS_TOOL_CALLS_OOM;
        }
        acc->n++;
        *started = true;
    }
    if (args && gp_buf_append(&acc->v[i].args, args, strlen(args)) < 0)
        return GPS_TOOL_CALLS_OOM;
    return (int)i;
}

void gps_tool_calls_free(gps_tool_calls *acc)
{
    for (size_t i = 0; i < acc->n; i++) {
        free(acc->v[i].id);
        free(acc->v[i].name);
        gp_buf_free(&acc->v[i].args);
    }
    free(acc->v);
    acc->v = NULL;
    acc->n = 0;
}

bool gps_model_takes_tools(registry *reg, const char *model)
{
    return registry_model_tools_count(reg, model) > 0;
}


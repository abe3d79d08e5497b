/* gguf_tools: tool calls and tool_choice on the gguf backend (gguf_tools.h). */
#include "agent/gguf_tools.h"

#include <stdio.h>
#include <string.h>

/* The arguments a forced call is held to: the one tool's parameters when
 * they can be enforced, else any object (a strict tool's that cannot be
 * enforced is an error: strict promises the schema). */
static json_t *args_schema(const char *name, json_t *params, bool strict, bool one, char *err,
                           size_t errlen)
{
    if (!one || !json_is_object(params))
        return json_pack("{s:s}", "type", "object");
    char *text = json_dumps(params, JSON_COMPACT);
    char why[256] = "";
    gpe_status st = text ? gpe_schema_check(text, why, sizeof why) : GPE_ERR_NOMEM;
    free(text);
    if (st == GPE_OK)
        return json_deep_copy(params);
    if (strict) {
        snprintf(err, errlen, "tool '%s' is strict but its parameters cannot be enforced: %s",
                 name, st == GPE_ERR_NOMEM ? "out of memory" : why);
        return NULL;
    }
    return json_pack("{s:s}", "type", "object");
}

json_t *gguf_tools_call_schema(const char *family, json_t *tools, const char *only, char *err,
                               size_t errlen)
{
    json_t *names = json_array(), *call = NULL, *params = NULL;
    const char *first = NULL;
    bool strict = false;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || (only && strcmp(nm, only) != 0))
            continue;
        if (!first) {
            first = nm;
            params = json_object_get(fn, "parameters");
            strict = json_is_true(json_object_get(fn, "strict"));
        }
        json_array_append_new(names, json_string(nm));
    }
    size_t n = json_array_size(names);
    if (n == 0) {
        snprintf(err, errlen, only ? "tool_choice names function '%s', which is not in tools"
                                   : "tool_choice needs tools%s", only ? only : "");
        goto done;
    }
    json_t *args = args_schema(first, params, strict, n == 1, err, errlen);
    if (!args)
        goto done;
    const char *key = strcmp(family, "llama-3") == 0 ? "parameters" : "arguments";
    json_t *name_schema = n == 1 ? json_pack("{s:s}", "const", first)
                                 : json_pack("{s:O}", "enum", names);
    call = json_pack("{s:s, s:{s:o, s:o}, s:[s,s], s:b}", "type", "object", "properties",
                     "name", name_schema, key, args, "required", "name", key,
                     "additionalProperties", 0);
    if (call && strcmp(family, "mistral") == 0)
        call = json_pack("{s:s, s:o, s:i}", "type", "array", "items", call, "minItems", 1);
    if (!call)
        snprintf(err, errlen, "out of memory");
done:
    json_decref(names);
    return call;
}

/* "required" -> any tool; {"type":"function","function":{"name"}} -> that
 * one; "auto", absent or anything else -> not forced. */
static bool forced_choice(json_t *job, const char **only)
{
    json_t *tc = json_object_get(job, "tool_choice");
    *only = NULL;
    if (json_is_string(tc))
        return strcmp(json_string_value(tc), "required") == 0;
    const char *nm = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    if (json_is_object(tc) && nm) {
        *only = nm;
        return true;
    }
    return false;
}

int gguf_tools_init(gguf_tools *t, const char *family, bool writes_tools,
                    const gpe_grammar_vocab *gv, json_t *job, bool continuation, char *err,
                    size_t errlen)
{
    memset(t, 0, sizeof *t);
    json_t *tools = json_object_get(job, "tools");
    const char *choice = json_string_value(json_object_get(job, "tool_choice"));
    if (!writes_tools || !json_is_array(tools) || json_array_size(tools) == 0 ||
        (choice && strcmp(choice, "none") == 0))
        return 0;
    t->tp = gpe_toolparse_new(family);
    if (!t->tp)
        return 0;   /* a family without a calls format: tools stay prompt text */
    const char *only;
    if (continuation || !forced_choice(job, &only))
        return 0;
    json_t *schema = gguf_tools_call_schema(family, tools, only, err, errlen);
    if (!schema)
        goto fail;
    char *text = json_dumps(schema, JSON_COMPACT);
    json_decref(schema);
    char why[256] = "";
    gpe_status st = text ? gpe_grammar_init_vocab(gv, text, &t->gram, why, sizeof why)
                         : GPE_ERR_NOMEM;
    free(text);
    if (st != GPE_OK) {
        snprintf(err, errlen, "tool_choice: %s", st == GPE_ERR_NOMEM ? "out of memory" : why);
        goto fail;
    }
    t->prefix = gpe_toolparse_forced_prefix(family);
    const char *emit;
    size_t elen;
    if (gpe_toolparse_feed(t->tp, t->prefix, strlen(t->prefix), &emit, &elen) != GPE_OK) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return 0;
fail:
    gguf_tools_free(t);
    return -1;
}

void gguf_tools_free(gguf_tools *t)
{
    gpe_toolparse_free(t->tp);
    gpe_grammar_free(t->gram);
    memset(t, 0, sizeof *t);
}

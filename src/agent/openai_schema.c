/*
 * openai_schema: see openai_schema.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/openai_schema.h"
#include "common/gp_util.h"
#include "engine/jvalidate.h"

/* Text kept for the check: a reply past this is not one a client can use
 * as a structured answer either (the parser's whole-body limit). */
#define MAX_CHECKED (16u << 20)
#define MAX_CALLS 128

typedef struct strict_tool {
    char *name;
    gpe_jv *jv;
} strict_tool;

typedef struct call {
    char *name;           /* NULL until its first piece */
    gp_buf args;
} call;

struct oai_schema {
    gpe_jv *format;       /* response_format's, or NULL */
    gp_buf text;
    bool too_long;        /* text or arguments past MAX_CHECKED */
    bool nomem;           /* text, arguments or a name not kept for want of memory */
    strict_tool *tools;
    int n_tools;
    call calls[MAX_CALLS];
    int n_calls;
};

void oai_schema_free(oai_schema *c)
{
    if (!c)
        return;
    gpe_jv_free(c->format);
    gp_buf_free(&c->text);
    for (int i = 0; i < c->n_tools; i++) {
        free(c->tools[i].name);
        gpe_jv_free(c->tools[i].jv);
    }
    free(c->tools);
    for (int i = 0; i < c->n_calls; i++) {
        free(c->calls[i].name);
        gp_buf_free(&c->calls[i].args);
    }
    free(c);
}

/* response_format's validator: json_schema's schema ({} when absent), any
 * object for json_object, none for text. 0, -1 (refused) or
 * OAI_SCHEMA_NOMEM. */
static int format_checker(oai_schema *c, json_t *rf, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(rf, "type"));
    json_t *schema = NULL;
    if (type && strcmp(type, "json_schema") == 0) {
        json_t *s = json_object_get(json_object_get(rf, "json_schema"), "schema");
        schema = s ? json_incref(s) : json_object();
    } else if (type && strcmp(type, "json_object") == 0) {
        schema = json_pack("{s:s}", "type", "object");
    } else {
        return 0;
    }
    char why[300];
    gpe_status st = GPE_ERR_NOMEM; /* (schema NULL: json_object() or json_pack failed) */
    c->format = schema ? gpe_jv_new_status(schema, why, sizeof why, &st) : NULL;
    json_decref(schema);
    if (!c->format) {
        bool oom = st == GPE_ERR_NOMEM;
        snprintf(err, errlen, "response_format: the schema cannot be checked: %s",
                 oom ? "out of memory" : why);
        return oom ? OAI_SCHEMA_NOMEM : -1;
    }
    return 0;
}

/* A validator for each tool with "strict": true ({"type":"object"} when it
 * has no parameters). 0, -1 (refused) or OAI_SCHEMA_NOMEM. */
static int tool_checkers(oai_schema *c, json_t *tools, char *err, size_t errlen)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !json_is_true(json_object_get(fn, "strict")))
            continue;
        json_t *params = json_object_get(fn, "parameters");
        json_t *schema = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
        strict_tool *n = realloc(c->tools, (size_t)(c->n_tools + 1) * sizeof *n);
        char why[300];
        gpe_status st = GPE_ERR_NOMEM; /* (no schema or no room: memory) */
        gpe_jv *jv = schema && n ? gpe_jv_new_status(schema, why, sizeof why, &st) : NULL;
        json_decref(schema);
        if (n)
            c->tools = n;
        char *dup = jv ? strdup(name) : NULL;
        if (!dup) {
            gpe_jv_free(jv);
            bool oom = jv || st == GPE_ERR_NOMEM; /* the name's copy, the validator's memory */
            snprintf(err, errlen, "tool '%.64s' is strict but its parameters cannot be "
                     "checked: %s", name, oom ? "out of memory" : why);
            return oom ? OAI_SCHEMA_NOMEM : -1;
        }
        c->tools[c->n_tools++] = (strict_tool){.name = dup, .jv = jv};
    }
    return 0;
}

int oai_schema_new(json_t *job, oai_schema **out, char *err, size_t errlen)
{
    *out = NULL;
    json_t *rf = json_object_get(job, "response_format");
    json_t *tools = json_object_get(job, "tools");
    if (!json_is_object(rf) && json_array_size(tools) == 0)
        return 0;   /* most jobs: no allocation */
    oai_schema *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return OAI_SCHEMA_NOMEM;
    }
    gp_buf_init(&c->text);
    int rc = format_checker(c, rf, err, errlen);
    if (rc == 0)
        rc = tool_checkers(c, tools, err, errlen);
    if (rc < 0) {
        oai_schema_free(c);
        return rc;
    }
    if (!c->format && c->n_tools == 0) {
        oai_schema_free(c);
        return 0;
    }
    /* A failed-over reply goes on from the text the client already has. */
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    if (c->format && cont)
        oai_schema_text(c, cont, strlen(cont));
    *out = c;
    return 0;
}

static void keep(oai_schema *c, gp_buf *b, const char *p, size_t n)
{
    if (c->too_long || c->nomem || n == 0)
        return;
    if (b->len + n > MAX_CHECKED)
        c->too_long = true;
    else if (gp_buf_append(b, p, n) < 0)
        c->nomem = true;   /* not the reply's size: the agent's memory */
}

void oai_schema_text(oai_schema *c, const char *text, size_t len)
{
    if (c && c->format)
        keep(c, &c->text, text, len);
}

void oai_schema_tool(oai_schema *c, int index, const char *name, const char *args, size_t len)
{
    if (!c || c->n_tools == 0 || index < 0 || index >= MAX_CALLS)
        return;
    while (c->n_calls <= index)
        gp_buf_init(&c->calls[c->n_calls++].args);
    call *k = &c->calls[index];
    if (name && !k->name && !(k->name = strdup(name)))
        c->nomem = true;   /* the verdict says so: not the reply's fault */
    keep(c, &k->args, args, len);
}

static gpe_jv *strict_of(const oai_schema *c, const char *name)
{
    for (int i = 0; name && i < c->n_tools; i++)
        if (strcmp(c->tools[i].name, name) == 0)
            return c->tools[i].jv;
    return NULL;
}

/* The verdict when the check could not be made for want of memory. */
static int verdict_nomem(char *msg, size_t msglen)
{
    snprintf(msg, msglen, "the agent ran out of memory checking the upstream's reply "
             "against its schema");
    return OAI_SCHEMA_NOMEM;
}

int oai_schema_verdict(oai_schema *c, char *msg, size_t msglen)
{
    char why[400];
    if (!c)
        return 0;
    if (c->nomem)
        return verdict_nomem(msg, msglen);
    if (c->too_long) {
        snprintf(msg, msglen, "the upstream's reply is too large to check against its schema");
        return -1;
    }
    /* The text is held to the format only when the model answered rather
     * than called a tool. */
    if (c->format && c->n_calls == 0) {
        gpe_jv_result r = gpe_jv_check_text(c->format, c->text.data, c->text.len, why,
                                            sizeof why);
        if (r == GPE_JV_NOMEM)
            return verdict_nomem(msg, msglen);
        if (r != GPE_JV_VALID) {
            snprintf(msg, msglen, "the upstream's reply %s the response_format schema: %s",
                     r == GPE_JV_INVALID ? "does not match" : "could not be checked against",
                     why);
            return -1;
        }
    }
    for (int i = 0; i < c->n_calls; i++) {
        gpe_jv *jv = strict_of(c, c->calls[i].name);
        if (!jv)
            continue;
        gpe_jv_result r = gpe_jv_check_text(jv, c->calls[i].args.data, c->calls[i].args.len,
                                            why, sizeof why);
        if (r == GPE_JV_NOMEM)
            return verdict_nomem(msg, msglen);
        if (r != GPE_JV_VALID) {
            snprintf(msg, msglen, "the upstream's tool call %d (%.64s) %s the strict tool's "
                     "parameters: %s", i, c->calls[i].name,
                     r == GPE_JV_INVALID ? "does not match" : "could not be checked against",
                     why);
            return -1;
        }
    }
    return 0;
}

/* gguf_tools: tool calls and tool_choice on the gguf backend (gguf_tools.h). */
#include "agent/gguf_tools.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

/* Memory ran out building a forced call's schema or grammar: the agent's
 * own failure (GGUF_TOOLS_NOMEM), never a weaker schema in its place (any
 * object for a tool's parameters, only the name held) nor the client's
 * refusal. Returns NULL for the callers' convenience. */
static json_t *nomem(bool *oom, char *err, size_t errlen)
{
    *oom = true;
    snprintf(err, errlen, "out of memory");
    return NULL;
}

/* Any JSON object: the arguments of a tool whose parameters are not held. */
static json_t *any_object(bool *oom, char *err, size_t errlen)
{
    json_t *o = json_pack("{s:s}", "type", "object");
    return o ? o : nomem(oom, err, errlen);
}

/* The arguments a forced call is held to: the one tool's parameters when
 * they can be enforced, else any object (a strict tool's that cannot be
 * enforced is an error: strict promises the schema). NULL with err set,
 * *oom saying whether memory ran out. */
static json_t *args_schema(const char *name, json_t *params, bool strict, bool one, bool *oom,
                           char *err, size_t errlen)
{
    if (!one || !json_is_object(params))
        return any_object(oom, err, errlen);
    /* gp_json_dumps, not json_dumps: jansson 2.14's can leave a key out and
     * succeed, and the check would judge another schema than the one the
     * grammar holds the model to. (Strings of a JSON text: NULL is memory.) */
    char *text = gp_json_dumps(params);
    if (!text)
        return nomem(oom, err, errlen);
    char why[256] = "";
    gpe_status st = gpe_schema_check(text, why, sizeof why);
    free(text);
    if (st == GPE_ERR_NOMEM)
        return nomem(oom, err, errlen);
    if (st == GPE_OK) {
        json_t *copy = json_deep_copy(params);
        return copy ? copy : nomem(oom, err, errlen);
    }
    if (strict) {
        snprintf(err, errlen, "tool '%s' is strict but its parameters cannot be enforced: %s",
                 name, why);
        return NULL;
    }
    return any_object(oom, err, errlen);
}

/* One call: {"name": name, key: arguments}, nothing else. Takes both
 * references (json_pack's "o", even when it fails). */
static json_t *call_object(const char *key, json_t *name_schema, json_t *args)
{
    return json_pack("{s:s, s:{s:o, s:o}, s:[s,s], s:b}", "type", "object", "properties",
                     "name", name_schema, key, args, "required", "name", key,
                     "additionalProperties", 0);
}

/* Whether the grammar takes schema: 1, 0, or -1 when memory ran out
 * checking (not a "no": the caller would fall back to a weaker schema). */
static int schema_ok(json_t *schema)
{
    char *text = gp_json_dumps(schema); /* (not json_dumps: as in args_schema) */
    if (!text)
        return -1;
    char why[256];
    gpe_status st = gpe_schema_check(text, why, sizeof why);
    free(text);
    return st == GPE_OK ? 1 : st == GPE_ERR_NOMEM ? -1 : 0;
}

/* Several candidates: a union of one call object per tool, told apart by
 * the name (the grammar's discriminated unions), so that each tool's
 * arguments follow its own parameters; NULL when that union is not one the
 * grammar takes (then only the name is held to the tools'). *failed: NULL
 * for an error, err set (a strict tool that cannot be enforced; or out of
 * memory, *oom set). */
static json_t *union_of_calls(json_t *tools, const char *key, bool *failed, bool *oom,
                              char *err, size_t errlen)
{
    json_t *alts = json_array();
    size_t i;
    json_t *tool;
    *failed = true;
    if (!alts)
        return nomem(oom, err, errlen);
    json_array_foreach(tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm)
            continue;
        json_t *args = args_schema(nm, json_object_get(fn, "parameters"),
                                   json_is_true(json_object_get(fn, "strict")), true, oom, err,
                                   errlen);
        /* (a union without one of the tools would keep the model from it) */
        if (!args || json_array_append_new(alts, call_object(key, json_pack("{s:s}", "const", nm),
                                                             args)) < 0) {
            json_decref(alts);
            return args ? nomem(oom, err, errlen) : NULL;
        }
    }
    json_t *u = json_pack("{s:o}", "anyOf", alts);
    int ok = !u ? -1 : json_array_size(alts) <= 16 ? schema_ok(u) : 0;
    if (ok < 0) {
        json_decref(u);
        return nomem(oom, err, errlen);
    }
    *failed = false;
    if (ok)
        return u;
    json_decref(u);
    return NULL;
}

json_t *gguf_tools_call_schema(const char *family, json_t *tools, const char *only, bool *oom,
                               char *err, size_t errlen)
{
    json_t *names = json_array(), *call = NULL, *params = NULL;
    const char *first = NULL;
    bool strict = false;
    size_t i;
    json_t *tool;
    *oom = false;
    if (!names)
        return nomem(oom, err, errlen);
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
        /* (an enum without a name would keep the model from that tool) */
        if (json_array_append_new(names, json_string(nm)) < 0) {
            nomem(oom, err, errlen);
            goto done;
        }
    }
    size_t n = json_array_size(names);
    const char *key = strcmp(family, "llama-3") == 0 ? "parameters" : "arguments";
    if (n == 0) {
        snprintf(err, errlen, only ? "tool_choice names function '%s', which is not in tools"
                                   : "tool_choice needs tools%s", only ? only : "");
        goto done;
    }
    if (n > 1) {
        bool failed;
        call = union_of_calls(tools, key, &failed, oom, err, errlen);
        if (failed)
            goto done;
    }
    if (!call) {
        json_t *args = args_schema(first, params, strict, n == 1, oom, err, errlen);
        if (!args)
            goto done;
        call = call_object(key, n == 1 ? json_pack("{s:s}", "const", first)
                                       : json_pack("{s:O}", "enum", names), args);
    }
    if (call && strcmp(family, "mistral") == 0)
        call = json_pack("{s:s, s:o, s:i}", "type", "array", "items", call, "minItems", 1);
    if (!call)
        nomem(oom, err, errlen); /* (json_pack: every value is there) */
done:
    json_decref(names);
    return call;
}

/* The grammar of a call (gguf_tools_call_schema) over the model's
 * vocabulary. 0, -1 or GGUF_TOOLS_NOMEM, with err set. */
static int call_grammar(const char *family, json_t *tools, const char *only,
                        const gpe_grammar_vocab *gv, gpe_grammar **out, char *err, size_t errlen)
{
    bool oom;
    json_t *schema = gguf_tools_call_schema(family, tools, only, &oom, err, errlen);
    if (!schema)
        return oom ? GGUF_TOOLS_NOMEM : -1;
    /* The text the grammar is compiled from: gp_json_dumps, not json_dumps,
     * whose dropped key (jansson 2.14) would compile another grammar (a
     * call without "required", or without the arguments' own schema), or
     * refuse the client's tools as not JSON. */
    char *text = gp_json_dumps(schema);
    json_decref(schema);
    char why[256] = "";
    gpe_status st = text ? gpe_grammar_init_vocab(gv, text, out, why, sizeof why)
                         : GPE_ERR_NOMEM;
    free(text);
    if (st == GPE_ERR_NOMEM) {
        snprintf(err, errlen, "out of memory");
        return GGUF_TOOLS_NOMEM;
    }
    if (st != GPE_OK) {
        snprintf(err, errlen, "tool_choice: %s", why);
        return -1;
    }
    return 0;
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
    if (!t->tp && gpe_toolparse_opener(family)) {
        /* a family with a calls format: NULL was memory (else the model's
         * calls would reach the client as text) */
        snprintf(err, errlen, "out of memory");
        return GGUF_TOOLS_NOMEM;
    }
    if (!t->tp)
        return 0;   /* a family without a calls format: tools stay prompt text */
    const char *only;
    int rc;
    t->opener_at = -1;
    if (continuation)
        return 0;
    if (!forced_choice(job, &only)) {
        /* auto: with a schema too, a call stays possible (lazy first step) */
        const char *rf = json_string_value(
            json_object_get(json_object_get(job, "response_format"), "type"));
        t->opener = gpe_toolparse_opener(family);
        if (!rf || strcmp(rf, "text") == 0 || !t->opener || !*t->opener)
            return 0;
        if ((rc = call_grammar(family, tools, NULL, gv, &t->call_gram, err, errlen)) < 0)
            goto fail;
        t->lazy = true;
        return 0;
    }
    if ((rc = call_grammar(family, tools, only, gv, &t->gram, err, errlen)) < 0)
        goto fail;
    t->prefix = gpe_toolparse_forced_prefix(family);
    const char *emit;
    size_t elen;
    if (gpe_toolparse_feed(t->tp, t->prefix, strlen(t->prefix), &emit, &elen) != GPE_OK) {
        snprintf(err, errlen, "out of memory");
        rc = GGUF_TOOLS_NOMEM;
        goto fail;
    }
    return 0;
fail:
    gguf_tools_free(t);
    return rc;
}

void gguf_tools_free(gguf_tools *t)
{
    gpe_toolparse_free(t->tp);
    gpe_grammar_free(t->gram);
    gpe_grammar_free(t->call_gram);
    memset(t, 0, sizeof *t);
}

int gguf_tools_opener_tokens(const gpe_model *m, const char *family, int32_t **ids,
                             uint64_t **at, int *n)
{
    *ids = NULL;
    *at = NULL;
    *n = 0;
    const char *op = gpe_toolparse_opener(family);
    size_t ol = op ? strlen(op) : 0;
    if (ol == 0)
        return 0;
    int nv = gpe_model_n_vocab(m), cap = 0;
    char piece[256];
    for (int32_t t = 0; t < nv; t++) {
        /* special: a control token (mistral's [TOOL_CALLS]) renders as "" else */
        int k = gpe_token_to_piece(m, t, piece, sizeof piece, true);
        /* (a piece longer than the buffer, k < 0, is longer than any
         * opener too: it writes no piece of it) */
        if (k <= 0 || (size_t)k > ol)
            continue;
        /* any piece of the opener: the model may write it in several
         * tokens; every offset it fits at (openers are a few bytes, under
         * 64: the mask's width) */
        uint64_t where = 0;
        for (size_t a = 0; a + (size_t)k <= ol && a < 64; a++)
            if (memcmp(op + a, piece, (size_t)k) == 0)
                where |= 1ULL << a;
        if (!where)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int32_t *ni = realloc(*ids, (size_t)cap * sizeof *ni);
            if (ni)
                *ids = ni;
            uint64_t *na = realloc(*at, (size_t)cap * sizeof *na);
            if (na)
                *at = na;
            if (!ni || !na)
                return -1;
        }
        (*ids)[*n] = t;
        (*at)[*n] = where;
        (*n)++;
    }
    return 0;
}

void gguf_tools_lazy_mask(const gguf_tools *t, const float *raw, const float *masked,
                          const int32_t *ids, const uint64_t *at, int n_ids, float *out,
                          int n_vocab)
{
    size_t pos = t->opener_at > 0 ? (size_t)t->opener_at : 0;
    for (int i = 0; i < n_vocab; i++)
        out[i] = masked ? masked[i] : -INFINITY;
    /* tokens that write the next bytes of the opener (never past its end:
     * the offsets were taken where the whole piece fits) */
    for (int i = 0; pos < 64 && i < n_ids; i++)
        if (ids[i] < n_vocab && (at[i] >> pos & 1))
            out[ids[i]] = raw[ids[i]];
}

int gguf_tools_lazy_accept(gguf_tools *t, const gpe_model *m, int32_t tok, bool schema_ok,
                           gpe_grammar **install)
{
    *install = NULL;
    if (t->lazy && schema_ok) {
        t->lazy = false;   /* the schema's answer: no call this turn */
        return 0;
    }
    t->lazy = false;
    /* tok is one of the opener's tokens here (the lazy mask allows no
     * other off the schema), a few bytes: the buffer holds it */
    char piece[256];
    int n = gpe_token_to_piece(m, tok, piece, sizeof piece, true);
    t->opener_at = (t->opener_at > 0 ? t->opener_at : 0) + (n > 0 ? n : 0);
    if ((size_t)t->opener_at >= strlen(t->opener)) {
        *install = t->call_gram;   /* the opener is written: the call follows */
        t->call_gram = NULL;
        t->opener_at = -1;
    }
    return 1;
}

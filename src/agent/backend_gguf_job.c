/*
 * backend_gguf_job.c: a job of the server's JSON into a gjob: the prompt
 * (a chat rendered with the model's template, tools, response format), its
 * sampling, stops, and a token-exact continuation.
 */
#include "agent/backend_gguf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* ------------------------------------------------------ job JSON parsing */

/* Memory ran out: the agent's own failure, not the job's (job_start's
 * AGENT_JOB_START_NOMEM: the job fails over, the client gets no 400). */
static int nomem(char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory");
    return AGENT_JOB_START_NOMEM;
}

/* Content of a message: a string, or an array of {type:"text", text} blocks
 * (concatenated). Returns a malloc'd string or NULL (for a string or an
 * array: out of memory). */
static char *message_text(json_t *content)
{
    if (json_is_string(content))
        return strdup(json_string_value(content));
    if (!json_is_array(content))
        return NULL;
    size_t total = 1, i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        const char *t = json_string_value(json_object_get(blk, "text"));
        if (t)
            total += strlen(t);
    }
    char *out = malloc(total), *p = out;
    if (!out)
        return NULL;
    json_array_foreach(content, i, blk) {
        const char *t = json_string_value(json_object_get(blk, "text"));
        if (t) {
            size_t n = strlen(t);
            memcpy(p, t, n);
            p += n;
        }
    }
    *p = '\0';
    return out;
}

/* Strings render_chat allocates, freed together at the end. */
typedef struct strpool {
    char **v;
    size_t n, cap;
    bool oom;
} strpool;

static char *pool_keep(strpool *p, char *s)
{
    if (!s) {
        p->oom = true;
        return NULL;
    }
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 16;
        char **nv = realloc(p->v, nc * sizeof *nv);
        if (!nv) {
            free(s);
            p->oom = true;
            return NULL;
        }
        p->v = nv;
        p->cap = nc;
    }
    p->v[p->n++] = s;
    return s;
}

static void pool_free(strpool *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
}

/* JSON text of v for the chat template (which re-spaces it): strings as
 * they are (OpenAI sends arguments as a JSON string), anything else dumped.
 * The text goes into the prompt (a tool's parameters: what the model is
 * told it may call with; a call's arguments: what it called with), so it
 * is gp_json_dump_append's, not json_dumps's: jansson 2.14's can leave a
 * key out and succeed, and the model would be told another schema. NULL
 * (p->oom) when memory ran out. */
static const char *json_text(strpool *p, json_t *v)
{
    if (!v || json_is_null(v))
        return NULL;
    if (json_is_string(v))
        return pool_keep(p, strdup(json_string_value(v)));
    gp_buf t;
    gp_buf_init(&t);
    char *text = NULL;
    /* (a tree read from JSON is UTF-8: a failure is memory) */
    if (gp_json_dump_append(&t, v) == 0 && gp_buf_append(&t, "", 0) == 0)
        text = gp_buf_steal(&t);
    gp_buf_free(&t);
    return pool_keep(p, text);
}

/* Render a job's messages (and its OpenAI `tools`) with the model's chat
 * template. Tools and tool messages (assistant `tool_calls`, role "tool"
 * with `tool_call_id`) go to gpe_chat_apply_tools: in the template's tool
 * format when the model's template supports tools, else tools are ignored
 * (the server only sends them to models reporting supports_tools) and tool
 * messages become plain text. tool_choice "none" leaves the tools out.
 * NULL with err set; *oom says whether memory ran out (here or in the
 * engine's rendering: gpe_chat_apply_tools_status's GPE_ERR_NOMEM). */
static char *render_chat(gguf_backend *b, json_t *job, json_t *messages, bool *oom, char *err,
                         size_t errlen)
{
    *oom = false;
    size_t n = json_array_size(messages);
    if (!json_is_array(messages) || n == 0) {
        snprintf(err, errlen, "chat job without messages");
        return NULL;
    }
    json_t *jtools = json_object_get(job, "tools");
    const char *choice = json_string_value(json_object_get(job, "tool_choice"));
    size_t nt = json_is_array(jtools) && !(choice && strcmp(choice, "none") == 0)
                    ? json_array_size(jtools) : 0;
    gpe_chat_msg *msgs = calloc(n, sizeof *msgs);
    gpe_chat_msg_tools *extra = calloc(n, sizeof *extra);
    gpe_chat_tool *tools = calloc(nt ? nt : 1, sizeof *tools);
    gpe_chat_tool_call **calls = calloc(n, sizeof *calls);
    strpool pool = {0};
    char *out = NULL;
    if (!msgs || !extra || !tools || !calls)
        goto nomem;
    for (size_t t = 0; t < nt; t++) {
        json_t *fn = json_object_get(json_array_get(jtools, t), "function");
        tools[t].name = json_string_value(json_object_get(fn, "name"));
        tools[t].description = json_string_value(json_object_get(fn, "description"));
        tools[t].parameters = json_text(&pool, json_object_get(fn, "parameters"));
        if (!tools[t].name || !*tools[t].name) {
            snprintf(err, errlen, "tool %zu needs a function name", t);
            goto done;
        }
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        json_t *tc = json_object_get(m, "tool_calls");
        size_t nc = json_array_size(tc);
        msgs[i].role = role;
        char *txt = message_text(content);
        if (!txt && (json_is_string(content) || json_is_array(content)))
            goto nomem;
        msgs[i].content = txt ? pool_keep(&pool, txt) : NULL;
        if (txt && !msgs[i].content)
            goto nomem;
        /* an assistant tool call may have null content */
        if (!msgs[i].content && nc > 0 && (!content || json_is_null(content)))
            msgs[i].content = "";
        if (!role || !msgs[i].content) {
            snprintf(err, errlen, "message %zu needs a string role and text content", i);
            goto done;
        }
        extra[i].tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
        if (nc == 0)
            continue;
        calls[i] = calloc(nc, sizeof *calls[i]);
        if (!calls[i])
            goto nomem;
        for (size_t c = 0; c < nc; c++) {
            json_t *call = json_array_get(tc, c);
            json_t *fn = json_object_get(call, "function");
            calls[i][c].id = json_string_value(json_object_get(call, "id"));
            calls[i][c].name = json_string_value(json_object_get(fn, "name"));
            calls[i][c].arguments = json_text(&pool, json_object_get(fn, "arguments"));
            if (!calls[i][c].name || !*calls[i][c].name) {
                snprintf(err, errlen, "message %zu: tool call %zu needs a function name", i, c);
                goto done;
            }
        }
        extra[i].tool_calls = calls[i];
        extra[i].n_tool_calls = nc;
    }
    if (pool.oom)
        goto nomem;
    gpe_status st;
    out = gpe_chat_apply_tools_status(b->model, tools, nt, msgs, extra, n, true, err, errlen,
                                      &st);
    if (!out && st == GPE_ERR_NOMEM)
        goto nomem;
    goto done;
nomem:
    *oom = true;
    nomem(err, errlen);
done:
    if (calls)
        for (size_t i = 0; i < n; i++)
            free(calls[i]);
    free(calls);
    free(tools);
    free(extra);
    free(msgs);
    pool_free(&pool);
    return out;
}

static double num_or(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* Tools of a chat job (gguf_tools.h): the parser for the model's calls
 * and, for a forced call, its opener appended to the prompt and its
 * grammar (which then takes the place of a response_format). Not forced
 * on a continuation: the text so far decides what comes next. 0, -1 or
 * AGENT_JOB_START_NOMEM, with err set. */
static int setup_tools(gguf_backend *b, json_t *job, gjob *j, char *err, size_t errlen)
{
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    bool continuation = (cont && *cont) || json_object_get(job, "continuation_ids");
    int rc = gguf_tools_init(&j->tools, b->info.chat_format, gpe_chat_supports_tools(b->model),
                             b->gvocab, job, continuation, err, errlen);
    if (rc < 0)
        return rc == GGUF_TOOLS_NOMEM ? nomem(err, errlen) : -1;
    if (continuation && cont && j->tools.tp) {
        /* the client has this text already: the parser only learns from it
         * (one that could not keep it would read the rest otherwise: a call
         * begun in it lost, or its text taken for content) */
        const char *emit;
        size_t elen;
        if (gpe_toolparse_feed(j->tools.tp, cont, strlen(cont), &emit, &elen) == GPE_ERR_NOMEM)
            return nomem(err, errlen);
    }
    if (j->tools.lazy) {
        j->lazy_buf = malloc((size_t)gpe_model_n_vocab(b->model) * sizeof *j->lazy_buf);
        if (!j->lazy_buf)
            return nomem(err, errlen);
    }
    if (!j->tools.gram)
        return 0;
    size_t a = strlen(j->text), c = strlen(j->tools.prefix);
    char *t = realloc(j->text, a + c + 1);
    if (!t)
        return nomem(err, errlen);
    memcpy(t + a, j->tools.prefix, c + 1);
    j->text = t;
    j->gram = j->tools.gram;
    j->tools.gram = NULL;
    return 0;
}

/* response_format (docs/protocol.md, OpenAI's chat form): json_object or
 * json_schema become a grammar that constrains every sampled token. The
 * text a continuation carries was written under the same schema: the
 * grammar starts after it. 0, -1 or AGENT_JOB_START_NOMEM, with err set. */
static int parse_response_format(gguf_backend *b, json_t *job, gjob *j, const char *cont,
                                 char *err, size_t errlen)
{
    json_t *rf = json_object_get(job, "response_format");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type || strcmp(type, "text") == 0 || j->gram)
        return 0;   /* (j->gram: a forced tool call, whose grammar comes first) */
    char *schema = NULL;
    if (strcmp(type, "json_schema") == 0) {
        json_t *sc = json_object_get(json_object_get(rf, "json_schema"), "schema");
        /* gp_json_dump_append, not json_dumps: jansson 2.14's drops an
         * object key it could not append and goes on (text that is not
         * JSON: the client's "schema is not JSON" for want of the agent's
         * memory; or another schema, silently). Any value: the grammar
         * refuses a scalar itself. (UTF-8 strings: a failure is memory.) */
        gp_buf t;
        gp_buf_init(&t);
        if (!sc)
            schema = strdup("{}");
        else if (gp_json_dump_append(&t, sc) == 0 && gp_buf_append(&t, "", 0) == 0)
            schema = gp_buf_steal(&t);
        gp_buf_free(&t);
        if (!schema)
            return nomem(err, errlen);
    } else if (strcmp(type, "json_object") != 0) {
        snprintf(err, errlen, "response_format type '%s' is not supported", type);
        return -1;
    }
    char why[256];
    gpe_status st = gpe_grammar_init_vocab(b->gvocab, schema, &j->gram, why, sizeof why);
    free(schema);
    if (st == GPE_ERR_NOMEM)
        return nomem(err, errlen);
    if (st != GPE_OK) {
        snprintf(err, errlen, "response_format: %s", why);
        return -1;
    }
    st = cont && *cont ? gpe_grammar_accept_text(j->gram, cont, strlen(cont)) : GPE_OK;
    if (st == GPE_ERR_NOMEM)
        return nomem(err, errlen);
    if (st != GPE_OK) {
        snprintf(err, errlen, "continuation does not match the response_format schema");
        return -1;
    }
    return 0;
}

/* Token-exact continuation fields of a job (see the top of this file).
 * Returns 1 when the job continues from token ids (j->cont_* set), 0 when
 * it does not (no ids, or a digest that is not ours: text continuation),
 * -1 with err set on malformed fields, AGENT_JOB_START_NOMEM. */
static int parse_token_continuation(gguf_backend *b, json_t *job, gjob *j, char *err,
                                    size_t errlen)
{
    json_t *ids = json_object_get(job, "continuation_ids");
    const char *dg = json_string_value(json_object_get(job, "continuation_digest"));
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return 0;
    if (!b->digest[0] || !dg || strcmp(dg, b->digest) != 0) {
        /* another file (the server's facts were stale): the ids mean
         * other tokens here */
        gp_log_warn("continuation_digest_mismatch", "job %s: continuation ids for another "
                    "model file; continuing from the text", j->job_id);
        return 0;
    }
    size_t n = json_array_size(ids);
    json_t *ns = json_object_get(json_object_get(job, "sampler"), "n_sampled");
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    /* One draw per sampled token, and every sampled token is an id here
     * (an end-of-generation token ends the job): n_sampled cannot exceed
     * the ids, which also bounds the generator's fast-forward. Too many
     * ids for the context: job_admit's CONTEXT_OVERFLOW. */
    if (!json_is_integer(ns) || json_integer_value(ns) < 0 ||
        (size_t)json_integer_value(ns) > n || !cont) {
        snprintf(err, errlen, "continuation_ids needs continuation and sampler.n_sampled "
                              "(0..number of ids)");
        return -1;
    }
    j->cont_ids = malloc(n * sizeof *j->cont_ids);
    j->cont_text = strdup(cont);
    if (!j->cont_ids || !j->cont_text)
        return nomem(err, errlen);
    int n_vocab = gpe_model_n_vocab(b->model);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            snprintf(err, errlen, "continuation_ids[%zu]: not a token id of this model", i);
            return -1;
        }
        j->cont_ids[i] = (int32_t)json_integer_value(v);
    }
    j->n_cont = (int)n;
    j->n_sampled = (uint64_t)json_integer_value(ns);
    return 1;
}

int gguf_job_parse(gguf_backend *b, json_t *job, gjob **out, char *err, size_t errlen)
{
    int rc = -1;   /* on the way to fail: refused, unless memory ran out */
    bool oom = false;
    *out = NULL;
    gjob *j = calloc(1, sizeof *j);
    if (!j)
        return nomem(err, errlen);
    const char *id = json_string_value(json_object_get(job, "job_id"));
    const char *kind = json_string_value(json_object_get(job, "kind"));
    if (!id || !kind) {
        snprintf(err, errlen, "job without job_id or kind");
        goto fail;
    }
    snprintf(j->job_id, sizeof j->job_id, "%s", id);
    if (strcmp(kind, "chat") == 0) {
        j->text = render_chat(b, job, json_object_get(job, "messages"), &oom, err, errlen);
        if (!j->text) {
            rc = oom ? AGENT_JOB_START_NOMEM : -1;
            goto fail;
        }
        int r = setup_tools(b, job, j, err, errlen);
        if (r < 0) {
            rc = r;
            goto fail;
        }
    } else if (strcmp(kind, "completion") == 0 || strcmp(kind, "count_tokens") == 0) {
        json_t *msgs = json_object_get(job, "messages");
        const char *p = json_string_value(json_object_get(job, "prompt"));
        if (p)
            oom = !(j->text = strdup(p));
        else if (json_is_array(msgs))
            j->text = render_chat(b, job, msgs, &oom, err, errlen);
        if (!j->text) {
            if (!p && !json_is_array(msgs))
                snprintf(err, errlen, "%s job without prompt", kind);
            rc = oom ? nomem(err, errlen) : -1;
            goto fail;
        }
        j->count_only = strcmp(kind, "count_tokens") == 0;
    } else if (strcmp(kind, "embeddings") == 0) {
        json_t *in = json_object_get(job, "input");
        if (!json_is_array(in) || json_array_size(in) == 0) {
            snprintf(err, errlen, "embeddings job without input");
            goto fail;
        }
        j->emb_input = json_incref(in);
        j->text = strdup("");
        if (!j->text) {
            rc = nomem(err, errlen);
            goto fail;
        }
    } else {
        snprintf(err, errlen, "unknown job kind '%s'", kind);
        goto fail;
    }
    const char *cont = json_string_value(json_object_get(job, "continuation"));
    int tc = parse_token_continuation(b, job, j, err, errlen);
    if (tc < 0) {
        rc = tc;
        goto fail;
    }
    if (tc == 0 && cont && *cont) {
        size_t a = strlen(j->text), c = strlen(cont);
        char *t = realloc(j->text, a + c + 1);
        if (!t) {
            rc = nomem(err, errlen);
            goto fail;
        }
        memcpy(t + a, cont, c + 1);
        j->text = t;
    }

    json_t *params = json_object_get(job, "params");
    j->sp = gpe_sampler_default_params();
    j->sp.temperature = (float)num_or(params, "temperature", 0.8);
    j->sp.top_p = (float)num_or(params, "top_p", 1.0);
    j->sp.top_k = (int)num_or(params, "top_k", 0);
    /* The client's seed, else the one the server chose for the job (the
     * same on every attempt: a token-exact continuation needs it), else
     * our own. */
    json_t *seed = json_object_get(params, "seed");
    json_t *sseed = json_object_get(json_object_get(job, "sampler"), "seed");
    j->sp.seed = json_is_integer(seed)    ? (uint64_t)json_integer_value(seed)
                 : json_is_integer(sseed) ? (uint64_t)json_integer_value(sseed)
                                          : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)j;
    if (j->sp.temperature < 0 || j->sp.top_p < 0 || j->sp.top_p > 1 || j->sp.top_k < 0) {
        snprintf(err, errlen, "bad sampling parameters");
        goto fail;
    }
    j->max_tokens = (long)num_or(params, "max_tokens", (double)b->n_ctx);
    if (j->max_tokens <= 0)
        j->max_tokens = b->n_ctx;
    json_t *stop = json_object_get(params, "stop");
    if (json_is_string(stop)) {
        j->stops[j->n_stops++] = strdup(json_string_value(stop));
    } else if (json_is_array(stop)) {
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) {
            if (json_is_string(s) && *json_string_value(s) && j->n_stops < MAX_STOPS)
                j->stops[j->n_stops++] = strdup(json_string_value(s));
        }
    }
    for (size_t i = 0; i < j->n_stops; i++)
        if (!j->stops[i]) {
            rc = nomem(err, errlen);
            goto fail;
        }
    int r = parse_response_format(b, job, j, cont, err, errlen);
    if (r < 0) {
        rc = r;
        goto fail;
    }
    /* Only what the server can compute too: no chain is fine (nothing
     * advertised for the slot). */
    gp_prefix_chain_of_job(job, &j->chain);
    /* Longer than the server ever sends: hashed down, still distinct. */
    const char *tenant = json_string_value(json_object_get(job, "tenant"));
    if (tenant && strlen(tenant) < sizeof j->tenant)
        snprintf(j->tenant, sizeof j->tenant, "%s", tenant);
    else if (tenant)
        gp_sha256_hex(tenant, strlen(tenant), j->tenant);
    j->slot = -1;
    j->t_start = gguf_now_s();
    *out = j;
    return 0;
fail:
    gguf_job_free(j);
    return rc;
}

/* jobs_wire: a job as its agent receives it, as a jansson tree or written as text (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <math.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_util.h"

/* ------------------------------------------------------------------ */
/* Wire form                                                           */
/* ------------------------------------------------------------------ */

/* Token-exact continuation part of the wire (docs/protocol.md): the ids
 * generated so far, the digest they belong to and the sampler's state
 * (seed; draws taken = tokens sampled). The sampler seed goes with every
 * attempt, so the first attempt samples with the seed a continuation will
 * be given. */
static void wire_continuation(const gps_job *job, json_t *w)
{
    json_t *smp = json_pack("{s:I}", "seed", (json_int_t)job->sampler_seed);
    if (job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0) {
        json_t *ids = json_array();
        for (size_t i = 0; ids && i < job->n_gen_ids; i++)
            json_array_append_new(ids, json_integer(job->gen_ids[i]));
        json_object_set_new(w, "continuation_ids", ids);
        json_object_set_new(w, "continuation_digest", json_string(job->ids_digest));
        json_object_set_new(smp, "n_sampled", json_integer((json_int_t)job->n_gen_ids));
    }
    json_object_set_new(w, "sampler", smp);
}

json_t *gps_job_wire(const gps_job *job, uint64_t now_us, int request_timeout_sec)
{
    /* A part lost to out of memory must not leave a wire short of it (an
     * offer run elsewhere without its messages, stop strings or tools):
     * jansson's failed allocations are counted (gp_json.h), and any during
     * the build gives no wire at all. A string jansson refuses (not UTF-8)
     * still leaves its key out, as gps_job_wire_append does. */
    gp_json_init();
    unsigned long failed = gp_json_alloc_failures();
    const gps_job_spec *s = &job->spec;
    /* A continuation attempt generates only what is left of the budget. */
    long long done = job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0
                         ? (long long)job->n_gen_ids
                         : job->continued_tokens;
    long long max_tokens = s->max_tokens - done;
    if (max_tokens < 1)
        max_tokens = 1;
    json_t *params = json_pack("{s:I,s:f,s:f,s:I}", "max_tokens", (json_int_t)max_tokens,
                               "temperature", s->temperature, "top_p", s->top_p, "top_k",
                               (json_int_t)s->top_k);
    json_object_set_new(params, "stop", s->stop ? json_deep_copy(s->stop) : json_array());
    json_object_set_new(params, "seed", s->has_seed ? json_integer(s->seed) : json_null());
    uint64_t budget_us = (uint64_t)request_timeout_sec * 1000000ull;
    uint64_t used = now_us > job->created_us ? now_us - job->created_us : 0;
    long long deadline_ms = used < budget_us ? (long long)((budget_us - used) / 1000) : 0;
    json_t *w = json_pack("{s:s,s:s,s:s,s:o,s:s,s:i,s:s,s:I}", "job_id", job->id, "kind",
                          gps_job_kind_name(s->kind), "model", s->model, "params", params,
                          "continuation",
                          job->continued_tokens > 0 && job->text.data ? job->text.data : "",
                          "attempt", job->attempts, "correlation_id",
                          job->correlation_id, "deadline_ms", (json_int_t)deadline_ms);
    json_object_set_new(w, "prompt", s->prompt ? json_string(s->prompt) : json_null());
    json_object_set_new(w, "messages", s->messages ? json_deep_copy(s->messages) : json_null());
    if (s->input)
        json_object_set_new(w, "input", json_deep_copy(s->input));
    if (s->tools) {
        json_object_set_new(w, "tools", json_deep_copy(s->tools));
        if (s->tool_choice)
            json_object_set_new(w, "tool_choice", json_deep_copy(s->tool_choice));
    }
    if (s->response_format)
        json_object_set_new(w, "response_format", json_deep_copy(s->response_format));
    if (s->user)
        json_object_set_new(w, "user", json_string(s->user));
    /* What an agent whose upstream is another pool passes on to it
     * (docs/protocol.md): the affinity key and a batch priority. */
    const char *session = s->session ? s->session : s->user;
    if (session)
        json_object_set_new(w, "session", json_string(session));
    if (s->priority == GPS_PRIO_BATCH)
        json_object_set_new(w, "priority", json_string("batch"));
    if (s->pool_via[0])
        json_object_set_new(w, "pool_via", json_string(s->pool_via));
    if (job->tenant[0])
        json_object_set_new(w, "tenant", json_string(job->tenant));
    if (s->prompt_tokens_first)
        json_object_set_new(w, "prompt_tokens_first", json_true());
    wire_continuation(job, w);
    if (gp_json_alloc_failures() != failed) {
        json_decref(w);
        return NULL;
    }
    return w;
}

/*
 * The same wire, written as text (issue 24, fourth round): building it as
 * a jansson tree (a json_pack per part, the messages and tools deep-copied)
 * and dumping it was about 50,000 instructions a job. The fields come in
 * gps_job_wire's order and as gp_json_dump_append writes them; the parts
 * that are JSON already (stop, messages, input, tools, response_format)
 * are dumped as they are. A string jansson would refuse (not UTF-8), a
 * missing model or a temperature that is not finite takes the jansson
 * path instead, where json_pack's and json_string's refusals decide what
 * is left (test_job_wire compares the two).
 */

/* A real as json_real dumped it (jansson's own formatting). */
static int put_real(gp_buf *b, double d)
{
    json_t *r = json_real(d);
    int rc = r ? gp_json_dump_append(b, r) : -1;
    json_decref(r);
    return rc;
}

static bool utf8_ok(const char *s)
{
    return !s || gp_utf8_valid(s, strlen(s));
}

/* Every string of the wire is one jansson takes, and the numbers are. */
static bool wire_plain(const gps_job *job)
{
    const gps_job_spec *s = &job->spec;
    bool cont = job->continued_tokens > 0;
    return s->model && isfinite(s->temperature) && isfinite(s->top_p) && utf8_ok(job->id) &&
           utf8_ok(s->model) && (!cont || utf8_ok(job->text.data)) &&
           utf8_ok(job->correlation_id) &&
           utf8_ok(s->prompt) && utf8_ok(s->user) && utf8_ok(s->session) &&
           utf8_ok(s->pool_via) && utf8_ok(job->tenant) && utf8_ok(job->ids_digest);
}

/* ,"key":JSON (v borrowed). */
static int put_json(gp_buf *b, const char *key_lit, size_t klen, const json_t *v)
{
    return gp_buf_append(b, key_lit, klen) < 0 ? -1 : gp_json_dump_append(b, v);
}
#define PUT_JSON(b, k, v) put_json((b), (k), sizeof(k) - 1, (v))

static int wire_text(gp_buf *b, const gps_job *job, uint64_t now_us, int request_timeout_sec)
{
    const gps_job_spec *s = &job->spec;
    bool tokens = job->continuation_mode && strcmp(job->continuation_mode, "tokens") == 0;
    long long done = tokens ? (long long)job->n_gen_ids : job->continued_tokens;
    long long max_tokens = s->max_tokens - done;
    if (max_tokens < 1)
        max_tokens = 1;
    uint64_t budget_us = (uint64_t)request_timeout_sec * 1000000ull;
    uint64_t used = now_us > job->created_us ? now_us - job->created_us : 0;
    long long deadline_ms = used < budget_us ? (long long)((budget_us - used) / 1000) : 0;
    const char *cont = job->continued_tokens > 0 && job->text.data ? job->text.data : "";
    if (LIT(b, "{\"job_id\":") < 0 || gp_json_str_append(b, job->id) < 0 || LIT(b, ",\"kind\":") < 0 ||
        gp_json_str_append(b, gps_job_kind_name(s->kind)) < 0 || LIT(b, ",\"model\":") < 0 ||
        gp_json_str_append(b, s->model) < 0 || LIT(b, ",\"params\":{\"max_tokens\":") < 0 ||
        gp_buf_append_int(b, max_tokens) < 0 || LIT(b, ",\"temperature\":") < 0 ||
        put_real(b, s->temperature) < 0 || LIT(b, ",\"top_p\":") < 0 ||
        put_real(b, s->top_p) < 0 || LIT(b, ",\"top_k\":") < 0 || gp_buf_append_int(b, s->top_k) < 0 ||
        LIT(b, ",\"stop\":") < 0 || (s->stop ? gp_json_dump_append(b, s->stop) : LIT(b, "[]")) < 0 ||
        LIT(b, ",\"seed\":") < 0 || (s->has_seed ? gp_buf_append_int(b, s->seed) : LIT(b, "null")) < 0 ||
        LIT(b, "},\"continuation\":") < 0 || gp_json_str_append(b, cont) < 0 ||
        LIT(b, ",\"attempt\":") < 0 || gp_buf_append_int(b, job->attempts) < 0 ||
        LIT(b, ",\"correlation_id\":") < 0 || gp_json_str_append(b, job->correlation_id) < 0 ||
        LIT(b, ",\"deadline_ms\":") < 0 || gp_buf_append_int(b, deadline_ms) < 0 ||
        LIT(b, ",\"prompt\":") < 0 || (s->prompt ? gp_json_str_append(b, s->prompt) : LIT(b, "null")) < 0 ||
        LIT(b, ",\"messages\":") < 0 ||
        (s->messages ? gp_json_dump_append(b, s->messages) : LIT(b, "null")) < 0)
        return -1;
    if ((s->input && PUT_JSON(b, ",\"input\":", s->input) < 0) ||
        (s->tools && PUT_JSON(b, ",\"tools\":", s->tools) < 0) ||
        (s->tools && s->tool_choice && PUT_JSON(b, ",\"tool_choice\":", s->tool_choice) < 0) ||
        (s->response_format && PUT_JSON(b, ",\"response_format\":", s->response_format) < 0) ||
        (s->user && (LIT(b, ",\"user\":") < 0 || gp_json_str_append(b, s->user) < 0)))
        return -1;
    const char *session = s->session ? s->session : s->user;
    if ((session && (LIT(b, ",\"session\":") < 0 || gp_json_str_append(b, session) < 0)) ||
        (s->priority == GPS_PRIO_BATCH && LIT(b, ",\"priority\":\"batch\"") < 0) ||
        (s->pool_via[0] && (LIT(b, ",\"pool_via\":") < 0 || gp_json_str_append(b, s->pool_via) < 0)) ||
        (job->tenant[0] && (LIT(b, ",\"tenant\":") < 0 || gp_json_str_append(b, job->tenant) < 0)) ||
        (s->prompt_tokens_first && LIT(b, ",\"prompt_tokens_first\":true") < 0))
        return -1;
    if (tokens) {
        if (LIT(b, ",\"continuation_ids\":[") < 0)
            return -1;
        for (size_t i = 0; i < job->n_gen_ids; i++)
            if ((i && LIT(b, ",") < 0) || gp_buf_append_int(b, job->gen_ids[i]) < 0)
                return -1;
        if (LIT(b, "],\"continuation_digest\":") < 0 || gp_json_str_append(b, job->ids_digest) < 0)
            return -1;
    }
    if (LIT(b, ",\"sampler\":{\"seed\":") < 0 || gp_buf_append_int(b, job->sampler_seed) < 0 ||
        (tokens && (LIT(b, ",\"n_sampled\":") < 0 || gp_buf_append_int(b, (long long)job->n_gen_ids) < 0)))
        return -1;
    return LIT(b, "}}");
}

int gps_job_wire_append(gp_buf *out, const gps_job *job, uint64_t now_us,
                        int request_timeout_sec)
{
    size_t at = out->len;
    int rc;
    if (wire_plain(job)) {
        rc = wire_text(out, job, now_us, request_timeout_sec);
    } else {
        json_t *w = gps_job_wire(job, now_us, request_timeout_sec);
        rc = w ? gp_json_dump_append(out, w) : 1;
        json_decref(w);
    }
    if (rc != 0) {
        gp_buf_truncate(out, at);
    }
    return rc < 0 ? -1 : rc;
}

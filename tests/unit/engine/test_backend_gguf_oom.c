/*
 * The agent's gguf backend (src/agent/backend_gguf*.c) when memory runs
 * out, on stories260K: a job the agent cannot run for want of memory ends
 * with AGENT_OUT_OF_MEMORY (the server fails it over), never as the
 * client's fault (job_start's -1: INVALID_REQUEST) nor INTERNAL_ERROR, and
 * never goes on with a piece of its text, a tool call or an event lost.
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: the agent's, the engine's and jansson's malloc, calloc,
 * realloc and strdup (ld --wrap: part-41-backend-gguf-oom.cmake, through
 * tests/unit/server/fixture_oom.h arm_beneath), jansson's through
 * gp_json's counting allocator, whose count the engine is given, as
 * gpupool-agent's main sets it up.
 *
 * test_start_sweep: job_start alone (the failure disarmed when it returns):
 * the job starts, or job_start says AGENT_JOB_START_NOMEM; a refused job is
 * still refused.
 *
 * The whole-job sweeps keep the failure armed until the job's terminal
 * event, so it also lands in the decode thread (tokenizing, admission,
 * decoding, sampling, the stop matcher, the tool-call parser, the events).
 * Each run, against a run without failure (greedy, so the same text):
 * either the same events (text, tool calls, ids, metrics, end), or the
 * start refused with AGENT_JOB_START_NOMEM, or an AGENT_OUT_OF_MEMORY end
 * after a beginning of the same output. The token ids the server would
 * keep (those up to the first token event without any, docs/protocol.md)
 * are always a beginning of the reference's: a token-exact failover
 * resumes the text the client has. Jobs: completions (stop strings, one
 * the text writes most of, so the matcher's buffer grows while the job
 * runs; a token-exact continuation, a response_format), a chat on the
 * model's own template, tools on a copy of the model given a chatml
 * template with a tools format (a forced call: the parser reads it back
 * out of the text), and embeddings. Then tokens longer than the fixed
 * buffers they were once rendered into: a 300-byte token generated and
 * continued after (test_long_token), a long BOS in a chat prompt
 * (test_long_special_token), each on a copy of the model whose
 * vocabulary was rewritten.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/backend.h"
#include "common/gp_json.h"
#include "gpupool/engine.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"
#include "fixture_gguf.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

/* ------------------------------------------------------------ the sink */

/* A job's events. Fixed buffers: the sink runs on the decode thread while
 * the failure is armed, and its own allocations would be counted. */
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_terminal;
    bool started;
    char text[8192];
    size_t n_text;
    /* the ids the server keeps: those of every token event up to the
     * first one without ids (ids_ok false from there) */
    int32_t ids[1024];
    size_t n_ids;
    bool ids_ok;
    char calls[4096];          /* "index id name args;" per call event */
    size_t n_calls;
    int n_metrics;
    long long first_prompt;    /* the first metrics event's prompt_tokens, -1 none */
    bool final_metrics;        /* one with prompt_tokens_cached came */
    int n_emb;
    float emb[4][128];
    char reason[32], code[64], msg[256];
    long long prompt_tokens, completion_tokens;
    bool overflow;             /* more than the buffers hold (a test error) */
} rec;

static void rec_init(rec *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->ids_ok = true;
    r->first_prompt = -1;
}

static void rec_destroy(rec *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static void put(rec *r, char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    if (*n + len >= cap) {
        r->overflow = true;
        return;
    }
    memcpy(buf + *n, s, len);
    *n += len;
    buf[*n] = '\0';
}

static void keep_ids(rec *r, const int32_t *ids, size_t n)
{
    if (n == 0 || ids[n - 1] < 0) {
        r->ids_ok = false;   /* an event without ids ends the server's record */
        return;
    }
    if (!r->ids_ok)
        return;
    if (r->n_ids + n > sizeof r->ids / sizeof r->ids[0]) {
        r->overflow = true;
        return;
    }
    memcpy(r->ids + r->n_ids, ids, n * sizeof *ids);
    r->n_ids += n;
}

static void on_started(void *c)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    r->started = true;
    pthread_mutex_unlock(&r->mu);
}

static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    put(r, r->text, sizeof r->text, &r->n_text, t, n);
    keep_ids(r, &id, 1);
    pthread_mutex_unlock(&r->mu);
}

static void on_token_ids(void *c, const char *t, size_t n, const int32_t *ids, size_t n_ids)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    put(r, r->text, sizeof r->text, &r->n_text, t, n);
    keep_ids(r, ids, n_ids);
    pthread_mutex_unlock(&r->mu);
}

static void on_metrics(void *c, json_t *m)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    if (r->n_metrics++ == 0 && json_is_integer(json_object_get(m, "prompt_tokens")))
        r->first_prompt = json_integer_value(json_object_get(m, "prompt_tokens"));
    if (json_object_get(m, "prompt_tokens_cached"))
        r->final_metrics = true;
    pthread_mutex_unlock(&r->mu);
}

static void on_tool_call(void *c, int index, const char *id, const char *name, const char *args,
                         size_t args_len)
{
    rec *r = c;
    char head[256];
    int n = snprintf(head, sizeof head, "%d %s %s ", index, id ? id : "-", name ? name : "-");
    pthread_mutex_lock(&r->mu);
    put(r, r->calls, sizeof r->calls, &r->n_calls, head, (size_t)n);
    put(r, r->calls, sizeof r->calls, &r->n_calls, args, args_len);
    put(r, r->calls, sizeof r->calls, &r->n_calls, ";", 1);
    pthread_mutex_unlock(&r->mu);
}

static void on_embedding(void *c, int index, const float *v, int dim)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    if (index != r->n_emb || index >= 4 || dim > 128)
        r->overflow = true;
    else
        memcpy(r->emb[r->n_emb++], v, (size_t)dim * sizeof *v);
    pthread_mutex_unlock(&r->mu);
}

static void terminal(rec *r)
{
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
}

static void on_end(void *c, const char *fr, long long pt, long long ct)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->reason, sizeof r->reason, "%s", fr);
    r->prompt_tokens = pt;
    r->completion_tokens = ct;
    terminal(r);
    pthread_mutex_unlock(&r->mu);
}

static void on_error(void *c, const char *code, const char *msg)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->code, sizeof r->code, "%s", code);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    terminal(r);
    pthread_mutex_unlock(&r->mu);
}

/* Waits (bounded: 60 s) for the terminal event; its count. */
static int rec_wait(rec *r)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&r->mu);
    while (r->n_terminal == 0)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
            break;
    int n = r->n_terminal;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* --------------------------------------------------------- the backend */

static agent_backend *make(const char *model, long long ctx, bool prefix_cache)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)model;
    o.slots = 1;
    o.threads = 1;
    o.ctx_size = ctx;
    o.prefix_cache = prefix_cache;
    char err[256];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fail_msg("create: %s", err);
    return b;
}

static agent_job_sink sink_of(rec *r)
{
    return (agent_job_sink){.ctx = r, .started = on_started, .token = on_token,
                            .token_ids = on_token_ids, .metrics = on_metrics, .end = on_end,
                            .error = on_error, .tool_call = on_tool_call,
                            .embedding = on_embedding};
}

/* job_start on job, the n-th allocation failing (0: none) while it
 * starts; its rc, and whether the failure was reached. A started job runs
 * to its end first. */
static int start(agent_backend *b, json_t *job, size_t n, bool *hit, char *err, size_t errlen)
{
    rec r;
    rec_init(&r);
    agent_job_sink s = sink_of(&r);
    err[0] = '\0';
    if (n)
        arm_beneath(n);
    int rc = b->ops->job_start(b, job, &s, err, errlen);
    /* (the decode thread may take the failure once the job is queued: a
     * started job is not judged here) */
    *hit = disarm();
    if (rc == 0)
        assert_int_equal(rec_wait(&r), 1);
    rec_destroy(&r);
    return rc;
}

/* The whole job with the n-th allocation failing (0: none), the failure
 * armed until its terminal event: its events into r, job_start's rc; *hit:
 * whether the failure was reached. */
static int run(agent_backend *b, json_t *job, size_t n, rec *r, bool *hit, char *err,
               size_t errlen)
{
    rec_init(r);
    agent_job_sink s = sink_of(r);
    err[0] = '\0';
    if (n)
        arm_beneath(n);
    int rc = b->ops->job_start(b, job, &s, err, errlen);
    int n_term = rc == 0 ? rec_wait(r) : 0;
    *hit = disarm();
    if (rc == 0 && n_term != 1)
        fail_msg("%d terminal events", n_term);
    return rc;
}

static bool prefix_of(const char *p, size_t np, const char *s, size_t ns)
{
    return np <= ns && memcmp(p, s, np) == 0;
}

/* Whether run got (job_start's rc, the failure reached or not) keeps the
 * rule against ref, the run without failure; prints why not. */
static bool judge(const char *what, size_t n, int rc, bool hit, const char *err, const rec *ref,
                  const rec *got)
{
    const char *why = NULL;
    bool ids_prefix = got->n_ids <= ref->n_ids &&
                      memcmp(got->ids, ref->ids, got->n_ids * sizeof *got->ids) == 0;
    if (got->overflow) {
        why = "the recorder overflowed";
    } else if (rc != 0) {
        if (rc != AGENT_JOB_START_NOMEM || !hit || !strstr(err, "out of memory"))
            why = "job_start's failure is not AGENT_JOB_START_NOMEM";
    } else if (!ids_prefix) {
        why = "the ids the server keeps are not the reference's";
    } else if (got->code[0]) {
        if (strcmp(got->code, "AGENT_OUT_OF_MEMORY") != 0 || !hit)
            why = "the error is not AGENT_OUT_OF_MEMORY";
        else if (!prefix_of(got->text, got->n_text, ref->text, ref->n_text) ||
                 !prefix_of(got->calls, got->n_calls, ref->calls, ref->n_calls) ||
                 got->n_emb > 0)
            why = "the output before AGENT_OUT_OF_MEMORY is not the reference's";
    } else if (got->n_text != ref->n_text || memcmp(got->text, ref->text, ref->n_text) != 0) {
        why = "another text";
    } else if (strcmp(got->calls, ref->calls) != 0) {
        why = "other tool calls";
    } else if (got->ids_ok && got->n_ids != ref->n_ids) {
        why = "ids missing";
    } else if (strcmp(got->reason, ref->reason) != 0 ||
               got->prompt_tokens != ref->prompt_tokens ||
               got->completion_tokens != ref->completion_tokens) {
        why = "another end";
    } else if (got->n_metrics != ref->n_metrics || got->first_prompt != ref->first_prompt ||
               got->final_metrics != ref->final_metrics) {
        why = "metrics lost";
    } else if (got->n_emb != ref->n_emb || memcmp(got->emb, ref->emb, sizeof got->emb) != 0) {
        why = "other embeddings";
    }
    if (why)
        print_message("%s: allocation %zu (%s): %s: rc %d \"%s\", error %s \"%s\", end %s, "
                      "text \"%.200s\" (want \"%.200s\"), calls \"%.200s\" (want \"%.200s\")\n",
                      what, n, hit ? "failed" : "not reached", why, rc, err, got->code,
                      got->msg, got->reason, got->text, ref->text, got->calls, ref->calls);
    return why == NULL;
}

/* Where a sweep runs its jobs: on warm, or (warm NULL) on a backend made
 * for each run (model, ctx), whose first job makes what a backend makes
 * on first use (the decode scratch, the embeddings contexts). */
typedef struct where {
    const char *model;
    long long ctx;
    agent_backend *warm;
} where;

/* Runs job without failure (the reference, into *ref_out when not NULL),
 * then with the N-th allocation failing for N = 1, 2, ... until one is
 * not reached. Returns how many runs broke the rule. */
static int sweep_job(const where *w, const char *what, json_t *job, rec *ref_out)
{
    char err[256];
    bool hit;
    rec ref, got;
    agent_backend *b = w->warm ? w->warm : make(w->model, w->ctx, false);
    assert_int_equal(run(b, job, 0, &ref, &hit, err, sizeof err), 0);
    if (ref.code[0])
        fail_msg("%s: %s %s", what, ref.code, ref.msg);
    assert_false(ref.overflow);
    assert_true(ref.ids_ok);
    int bad = 0, n_nomem = 0;
    size_t n;
    for (n = 1;; n++) {
        if (!w->warm) {
            b->ops->destroy(b);
            b = make(w->model, w->ctx, false);
        }
        int rc = run(b, job, n, &got, &hit, err, sizeof err);
        bad += !judge(what, n, rc, hit, err, &ref, &got);
        n_nomem += rc != 0 || got.code[0];
        rec_destroy(&got);
        if (!hit)
            break;
    }
    if (!w->warm)
        b->ops->destroy(b);
    print_message("%s: %zu runs, %d ended out of memory, %d broke the rule\n", what, n, n_nomem,
                  bad);
    if (ref_out)
        *ref_out = ref;
    else
        rec_destroy(&ref);
    return bad;
}

/* ------------------------------------------------------------- the tests */

static void test_start_sweep(void **state)
{
    (void)state;
    agent_backend *b = make(STORIES, 256, true);
    json_t *models = b->ops->models(b);
    const char *dg = json_string_value(json_object_get(json_array_get(models, 0), "digest"));
    assert_non_null(dg);
    /* stop strings, a response_format (a grammar) and a text continuation
     * it accepts */
    json_t *fmt = json_pack(
        "{s:s, s:s, s:s, s:s, s:{s:i, s:f, s:[s,s]}, s:{s:s, s:{s:s, s:{s:s, s:{s:{s:s}}}}}}",
        "job_id", "fmt", "kind", "completion", "prompt", "Once upon a time", "continuation",
        "{\"a", "params", "max_tokens", 2, "temperature", 0.0, "stop", "xyz", "\n\n",
        "response_format", "type", "json_schema", "json_schema", "name", "r", "schema",
        "type", "object", "properties", "a", "type", "string");
    /* a token-exact continuation (its ids and text copied) */
    json_t *ids = json_pack("{s:s, s:s, s:s, s:s, s:[i,i,i], s:s, s:{s:i, s:i}, s:{s:i}}",
                            "job_id", "ids", "kind", "completion", "prompt", "Once upon",
                            "continuation", " a time", "continuation_ids", 1, 2, 3,
                            "continuation_digest", dg, "sampler", "seed", 5, "n_sampled", 3,
                            "params", "max_tokens", 2);
    /* an embeddings job */
    json_t *emb = json_pack("{s:s, s:s, s:[s]}", "job_id", "emb", "kind", "embeddings",
                            "input", "Once");
    assert_non_null(fmt);
    assert_non_null(ids);
    assert_non_null(emb);
    json_decref(models);
    json_t *jobs[] = {fmt, ids, emb};
    const char *names[] = {"response_format", "continuation_ids", "embeddings"};
    int bad = 0;
    char err[256];
    bool hit;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(start(b, jobs[k], 0, &hit, err, sizeof err), 0);
        int bad_here = 0;
        size_t n;
        for (n = 1;; n++) {
            int rc = start(b, jobs[k], n, &hit, err, sizeof err);
            if (rc != 0 && (!hit || rc != AGENT_JOB_START_NOMEM || !strstr(err, "out of memory"))) {
                print_message("%s: allocation %zu %s: rc %d (want AGENT_JOB_START_NOMEM), "
                              "\"%s\"\n", names[k], n, hit ? "failed" : "did not fail", rc, err);
                bad_here++;
            }
            if (!hit)
                break;
        }
        print_message("%s (start): %zu runs, %d broke the rule\n", names[k], n, bad_here);
        bad += bad_here;
    }
    /* a refused job is still refused */
    json_t *refused = json_pack("{s:s, s:s, s:s, s:{s:f}}", "job_id", "r", "kind", "completion",
                                "prompt", "x", "params", "temperature", -1.0);
    assert_int_equal(start(b, refused, 0, &hit, err, sizeof err), -1);
    json_decref(refused);
    json_decref(fmt);
    json_decref(ids);
    json_decref(emb);
    b->ops->destroy(b);
    assert_int_equal(bad, 0);
}

/* The text of a token (stories260K's pieces are short). */
static void piece_of(const char *model_path, int32_t id, char *buf, size_t cap)
{
    gpe_model *m = NULL;
    char err[256];
    if (gpe_model_load(model_path, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    int n = gpe_token_to_piece(m, id, buf, cap - 1, false);
    buf[n > 0 ? n : 0] = '\0';
    gpe_model_free(m);
}

/* Completions, whole: the tokenizer, admission (sampler, stop matcher),
 * decoding, sampling and the events. Without the prefix cache: greedy
 * text from a cached prefix may differ by float rounding. */
static void test_completion_sweep(void **state)
{
    (void)state;
    agent_backend *b = make(STORIES, 256, false);
    json_t *models = b->ops->models(b);
    const char *dg = json_string_value(json_object_get(json_array_get(models, 0), "digest"));
    assert_non_null(dg);
    json_t *plain = json_pack("{s:s, s:s, s:s, s:{s:i, s:f}}", "job_id", "plain", "kind",
                              "completion", "prompt", "Once upon a time", "params",
                              "max_tokens", 6, "temperature", 0.0);
    assert_non_null(plain);
    rec ref;
    where fresh = {STORIES, 256, NULL}, warm = {STORIES, 256, b};
    /* a new backend's first job (the decode's scratch is made then) */
    int bad = sweep_job(&fresh, "completion (first job)", plain, &ref);
    assert_true(ref.n_ids >= 4);
    rec_destroy(&ref);
    bad += sweep_job(&warm, "completion", plain, &ref);

    /* A stop string the first token's text begins: the matcher holds that
     * text back, so its id goes out with the next token's, in one event:
     * an id lost before that event must not leave the server the later
     * ids alone. */
    char first[64], stop[80];
    piece_of(STORIES, ref.ids[0], first, sizeof first);
    snprintf(stop, sizeof stop, "%s\x01", first);
    json_t *held = json_pack("{s:s, s:s, s:s, s:{s:i, s:f, s:[s]}}", "job_id", "held", "kind",
                             "completion", "prompt", "Once upon a time", "params", "max_tokens",
                             6, "temperature", 0.0, "stop", stop);
    assert_non_null(held);
    bad += sweep_job(&warm, "held back by a stop string", held, NULL);

    /* A stop string whose first 80 bytes the text writes: the matcher
     * holds them back, and its buffer grows past the 64 bytes made at
     * admission while the job runs (a growth that fails ends the job
     * AGENT_OUT_OF_MEMORY: never the text with that piece left out) */
    json_t *longer = json_pack("{s:s, s:s, s:s, s:{s:i, s:f}}", "job_id", "longer", "kind",
                               "completion", "prompt", "Once upon a time", "params",
                               "max_tokens", 40, "temperature", 0.0);
    assert_non_null(longer);
    rec long_ref;
    char err[256], long_stop[96];
    bool hit;
    assert_int_equal(run(b, longer, 0, &long_ref, &hit, err, sizeof err), 0);
    assert_true(long_ref.n_text > 100);
    memcpy(long_stop, long_ref.text, 80);
    memcpy(long_stop + 80, "\x01", 2);
    rec_destroy(&long_ref);
    json_t *held_long = json_pack("{s:s, s:s, s:s, s:{s:i, s:f, s:[s]}}", "job_id", "held_long",
                                  "kind", "completion", "prompt", "Once upon a time", "params",
                                  "max_tokens", 40, "temperature", 0.0, "stop", long_stop);
    assert_non_null(held_long);
    bad += sweep_job(&warm, "held back past the matcher's first buffer", held_long, NULL);
    json_decref(longer);
    json_decref(held_long);

    /* A token-exact continuation of the plain run after its second token:
     * its ids after the prompt, the matcher primed with the text held */
    char cont[64] = "";
    for (int i = 0; i < 2; i++) {
        char p[32];
        piece_of(STORIES, ref.ids[i], p, sizeof p);
        strcat(cont, p);
    }
    json_t *ids = json_pack("{s:s, s:s, s:s, s:s, s:[i,i], s:s, s:{s:i, s:i}, s:{s:i, s:f, "
                            "s:[s]}}",
                            "job_id", "ids", "kind", "completion", "prompt", "Once upon a time",
                            "continuation", cont, "continuation_ids", ref.ids[0], ref.ids[1],
                            "continuation_digest", dg, "sampler", "seed", 5, "n_sampled", 2,
                            "params", "max_tokens", 4, "temperature", 0.0, "stop", "qqq");
    assert_non_null(ids);
    bad += sweep_job(&warm, "continuation_ids", ids, NULL);

    /* a response_format (the grammar masks every step) */
    json_t *fmt = json_pack("{s:s, s:s, s:s, s:{s:i, s:f}, s:{s:s, s:{s:s, s:{s:s, "
                            "s:{s:{s:s, s:i}}, s:[s]}}}}",
                            "job_id", "fmt", "kind", "completion", "prompt", "Once upon a time",
                            "params", "max_tokens", 12, "temperature", 0.0, "response_format",
                            "type", "json_schema", "json_schema", "name", "r", "schema", "type",
                            "object", "properties", "a", "type", "string", "maxLength", 3,
                            "required", "a");
    assert_non_null(fmt);
    bad += sweep_job(&warm, "response_format", fmt, NULL);
    rec_destroy(&ref);
    json_decref(plain);
    json_decref(held);
    json_decref(ids);
    json_decref(fmt);
    json_decref(models);
    b->ops->destroy(b);
    assert_int_equal(bad, 0);
}

/* A chat job, whole: its messages rendered with the model's template
 * (the engine's renderer runs out of memory too) and generated. */
static void test_chat_sweep(void **state)
{
    (void)state;
    where w = {STORIES, 256, NULL};
    json_t *chat = json_pack("{s:s, s:s, s:[{s:s, s:s}, {s:s, s:[{s:s, s:s}]}], s:{s:i, s:f}}",
                             "job_id", "chat", "kind", "chat", "messages", "role", "system",
                             "content", "Be brief.", "role", "user", "content", "type", "text",
                             "text", "Once upon a time", "params", "max_tokens", 4,
                             "temperature", 0.0);
    assert_non_null(chat);
    int bad = sweep_job(&w, "chat", chat, NULL);
    json_decref(chat);
    assert_int_equal(bad, 0);
}

/* ---------------------------------------------- a model with a tools format */

/* A chatml template with a tools format (gpe_chat_template_supports_tools). */
#define TOOLS_TEMPLATE                                                                         \
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"            \
    "{% endfor %}{% if tools %}<tools>{{ tools }}</tools> <tool_call>{% endif %}"              \
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

/* Tools, whole: the tools and a tool message rendered in chatml's tools
 * format, a forced call (its grammar), and the call read back out of the
 * text by the parser as the model writes it and at the end. */
static void test_tools_sweep(void **state)
{
    (void)state;
    char path[] = "/tmp/gpupool-test-tools-XXXXXX.gguf";
    fixture_gguf_tmp(path);
    fixture_gguf_with_template(STORIES, path, TOOLS_TEMPLATE, 2048);
    agent_backend *b = make(path, 2048, false);
    json_t *models = b->ops->models(b);
    assert_true(json_is_true(json_object_get(json_array_get(models, 0), "supports_tools")));
    json_decref(models);
    json_t *tools = J("[{\"type\":\"function\",\"function\":{\"name\":\"weather\","
                      "\"description\":\"Weather now\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"c\":{\"type\":\"string\",\"maxLength\":3}},"
                      "\"required\":[\"c\"],\"additionalProperties\":false}}}]");
    json_t *msgs = J("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                     "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                     "\"function\":{\"name\":\"weather\","
                     "\"arguments\":\"{\\\"c\\\":\\\"x\\\"}\"}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sun\"}]");
    json_t *job = json_pack("{s:s, s:s, s:o, s:o, s:{s:s, s:{s:s}}, s:{s:i, s:f}}", "job_id",
                            "tools", "kind", "chat", "messages", msgs, "tools", tools,
                            "tool_choice", "type", "function", "function", "name", "weather",
                            "params", "max_tokens", 40, "temperature", 0.0);
    assert_non_null(job);
    rec ref;
    where w = {path, 2048, b};
    int bad = sweep_job(&w, "forced tool call", job, &ref);
    /* the reference did call the tool */
    assert_string_equal(ref.reason, "tool_calls");
    assert_non_null(strstr(ref.calls, " weather {\"c\":"));
    rec_destroy(&ref);
    /* "auto": the model writes text, which goes out through the parser
     * (a piece it could not keep must not leave the rest to go out) */
    json_t *text = json_pack("{s:s, s:s, s:[{s:s, s:s}], s:O, s:s, s:{s:i, s:f}}", "job_id",
                             "auto", "kind", "chat", "messages", "role", "user", "content",
                             "Once upon a time", "tools", tools, "tool_choice", "auto", "params",
                             "max_tokens", 8, "temperature", 0.0);
    assert_non_null(text);
    bad += sweep_job(&w, "tools, text", text, &ref);
    assert_string_equal(ref.reason, "length");
    assert_true(ref.n_text > 0);
    rec_destroy(&ref);
    json_decref(text);
    json_decref(job);
    b->ops->destroy(b);
    unlink(path);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------- a token longer than 256 bytes */

/* src copied to dst with the vocabulary's token `from` (tokenizer.ggml.
 * tokens) spelled `to` instead; its id (the token must be there). */
static int32_t gguf_with_token(const char *src, const char *dst, const char *from, const char *to)
{
    int32_t id;
    fixture_gguf_with_tokens(src, dst, &from, &to, &id, 1);
    return id;
}

/* Whether token tok may follow the opening quote of a JSON string under
 * v (its text is plain characters: it may). */
static bool string_allows(const gpe_grammar_vocab *v, int n_vocab, int32_t tok)
{
    char err[256];
    gpe_grammar *gr = NULL;
    assert_int_equal(gpe_grammar_init_vocab(v, "{\"type\":\"string\"}", &gr, err, sizeof err),
                     GPE_OK);
    assert_int_equal(gpe_grammar_accept_text(gr, "\"", 1), GPE_OK);
    float *logits = calloc((size_t)n_vocab, sizeof *logits);
    assert_non_null(logits);
    const float *masked = gpe_grammar_mask(gr, logits, n_vocab, 0);
    assert_non_null(masked);
    bool ok = masked[tok] == 0.0f && gpe_grammar_accept(gr, tok) == GPE_OK;
    free(logits);
    gpe_grammar_free(gr);
    return ok;
}

#define LONG_RUN 300   /* bytes of '~' after " little": past the old 256-byte piece */

/* A token whose text is longer than 256 bytes (stories260K's " little",
 * the greedy story's fifth token, made " little" and 300 '~'): its whole text
 * goes out where the model samples it, and where a token-exact
 * continuation primes the stop matcher with what it held back of it; a
 * schema's grammar allows it where its text fits (its vocabulary swept). Before, it was rendered
 * into a 256-byte buffer, came back -(needed) and was taken for "": the
 * text lost its 307 bytes, the primed matcher nothing, the grammar never
 * allowed it. Then the jobs, swept: the piece's buffer that cannot grow
 * ends the job AGENT_OUT_OF_MEMORY, never the text without it. */
static void test_long_token(void **state)
{
    (void)state;
    char path[] = "/tmp/gpupool-test-longtok-XXXXXX.gguf";
    fixture_gguf_tmp(path);
    char spelled[16 + LONG_RUN], run_txt[LONG_RUN + 1];
    memset(run_txt, '~', LONG_RUN);
    run_txt[LONG_RUN] = '\0';
    snprintf(spelled, sizeof spelled, "\xE2\x96\x81little%s", run_txt);
    int32_t lil = gguf_with_token(STORIES, path, "\xE2\x96\x81little", spelled);

    /* the original model's greedy text, and where " little" ends in it */
    json_t *plain = json_pack("{s:s, s:s, s:s, s:{s:i, s:f}}", "job_id", "plain", "kind",
                              "completion", "prompt", "Once upon a time", "params",
                              "max_tokens", 10, "temperature", 0.0);
    assert_non_null(plain);
    char err[256];
    bool hit;
    rec orig;
    agent_backend *b0 = make(STORIES, 256, false);
    assert_int_equal(run(b0, plain, 0, &orig, &hit, err, sizeof err), 0);
    b0->ops->destroy(b0);
    const char *l = strstr(orig.text, " little");
    assert_non_null(l);
    assert_null(strstr(l + 1, " little"));
    size_t cut = (size_t)(l - orig.text) + 7;
    char want[8192];
    snprintf(want, sizeof want, "%.*s%s%s", (int)cut, orig.text, run_txt, orig.text + cut);
    rec_destroy(&orig);

    agent_backend *b = make(path, 256, false);
    json_t *models = b->ops->models(b);
    const char *dg = json_string_value(json_object_get(json_array_get(models, 0), "digest"));
    assert_non_null(dg);
    where w = {path, 256, b};
    rec ref;
    int bad = sweep_job(&w, "a long token", plain, &ref);
    if (strcmp(ref.text, want) != 0)
        fail_msg("text \"%s\", want \"%s\"", ref.text, want);
    size_t k = 0;   /* ids up to the long token's, inclusive */
    while (k < ref.n_ids && ref.ids[k] != lil)
        k++;
    assert_true(k < ref.n_ids);
    k++;

    /* A continuation after the long token, as a lost attempt with the
     * stop string "~~~~~~\x01" left it: the client has the text up to the
     * token's last 6 '~', which the matcher held back (a stop's beginning).
     * The primed matcher gives them back first. */
    json_t *ids = json_array();
    for (size_t i = 0; i < k; i++)
        json_array_append_new(ids, json_integer(ref.ids[i]));
    size_t sent = cut + LONG_RUN - 6;
    json_t *cj = json_pack("{s:s, s:s, s:s, s:s%, s:o, s:s, s:{s:i, s:i}, s:{s:i, s:f, s:[s]}}",
                           "job_id", "cont", "kind", "completion", "prompt", "Once upon a time",
                           "continuation", want, sent, "continuation_ids", ids,
                           "continuation_digest", dg, "sampler", "seed", 5, "n_sampled", (int)k,
                           "params", "max_tokens", (int)(10 - k), "temperature", 0.0, "stop",
                           "~~~~~~\x01");
    assert_non_null(cj);
    rec cref;
    bad += sweep_job(&w, "a continuation after a long token", cj, &cref);
    if (strcmp(cref.text, want + sent) != 0)
        fail_msg("continued \"%s\", want \"%s\"", cref.text, want + sent);
    rec_destroy(&cref);
    rec_destroy(&ref);
    json_decref(cj);
    json_decref(models);
    json_decref(plain);
    b->ops->destroy(b);

    /* the grammar's vocabulary, swept: built whole (the long token in it)
     * or GPE_ERR_NOMEM */
    gpe_model *m = NULL;
    if (gpe_model_load(path, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    size_t n;
    for (n = 1;; n++) {
        gpe_grammar_vocab *v = NULL;
        arm_beneath(n);
        gpe_status st = gpe_grammar_vocab_init(m, &v);
        hit = disarm();
        if (st == GPE_OK)
            assert_true(string_allows(v, gpe_model_n_vocab(m), lil));
        else if (st != GPE_ERR_NOMEM || !hit || v)
            fail_msg("grammar vocabulary: allocation %zu: status %d", n, (int)st);
        gpe_grammar_vocab_free(v);
        if (!hit)
            break;
    }
    print_message("grammar vocabulary: %zu runs\n", n);
    gpe_model_free(m);
    unlink(path);
    assert_int_equal(bad, 0);
}

/* A BOS longer than 64 bytes on a template that writes it (mistral's:
 * "[INST]" without "<<SYS>>"): the chat prompt begins with its whole
 * text. Before, it was rendered into a 64-byte buffer and came out ""
 * (the prompt without its BOS). Swept: the prompt whole, or
 * GPE_ERR_NOMEM. */
static void test_long_special_token(void **state)
{
    (void)state;
    char t1[] = "/tmp/gpupool-test-longbos1-XXXXXX.gguf";
    char t2[] = "/tmp/gpupool-test-longbos2-XXXXXX.gguf";
    fixture_gguf_tmp(t1);
    fixture_gguf_tmp(t2);
    fixture_gguf_with_template(STORIES, t1, "{{ bos_token }}[INST] {{ messages }} [/INST]",
                               256);
    char bos[128];
    snprintf(bos, sizeof bos, "<s>%s", "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~"
                                       "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~");
    gguf_with_token(t1, t2, "<s>", bos);
    gpe_model *m = NULL;
    char err[256];
    if (gpe_model_load(t2, NULL, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    gpe_chat_msg msg = {"user", "Hi"};
    size_t n;
    int whole = 0;
    for (n = 0;; n++) {
        gpe_status st1 = GPE_OK, st2 = GPE_OK;
        if (n)
            arm_beneath(n);
        char *p1 = gpe_chat_apply_status(m, &msg, 1, true, err, sizeof err, &st1);
        char *p2 = gpe_chat_apply_tools_status(m, NULL, 0, &msg, NULL, 1, true, err, sizeof err,
                                               &st2);
        bool hit = disarm();
        char *ps[] = {p1, p2};
        gpe_status sts[] = {st1, st2};
        for (int k = 0; k < 2; k++) {
            if (ps[k]) {
                if (strncmp(ps[k], bos, strlen(bos)) != 0)
                    fail_msg("allocation %zu: prompt \"%s\", want it to begin \"%s\"", n, ps[k],
                             bos);
                whole++;
            } else if (sts[k] != GPE_ERR_NOMEM || !hit) {
                fail_msg("allocation %zu: status %d, %s", n, (int)sts[k], err);
            }
        }
        free(p1);
        free(p2);
        if (n && !hit)
            break;
    }
    print_message("a long BOS: %zu runs, %d prompts whole\n", n, whole);
    gpe_model_free(m);
    unlink(t1);
    unlink(t2);
}

/* Embeddings, whole: tokenizing the inputs, the embeddings context. */
static void test_embeddings_sweep(void **state)
{
    (void)state;
    where w = {STORIES, 256, NULL};
    json_t *emb = json_pack("{s:s, s:s, s:[s, [i,i,i]]}", "job_id", "emb", "kind", "embeddings",
                            "input", "Once upon a time", 1, 2, 3);
    assert_non_null(emb);
    rec ref;
    int bad = sweep_job(&w, "embeddings", emb, &ref);
    assert_int_equal(ref.n_emb, 2);
    rec_destroy(&ref);
    json_decref(emb);
    assert_int_equal(bad, 0);
}

int main(void)
{
    /* as gpupool-agent's main: jansson's counting allocator, before any
     * thread; the engine judges its loads and dumps by its count */
    gp_json_init();
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_sweep),
        cmocka_unit_test(test_completion_sweep),
        cmocka_unit_test(test_chat_sweep),
        cmocka_unit_test(test_tools_sweep),
        cmocka_unit_test(test_embeddings_sweep),
        cmocka_unit_test(test_long_token),
        cmocka_unit_test(test_long_special_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

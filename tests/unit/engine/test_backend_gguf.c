/*
 * The agent's gguf backend (src/agent/backend_gguf.c) on stories260K:
 * several jobs decoded together in fewer slots than jobs (queueing), greedy
 * text identical to llama.cpp's reference, stop strings, max_tokens,
 * count_tokens, chat rendering, cancellation, context overflow, bad jobs,
 * and model facts for /agents/poll.
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

#include <cmocka.h>
#include <jansson.h>

#include "agent/backend.h"
#include "common/gp_prefix.h"
#include "gpupool/engine.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

/* One job's events, collected by the sink (thread-safe). */
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[8192];
    size_t len;
    int n_tokens, n_started, n_metrics, n_terminal;
    long long cached;          /* metrics prompt_tokens_cached, -1 when absent */
    long long first_prompt;    /* the first metrics event's prompt_tokens, -1 when absent */
    int first_at_tokens;       /* token events before the first metrics event */
    char reason[32], code[64];
    long long prompt_tokens, completion_tokens;
    /* token_ids sink: every id, and after each token event the text
     * length and id count so far */
    int32_t ids[1024];
    int n_ids, n_ev;
    size_t ev_len[1024];
    int ev_ids[1024];
    /* gate: the first token callback waits (bounded) until the test opens
     * it, holding the backend's decode thread there */
    bool gate, gated;
} rec;

static void on_started(void *c) { rec *r = c; pthread_mutex_lock(&r->mu); r->n_started++; pthread_mutex_unlock(&r->mu); }
static void deadline_in(struct timespec *dl, int sec)
{
    clock_gettime(CLOCK_REALTIME, dl);
    dl->tv_sec += sec;
}

static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)id;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    if (r->gate && !r->gated) {
        struct timespec dl;
        deadline_in(&dl, 60);
        r->gated = true;
        pthread_cond_broadcast(&r->cv);
        while (r->gate)
            if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
                break;
    }
    if (r->len + n < sizeof r->text) {
        memcpy(r->text + r->len, t, n);
        r->len += n;
        r->text[r->len] = '\0';
    }
    r->n_tokens++;
    pthread_mutex_unlock(&r->mu);
}
static void on_token_ids(void *c, const char *t, size_t n, const int32_t *ids, size_t n_ids)
{
    on_token(c, t, n, ids[n_ids - 1]);
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < n_ids && r->n_ids < 1024; i++)
        r->ids[r->n_ids++] = ids[i];
    if (r->n_ev < 1024) {
        r->ev_len[r->n_ev] = r->len;
        r->ev_ids[r->n_ev++] = r->n_ids;
    }
    pthread_mutex_unlock(&r->mu);
}
static void on_metrics(void *c, json_t *m)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    if (r->n_metrics++ == 0) {
        json_t *p = json_object_get(m, "prompt_tokens");
        r->first_prompt = json_is_integer(p) ? json_integer_value(p) : -1;
        r->first_at_tokens = r->n_tokens;
    }
    json_t *v = json_object_get(m, "prompt_tokens_cached");
    r->cached = json_is_integer(v) ? json_integer_value(v) : -1;
    pthread_mutex_unlock(&r->mu);
}
static void on_end(void *c, const char *reason, long long pt, long long ct)
{
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    r->prompt_tokens = pt;
    r->completion_tokens = ct;
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
static void on_error(void *c, const char *code, const char *msg)
{
    (void)msg;
    rec *r = c;
    pthread_mutex_lock(&r->mu);
    snprintf(r->code, sizeof r->code, "%s", code);
    r->n_terminal++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static rec *rec_new(void)
{
    rec *r = calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void rec_free(rec *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* Waits (bounded: 60 s) for the terminal event. */
static void rec_wait(rec *r)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&r->mu);
    while (r->n_terminal == 0)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
            break;
    pthread_mutex_unlock(&r->mu);
    assert_int_equal(r->n_terminal, 1);
}

/* Waits (bounded: 60 s) until the gated token callback holds the job. */
static void rec_wait_gated(rec *r)
{
    struct timespec dl;
    deadline_in(&dl, 60);
    pthread_mutex_lock(&r->mu);
    while (!r->gated)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
            break;
    bool gated = r->gated;
    pthread_mutex_unlock(&r->mu);
    assert_true(gated);
}

static void rec_open_gate(rec *r)
{
    pthread_mutex_lock(&r->mu);
    r->gate = false;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static agent_job_sink sink_for(rec *r)
{
    agent_job_sink s = {.ctx = r, .started = on_started, .token = on_token,
                        .metrics = on_metrics, .end = on_end, .error = on_error};
    return s;
}

/* The agent's default: prompt-prefix cache on. */
static agent_backend *make_pc(int slots, int ctx, bool prefix_cache)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)STORIES;
    o.slots = slots;
    o.threads = 2;
    o.ctx_size = ctx;
    o.prefix_cache = prefix_cache;
    char err[256];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fail_msg("create: %s", err);
    return b;
}

static agent_backend *make(int slots, int ctx)
{
    return make_pc(slots, ctx, true);
}

static int start(agent_backend *b, const char *json, rec *r)
{
    json_error_t je;
    json_t *job = json_loads(json, 0, &je);
    assert_non_null(job);
    agent_job_sink s = sink_for(r);
    char err[256];
    int rc = b->ops->job_start(b, job, &s, err, sizeof err);
    json_decref(job);
    return rc;
}

static void test_greedy_jobs_batched(void **state)
{
    (void)state;
    json_error_t je;
    json_t *ref = json_load_file(GP_TEST_DATA "/stories260K.greedy.json", 0, &je);
    assert_non_null(ref);
    json_t *cases = json_object_get(ref, "cases");
    agent_backend *b = make(2, 256);   /* 5 jobs, 2 slots: three wait */
    rec *r[5];
    for (int i = 0; i < 5; i++) {
        r[i] = rec_new();
        json_t *cs = json_array_get(cases, (size_t)i);
        json_t *job = json_pack("{s:s, s:s, s:s, s:{s:i, s:f, s:i}}", "job_id",
                                (char[]){ (char)('a' + i), 0 }, "kind", "completion", "prompt",
                                json_string_value(json_object_get(cs, "prompt")), "params",
                                "max_tokens", 64, "temperature", 0.0, "seed", 1);
        char *s = json_dumps(job, 0);
        assert_int_equal(start(b, s, r[i]), 0);
        free(s);
        json_decref(job);
    }
    for (int i = 0; i < 5; i++) {
        rec_wait(r[i]);
        json_t *cs = json_array_get(cases, (size_t)i);
        assert_string_equal(r[i]->reason, "length");
        assert_int_equal(r[i]->completion_tokens, 64);
        assert_int_equal(r[i]->prompt_tokens,
                         (long long)json_array_size(json_object_get(cs, "prompt_ids")));
        assert_string_equal(r[i]->text, json_string_value(json_object_get(cs, "generated_text")));
        assert_int_equal(r[i]->n_started, 1);
        /* The prompt's size before the first token (a reply the server ends
         * early still has it), then the job's metrics at its end. */
        assert_int_equal(r[i]->n_metrics, 2);
        assert_int_equal(r[i]->first_at_tokens, 0);
        assert_int_equal(r[i]->first_prompt, r[i]->prompt_tokens);
        rec_free(r[i]);
    }
    json_t *facts = json_object();
    b->ops->poll_facts(b, facts);
    assert_true(json_is_real(json_object_get(facts, "kv_cache_utilization")));
    json_decref(facts);
    b->ops->destroy(b);
    json_decref(ref);
}


/* Run one job (JSON text) to its end on b; the record is the caller's. */
static rec *run(agent_backend *b, const char *json)
{
    rec *r = rec_new();
    assert_int_equal(start(b, json, r), 0);
    rec_wait(r);
    assert_string_equal(r->code, "");
    return r;
}

#define PERSON_RF "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":" \
    "\"p\",\"schema\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"," \
    "\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}}," \
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}}}"

/* Issue 26, response_format: a constrained job writes the schema's JSON and
 * ends with stop when the value closes, while an unconstrained job in the
 * same batch streams exactly its reference; a text continuation is fed to
 * the constraint first; an unknown type fails the job at its start. */
static void test_response_format(void **state)
{
    (void)state;
    json_error_t je;
    json_t *ref = json_load_file(GP_TEST_DATA "/stories260K.greedy.json", 0, &je);
    assert_non_null(ref);
    json_t *cs = json_array_get(json_object_get(ref, "cases"), 0);
    agent_backend *b = make(2, 256);
    for (int seed = 1; seed <= 3; seed++) {
        rec *plain = rec_new(), *con = rec_new();
        json_t *job = json_pack("{s:s, s:s, s:s, s:{s:i, s:f, s:i}}", "job_id", "plain", "kind",
                                "completion", "prompt",
                                json_string_value(json_object_get(cs, "prompt")), "params",
                                "max_tokens", 64, "temperature", 0.0, "seed", 1);
        char *js = json_dumps(job, 0);
        char cj[2048];
        snprintf(cj, sizeof cj, "{\"job_id\":\"c\",\"kind\":\"completion\",\"prompt\":\"Once\","
                 "\"params\":{\"max_tokens\":100,\"temperature\":1.0,\"seed\":%d}," PERSON_RF
                 "}", seed);
        assert_int_equal(start(b, cj, con), 0);
        assert_int_equal(start(b, js, plain), 0);
        free(js);
        json_decref(job);
        rec_wait(con);
        rec_wait(plain);
        assert_string_equal(plain->text,
                            json_string_value(json_object_get(cs, "generated_text")));
        assert_string_equal(con->reason, "stop");
        json_t *v = json_loads(con->text, 0, &je);
        if (!v || !json_is_string(json_object_get(v, "name")) ||
            !json_is_integer(json_object_get(v, "age")) || json_object_size(v) != 2)
            fail_msg("not the schema's JSON: %s", con->text);
        json_decref(v);
        rec_free(plain);
        rec_free(con);
    }
    /* continuation: the text already sent is part of the value */
    rec *r = run(b, "{\"job_id\":\"k\",\"kind\":\"completion\",\"prompt\":\"Once\","
                    "\"continuation\":\"{\\\"name\\\":\\\"Bo\","
                    "\"params\":{\"max_tokens\":60,\"temperature\":1.0,\"seed\":5}," PERSON_RF "}");
    char full[8300];
    snprintf(full, sizeof full, "{\"name\":\"Bo%s", r->text);
    json_t *v = json_loads(full, 0, &je);
    if (!v || strncmp(json_string_value(json_object_get(v, "name")), "Bo", 2) != 0)
        fail_msg("continuation: %s", full);
    json_decref(v);
    rec_free(r);
    /* unknown type */
    r = rec_new();
    assert_true(start(b, "{\"job_id\":\"x\",\"kind\":\"completion\",\"prompt\":\"Once\","
                         "\"response_format\":{\"type\":\"yaml\"}}", r) != 0);
    rec_free(r);
    b->ops->destroy(b);
    json_decref(ref);
}

static long long fact(json_t *facts, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(facts, "prefix_cache"), key));
}

#define STORY_A "Once upon a time, there was a little girl named Lily. She loved to play " \
                "outside in the park with her big red ball and her friend Tom."
#define STORY_B "The sun was hot and the kids went to the beach. They built a castle of " \
                "sand and a dog came to look at it and barked at the waves."
#define JOB(id, prompt) "{\"job_id\":\"" id "\",\"kind\":\"completion\",\"prompt\":\"" prompt \
                        "\",\"params\":{\"max_tokens\":12,\"temperature\":0}}"

/* Issue 13, prompt-prefix cache: a job whose prompt extends an earlier
 * one's reuses the slot that holds it (prompt_tokens_cached > 0, facts
 * count it) and streams exactly what a backend without the cache streams;
 * with two slots holding different stories, each extension goes to the
 * slot of its own story, also when that slot is not the least recently
 * used; with the cache off nothing is reused. */
static void test_prefix_cache(void **state)
{
    (void)state;
    agent_backend *b = make(2, 256), *cold = make_pc(2, 256, false);
    rec *a = run(b, JOB("a", STORY_A));
    assert_int_equal(a->cached, 0);
    rec *bb = run(b, JOB("b", STORY_B));
    assert_true(bb->cached <= 1);   /* at most BOS: B took the other (empty) slot */
    /* Slot of A is the least recently used; B's extension must still go
     * to B's slot. */
    rec *c = run(b, JOB("c", STORY_B " Then the sea came up and took it away."));
    assert_true(c->cached >= bb->prompt_tokens - 1);
    assert_true(c->cached < c->prompt_tokens);
    rec *d = run(b, JOB("d", STORY_A " One day the ball rolled into the pond."));
    assert_true(d->cached >= a->prompt_tokens - 1);
    /* The same prompt again: everything but the last token comes from the
     * cache, and the output is the same. */
    rec *e = run(b, JOB("e", STORY_A " One day the ball rolled into the pond."));
    assert_int_equal(e->cached, d->prompt_tokens - 1);
    assert_string_equal(e->text, d->text);

    /* Identical output to cold runs. */
    const char *cold_jobs[] = {JOB("c", STORY_B " Then the sea came up and took it away."),
                               JOB("d", STORY_A " One day the ball rolled into the pond.")};
    rec *warm[] = {c, d};
    for (int i = 0; i < 2; i++) {
        rec *r = run(cold, cold_jobs[i]);
        assert_int_equal(r->cached, 0);
        assert_string_equal(r->text, warm[i]->text);
        assert_int_equal(r->completion_tokens, warm[i]->completion_tokens);
        rec_free(r);
    }

    json_t *facts = json_object();
    b->ops->poll_facts(b, facts);
    long long saved = a->cached + bb->cached + c->cached + d->cached + e->cached;
    long long total = a->prompt_tokens + bb->prompt_tokens + c->prompt_tokens +
                      d->prompt_tokens + e->prompt_tokens;
    assert_int_equal(fact(facts, "lookups"), 5);
    assert_true(fact(facts, "hits") >= 3);
    assert_int_equal(fact(facts, "tokens_saved"), saved);
    assert_int_equal(fact(facts, "tokens_computed"), total - saved);
    assert_true(json_is_true(json_object_get(json_object_get(facts, "prefix_cache"), "enabled")));
    /* Each slot holds its story and advertises it as one text unit...
     * (prompts under 1 KiB have no whole text block: no units) */
    json_t *slots = json_object_get(json_object_get(facts, "prefix_cache"), "slots");
    assert_int_equal(json_array_size(slots), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *sl = json_array_get(slots, i);
        assert_true(json_integer_value(json_object_get(sl, "tokens")) > 30);
        assert_false(json_is_true(json_object_get(sl, "busy")));
    }
    json_decref(facts);

    facts = json_object();
    cold->ops->poll_facts(cold, facts);
    assert_int_equal(fact(facts, "tokens_saved"), 0);
    assert_int_equal(fact(facts, "hits"), 0);
    assert_false(json_is_true(json_object_get(json_object_get(facts, "prefix_cache"), "enabled")));
    json_decref(facts);

    rec_free(a);
    rec_free(bb);
    rec_free(c);
    rec_free(d);
    rec_free(e);
    b->ops->destroy(b);
    cold->ops->destroy(cold);
}


#define JOB_T(id, tenant, prompt)                                                          \
    "{\"job_id\":\"" id "\",\"kind\":\"completion\",\"tenant\":\"" tenant           \
    "\",\"prompt\":\"" prompt "\",\"params\":{\"max_tokens\":12,\"temperature\":0}}"

/* Issue 25 finding 3: a slot's prompt is reused only by jobs of the tenant
 * that left it. Another tenant's identical prompt finds nothing cached (it
 * takes the least recently used slot cold, here the empty one), a job
 * without a tenant is a tenant of its own, and the owner still hits. */
static void test_prefix_cache_tenants(void **state)
{
    (void)state;
    agent_backend *b = make(2, 256);
    rec *a = run(b, JOB_T("a", "aaaa", STORY_A));
    assert_int_equal(a->cached, 0);
    rec *x = run(b, JOB_T("x", "bbbb", STORY_A));
    assert_int_equal(x->cached, 0);
    rec *a2 = run(b, JOB_T("a2", "aaaa", STORY_A " One day the ball rolled into the pond."));
    assert_true(a2->cached >= a->prompt_tokens - 1);
    rec *y = run(b, JOB_T("y", "", STORY_A " One day the ball rolled into the pond."));
    assert_int_equal(y->cached, 0);
    assert_string_equal(y->text, a2->text);  /* a cold slot, the same answer */
    /* y took the least recently used slot (x's); a's is still a's */
    rec *a3 = run(b, JOB_T("a3", "aaaa", STORY_A " One day the ball rolled into the pond."));
    assert_int_equal(a3->cached, a2->prompt_tokens - 1);
    rec_free(a);
    rec_free(x);
    rec_free(a2);
    rec_free(y);
    rec_free(a3);
    b->ops->destroy(b);
}


/* The slot's advertised prefix is the chain the server computes from the
 * same job (common/gp_prefix.h): after a 3-message chat job the slot says
 * kind "messages", 3 units, and the hash of unit 3 matches; a request that
 * adds a message matches those 3 units. */
static void test_prefix_descriptor(void **state)
{
    (void)state;
    agent_backend *b = make(1, 256);
    const char *js = "{\"job_id\":\"d1\",\"kind\":\"chat\",\"params\":{\"max_tokens\":4,"
                     "\"temperature\":0},\"messages\":[{\"role\":\"system\",\"content\":\"Be "
                     "kind.\"},{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                     "\"content\":\"Hello\"}]}";
    rec *r = run(b, js);
    json_t *facts = json_object();
    b->ops->poll_facts(b, facts);
    json_t *pfx = json_object_get(json_array_get(json_object_get(json_object_get(facts,
                                  "prefix_cache"), "slots"), 0), "prefix");
    gp_prefix_desc have;
    assert_int_equal(gp_prefix_desc_parse(pfx, &have), 0);
    assert_string_equal(have.kind, "messages");
    assert_int_equal(have.units, 3);
    json_error_t je;
    json_t *job = json_loads(js, 0, &je);
    json_array_append_new(json_object_get(job, "messages"),
                          json_pack("{s:s,s:s}", "role", "user", "content", "More"));
    gp_prefix_chain req;
    assert_int_equal(gp_prefix_chain_of_job(job, &req), 0);
    assert_int_equal(req.units, 4);
    assert_int_equal(gp_prefix_match(&req, &have), 3);
    gp_prefix_chain_free(&req);
    json_decref(job);
    json_decref(facts);
    rec_free(r);
    b->ops->destroy(b);
}

/* Start job (a JSON object, borrowed) with the token_ids sink. */
static void start_ids(agent_backend *b, json_t *job, rec *r)
{
    agent_job_sink s = sink_for(r);
    s.token_ids = on_token_ids;
    char err[256];
    if (b->ops->job_start(b, job, &s, err, sizeof err) != 0)
        fail_msg("job_start: %s", err);
}

/* Token-exact continuation: a job continued from the ids of the first k
 * token events of a reference run (its text as continuation, its sampler
 * state) produces exactly the rest of the reference text, while another
 * job shares the batch; a continuation for another file's digest falls
 * back to text. */
static void test_token_continuation_exact(void **state)
{
    (void)state;
    agent_backend *b = make(2, 256);
    json_t *models = b->ops->models(b);
    const char *dg = json_string_value(json_object_get(json_array_get(models, 0), "digest"));
    assert_non_null(dg);
    assert_int_equal(strlen(dg), 64);
    char digest[65];
    snprintf(digest, sizeof digest, "%s", dg);
    json_decref(models);
    static const double temps[] = {0.0, 0.9};
    for (size_t t = 0; t < 2; t++) {
        json_t *params = json_pack("{s:i, s:f, s:f, s:i, s:i}", "max_tokens", 60, "temperature",
                                   temps[t], "top_p", 0.9, "top_k", 40, "seed", 4242);
        json_t *job = json_pack("{s:s, s:s, s:s, s:O}", "job_id", "ref", "kind", "completion",
                                "prompt", "Once upon a time", "params", params);
        rec *ref = rec_new();
        start_ids(b, job, ref);
        rec_wait(ref);
        json_decref(job);
        assert_string_equal(ref->reason, "length");
        assert_int_equal(ref->n_ids, 60);
        static const int cuts[] = {1, 5, 20};
        for (size_t c = 0; c < 3; c++) {
            int e = cuts[c] - 1;   /* after token event e */
            int k = ref->ev_ids[e];
            /* another job decodes in the other slot meanwhile */
            rec *other = rec_new();
            assert_int_equal(start(b, "{\"job_id\":\"o\",\"kind\":\"completion\",\"prompt\":"
                                      "\"Lily liked\",\"params\":{\"max_tokens\":40}}", other), 0);
            json_t *ids = json_array();
            for (int i = 0; i < k; i++)
                json_array_append_new(ids, json_integer(ref->ids[i]));
            json_t *p2 = json_deep_copy(params);
            json_object_set_new(p2, "max_tokens", json_integer(60 - k));
            json_t *cj = json_pack("{s:s, s:s, s:s, s:o, s:s%, s:o, s:s, s:{s:i, s:i}}", "job_id",
                                   "cont", "kind", "completion", "prompt", "Once upon a time",
                                   "params", p2, "continuation", ref->text, ref->ev_len[e],
                                   "continuation_ids", ids, "continuation_digest", digest,
                                   "sampler", "seed", 4242, "n_sampled", k);
            assert_non_null(cj);
            rec *r = rec_new();
            start_ids(b, cj, r);
            rec_wait(r);
            rec_wait(other);
            json_decref(cj);
            /* the continuation was ref->text up to ev_len[e]: the rest follows */
            assert_string_equal(r->text, ref->text + ref->ev_len[e]);
            assert_string_equal(r->reason, "length");
            assert_int_equal(r->prompt_tokens, ref->prompt_tokens);   /* the prompt's own */
            assert_int_equal(r->completion_tokens, 60 - k);
            assert_memory_equal(r->ids, ref->ids + k, (size_t)(60 - k) * sizeof(int32_t));
            rec_free(r);
            rec_free(other);
        }
        /* ids for another file: continues from the text (and still ends) */
        json_t *cj = json_pack("{s:s, s:s, s:s, s:O, s:s%, s:[i], s:s, s:{s:i, s:i}}", "job_id",
                               "x", "kind", "completion", "prompt", "Once upon a time", "params",
                               params, "continuation", ref->text, ref->ev_len[0],
                               "continuation_ids", ref->ids[0], "continuation_digest",
                               "0000000000000000000000000000000000000000000000000000000000000000",
                               "sampler", "seed", 4242, "n_sampled", 1);
        rec *r = rec_new();
        start_ids(b, cj, r);
        rec_wait(r);
        json_decref(cj);
        assert_string_equal(r->reason, "length");
        assert_true(r->prompt_tokens > ref->prompt_tokens);   /* the text went into the prompt */
        rec_free(r);
        rec_free(ref);
        json_decref(params);
    }
    /* malformed ids for our own file: the job is refused */
    rec *r = rec_new();
    char bad[512];
    snprintf(bad, sizeof bad,
             "{\"job_id\":\"bad\",\"kind\":\"completion\",\"prompt\":\"x\","
             "\"continuation\":\"y\",\"continuation_ids\":[1,-5],\"continuation_digest\":\"%s\","
             "\"sampler\":{\"n_sampled\":2}}",
             digest);
    assert_int_equal(start(b, bad, r), -1);
    rec_free(r);
    /* n_sampled beyond the ids (a fast-forward the server cannot mean) */
    r = rec_new();
    snprintf(bad, sizeof bad,
             "{\"job_id\":\"bad2\",\"kind\":\"completion\",\"prompt\":\"x\","
             "\"continuation\":\"y\",\"continuation_ids\":[1,2],\"continuation_digest\":\"%s\","
             "\"sampler\":{\"n_sampled\":1000000000000}}",
             digest);
    assert_int_equal(start(b, bad, r), -1);
    rec_free(r);
    b->ops->destroy(b);
}

static void test_stop_count_chat_errors(void **state)
{
    (void)state;
    agent_backend *b = make(2, 64);

    json_t *models = b->ops->models(b);
    json_t *m0 = json_array_get(models, 0);
    assert_string_equal(json_string_value(json_object_get(m0, "id")), "stories260K");
    assert_string_equal(json_string_value(json_object_get(m0, "quantization")), "F32");
    assert_string_equal(json_string_value(json_object_get(m0, "architecture")), "llama");
    assert_int_equal(json_integer_value(json_object_get(m0, "context_length")), 64);
    json_decref(models);

    /* stop string: the greedy text is ", there was a little girl named Lily." */
    rec *r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"s\",\"kind\":\"completion\",\"prompt\":\"Once upon a "
                              "time\",\"params\":{\"max_tokens\":50,\"temperature\":0,"
                              "\"stop\":[\" girl\"]}}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "stop");
    assert_string_equal(r->text, ", there was a little");
    rec_free(r);

    /* count_tokens */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"c\",\"kind\":\"count_tokens\",\"prompt\":\"Once upon a "
                              "time\"}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "stop");
    assert_int_equal(r->prompt_tokens, 5);
    assert_int_equal(r->n_tokens, 0);
    rec_free(r);

    /* chat with the fallback template: some text, then length */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"h\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
                              "\"content\":\"Tell a story\"}],\"params\":{\"max_tokens\":8,"
                              "\"temperature\":0}}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "length");
    assert_int_equal(r->completion_tokens, 8);
    rec_free(r);

    /* context overflow: a prompt longer than 64 tokens */
    char big[2048] = "{\"job_id\":\"o\",\"kind\":\"completion\",\"prompt\":\"";
    for (int i = 0; i < 80; i++)
        strcat(big, "cat ");
    strcat(big, "\"}");
    r = rec_new();
    assert_int_equal(start(b, big, r), 0);
    rec_wait(r);
    assert_string_equal(r->code, "CONTEXT_OVERFLOW");
    rec_free(r);

    /* a job that runs to the context end stops with "length" */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"L\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":1000,\"temperature\":0}}", r), 0);
    rec_wait(r);
    assert_string_equal(r->reason, "length");
    assert_string_equal(r->code, "");
    /* the last sampled token needs no cache position: n_ctx + 1 exactly
     * ("Once" is BOS + 1 token; greedy stories260K says no EOS before) */
    assert_int_equal(r->prompt_tokens, 2);
    assert_int_equal(r->completion_tokens, 63);
    rec_free(r);

    /* bad jobs are refused at start, no callback */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"x\",\"kind\":\"dance\"}", r), -1);
    assert_int_equal(start(b, "{\"kind\":\"completion\",\"prompt\":\"x\"}", r), -1);
    assert_int_equal(start(b, "{\"job_id\":\"y\",\"kind\":\"chat\",\"messages\":[]}", r), -1);
    assert_int_equal(r->n_terminal, 0);
    rec_free(r);

    /* cancel a long job: exactly one terminal event, CANCELLED. The job's
     * first token callback holds the decode thread until the cancel is in,
     * so the job cannot finish first: a cancel that is ignored ends it with
     * "length" after 60 tokens instead. */
    r = rec_new();
    r->gate = true;
    assert_int_equal(start(b, "{\"job_id\":\"k\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":60,\"temperature\":1}}", r), 0);
    rec_wait_gated(r);
    b->ops->job_cancel(b, "k");
    b->ops->job_cancel(b, "unknown");
    rec_open_gate(r);
    rec_wait(r);
    assert_string_equal(r->code, "CANCELLED");
    assert_string_equal(r->reason, "");
    assert_int_equal(r->n_tokens, 1);
    rec_free(r);

    /* destroy with a job still queued: it gets its terminal event */
    r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"d\",\"kind\":\"completion\",\"prompt\":\"Once\","
                              "\"params\":{\"max_tokens\":60}}", r), 0);
    b->ops->destroy(b);
    assert_int_equal(r->n_terminal, 1);
    rec_free(r);
}

static void test_bad_model(void **state)
{
    (void)state;
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)"/nonexistent/model.gguf";
    o.slots = 1;
    char err[256];
    assert_null(agent_backend_gguf_create(&o, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
}


/* Tools on a model whose template has no tools format (stories260K: the
 * fallback): supports_tools false, tools ignored, tool calls and results
 * rendered as plain text lines. The prompt the backend renders is checked
 * through the model: a chat job and a completion job with the expected
 * text give the same token count and the same greedy text. */
#define TOOL_MSGS                                                                                \
    "\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},"                     \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"     \
    "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"        \
    "\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}]"
#define TOOL_DEFS                                                                                \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"  \
    "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"        \
    "\"string\"}}}}}],\"tool_choice\":\"auto\""
#define TOOL_TEXT                                                                                \
    "Once upon a time\\nTool call: get_weather({\\\"city\\\":\\\"Paris\\\"})\\nTool result: sunny"

static void test_tools_fallback(void **state)
{
    (void)state;
    agent_backend *b = make(1, 256);
    json_t *models = b->ops->models(b);
    json_t *st = json_object_get(json_array_get(models, 0), "supports_tools");
    assert_true(json_is_boolean(st));
    assert_false(json_is_true(st));
    json_decref(models);

    rec *chat = rec_new(), *plain = rec_new(), *other = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"t1\",\"kind\":\"count_tokens\"," TOOL_MSGS ","
                              TOOL_DEFS "}", chat), 0);
    assert_int_equal(start(b, "{\"job_id\":\"t2\",\"kind\":\"count_tokens\",\"prompt\":\""
                              TOOL_TEXT "\"}", plain), 0);
    assert_int_equal(start(b, "{\"job_id\":\"t3\",\"kind\":\"count_tokens\",\"prompt\":"
                              "\"Once upon a time\\nsunny\"}", other), 0);
    rec_wait(chat);
    rec_wait(plain);
    rec_wait(other);
    assert_true(plain->prompt_tokens > other->prompt_tokens);
    assert_int_equal(chat->prompt_tokens, plain->prompt_tokens);
    rec_free(chat);
    rec_free(plain);
    rec_free(other);

    chat = rec_new();
    plain = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"g1\",\"kind\":\"chat\"," TOOL_MSGS "," TOOL_DEFS
                              ",\"params\":{\"max_tokens\":12,\"temperature\":0}}", chat), 0);
    assert_int_equal(start(b, "{\"job_id\":\"g2\",\"kind\":\"completion\",\"prompt\":\"" TOOL_TEXT
                              "\",\"params\":{\"max_tokens\":12,\"temperature\":0}}", plain), 0);
    rec_wait(chat);
    rec_wait(plain);
    assert_true(chat->len > 0);
    assert_string_equal(chat->text, plain->text);
    assert_int_equal(chat->prompt_tokens, plain->prompt_tokens);
    rec_free(chat);
    rec_free(plain);

    /* bad tool jobs are refused at start */
    rec *r = rec_new();
    assert_int_equal(start(b, "{\"job_id\":\"b1\",\"kind\":\"chat\",\"messages\":[{\"role\":"
                              "\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                              "\"function\":{\"description\":\"no name\"}}]}", r), -1);
    assert_int_equal(start(b, "{\"job_id\":\"b2\",\"kind\":\"chat\",\"messages\":[{\"role\":"
                              "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
                              "\"function\":{\"arguments\":\"{}\"}}]}]}", r), -1);
    assert_int_equal(start(b, "{\"job_id\":\"b3\",\"kind\":\"chat\",\"messages\":[{\"role\":"
                              "\"assistant\",\"content\":null}]}", r), -1);
    assert_int_equal(r->n_terminal, 0);
    rec_free(r);
    b->ops->destroy(b);
}

/* The engine entry points on the model itself. */
static void test_tools_engine_on_model(void **state)
{
    (void)state;
    gpe_model_params mp = gpe_model_default_params();
    gpe_model *m = NULL;
    char err[256];
    assert_int_equal(gpe_model_load(STORIES, &mp, &m, err, sizeof err), GPE_OK);
    assert_false(gpe_chat_supports_tools(m));
    assert_false(gpe_chat_supports_tools(NULL));
    const gpe_chat_tool tools[] = {{"f", "d", "{}"}};
    const gpe_chat_tool_call call[] = {{"c1", "f", "{\"a\": 1}"}};
    const gpe_chat_msg msgs[] = {{"user", "Hi"}, {"assistant", NULL}, {"tool", "ok"}};
    const gpe_chat_msg_tools x[] = {{NULL, 0, NULL}, {call, 1, NULL}, {NULL, 0, "c1"}};
    char *p = gpe_chat_apply_tools(m, tools, 1, msgs, x, 3, true, err, sizeof err);
    assert_non_null(p);
    assert_string_equal(p, "Hi\nTool call: f({\"a\": 1})\nTool result: ok");
    free(p);
    /* no tool parts at all: the same as gpe_chat_apply */
    p = gpe_chat_apply_tools(m, NULL, 0, msgs, NULL, 1, true, err, sizeof err);
    char *q = gpe_chat_apply(m, msgs, 1, true, err, sizeof err);
    assert_non_null(p);
    assert_non_null(q);
    assert_string_equal(p, q);
    free(p);
    free(q);
    assert_null(gpe_chat_apply_tools(NULL, NULL, 0, msgs, NULL, 1, true, err, sizeof err));
    gpe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_jobs_batched),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_prefix_cache_tenants),
        cmocka_unit_test(test_prefix_descriptor),
        cmocka_unit_test(test_stop_count_chat_errors),
        cmocka_unit_test(test_token_continuation_exact),
        cmocka_unit_test(test_bad_model),
        cmocka_unit_test(test_tools_fallback),
        cmocka_unit_test(test_tools_engine_on_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

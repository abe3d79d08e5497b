/*
 * The agent's JSON texts when memory runs out, where jansson 2.14's own
 * json_dumps could leave an object's key out and succeed, and its
 * json_loadb drop a byte of a long string and succeed:
 *   - the gguf backend's tool_choice (src/agent/gguf_tools.c): the schema a
 *     forced call is held to and the grammar compiled from it are the
 *     unhurt run's, or the answer is out of memory (GGUF_TOOLS_NOMEM, the
 *     job start's AGENT_JOB_START_NOMEM); never a weaker schema (any object
 *     for a tool's parameters, a union without a tool, only the name held),
 *     never the client's refusal;
 *   - the gguf backend's chat prompt (src/agent/backend_gguf_job.c): the
 *     JSON of a tool call's arguments rendered into it whole, or the job is
 *     AGENT_JOB_START_NOMEM (seen through a count_tokens job's count);
 *   - the model digest cache (src/agent/agent_facts.c): after a run the
 *     file is as it was or as the unhurt run wrote it, never with an entry
 *     damaged or lost;
 *   - the refusal the agent prints when the server refuses its credential
 *     (src/agent/main.c): the server's code and message, or "out of
 *     memory", never a message with a byte missing.
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: the agent's, the engine's and (through gp_json's counting
 * allocator) jansson's malloc, calloc, realloc and strdup (ld --wrap:
 * part-agent-json-oom.cmake, tests/unit/server/fixture_oom.h arm_beneath).
 * main.c is included for its statics, its main renamed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#define main gpupool_agent_main
#include "agent/main.c"
#undef main

#include "agent/agent_facts.h"
#include "agent/gguf_tools.h"
#include "common/gp_util.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

/* ------------------------------------------------------------ tool_choice */

/* Tools with long keys in their parameters (where jansson's dump grows its
 * buffer), one whose parameters the grammar cannot enforce (multipleOf: any
 * object, the tool not being strict). */
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather_for_city\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"city_name_in_english\":{\"type\":\"string\"},"
    "\"day_offset_from_today\":{\"type\":\"integer\"}},"
    "\"required\":[\"city_name_in_english\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"list_files_in_directory\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"directory_path_to_list\":{\"type\":\"string\"},"
    "\"include_hidden_files_too\":{\"type\":\"boolean\"}},"
    "\"required\":[\"directory_path_to_list\",\"include_hidden_files_too\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"count_in_threes\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":3}}}}}]";

/* gguf_tools_call_schema(family, tools, only) for N = 1, 2, ...: the
 * unhurt schema, or NULL saying out of memory. */
static int schema_sweep(const char *family, json_t *tools, const char *only)
{
    char err[256];
    bool oom = true;
    json_t *ref = gguf_tools_call_schema(family, tools, only, &oom, err, sizeof err);
    assert_non_null(ref);
    assert_false(oom);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        arm_beneath(n);
        json_t *got = gguf_tools_call_schema(family, tools, only, &oom, err, sizeof err);
        bool hit = disarm();
        if (got ? oom || !json_equal(got, ref)
                : !oom || !hit || strcmp(err, "out of memory") != 0) {
            print_message("%s, %s: allocation %zu failed: %s (%s)\n", family,
                          only ? only : "any tool", n, got ? "another schema" : "no schema", err);
            if (got)
                print_diff("schema", got, ref);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("%s, %s: %zu runs, %d broke the rule\n", family, only ? only : "any tool", n,
                  bad);
    json_decref(ref);
    return bad;
}

static void test_call_schema_sweep(void **state)
{
    (void)state;
    json_t *tools = J(TOOLS);
    char err[256];
    bool oom;
    /* the references: a union of the three, each tool's own parameters
     * where the grammar takes them */
    json_t *u = gguf_tools_call_schema("chatml", tools, NULL, &oom, err, sizeof err);
    assert_int_equal(json_array_size(json_object_get(u, "anyOf")), 3);
    json_decref(u);
    int bad = schema_sweep("chatml", tools, NULL) +
              schema_sweep("chatml", tools, "get_weather_for_city") +
              schema_sweep("chatml", tools, "count_in_threes") +
              schema_sweep("mistral", tools, NULL) +
              schema_sweep("llama-3", tools, "list_files_in_directory");
    json_decref(tools);
    assert_int_equal(bad, 0);
}

/* What gguf_tools_init set up, and whether its grammar (the forced call's,
 * else the lazy call's) takes a text whole. */
typedef struct tools_setup {
    bool tp, gram, call_gram, lazy;
    const char *prefix;
    int takes; /* -1: no grammar; 0: refused; 1: taken, not done; 2: taken and done */
} tools_setup;

static tools_setup setup_of(gguf_tools *t, const char *probe)
{
    tools_setup s = {.tp = t->tp != NULL, .gram = t->gram != NULL,
                     .call_gram = t->call_gram != NULL, .lazy = t->lazy, .prefix = t->prefix,
                     .takes = -1};
    gpe_grammar *g = t->gram ? t->gram : t->call_gram;
    if (g)
        s.takes = gpe_grammar_accept_text(g, probe, strlen(probe)) != GPE_OK ? 0
                  : gpe_grammar_done(g)                                     ? 2
                                                                            : 1;
    return s;
}

static bool same_setup(const tools_setup *a, const tools_setup *b)
{
    return a->tp == b->tp && a->gram == b->gram && a->call_gram == b->call_gram &&
           a->lazy == b->lazy && a->prefix == b->prefix && a->takes == b->takes;
}

/* gguf_tools_init on job for N = 1, 2, ..., its grammar fed probe: set up
 * as the unhurt run (its grammar taking probe as that one does), or
 * GGUF_TOOLS_NOMEM. */
static int init_sweep(const gpe_grammar_vocab *gv, const char *what, json_t *job,
                      const char *probe, int want_takes)
{
    gguf_tools t;
    char err[256];
    assert_int_equal(gguf_tools_init(&t, "chatml", true, gv, job, false, err, sizeof err), 0);
    tools_setup ref = setup_of(&t, probe);
    gguf_tools_free(&t);
    assert_int_equal(ref.takes, want_takes); /* the probe tells grammars apart */
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        arm_beneath(n);
        int rc = gguf_tools_init(&t, "chatml", true, gv, job, false, err, sizeof err);
        bool hit = disarm();
        if (rc == 0) {
            tools_setup got = setup_of(&t, probe);
            gguf_tools_free(&t);
            if (!same_setup(&got, &ref)) {
                print_message("%s: allocation %zu failed: set up otherwise (grammar %d, want "
                              "%d)\n", what, n, got.takes, ref.takes);
                bad++;
            }
        } else if (rc != GGUF_TOOLS_NOMEM || !hit || strcmp(err, "out of memory") != 0) {
            print_message("%s: allocation %zu %s: rc %d (want GGUF_TOOLS_NOMEM), \"%s\"\n", what,
                          n, hit ? "failed" : "did not fail", rc, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", what, n, bad);
    return bad;
}

static json_t *tools_job(const char *choice_text)
{
    json_t *job = J("{\"job_id\":\"t\",\"kind\":\"chat\"}");
    assert_int_equal(json_object_set_new(job, "tools", J(TOOLS)), 0);
    json_error_t e;
    json_t *choice = json_loads(choice_text, JSON_DECODE_ANY, &e);
    assert_non_null(choice);
    assert_int_equal(json_object_set_new(job, "tool_choice", choice), 0);
    return job;
}

/* The forced call's grammar over stories260K's vocabulary (the chatml
 * format forced, whatever the model's own template): a call the tools'
 * parameters allow, one they do not (a required argument missing). */
static void test_tools_init_sweep(void **state)
{
    (void)state;
    gpe_model_params mp = gpe_model_default_params();
    mp.vocab_only = true;
    gpe_model *m = NULL;
    gpe_grammar_vocab *gv = NULL;
    char err[256];
    assert_int_equal(gpe_model_load(STORIES, &mp, &m, err, sizeof err), GPE_OK);
    assert_int_equal(gpe_grammar_vocab_init(m, &gv), GPE_OK);
    static const char GOOD[] = "{\"name\":\"get_weather_for_city\",\"arguments\":{"
                               "\"city_name_in_english\":\"Paris\",\"day_offset_from_today\":1}}";
    static const char NO_CITY[] = "{\"name\":\"get_weather_for_city\",\"arguments\":{"
                                  "\"day_offset_from_today\":1}}";
    static const char NO_HIDDEN[] = "{\"name\":\"list_files_in_directory\",\"arguments\":{"
                                    "\"directory_path_to_list\":\"/tmp\"}}";
    json_t *required = tools_job("\"required\"");
    json_t *named = tools_job("{\"type\":\"function\",\"function\":{\"name\":"
                              "\"get_weather_for_city\"}}");
    int bad = init_sweep(gv, "required, a good call", required, GOOD, 2) +
              init_sweep(gv, "required, a call without a required argument", required,
                         NO_HIDDEN, 0) +
              init_sweep(gv, "named, a good call", named, GOOD, 2) +
              init_sweep(gv, "named, a call without a required argument", named, NO_CITY, 0);
    json_decref(required);
    json_decref(named);
    gpe_grammar_vocab_free(gv);
    gpe_model_free(m);
    assert_int_equal(bad, 0);
}

/* -------------------------------------------- the gguf backend's chat prompt */

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_terminal;
    long long prompt_tokens;
    char code[64];
} rec;

static void on_started(void *c) { (void)c; }
static void on_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)c, (void)t, (void)n, (void)id;
}
static void on_metrics(void *c, json_t *m) { (void)c, (void)m; }
static void terminal(rec *r, long long pt, const char *code)
{
    pthread_mutex_lock(&r->mu);
    r->n_terminal++;
    r->prompt_tokens = pt;
    snprintf(r->code, sizeof r->code, "%s", code ? code : "");
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
static void on_end(void *c, const char *fr, long long pt, long long ct)
{
    (void)fr, (void)ct;
    terminal(c, pt, NULL);
}
static void on_error(void *c, const char *code, const char *msg)
{
    (void)msg;
    terminal(c, -1, code);
}

/* job_start on job, the n-th allocation failing (0: none): its rc, whether
 * the failure was reached, and (a started job, once it ended) its count or
 * error code. */
static int count_start(agent_backend *b, json_t *job, size_t n, bool *hit, long long *pt,
                       char *code, char *err, size_t errlen)
{
    rec r = {.n_terminal = 0};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    agent_job_sink s = {.ctx = &r, .started = on_started, .token = on_token,
                        .metrics = on_metrics, .end = on_end, .error = on_error};
    err[0] = '\0';
    if (n)
        arm_beneath(n);
    int rc = b->ops->job_start(b, job, &s, err, errlen);
    *hit = disarm();
    if (rc == 0) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 60;
        pthread_mutex_lock(&r.mu);
        while (r.n_terminal == 0 && pthread_cond_timedwait(&r.cv, &r.mu, &dl) == 0)
            ;
        pthread_mutex_unlock(&r.mu);
        assert_int_equal(r.n_terminal, 1);
    }
    *pt = r.prompt_tokens;
    snprintf(code, 64, "%s", r.code);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    return rc;
}

/* A count_tokens chat job whose assistant called a tool with arguments as
 * a JSON object (long keys), rendered into the prompt: counted as the
 * unhurt run counts it, or AGENT_JOB_START_NOMEM. Not judged here, only
 * counted: the engine's own rendering, which says out of memory only in
 * its message ("chat: out of memory rendering the prompt", with -1), and a
 * started job's preparation (its tokens, an error event). */
static void test_chat_prompt_sweep(void **state)
{
    (void)state;
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)STORIES;
    o.slots = 1;
    o.threads = 1;
    o.ctx_size = 256;
    char err[256], code[64];
    agent_backend *b = agent_backend_gguf_create(&o, err, sizeof err);
    if (!b)
        fail_msg("create: %s", err);
    json_t *job = J("{\"job_id\":\"c\",\"kind\":\"count_tokens\",\"messages\":["
                    "{\"role\":\"user\",\"content\":\"Weather?\"},"
                    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
                    "{\"city_name_in_english\":\"Paris\",\"day_offset_from_today\":1,"
                    "\"unit_of_temperature_wanted\":\"celsius\"}}}]},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"Rain.\"}]}");
    bool hit;
    long long ref, pt;
    assert_int_equal(count_start(b, job, 0, &hit, &ref, code, err, sizeof err), 0);
    assert_true(ref > 20);
    int bad = 0, engine = 0, later = 0;
    size_t n;
    for (n = 1;; n++) {
        int rc = count_start(b, job, n, &hit, &pt, code, err, sizeof err);
        if (rc == 0 && code[0]) {
            later++; /* the job's preparation (tokens) failed: not this test's */
        } else if (rc == 0 && pt != ref) {
            print_message("allocation %zu failed: counted %lld, want %lld\n", n, pt, ref);
            bad++;
        } else if (rc == -1 && hit && strstr(err, "chat: out of memory")) {
            engine++;
        } else if (rc != 0 && (!hit || rc != AGENT_JOB_START_NOMEM)) {
            print_message("allocation %zu %s: rc %d (want AGENT_JOB_START_NOMEM), \"%s\"\n", n,
                          hit ? "failed" : "did not fail", rc, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("chat prompt: %zu runs, %d broke the rule (%d the engine's rendering, %d "
                  "ended with an error once started)\n", n, bad, engine, later);
    json_decref(job);
    b->ops->destroy(b);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------------- the digest cache */

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *slurp(const char *path)
{
    size_t len;
    char *t = gp_read_file(path, &len, 1u << 20);
    assert_non_null(t);
    return t;
}

/* A cache of other models' digests, under paths longer than jansson's
 * first token buffer. */
static const char CACHE[] =
    "{\"entries\":[{\"path\":\"/srv/models/llama-3-8b-instruct.Q4_K_M.gguf\",\"size\":4920739232,"
    "\"mtime_ns\":1700000000000000000,\"sha256\":"
    "\"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\"},"
    "{\"path\":\"/srv/models/mistral-7b-instruct-v0.3.Q5_K_M.gguf\",\"size\":5136170144,"
    "\"mtime_ns\":1700000000000000001,\"sha256\":"
    "\"88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589\"}]}";
#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

/* agent_model_digest (remember: agent_model_digest_remember) of a file
 * not in CACHE, for N = 1, 2, ...: the digest or an error; the cache file
 * after it as it was, or as the unhurt run wrote it. */
static int digest_sweep(const char *dir, bool remember)
{
    char model[300], state[300], cache[350];
    snprintf(model, sizeof model, "%s/a-model-file-with-a-long-name.gguf", dir);
    snprintf(state, sizeof state, "%s/state", dir);
    snprintf(cache, sizeof cache, "%s/model-digests.json", state);
    put(model, "abc");
    char d[65], err[256];
    bool cached;
    put(cache, CACHE);
    if (remember)
        agent_model_digest_remember(model, state, SHA_ABC);
    else
        assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    char *ref = slurp(cache);
    assert_non_null(strstr(ref, "mistral-7b")); /* the others kept: no tautology */
    assert_non_null(strstr(ref, "a-model-file"));
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        put(cache, CACHE);
        int rc = 0;
        d[0] = '\0';
        arm_beneath(n);
        if (remember)
            agent_model_digest_remember(model, state, SHA_ABC);
        else
            rc = agent_model_digest(model, state, d, &cached, err, sizeof err);
        bool hit = disarm();
        char *got = slurp(cache);
        if ((strcmp(got, CACHE) != 0 && strcmp(got, ref) != 0) ||
            (rc == 0 && !remember && strcmp(d, SHA_ABC) != 0)) {
            print_message("%s: allocation %zu failed: rc %d, %s, the cache: %.400s\n",
                          remember ? "remember" : "digest", n, rc, d, got);
            bad++;
        }
        free(got);
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", remember ? "remember" : "digest", n, bad);
    free(ref);
    unlink(cache);
    rmdir(state);
    unlink(model);
    return bad;
}

static void test_digest_cache_sweep(void **state)
{
    (void)state;
    char dir[] = "/tmp/gp-digest-oom-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char st[300];
    snprintf(st, sizeof st, "%s/state", dir);
    assert_int_equal(mkdir(st, 0700), 0);
    int bad = digest_sweep(dir, false);
    assert_int_equal(mkdir(st, 0700), 0);
    bad += digest_sweep(dir, true);
    rmdir(dir);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------- main.c: a refused credential */

/* The refusal printed for a 401 whose message is longer than jansson's
 * first token buffer, for N = 1, 2, ...: the server's code and message, or
 * the reply unread for want of memory. */
static void test_refusal_sweep(void **state)
{
    (void)state;
    check_body b;
    b.len = (size_t)snprintf(b.data, sizeof b.data, "%s",
                             "{\"error\":{\"code\":\"AGENT_KEY_REVOKED\",\"message\":\"this "
                             "agent's key was revoked by an operator on the server\"}}");
    char ref[1024], got[1024];
    refusal_message(&b, 401, true, true, ref, sizeof ref);
    assert_non_null(strstr(ref, "AGENT_KEY_REVOKED: this agent's key was revoked by an "
                                "operator on the server"));
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        arm_beneath(n);
        refusal_message(&b, 401, true, true, got, sizeof got);
        bool hit = disarm();
        if (strcmp(got, ref) != 0 && !(hit && strstr(got, "the agent is out of memory"))) {
            print_message("allocation %zu failed: %s\n", n, got);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("refusal: %zu runs, %d broke the rule\n", n, bad);
    assert_int_equal(bad, 0);
}

int main(void)
{
    /* jansson's allocator: gp_json's counting one, before any JSON is
     * made (arm_beneath fails libc's allocations beneath it) */
    gp_json_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_schema_sweep),
        cmocka_unit_test(test_tools_init_sweep),
        cmocka_unit_test(test_chat_prompt_sweep),
        cmocka_unit_test(test_digest_cache_sweep),
        cmocka_unit_test(test_refusal_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

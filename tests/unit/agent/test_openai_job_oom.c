/* The openai backend (src/agent/backend_openai.c) when memory runs out:
 *   - oai_job_start either starts the job exactly as it starts with memory
 *     to spare (its request body, its stop strings, its X-Pool-Options
 *     line: session, priority, tenant; the bodies of the count methods) or
 *     returns AGENT_JOB_START_NOMEM (the agent's own failure: the job fails
 *     over); never -1 (the client's INVALID_REQUEST), never a job run
 *     without what it asked for, never a count method skipped;
 *   - a count_tokens job whose method answered counts with that answer (or
 *     goes on to the template's /tokenize step) as with memory to spare, or
 *     ends AGENT_OUT_OF_MEMORY; never the next method or the estimate for
 *     a reply it had no memory to read (openai_count.c's builders and
 *     readers, swept alone too: a body or NULL saying out of memory);
 *   - a reply held to a response_format ends as it ends with memory to
 *     spare, or with AGENT_OUT_OF_MEMORY when the check could not be made
 *     (openai_stream.c maps the verdict); never UPSTREAM_INVALID_OUTPUT for a reply that was
 *     fine;
 *   - the embeddings probe's body is whole or not made (never one without
 *     a key, whose 4xx would say "no embeddings").
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: the agent's malloc, calloc, realloc and strdup, jansson's
 * among them through gp_json's counting allocator (arm_beneath: ld --wrap,
 * part-openai-schema.cmake, through tests/unit/server/fixture_oom.h), so
 * that the checked loads and dumps see the failures as real ones. The
 * backend file is included for its statics, as test_agent_openai_stream.c
 * does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/backend_openai.c"
#include "common/gp_json.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

/* The terminal event a job's sink got. */
typedef struct rec {
    int nend, nerror, nmetrics;
    long long pt;
    char code[64];
    char msg[600];
    char finish[32];
} rec;

static void r_started(void *c) { (void)c; }
static void r_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)c, (void)t, (void)n, (void)id;
}
static void r_metrics(void *c, json_t *m)
{
    (void)m;
    ((rec *)c)->nmetrics++;
}
static void r_end(void *c, const char *fr, long long pt, long long ct)
{
    rec *r = c;
    (void)ct;
    r->nend++;
    r->pt = pt;
    snprintf(r->finish, sizeof r->finish, "%s", fr);
}
static void r_error(void *c, const char *code, const char *msg)
{
    rec *r = c;
    r->nerror++;
    snprintf(r->code, sizeof r->code, "%s", code);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

static agent_job_sink sink_of(rec *r)
{
    memset(r, 0, sizeof *r);
    return (agent_job_sink){.ctx = r, .started = r_started, .token = r_token,
                            .metrics = r_metrics, .end = r_end, .error = r_error};
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
}

/* A backend enough for oai_job_start: its inbox, lock and wake event. */
typedef struct bench {
    agent_options o;
    oai_backend b;
    struct event_base *evb;
} bench;

static void bench_init(bench *t)
{
    memset(t, 0, sizeof *t);
    t->o.upstream_model = "upm";
    t->b.o = &t->o;
    pthread_mutex_init(&t->b.mu, NULL);
    t->b.inbox_tail = &t->b.inbox;
    t->evb = event_base_new();
    assert_non_null(t->evb);
    t->b.wake_ev = event_new(t->evb, -1, 0, wake_cb, NULL);
    assert_non_null(t->b.wake_ev);
}

static void bench_free(bench *t)
{
    event_free(t->b.wake_ev);
    event_base_free(t->evb);
    pthread_mutex_destroy(&t->b.mu);
}

/* The job oai_job_start queued, taken back from the backend. */
static oai_job *take(bench *t)
{
    oai_job *j = t->b.jobs;
    assert_non_null(j);
    assert_ptr_equal(t->b.inbox, j);
    t->b.jobs = NULL;
    t->b.inbox = NULL;
    t->b.inbox_tail = &t->b.inbox;
    return j;
}

static bool same_str(const char *what, const char *got, const char *want)
{
    if ((!got && !want) || (got && want && strcmp(got, want) == 0))
        return true;
    print_message("  %s: got %.300s\n  want %.300s\n", what, got ? got : "(none)",
                  want ? want : "(none)");
    return false;
}

/* Whether j starts as ref does: what goes upstream and what the agent
 * holds the reply to. */
static bool same_start(const oai_job *j, const oai_job *ref)
{
    bool ok = same_str("body", j->body, ref->body) &&
              same_str("pool options", j->pool_options, ref->pool_options) &&
              same_str("count body (/tokenize)", j->tok_body, ref->tok_body) &&
              same_str("count body (count_tokens)", j->count_body, ref->count_body) &&
              same_str("count body (/apply-template)", j->tmpl_body, ref->tmpl_body) &&
              same_str("correlation id", j->h_corr, ref->h_corr) &&
              same_str("pool via", j->pool_via, ref->pool_via);
    if (!json_equal(j->stops, ref->stops) && (j->stops || ref->stops)) {
        print_message("  stop strings differ (%s)\n", j->stops ? "copied" : "none");
        ok = false;
    }
    if (j->count_estimate != ref->count_estimate || j->count_chat != ref->count_chat) {
        print_message("  the count's estimate differs: %lld, want %lld\n", j->count_estimate,
                      ref->count_estimate);
        ok = false;
    }
    if (!j->check != !ref->check || j->st.stops != (const json_t *)j->stops) {
        print_message("  checks or the parser's stop strings differ\n");
        ok = false;
    }
    return ok;
}

/* A chat job with all a start copies or builds: a continuation (the
 * messages' copy), tools, a response_format, sampling parameters, stop
 * strings, a session, a batch priority, a tenant, a correlation id and the
 * pools it came through. */
static const char JOB[] =
    "{\"job_id\":\"job-1\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
    "\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}],"
    "\"continuation\":\"{\\\"a\",\"params\":{\"max_tokens\":50,\"temperature\":0.5,"
    "\"top_p\":0.9,\"top_k\":40,\"seed\":7,\"stop\":[\"END\",\"\\n\\n\"]},"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
    "\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"auto\","
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\","
    "\"schema\":{\"type\":\"object\"}}},\"session\":\"sess-9\",\"priority\":\"batch\","
    "\"tenant\":\"0123456789abcdef0123456789abcdef\",\"correlation_id\":\"corr-1\","
    "\"pool_via\":\"ab12\"}";

/* oai_job_start on job for N = 1, 2, ...: the job starts as the reference
 * does or is AGENT_JOB_START_NOMEM. Returns the runs that broke the rule. */
static int start_sweep(bench *t, const char *what, json_t *job, oai_job **refp)
{
    rec r;
    agent_job_sink sink = sink_of(&r);
    char err[300];
    assert_int_equal(oai_job_start(&t->b.base, job, &sink, err, sizeof err), 0);
    oai_job *ref = take(t);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        arm_beneath(n);
        int rc = oai_job_start(&t->b.base, job, &sink, err, sizeof err);
        bool hit = disarm();
        if (rc == 0) {
            oai_job *j = take(t);
            if (!same_start(j, ref)) {
                print_message("%s: allocation %zu failed: the job started otherwise\n", what, n);
                bad++;
            }
            job_free(j);
        } else if (!hit || rc != AGENT_JOB_START_NOMEM || !strstr(err, "out of memory")) {
            print_message("%s: allocation %zu %s: rc %d (want AGENT_JOB_START_NOMEM), \"%s\"\n",
                          what, n, hit ? "failed" : "did not fail", rc, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", what, n, bad);
    *refp = ref;
    return bad;
}

/* A chat job with all a start copies or builds, for N = 1, 2, ... */
static void test_start_sweep(void **state)
{
    (void)state;
    bench t;
    bench_init(&t);
    json_t *job = J(JOB);
    oai_job *ref;
    int bad = start_sweep(&t, "chat job", job, &ref);
    /* the reference has what the job asked for: no tautology */
    assert_non_null(ref->stops);
    assert_non_null(ref->check);
    assert_non_null(strstr(ref->pool_options, "\"tenant\""));
    assert_non_null(strstr(ref->pool_options, "\"session\""));
    assert_non_null(strstr(ref->body, "\"tools\""));
    assert_non_null(strstr(ref->body, "\"response_format\""));
    assert_non_null(strstr(ref->body, "\"top_k\""));
    /* (stop strings: it may count its prompt after the reply) */
    assert_non_null(ref->tok_body);
    assert_non_null(ref->count_body);
    assert_non_null(ref->tmpl_body);
    job_free(ref);
    json_decref(job);
    bench_free(&t);
    assert_int_equal(bad, 0);
}

/* A count_tokens chat job with something for every method's body: system
 * prompts, a user's text parts, an assistant's tool call, a tool's result,
 * tools whose parameters have long keys. */
static const char COUNT_JOB[] =
    "{\"job_id\":\"count-1\",\"kind\":\"count_tokens\",\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are a careful assistant that answers briefly.\"},"
    "{\"role\":\"system\",\"content\":\"Answer in English, whatever the question's language.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is the weather \"},"
    "{\"type\":\"text\",\"text\":\"in the city of Amsterdam today?\"}]},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0001\","
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather_for_city\",\"arguments\":"
    "\"{\\\"city_name_in_english\\\":\\\"Amsterdam\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_0001\",\"content\":\"Rain, 11 degrees.\"},"
    "{\"role\":\"user\",\"content\":\"And tomorrow, in the morning?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather_for_city\","
    "\"description\":\"The weather of a city, today or another day.\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"city_name_in_english\":{\"type\":\"string\"},"
    "\"day_offset_from_today\":{\"type\":\"integer\"}},\"required\":[\"city_name_in_english\"]}}}],"
    "\"session\":\"sess-9\",\"tenant\":\"0123456789abcdef0123456789abcdef\"}";

/* count_tokens: its bodies (every method's) as with memory to spare, or
 * AGENT_JOB_START_NOMEM; never the client's INVALID_REQUEST ("without a
 * prompt or messages"), never a method skipped for want of memory. */
static void test_count_start_sweep(void **state)
{
    (void)state;
    bench t;
    bench_init(&t);
    json_t *job = J(COUNT_JOB);
    oai_job *ref;
    int bad = start_sweep(&t, "count_tokens job", job, &ref);
    assert_non_null(ref->tok_body);
    assert_non_null(ref->count_body);
    assert_non_null(strstr(ref->tmpl_body, "\"tools\""));
    job_free(ref);
    json_decref(job);
    bench_free(&t);
    assert_int_equal(bad, 0);
}

/* The X-Pool-Options line for sessions of 1..80 bytes (the key that
 * follows lands at every place of jansson's output buffer, where the dump
 * grows it), for N = 1, 2, ...: the line of the unhurt run or -1. */
static void test_pool_options_sweep(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t len = 1; len <= 80; len++) {
        char sess[81];
        memset(sess, 's', len);
        sess[len] = '\0';
        json_t *job = json_pack("{s:s,s:s,s:s}", "session", sess, "priority", "batch", "tenant",
                                "0123456789abcdef0123456789abcdef");
        char *ref;
        assert_int_equal(pool_options_header(job, &ref), 0);
        assert_non_null(strstr(ref, "\"priority\":\"batch\""));
        for (size_t n = 1;; n++) {
            char *got = NULL;
            arm_beneath(n);
            int rc = pool_options_header(job, &got);
            bool hit = disarm();
            if (rc == 0 ? !got || strcmp(got, ref) != 0 : !hit || got) {
                print_message("session of %zu bytes, allocation %zu failed: rc %d, %s\n", len, n,
                              rc, got ? got : "(no line)");
                bad++;
            }
            free(got);
            if (!hit)
                break;
        }
        free(ref);
        json_decref(job);
    }
    assert_int_equal(bad, 0);
}

/* openai_count's builders for N = 1, 2, ...: the body of the unhurt run,
 * or NULL saying out of memory; never NULL as for a job with nothing to
 * count (its method would be skipped), never a body with a part left out. */
typedef json_t *(*count_builder)(const json_t *job, const char *model, bool *nomem);

static int builder_sweep(const char *what, count_builder build, const json_t *job)
{
    bool nomem = true;
    json_t *ref = build(job, "upm", &nomem);
    assert_non_null(ref);
    assert_false(nomem);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        arm_beneath(n);
        json_t *got = build(job, "upm", &nomem);
        bool hit = disarm();
        if (got ? nomem || !json_equal(got, ref) : !nomem || !hit) {
            print_message("%s: allocation %zu failed: %s%s\n", what, n,
                          got ? "another body" : "no body", nomem ? ", out of memory" : "");
            if (got)
                print_diff("body", got, ref);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", what, n, bad);
    json_decref(ref);
    return bad;
}

static void test_count_bodies_sweep(void **state)
{
    (void)state;
    json_t *chat = J(COUNT_JOB);
    json_t *prompt = J("{\"kind\":\"count_tokens\",\"prompt\":\"Once upon a time, in a land far "
                       "away, there lived a very long prompt.\"}");
    int bad = builder_sweep("count_tokens body", oai_count_messages_body, chat) +
              builder_sweep("count_tokens body of a prompt", oai_count_messages_body, prompt) +
              builder_sweep("/apply-template body", oai_count_template_body, chat) +
              builder_sweep("/tokenize body", oai_count_tokenize_body, chat) +
              builder_sweep("/tokenize body of a prompt", oai_count_tokenize_body, prompt);
    /* gp_count_text (the /tokenize body's "content"): whole or NULL */
    char *ref = gp_count_text(chat);
    assert_non_null(ref);
    for (size_t n = 1;; n++) {
        arm_beneath(n);
        char *got = gp_count_text(chat);
        bool hit = disarm();
        if (got ? strcmp(got, ref) != 0 : !hit) {
            print_message("gp_count_text: allocation %zu failed: %s\n", n, got ? got : "NULL");
            bad++;
        }
        free(got);
        if (!hit)
            break;
    }
    free(ref);
    json_decref(prompt);
    json_decref(chat);
    assert_int_equal(bad, 0);
}

/* Method 2's /apply-template reply (a prompt longer than jansson's first
 * token buffer, where its lexer drops a byte when it cannot grow it: the
 * checked load's case) and method 1's count.
 *
 * Shaped around two crashes of jansson 2.14's own loader under allocation
 * failure, which no checked load can catch, since they happen inside
 * json_loadb (load.c, lex_scan_string: the byte it fails to save is lost
 * and the decoder trusts the saved text): where the lost byte is a string's
 * closing quote (a string token of exactly 16, 32, 64, ... bytes, quotes
 * included, the first of its size: "an-inner-model" here crashed), the
 * decoder reads past the saved text and writes past its buffer (heap
 * corruption, SIGSEGV); where it is an escape's letter ("\\n"), it reaches
 * assert(0). So: no escapes, and no string of those sizes. */
static const char TEMPLATE_REPLY[] =
    "{\"prompt\":\"<|im_start|>system You are a careful assistant that answers briefly."
    "<|im_end|> <|im_start|>user What is the weather in Amsterdam?<|im_end|> \"}";
static const char COUNT_REPLY[] =
    "{\"input_tokens\":1234,\"x_pool_meta\":{\"estimated\":false,\"model\":\"an-inner-gpupool\"}}";

/* The reply readers for N = 1, 2, ...: the unhurt answer or out of memory. */
static void test_count_readers_sweep(void **state)
{
    (void)state;
    bool nomem = true;
    char *ref = oai_count_template_tokenize(TEMPLATE_REPLY, strlen(TEMPLATE_REPLY), &nomem);
    assert_non_null(ref);
    assert_false(nomem);
    int bad = 0;
    for (size_t n = 1;; n++) {
        arm_beneath(n);
        char *got = oai_count_template_tokenize(TEMPLATE_REPLY, strlen(TEMPLATE_REPLY), &nomem);
        bool hit = disarm();
        if (got ? nomem || strcmp(got, ref) != 0 : !nomem || !hit) {
            print_message("/tokenize step: allocation %zu failed: %s%s\n", n,
                          got ? got : "no body", nomem ? ", out of memory" : "");
            bad++;
        }
        free(got);
        if (!hit)
            break;
    }
    free(ref);
    for (size_t n = 1;; n++) {
        long long c = 0;
        bool est = true;
        arm_beneath(n);
        int rc = oai_count_parse(OAI_COUNT_MESSAGES, COUNT_REPLY, strlen(COUNT_REPLY), &c, &est);
        bool hit = disarm();
        if (rc == 0 ? c != 1234 || est : rc != OAI_COUNT_NOMEM || !hit) {
            print_message("count reply: allocation %zu failed: rc %d, %lld\n", n, rc, c);
            bad++;
        }
        if (!hit)
            break;
    }
    assert_int_equal(bad, 0);
}

/* What a count_tokens job did once its method's reply was read: ended
 * (its count, or an error), or went on to another transfer (which method,
 * which step, with what body). */
typedef struct count_outcome {
    int nend, nerror, nmetrics;
    long long pt;
    char code[64];
    int count_m;
    bool tmpl_step;
    char tok[1024];
} count_outcome;

static void count_bench_init(bench *t)
{
    bench_init(t);
    t->b.multi = curl_multi_init();
    assert_non_null(t->b.multi);
    t->b.url_count = "http://127.0.0.1:9/v1/messages/count_tokens";
    t->b.url_template = "http://127.0.0.1:9/apply-template";
    t->b.url_tokenize = "http://127.0.0.1:9/tokenize";
    t->b.nrunning = 1; /* (never 0 in job_release: no sweep timer here) */
}

static void count_bench_free(bench *t)
{
    while (t->b.n_easy_idle)
        curl_easy_cleanup(t->b.easy_idle[--t->b.n_easy_idle]);
    curl_multi_cleanup(t->b.multi);
    while (t->b.n_parsed)
        curl_url_cleanup(t->b.parsed[--t->b.n_parsed].u);
    bench_free(t);
}

/* COUNT_JOB started, its method m's transfer ended with a 200 JSON reply
 * (body), then count_step_done with the n-th allocation failing (0: none).
 * Returns whether it was reached. */
static bool count_replied(bench *t, json_t *job, int m, const char *body, size_t n,
                          count_outcome *out)
{
    rec r;
    agent_job_sink sink = sink_of(&r);
    char err[300];
    assert_int_equal(oai_job_start(&t->b.base, job, &sink, err, sizeof err), 0);
    oai_job *j = take(t);
    t->b.nrunning++; /* job_begin's */
    j->count_m = j->count_first = m;
    oai_stream_reset(&j->st, true);
    static const char *const hdrs[] = {"HTTP/1.1 200 OK\r\n",
                                       "Content-Type: application/json\r\n", "\r\n"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(oai_stream_header(&j->st, hdrs[i], strlen(hdrs[i])), 0);
    assert_int_equal(oai_stream_body(&j->st, body, strlen(body)), 0);
    if (n)
        arm_beneath(n);
    count_step_done(&t->b, j, true, CURLE_OK);
    bool hit = disarm();
    memset(out, 0, sizeof *out);
    out->nend = r.nend;
    out->nerror = r.nerror;
    out->nmetrics = r.nmetrics;
    out->pt = r.pt;
    snprintf(out->code, sizeof out->code, "%s", r.code);
    if (r.nend + r.nerror == 0) { /* on to another transfer: stopped here */
        out->count_m = j->count_m;
        out->tmpl_step = j->tmpl_step;
        snprintf(out->tok, sizeof out->tok, "%s", j->tmpl_tok ? j->tmpl_tok : "");
        xfer_drop(&t->b, j);
        job_release(&t->b, j);
    }
    return hit;
}

static int reply_sweep(const char *what, int m, const char *body)
{
    bench t;
    count_bench_init(&t);
    json_t *job = J(COUNT_JOB);
    count_outcome ref, got;
    count_replied(&t, job, m, body, 0, &ref);
    /* the reference counts with what the reply said: no tautology */
    if (m == OAI_COUNT_MESSAGES)
        assert_true(ref.nend == 1 && ref.pt == 1234 && ref.nmetrics == 0);
    else
        assert_true(ref.tmpl_step && ref.count_m == m && strstr(ref.tok, "im_start"));
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        bool hit = count_replied(&t, job, m, body, n, &got);
        bool same = got.nend == ref.nend && got.nerror == ref.nerror && got.pt == ref.pt &&
                    got.nmetrics == ref.nmetrics && got.count_m == ref.count_m &&
                    got.tmpl_step == ref.tmpl_step && strcmp(got.tok, ref.tok) == 0;
        bool oom = hit && got.nerror == 1 && strcmp(got.code, "AGENT_OUT_OF_MEMORY") == 0;
        if (!same && !oom) {
            print_message("%s: allocation %zu failed: %s (count %lld%s), method %d%s\n", what,
                          n, got.nend ? "ended" : got.nerror ? got.code : "went on", got.pt,
                          got.nmetrics ? ", estimated" : "", got.count_m,
                          got.tmpl_step ? " (its /tokenize step)" : "");
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d broke the rule\n", what, n, bad);
    json_decref(job);
    count_bench_free(&t);
    return bad;
}

/* A count_tokens job whose method answered, read for N = 1, 2, ...: the
 * count (or the template's /tokenize step) as with memory to spare, or
 * AGENT_OUT_OF_MEMORY; never the next method or the estimate for a reply
 * the agent had no memory to read. */
static void test_count_reply_sweep(void **state)
{
    (void)state;
    int bad = reply_sweep("count_tokens reply", OAI_COUNT_MESSAGES, COUNT_REPLY) +
              reply_sweep("/apply-template reply", OAI_COUNT_TEMPLATE, TEMPLATE_REPLY);
    assert_int_equal(bad, 0);
}

/* The embeddings probe's body for upstream model names of 1..40 bytes (its
 * keys land at every place of the output buffer), for N = 1, 2, ...: the
 * unhurt body or NULL (tried again later), never a body without "model" or
 * "input", whose 4xx would be taken for "no embeddings here". */
static void test_embed_probe_body_sweep(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t len = 1; len <= 40; len++) {
        char model[41];
        memset(model, 'm', len);
        model[len] = '\0';
        char *ref = oai_embed_probe_body(model);
        assert_non_null(ref);
        for (size_t n = 1;; n++) {
            arm_beneath(n);
            char *got = oai_embed_probe_body(model);
            bool hit = disarm();
            if (got ? strcmp(got, ref) != 0 : !hit) {
                print_message("model of %zu bytes, allocation %zu failed: %s\n", len, n,
                              got ? got : "(no body)");
                bad++;
            }
            free(got);
            if (!hit)
                break;
        }
        free(ref);
    }
    assert_int_equal(bad, 0);
}

/* A reply that is JSON, as the upstream streams it. */
static const char *const REPLY_OK =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"zip\\\":\\\"12345\\\","
    "\\\"n\\\":1}\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
    "data: [DONE]\n\n";
/* One that breaks the schema (a zip of four digits). */
static const char *const REPLY_BAD =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"zip\\\":\\\"1234\\\","
    "\\\"n\\\":1}\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
    "data: [DONE]\n\n";

static const char SCHEMA_JOB[] =
    "{\"job_id\":\"job-2\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
    "\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
    "\"name\":\"r\",\"schema\":{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":"
    "\"string\",\"pattern\":\"^[0-9]{5}$\"},\"n\":{\"type\":\"integer\"}},"
    "\"required\":[\"zip\",\"n\"],\"additionalProperties\":false}}}}";

/* A started job of SCHEMA_JOB whose reply (body) has been read to its
 * [DONE], its terminal events going to r; n > 0: the n-th allocation of
 * the reply's end (oai_stream_finish: the verdict) fails. Returns whether
 * it was reached. */
static bool finish(bench *t, json_t *job, const char *body, rec *r, size_t n)
{
    agent_job_sink sink = sink_of(r);
    char err[300];
    assert_int_equal(oai_job_start(&t->b.base, job, &sink, err, sizeof err), 0);
    oai_job *j = take(t);
    static const char *const hdrs[] = {"HTTP/1.1 200 OK\r\n",
                                       "Content-Type: text/event-stream\r\n", "\r\n"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(oai_stream_header(&j->st, hdrs[i], strlen(hdrs[i])), 0);
    assert_int_equal(oai_stream_body(&j->st, body, strlen(body)), 1);
    if (n)
        arm_beneath(n);
    oai_stream_finish(&j->st, NULL, NULL);
    bool hit = disarm();
    assert_int_equal(r->nend + r->nerror, 1);
    job_free(j);
    return hit;
}

static int verdict_sweep(const char *what, const char *body)
{
    bench t;
    bench_init(&t);
    json_t *job = J(SCHEMA_JOB);
    rec ref, r;
    finish(&t, job, body, &ref, 0);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        bool hit = finish(&t, job, body, &r, n);
        bool same = r.nend == ref.nend && strcmp(r.code, ref.code) == 0 &&
                    strcmp(r.finish, ref.finish) == 0 && strcmp(r.msg, ref.msg) == 0;
        bool oom = r.nerror && strcmp(r.code, "AGENT_OUT_OF_MEMORY") == 0;
        if (!same && !(hit && oom)) {
            print_message("%s: allocation %zu failed: %s %s \"%s\" (want %s%s \"%s\" or "
                          "AGENT_OUT_OF_MEMORY)\n", what, n, r.nend ? "end" : "error",
                          r.nend ? r.finish : r.code, r.msg, ref.nend ? "end " : "error ",
                          ref.nend ? ref.finish : ref.code, ref.msg);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s: %zu runs\n", what, n);
    json_decref(job);
    bench_free(&t);
    return bad;
}

/* The verdict on a reply, for N = 1, 2, ...: a reply that holds ends
 * "stop", one that does not UPSTREAM_INVALID_OUTPUT, as with memory to
 * spare, or the job ends AGENT_OUT_OF_MEMORY (failed over). */
static void test_verdict_sweep(void **state)
{
    (void)state;
    /* the reference: the replies are judged, one holds and one does not */
    bench t;
    bench_init(&t);
    json_t *job = J(SCHEMA_JOB);
    rec r;
    finish(&t, job, REPLY_OK, &r, 0);
    assert_int_equal(r.nend, 1);
    assert_string_equal(r.finish, "stop");
    finish(&t, job, REPLY_BAD, &r, 0);
    assert_int_equal(r.nerror, 1);
    assert_string_equal(r.code, "UPSTREAM_INVALID_OUTPUT");
    json_decref(job);
    bench_free(&t);
    int bad = verdict_sweep("a reply that holds", REPLY_OK) +
              verdict_sweep("a reply that does not", REPLY_BAD);
    print_message("%d runs broke the rule\n", bad);
    assert_int_equal(bad, 0);
}

int main(void)
{
    /* jansson's allocator: gp_json's counting one, before any JSON is
     * made, so that arm_beneath's failures reach the checked loads and
     * dumps as real ones would */
    gp_json_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_sweep),
        cmocka_unit_test(test_count_start_sweep),
        cmocka_unit_test(test_pool_options_sweep),
        cmocka_unit_test(test_count_bodies_sweep),
        cmocka_unit_test(test_count_readers_sweep),
        cmocka_unit_test(test_count_reply_sweep),
        cmocka_unit_test(test_embed_probe_body_sweep),
        cmocka_unit_test(test_verdict_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The openai backend (src/agent/backend_openai.c) when memory runs out:
 *   - oai_job_start either starts the job exactly as it starts with memory
 *     to spare (its request body, its stop strings, its X-Pool-Options
 *     line: session, priority, tenant) or returns AGENT_JOB_START_NOMEM
 *     (the agent's own failure: the job fails over); never -1 (the client's
 *     INVALID_REQUEST), never a job run without what it asked for;
 *   - a reply held to a response_format ends as it ends with memory to
 *     spare, or with AGENT_OUT_OF_MEMORY when the check could not be made
 *     (openai_stream.c maps the verdict); never UPSTREAM_INVALID_OUTPUT for a reply that was
 *     fine.
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: jansson's and the agent's malloc, calloc, realloc and
 * strdup (ld --wrap: part-openai-schema.cmake, through
 * tests/unit/server/fixture_oom.h). The backend file is included for its
 * statics, as test_agent_openai_stream.c does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/backend_openai.c"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

/* The terminal event a job's sink got. */
typedef struct rec {
    int nend, nerror;
    char code[64];
    char msg[600];
    char finish[32];
} rec;

static void r_started(void *c) { (void)c; }
static void r_token(void *c, const char *t, size_t n, int32_t id)
{
    (void)c, (void)t, (void)n, (void)id;
}
static void r_metrics(void *c, json_t *m) { (void)c, (void)m; }
static void r_end(void *c, const char *fr, long long pt, long long ct)
{
    rec *r = c;
    (void)pt, (void)ct;
    r->nend++;
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
              same_str("correlation id", j->h_corr, ref->h_corr) &&
              same_str("pool via", j->pool_via, ref->pool_via);
    if (!json_equal(j->stops, ref->stops) && (j->stops || ref->stops)) {
        print_message("  stop strings differ (%s)\n", j->stops ? "copied" : "none");
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

/* oai_job_start on JOB for N = 1, 2, ...: the job starts as the reference
 * does or is AGENT_JOB_START_NOMEM. */
static void test_start_sweep(void **state)
{
    (void)state;
    bench t;
    bench_init(&t);
    json_t *job = J(JOB);
    rec r;
    agent_job_sink sink = sink_of(&r);
    char err[300];
    assert_int_equal(oai_job_start(&t.b.base, job, &sink, err, sizeof err), 0);
    oai_job *ref = take(&t);
    /* the reference has what the job asked for: no tautology */
    assert_non_null(ref->stops);
    assert_non_null(ref->check);
    assert_non_null(strstr(ref->pool_options, "\"tenant\""));
    assert_non_null(strstr(ref->pool_options, "\"session\""));
    assert_non_null(strstr(ref->body, "\"tools\""));
    assert_non_null(strstr(ref->body, "\"response_format\""));
    assert_non_null(strstr(ref->body, "\"top_k\""));
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        arm_libc(n);
        int rc = oai_job_start(&t.b.base, job, &sink, err, sizeof err);
        bool hit = disarm();
        if (rc == 0) {
            oai_job *j = take(&t);
            if (!same_start(j, ref)) {
                print_message("allocation %zu failed: the job started otherwise\n", n);
                bad++;
            }
            job_free(j);
        } else if (!hit || rc != AGENT_JOB_START_NOMEM || !strstr(err, "out of memory")) {
            print_message("allocation %zu %s: rc %d (want AGENT_JOB_START_NOMEM), \"%s\"\n",
                          n, hit ? "failed" : "did not fail", rc, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%zu runs, %d broke the rule\n", n, bad);
    job_free(ref);
    json_decref(job);
    bench_free(&t);
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
        arm_libc(n);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_sweep),
        cmocka_unit_test(test_verdict_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

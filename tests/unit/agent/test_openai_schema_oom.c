/* openai_schema (src/agent/openai_schema.c) when memory runs out while it
 * makes a job's checks: oai_schema_new either makes checks that judge a
 * reply as the ones made with memory to spare do, or returns
 * OAI_SCHEMA_NOMEM ("out of memory"), which the openai backend turns into
 * AGENT_JOB_START_NOMEM (the agent's own failure: the job fails over);
 * never -1, which refuses the job as the client's INVALID_REQUEST (a 400
 * for a valid response_format or strict tool).
 *
 * And a reply judged while memory runs out (kept, loaded, checked) has the
 * verdict it has with memory to spare, or OAI_SCHEMA_NOMEM: never "not
 * JSON" or "too large to check" (UPSTREAM_INVALID_OUTPUT, not failed over)
 * for want of the agent's memory.
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: jansson's and the agent's and validator's own malloc,
 * calloc, realloc and strdup (ld --wrap: part-openai-schema.cmake),
 * through the server sweeps' failing allocator
 * (tests/unit/server/fixture_oom.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/openai_schema.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

/* A response_format with patterns and a format, a strict tool with
 * parameters, a strict tool without (any object), and a loose one. */
static const char JOB[] =
    "{\"kind\":\"chat\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
    "\"name\":\"r\",\"schema\":{\"type\":\"object\",\"properties\":{"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},"
    "\"when\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"n\":{\"type\":\"integer\",\"minimum\":0}},\"required\":[\"zip\",\"n\"],"
    "\"additionalProperties\":false}}},"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"tight\",\"strict\":true,"
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
    "\"pattern\":\"^[a-z]+$\"}},\"required\":[\"a\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"bare\",\"strict\":true}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"loose\",\"parameters\":{}}}]}";

/* A reply: its text, or a tool call (name, arguments). */
typedef struct reply {
    const char *text;
    const char *tool;
    const char *args;
} reply;

static const reply REPLIES[] = {
    {"{\"zip\":\"12345\",\"n\":1,\"when\":\"2024-02-03\"}", NULL, NULL},
    {"{\"zip\":\"1234\",\"n\":1}", NULL, NULL},
    {"{\"zip\":\"12345\",\"n\":1,\"when\":\"soon\"}", NULL, NULL},
    {"{\"zip\":\"12345\"}", NULL, NULL},
    {NULL, "tight", "{\"a\":\"abc\"}"},
    {NULL, "tight", "{\"a\":\"ABC\"}"},
    {NULL, "bare", "{\"x\":1}"},
    {NULL, "bare", "[1]"},
    {NULL, "loose", "nonsense"},
};
#define N_REPLIES (sizeof REPLIES / sizeof REPLIES[0])

/* c's verdict on reply r, and its message. */
static int verdict(oai_schema *c, const reply *r, char *msg, size_t msglen)
{
    msg[0] = '\0';
    if (r->text)
        oai_schema_text(c, r->text, strlen(r->text));
    else
        oai_schema_tool(c, 0, r->tool, r->args, strlen(r->args));
    return oai_schema_verdict(c, msg, msglen);
}

/* A fresh checker per reply (a checker keeps what it was given). */
static oai_schema *make(json_t *job)
{
    char err[300];
    oai_schema *c = NULL;
    assert_int_equal(oai_schema_new(job, &c, err, sizeof err), 0);
    assert_non_null(c);
    return c;
}

/* c (made in a run, freed here) judges reply r as checks made with memory
 * to spare do (a checker keeps what it is given: one reply each). */
static bool same_judgement(oai_schema *c, json_t *job, const reply *r)
{
    char m1[600], m2[600];
    oai_schema *ref = make(job);
    int r1 = verdict(c, r, m1, sizeof m1);
    int r2 = verdict(ref, r, m2, sizeof m2);
    oai_schema_free(ref);
    oai_schema_free(c);
    if (r1 != r2 || strcmp(m1, m2)) {
        print_message("%d \"%s\", want %d \"%s\"\n", r1, m1, r2, m2);
        return false;
    }
    return true;
}

/* oai_schema_new on job for N = 1, 2, ..., the checks made judged on
 * reply r; the number of runs that broke the rule (each printed). */
static int sweep(const char *what, const char *job_text, const reply *r)
{
    json_t *job = J(job_text);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        char err[300] = "";
        oai_schema *c = NULL;
        arm_libc(n);
        int rc = oai_schema_new(job, &c, err, sizeof err);
        bool hit = disarm();
        if (rc == 0) {
            if (!c || !same_judgement(c, job, r)) {
                print_message("%s: allocation %zu failed, checks made that judge otherwise\n",
                              what, n);
                bad++;
            }
        } else {
            oai_schema_free(c); /* (NULL: *out is set only on success) */
            if (!hit || rc != OAI_SCHEMA_NOMEM || !strstr(err, "out of memory")) {
                print_message("%s: allocation %zu %s: rc %d (want OAI_SCHEMA_NOMEM %d), "
                              "\"%s\"\n", what, n, hit ? "failed" : "did not fail", rc,
                              OAI_SCHEMA_NOMEM, err);
                bad++;
            }
        }
        if (!hit)
            break;
    }
    json_decref(job);
    return bad;
}

static void test_sweep(void **state)
{
    (void)state;
    /* the reference judges as it should: the replies are no tautology */
    static const int want[N_REPLIES] = {0, -1, -1, -1, 0, -1, 0, -1, 0};
    json_t *job = J(JOB);
    for (size_t i = 0; i < N_REPLIES; i++) {
        char msg[600];
        oai_schema *c = make(job);
        assert_int_equal(verdict(c, &REPLIES[i], msg, sizeof msg), want[i]);
        oai_schema_free(c);
    }
    json_decref(job);
    int bad = 0;
    for (size_t i = 0; i < N_REPLIES; i++)
        bad += sweep("json_schema and strict tools", JOB, &REPLIES[i]);
    static const reply obj[] = {{"{\"x\":[]}", NULL, NULL}, {"[]", NULL, NULL}};
    for (size_t i = 0; i < 2; i++)
        bad += sweep("json_object", "{\"kind\":\"chat\",\"response_format\":"
                                    "{\"type\":\"json_object\"}}", &obj[i]);
    print_message("%d runs broke the rule\n", bad);
    assert_int_equal(bad, 0);
}

/* Checks made with memory to spare, given reply r and judging it while
 * the N-th allocation fails, for N = 1, 2, ...: the verdict is the one
 * given with memory to spare, or OAI_SCHEMA_NOMEM ("out of memory"), never
 * -1 for a reply that holds, nor another message ("not JSON", "too large
 * to check") for one that does not. The number of runs that broke it. */
static int verdict_sweep(json_t *job, const reply *r)
{
    char want[600], got[600];
    oai_schema *ref = make(job);
    int want_rc = verdict(ref, r, want, sizeof want);
    oai_schema_free(ref);
    int bad = 0;
    for (size_t n = 1;; n++) {
        oai_schema *c = make(job);
        arm_libc(n);
        int rc = verdict(c, r, got, sizeof got);
        bool hit = disarm();
        oai_schema_free(c);
        bool same = rc == want_rc && strcmp(got, want) == 0;
        if (!same && !(hit && rc == OAI_SCHEMA_NOMEM && strstr(got, "out of memory"))) {
            print_message("%s: allocation %zu %s: %d \"%s\", want %d \"%s\" or "
                          "OAI_SCHEMA_NOMEM\n", r->text ? r->text : r->args, n,
                          hit ? "failed" : "did not fail", rc, got, want_rc, want);
            bad++;
        }
        if (!hit)
            break;
    }
    return bad;
}

/* What a reply is judged while memory runs out: keeping its text or a
 * call's name and arguments, loading it and checking it. */
static void test_verdict_sweep(void **state)
{
    (void)state;
    json_t *job = J(JOB);
    int bad = 0;
    for (size_t i = 0; i < N_REPLIES; i++)
        bad += verdict_sweep(job, &REPLIES[i]);
    json_decref(job);
    print_message("%d runs broke the rule\n", bad);
    assert_int_equal(bad, 0);
}

/* A schema the validator refuses is still the job's fault (-1). */
static void test_refused_stays_refused(void **state)
{
    (void)state;
    json_t *job = J("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                    "\"name\":\"r\",\"schema\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}}");
    char err[300] = "";
    oai_schema *c = NULL;
    assert_int_equal(oai_schema_new(job, &c, err, sizeof err), -1);
    assert_null(c);
    assert_null(strstr(err, "out of memory"));
    json_decref(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_verdict_sweep),
        cmocka_unit_test(test_refused_stays_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

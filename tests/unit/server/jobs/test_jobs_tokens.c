/* Token-exact continuation (jobs.c, registry.c): the registry keeps each
 * agent model's digest (and refuses a malformed one); token events'
 * ids are recorded; a continue-mode failover onto an agent with the same
 * digest carries continuation_ids + sampler state on the wire, onto
 * another digest only the text; a requeue without output forgets the ids;
 * a free same-digest agent is preferred. Real registry, scheduler and jobs
 * table; no store, the event loop never runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_fleet.h"
#include "server/jobs/jobs.h"

#define D1 "1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "2222222222222222222222222222222222222222222222222222222222222222"

typedef fleet fx;

static registry_agent *add_agent(fx *f, int i, const char *digest)
{
    return fleet_agent(f, i, "m1", digest, 2, 1000);
}

static void fx_init(fx *f) { fleet_init(f, NULL, NULL); }
static void fx_free(fx *f) { fleet_free(f); }

static char g_fo_cont[16];   /* continuation of the last failover event */

/* A subscriber that plays a streaming client: every token reached it. */
static void on_event(gps_job *job, gps_event_type t, json_t *ev, void *arg)
{
    (void)arg;
    if (t == GPS_EV_TOKEN)
        gps_job_mark_output_sent(job);
    if (t == GPS_EV_FAILOVER) {
        const char *c = json_string_value(json_object_get(ev, "continuation"));
        snprintf(g_fo_cont, sizeof g_fo_cont, "%s", c ? c : "(none)");
    }
}

static gps_job *submit(fx *f, long long max_tokens, bool seeded)
{
    gps_job_spec s = fleet_spec("m1", max_tokens);
    s.temperature = 0.8;
    s.has_seed = seeded;
    s.seed = 77;
    gps_job *job = fleet_submit(f, &s);
    assert_int_equal(gps_job_subscribe(job, on_event, NULL), 0);
    return job;
}

static json_t *take(fx *f, registry_agent *a) { return fleet_take(f, a); }

static int apply(fx *f, gps_job *job, registry_agent *a, long long seq, const char *events)
{
    return fleet_apply(f, job, a, seq, events);
}

static const char *TOKENS =
    "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\" ab\",\"token_id\":5},"
    "{\"type\":\"token\",\"text\":\"c\",\"token_id\":8,\"token_ids\":[7,8]}]";

static void check_ids(json_t *w, const char *digest)
{
    json_t *ids = json_object_get(w, "continuation_ids");
    assert_int_equal(json_array_size(ids), 3);
    assert_int_equal(json_integer_value(json_array_get(ids, 0)), 5);
    assert_int_equal(json_integer_value(json_array_get(ids, 1)), 7);
    assert_int_equal(json_integer_value(json_array_get(ids, 2)), 8);
    assert_string_equal(json_string_value(json_object_get(w, "continuation_digest")), digest);
    json_t *smp = json_object_get(w, "sampler");
    assert_int_equal(json_integer_value(json_object_get(smp, "n_sampled")), 3);
    assert_string_equal(json_string_value(json_object_get(w, "continuation")), " abc");
    /* 3 of the 20 tokens were generated */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "params"),
                                                        "max_tokens")),
                     17);
}

static void test_registry_digest(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1), *b = add_agent(&f, 2, NULL);
    assert_string_equal(registry_agent_model_digest(a, "m1"), D1);
    assert_null(registry_agent_model_digest(b, "m1"));
    assert_null(registry_agent_model_digest(a, "other"));
    /* upper case, 65 characters, not a string, a non-hex character */
    static const char *bad[] = {"\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"",
                                "\"" D1 "0\"", "42",
                                "\"11111111111111111111111111111111"
                                "1111111111111111111111111111111G\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"agent_id\":\"00000000-0000-4000-8000-000000000009\",\"models\":"
                 "[{\"id\":\"m1\",\"digest\":%s}],\"slots\":{\"total\":1}}",
                 bad[i]);
        json_t *j = json_loads(body, 0, NULL);
        registry_facts facts;
        char err[160] = "";
        assert_int_equal(registry_facts_parse(j, &facts, err, sizeof err), -1);
        assert_non_null(strstr(err, "models[0].digest"));
        registry_facts_free(&facts);
        json_decref(j);
    }
    fx_free(&f);
}

static void test_same_digest_continues_from_ids(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1), *b = add_agent(&f, 2, D1);
    gps_job *job = submit(&f, 20, false);
    json_t *w = take(&f, a);
    /* every attempt gets the job's sampler seed; no ids on a first attempt */
    json_t *seed = json_object_get(json_object_get(w, "sampler"), "seed");
    assert_true(json_is_integer(seed));
    assert_int_equal(json_integer_value(seed), job->sampler_seed); /* the one drawn at submit */
    long long s1 = json_integer_value(seed);
    assert_null(json_object_get(w, "continuation_ids"));
    json_decref(w);
    assert_int_equal(apply(&f, job, a, 0, TOKENS), 0);
    assert_int_equal(job->completion_tokens, 3);     /* the second event stands for two */
    gps_jobs_agent_lost(f.jobs, a->id, "test");
    assert_string_equal(g_fo_cont, "tokens");
    w = take(&f, b);
    check_ids(w, D1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "sampler"), "seed")),
                     s1);
    assert_string_equal(job->continuation_mode, "tokens");
    json_decref(w);
    fx_free(&f);
}

static void test_other_digest_gets_text(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1), *c = add_agent(&f, 3, D2);
    registry_agent *o = add_agent(&f, 4, NULL);
    gps_job *job = submit(&f, 20, true);
    json_t *w = take(&f, a);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "sampler"), "seed")),
                     77);
    json_decref(w);
    assert_int_equal(apply(&f, job, a, 0, TOKENS), 0);
    gps_jobs_agent_lost(f.jobs, a->id, "test");
    assert_string_equal(g_fo_cont, "text");   /* no live agent has a's file */
    w = take(&f, c);
    assert_null(json_object_get(w, "continuation_ids"));
    assert_null(json_object_get(json_object_get(w, "sampler"), "n_sampled"));
    assert_string_equal(json_string_value(json_object_get(w, "continuation")), " abc");
    assert_string_equal(job->continuation_mode, "text");
    json_decref(w);
    /* text from another file followed: ids are no use any more, not even
     * on an agent with the first digest */
    assert_int_equal(apply(&f, job, c, 0, "[{\"type\":\"token\",\"text\":\"d\",\"token_id\":1}]"),
                     0);
    registry_agent *a2 = add_agent(&f, 5, D1);
    gps_jobs_agent_lost(f.jobs, c->id, "test");
    w = take(&f, a2);
    assert_null(json_object_get(w, "continuation_ids"));
    assert_string_equal(job->continuation_mode, "text");
    json_decref(w);
    /* an agent without digest (openai backend, old agent): text */
    gps_job *j2 = submit(&f, 20, true);
    w = take(&f, o);
    json_decref(w);
    assert_int_equal(apply(&f, j2, o, 0, TOKENS), 0);
    gps_jobs_agent_lost(f.jobs, o->id, "test");
    gps_jobs_agent_lost(f.jobs, a2->id, "test");   /* j2 must not wait for it */
    fx_free(&f);
}

static void test_missing_ids_and_requeue(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1), *b = add_agent(&f, 2, D1);
    /* a token event without ids: text continuation */
    gps_job *job = submit(&f, 20, false);
    json_decref(take(&f, a));
    assert_int_equal(apply(&f, job, a, 0,
                           "[{\"type\":\"token\",\"text\":\"x\",\"token_id\":3},"
                           "{\"type\":\"token\",\"text\":\"y\"}]"),
                     0);
    gps_jobs_agent_lost(f.jobs, a->id, "test");
    json_t *w = take(&f, b);
    assert_null(json_object_get(w, "continuation_ids"));
    assert_string_equal(job->continuation_mode, "text");
    json_decref(w);
    /* malformed token_ids: 400 */
    assert_int_equal(apply(&f, job, b, 0,
                           "[{\"type\":\"token\",\"text\":\"x\",\"token_ids\":[1,\"2\"]}]"),
                     400);
    assert_int_equal(apply(&f, job, b, 0,
                           "[{\"type\":\"token\",\"text\":\"x\",\"token_id\":4,"
                           "\"token_ids\":[1,2]}]"),
                     400);
    assert_int_equal(apply(&f, job, b, 0, "[{\"type\":\"token\",\"text\":\"x\",\"token_ids\":[]}]"),
                     400);
    fx_free(&f);

    /* nothing reached the client: a requeue forgets text and ids */
    fx_init(&f);
    a = add_agent(&f, 1, D1);
    b = add_agent(&f, 2, D1);
    gps_job_spec s = {0};
    s.kind = GPS_JOB_COMPLETION;
    s.model = strdup("m1");
    s.prompt = strdup("hello");
    s.max_tokens = 20;
    s.api = "openai";
    gps_submit_err err;
    job = gps_jobs_submit(f.jobs, &s, "corr", "", &err);
    assert_non_null(job);
    json_decref(take(&f, a));
    assert_int_equal(apply(&f, job, a, 0, TOKENS), 0);
    assert_int_equal(gps_job_text_resets(job), 0);
    gps_jobs_agent_lost(f.jobs, a->id, "test");
    assert_int_equal(gps_job_text_resets(job), 1); /* a relay's cursor starts over */
    assert_int_equal(gps_job_text_len(job), 0);
    w = take(&f, b);
    assert_null(json_object_get(w, "continuation_ids"));
    assert_string_equal(json_string_value(json_object_get(w, "continuation")), "");
    assert_null(job->continuation_mode);
    assert_int_equal(job->n_gen_ids, 0);
    json_decref(w);
    fx_free(&f);
}

static void test_prefers_free_same_digest_agent(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1);
    registry_agent *c = add_agent(&f, 3, D2), *b = add_agent(&f, 2, D1);
    gps_job *job = submit(&f, 20, false);
    json_decref(take(&f, a));
    assert_int_equal(apply(&f, job, a, 0, TOKENS), 0);
    /* both free with a parked long-poll; round robin alone would pick c */
    assert_int_equal(sched_agent_ready(f.s, c, 1), 0);
    assert_int_equal(sched_agent_ready(f.s, b, 1), 0);
    gps_jobs_agent_lost(f.jobs, a->id, "test");
    assert_ptr_equal(f.delivered_to, b);
    check_ids(json_array_get(f.delivery, 0), D1);
    /* b lost too: only c (another file) is free: text, at once */
    f.delivered_to = NULL;
    gps_jobs_agent_lost(f.jobs, b->id, "test");
    assert_ptr_equal(f.delivered_to, c);
    assert_null(json_object_get(json_array_get(f.delivery, 0), "continuation_ids"));
    fx_free(&f);
}

/* A tool call between token events: the gguf agent sends the call as a
 * tool_call event and drops the ids of the tokens that wrote it
 * (backend_gguf_out.c send_calls), so the server's record goes on with
 * the ids of the content after the call, which no longer spell what the
 * model generated. That record must never be resumed: once a tool call
 * was relayed no failover continues the job (gps_failover_decide), be the
 * attempt lost, out of memory or stalled, so the ids are never sent. */
static void test_no_continuation_after_tool_call(void **st)
{
    (void)st;
    static const char *after_call =
        "[{\"type\":\"tool_call\",\"index\":0,\"id\":\"call_1\",\"name\":\"f\","
        "\"arguments\":\"{}\"},{\"type\":\"token\",\"text\":\"d\",\"token_id\":9}]";
    /* the attempt's end: the agent lost (NULL), or its own failure with
     * another agent live, which would be failed over (jobs_events.c
     * apply_error) were it not for the call: the attempt is "lost" */
    static const struct {
        const char *error;
        const char *code;
    } t[] = {
        {NULL, "AGENT_LOST"},
        {"[{\"type\":\"error\",\"code\":\"AGENT_OUT_OF_MEMORY\",\"message\":\"x\"}]",
         "AGENT_LOST"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fx f;
        fx_init(&f);
        registry_agent *a = add_agent(&f, 1, D1), *b = add_agent(&f, 2, D1);
        gps_job *job = submit(&f, 20, false);
        json_decref(take(&f, a));
        assert_int_equal(apply(&f, job, a, 0, TOKENS), 0);
        assert_int_equal(apply(&f, job, a, 3, after_call), 0);
        assert_int_equal(job->n_gen_ids, 4);   /* 5 7 8 9: the call's ids are not there */
        g_fo_cont[0] = '\0';
        if (t[i].error)
            assert_int_equal(apply(&f, job, a, 5, t[i].error), 0);
        else
            gps_jobs_agent_lost(f.jobs, a->id, "test");
        assert_true(gps_job_terminal(job));
        assert_int_equal(job->state, GPS_JOB_FAILED);
        assert_string_equal(gps_job_error_code(job), t[i].code);
        assert_string_equal(g_fo_cont, "");   /* no failover event */
        gp_buf text;
        gp_buf_init(&text);
        assert_int_equal(gps_jobs_take_for_agent(f.jobs, b, 1, 0, &text), 0);
        gp_buf_free(&text);
        fx_free(&f);
    }
}

/* What a subscriber saw of a token: its tree (NULL or not) and the text. */
typedef struct {
    int tokens, trees;
    char last[16];
} seen;

static void on_token(gps_job *job, gps_event_type t, json_t *ev, void *arg)
{
    seen *s = arg;
    if (t != GPS_EV_TOKEN)
        return;
    s->tokens++;
    if (ev) {
        s->trees++;
        snprintf(s->last, sizeof s->last, "%s", json_string_value(json_object_get(ev, "text")));
    }
    /* the token is the tail of the job's text, tree or not */
    assert_true(gps_job_text_len(job) > 0);
}

/* An upload read without trees (gps_jobs_apply_upload) hands cursor
 * subscribers (the relay) no token tree while only they listen; a plain
 * subscriber still gets its text and id. */
static void test_cursor_subscribers_get_no_token_tree(void **st)
{
    (void)st;
    fx f;
    fx_init(&f);
    registry_agent *a = add_agent(&f, 1, D1);
    gps_job_spec sp = fleet_spec("m1", 20);
    gps_job *job = fleet_submit(&f, &sp);
    seen cur = {0}, plain = {0};
    assert_int_equal(gps_job_subscribe_cursor(job, on_token, &cur), 0);
    json_decref(take(&f, a));
    gps_event_in in[2] = {{.text = "ab", .len = 2, .token_id = -1, .bytes = 28},
                          {.text = "c", .len = 1, .token_id = 9, .bytes = 40}};
    bool cancel;
    long long exp;
    char msg[128];
    assert_int_equal(gps_jobs_apply_upload(f.jobs, job->id, a->id, 0, in, 2, &cancel, &exp, msg,
                                           sizeof msg),
                     0);
    assert_int_equal(cur.tokens, 2);
    assert_int_equal(cur.trees, 0);
    assert_int_equal(gps_job_text_len(job), 3);
    assert_memory_equal(gps_job_text(job), "abc", 3);
    assert_int_equal(gps_job_subscribe(job, on_token, &plain), 0);
    in[0].text = "d";
    in[0].len = 1;
    assert_int_equal(gps_jobs_apply_upload(f.jobs, job->id, a->id, 2, in, 1, &cancel, &exp, msg,
                                           sizeof msg),
                     0);
    assert_int_equal(plain.trees, 1);
    assert_string_equal(plain.last, "d");
    assert_int_equal(cur.tokens, 3); /* (given the tree now: it ignores it) */
    gps_job_unsubscribe(job, NULL, &plain);
    gps_job_unsubscribe(job, NULL, &cur);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_digest),
        cmocka_unit_test(test_same_digest_continues_from_ids),
        cmocka_unit_test(test_other_digest_gets_text),
        cmocka_unit_test(test_missing_ids_and_requeue),
        cmocka_unit_test(test_prefers_free_same_digest_agent),
        cmocka_unit_test(test_no_continuation_after_tool_call),
        cmocka_unit_test(test_cursor_subscribers_get_no_token_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

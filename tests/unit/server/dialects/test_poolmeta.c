/*
 * poolmeta: gps_pool_meta_append writes, byte for byte, what
 * gp_json_dump_append writes for gps_pool_meta's tree (plus the caller's
 * warnings), for a real job run through the jobs module (fleet fixture:
 * an agent with a model digest takes the job, uploads its tokens and end),
 * then with each optional member set: a fallback's warning, the slot's
 * prefix units, an upstream pool's meta, a continuation, strings that need
 * escaping, and a model name json_pack refuses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"
#include "server/dialects/poolmeta.h"

#include "fixture_fleet.h"

#define DIGEST "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* The tree's dump with extra warnings appended, as the dialects did. */
static char *tree_text(gps_job *job, const char *const *extra, size_t n)
{
    json_t *meta = gps_pool_meta(job);
    if (!meta)
        return NULL;
    json_t *list = json_object_get(meta, "warnings");
    for (size_t i = 0; i < n; i++) { /* once each, as api_anthropic's pool_meta */
        json_t *w = json_string(extra[i]), *x;
        size_t k;
        bool seen = false;
        json_array_foreach(list, k, x) seen |= w && json_equal(x, w);
        if (!seen)
            json_array_append(list, w);
        json_decref(w);
    }
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(gp_json_dump_append(&b, meta), 0);
    assert_int_equal(gp_buf_append(&b, "", 0), 0);
    json_decref(meta);
    return gp_buf_steal(&b);
}

static void assert_same(gps_job *job, const char *const *extra, size_t n)
{
    char *want = tree_text(job, extra, n);
    gp_buf got;
    gp_buf_init(&got);
    assert_int_equal(gp_buf_append(&got, "x", 1), 0); /* appended after what is there */
    int rc = gps_pool_meta_append(&got, job, extra, n);
    if (!want) {
        assert_int_equal(rc, 1);
        assert_int_equal(got.len, 1);
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(gp_buf_append(&got, "", 0), 0);
        assert_string_equal(got.data + 1, want);
    }
    gp_buf_free(&got);
    free(want);
}

static void test_text_matches_tree(void **state)
{
    (void)state;
    fleet f;
    fleet_init(&f, NULL, NULL);
    registry_agent *a = fleet_agent(&f, 1, "m1", DIGEST, 1, 1000);
    gps_job_spec spec = fleet_spec("m1", 8);
    gps_job *job = fleet_submit(&f, &spec);
    json_decref(fleet_take(&f, a));
    assert_int_equal(fleet_apply(&f, job, a, 0,
                                 "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"Once\"},"
                                 "{\"type\":\"end\",\"finish_reason\":\"stop\","
                                 "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}]"),
                     0);
    assert_true(gps_job_finished_us(job) > 0);
    assert_string_equal(gps_job_model_digest(job), DIGEST);
    assert_same(job, NULL, 0);
    const char *extra[] = {"tools were ignored: \"quoted\"\n\ttabbed", "caf\xc3\xa9 \\ ok",
                           "bad \xff utf-8 left out", "caf\xc3\xa9 \\ ok"};
    assert_same(job, extra, 4);

    /* Every optional member, as after a fallback and a failover through an
     * upstream pool. */
    job->requested_model = "big-\"model\"";
    job->prefix_units = 12;
    job->upstream_meta = json_pack("{s:s,s:i,s:[s],s:f}", "agent_id", "up-1", "attempts", 2,
                                   "warnings", "w\u00e9", "ratio", 0.25);
    job->continuation_mode = "tokens";
    job->queue_ms = 1234567890123LL;
    job->attempts = 3;
    assert_same(job, NULL, 0);
    assert_same(job, extra, 2);
    /* A request's warning equal to the fallback's is listed once. */
    const char *dup[] = {"model 'big-\"model\"' had no capacity; served by fallback model 'm1'"};
    assert_same(job, dup, 1);
    char *one = tree_text(job, NULL, 0), *two = tree_text(job, dup, 1);
    assert_string_equal(one, two);
    free(one);
    free(two);
    job->model_digest[0] = '\0';
    job->prefix_units = 0;
    assert_same(job, extra, 1);
    /* A requested name long enough to be cut inside a UTF-8 sequence: the
     * warning json_string refuses is left out, in both. */
    char lng[300];
    memset(lng, 'a', sizeof lng);
    memcpy(lng + 255, "\xc3\xa9", 2);
    lng[299] = '\0';
    job->requested_model = lng;
    assert_same(job, extra, 1);
    job->requested_model = NULL;
    /* Not started on an agent: no agent id, inference_ms 0. */
    job->assigned_us = 0;
    job->agent_id[0] = '\0';
    assert_same(job, NULL, 0);
    fleet_free(&f);
}

/* gps_pool_meta_attach: NULL meta sets nothing; an object is set and
 * taken; a NULL body releases the meta (ASan's leak check sees it). */
static void test_attach(void **state)
{
    (void)state;
    json_t *o = json_object();
    assert_ptr_equal(gps_pool_meta_attach(o, NULL), o);
    assert_null(json_object_get(o, "x_pool_meta"));
    json_t *m = json_pack("{s:s}", "agent_id", "a1");
    assert_ptr_equal(gps_pool_meta_attach(o, m), o);
    assert_ptr_equal(json_object_get(o, "x_pool_meta"), m);
    assert_int_equal(m->refcount, 1); /* taken, not copied */
    json_decref(o);
    assert_null(gps_pool_meta_attach(NULL, json_pack("{s:s}", "agent_id", "a1")));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_matches_tree),
        cmocka_unit_test(test_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

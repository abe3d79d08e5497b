/* openai_embed: the upstream request of an embeddings job and the replies
 * the openai backend accepts (vectors placed by index, usage) or refuses
 * (nothing sent to the sink then). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/openai_embed.h"

typedef struct rec {
    int started, ends, n;
    int index[8], dim[8];
    float first[8];
    long long prompt_tokens;
} rec;

static void on_started(void *ctx) { ((rec *)ctx)->started++; }

static void on_embedding(void *ctx, int index, const float *v, int dim)
{
    rec *r = ctx;
    r->index[r->n] = index;
    r->dim[r->n] = dim;
    r->first[r->n] = v[0];
    r->n++;
}

static void on_end(void *ctx, const char *fr, long long pt, long long ct)
{
    rec *r = ctx;
    assert_string_equal(fr, "stop");
    assert_int_equal(ct, 0);
    r->prompt_tokens = pt;
    r->ends++;
}

static int deliver(const char *body, int n, rec *r, char *err, size_t errlen)
{
    agent_job_sink sink = {.ctx = r, .started = on_started, .embedding = on_embedding,
                           .end = on_end};
    memset(r, 0, sizeof *r);
    return oai_embed_deliver(body, strlen(body), n, &sink, err, errlen);
}

static void test_request(void **st)
{
    (void)st;
    char err[200];
    int n = 0;
    json_t *job = json_loads("{\"kind\":\"embeddings\",\"input\":[\"a b\",[1,2]]}", 0, NULL);
    json_t *req = oai_embed_request("up", job, &n, err, sizeof err);
    assert_non_null(req);
    assert_int_equal(n, 2);
    assert_string_equal(json_string_value(json_object_get(req, "model")), "up");
    assert_string_equal(json_string_value(json_object_get(req, "encoding_format")), "float");
    assert_true(json_equal(json_object_get(req, "input"), json_object_get(job, "input")));
    json_decref(req);
    json_object_set_new(job, "input", json_array());
    assert_null(oai_embed_request("up", job, &n, err, sizeof err));
    json_decref(job);
}

static void test_reply_by_index(void **st)
{
    (void)st;
    char err[200];
    rec r;
    assert_int_equal(deliver("{\"data\":[{\"index\":1,\"embedding\":[2,0.5]},"
                             "{\"index\":0,\"embedding\":[1.5,-1]}],"
                             "\"usage\":{\"prompt_tokens\":7}}",
                             2, &r, err, sizeof err),
                     0);
    assert_int_equal(r.started, 1);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.index[0], 0);
    assert_int_equal(r.index[1], 1);
    assert_int_equal(r.dim[0], 2);
    assert_true(r.first[0] == 1.5f && r.first[1] == 2.0f);
    assert_int_equal(r.ends, 1);
    assert_int_equal(r.prompt_tokens, 7);
    /* no index: in order; no usage: 0 */
    assert_int_equal(deliver("{\"data\":[{\"embedding\":[3]}]}", 1, &r, err, sizeof err), 0);
    assert_true(r.first[0] == 3.0f);
    assert_int_equal(r.prompt_tokens, 0);
}

static void test_bad_replies(void **st)
{
    (void)st;
    char err[200];
    rec r;
    const char *bad[] = {
        "not json",
        "{\"data\":[{\"index\":0,\"embedding\":[1]}]}",                                /* 1 of 2 */
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":0,\"embedding\":[2]}]}", /* repeat */
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":5,\"embedding\":[2]}]}", /* range */
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":1,\"embedding\":[2,3]}]}",
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":1,\"embedding\":[\"x\"]}]}",
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":1,\"embedding\":\"AAAA\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(deliver(bad[i], 2, &r, err, sizeof err), -1);
        assert_true(err[0] != '\0');
        assert_int_equal(r.started + r.n + r.ends, 0); /* nothing sent */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request),
        cmocka_unit_test(test_reply_by_index),
        cmocka_unit_test(test_bad_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* pins: model attestation (pins.h). The table (set, replace, delete, list
 * order, bad names and digests, the bound), and the filter applied to real
 * poll facts (registry_facts_parse): a model whose id or alias is pinned to
 * another digest, or that reports none, is dropped with its reason; a
 * matching one stays; the refusals per agent follow the latest poll and are
 * forgotten with the agent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/fleet/pins.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define AGENT "0b0e3c9e-6a43-4a59-9c8e-2f2d7b1c0a11"

static void test_table(void **st)
{
    (void)st;
    gps_pins *p = gps_pins_new();
    assert_non_null(p);
    assert_int_equal(gps_pins_set(p, "qwen", SHA_A, 5, "admin1"), 0);
    assert_int_equal(gps_pins_set(p, "llama", SHA_B, 6, NULL), 0);
    assert_string_equal(gps_pins_get(p, "qwen"), SHA_A);
    assert_int_equal(gps_pins_set(p, "qwen", SHA_B, 7, NULL), 0); /* replaces */
    assert_string_equal(gps_pins_get(p, "qwen"), SHA_B);
    assert_int_equal(gps_pins_count(p), 2);
    json_t *l = gps_pins_list(p);
    assert_int_equal(json_array_size(l), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "name")),
                        "llama");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(l, 1), "created_at")),
                     7);
    json_decref(l);
    /* Refused: names with spaces or empty, digests not 64 lower-case hex. */
    assert_int_equal(gps_pins_set(p, "", SHA_A, 0, NULL), -1);
    assert_int_equal(gps_pins_set(p, "a b", SHA_A, 0, NULL), -1);
    assert_int_equal(gps_pins_set(p, "x", "ABC", 0, NULL), -1);
    char upper[65];
    memset(upper, 'A', 64);
    upper[64] = '\0';
    assert_int_equal(gps_pins_set(p, "x", upper, 0, NULL), -1);
    assert_null(gps_pins_get(p, "x"));
    assert_int_equal(gps_pins_delete(p, "qwen"), 0);
    assert_int_equal(gps_pins_delete(p, "qwen"), 1);
    assert_null(gps_pins_get(p, "qwen"));
    gps_pins_free(p);
}

static void test_bound(void **st)
{
    (void)st;
    gps_pins *p = gps_pins_new();
    char name[32];
    for (int i = 0; i < GPS_PINS_MAX; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_int_equal(gps_pins_set(p, name, SHA_A, 0, NULL), 0);
    }
    assert_int_equal(gps_pins_set(p, "one-more", SHA_A, 0, NULL), -2);
    /* Replacing an existing pin is still fine when full. */
    assert_int_equal(gps_pins_set(p, "m0", SHA_B, 0, NULL), 0);
    gps_pins_free(p);
}

/* Poll facts with three models: qwen (digest A, alias "chat"), llama
 * (digest B), gpt (no digest). */
static void parse(registry_facts *f, const char *qwen_digest)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"agent_id\":\"" AGENT "\",\"slots\":{\"total\":2,\"busy\":0},\"models\":["
             "{\"id\":\"qwen\",\"aliases\":[\"chat\"],\"digest\":\"%s\"},"
             "{\"id\":\"llama\",\"digest\":\"" SHA_B "\"},"
             "{\"id\":\"gpt\"}]}",
             qwen_digest);
    json_t *j = json_loads(body, 0, NULL);
    assert_non_null(j);
    char err[256];
    assert_int_equal(registry_facts_parse(j, f, err, sizeof err), 0);
    json_decref(j);
}

static void test_filter(void **st)
{
    (void)st;
    gps_pins *p = gps_pins_new();
    registry_facts f;
    /* No pins: nothing dropped, nothing kept. */
    parse(&f, SHA_A);
    assert_int_equal(gps_pins_filter(p, &f), 0);
    assert_int_equal(f.n_models, 3);
    assert_null(gps_pins_refused(p, AGENT));
    registry_facts_free(&f);

    /* The alias "chat" pinned to B: qwen (A) is refused; llama pinned to its
     * own digest stays; gpt pinned: no digest, refused. */
    assert_int_equal(gps_pins_set(p, "chat", SHA_B, 0, NULL), 0);
    assert_int_equal(gps_pins_set(p, "llama", SHA_B, 0, NULL), 0);
    assert_int_equal(gps_pins_set(p, "gpt", SHA_A, 0, NULL), 0);
    parse(&f, SHA_A);
    assert_int_equal(gps_pins_filter(p, &f), 2);
    assert_int_equal(f.n_models, 1);
    assert_string_equal(f.models[0].id, "llama");
    registry_facts_free(&f);
    json_t *r = gps_pins_refused(p, AGENT);
    assert_int_equal(json_array_size(r), 2);
    json_t *q = json_array_get(r, 0);
    assert_string_equal(json_string_value(json_object_get(q, "model")), "qwen");
    assert_string_equal(json_string_value(json_object_get(q, "name")), "chat");
    assert_string_equal(json_string_value(json_object_get(q, "expected")), SHA_B);
    assert_string_equal(json_string_value(json_object_get(q, "got")), SHA_A);
    assert_non_null(strstr(json_string_value(json_object_get(q, "reason")), "does not match"));
    json_t *g = json_array_get(r, 1);
    assert_string_equal(json_string_value(json_object_get(g, "model")), "gpt");
    assert_true(json_is_null(json_object_get(g, "got")) || !json_object_get(g, "got"));
    assert_non_null(strstr(json_string_value(json_object_get(g, "reason")), "no sha256"));

    /* The agent swaps its qwen file for the pinned one and the gpt pin
     * goes: at its next poll nothing is refused any more. */
    assert_int_equal(gps_pins_delete(p, "gpt"), 0);
    parse(&f, SHA_B);
    assert_int_equal(gps_pins_filter(p, &f), 0);
    assert_int_equal(f.n_models, 3);
    registry_facts_free(&f);
    assert_null(gps_pins_refused(p, AGENT));

    /* Refused again, then the agent is removed: forgotten. */
    parse(&f, SHA_A);
    assert_int_equal(gps_pins_filter(p, &f), 1);
    registry_facts_free(&f);
    assert_non_null(gps_pins_refused(p, AGENT));
    gps_pins_forget(p, AGENT);
    assert_null(gps_pins_refused(p, AGENT));
    gps_pins_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_filter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

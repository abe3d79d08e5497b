/* The JSON Schema validator's compile (src/engine/jvalidate.c) under
 * allocation failure: gpe_jv_new_status either makes a validator that
 * checks every value as the one made with memory to spare does, or fails
 * with GPE_ERR_NOMEM ("out of memory"); never GPE_ERR_UNSUPPORTED, which
 * the agent reports as the client's INVALID_REQUEST (a 400 for a valid
 * response_format or strict tool), where out of memory is its own failure
 * (AGENT_OUT_OF_MEMORY: the job fails over).
 *
 * And gpe_jv_check_text gives the verdict it gives with memory to spare,
 * or GPE_JV_NOMEM: never "not JSON" (jansson reports an allocation that
 * failed as a syntax error) nor the verdict on another value (a byte it
 * dropped).
 *
 * The N-th allocation fails, for N = 1, 2, 3, ... until a run ends without
 * reaching it, as in test_jschema_oom.c: jansson's allocations and the
 * validator's own malloc, calloc, realloc, strdup and strndup (the linker's
 * --wrap: part-47-jvalidate-oom.cmake), through the server sweeps' failing
 * allocator (tests/unit/server/fixture_oom.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <gpupool/engine.h>

#include "common/gp_json.h"
#include "engine/jvalidate.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#define GPS_FIXTURE_OOM_STRNDUP
#include "../server/fixture_oom.h"

/* Every part of the compile that allocates: more schema objects than the
 * walk's first list of them holds (32) and more patterns and formats than
 * the first list of compiled ones (8), each pattern compiled (jregex), a
 * $ref used twice, unions, items and additionalProperties as schemas. */
#define N_PROPS 40

static json_t *rich_schema(void)
{
    json_t *props = json_object();
    for (int i = 0; i < N_PROPS; i++) {
        char key[16], pat[48];
        snprintf(key, sizeof key, "p%02d", i);
        snprintf(pat, sizeof pat, "^p%d[a-z]{0,4}(-[0-9]+)?$", i);
        json_object_set_new(props, key, json_pack("{s:s,s:s,s:i}", "type", "string",
                                                  "pattern", pat, "maxLength", 20));
    }
    json_object_set_new(props, "when", json_pack("{s:s,s:s}", "type", "string", "format",
                                                 "date-time"));
    json_object_set_new(props, "id", json_pack("{s:s,s:s}", "type", "string", "format",
                                               "uuid"));
    json_object_set_new(props, "home", json_pack("{s:s}", "$ref", "#/$defs/address"));
    json_object_set_new(props, "work", json_pack("{s:s}", "$ref", "#/$defs/address"));
    json_object_set_new(props, "value",
                        json_pack("{s:[{s:s},{s:s,s:i},{s:s,s:{s:s}}]}", "anyOf", "type",
                                  "null", "type", "integer", "minimum", 0, "type", "array",
                                  "items", "type", "boolean"));
    json_object_set_new(props, "counts",
                        json_pack("{s:s,s:{s:s}}", "type", "object", "additionalProperties",
                                  "type", "integer"));
    json_t *s = json_pack(
        "{s:s,s:{s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:s}},s:[s,s],s:b}},s:o,s:[s,s],s:b}", "type",
        "object", "$defs", "address", "type", "object", "properties", "street", "type",
        "string", "pattern", "^[A-Z][a-z ]+$", "zip", "type", "string", "pattern",
        "^[0-9]{5}(-[0-9]{4})?$", "required", "street", "zip", "additionalProperties", 0,
        "properties", props, "required", "p00", "when", "additionalProperties", 0);
    assert_non_null(s);
    return s;
}

/* Values the validators are compared on: each keyword the rich schema
 * uses, held and broken. */
static const char *const VALUES[] = {
    "{\"p00\":\"p0ab-12\",\"when\":\"2024-01-02T03:04:05Z\"}",
    "{\"p00\":\"p0ab\",\"p39\":\"p39x\",\"when\":\"2024-01-02T03:04:05Z\","
    "\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"home\":{\"street\":\"Main st\","
    "\"zip\":\"12345-6789\"},\"work\":{\"street\":\"Elm\",\"zip\":\"54321\"},\"value\":[true],"
    "\"counts\":{\"a\":1}}",
    "{\"p00\":\"p1ab\",\"when\":\"2024-01-02T03:04:05Z\"}",
    "{\"p00\":\"p0ab\",\"p39\":\"p38\",\"when\":\"2024-01-02T03:04:05Z\"}",
    "{\"p00\":\"p0ab\",\"when\":\"yesterday\"}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"id\":\"nope\"}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"home\":{\"street\":\"main\","
    "\"zip\":\"12345\"}}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"work\":{\"street\":\"Elm\","
    "\"zip\":\"1234\"}}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"value\":-1}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"counts\":{\"a\":\"1\"}}",
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"extra\":1}",
    "{\"when\":\"2024-01-02T03:04:05Z\"}",
};
#define N_VALUES (sizeof VALUES / sizeof VALUES[0])

/* Whether v checks every value as ref does (verdict and message). */
static bool same_checks(gpe_jv *v, gpe_jv *ref)
{
    for (size_t i = 0; i < N_VALUES; i++) {
        char m1[300], m2[300];
        gpe_jv_result r1 = gpe_jv_check_text(v, VALUES[i], strlen(VALUES[i]), m1, sizeof m1);
        gpe_jv_result r2 = gpe_jv_check_text(ref, VALUES[i], strlen(VALUES[i]), m2, sizeof m2);
        if (r1 != r2 || strcmp(m1, m2)) {
            print_message("value %zu: %d \"%s\", want %d \"%s\"\n", i, (int)r1, m1, (int)r2,
                          m2);
            return false;
        }
    }
    return true;
}

/* The reference checks what it should: the values are no tautology. */
static void test_reference(void **state)
{
    (void)state;
    json_t *schema = rich_schema();
    char err[256];
    gpe_status st = GPE_ERR_ARG;
    gpe_jv *ref = gpe_jv_new_status(schema, err, sizeof err, &st);
    json_decref(schema);
    assert_non_null(ref);
    assert_int_equal(st, GPE_OK);
    for (size_t i = 0; i < N_VALUES; i++) {
        char m[300];
        gpe_jv_result want = i < 2 ? GPE_JV_VALID : GPE_JV_INVALID;
        assert_int_equal(gpe_jv_check_text(ref, VALUES[i], strlen(VALUES[i]), m, sizeof m),
                         want);
    }
    gpe_jv_free(ref);
}

/* gpe_jv_new_status for N = 1, 2, ...: a validator that checks as the
 * unhurt one, or GPE_ERR_NOMEM with "out of memory". */
static void test_new_sweep(void **state)
{
    (void)state;
    json_t *schema = rich_schema();
    char err[256];
    gpe_jv *ref = gpe_jv_new(schema, err, sizeof err);
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        gpe_status st = GPE_OK;
        arm_libc(n);
        gpe_jv *v = gpe_jv_new_status(schema, err, sizeof err, &st);
        bool hit = disarm();
        if (v) {
            if (st != GPE_OK || !same_checks(v, ref)) {
                print_message("allocation %zu failed, the validator was made and checks "
                              "otherwise (status %d)\n", n, (int)st);
                bad++;
            }
            gpe_jv_free(v);
        } else if (!hit || st != GPE_ERR_NOMEM || strcmp(err, "out of memory")) {
            print_message("allocation %zu %s: status %d (want GPE_ERR_NOMEM %d), \"%s\"\n", n,
                          hit ? "failed" : "did not fail", (int)st, (int)GPE_ERR_NOMEM, err);
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("gpe_jv_new_status: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    gpe_jv_free(ref);
    json_decref(schema);
    assert_true(n > 50); /* the sweep reached the patterns and the lists' growth */
    assert_int_equal(bad, 0);
}

/* Text that is not JSON, or has an integer past 64 bits (the second load,
 * as reals): the check's loads under allocation failure too. */
static const char *const TEXTS[] = {
    "{\"p00\":\"p0ab\",\"when\":\"2024-01-02T03:04:05Z\",\"value\":"
    "123456789012345678901234567890}",
    "{\"p00\":\"p0ab\",\"when\":",
    "{\"p00\":\"p0ab\" \"when\":1}",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* The engine alone (no counter: arm_libc swaps jansson's allocator for
 * the fixture's), or with the host's counter (engine.h
 * gpe_set_json_alloc_failures: gp_json's, as the agent registers it; libc
 * fails beneath it, arm_beneath). */
static bool counted;

static void use_counter(bool on)
{
    counted = on;
    gp_json_init();
    gpe_set_json_alloc_failures(on ? gp_json_alloc_failures : NULL);
}

/* gpe_jv_check_text on text for N = 1, 2, ...: the verdict and message
 * of the check made with memory to spare, or GPE_JV_NOMEM ("out of
 * memory"); never "not JSON" for JSON, nor a value jansson read with a
 * byte dropped (a key or string another than the text's). */
static int check_sweep(gpe_jv *v, const char *text)
{
    char want[300], got[300];
    gpe_jv_result r0 = gpe_jv_check_text(v, text, strlen(text), want, sizeof want);
    int bad = 0;
    for (size_t n = 1;; n++) {
        got[0] = '\0';
        if (counted)
            arm_beneath(n);
        else
            arm_libc(n);
        gpe_jv_result r = gpe_jv_check_text(v, text, strlen(text), got, sizeof got);
        bool hit = disarm();
        bool same = r == r0 && strcmp(got, want) == 0;
        if (!same && !(hit && r == GPE_JV_NOMEM && strcmp(got, "out of memory") == 0)) {
            print_message("%.40s...%s: allocation %zu %s: %d \"%s\", want %d \"%s\" or "
                          "GPE_JV_NOMEM\n", text, counted ? " (counter)" : "", n,
                          hit ? "failed" : "did not fail", (int)r, got, (int)r0, want);
            bad++;
        }
        if (!hit)
            break;
    }
    return bad;
}

static void test_check_sweep(void **state)
{
    (void)state;
    json_t *schema = rich_schema();
    char err[256];
    gpe_jv *v = gpe_jv_new(schema, err, sizeof err);
    assert_non_null(v);
    int bad = 0;
    for (int on = 0; on <= 1; on++) {
        use_counter(on);
        for (size_t i = 0; i < N_VALUES; i++)
            bad += check_sweep(v, VALUES[i]);
        for (size_t i = 0; i < N_TEXTS; i++)
            bad += check_sweep(v, TEXTS[i]);
    }
    use_counter(false);
    print_message("gpe_jv_check_text: %d runs broke the rule\n", bad);
    gpe_jv_free(v);
    json_decref(schema);
    assert_int_equal(bad, 0);
}

/* Refusals keep their statuses and messages: not out of memory. */
static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        const char *msg;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"(?=x)\"}", " at #"},
        {"{\"properties\":{\"a\":{\"format\":\"hostname\"}}}", "'format' 'hostname'"},
        {"{\"not\":{}}", "unsupported JSON Schema keyword 'not'"},
        {"{\"$ref\":\"#/$defs/none\"}", "'$ref' at #"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *s = J(cases[i].schema);
        char err[256] = "";
        gpe_status st = GPE_OK;
        assert_null(gpe_jv_new_status(s, err, sizeof err, &st));
        assert_int_equal(st, GPE_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, cases[i].msg));
        json_decref(s);
    }
    char err[256];
    gpe_status st = GPE_OK;
    assert_null(gpe_jv_new_status(NULL, err, sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    /* st may be NULL; gpe_jv_new is the same without it */
    json_t *s = J("{\"type\":\"integer\"}");
    gpe_jv *v = gpe_jv_new_status(s, err, sizeof err, NULL);
    assert_non_null(v);
    gpe_jv_free(v);
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_new_sweep),
        cmocka_unit_test(test_check_sweep),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* POST /agents/enroll: the body rules (gps_agents_enroll_parse). The
 * handler turns a refusal into 400 INVALID_REQUEST with the field named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/agents_api.h"

#define UUID "8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f"

/* Parse text; returns rc and fills the outputs (param NULL when none). */
static int parse(const char *text, const char **id, const char **name, const char **param,
                 json_t **keep)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    char err[160] = "";
    int rc = gps_agents_enroll_parse(j, id, name, param, err, sizeof err);
    if (rc < 0)
        assert_true(err[0] != '\0');
    *keep = j; /* outputs borrow from it */
    return rc;
}

static void test_ok(void **st)
{
    (void)st;
    const char *id, *name, *param;
    json_t *j;
    assert_int_equal(parse("{\"agent_id\":\"" UUID "\",\"name\":\"gpu-box-1\"}", &id, &name,
                           &param, &j), 0);
    assert_string_equal(id, UUID);
    assert_string_equal(name, "gpu-box-1");
    assert_null(param);
    json_decref(j);
    /* name optional (null or absent: ""); unknown fields ignored. */
    assert_int_equal(parse("{\"agent_id\":\"" UUID "\"}", &id, &name, &param, &j), 0);
    assert_string_equal(name, "");
    json_decref(j);
    assert_int_equal(parse("{\"agent_id\":\"" UUID "\",\"name\":null,\"x\":1}", &id, &name,
                           &param, &j), 0);
    assert_string_equal(name, "");
    json_decref(j);
}

static void test_agent_id_rules(void **st)
{
    (void)st;
    const char *bad[] = {
        "{}",
        "{\"agent_id\":null}",
        "{\"agent_id\":42}",
        "{\"agent_id\":\"\"}",
        "{\"agent_id\":\"gpu-box-1\"}",
        "{\"agent_id\":\"" UUID "x\"}",
        "{\"agent_id\":\"" UUID "\\u0000\"}",
        "{\"agent_id\":\"8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f-8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *id, *name, *param;
        json_t *j;
        assert_int_equal(parse(bad[i], &id, &name, &param, &j), -1);
        assert_non_null(param);
        assert_string_equal(param, "agent_id");
        assert_null(id);
        json_decref(j);
    }
}

static void test_name_rules(void **st)
{
    (void)st;
    char big[400];
    snprintf(big, sizeof big, "{\"agent_id\":\"" UUID "\",\"name\":\"%0257d\"}", 0);
    const char *bad[] = {
        "{\"agent_id\":\"" UUID "\",\"name\":7}",
        "{\"agent_id\":\"" UUID "\",\"name\":[\"a\"]}",
        "{\"agent_id\":\"" UUID "\",\"name\":\"a\\nb\"}",
        "{\"agent_id\":\"" UUID "\",\"name\":\"a\\u0000b\"}",
        "{\"agent_id\":\"" UUID "\",\"name\":\"a\\u007fb\"}",
        big,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *id, *name, *param;
        json_t *j;
        assert_int_equal(parse(bad[i], &id, &name, &param, &j), -1);
        assert_non_null(param);
        assert_string_equal(param, "name");
        json_decref(j);
    }
    /* 256 bytes is the limit, UTF-8 is fine. */
    snprintf(big, sizeof big, "{\"agent_id\":\"" UUID "\",\"name\":\"%0256d\"}", 0);
    const char *id, *name, *param;
    json_t *j;
    assert_int_equal(parse(big, &id, &name, &param, &j), 0);
    assert_int_equal(strlen(name), 256);
    json_decref(j);
    assert_int_equal(parse("{\"agent_id\":\"" UUID "\",\"name\":\"caf\\u00e9\"}", &id, &name,
                           &param, &j), 0);
    json_decref(j);
}

static void test_not_object(void **st)
{
    (void)st;
    const char *texts[] = {"[]", "\"x\"", "null"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        const char *id, *name, *param;
        json_t *j;
        assert_int_equal(parse(texts[i], &id, &name, &param, &j), -1);
        assert_null(param);
        json_decref(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ok),
        cmocka_unit_test(test_agent_id_rules),
        cmocka_unit_test(test_name_rules),
        cmocka_unit_test(test_not_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

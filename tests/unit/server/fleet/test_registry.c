/*
 * Unit tests for the registry: poll parsing, the health state machine at its
 * exact time boundaries (fake clock), the weight ramp, draining, the model
 * index and the expiry lists.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "server/fleet/registry.h"

#define T0 1000000ULL   /* fake clock start */

/* ------------------------------------------------------------ helpers */

typedef struct trans {
    char id[37];
    registry_state from, to;
    char reason[32];
    uint64_t at;
} trans;

static trans g_tr[64];
static size_t g_ntr;

static void listener(void *ud, registry_agent *a, registry_state o, registry_state n,
                     const char *reason, uint64_t now)
{
    (void)ud;
    if (g_ntr < 64) {
        trans *t = &g_tr[g_ntr];
        memcpy(t->id, a->id, 37);
        t->from = o;
        t->to = n;
        snprintf(t->reason, sizeof(t->reason), "%s", reason);
        t->at = now;
    }
    g_ntr++;
}

static registry *mkreg(uint64_t grace)
{
    registry_config c;
    registry_config_default(&c);
    c.grace_ms = grace;
    c.listener = listener;
    g_ntr = 0;
    return registry_create(&c);
}

static void agent_uuid(int i, char out[37])
{
    snprintf(out, 37, "00000000-0000-4000-8000-%012d", i);
}

/* Poll for agent i with a JSON models array and optional labels/status. */
static registry_agent *poll_json(registry *reg, int i, const char *models_json,
                                 const char *extra_json, uint64_t now)
{
    char id[37];
    agent_uuid(i, id);
    char body[4096];
    snprintf(body, sizeof(body),
             "{\"agent_id\":\"%s\",\"name\":\"agent-%d\",\"version\":\"0.1.0\","
             "\"platform\":\"linux-x86_64\",\"models\":%s,\"slots\":{\"total\":4,\"busy\":0}%s%s}",
             id, i, models_json, extra_json ? "," : "", extra_json ? extra_json : "");
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    assert_non_null(j);
    registry_facts f;
    char err[256] = "";
    int rc = registry_facts_parse(j, &f, err, sizeof(err));
    if (rc != 0)
        fail_msg("parse failed: %s", err);
    json_decref(j);
    registry_agent *a = registry_heartbeat(reg, &f, now, 1700000000000LL + (int64_t)now);
    registry_facts_free(&f);
    assert_non_null(a);
    return a;
}

static registry_agent *poll1(registry *reg, int i, uint64_t now)
{
    return poll_json(reg, i, "[{\"id\":\"m1\",\"aliases\":[\"tiny\"]}]", NULL, now);
}

static int parse_err(const char *body, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    assert_non_null(j);
    registry_facts f;
    int rc = registry_facts_parse(j, &f, err, errlen);
    registry_facts_free(&f);
    json_decref(j);
    return rc;
}

/* -------------------------------------------------------------- tests */

static void test_parse_valid(void **st)
{
    (void)st;
    const char *body =
        "{\"agent_id\":\"8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f\",\"name\":\"gpu-box-1\","
        "\"version\":\"0.1.0\",\"platform\":\"linux-x86_64\",\"gpus\":[],"
        "\"models\":[{\"id\":\"stories260K\",\"aliases\":[\"tiny\"],\"quantization\":\"F32\","
        "\"context_length\":512,\"vram_bytes\":0,\"loaded\":true,\"architecture\":\"llama\","
        "\"bytes\":1185376}],\"slots\":{\"total\":4,\"busy\":1},\"queue_depth\":2,"
        "\"kv_cache_utilization\":0.12,\"labels\":{\"region\":\"eu\"},\"status\":\"draining\","
        "\"junk\":[1,2,3]}";
    json_t *j = json_loads(body, 0, NULL);
    registry_facts f;
    char err[128];
    assert_int_equal(registry_facts_parse(j, &f, err, sizeof(err)), 0);
    assert_string_equal(f.agent_id, "8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f");
    assert_string_equal(f.name, "gpu-box-1");
    assert_int_equal(f.n_models, 1);
    assert_string_equal(f.models[0].id, "stories260K");
    assert_int_equal(f.models[0].n_aliases, 1);
    assert_string_equal(f.models[0].aliases[0], "tiny");
    assert_string_equal(f.models[0].quantization, "F32");
    assert_int_equal(f.models[0].context_length, 512);
    assert_int_equal(f.models[0].bytes, 1185376);
    assert_int_equal(f.slots_total, 4);
    assert_int_equal(f.slots_busy, 1);
    assert_int_equal(f.queue_depth, 2);
    assert_true(f.draining);
    assert_int_equal(f.n_labels, 1);
    assert_string_equal(f.labels[0].key, "region");
    assert_string_equal(f.labels[0].value, "eu");
    /* Only the known fields are kept (issue 25): not the models (parsed
     * above), not an unknown field. */
    assert_non_null(f.raw);
    assert_ptr_not_equal(f.raw, j);
    assert_non_null(json_object_get(f.raw, "labels"));
    assert_null(json_object_get(f.raw, "models"));
    assert_null(json_object_get(f.raw, "agent_id"));
    assert_null(json_object_get(f.raw, "junk"));
    registry_facts_free(&f);
    json_decref(j);
}

static void test_parse_errors(void **st)
{
    (void)st;
    char err[256];
    const char *id = "\"agent_id\":\"8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f\"";
    char b[512];
    struct { const char *rest; const char *field; } cases[] = {
        {"\"models\":[],\"slots\":{\"total\":0}", "slots.total"},
        {"\"models\":[],\"slots\":{\"total\":1,\"busy\":-1}", "slots.busy"},
        {"\"models\":{},\"slots\":{\"total\":1}", "models"},
        {"\"slots\":{\"total\":1}", "models"},
        {"\"models\":[{\"id\":\"\"}],\"slots\":{\"total\":1}", "models[0].id"},
        {"\"models\":[{\"id\":\"a\"},{\"id\":7}],\"slots\":{\"total\":1}", "models[1].id"},
        {"\"models\":[{\"id\":\"a\",\"aliases\":[1]}],\"slots\":{\"total\":1}", "aliases[0]"},
        {"\"models\":[{\"id\":\"a\",\"context_length\":-5}],\"slots\":{\"total\":1}",
         "context_length"},
        {"\"models\":[],\"slots\":{\"total\":1},\"status\":\"sleeping\"", "status"},
        {"\"models\":[],\"slots\":{\"total\":1},\"labels\":{\"region\":3}", "labels.region"},
        {"\"models\":[],\"slots\":{\"total\":1},\"kv_cache_utilization\":2", "kv_cache"},
        {"\"models\":[],\"slots\":{\"total\":1},\"name\":5", "name"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(b, sizeof(b), "{%s,%s}", id, cases[i].rest);
        err[0] = '\0';
        assert_int_equal(parse_err(b, err, sizeof(err)), -1);
        if (!strstr(err, cases[i].field))
            fail_msg("case %zu: message '%s' does not name '%s'", i, err, cases[i].field);
    }
    assert_int_equal(parse_err("{\"agent_id\":\"nope\",\"models\":[],\"slots\":{\"total\":1}}",
                               err, sizeof(err)), -1);
    assert_non_null(strstr(err, "agent_id"));
    assert_int_equal(parse_err("[1,2]", err, sizeof(err)), -1);
    assert_int_equal(parse_err("{\"models\":[],\"slots\":{\"total\":1}}", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "agent_id"));
}

static void test_register_and_boundaries(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll1(reg, 1, T0);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_int_equal(g_ntr, 1);
    assert_int_equal(g_tr[0].from, REGISTRY_REGISTERING);
    assert_int_equal(g_tr[0].to, REGISTRY_HEALTHY);
    assert_string_equal(g_tr[0].reason, "registered");
    assert_ptr_equal(registry_get(reg, a->id), a);
    assert_int_equal(registry_count_state(reg, REGISTRY_HEALTHY), 1);

    assert_int_equal(registry_next_deadline(reg), T0 + 15000 + 1);
    assert_int_equal(registry_tick(reg, T0 + 15000 - 1), 0);   /* interval - 1 */
    assert_int_equal(registry_tick(reg, T0 + 15000), 0);       /* exactly on time */
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_int_equal(registry_tick(reg, T0 + 15000 + 1), 1);   /* interval + 1 */
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    assert_int_equal(g_tr[1].from, REGISTRY_HEALTHY);
    assert_int_equal(g_tr[1].to, REGISTRY_SUSPECT);
    assert_string_equal(g_tr[1].reason, "missed_heartbeat");
    assert_int_equal(a->state_since_ms, T0 + 15001);
    /* still served (suspect is live) */
    assert_int_equal(registry_model_live_count(reg, "m1"), 1);

    assert_int_equal(registry_next_deadline(reg), T0 + 90000);
    assert_int_equal(registry_tick(reg, T0 + 90000 - 1), 0);
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    assert_int_equal(registry_tick(reg, T0 + 90000), 1);       /* timeout -> dead */
    assert_int_equal(a->state, REGISTRY_DEAD);
    assert_int_equal(g_tr[2].from, REGISTRY_SUSPECT);
    assert_int_equal(g_tr[2].to, REGISTRY_DEAD);
    assert_string_equal(g_tr[2].reason, "timeout");
    assert_int_equal(registry_model_live_count(reg, "m1"), 0);
    assert_true(registry_model_known(reg, "m1"));
    assert_int_equal(registry_next_deadline(reg), UINT64_MAX);
    assert_int_equal(registry_tick(reg, T0 + 10000000), 0);

    /* dead -> healthy again on the next poll (re-registration), ramping */
    poll1(reg, 1, T0 + 100000);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_string_equal(g_tr[3].reason, "reregistered");
    assert_int_equal(g_tr[3].from, REGISTRY_DEAD);
    assert_int_equal(registry_model_live_count(reg, "m1"), 1);
    assert_true(registry_agent_weight(reg, a, T0 + 100000) < 0.01);
    registry_destroy(reg);
}

static void test_grace_default(void **st)
{
    (void)st;
    registry *reg = mkreg(5000);
    registry_agent *a = poll1(reg, 1, T0);
    assert_int_equal(registry_tick(reg, T0 + 20000), 0);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_int_equal(registry_tick(reg, T0 + 20001), 1);
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    registry_destroy(reg);
}

static void test_heartbeat_keeps_healthy(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll1(reg, 1, T0);
    for (int k = 1; k <= 20; k++) {
        poll1(reg, 1, T0 + (uint64_t)k * 15000);
        assert_int_equal(registry_tick(reg, T0 + (uint64_t)k * 15000 + 14999), 0);
    }
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_int_equal(g_ntr, 1);
    registry_destroy(reg);
}

static void test_revive_and_ramp(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll1(reg, 1, T0);
    assert_true(registry_agent_weight(reg, a, T0) == 1.0);   /* new agents: no ramp */
    registry_tick(reg, T0 + 20000);
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    uint64_t r = T0 + 30000;
    poll1(reg, 1, r);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_int_equal(g_tr[g_ntr - 1].from, REGISTRY_SUSPECT);
    assert_string_equal(g_tr[g_ntr - 1].reason, "heartbeat");
    assert_true(registry_agent_weight(reg, a, r) == 0.0);
    assert_true(registry_agent_weight(reg, a, r + 15000) > 0.2499 &&
                registry_agent_weight(reg, a, r + 15000) < 0.2501);
    assert_true(registry_agent_weight(reg, a, r + 30000) > 0.4999 &&
                registry_agent_weight(reg, a, r + 30000) < 0.5001);
    assert_true(registry_agent_weight(reg, a, r + 59999) < 1.0);
    assert_true(registry_agent_weight(reg, a, r + 60000) == 1.0);
    assert_true(registry_agent_weight(reg, a, r + 600000) == 1.0);
    registry_destroy(reg);
}

static void test_mark_suspect(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll1(reg, 1, T0);
    poll1(reg, 2, T0);
    /* the parked long-poll dropped 2 s after the last poll: suspect at once */
    assert_true(registry_mark_suspect(reg, a, T0 + 2000, NULL));
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    assert_string_equal(g_tr[g_ntr - 1].reason, "poll_disconnected");
    assert_false(registry_mark_suspect(reg, a, T0 + 2001, NULL));  /* already */
    /* dead agent_timeout after the last poll, not after the disconnect */
    registry_touch(reg, registry_get(reg, "00000000-0000-4000-8000-000000000002"), T0 + 14000);
    assert_int_equal(registry_tick(reg, T0 + 89999), 1);  /* agent 2 -> suspect */
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    assert_int_equal(registry_tick(reg, T0 + 90000), 1);
    assert_int_equal(a->state, REGISTRY_DEAD);
    assert_false(registry_mark_suspect(reg, a, T0 + 90001, NULL));
    registry_destroy(reg);
}

static void test_draining(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll1(reg, 1, T0);
    registry_set_drain(reg, a, true, T0 + 1);
    assert_int_equal(a->state, REGISTRY_DRAINING);
    assert_string_equal(g_tr[g_ntr - 1].reason, "drain");
    assert_int_equal(registry_model_live_count(reg, "m1"), 0);   /* no new jobs */
    /* heartbeats keep it draining (the admin flag sticks) */
    poll1(reg, 1, T0 + 1000);
    assert_int_equal(a->state, REGISTRY_DRAINING);
    /* missed heartbeat -> suspect -> heartbeat -> back to draining */
    registry_tick(reg, T0 + 17000);
    assert_int_equal(a->state, REGISTRY_SUSPECT);
    poll1(reg, 1, T0 + 18000);
    assert_int_equal(a->state, REGISTRY_DRAINING);
    registry_set_drain(reg, a, false, T0 + 19000);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    assert_string_equal(g_tr[g_ntr - 1].reason, "undrain");
    /* the agent itself reports draining, then online again */
    poll_json(reg, 1, "[{\"id\":\"m1\"}]", "\"status\":\"draining\"", T0 + 20000);
    assert_int_equal(a->state, REGISTRY_DRAINING);
    registry_set_drain(reg, a, false, T0 + 20001);   /* agent still says draining */
    assert_int_equal(a->state, REGISTRY_DRAINING);
    poll_json(reg, 1, "[{\"id\":\"m1\"}]", "\"status\":\"online\"", T0 + 21000);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    /* graceful deregistration */
    registry_deregister(reg, a, T0 + 22000);
    assert_int_equal(a->state, REGISTRY_OFFLINE);
    assert_int_equal(registry_model_live_count(reg, "m1"), 0);
    assert_int_equal(registry_tick(reg, T0 + 1000000), 0);   /* offline never expires */
    registry_destroy(reg);
}

static void test_model_index(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    assert_false(registry_model_known(reg, "m1"));
    registry_agent *a = poll_json(reg, 1, "[{\"id\":\"m1\",\"aliases\":[\"tiny\"]},{\"id\":\"m2\"}]",
                                  NULL, T0);
    poll_json(reg, 2, "[{\"id\":\"m2\"},{\"id\":\"b-model\"}]", NULL, T0 + 5);
    assert_true(registry_model_known(reg, "m1"));
    assert_true(registry_model_known(reg, "tiny"));
    assert_false(registry_model_known(reg, "m3"));
    assert_int_equal(registry_model_live_count(reg, "tiny"), 1);
    assert_int_equal(registry_model_live_count(reg, "m2"), 2);
    assert_true(registry_agent_serves(a, "tiny"));
    assert_false(registry_agent_serves(a, "b-model"));

    size_t n;
    registry_model_entry *l;
    assert_int_equal(registry_models_list(reg, &l, &n), 0);
    assert_int_equal(n, 3);   /* ids only, no aliases, sorted */
    assert_string_equal(l[0].id, "b-model");
    assert_string_equal(l[1].id, "m1");
    assert_string_equal(l[2].id, "m2");
    assert_int_equal(l[1].created_wall_ms, 1700000000000LL + (int64_t)T0);
    assert_int_equal(l[0].created_wall_ms, 1700000000000LL + (int64_t)T0 + 5);
    assert_int_equal(l[2].live_agents, 2);
    free(l);

    /* agent 1 drops m1: index updated, m1 still known, created time kept */
    uint32_t gen = a->models_gen;
    poll_json(reg, 1, "[{\"id\":\"m2\"}]", NULL, T0 + 1000);
    assert_true(a->models_gen != gen);
    assert_int_equal(registry_model_live_count(reg, "m1"), 0);
    assert_int_equal(registry_model_live_count(reg, "tiny"), 0);
    assert_true(registry_model_known(reg, "m1"));
    assert_int_equal(registry_models_list(reg, &l, &n), 0);
    assert_int_equal(n, 2);
    free(l);
    /* same list again: generation unchanged */
    gen = a->models_gen;
    poll_json(reg, 1, "[{\"id\":\"m2\"}]", NULL, T0 + 2000);
    assert_int_equal(a->models_gen, gen);
    /* m1 comes back: created stays at first sight */
    poll_json(reg, 1, "[{\"id\":\"m1\"}]", NULL, T0 + 3000);
    assert_int_equal(registry_models_list(reg, &l, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(l[1].created_wall_ms, 1700000000000LL + (int64_t)T0);
    free(l);

    /* restored names are known without any agent */
    assert_int_equal(registry_model_note(reg, "old-model", 5), 0);
    assert_true(registry_model_known(reg, "old-model"));
    assert_int_equal(registry_model_live_count(reg, "old-model"), 0);

    /* all agents gone: empty list */
    registry_deregister(reg, registry_get(reg, "00000000-0000-4000-8000-000000000001"), T0 + 4000);
    registry_deregister(reg, registry_get(reg, "00000000-0000-4000-8000-000000000002"), T0 + 4000);
    assert_int_equal(registry_models_list(reg, &l, &n), 0);
    assert_null(l);
    assert_int_equal(n, 0);
    registry_destroy(reg);
}

/* What a model's request may assume of the agents serving it: the
 * smallest context any live one reports (suspect still counts: it may get
 * the job), and the healthy ones' slots. */
static void test_model_capacity(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll_json(reg, 1, "[{\"id\":\"m1\",\"context_length\":4096}]", NULL, T0);
    registry_agent *b = poll_json(
        reg, 2, "[{\"id\":\"m2\"},{\"id\":\"m1b\",\"aliases\":[\"m1\"],\"context_length\":2048}]",
        NULL, T0);
    poll_json(reg, 3, "[{\"id\":\"m1\"}]", NULL, T0); /* reports no context */
    poll_json(reg, 4, "[{\"id\":\"m2\",\"context_length\":1024}]", NULL, T0);
    assert_int_equal(registry_model_min_context(reg, "m1"), 2048);   /* b, by its alias */
    assert_int_equal(registry_model_slots(reg, "m1"), 12);           /* 4 each */
    assert_int_equal(registry_model_min_context(reg, "m2"), 1024);
    assert_int_equal(registry_model_min_context(reg, "none"), 0);
    assert_int_equal(registry_model_slots(reg, "none"), 0);

    /* suspect: still live for the context, no longer counted as slots */
    assert_true(registry_mark_suspect(reg, b, T0 + 10, NULL));
    assert_int_equal(registry_model_min_context(reg, "m1"), 2048);
    assert_int_equal(registry_model_slots(reg, "m1"), 8);
    /* gone: its context no longer binds */
    registry_deregister(reg, b, T0 + 20);
    assert_int_equal(registry_model_min_context(reg, "m1"), 4096);
    registry_deregister(reg, a, T0 + 30);
    assert_int_equal(registry_model_min_context(reg, "m1"), 0);
    assert_int_equal(registry_model_slots(reg, "m1"), 4);
    registry_destroy(reg);
}

static void test_counters_and_labels(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    registry_agent *a = poll_json(reg, 1, "[{\"id\":\"m1\"}]",
                                  "\"labels\":{\"region\":\"eu\",\"gpu\":\"4090\"}", T0);
    assert_string_equal(registry_agent_label(a, "region"), "eu");
    assert_string_equal(registry_agent_label(a, "gpu"), "4090");
    assert_null(registry_agent_label(a, "zone"));
    assert_true(registry_agent_reliability(a) == 0.5);
    registry_job_begin(reg, a);
    registry_job_begin(reg, a);
    assert_int_equal(a->active, 2);
    registry_job_end(reg, a, true, 100.0);
    assert_true(a->tokens_per_sec == 100.0);
    registry_job_end(reg, a, false, 200.0);
    assert_true(a->tokens_per_sec > 129.99 && a->tokens_per_sec < 130.01);  /* 0.7*100+0.3*200 */
    assert_int_equal(a->active, 0);
    registry_job_end(reg, a, true, 0);   /* unbalanced end: active stays >= 0 */
    assert_int_equal(a->active, 0);
    assert_int_equal(a->jobs_done, 2);
    assert_int_equal(a->jobs_failed, 1);
    assert_true(registry_agent_reliability(a) == 3.0 / 5.0);
    /* labels change bumps the generation */
    uint32_t gen = a->models_gen;
    poll_json(reg, 1, "[{\"id\":\"m1\"}]", "\"labels\":{\"region\":\"us\"}", T0 + 1);
    assert_true(a->models_gen != gen);
    assert_string_equal(registry_agent_label(a, "region"), "us");
    registry_remove(reg, a);
    assert_int_equal(registry_count(reg), 0);
    assert_int_equal(registry_model_live_count(reg, "m1"), 0);
    registry_destroy(reg);
}


/* Every field replaced by every JSON type: parsing either succeeds or fails
 * with a message, never crashes (run under ASan/UBSan). */
static void test_parse_type_confusion(void **st)
{
    (void)st;
    const char *fields[] = {"agent_id", "name", "version", "platform", "models", "slots",
                            "queue_depth", "kv_cache_utilization", "labels", "status", "gpus"};
    const char *values[] = {"null", "true", "0", "-1", "1e308", "9223372036854775807", "\"\"",
                            "\"x\"", "[]", "[null]", "[{}]", "[{\"id\":\"a\",\"aliases\":{}}]",
                            "{}", "{\"total\":\"4\"}", "{\"total\":4,\"busy\":4096}",
                            "{\"a\":{}}", "[[[]]]"};
    char err[256];
    int ok = 0, bad = 0;
    for (size_t fi = 0; fi < sizeof(fields) / sizeof(fields[0]); fi++) {
        for (size_t vi = 0; vi < sizeof(values) / sizeof(values[0]); vi++) {
            json_t *body = json_loads("{\"agent_id\":\"8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f\","
                                      "\"models\":[{\"id\":\"m\"}],\"slots\":{\"total\":2}}",
                                      0, NULL);
            json_t *v = json_loads(values[vi], JSON_DECODE_ANY, NULL);
            assert_non_null(body);
            assert_non_null(v);
            json_object_set_new(body, fields[fi], v);
            registry_facts f;
            err[0] = '\0';
            if (registry_facts_parse(body, &f, err, sizeof(err)) == 0) {
                ok++;
                registry *reg = mkreg(0);
                assert_non_null(registry_heartbeat(reg, &f, T0, 0));
                registry_destroy(reg);
            } else {
                bad++;
                assert_true(strlen(err) > 0);
            }
            registry_facts_free(&f);
            json_decref(body);
        }
    }
    assert_true(ok > 0 && bad > 0);
}

/* Many agents with staggered heartbeats: each tick reports exactly the
 * overdue ones (the expiry list is ordered, no full scan needed). */
static void test_many_agents_expiry(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    const int N = 10000;
    for (int i = 0; i < N; i++)
        poll1(reg, i, T0 + (uint64_t)i);     /* agent i last seen at T0 + i */
    assert_int_equal(registry_count(reg), N);
    g_ntr = 0;
    /* at T0+15000+k, agents 0..k-1 are overdue */
    assert_int_equal(registry_tick(reg, T0 + 15000 + 100), 100);
    assert_int_equal(registry_tick(reg, T0 + 15000 + 100), 0);
    /* agents 100..109 heartbeat again: they leave the overdue set */
    for (int i = 100; i < 110; i++)
        poll1(reg, i, T0 + 15100);
    assert_int_equal(registry_tick(reg, T0 + 15000 + 200), 90);
    assert_int_equal(registry_count_state(reg, REGISTRY_SUSPECT), 190);
    struct timespec t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    size_t k = registry_tick(reg, T0 + 15000 + 201);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    assert_int_equal(k, 1);
    printf("registry_tick with %d agents, 1 transition: %ld ns\n", N,
           (long)((t2.tv_sec - t1.tv_sec) * 1000000000L + (t2.tv_nsec - t1.tv_nsec)));
    assert_int_equal(registry_tick(reg, T0 + 90000 + 200), 191 + (N - 201) + 10);
    registry_destroy(reg);
}


/* Issue 13, prompt-prefix cache: an agent's "prefix_cache" facts are kept
 * (counters, per-slot descriptors) and a request's message chain matches
 * the free slot that advertises the longest prefix of it; bad facts are
 * refused naming the field. */
static json_t *chat_job(const char *last, const char *tools)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"kind\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":"
             "\"Hello!\"}%s%s%s]%s%s}",
             last ? ",{\"role\":\"user\",\"content\":\"" : "", last ? last : "",
             last ? "\"}" : "", tools ? ",\"tools\":" : "", tools ? tools : "");
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    assert_non_null(j);
    return j;
}

static void test_prefix_facts(void **st)
{
    (void)st;
    registry *reg = mkreg(0);
    /* slot 0 holds the 3-message conversation, slot 1 (busy) the same */
    json_t *held = chat_job(NULL, NULL);
    gp_prefix_chain c;
    assert_int_equal(gp_prefix_chain_of_job(held, &c), 0);
    assert_int_equal(c.units, 3);
    assert_string_equal(c.kind, "messages");
    gp_prefix_desc d;
    gp_prefix_desc_of_chain(&c, &d);
    assert_int_equal(d.n_pts, 3);   /* 1, 2, 3 */
    json_t *dj = gp_prefix_desc_json(&d);
    char *djs = json_dumps(dj, JSON_COMPACT);
    char extra[1600];
    snprintf(extra, sizeof extra,
             "\"prefix_cache\":{\"enabled\":true,\"lookups\":9,\"hits\":4,\"tokens_saved\":700,"
             "\"tokens_computed\":300,\"slots\":[{\"slot\":0,\"busy\":false,\"tokens\":120,"
             "\"prefix\":%s},{\"slot\":1,\"busy\":true,\"tokens\":99,\"prefix\":%s}]}",
             djs, djs);
    registry_agent *a = poll_json(reg, 1, "[{\"id\":\"m1\"}]", extra, 10);
    assert_true(a->prefix.reported);
    assert_true(a->prefix.enabled);
    assert_int_equal(a->prefix.lookups, 9);
    assert_int_equal(a->prefix.hits, 4);
    assert_int_equal(a->prefix.tokens_saved, 700);
    assert_int_equal(a->prefix.tokens_computed, 300);
    assert_int_equal(a->prefix.n_slots, 2);

    /* The next turn (one more message) matches all 3 held messages. */
    json_t *next = chat_job("And now?", NULL);
    gp_prefix_chain rc;
    assert_int_equal(gp_prefix_chain_of_job(next, &rc), 0);
    assert_int_equal(rc.units, 4);
    int slot = -1;
    long long tokens = 0;
    assert_int_equal(registry_agent_prefix_match(a, &rc, &slot, &tokens), 3);
    assert_int_equal(slot, 0);
    assert_int_equal(tokens, 120);
    gp_prefix_chain_free(&rc);
    /* Another tenant's identical conversation shares no hash: no match;
     * an empty tag is no tag. */
    json_object_set_new(next, "tenant", json_string("0123456789abcdef0123456789abcdef"));
    assert_int_equal(gp_prefix_chain_of_job(next, &rc), 0);
    assert_int_equal(rc.units, 4);
    assert_int_equal(registry_agent_prefix_match(a, &rc, NULL, NULL), 0);
    gp_prefix_chain_free(&rc);
    json_object_set_new(next, "tenant", json_string(""));
    assert_int_equal(gp_prefix_chain_of_job(next, &rc), 0);
    assert_int_equal(registry_agent_prefix_match(a, &rc, NULL, NULL), 3);
    gp_prefix_chain_free(&rc);
    /* Other tools change what precedes the messages: no match. */
    json_t *tooled = chat_job("And now?", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
    assert_int_equal(gp_prefix_chain_of_job(tooled, &rc), 0);
    assert_int_equal(registry_agent_prefix_match(a, &rc, NULL, NULL), 0);
    gp_prefix_chain_free(&rc);
    /* A text prompt: whole 1 KiB blocks only; never matches messages. */
    char *big = malloc(2600);
    memset(big, 'x', 2599);
    big[2599] = '\0';
    json_t *tj = json_pack("{s:s}", "prompt", big);
    assert_int_equal(gp_prefix_chain_of_job(tj, &rc), 0);
    assert_int_equal(rc.units, 2);
    assert_string_equal(rc.kind, "text");
    assert_int_equal(registry_agent_prefix_match(a, &rc, NULL, NULL), 0);
    gp_prefix_chain_free(&rc);
    json_decref(tj);
    free(big);

    /* A later poll without prefix_cache forgets it. */
    a = poll1(reg, 1, 20);
    assert_false(a->prefix.reported);
    assert_int_equal(a->prefix.n_slots, 0);

    /* Bad facts are refused, naming the field. */
    char err[256], b[2400];
    const char *id = "\"agent_id\":\"8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5f\",\"models\":[]";
    const char *bad[][2] = {
        {"\"slots\":{\"total\":1},\"prefix_cache\":5", "prefix_cache"},
        {"\"slots\":{\"total\":1},\"prefix_cache\":{\"hits\":-1}", "prefix_cache"},
        {"\"slots\":{\"total\":1},\"prefix_cache\":{\"slots\":[{\"slot\":0},{\"slot\":1}]}",
         "prefix_cache.slots"},
        {"\"slots\":{\"total\":1},\"prefix_cache\":{\"slots\":[{\"slot\":0,\"prefix\":{\"kind\":"
         "\"messages\",\"units\":2,\"points\":[{\"n\":1,\"h\":\"XYZ\"}]}}]}",
         "prefix_cache.slots[0]"},
        {"\"slots\":{\"total\":1},\"prefix_cache\":{\"slots\":[{\"slot\":0,\"prefix\":{\"kind\":"
         "\"messages\",\"units\":1,\"points\":[{\"n\":2,\"h\":\"0123456789abcdef\"}]}}]}",
         "prefix_cache.slots[0]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(b, sizeof b, "{%s,%s}", id, bad[i][0]);
        err[0] = '\0';
        assert_int_equal(parse_err(b, err, sizeof err), -1);
        if (!strstr(err, bad[i][1]))
            fail_msg("case %zu: message '%s' does not name '%s'", i, err, bad[i][1]);
    }

    free(djs);
    json_decref(dj);
    json_decref(held);
    json_decref(next);
    json_decref(tooled);
    gp_prefix_chain_free(&c);
    registry_destroy(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_parse_type_confusion),
        cmocka_unit_test(test_register_and_boundaries),
        cmocka_unit_test(test_grace_default),
        cmocka_unit_test(test_heartbeat_keeps_healthy),
        cmocka_unit_test(test_revive_and_ramp),
        cmocka_unit_test(test_mark_suspect),
        cmocka_unit_test(test_draining),
        cmocka_unit_test(test_model_index),
        cmocka_unit_test(test_model_capacity),
        cmocka_unit_test(test_counters_and_labels),
        cmocka_unit_test(test_many_agents_expiry),
        cmocka_unit_test(test_prefix_facts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* deploy: models deployed from the server (deploy.h, issue 27). The
 * request check; placement on agents that offer themselves, match the
 * labels and have room, with a reason per refused agent; capacity; a
 * failed replica is re-placed elsewhere, never where it failed; scaling
 * down drops replicas that are not ready first; a dead agent's replica
 * moves only after the grace, and the server's own start counts as a
 * sighting. Agents are real registry entries from poll bodies. What the
 * store holds of deployments (a real SQLite file, db_fixture.h) is whole
 * under a failing allocator (fixture_oom.h arm_beneath: linked with
 * --wrap=malloc,calloc,realloc); an admin change the database refuses (a
 * trigger that raises) changes nothing; a start-up load that fails leaves
 * no deployment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <sqlite3.h>

#include "common/gp_json.h"
#include "server/fleet/deploy.h"
#include "server/store/store.h"
#include "db_fixture.h"
#include "fixture_oom.h"

#define T0 1000000ULL
#define GIB (1LL << 30)

typedef struct fx {
    registry *reg;
    gps_deploy *d;
} fx;

static void fx_init(fx *f, uint64_t grace_ms)
{
    registry_config rc;
    registry_config_default(&rc);
    rc.grace_ms = 0;
    f->reg = registry_create(&rc);
    assert_non_null(f->reg);
    f->d = gps_deploy_new(f->reg, NULL, grace_ms, T0);
    assert_non_null(f->d);
}

static void fx_free(fx *f)
{
    gps_deploy_free(f->d);
    registry_destroy(f->reg);
}

static void uuid(int i, char out[37])
{
    snprintf(out, 37, "00000000-0000-4000-8000-%012d", i);
}

/* Agent i polls: labels (JSON object text), models (JSON array text, NULL:
 * none) and deploy_json (the "deploy" member, or NULL for an agent started
 * with --model). Returns the reply's "deployments" (new reference) or NULL. */
static json_t *poll_models(fx *f, int i, const char *labels, const char *models,
                           const char *deploy_json, uint64_t now)
{
    char id[37], body[2048];
    uuid(i, id);
    snprintf(body, sizeof body,
             "{\"agent_id\":\"%s\",\"name\":\"box%d\",\"slots\":{\"total\":1,\"busy\":0},"
             "\"models\":%s,\"labels\":%s%s%s}",
             id, i, models ? models : "[]", labels ? labels : "{}",
             deploy_json ? ",\"deploy\":" : "", deploy_json ? deploy_json : "");
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    registry_facts rf;
    char err[256];
    assert_int_equal(registry_facts_parse(b, &rf, err, sizeof err), 0);
    registry_agent *a = registry_heartbeat(f->reg, &rf, now, 0);
    registry_facts_free(&rf);
    assert_non_null(a);
    json_t *want = NULL;
    assert_int_equal(gps_deploy_agent_poll(f->d, a, b, now, 0, &want), 0);
    json_decref(b);
    return want;
}

static json_t *poll(fx *f, int i, const char *labels, const char *deploy_json, uint64_t now)
{
    return poll_models(f, i, labels, NULL, deploy_json, now);
}

static int create(fx *f, const char *body_text)
{
    json_t *b = json_loads(body_text, 0, NULL);
    gps_deploy_spec s;
    char msg[256];
    const char *param = NULL;
    assert_int_equal(gps_deploy_parse(b, &s, msg, sizeof msg, &param), 0);
    int rc = gps_deploy_create(f->d, &s, 0, NULL, NULL, NULL);
    json_decref(b);
    return rc;
}

static json_t *get(fx *f, const char *name)
{
    bool found = false;
    json_t *j = gps_deploy_get(f->d, name, &found);
    assert_true(found);
    return j;
}

/* The refusal reason for agent i in deployment j, or NULL. */
static const char *refusal(const json_t *j, int i)
{
    char id[37];
    uuid(i, id);
    size_t k;
    json_t *r;
    json_array_foreach(json_object_get(j, "refusals"), k, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "agent_id")), id) == 0)
            return json_string_value(json_object_get(r, "reason"));
    }
    return NULL;
}

static size_t placed(const json_t *j)
{
    return json_array_size(json_object_get(j, "placed"));
}

static void test_parse(void **st)
{
    (void)st;
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"source\":\"https://x/m.gguf\"}", "name"},
        {"{\"name\":\"a/b\",\"source\":\"https://x/m.gguf\"}", "name"},
        {"{\"name\":\"a\",\"source\":\"ftp://x/m.gguf\"}", "source"},
        {"{\"name\":\"a\",\"source\":\"https://x/m.gguf\",\"replicas\":257}", "replicas"},
        {"{\"name\":\"a\",\"source\":\"https://x/m.gguf\",\"replicas\":-1}", "replicas"},
        {"{\"name\":\"a\",\"source\":\"hf:o/r/m.gguf\",\"sha256\":\"abc\"}", "sha256"},
        {"{\"name\":\"a\",\"source\":\"hf:o/r/m.gguf\",\"labels\":{\"k\":1}}", "labels"},
        {"{\"name\":\"a\",\"source\":\"hf:o/r/m.gguf\",\"labels\":[]}", "labels"},
        {"{\"name\":\"a\",\"source\":\"hf:o/r/m.gguf\",\"bytes\":-5}", "bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = json_loads(bad[i].body, 0, NULL);
        gps_deploy_spec s;
        char msg[256];
        const char *param = NULL;
        assert_int_equal(gps_deploy_parse(b, &s, msg, sizeof msg, &param), -1);
        assert_string_equal(param, bad[i].param);
        json_decref(b);
    }
    json_t *b = json_loads("{\"name\":\"q\",\"source\":\"hf:o/r/m.gguf\",\"sha256\":\""
                           "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789\"}",
                           0, NULL);
    gps_deploy_spec s;
    char msg[256];
    const char *param = NULL;
    assert_int_equal(gps_deploy_parse(b, &s, msg, sizeof msg, &param), 0);
    assert_int_equal(s.replicas, 1);
    assert_string_equal(s.sha256,
                        "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789");
    json_decref(b);
}

static void test_placement_explains_itself(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 1000);
    char deploy_big[128], deploy_small[128];
    snprintf(deploy_big, sizeof deploy_big, "{\"capacity\":1,\"memory_free\":%lld}", 8 * GIB);
    snprintf(deploy_small, sizeof deploy_small, "{\"capacity\":1,\"memory_free\":%lld}",
             GIB / 2);
    json_decref(poll(&f, 1, "{\"zone\":\"a\"}", deploy_big, T0));
    json_decref(poll(&f, 2, "{\"zone\":\"a\"}", deploy_small, T0));
    json_decref(poll(&f, 3, "{\"zone\":\"a\"}", NULL, T0)); /* --model */
    json_decref(poll(&f, 4, "{\"zone\":\"b\"}", deploy_big, T0));
    assert_int_equal(create(&f, "{\"name\":\"big\",\"source\":\"https://x/m.gguf\","
                                "\"replicas\":2,\"bytes\":2147483648,"
                                "\"labels\":{\"zone\":\"a\"}}"), 0);
    assert_int_equal(create(&f, "{\"name\":\"big\",\"source\":\"https://x/m.gguf\"}"), -2);
    gps_deploy_reconcile(f.d, T0, 0);
    json_t *j = get(&f, "big");
    assert_int_equal(placed(j), 1); /* only agent 1 fits */
    assert_int_equal(json_integer_value(json_object_get(j, "unplaced")), 1);
    assert_non_null(strstr(refusal(j, 2), "does not fit: needs about 2252 MiB; 512 MiB"));
    assert_non_null(strstr(refusal(j, 3), "not offered to deployments"));
    assert_string_equal(refusal(j, 4), "labels do not match: wants zone=a, has b");
    assert_null(refusal(j, 1));
    json_decref(j);
    /* Agent 1's poll reply now names the model; agent 4's names nothing. */
    json_t *w = poll(&f, 1, "{\"zone\":\"a\"}", deploy_big, T0 + 10);
    assert_int_equal(json_array_size(w), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(w, 0), "name")), "big");
    json_decref(w);
    w = poll(&f, 4, "{\"zone\":\"b\"}", deploy_big, T0 + 10);
    assert_int_equal(json_array_size(w), 0);
    json_decref(w);
    /* A second deployment (2 GiB: not for agent 2): agent 1 is at its
     * capacity, agent 4 takes it. */
    assert_int_equal(create(&f, "{\"name\":\"other\",\"source\":\"https://x/o.gguf\","
                                "\"bytes\":2147483648}"), 0);
    gps_deploy_reconcile(f.d, T0 + 20, 0);
    j = get(&f, "other");
    assert_int_equal(placed(j), 1);
    assert_null(json_object_get(j, "refusals"));
    json_decref(j);
    assert_int_equal(gps_deploy_scale(f.d, "other", 2, NULL, NULL), 0);
    gps_deploy_reconcile(f.d, T0 + 30, 0);
    j = get(&f, "other");
    assert_string_equal(refusal(j, 1), "holds 1 deployed model(s), its capacity");
    json_decref(j);
    assert_int_equal(gps_deploy_remove(f.d, "other", NULL, NULL), 0);
    assert_int_equal(gps_deploy_remove(f.d, "other", NULL, NULL), 1);
    fx_free(&f);
}

static void test_failed_replica_moves_elsewhere(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 1000);
    const char *dj = "{\"capacity\":1,\"memory_free\":1073741824}";
    json_decref(poll(&f, 1, NULL, dj, T0));
    assert_int_equal(create(&f, "{\"name\":\"m\",\"source\":\"https://x/m.gguf\"}"), 0);
    gps_deploy_reconcile(f.d, T0, 0);
    json_decref(poll(&f, 2, NULL, dj, T0)); /* too late: agent 1 has it */
    json_t *j = get(&f, "m");
    assert_int_equal(placed(j), 1);
    json_decref(j);
    /* Agent 1 reports progress, then a failure. */
    json_decref(poll(&f, 1, NULL,
                     "{\"capacity\":1,\"memory_free\":1073741824,\"models\":[{\"name\":\"m\","
                     "\"state\":\"downloading\",\"bytes\":10,\"total\":100,\"rate\":5}]}",
                     T0 + 1));
    j = get(&f, "m");
    json_t *r = json_array_get(json_object_get(j, "placed"), 0);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "downloading");
    assert_int_equal(json_integer_value(json_object_get(r, "eta_sec")), 18);
    assert_int_equal(json_integer_value(json_object_get(j, "bytes")), 100);
    json_decref(j);
    json_t *w = poll(&f, 1, NULL,
                     "{\"capacity\":1,\"memory_free\":1073741824,\"models\":[{\"name\":\"m\","
                     "\"state\":\"failed\",\"reason\":\"sha256 mismatch\"}]}",
                     T0 + 2);
    assert_int_equal(json_array_size(w), 0); /* agent 1 drops it */
    json_decref(w);
    j = get(&f, "m");
    assert_int_equal(placed(j), 2); /* the failure is kept, and agent 2 took over */
    json_decref(j);
    /* Agent 2 got ready, then restarted: it lists nothing; the replica is
     * assigned again (not shown ready while the agent starts over). */
    json_decref(poll(&f, 2, NULL, "{\"models\":[{\"name\":\"m\",\"state\":\"ready\"}]}",
                     T0 + 2));
    json_decref(poll(&f, 2, NULL, dj, T0 + 2));
    j = get(&f, "m");
    r = json_array_get(json_object_get(j, "placed"), 1);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "assigned");
    json_decref(j);
    w = poll(&f, 2, NULL, dj, T0 + 3);
    assert_int_equal(json_array_size(w), 1);
    json_decref(w);
    /* Agent 2 fails too: nowhere left; agent 1 says why. */
    json_decref(poll(&f, 2, NULL,
                     "{\"models\":[{\"name\":\"m\",\"state\":\"failed\",\"reason\":\"x\"}]}",
                     T0 + 4));
    j = get(&f, "m");
    assert_string_equal(refusal(j, 1), "failed this deployment: sha256 mismatch");
    assert_int_equal(json_integer_value(json_object_get(j, "unplaced")), 1);
    json_decref(j);
    /* A scale forgets the failures: a retry. */
    assert_int_equal(gps_deploy_scale(f.d, "m", 1, NULL, NULL), 0);
    gps_deploy_reconcile(f.d, T0 + 5, 0);
    j = get(&f, "m");
    assert_int_equal(placed(j), 1);
    json_decref(j);
    fx_free(&f);
}

static void test_scale_down_and_dead_agents(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 5000);
    const char *dj = "{\"capacity\":1,\"memory_free\":1073741824}";
    json_decref(poll(&f, 1, NULL, dj, T0));
    json_decref(poll(&f, 2, NULL, dj, T0));
    json_decref(poll(&f, 3, NULL, dj, T0));
    assert_int_equal(create(&f, "{\"name\":\"m\",\"source\":\"https://x/m.gguf\","
                                "\"replicas\":2}"), 0);
    gps_deploy_reconcile(f.d, T0, 0);
    json_t *j = get(&f, "m");
    assert_int_equal(placed(j), 2);
    json_decref(j);
    /* Whichever two it chose: make one ready; scaling to 1 keeps that one. */
    char ready_id[37] = "";
    for (int i = 1; i <= 3; i++) {
        json_t *w = poll(&f, i, NULL,
                         "{\"capacity\":1,\"models\":[{\"name\":\"m\",\"state\":\"ready\"}]}",
                         T0 + 1);
        if (json_array_size(w) == 1 && !ready_id[0])
            uuid(i, ready_id);
        json_decref(w);
    }
    assert_int_equal(gps_deploy_scale(f.d, "m", 1, NULL, NULL), 0);
    gps_deploy_reconcile(f.d, T0 + 2, 0);
    j = get(&f, "m");
    assert_int_equal(placed(j), 1);
    json_t *r = json_array_get(json_object_get(j, "placed"), 0);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "ready");
    char holder[37];
    snprintf(holder, sizeof holder, "%s", json_string_value(json_object_get(r, "agent_id")));
    json_decref(j);
    /* The holder goes silent; the others keep polling. Dead after the
     * agent timeout (90 s), moved only after the grace (5 s) more. */
    uint64_t t = T0 + 2;
    for (; t < T0 + 200000; t += 1000) {
        for (int i = 1; i <= 3; i++) {
            char id[37];
            uuid(i, id);
            if (strcmp(id, holder) != 0)
                json_decref(poll(&f, i, NULL, dj, t));
        }
        registry_tick(f.reg, t);
        const registry_agent *a = registry_get(f.reg, holder);
        if (a->state == REGISTRY_DEAD)
            break;
    }
    gps_deploy_reconcile(f.d, t + 1000, 0);
    j = get(&f, "m");
    r = json_array_get(json_object_get(j, "placed"), 0);
    assert_string_equal(json_string_value(json_object_get(r, "agent_id")), holder);
    json_decref(j);
    gps_deploy_reconcile(f.d, t + 6000, 0);
    j = get(&f, "m");
    assert_int_equal(placed(j), 1);
    r = json_array_get(json_object_get(j, "placed"), 0);
    assert_string_not_equal(json_string_value(json_object_get(r, "agent_id")), holder);
    json_decref(j);
    fx_free(&f);
}

/* An agent restarted with --model (no "deploy" in its poll) loses its
 * replica at once, and gets no "deployments" member. */
static void test_agent_restarted_with_model(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 60000);
    const char *dj = "{\"capacity\":1,\"memory_free\":1073741824}";
    json_decref(poll(&f, 1, NULL, dj, T0));
    assert_int_equal(create(&f, "{\"name\":\"m\",\"source\":\"https://x/m.gguf\"}"), 0);
    gps_deploy_reconcile(f.d, T0, 0);
    json_decref(poll(&f, 2, NULL, dj, T0));
    assert_null(poll(&f, 1, NULL, NULL, T0 + 1));
    gps_deploy_reconcile(f.d, T0 + 2, 0);
    json_t *j = get(&f, "m");
    assert_int_equal(placed(j), 1);
    char id2[37];
    uuid(2, id2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(
                            json_object_get(j, "placed"), 0), "agent_id")), id2);
    json_decref(j);
    fx_free(&f);
}

/* gps_deploy_list (GET /admin/deployments, the dashboard's table) under a
 * failing allocator: every run gives the whole list (json_equal to the one
 * built with memory) or NULL (a 500), never one with a deployment, a
 * replica, a refusal or an agent's own model left out. */
static void test_list_oom(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 1000);
    char big[128], small[128];
    snprintf(big, sizeof big, "{\"capacity\":2,\"memory_free\":%lld}", 8 * GIB);
    snprintf(small, sizeof small, "{\"capacity\":1,\"memory_free\":%lld}", GIB / 2);
    json_decref(poll(&f, 1, NULL, big, T0));
    json_decref(poll(&f, 2, NULL, big, T0));
    json_decref(poll(&f, 3, NULL, small, T0));
    json_decref(poll_models(&f, 4, NULL, "[{\"id\":\"local-a\"},{\"id\":\"local-b\"}]", NULL,
                            T0));
    assert_int_equal(create(&f, "{\"name\":\"a\",\"source\":\"https://x/a.gguf\","
                                "\"replicas\":2,\"bytes\":2147483648}"), 0);
    assert_int_equal(create(&f, "{\"name\":\"b\",\"source\":\"https://x/b.gguf\","
                                "\"labels\":{\"zone\":\"a\"}}"), 0);
    gps_deploy_reconcile(f.d, T0, 0);
    /* Agent 1 downloads a (a replica with an ETA and its agent's state). */
    json_decref(poll(&f, 1, NULL,
                     "{\"capacity\":2,\"memory_free\":8589934592,\"models\":[{\"name\":\"a\","
                     "\"state\":\"downloading\",\"bytes\":100,\"total\":1000,\"rate\":10}]}",
                     T0 + 1));
    json_t *want = gps_deploy_list(f.d);
    assert_non_null(want);
    json_t *deps = json_object_get(want, "deployments");
    assert_int_equal(json_array_size(deps), 2);
    /* Agent 4's own models, each with its agent. */
    char id4[37], local[512];
    uuid(4, id4);
    const char *st4 = registry_state_name(registry_get(f.reg, id4)->state);
    snprintf(local, sizeof local,
             "[{\"model\":\"local-a\",\"agent_id\":\"%s\",\"agent\":\"box4\","
             "\"agent_state\":\"%s\"},{\"model\":\"local-b\",\"agent_id\":\"%s\","
             "\"agent\":\"box4\",\"agent_state\":\"%s\"}]",
             id4, st4, id4, st4);
    json_t *lj = J(local);
    assert_true(json_equal(json_object_get(want, "local"), lj));
    json_decref(lj);
    size_t k, refusals = 0, etas = 0;
    json_t *dep;
    json_array_foreach(deps, k, dep)
    {
        size_t m;
        json_t *r;
        refusals += json_array_size(json_object_get(dep, "refusals"));
        json_array_foreach(json_object_get(dep, "placed"), m, r) etas +=
            json_object_get(r, "eta_sec") != NULL;
    }
    assert_true(refusals > 0);
    assert_int_equal(etas, 1);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = gps_deploy_list(f.d);
        bool hit = disarm();
        if (got && !json_equal(got, want)) {
            print_message("run %zu: a list with a part missing\n", n);
            print_diff("list", got, want);
            bad++;
        }
        refused += !got;
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 10); /* the sweep reached the builder's allocations */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(want);
    fx_free(&f);
}

/* The poll reply's "deployments" under a failing allocator: every run
 * gives the whole list (json_equal to the one made with memory) or -1 (a
 * 500: the agent keeps what it holds and polls again), never a list with
 * a deployment left out, which the agent would unload, nor NULL, which
 * reads as "takes no deployments". */
static void test_agent_poll_oom(void **st)
{
    (void)st;
    fx f;
    fx_init(&f, 1000);
    const char *dep = "{\"capacity\":4,\"memory_free\":8589934592,\"models\":["
                      "{\"name\":\"a\",\"state\":\"ready\"},{\"name\":\"b\","
                      "\"state\":\"downloading\",\"bytes\":1,\"total\":10,\"rate\":1}]}";
    json_decref(poll(&f, 1, NULL, dep, T0));
    assert_int_equal(create(&f, "{\"name\":\"a\",\"source\":\"https://x/a.gguf\"}"), 0);
    assert_int_equal(create(&f, "{\"name\":\"b\",\"source\":\"hf:o/r/b.gguf\"}"), 0);
    assert_int_equal(create(&f, "{\"name\":\"c\",\"source\":\"https://x/c.gguf\","
                                "\"sha256\":\"" "0123456789abcdef0123456789abcdef"
                                "0123456789abcdef0123456789abcdef\"}"), 0);
    gps_deploy_reconcile(f.d, T0, 0);
    json_decref(poll(&f, 1, NULL, dep, T0 + 1)); /* a ready, b downloading, c assigned */

    char id[37], text[1024];
    uuid(1, id);
    registry_agent *a = registry_get(f.reg, id);
    assert_non_null(a);
    snprintf(text, sizeof text, "{\"agent_id\":\"%s\",\"deploy\":%s}", id, dep);
    json_t *body = J(text);
    json_t *want = NULL;
    assert_int_equal(gps_deploy_agent_poll(f.d, a, body, T0 + 2, 0, &want), 0);
    assert_int_equal(json_array_size(want), 3);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = json_null(); /* (a singleton: no allocation) */
        int rc = gps_deploy_agent_poll(f.d, a, body, T0 + 2, 0, &got);
        bool hit = disarm();
        if (rc == 0 && !json_equal(got, want)) {
            print_message("run %zu: a list with a deployment left out\n", n);
            if (got)
                print_diff("deployments", got, want);
            else
                print_message("  NULL: reads as an agent that takes no deployments\n");
            bad++;
        }
        if (rc != 0) {
            assert_int_equal(rc, -1);
            assert_null(got);
            refused++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 3); /* the sweep reached every entry's allocation */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(want);
    json_decref(body);
    fx_free(&f);
}

/* ---- the store's side, under memory pressure ---- */

/* Labels long enough, and many enough, that jansson's dump grows its
 * buffer for them (a growth that fails can drop a key and succeed). */
#define OOM_LABELS                                                                         \
    "{\"datacenter_zone_of_the_rack\":\"eu-west-3, the rack by the window\","             \
    "\"gpu_model_the_deployment_needs\":\"nvidia-a100-sxm4-80gb\","                        \
    "\"a_third_label_with_a_long_name\":\"and a value long enough to matter\"}"

/* The store with an event base: an admin change is answered from the
 * store's callback, which runs on the loop (wait_done). */
static struct event_base *base;

static gps_store *deploy_store(const tctx *t)
{
    char err[256] = "";
    gps_store_opts o = {.commit_interval_ms = 2};
    if (!base)
        base = event_base_new();
    assert_non_null(base);
    gps_store *s = gps_store_open(t->db, base, &o, err, sizeof err);
    if (!s)
        fail_msg("open %s: %s", t->db, err);
    return s;
}

/* How an admin change ended (gps_deploy_done_fn). */
typedef struct outcome {
    int called, rc;
    gps_deploy *d;
} outcome;

static void on_done(void *arg, gps_deploy *d, int rc)
{
    outcome *o = arg;
    o->called++;
    o->rc = rc;
    o->d = d;
}

/* rc of the call; when accepted (0), the change's outcome once the store
 * answered. */
static int wait_done(int rc, outcome *o)
{
    if (rc != 0) {
        assert_int_equal(o->called, 0); /* not accepted: done never runs */
        return rc;
    }
    while (!o->called)
        assert_int_equal(event_base_loop(base, EVLOOP_ONCE), 0);
    assert_int_equal(o->called, 1);
    return o->rc;
}

static int create_wait(gps_deploy *d, const gps_deploy_spec *spec)
{
    outcome o = {0};
    return wait_done(gps_deploy_create(d, spec, 0, NULL, on_done, &o), &o);
}

static int scale_wait(gps_deploy *d, const char *name, int to)
{
    outcome o = {0};
    return wait_done(gps_deploy_scale(d, name, to, on_done, &o), &o);
}

static int remove_wait(gps_deploy *d, const char *name)
{
    outcome o = {0};
    return wait_done(gps_deploy_remove(d, name, on_done, &o), &o);
}

/* What the store holds of one deployment (gps_store_load_deployments). */
typedef struct row_seen {
    const char *name;      /* the one looked for */
    int found;
    int replicas;
    json_t *labels;        /* its labels text, read (NULL: not JSON) */
} row_seen;

static int row_of(void *arg, const gps_store_deploy_row *d)
{
    row_seen *r = arg;
    if (strcmp(d->name, r->name) != 0)
        return 0;
    r->found++;
    r->replicas = d->replicas;
    json_decref(r->labels);
    r->labels = d->labels_json ? json_loads(d->labels_json, 0, NULL) : NULL;
    return 0;
}

static int no_replica(void *arg, const gps_store_replica_row *r)
{
    (void)arg;
    (void)r;
    return 0;
}

static row_seen stored(gps_store *s, const char *name)
{
    row_seen r = {.name = name};
    char err[256] = "";
    assert_int_equal(gps_store_flush(s), 0);
    assert_int_equal(gps_store_load_deployments(s, row_of, no_replica, &r, err, sizeof err), 0);
    return r;
}

/* The deployment name's labels and replicas in memory (found false: none). */
static bool in_memory(gps_deploy *d, const char *name, const json_t *labels, int *replicas)
{
    bool found = false;
    json_t *j = gps_deploy_get(d, name, &found);
    if (found && !j)
        fail_msg("gps_deploy_get %s: out of memory with memory", name);
    if (j && !json_equal(json_object_get(j, "labels"), labels))
        fail_msg("deployment %s has other labels in memory", name);
    if (j && replicas)
        *replicas = (int)json_integer_value(json_object_get(j, "replicas"));
    json_decref(j);
    return found;
}

/* POST and PATCH of a deployment with long labels on a failing allocator:
 * a 201/200 whose row holds the very labels and count, or a refusal (a
 * 500) with nothing changed, in memory or in the DB. The code before
 * stored jansson's dump of the labels, which under out of memory can lose
 * a key or a byte (a row the next start reads with other labels, or skips
 * as not JSON); and it answered 201/200 when the row's write could not be
 * queued (only logged): a deployment gone at the next restart. */
static void test_create_and_scale_persist_oom(void **st)
{
    tctx *t = *st;
    gps_store *s = deploy_store(t);
    registry_config rc;
    registry_config_default(&rc);
    registry *reg = registry_create(&rc);
    assert_non_null(reg);
    gps_deploy *d = gps_deploy_new(reg, s, 1000, T0);
    assert_non_null(d);
    json_t *labels = J(OOM_LABELS);
    gps_deploy_spec spec = {.source = "https://x/m.gguf", .replicas = 1, .labels = labels};
    size_t bad = 0, refused = 0, n;
    char name[32];
    for (n = 1;; n++) {
        snprintf(name, sizeof name, "c%zu", n);
        spec.name = name;
        outcome o = {0};
        arm_beneath(n);
        int rc = gps_deploy_create(d, &spec, 0, NULL, on_done, &o);
        bool hit = disarm();
        rc = wait_done(rc, &o);
        row_seen r = stored(s, name);
        bool mem = in_memory(d, name, labels, NULL);
        if (rc == 0 && mem && r.found == 1 && json_equal(r.labels, labels)) {
            /* whole */
        } else if (rc != 0 && !mem && !r.found) {
            refused++;
        } else {
            print_message("run %zu: create gave %d, in memory %d, row %d with %s labels\n", n,
                          rc, mem, r.found, r.labels ? "other" : "no or unreadable");
            bad++;
        }
        json_decref(r.labels);
        if (rc == 0)
            assert_int_equal(remove_wait(d, name), 0);
        if (!hit)
            break;
    }
    assert_true(n > 5);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);

    spec.name = "scaled";
    assert_int_equal(create_wait(d, &spec), 0);
    int want = 1;
    for (n = 1;; n++) {
        int to = want % 5 + 1;
        outcome o = {0};
        arm_beneath(n);
        int rc = gps_deploy_scale(d, "scaled", to, on_done, &o);
        bool hit = disarm();
        rc = wait_done(rc, &o);
        row_seen r = stored(s, "scaled");
        int now = -1;
        assert_true(in_memory(d, "scaled", labels, &now));
        if (rc == 0 && now == to && r.found == 1 && r.replicas == to &&
            json_equal(r.labels, labels)) {
            want = to;
        } else if (rc != 0 && now == want && r.found == 1 && r.replicas == want) {
            refused++;
        } else {
            print_message("run %zu: scale to %d gave %d, %d in memory, row %d at %d with %s "
                          "labels\n", n, to, rc, now, r.found, r.replicas,
                          r.labels ? "other" : "unreadable");
            bad++;
            want = now;
        }
        json_decref(r.labels);
        if (!hit)
            break;
    }
    assert_true(n > 5);
    assert_int_equal(bad, 0);
    json_decref(labels);
    gps_deploy_free(d);
    registry_destroy(reg);
    gps_store_close(s);
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *msg = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000); /* the store's DB thread may hold the write lock */
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

/* A write the database refuses (a trigger that raises, as a constraint, a
 * full disk or a read-only file would): the change answers -1 (the admin
 * API's 500) and nothing changed, in memory or in the DB; the code before
 * answered 0 (201/200) with the table changed and the DB not (a creation
 * gone at the next restart, a removal back, a count reverted). A change
 * the DB took stays, and a second change of a name waits for the first
 * (-4): the two rows' order and the table's would not be the same. */
static void test_write_refused_changes_nothing(void **st)
{
    tctx *t = *st;
    fixture_needs_file(t);
    gps_store *s = deploy_store(t);
    registry_config rc;
    registry_config_default(&rc);
    registry *reg = registry_create(&rc);
    assert_non_null(reg);
    gps_deploy *d = gps_deploy_new(reg, s, 1000, T0);
    assert_non_null(d);
    json_t *labels = J("{\"zone\":\"eu\"}");
    gps_deploy_spec spec = {.name = "kept", .source = "https://x/m.gguf", .replicas = 2,
                            .labels = labels};
    assert_int_equal(create_wait(d, &spec), 0);
    raw_exec(t->db, "CREATE TRIGGER no_insert BEFORE INSERT ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_update BEFORE UPDATE ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_delete BEFORE DELETE ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;");

    spec.name = "lost";
    assert_int_equal(create_wait(d, &spec), -1);
    assert_false(in_memory(d, "lost", labels, NULL));
    row_seen r = stored(s, "lost");
    assert_int_equal(r.found, 0);

    int now = -1;
    assert_int_equal(scale_wait(d, "kept", 5), -1);
    assert_true(in_memory(d, "kept", labels, &now));
    assert_int_equal(now, 2);
    r = stored(s, "kept");
    assert_int_equal(r.replicas, 2);
    json_decref(r.labels);

    assert_int_equal(remove_wait(d, "kept"), -1);
    assert_true(in_memory(d, "kept", labels, NULL));
    r = stored(s, "kept");
    assert_int_equal(r.found, 1);
    json_decref(r.labels);

    /* One change of a name at a time. */
    outcome o1 = {0}, o2 = {0};
    assert_int_equal(gps_deploy_scale(d, "kept", 3, on_done, &o1), 0);
    assert_int_equal(gps_deploy_remove(d, "kept", on_done, &o2), -4);
    assert_int_equal(wait_done(0, &o1), -1);
    assert_int_equal(o2.called, 0);

    raw_exec(t->db, "DROP TRIGGER no_insert; DROP TRIGGER no_update; DROP TRIGGER no_delete;");
    assert_int_equal(scale_wait(d, "kept", 4), 0);
    assert_true(in_memory(d, "kept", labels, &now));
    assert_int_equal(now, 4);
    spec.name = "made";
    assert_int_equal(create_wait(d, &spec), 0);
    /* What a restart reads: the changes the DB took, and only those. */
    gps_deploy *d2 = gps_deploy_new(reg, NULL, 1000, T0);
    assert_non_null(d2);
    char err[256];
    assert_int_equal(gps_deploy_load(d2, s, err, sizeof err), 0);
    assert_true(in_memory(d2, "kept", labels, &now));
    assert_int_equal(now, 4);
    assert_true(in_memory(d2, "made", labels, NULL));
    assert_false(in_memory(d2, "lost", labels, NULL));
    gps_deploy_free(d2);
    assert_int_equal(remove_wait(d, "made"), 0);
    assert_false(in_memory(d, "made", labels, NULL));
    assert_int_equal(stored(s, "made").found, 0);

    /* Freed with a change waiting (the server stopping): done still runs
     * once, at the store's close, and finds the module gone. */
    outcome o3 = {0};
    assert_int_equal(gps_deploy_scale(d, "kept", 1, on_done, &o3), 0);
    gps_deploy_free(d);
    gps_store_close(s);
    assert_int_equal(o3.called, 1);
    assert_null(o3.d);
    assert_int_equal(o3.rc, -1);
    json_decref(labels);
    registry_destroy(reg);
}

/* The start-up load on a failing allocator: every deployment with its
 * labels, or -1 saying out of memory with none in the table (the server
 * refuses to start); never a deployment skipped as "not valid" for want of
 * memory (the code before: its agents would then be told to unload it),
 * read with a label changed, or the deployments read before the failure
 * left in the table (the code before, which the server then ran with).
 * One row's labels hold a \u escape, read by jansson's own (checked)
 * load, the other's long strings by gp_json_read. */
static void test_load_oom(void **st)
{
    tctx *t = *st;
    gps_store *s = deploy_store(t);
    json_t *l1 = J(OOM_LABELS), *l2 = J("{\"zone\":\"caf\\u00e9\",\"tier\":\"gold\"}");
    gps_store_deploy_row r1 = {.name = "one", .source = "https://x/1.gguf", .replicas = 2,
                               .labels_json = OOM_LABELS, .created_at = 5};
    gps_store_deploy_row r2 = {.name = "two", .source = "hf:o/r/2.gguf", .replicas = 1,
                               .labels_json = "{\"zone\":\"caf\\u00e9\",\"tier\":\"gold\"}",
                               .created_at = 6};
    assert_int_equal(gps_store_deploy_put(s, &r1), 0);
    assert_int_equal(gps_store_deploy_put(s, &r2), 0);
    assert_int_equal(gps_store_flush(s), 0);
    registry_config rc;
    registry_config_default(&rc);
    registry *reg = registry_create(&rc);
    assert_non_null(reg);
    char err[256];
    gps_deploy *d = gps_deploy_new(reg, NULL, 1000, T0);
    assert_int_equal(gps_deploy_load(d, s, err, sizeof err), 0);
    assert_true(in_memory(d, "one", l1, NULL));
    assert_true(in_memory(d, "two", l2, NULL));
    gps_deploy_free(d);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        d = gps_deploy_new(reg, NULL, 1000, T0);
        assert_non_null(d);
        err[0] = '\0';
        arm_beneath(n);
        int rc = gps_deploy_load(d, s, err, sizeof err);
        bool hit = disarm();
        if (rc == 0 && in_memory(d, "one", l1, NULL) && in_memory(d, "two", l2, NULL)) {
            /* whole */
        } else if (rc == -1 && strstr(err, "out of memory") && !in_memory(d, "one", l1, NULL) &&
                   !in_memory(d, "two", l2, NULL)) {
            refused++;
        } else {
            print_message("run %zu: load gave %d (%s) with part of the deployments\n", n, rc,
                          err);
            bad++;
        }
        gps_deploy_free(d);
        if (!hit)
            break;
    }
    assert_true(n > 5);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(l1);
    json_decref(l2);
    registry_destroy(reg);
    gps_store_close(s);
}

/* A step of the start-up load that fails (the replicas' table unreadable,
 * here gone): -1 naming what failed, and no deployment in the table; the
 * code before kept the deployments read by then, without their replicas
 * (placed again elsewhere), and the server ran with them. */
static void test_load_step_fails(void **st)
{
    tctx *t = *st;
    fixture_needs_file(t);
    gps_store *s = deploy_store(t);
    gps_store_deploy_row r1 = {.name = "one", .source = "https://x/1.gguf", .replicas = 1};
    gps_store_replica_row rr = {.deployment = "one",
                                .agent_id = "00000000-0000-4000-8000-000000000001",
                                .state = "ready"};
    assert_int_equal(gps_store_deploy_put(s, &r1), 0);
    assert_int_equal(gps_store_replica_put(s, &rr), 0);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_close(s);
    raw_exec(t->db, "ALTER TABLE deployment_replicas RENAME TO replicas_elsewhere;");
    s = deploy_store(t);
    registry_config rc;
    registry_config_default(&rc);
    registry *reg = registry_create(&rc);
    assert_non_null(reg);
    gps_deploy *d = gps_deploy_new(reg, NULL, 1000, T0);
    assert_non_null(d);
    char err[256] = "";
    assert_int_equal(gps_deploy_load(d, s, err, sizeof err), -1);
    assert_non_null(strstr(err, "deployment_replicas"));
    bool found = true;
    assert_null(gps_deploy_get(d, "one", &found));
    assert_false(found);
    json_t *l = gps_deploy_list(d);
    assert_int_equal(json_array_size(json_object_get(l, "deployments")), 0);
    json_decref(l);
    gps_deploy_free(d);
    registry_destroy(reg);
    gps_store_close(s);
}

int main(void)
{
    gp_json_init(); /* as the server's main: before arm() swaps jansson's allocator */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_placement_explains_itself),
        cmocka_unit_test(test_failed_replica_moves_elsewhere),
        cmocka_unit_test(test_scale_down_and_dead_agents),
        cmocka_unit_test(test_agent_restarted_with_model),
        cmocka_unit_test(test_list_oom),
        cmocka_unit_test(test_agent_poll_oom),
        cmocka_unit_test_setup_teardown(test_create_and_scale_persist_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_refused_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_step_fails, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (base)
        event_base_free(base);
    return rc;
}

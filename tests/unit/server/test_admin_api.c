/*
 * Unit tests for the pure parts of src/server/admin_api.c: POST
 * /admin/keys and PATCH bodies (types, ranges, roles, the field named on
 * error), the /admin/jobs query, and the 60 s throughput ring; and the
 * bodies built from the fleet (the dashboard's snapshot: status, the
 * agents list, history, deployments) and POST /admin/keys (the key and its
 * reply) under a failing allocator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/gp_util.h"
#include "server/admin_api.h"
#include "server/fleet/deploy.h"
#include "server/fleet/pins.h"
#include "server/http/http.h"
#include "server/store/store.h"
#include "db_fixture.h"
#include "fixture_fleet.h"
#include "fixture_oom.h"

static json_t *js(const char *text)
{
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    return v;
}

static void test_key_create_ok(void **state)
{
    (void)state;
    json_t *b = js("{\"role\":\"client\",\"name\":\"ci\",\"expires_in_sec\":60,\"rpm\":10,"
                   "\"tokens_per_day\":1000,\"max_concurrent\":2}");
    gps_key_spec s;
    char msg[256];
    const char *param = "x";
    assert_int_equal(gps_admin_parse_key_create(b, 1000, &s, msg, sizeof msg, &param), 0);
    assert_int_equal(s.role, GPS_KEY_CLIENT);
    assert_string_equal(s.name, "ci");
    assert_int_equal(s.expires_at, 1000 + 60000);
    assert_int_equal(s.limits.rpm, 10);
    assert_int_equal(s.limits.tokens_per_day, 1000);
    assert_int_equal(s.limits.max_concurrent, 2);
    assert_null(param);
    json_decref(b);

    b = js("{\"role\":\"enrollment\",\"max_uses\":3}");
    assert_int_equal(gps_admin_parse_key_create(b, 1000, &s, msg, sizeof msg, &param), 0);
    assert_int_equal(s.role, GPS_KEY_ENROLLMENT);
    assert_int_equal(s.max_uses, 3);
    assert_int_equal(s.expires_at, 0);
    assert_null(s.name);
    json_decref(b);
}

static void test_key_create_bad(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *param;
    } cases[] = {
        {"[]", NULL},
        {"{}", "role"},
        {"{\"role\":\"root\"}", "role"},
        {"{\"role\":7}", "role"},
        {"{\"role\":\"client\",\"name\":5}", "name"},
        {"{\"role\":\"client\",\"rpm\":-1}", "rpm"},
        {"{\"role\":\"client\",\"rpm\":\"10\"}", "rpm"},
        {"{\"role\":\"client\",\"rpm\":1.5}", "rpm"},
        {"{\"role\":\"client\",\"tokens_per_day\":true}", "tokens_per_day"},
        {"{\"role\":\"client\",\"max_concurrent\":-3}", "max_concurrent"},
        {"{\"role\":\"client\",\"expires_in_sec\":-1}", "expires_in_sec"},
        {"{\"role\":\"client\",\"expires_in_sec\":99999999999}", "expires_in_sec"},
        {"{\"role\":\"enrollment\",\"max_uses\":-1}", "max_uses"},
        {"{\"role\":\"client\",\"max_uses\":2}", "max_uses"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *b = js(cases[i].body);
        gps_key_spec s;
        char msg[256];
        const char *param = "unset";
        assert_int_equal(gps_admin_parse_key_create(b, 0, &s, msg, sizeof msg, &param), -1);
        if (cases[i].param)
            assert_string_equal(param, cases[i].param);
        else
            assert_null(param);
        assert_true(msg[0] != '\0');
        json_decref(b);
    }
}

static void test_limits(void **state)
{
    (void)state;
    gps_key_limits l = {5, 6, 7};
    char msg[256];
    const char *param;
    json_t *b = js("{\"rpm\":0,\"max_concurrent\":9}");
    assert_int_equal(gps_admin_parse_limits(b, &l, msg, sizeof msg, &param), 0);
    assert_int_equal(l.rpm, 0);
    assert_int_equal(l.tokens_per_day, 6);
    assert_int_equal(l.max_concurrent, 9);
    json_decref(b);
    b = js("{}");
    assert_int_equal(gps_admin_parse_limits(b, &l, msg, sizeof msg, &param), -1);
    json_decref(b);
    b = js("{\"tokens_per_day\":\"x\",\"rpm\":1}");
    assert_int_equal(gps_admin_parse_limits(b, &l, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "tokens_per_day");
    assert_int_equal(l.rpm, 0); /* unchanged on error */
    json_decref(b);
}

static void test_job_query(void **state)
{
    (void)state;
    gps_store_job_filter f;
    char buf[1100], msg[256];
    const char *param;
    assert_int_equal(gps_admin_parse_job_query(NULL, &f, buf, sizeof buf, msg, sizeof msg,
                                               &param), 0);
    assert_int_equal(f.limit, GPS_ADMIN_JOBS_DEFAULT);
    assert_null(f.status);
    assert_int_equal(gps_admin_parse_job_query("status=done&model=m%201&agent=a&key=key_x"
                                               "&limit=1000&before=17&other=1&agent=",
                                               &f, buf, sizeof buf, msg, sizeof msg, &param),
                     0);
    assert_string_equal(f.status, "done");
    assert_string_equal(f.model, "m 1");
    assert_string_equal(f.agent_id, "a"); /* an empty repeat does not clear it */
    assert_string_equal(f.key_id, "key_x");
    assert_int_equal(f.limit, 1000);
    assert_int_equal(f.before, 17);
    /* A decoded %00 used to cut the value: "x%00y" matched model "x". */
    const char *ctl[] = {"model=x%00y", "status=done%0A", "agent=a%1b[31m", "key=k%7f"};
    for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
        assert_int_equal(gps_admin_parse_job_query(ctl[i], &f, buf, sizeof buf, msg,
                                                   sizeof msg, &param), -1);
        assert_non_null(strstr(msg, "control characters"));
    }
    const char *bad[][2] = {{"limit=0", "limit"},     {"limit=1001", "limit"},
                            {"limit=abc", "limit"},   {"before=-4", "before"},
                            {"before=1x", "before"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(gps_admin_parse_job_query(bad[i][0], &f, buf, sizeof buf, msg,
                                                   sizeof msg, &param), -1);
        assert_string_equal(param, bad[i][1]);
    }
}

static void test_rate(void **state)
{
    (void)state;
    gps_admin_rate r;
    memset(&r, 0, sizeof r);
    double rpm, tps;
    gps_admin_rate_get(&r, 1000, 5, 5, &rpm, &tps);
    assert_true(rpm == 0 && tps == 0);
    /* 120 s of samples, 1 request and 10 tokens a second: the ring keeps
     * the last 61, the rate covers the last 60 s. */
    for (int s = 0; s <= 120; s++)
        gps_admin_rate_push(&r, (uint64_t)s * 1000, s, s * 10.0);
    gps_admin_rate_get(&r, 120000, 120, 1200, &rpm, &tps);
    assert_true(rpm > 59.9 && rpm < 60.1);
    assert_true(tps > 9.99 && tps < 10.01);
    /* Idle for a minute: nothing new. */
    gps_admin_rate_get(&r, 180000, 120, 1200, &rpm, &tps);
    assert_true(rpm == 0 && tps == 0);
}

/* Requests and errors per minute over the hour: finished minutes from the
 * ring, the current one up to now, quiet minutes as zeros, older than an
 * hour dropped. */
static void test_history(void **st)
{
    (void)st;
    gps_admin_history h;
    memset(&h, 0, sizeof h);
    const int64_t M = 60000, base = 1000000 * M;   /* a whole minute */
    gps_admin_history_push(&h, base, 100, 5);        /* start: counters at 100 / 5 */
    gps_admin_history_push(&h, base + 30000, 110, 5);
    gps_admin_history_push(&h, base + M + 1000, 112, 6);  /* minute 0 closed: 12 req, 1 err */
    gps_admin_history_push(&h, base + 3 * M, 120, 6);     /* minute 1 closed: 8 / 0; 2 quiet */
    json_t *a = gps_admin_history_json(&h, base + 3 * M + 5000, 123, 7);
    assert_int_equal(json_array_size(a), GPS_ADMIN_HISTORY_MINUTES);
    size_t n = json_array_size(a);
    json_t *cur = json_array_get(a, n - 1), *m2 = json_array_get(a, n - 2),
           *m1 = json_array_get(a, n - 3), *m0 = json_array_get(a, n - 4);
    assert_int_equal(json_integer_value(json_object_get(cur, "t")), base + 3 * M);
    assert_true(json_real_value(json_object_get(cur, "requests")) == 3);
    assert_true(json_real_value(json_object_get(cur, "errors")) == 1);
    assert_true(json_real_value(json_object_get(m2, "requests")) == 0);
    assert_true(json_real_value(json_object_get(m1, "requests")) == 8);
    assert_true(json_real_value(json_object_get(m0, "requests")) == 12);
    assert_true(json_real_value(json_object_get(m0, "errors")) == 1);
    assert_int_equal(json_integer_value(json_object_get(m0, "t")), base);
    json_decref(a);
    /* 70 minutes later: every entry is older than the hour. */
    a = gps_admin_history_json(&h, base + 73 * M, 123, 7);
    for (size_t i = 0; i < json_array_size(a); i++)
        assert_true(json_real_value(json_object_get(json_array_get(a, i), "requests")) == 0);
    json_decref(a);
    /* More than an hour of minutes: the ring keeps the last 60. */
    for (int k = 4; k < 200; k++)
        gps_admin_history_push(&h, base + k * M, 120 + k, 7);
    assert_int_equal(h.n, GPS_ADMIN_HISTORY_MINUTES);
    a = gps_admin_history_json(&h, base + 199 * M + 1, 320, 7);
    assert_true(json_real_value(json_object_get(json_array_get(a, 0), "requests")) == 1);
    json_decref(a);
}

/* The history alone under a failing allocator: the whole hour or NULL,
 * never a chart with a minute missing. */
static void test_history_oom(void **st)
{
    (void)st;
    gps_admin_history h;
    memset(&h, 0, sizeof h);
    const int64_t M = 60000, base = 1000000 * M;
    gps_admin_history_push(&h, base, 100, 5);
    gps_admin_history_push(&h, base + M + 1000, 112, 6);
    json_t *want = gps_admin_history_json(&h, base + 3 * M, 120, 7);
    assert_int_equal(json_array_size(want), GPS_ADMIN_HISTORY_MINUTES);
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = gps_admin_history_json(&h, base + 3 * M, 120, 7);
        bool hit = disarm();
        if (got && !json_equal(got, want)) {
            print_message("run %zu: a history with a minute missing\n", n);
            print_diff("history", got, want);
            bad++;
        }
        refused += !got;
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > GPS_ADMIN_HISTORY_MINUTES);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(want);
}

/* got has want's shape: the same type, objects the same keys, arrays the
 * same length, all the way down (values aside: a snapshot reads clocks).
 * Prints the path of the first difference. */
static bool same_shape(const char *path, const json_t *got, const json_t *want)
{
    char sub[256];
    if (!got || json_typeof(got) != json_typeof(want)) {
        print_message("  %s: %s\n", path, got ? "of another type" : "missing");
        return false;
    }
    if (json_is_object(want)) {
        if (json_object_size(got) != json_object_size(want)) {
            print_message("  %s: %zu members, want %zu\n", path, json_object_size(got),
                          json_object_size(want));
            return false;
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v)
        {
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (!same_shape(sub, json_object_get(got, k), v))
                return false;
        }
    } else if (json_is_array(want)) {
        if (json_array_size(got) != json_array_size(want)) {
            print_message("  %s: %zu entries, want %zu\n", path, json_array_size(got),
                          json_array_size(want));
            return false;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (!same_shape(sub, json_array_get(got, i), json_array_get(want, i)))
                return false;
        }
    }
    return true;
}

/* Agent i polls with labels, models with aliases, GPUs, a backend and an
 * error: every part of an /admin/agents entry. */
static void rich_agent(fleet *f, int i)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"agent_id\":\"00000000-0000-4000-8000-%012d\",\"name\":\"box%d\","
             "\"version\":\"1.2\",\"platform\":\"linux\",\"slots\":{\"total\":2,\"busy\":0},"
             "\"labels\":{\"zone\":\"a\",\"tier\":\"gold\"},\"backend\":\"cuda\","
             "\"error\":{\"code\":\"MODEL_REFUSED\",\"message\":\"too big\"},"
             "\"gpus\":[{\"index\":0,\"name\":\"H100\",\"vram_total\":80},"
             "{\"index\":1,\"name\":\"H100\"}],"
             "\"models\":[{\"id\":\"m1\",\"aliases\":[\"m1-a\",\"m1-b\"],"
             "\"quantization\":\"Q4_K\",\"architecture\":\"llama\",\"context_length\":4096},"
             "{\"id\":\"m2\"}]}",
             i, i);
    json_t *b = J(body);
    registry_facts rf;
    char err[256];
    if (registry_facts_parse(b, &rf, err, sizeof err) != 0)
        fail_msg("agent %d: %s", i, err);
    json_decref(b);
    assert_non_null(registry_heartbeat(f->reg, &rf, gp_now_mono_ms(), 0));
    registry_facts_free(&rf);
}

/* The dashboard's snapshot (the same agents list as GET /admin/agents, the
 * same status as GET /admin/status, history, deployments) under a failing
 * allocator: every run gives the whole snapshot or NULL (the tick is
 * skipped), never one with an agent's label, model, alias or GPU, a
 * state's count, a model's queue or a deployment left out. */
static void test_snapshot_oom(void **st)
{
    (void)st;
    fleet f;
    fleet_init(&f, NULL, NULL);
    rich_agent(&f, 1);
    rich_agent(&f, 2);
    gps_job_spec spec = fleet_spec("m1", 8);
    fleet_submit(&f, &spec); /* queued: a model in status.queue */
    gps_auth *auth = gps_auth_new(NULL);
    assert_non_null(auth);
    gps_admin *a = gps_admin_new(f.base, auth, NULL, f.reg, f.jobs, NULL, "test");
    assert_non_null(a);
    gps_deploy *d = gps_deploy_new(f.reg, NULL, 1000, gp_now_mono_ms());
    assert_non_null(d);
    json_t *body = J("{\"name\":\"dep\",\"source\":\"https://x/d.gguf\",\"replicas\":2}");
    gps_deploy_spec ds;
    char msg[256];
    const char *param = NULL;
    assert_int_equal(gps_deploy_parse(body, &ds, msg, sizeof msg, &param), 0);
    assert_int_equal(gps_deploy_create(d, &ds, 0, NULL, NULL, NULL), 0);
    json_decref(body);
    gps_admin_set_deploy(a, d);

    json_t *want = gps_admin_snapshot(a);
    assert_non_null(want);
    json_t *agents = json_object_get(want, "agents"), *ag = json_array_get(agents, 0);
    assert_int_equal(json_array_size(agents), 2);
    assert_int_equal(json_object_size(json_object_get(ag, "labels")), 2);
    assert_int_equal(json_array_size(json_object_get(ag, "gpus")), 2);
    json_t *m1 = json_array_get(json_object_get(ag, "models"), 0);
    assert_int_equal(json_array_size(json_object_get(m1, "aliases")), 2);
    json_t *status = json_object_get(want, "status");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(status, "queue"), "m1")),
                     1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(status, "agents"),
                                                        "total")),
                     2);
    assert_int_equal(json_array_size(json_object_get(want, "deployments")), 1);

    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = gps_admin_snapshot(a);
        bool hit = disarm();
        if (got && !same_shape("snapshot", got, want)) {
            print_message("run %zu: a snapshot with a part missing\n", n);
            bad++;
        }
        refused += !got;
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 100); /* the sweep reached the builders' allocations */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    json_decref(want);
    gps_admin_free(a);
    gps_deploy_free(d);
    gps_auth_free(auth);
    fleet_free(&f);
}

/* The auth-on hook of these tests: like the server's (main.c), it makes
 * an admin key, which can fail for want of memory as there, and says
 * where it went. */
static int auth_on_hook(void *arg, char *path, size_t pathlen)
{
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    gps_key_spec s = {.role = GPS_KEY_ADMIN, .name = "auth on"};
    if (gps_auth_key_create_spec(arg, &s, key, id) != 0)
        return -1;
    snprintf(path, pathlen, "/state/admin.key");
    return 0;
}

/* Whether text is a whole 201 reply for spec whose key is live in auth
 * (its id found, its raw key hashing to the entry's hash); first: the key
 * turned auth on, and the reply says so. Prints why not. */
static bool key_reply_ok(const char *text, const gps_key_spec *spec, gps_auth *auth, bool first)
{
    json_t *j = J(text);
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *key = json_string_value(json_object_get(j, "key"));
    const gps_auth_key *k = gps_auth_key_find(auth, id);
    char hash[65] = "";
    if (key)
        gps_auth_key_hash(key, hash);
    json_t *on = json_object_get(j, "auth_turned_on");
    const char *why = NULL;
    if (!k || k->revoked_at)
        why = "its key is not live";
    else if (strcmp(k->hash, hash) != 0)
        why = "its key is not the live one";
    else if (json_integer_value(json_object_get(json_object_get(j, "limits"), "rpm")) !=
                 spec->limits.rpm ||
             !json_is_string(json_object_get(j, "name")) ||
             !json_is_string(json_object_get(j, "role")) ||
             !json_is_integer(json_object_get(j, "max_uses")) || !json_object_get(j, "expires_at"))
        why = "a field is missing";
    else if (first && !json_is_string(json_object_get(on, "message")))
        why = "auth_turned_on is missing";
    else if (!first && on)
        why = "auth_turned_on where auth was on";
    if (why)
        print_message("  %s: %.300s\n", why, text);
    json_decref(j);
    return !why;
}

/* POST /admin/keys (gps_admin_key_create) under a failing allocator,
 * jansson's and the project's libc allocations alike: every run answers
 * with the key, live, or makes no key at all (a 500). Never a 500 for a
 * key that exists (its secret would be shown nowhere), nor a reply
 * without auth_turned_on where the key turned auth on. first: the server
 * had no keys; the hook then leaves an admin key. */
static void key_create_sweep(gps_key_role role, bool first)
{
    fleet f;
    fleet_init(&f, NULL, NULL);
    gps_key_spec spec = {.role = role, .name = "ci", .limits = {60, 0, 2},
                         .max_uses = role == GPS_KEY_ENROLLMENT ? 3 : 0};
    size_t bad = 0, refused = 0, n;
    for (n = 1;; n++) {
        gps_auth *auth = gps_auth_new(NULL);
        assert_non_null(auth);
        gps_admin *a = gps_admin_new(f.base, auth, NULL, f.reg, f.jobs, NULL, "test");
        assert_non_null(a);
        gps_admin_set_auth_on_hook(a, auth_on_hook, auth);
        if (!first) {
            char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
            gps_key_spec s0 = {.role = GPS_KEY_ADMIN};
            assert_int_equal(gps_auth_key_create_spec(auth, &s0, key, id), 0);
        }
        size_t before = gps_auth_key_count(auth);
        arm_libc(n);
        char *text = gps_admin_key_create(a, &spec, "key_test", NULL);
        bool hit = disarm();
        if (!text && gps_auth_key_count(auth) != before) {
            print_message("run %zu: no reply, and a key was made\n", n);
            bad++;
        } else if (text && !key_reply_ok(text, &spec, auth, first)) {
            print_message("run %zu: the reply is not the key's\n", n);
            bad++;
        }
        refused += !text;
        if (text && !hit && first && role != GPS_KEY_ADMIN) {
            /* With memory: the reply names the admin key the hook made. */
            json_t *j = J(text);
            assert_string_equal(json_string_value(json_object_get(
                                    json_object_get(j, "auth_turned_on"), "admin_key_file")),
                                "/state/admin.key");
            json_decref(j);
        }
        free(text);
        gps_admin_free(a);
        gps_auth_free(auth);
        if (!hit)
            break;
    }
    assert_true(n > 5); /* the sweep went past the key's entry and the reply */
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
    fleet_free(&f);
}

static void test_key_create_oom(void **st)
{
    (void)st;
    key_create_sweep(GPS_KEY_CLIENT, false);
    key_create_sweep(GPS_KEY_ENROLLMENT, false);
    key_create_sweep(GPS_KEY_CLIENT, true); /* turns auth on: the hook runs */
    key_create_sweep(GPS_KEY_ADMIN, true);
}

/* ---- the deployments' routes over HTTP, on a database that refuses ---- */

static int connect_loopback(int port)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

/* One request on a new connection; the loop runs until its whole reply
 * (head and Content-Length body) came back. Returns the status, the body
 * parsed into *body (new reference). */
static int request(struct event_base *base, int port, const char *method, const char *path,
                   const char *json, json_t **body)
{
    char req[1024], out[16384];
    snprintf(req, sizeof req,
             "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             method, path, json ? strlen(json) : 0, json ? json : "");
    int c = connect_loopback(port);
    assert_int_equal(send(c, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t got = 0;
    out[0] = '\0';
    for (int round = 0; round < 5000; round++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t n = recv(c, out + got, sizeof out - 1 - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            out[got] = '\0';
        }
        const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
        if (end && cl && got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10)) {
            close(c);
            *body = json_loads(end + 4, 0, NULL);
            assert_non_null(*body);
            return atoi(out + 9);
        }
        if (n <= 0)
            usleep(1000);
    }
    fail_msg("no whole reply to %s %s: %s", method, path, out);
    return -1;
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *msg = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

static const char *err_code(const json_t *body)
{
    return json_string_value(json_object_get(json_object_get(body, "error"), "code"));
}

/* POST, PATCH and DELETE /admin/deployments when the database refuses the
 * write (a trigger that raises, as a full disk or a read-only file would):
 * 500 INTERNAL in the admin API's error shape, and the deployment as it
 * was (GET); the code before answered 201/200 from the table it had
 * changed while the row never reached the database (gone, or back, at the
 * next restart). Once the database takes writes again, 201 and a row. */
static void test_deploy_routes_write_refused(void **st)
{
    tctx *t = *st;
    fixture_needs_file(t);
    struct event_base *base = event_base_new();
    assert_non_null(base);
    char err[256] = "";
    gps_store_opts so = {.commit_interval_ms = 2};
    gps_store *store = gps_store_open(t->db, base, &so, err, sizeof err);
    if (!store)
        fail_msg("open: %s", err);
    fleet f;
    fleet_init_on(&f, base, NULL, NULL, store);
    gps_auth *auth = gps_auth_new(NULL);
    assert_non_null(auth);
    gps_admin *a = gps_admin_new(base, auth, NULL, f.reg, f.jobs, store, "test");
    assert_non_null(a);
    gps_deploy *d = gps_deploy_new(f.reg, store, 1000, gp_now_mono_ms());
    assert_non_null(d);
    gps_admin_set_deploy(a, d);
    gps_http_opts ho = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                        .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                        .header_timeout_sec = 30, .body_timeout_sec = 30};
    gps_http *h = gps_http_new(base, &ho);
    assert_non_null(h);
    int port = 0;
    assert_int_equal(gps_http_bind(h, "127.0.0.1", 0, &port, err, sizeof err), 0);
    assert_int_equal(gps_admin_register(h, a), 0);

    json_t *b = NULL;
    assert_int_equal(request(base, port, "POST", "/admin/deployments",
                             "{\"name\":\"kept\",\"source\":\"https://x/k.gguf\",\"replicas\":2}",
                             &b), 201);
    json_decref(b);
    raw_exec(t->db, "CREATE TRIGGER no_insert BEFORE INSERT ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_update BEFORE UPDATE ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_delete BEFORE DELETE ON deployments "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;");

    assert_int_equal(request(base, port, "POST", "/admin/deployments",
                             "{\"name\":\"lost\",\"source\":\"https://x/l.gguf\"}", &b),
                     500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "GET", "/admin/deployments/lost", NULL, &b), 404);
    json_decref(b);

    assert_int_equal(request(base, port, "PATCH", "/admin/deployments/kept", "{\"replicas\":5}",
                             &b),
                     500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "DELETE", "/admin/deployments/kept", NULL, &b), 500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "GET", "/admin/deployments/kept", NULL, &b), 200);
    assert_int_equal(json_integer_value(json_object_get(b, "replicas")), 2);
    json_decref(b);

    raw_exec(t->db, "DROP TRIGGER no_insert; DROP TRIGGER no_update; DROP TRIGGER no_delete;");
    assert_int_equal(request(base, port, "POST", "/admin/deployments",
                             "{\"name\":\"lost\",\"source\":\"https://x/l.gguf\"}", &b),
                     201);
    assert_string_equal(json_string_value(json_object_get(b, "name")), "lost");
    json_decref(b);
    assert_int_equal(request(base, port, "DELETE", "/admin/deployments/kept", NULL, &b), 200);
    assert_true(json_is_true(json_object_get(b, "removed")));
    json_decref(b);
    assert_int_equal(request(base, port, "GET", "/admin/deployments/kept", NULL, &b), 404);
    json_decref(b);

    gps_http_free(h);
    gps_admin_free(a);
    gps_deploy_free(d);
    fleet_free(&f);
    gps_store_close(store);
    gps_auth_free(auth);
    event_base_free(base);
}

/* POST and DELETE /admin/models/pins when the database refuses the write
 * (a trigger that raises): 500 INTERNAL in the admin API's error shape,
 * and the pins as they were (GET, and what a restart reads); the code
 * before answered 200 from the table it had changed while the row never
 * reached the database (the pin gone, or back, at the next restart). Once
 * the database takes writes again, 200 and a row. */
static void test_pin_routes_write_refused(void **st)
{
    tctx *t = *st;
    fixture_needs_file(t);
    struct event_base *base = event_base_new();
    assert_non_null(base);
    char err[256] = "";
    gps_store_opts so = {.commit_interval_ms = 2};
    gps_store *store = gps_store_open(t->db, base, &so, err, sizeof err);
    if (!store)
        fail_msg("open: %s", err);
    fleet f;
    fleet_init_on(&f, base, NULL, NULL, store);
    gps_auth *auth = gps_auth_new(NULL);
    assert_non_null(auth);
    gps_admin *a = gps_admin_new(base, auth, NULL, f.reg, f.jobs, store, "test");
    assert_non_null(a);
    gps_pins *pins = gps_pins_new();
    assert_non_null(pins);
    gps_admin_set_pins(a, pins);
    gps_http_opts ho = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                        .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                        .header_timeout_sec = 30, .body_timeout_sec = 30};
    gps_http *h = gps_http_new(base, &ho);
    assert_non_null(h);
    int port = 0;
    assert_int_equal(gps_http_bind(h, "127.0.0.1", 0, &port, err, sizeof err), 0);
    assert_int_equal(gps_admin_register(h, a), 0);

#define PIN_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define PIN_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
    json_t *b = NULL;
    assert_int_equal(request(base, port, "POST", "/admin/models/pins",
                             "{\"name\":\"kept\",\"sha256\":\"" PIN_A "\"}", &b), 200);
    json_decref(b);
    raw_exec(t->db, "CREATE TRIGGER no_insert BEFORE INSERT ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_update BEFORE UPDATE ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "CREATE TRIGGER no_delete BEFORE DELETE ON model_pins "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;");

    assert_int_equal(request(base, port, "POST", "/admin/models/pins",
                             "{\"name\":\"lost\",\"sha256\":\"" PIN_A "\"}", &b), 500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "POST", "/admin/models/pins",
                             "{\"name\":\"kept\",\"sha256\":\"" PIN_B "\"}", &b), 500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "DELETE", "/admin/models/pins?name=kept", NULL, &b),
                     500);
    assert_string_equal(err_code(b), "INTERNAL");
    json_decref(b);
    assert_int_equal(request(base, port, "GET", "/admin/models/pins", NULL, &b), 200);
    json_t *l = json_object_get(b, "pins");
    assert_int_equal(json_array_size(l), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "name")), "kept");
    assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "sha256")),
                        PIN_A);
    json_decref(b);

    raw_exec(t->db, "DROP TRIGGER no_insert; DROP TRIGGER no_update; DROP TRIGGER no_delete;");
    assert_int_equal(request(base, port, "POST", "/admin/models/pins",
                             "{\"name\":\"made\",\"sha256\":\"" PIN_B "\"}", &b), 200);
    assert_string_equal(json_string_value(json_object_get(b, "name")), "made");
    json_decref(b);
    assert_int_equal(request(base, port, "DELETE", "/admin/models/pins?name=kept", NULL, &b),
                     200);
    assert_true(json_is_true(json_object_get(b, "removed")));
    json_decref(b);
    /* What a restart reads: the changes the database took, and only those. */
    gps_pins *again = gps_pins_new();
    assert_non_null(again);
    assert_int_equal(gps_store_flush(store), 0);
    assert_int_equal(gps_pins_load(again, store, err, sizeof err), 0);
    assert_int_equal(gps_pins_count(again), 1);
    assert_string_equal(gps_pins_get(again, "made"), PIN_B);
    gps_pins_free(again);
#undef PIN_A
#undef PIN_B

    gps_http_free(h);
    gps_admin_free(a);
    gps_pins_free(pins);
    fleet_free(&f);
    gps_store_close(store);
    gps_auth_free(auth);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_create_ok), cmocka_unit_test(test_key_create_bad),
        cmocka_unit_test(test_limits),        cmocka_unit_test(test_job_query),
        cmocka_unit_test(test_rate),          cmocka_unit_test(test_history),
        cmocka_unit_test(test_history_oom),   cmocka_unit_test(test_snapshot_oom),
        cmocka_unit_test(test_key_create_oom),
        cmocka_unit_test_setup_teardown(test_deploy_routes_write_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_routes_write_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * store: what every engine must do the same, through store.h only (no raw
 * access to the database), so that one binary checks SQLite (a scratch
 * file, the plain ctest entry) and PostgreSQL (the .pg entry: pg_run.py
 * starts a real server and db_fixture.h hands each test a fresh database).
 *
 * Keys and limits, daily usage added atomically by two stores on one DB
 * (two servers), agents and models, jobs with checkpoints and event logs
 * across a restart, a failed write that must not lose its batch, stored
 * responses, pins and deployments, the ping, the servers table and the
 * re-reads of keys and usage that several servers rely on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "server/store/store.h"

#include "db_fixture.h"

#define DAY 20000
#define SAT 2305843009213693951LL   /* the usage counters' ceiling (INT64_MAX/4) */

static gps_store *open_ok(const char *db, struct event_base *base)
{
    char err[512] = "";
    gps_store_opts o = {.commit_interval_ms = 2};
    gps_store *s = gps_store_open(db, base, &o, err, sizeof(err));
    if (!s)
        fail_msg("open %s: %s", db, err);
    return s;
}

static void loop_until(struct event_base *base, const int *flag)
{
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 3000 && !*flag; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    assert_true(*flag);
}

/* ---- keys ---- */

typedef struct keys_seen {
    int n;
    gps_store_key_row k[8];
    char id[8][40], agent[8][40];
} keys_seen;

static int on_key(void *arg, const gps_store_key_row *k)
{
    keys_seen *ks = arg;
    if (ks->n >= 8)
        return 1;
    ks->k[ks->n] = *k;
    snprintf(ks->id[ks->n], sizeof ks->id[0], "%s", k->id);
    snprintf(ks->agent[ks->n], sizeof ks->agent[0], "%s", k->agent_id ? k->agent_id : "");
    ks->n++;
    return 0;
}

static void test_keys_survive_a_restart(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL);
    char err[256] = "";
    char hash1[65], hash2[65];
    memset(hash1, 'a', 64);
    memset(hash2, 'b', 64);
    hash1[64] = hash2[64] = '\0';
    gps_store_key_row k1 = {.id = "key_1", .hash = hash1, .role = "client", .name = "one",
                            .created_at = 1000, .rpm = 60, .tokens_per_day = 5000000000LL,
                            .max_concurrent = 3};
    assert_int_equal(gps_store_key_insert_sync(s, &k1, err, sizeof err), 0);
    gps_store_key_row k2 = {.id = "key_2", .hash = hash2, .role = "agent", .created_at = 2000,
                            .expires_at = 1800000000000LL};
    assert_int_equal(gps_store_key_insert(s, k2), 0);
    assert_int_equal(gps_store_key_used(s, "key_2", 2500), 0);
    assert_int_equal(gps_store_key_bind_agent(s, "key_2", "agent-x"), 0);
    assert_int_equal(gps_store_key_bind_agent(s, "key_2", "agent-y"), 0); /* bound once */
    assert_int_equal(gps_store_key_uses(s, "key_1", 2), 0);
    assert_int_equal(gps_store_flush(s), 0);
    assert_int_equal(gps_store_key_revoke_sync(s, "key_1", 3000, err, sizeof err), 0);
    assert_int_equal(gps_store_key_revoke_sync(s, "key_1", 3001, err, sizeof err), 1);
    assert_int_equal(gps_store_key_revoke_sync(s, "key_none", 3001, err, sizeof err), 1);
    gps_store_close(s);

    s = open_ok(t->db, NULL);   /* a restart: migrations find nothing to do */
    keys_seen ks = {0};
    assert_int_equal(gps_store_load_keys(s, on_key, &ks, err, sizeof err), 0);
    assert_int_equal(ks.n, 2);
    assert_string_equal(ks.id[0], "key_1");
    assert_int_equal(ks.k[0].revoked_at, 3000);
    assert_int_equal(ks.k[0].rpm, 60);
    assert_int_equal(ks.k[0].tokens_per_day, 5000000000LL);   /* past 32 bits */
    assert_int_equal(ks.k[0].max_concurrent, 3);
    assert_int_equal(ks.k[0].uses, 2);
    assert_string_equal(ks.id[1], "key_2");
    assert_string_equal(ks.agent[1], "agent-x");
    assert_int_equal(ks.k[1].last_used_at, 2500);
    assert_int_equal(ks.k[1].expires_at, 1800000000000LL);
    assert_int_equal(ks.k[1].revoked_at, 0);
    gps_store_close(s);
}

/* ---- usage ---- */

typedef struct usage_seen {
    int n;
    int64_t req, prompt, completion, limited;
} usage_seen;

static int on_usage(void *arg, const char *key_id, int64_t day, int64_t requests,
                    int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    usage_seen *u = arg;
    assert_int_equal(day, DAY);
    if (strcmp(key_id, "key_u") == 0) {
        u->n++;
        u->req = requests;
        u->prompt = prompt_tokens;
        u->completion = completion_tokens;
        u->limited = rate_limited;
    }
    return 0;
}

/* Two stores on one DB stand for two servers: every add counts, none is
 * lost to a read-modify-write race, because the add is one statement. */
static void test_usage_adds_up_across_stores(void **state)
{
    tctx *t = *state;
    gps_store *a = open_ok(t->db, NULL);
    gps_store *b = open_ok(t->db, NULL);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(gps_store_usage_add(a, "key_u", DAY, 1, 10, 100, 0), 0);
        assert_int_equal(gps_store_usage_add(b, "key_u", DAY, 1, 20, 200, i % 2), 0);
    }
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(gps_store_flush(b), 0);
    char err[256] = "";
    usage_seen u = {0};
    assert_int_equal(gps_store_load_usage(a, DAY, on_usage, &u, err, sizeof err), 0);
    assert_int_equal(u.n, 1);
    assert_int_equal(u.req, 400);
    assert_int_equal(u.prompt, 200 * 30);
    assert_int_equal(u.completion, 200 * 300);
    assert_int_equal(u.limited, 100);
    /* Saturates at the ceiling instead of overflowing. */
    assert_int_equal(gps_store_usage_add(a, "key_u", DAY, 0, SAT, 0, 0), 0);
    assert_int_equal(gps_store_usage_add(a, "key_u", DAY, 0, SAT, 0, 0), 0);
    assert_int_equal(gps_store_flush(a), 0);
    u = (usage_seen){0};
    assert_int_equal(gps_store_load_usage(b, DAY, on_usage, &u, err, sizeof err), 0);
    assert_int_equal(u.prompt, SAT);
    gps_store_close(a);
    gps_store_close(b);
}

/* ---- a failed write in a batch ---- */

static void test_failed_write_keeps_its_batch(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL);
    char h[65];
    memset(h, 'c', 64);
    h[64] = '\0';
    gps_store_key_row k = {.id = "key_a", .hash = h, .role = "client", .created_at = 1};
    assert_int_equal(gps_store_key_insert(s, k), 0);
    assert_int_equal(gps_store_flush(s), 0);
    /* One group: a duplicate hash (UNIQUE) between two good writes. */
    gps_store_key_row dup = {.id = "key_dup", .hash = h, .role = "client", .created_at = 2};
    char h2[65];
    memset(h2, 'd', 64);
    h2[64] = '\0';
    gps_store_key_row k2 = {.id = "key_b", .hash = h2, .role = "client", .created_at = 3};
    assert_int_equal(gps_store_key_used(s, "key_a", 50), 0);
    assert_int_equal(gps_store_key_insert(s, dup), 0);
    assert_int_equal(gps_store_key_insert(s, k2), 0);
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_failed, 1);
    assert_int_equal(st.commit_failures, 0);
    char msg[128];
    assert_true(gps_store_healthy(s, msg, sizeof msg));
    keys_seen ks = {0};
    char err[256] = "";
    assert_int_equal(gps_store_load_keys(s, on_key, &ks, err, sizeof err), 0);
    assert_int_equal(ks.n, 2);
    assert_string_equal(ks.id[0], "key_a");
    assert_int_equal(ks.k[0].last_used_at, 50);
    assert_string_equal(ks.id[1], "key_b");
    gps_store_close(s);
}

/* ---- agents ---- */

typedef struct agents_seen {
    int n;
    char id[40], state[20], label[20], alias[20];
    size_t n_models;
    int64_t first_seen, last_seen, ctx;
} agents_seen;

static int on_agent(void *arg, const gps_store_agent_info *a)
{
    agents_seen *g = arg;
    g->n++;
    snprintf(g->id, sizeof g->id, "%s", a->id);
    snprintf(g->state, sizeof g->state, "%s", a->state);
    snprintf(g->label, sizeof g->label, "%s",
             json_string_value(json_object_get(a->labels, "region")) ?: "");
    g->n_models = a->n_models;
    g->first_seen = a->first_seen;
    g->last_seen = a->last_seen;
    if (a->n_models) {
        g->ctx = a->models[0].context_length;
        snprintf(g->alias, sizeof g->alias, "%s",
                 a->models[0].n_aliases ? a->models[0].aliases[0] : "");
    }
    return 0;
}

static void test_agents_and_models(void **state)
{
    tctx *t = *state;
    gps_store *s = open_ok(t->db, NULL);
    json_t *labels = json_pack("{s:s}", "region", "eu");
    gps_store_agent_row ar = {.id = "agent-1", .name = "box", .state = "healthy",
                              .labels = labels, .last_seen = 1000};
    assert_int_equal(gps_store_agent_upsert(s, ar), 0);
    ar.last_seen = 1700000000000LL;
    assert_int_equal(gps_store_agent_upsert(s, ar), 0);   /* update keeps first_seen */
    const char *al[] = {"tiny-alias"};
    gps_store_model_row m[] = {{.model = "tiny", .aliases = al, .n_aliases = 1,
                                .context_length = 4096, .loaded = true},
                               {.model = "other"}};
    assert_int_equal(gps_store_agent_models(s, "agent-1", m, 2), 0);
    assert_int_equal(gps_store_agent_models(s, "agent-1", m, 2), 0);   /* same rows again */
    assert_int_equal(gps_store_agent_models(s, "agent-1", m, 1), 0);
    assert_int_equal(gps_store_agent_state(s, "agent-1", "suspect", 0), 0);   /* 0: keep */
    assert_int_equal(gps_store_flush(s), 0);
    agents_seen g = {0};
    char err[256] = "";
    assert_int_equal(gps_store_load_agents(s, on_agent, &g, err, sizeof err), 0);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.state, "suspect");
    assert_string_equal(g.label, "eu");
    assert_int_equal(g.first_seen, 1000);
    assert_int_equal(g.last_seen, 1700000000000LL);
    assert_int_equal(g.n_models, 1);
    assert_int_equal(g.ctx, 4096);
    assert_string_equal(g.alias, "tiny-alias");
    assert_int_equal(gps_store_agent_delete(s, "agent-1"), 0);
    assert_int_equal(gps_store_flush(s), 0);
    g = (agents_seen){0};
    assert_int_equal(gps_store_load_agents(s, on_agent, &g, err, sizeof err), 0);
    assert_int_equal(g.n, 0);
    json_decref(labels);
    gps_store_close(s);
}

/* ---- jobs across a restart ---- */

typedef struct job_seen {
    int calls, status;
    char status_s[20], checkpoint[64], prompt[32], error_code[32], error_message[64];
    long long seq, completion_tokens;
    size_t n_events;
    int64_t created_at;
    bool has_seed;
} job_seen;

static void see_job(job_seen *g, const gps_store_job_info *j)
{
    snprintf(g->status_s, sizeof g->status_s, "%s", j->status);
    snprintf(g->checkpoint, sizeof g->checkpoint, "%.*s", (int)j->checkpoint_len,
             j->checkpoint_text ? j->checkpoint_text : "");
    snprintf(g->prompt, sizeof g->prompt, "%s",
             json_string_value(json_object_get(j->request, "prompt")) ?: "");
    g->seq = j->checkpoint_seq;
    g->completion_tokens = j->completion_tokens;
    g->n_events = json_array_size(j->events);
    g->created_at = j->created_at;
    g->has_seed = j->has_seed;
    snprintf(g->error_code, sizeof g->error_code, "%s", j->error_code ? j->error_code : "");
    snprintf(g->error_message, sizeof g->error_message, "%s",
             j->error_message ? j->error_message : "");
}

static void on_job(void *arg, int status, const gps_store_job_info *j)
{
    job_seen *g = arg;
    g->calls++;
    g->status = status;
    if (j)
        see_job(g, j);
}

static int on_unfinished(void *arg, const gps_store_job_info *j)
{
    job_seen *g = arg;
    g->calls++;
    see_job(g, j);
    return 0;
}

static json_t *events(int first, int last)
{
    json_t *a = json_array();
    for (int i = first; i <= last; i++)
        json_array_append_new(a, json_pack("{s:i, s:s, s:{s:i}}", "seq", i, "type", "token",
                                           "data", "i", i));
    return a;
}

static void test_jobs_survive_a_restart(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base);
    json_t *req = json_pack("{s:s}", "prompt", "Once upon");
    gps_store_job_row r = {.id = "job_1", .api = "native", .model = "tiny", .status = "queued",
                           .created_at = 1700000000123LL, .request = req};
    assert_int_equal(gps_store_job_insert(s, r), 0);
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT("job_1");
    u.status = "running";
    u.completion_tokens = 7;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_checkpoint(s, "job_1", "Once upon a", 11, 3), 0);
    assert_int_equal(gps_store_checkpoint(s, "job_1", "Once upon a time", 16, 4), 0);
    json_t *e1 = events(1, 2), *e2 = events(3, 4);
    assert_int_equal(gps_store_job_events(s, "job_1", e1), 0);
    assert_int_equal(gps_store_job_events(s, "job_1", e2), 0);
    assert_int_equal(gps_store_job_events(s, "job_1", e2), 0);   /* rewritten: replaced */
    assert_true(gps_store_has_job_events(s));
    job_seen g = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_1", on_job, &g), 0);
    loop_until(base, &g.calls);
    assert_int_equal(g.status, 0);
    assert_string_equal(g.status_s, "running");
    assert_string_equal(g.checkpoint, "Once upon a time");
    assert_string_equal(g.prompt, "Once upon");
    assert_int_equal(g.seq, 4);
    assert_int_equal(g.completion_tokens, 7);
    assert_int_equal(g.n_events, 4);
    assert_int_equal(g.created_at, 1700000000123LL);
    assert_false(g.has_seed);
    job_seen none = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_x", on_job, &none), 0);
    loop_until(base, &none.calls);
    assert_int_equal(none.status, 1);
    gps_store_close(s);

    s = open_ok(t->db, base);
    char err[256] = "";
    job_seen l = {0};
    assert_int_equal(gps_store_load_unfinished_jobs(s, on_unfinished, &l, err, sizeof err), 0);
    assert_int_equal(l.calls, 1);
    assert_string_equal(l.checkpoint, "Once upon a time");
    assert_int_equal(l.n_events, 4);
    /* The client's error message is kept with its code (migration 0014),
     * on both engines. */
    u = GPS_STORE_JOB_UPDATE_INIT("job_1");
    u.status = "failed";
    u.error_code = "AGENT_LOST";
    u.error_message = "the agent was lost while generating";
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_flush(s), 0);
    job_seen m = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_1", on_job, &m), 0);
    loop_until(base, &m.calls);
    assert_string_equal(m.status_s, "failed");
    assert_string_equal(m.error_code, "AGENT_LOST");
    assert_string_equal(m.error_message, "the agent was lost while generating");
    u = GPS_STORE_JOB_UPDATE_INIT("job_1");
    u.status = "done";
    u.finished_at = 1700000000999LL;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_purge_jobs(s, 1700000001000LL), 0);
    assert_int_equal(gps_store_flush(s), 0);
    job_seen gone = {0};
    assert_int_equal(gps_store_job_get_async(s, "job_1", on_job, &gone), 0);
    loop_until(base, &gone.calls);
    assert_int_equal(gone.status, 1);
    gps_store_close(s);
    json_decref(req);
    json_decref(e1);
    json_decref(e2);
    event_base_free(base);
}

/* Request-log rows whose writes fold (coalesce, issue 24): a burst of
 * rows, each inserted with an owner then updated twice, queued faster than
 * the DB thread runs them, so most updates fold into their still-queued
 * insert (K_JOB_INSERT_ROW) or update. Every row ends as if each write had
 * run, on both engines. */
static void test_folded_rows(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base);
    enum { N = 200 };
    char id[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(id[i], sizeof id[i], "fold_%d", i);
        gps_store_job_row r = {.id = id[i], .api = "openai", .model = "tiny", .status = "queued",
                               .created_at = 1700000000000LL + i, .coalesce = true};
        assert_int_equal(gps_store_job_insert_owned(s, r, "srv_x"), 0);
    }
    for (int i = 0; i < N; i++) {
        gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id[i]);
        u.status = "assigned";
        u.agent_id = "agent-1";
        u.attempts = 1;
        u.coalesce = true;
        assert_int_equal(gps_store_job_update_async(s, u), 0);
        u = GPS_STORE_JOB_UPDATE_INIT(id[i]);
        u.status = i % 2 ? "done" : "failed";
        u.completion_tokens = i;
        u.finished_at = 1700000009000LL;
        u.coalesce = true;
        assert_int_equal(gps_store_job_update_async(s, u), 0);
    }
    assert_int_equal(gps_store_flush(s), 0);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_failed, 0);
    assert_true(st.ops_committed >= 3 * N);
    for (int i = 0; i < N; i += 37) {
        job_seen g = {0};
        assert_int_equal(gps_store_job_get_async(s, id[i], on_job, &g), 0);
        loop_until(base, &g.calls);
        assert_int_equal(g.status, 0);
        assert_string_equal(g.status_s, i % 2 ? "done" : "failed");
        assert_int_equal(g.completion_tokens, i);
        assert_int_equal(g.created_at, 1700000000000LL + i);
    }
    gps_store_close(s);
    s = open_ok(t->db, base);
    char err[256] = "";
    job_seen l = {0};
    assert_int_equal(gps_store_load_unfinished_jobs(s, on_unfinished, &l, err, sizeof err), 0);
    assert_int_equal(l.calls, 0);
    gps_store_close(s);
    event_base_free(base);
}

/* ---- stored responses ---- */

typedef struct cells_seen {
    int calls, status;
    size_t nrows;
    int64_t changes;
    char first[64];
} cells_seen;

static void on_cells(void *arg, int status, const gps_store_cells *res)
{
    cells_seen *c = arg;
    c->calls++;
    c->status = status;
    if (res) {
        c->nrows = res->nrows;
        c->changes = res->changes;
        if (res->nrows && res->cell[0])
            snprintf(c->first, sizeof c->first, "%s", res->cell[0]);
    }
}

static void put_response(gps_store *s, const char *id, int64_t at, int64_t keep)
{
    json_t *obj = json_pack("{s:s}", "id", id);
    json_t *ctx = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
    char item[64];
    snprintf(item, sizeof item, "msg_%s", id);
    json_t *items = json_pack("[{s:s, s:{s:s, s:s}}]", "id", item, "message", "role",
                              "assistant", "content", "hello");
    gps_store_response_row r = {.id = id, .key_id = "key_r", .created_at = at,
                                .expires_at = 1900000000000LL, .object = obj, .context = ctx,
                                .items = items, .keep_per_key = keep};
    assert_int_equal(gps_store_response_put(s, &r), 0);
    json_decref(obj);
    json_decref(ctx);
    json_decref(items);
}

static void test_responses(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base);
    put_response(s, "resp_1", 1000, 0);
    put_response(s, "resp_2", 2000, 0);
    put_response(s, "resp_3", 3000, 2);   /* keeps resp_3 and resp_2 */
    cells_seen c = {0};
    assert_int_equal(gps_store_response_get_async(s, "resp_3", "key_r", 5000, on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.nrows, 1);
    json_t *obj = json_loads(c.first, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(obj, "id")), "resp_3");
    json_decref(obj);
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_get_async(s, "resp_1", "key_r", 5000, on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.nrows, 0);   /* trimmed */
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_get_async(s, "resp_3", "key_other", 5000, on_cells, &c),
                     0);
    loop_until(base, &c.calls);
    assert_int_equal(c.nrows, 0);   /* another key's */
    json_t *ids = json_pack("[s, s, s]", "msg_resp_2", "msg_resp_3", "msg_nope");
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_items_async(s, "key_r", ids, 5000, on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.nrows, 2);
    json_decref(ids);
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_delete_async(s, "resp_2", "key_r", on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.changes, 1);
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_delete_async(s, "resp_2", "key_r", on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.changes, 0);
    assert_int_equal(gps_store_purge_responses(s, 1900000000001LL), 0);
    assert_int_equal(gps_store_flush(s), 0);
    c = (cells_seen){0};
    assert_int_equal(gps_store_response_get_async(s, "resp_3", "key_r", 5000, on_cells, &c), 0);
    loop_until(base, &c.calls);
    assert_int_equal(c.nrows, 0);   /* purged */
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_failed, 0);
    gps_store_close(s);
    event_base_free(base);
}

/* ---- pins, deployments, ping ---- */

typedef struct deploy_seen {
    int pins, deploys, replicas;
    char pin_sha[70], replica_state[20];
    int64_t replica_bytes;
} deploy_seen;

static int on_pin(void *arg, const char *name, const char *sha256, int64_t created_at,
                  const char *created_by)
{
    deploy_seen *d = arg;
    (void)name;
    (void)created_at;
    (void)created_by;
    d->pins++;
    snprintf(d->pin_sha, sizeof d->pin_sha, "%s", sha256);
    return 0;
}

static int on_deploy(void *arg, const gps_store_deploy_row *r)
{
    deploy_seen *d = arg;
    assert_string_equal(r->labels_json, "{\"gpu\":\"a100\"}");
    d->deploys++;
    return 0;
}

static int on_replica(void *arg, const gps_store_replica_row *r)
{
    deploy_seen *d = arg;
    d->replicas++;
    snprintf(d->replica_state, sizeof d->replica_state, "%s", r->state);
    d->replica_bytes = r->bytes;
    return 0;
}

static void on_ping(void *arg, bool ok, const char *msg)
{
    (void)msg;
    *(int *)arg = ok ? 1 : -1;
}

static void test_pins_deployments_ping(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *s = open_ok(t->db, base);
    char sha1[65], sha2[65];
    memset(sha1, '1', 64);
    memset(sha2, '2', 64);
    sha1[64] = sha2[64] = '\0';
    assert_int_equal(gps_store_pin_set(s, "tiny", sha1, 1, "admin"), 0);
    assert_int_equal(gps_store_pin_set(s, "tiny", sha2, 2, NULL), 0);
    assert_int_equal(gps_store_pin_set(s, "gone", sha1, 1, NULL), 0);
    assert_int_equal(gps_store_pin_delete(s, "gone"), 0);
    gps_store_deploy_row d = {.name = "dep", .source = "hf:o/r/f.gguf", .replicas = 2,
                              .labels_json = "{\"gpu\":\"a100\"}", .created_at = 5};
    assert_int_equal(gps_store_deploy_put(s, &d), 0);
    d.replicas = 3;
    assert_int_equal(gps_store_deploy_put(s, &d), 0);
    gps_store_replica_row r = {.deployment = "dep", .agent_id = "a1", .state = "downloading",
                               .bytes = 10, .total = 6000000000LL, .updated_at = 6};
    assert_int_equal(gps_store_replica_put(s, &r), 0);
    r.state = "ready";
    r.bytes = 6000000000LL;
    assert_int_equal(gps_store_replica_put(s, &r), 0);
    int pinged = 0;
    assert_int_equal(gps_store_ping_async(s, on_ping, &pinged), 0);
    loop_until(base, &pinged);
    assert_int_equal(pinged, 1);
    assert_int_equal(gps_store_flush(s), 0);
    deploy_seen seen = {0};
    char err[256] = "";
    assert_int_equal(gps_store_load_pins(s, on_pin, &seen, err, sizeof err), 0);
    assert_int_equal(seen.pins, 1);
    assert_string_equal(seen.pin_sha, sha2);
    assert_int_equal(gps_store_load_deployments(s, on_deploy, on_replica, &seen, err, sizeof err),
                     0);
    assert_int_equal(seen.deploys, 1);
    assert_int_equal(seen.replicas, 1);
    assert_string_equal(seen.replica_state, "ready");
    assert_int_equal(seen.replica_bytes, 6000000000LL);
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    assert_int_equal(st.ops_failed, 0);
    gps_store_close(s);
    event_base_free(base);
}

/* ---- servers sharing the DB, and the re-reads (migration 0009) ---- */

typedef struct shared_seen {
    int beat, listed, keyed, used;
    int nservers, nkeys;
    char name[4][32];
    int64_t lease[4], stopped[4];
    int64_t revoked, tokens_per_day, usage_prompt, usage_day;
} shared_seen;

static void on_beat(void *arg, int status) { ((shared_seen *)arg)->beat = status == 0 ? 1 : -1; }

static void on_servers(void *arg, int status, const gps_store_server_row *rows, size_t n)
{
    shared_seen *ss = arg;
    ss->listed = status == 0 ? 1 : -1;
    ss->nservers = (int)n;
    for (size_t i = 0; i < n && i < 4; i++) {
        snprintf(ss->name[i], sizeof ss->name[i], "%s", rows[i].name);
        ss->lease[i] = rows[i].lease_until;
        ss->stopped[i] = rows[i].stopped_at;
    }
}

static void on_keys(void *arg, int status, const gps_store_key_row *rows, size_t n)
{
    shared_seen *ss = arg;
    ss->keyed = status == 0 ? 1 : -1;
    ss->nkeys = (int)n;
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].id, "key_shared") == 0) {
            ss->revoked = rows[i].revoked_at;
            ss->tokens_per_day = rows[i].tokens_per_day;
        }
}

static void on_usage_rows(void *arg, int status, int64_t day, const gps_store_usage_row *rows,
                          size_t n)
{
    shared_seen *ss = arg;
    ss->used = status == 0 ? 1 : -1;
    ss->usage_day = day;
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].key_id, "key_shared") == 0)
            ss->usage_prompt = rows[i].prompt_tokens;
}

static void test_servers_and_rereads(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    gps_store *b = open_ok(t->db, base);
    shared_seen ss = {0};
    gps_store_server_row r = {.id = "srv_a", .name = "a", .url = "http://a", .version = "1",
                              .pid = 10, .started_at = 100, .heartbeat_at = 100,
                              .lease_until = 3100};
    assert_int_equal(gps_store_server_beat_async(a, &r, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    assert_int_equal(ss.beat, 1);
    r = (gps_store_server_row){.id = "srv_b", .name = "b", .version = "1", .pid = 11,
                               .started_at = 200, .heartbeat_at = 200, .lease_until = 3200};
    ss.beat = 0;
    assert_int_equal(gps_store_server_beat_async(b, &r, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    /* a renews (the upsert moves the lease, keeps started_at), b stops. */
    r = (gps_store_server_row){.id = "srv_a", .name = "a", .url = "http://a", .version = "1",
                               .pid = 10, .started_at = 999, .heartbeat_at = 900,
                               .lease_until = 3900};
    ss.beat = 0;
    assert_int_equal(gps_store_server_beat_async(a, &r, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    assert_int_equal(gps_store_server_stop(b, "srv_b", 1000), 0);
    assert_int_equal(gps_store_flush(b), 0);
    assert_int_equal(gps_store_servers_async(a, on_servers, &ss), 0);
    loop_until(base, &ss.listed);
    assert_int_equal(ss.listed, 1);
    assert_int_equal(ss.nservers, 2);
    assert_string_equal(ss.name[0], "a");
    assert_int_equal(ss.lease[0], 3900);
    assert_int_equal(ss.stopped[0], 0);
    assert_string_equal(ss.name[1], "b");
    assert_int_equal(ss.stopped[1], 1000);
    assert_int_equal(ss.lease[1], 1000);
    /* Purge: rows whose lease ended before the bound go. */
    assert_int_equal(gps_store_server_purge(a, 2000), 0);
    ss.listed = 0;
    assert_int_equal(gps_store_servers_async(a, on_servers, &ss), 0);
    loop_until(base, &ss.listed);
    assert_int_equal(ss.nservers, 1);

    /* A key and usage written through b are read back through a. */
    gps_store_key_row k = {.id = "key_shared", .hash = "ab", .role = "client", .name = "n",
                           .created_at = 1, .tokens_per_day = 500};
    assert_int_equal(gps_store_key_insert(b, k), 0);
    assert_int_equal(gps_store_key_limits(b, "key_shared", 0, 700, 0, 0), 0);
    assert_int_equal(gps_store_key_revoke(b, "key_shared", 77), 0);
    assert_int_equal(gps_store_usage_add(b, "key_shared", DAY, 1, 40, 2, 0), 0);
    assert_int_equal(gps_store_flush(b), 0);
    assert_int_equal(gps_store_keys_async(a, on_keys, &ss), 0);
    assert_int_equal(gps_store_usage_async(a, DAY, on_usage_rows, &ss), 0);
    loop_until(base, &ss.used);
    loop_until(base, &ss.keyed);
    assert_int_equal(ss.nkeys, 1);
    assert_int_equal(ss.revoked, 77);
    assert_int_equal(ss.tokens_per_day, 700);
    assert_int_equal(ss.usage_day, DAY);
    assert_int_equal(ss.usage_prompt, 40);
    gps_store_close(a);
    gps_store_close(b);
    event_base_free(base);
}

/* The password of a URI never reaches a message. */
/* ---- native tasks across servers (migration 0010) ---- */

typedef struct claim_seen {
    int calls, status;
    size_t nrows;
    int64_t changes;
    char id[64], attempt[24], finished[24];
} claim_seen;

static void on_claim(void *arg, int status, const gps_store_cells *res)
{
    claim_seen *c = arg;
    c->calls++;
    c->status = status;
    if (res) {
        c->nrows = res->nrows;
        c->changes = res->changes;
        if (res->nrows && res->ncols >= 2) {
            snprintf(c->id, sizeof c->id, "%s", res->cell[0] ? res->cell[0] : "");
            snprintf(c->attempt, sizeof c->attempt, "%s", res->cell[1] ? res->cell[1] : "");
            snprintf(c->finished, sizeof c->finished, "%s", res->cell[0] ? res->cell[0] : "");
        }
    }
}

static uint64_t failed_ops(gps_store *s)
{
    gps_store_stats st;
    gps_store_get_stats(s, &st);
    return st.ops_failed;
}

/* Two stores on one DB stand for two servers: an expired lease is claimed
 * by one of them (attempt 2), the older attempt's event writes are
 * refused, and a follower reads the batches after a seq. */
static void test_task_leases(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    gps_store *b = open_ok(t->db, base);
    assert_true(gps_store_has_task_leases(a));
    json_t *req = json_pack("{s:s}", "prompt", "Once upon");
    gps_store_job_row r = {.id = "job_l", .api = "native", .model = "tiny", .status = "running",
                           .created_at = 1700000000000LL, .request = req};
    int64_t now = 1800000000000LL;
    assert_int_equal(gps_store_job_insert(a, r), 0);
    assert_int_equal(gps_store_task_own(a, "job_l", "srvA", now + 60000, 1), 0);
    json_t *e1 = events(1, 2), *e2 = events(3, 3);
    assert_int_equal(gps_store_job_events_fenced(a, "job_l", e1, 1, NULL), 0);
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(failed_ops(a), 0);

    json_t *tiny = json_pack("[s]", "tiny"), *other = json_pack("[s]", "other");
    /* A live lease is nobody else's. */
    claim_seen c1 = {0};
    assert_int_equal(gps_store_task_claim_async(b, "srvB", now + 2000, now, tiny, 16, on_claim,
                                                &c1), 0);
    loop_until(base, &c1.calls);
    assert_int_equal(c1.status, 0);
    assert_int_equal(c1.nrows, 0);

    /* Expired (A stopped renewing): B and C race, one takes it; a server
     * that serves another model never does. */
    assert_int_equal(gps_store_task_renew(a, "srvA", now - 1), 0);
    assert_int_equal(gps_store_flush(a), 0);
    claim_seen co = {0}, cb = {0}, cc = {0};
    assert_int_equal(gps_store_task_claim_async(a, "srvO", now + 2000, now, other, 16, on_claim,
                                                &co), 0);
    loop_until(base, &co.calls);
    assert_int_equal(co.nrows, 0);
    assert_int_equal(gps_store_task_claim_async(b, "srvB", now + 2000, now, tiny, 16, on_claim,
                                                &cb), 0);
    assert_int_equal(gps_store_task_claim_async(a, "srvC", now + 2000, now, tiny, 16, on_claim,
                                                &cc), 0);
    loop_until(base, &cb.calls);
    loop_until(base, &cc.calls);
    assert_int_equal(cb.status, 0);
    assert_int_equal(cc.status, 0);
    assert_int_equal(cb.nrows + cc.nrows, 1);
    claim_seen *won = cb.nrows ? &cb : &cc;
    assert_string_equal(won->id, "job_l");
    assert_string_equal(won->attempt, "2");

    /* Fencing: attempt 1's write is refused, attempt 2's lands. */
    assert_int_equal(gps_store_job_events_fenced(a, "job_l", e2, 1, NULL), 0);
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(failed_ops(a), 1);
    assert_int_equal(gps_store_job_events_fenced(b, "job_l", e2, 2, NULL), 0);
    assert_int_equal(gps_store_flush(b), 0);
    assert_int_equal(failed_ops(b), 0);

    /* The row and checkpoint writes of attempt 1 change nothing. */
    gps_store_job_update stale = GPS_STORE_JOB_UPDATE_INIT("job_l");
    stale.status = "cancelled";
    stale.finished_at = now;
    stale.lease_attempt = 1;
    assert_int_equal(gps_store_job_update_async(a, stale), 0);
    assert_int_equal(gps_store_checkpoint_fenced(a, "job_l", "stale", 5, 9, 1), 0);
    assert_int_equal(gps_store_checkpoint_fenced(b, "job_l", "fresh", 5, 3, 2), 0);
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(gps_store_flush(b), 0);
    job_seen js = {0};
    assert_int_equal(gps_store_job_get_async(a, "job_l", on_job, &js), 0);
    loop_until(base, &js.calls);
    assert_int_equal(js.status, 0);
    assert_string_equal(js.status_s, "running");
    assert_string_equal(js.checkpoint, "fresh");
    assert_int_equal(js.seq, 3);

    /* A follower: the batches after seq 2 (one), none after 3. */
    claim_seen f1 = {0}, f2 = {0}, f3 = {0};
    assert_int_equal(gps_store_task_follow_async(a, "job_l", 2, on_claim, &f1), 0);
    assert_int_equal(gps_store_task_follow_async(a, "job_l", 0, on_claim, &f2), 0);
    assert_int_equal(gps_store_task_follow_async(a, "job_none", 0, on_claim, &f3), 0);
    loop_until(base, &f1.calls);
    loop_until(base, &f2.calls);
    loop_until(base, &f3.calls);
    assert_int_equal(f1.nrows, 1);
    assert_true(strstr(f1.attempt, "\"seq\":3") != NULL || strstr(f1.attempt, "\"seq\": 3"));
    assert_int_equal(f2.nrows, 2);
    assert_int_equal(f3.nrows, 0);

    /* A fenced write keeps the client's error message too (0014). */
    gps_store_job_update fm = GPS_STORE_JOB_UPDATE_INIT("job_l");
    fm.status = "failed";
    fm.error_code = "CONTEXT_OVERFLOW";
    fm.error_message = "prompt and max_tokens exceed the context";
    fm.lease_attempt = 2;
    assert_int_equal(gps_store_job_update_async(b, fm), 0);
    assert_int_equal(gps_store_flush(b), 0);
    job_seen jm = {0};
    assert_int_equal(gps_store_job_get_async(a, "job_l", on_job, &jm), 0);
    loop_until(base, &jm.calls);
    assert_string_equal(jm.status_s, "failed");
    assert_string_equal(jm.error_code, "CONTEXT_OVERFLOW");
    assert_string_equal(jm.error_message, "prompt and max_tokens exceed the context");

    /* A finished task is never claimed, expired or not. */
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT("job_l");
    u.status = "done";
    u.finished_at = now;
    assert_int_equal(gps_store_job_update_async(b, u), 0);
    assert_int_equal(gps_store_task_renew(b, "srvB", now - 1), 0);
    assert_int_equal(gps_store_flush(b), 0);
    claim_seen c3 = {0};
    assert_int_equal(gps_store_task_claim_async(a, "srvC", now + 2000, now, tiny, 16, on_claim,
                                                &c3), 0);
    loop_until(base, &c3.calls);
    assert_int_equal(c3.nrows, 0);

    json_decref(tiny);
    json_decref(other);
    json_decref(e1);
    json_decref(e2);
    json_decref(req);
    gps_store_close(a);
    gps_store_close(b);
    event_base_free(base);
}

/* Requests' owners (docs/scaling.md 3d): the sweep fails the unfinished
 * non-native jobs of servers gone for two leases (or purged), and rows
 * without an owner created before the bound; nothing else. */
static void test_job_owners(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    assert_true(gps_store_has_job_owners(a));
    int64_t now = 1800000000000LL, bound = now - 20000;
    shared_seen ss = {0};
    gps_store_server_row live = {.id = "srv_live", .name = "l", .version = "1", .pid = 1,
                                 .started_at = 1, .heartbeat_at = now, .lease_until = now + 10000};
    assert_int_equal(gps_store_server_beat_async(a, &live, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    gps_store_server_row dead = live;
    dead.id = "srv_dead";
    dead.lease_until = bound - 1;
    ss.beat = 0;
    assert_int_equal(gps_store_server_beat_async(a, &dead, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    const struct {
        const char *id, *api, *owner;
        int64_t created;
        const char *after;
    } rows[] = {
        {"job_live", "openai", "srv_live", now - 60000, "running"},
        {"job_dead", "openai", "srv_dead", now - 60000, "failed"},
        {"job_gone", "anthropic", "srv_gone", now - 1000, "failed"},
        {"job_old", "openai", NULL, bound - 1, "failed"},
        {"job_new", "openai", NULL, bound + 1, "running"},
        {"job_task", "native", "srv_dead", now - 60000, "running"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        gps_store_job_row r = {.id = rows[i].id, .api = rows[i].api, .model = "m",
                               .status = "running", .created_at = rows[i].created};
        assert_int_equal(gps_store_job_insert_owned(a, r, rows[i].owner), 0);
    }
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(failed_ops(a), 0);
    claim_seen sw = {0};
    assert_int_equal(gps_store_jobs_fail_orphans_async(a, now, bound, on_claim, &sw), 0);
    loop_until(base, &sw.calls);
    assert_int_equal(sw.status, 0);
    assert_int_equal(sw.changes, 3);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        job_seen js = {0};
        assert_int_equal(gps_store_job_get_async(a, rows[i].id, on_job, &js), 0);
        loop_until(base, &js.calls);
        assert_int_equal(js.status, 0);
        assert_string_equal(js.status_s, rows[i].after);
    }
    /* A second sweep finds nothing more. */
    claim_seen sw2 = {0};
    assert_int_equal(gps_store_jobs_fail_orphans_async(a, now, bound, on_claim, &sw2), 0);
    loop_until(base, &sw2.calls);
    assert_int_equal(sw2.status, 0);
    assert_int_equal(sw2.changes, 0);
    gps_store_close(a);
    event_base_free(base);
}

/* The rows of a read, kept (every cell, row-major) for the assertions. */
typedef struct rows_seen {
    int calls, status;
    size_t nrows, ncols;
    int64_t changes;
    char cell[8][6][160];
} rows_seen;

static void on_rows(void *arg, int status, const gps_store_cells *res)
{
    rows_seen *r = arg;
    r->calls++;
    r->status = status;
    if (!res)
        return;
    r->nrows = res->nrows;
    r->ncols = res->ncols;
    r->changes = res->changes;
    for (size_t i = 0; i < res->nrows && i < 8; i++)
        for (size_t c = 0; c < res->ncols && c < 6; c++) {
            const char *v = res->cell[i * res->ncols + c];
            snprintf(r->cell[i][c], sizeof r->cell[i][c], "%s", v ? v : "(null)");
        }
}

static void beat_as(gps_store *s, struct event_base *base, const char *id, int64_t lease_until)
{
    shared_seen ss = {0};
    gps_store_server_row r = {.id = id, .name = id, .version = "1", .pid = 1, .started_at = 1,
                              .heartbeat_at = lease_until - 10000, .lease_until = lease_until};
    assert_int_equal(gps_store_server_beat_async(s, &r, on_beat, &ss), 0);
    loop_until(base, &ss.beat);
    assert_int_equal(ss.beat, 1);
}

/* A job queued on its own server and offered too (issue 28, docs/
 * scaling.md 3e): a claimer looks at the offers first (its own server's
 * are never shown, the constraints come without the spec), then claims by
 * id; the offering server's withdraw takes a waiting offer back (1 row)
 * and finds a claimed one taken (0 rows); a withdrawn offer is never
 * claimed. */
static void test_handoff_withdraw(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    gps_store *b = open_ok(t->db, base);
    int64_t now = 1800000000000LL;
    beat_as(a, base, "srvA", now + 10000);
    beat_as(b, base, "srvB", now + 10000);
    const char *ids[] = {"job_w1", "job_w2", "job_w3"};
    json_t *spec = json_pack("{s:s,s:{s:{s:s}}}", "model", "tiny", "constraints", "labels",
                             "gpu", "a100");
    json_t *plain = json_pack("{s:s}", "model", "tiny");
    for (int i = 0; i < 3; i++) {
        gps_store_job_row r = {.id = ids[i], .api = "openai", .model = "tiny",
                               .status = "queued", .created_at = now + i};
        assert_int_equal(gps_store_job_insert_owned(a, r, "srvA"), 0);
        assert_int_equal(gps_store_handoff_offer(a, ids[i], "tiny", i == 0 ? spec : plain,
                                                 "srvA", now + i, now + 5000),
                         0);
    }
    assert_int_equal(gps_store_flush(a), 0);
    json_t *tiny = json_pack("[s]", "tiny");
    rows_seen own = {0}, pk = {0};
    assert_int_equal(gps_store_handoff_peek_async(a, "srvA", now, tiny, 8, on_rows, &own), 0);
    assert_int_equal(gps_store_handoff_peek_async(b, "srvB", now, tiny, 8, on_rows, &pk), 0);
    loop_until(base, &own.calls);
    loop_until(base, &pk.calls);
    assert_int_equal(own.status, 0);
    assert_int_equal(own.nrows, 0);
    assert_int_equal(pk.nrows, 3);
    assert_string_equal(pk.cell[0][0], "job_w1");
    assert_string_equal(pk.cell[0][1], "tiny");
    json_t *c = json_loads(pk.cell[0][2], 0, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "labels"), "gpu")),
                        "a100");
    json_decref(c);
    assert_string_equal(pk.cell[1][0], "job_w2");
    assert_string_equal(pk.cell[1][2], "(null)");

    json_t *want = json_pack("[s]", "job_w2");
    rows_seen cl = {0};
    assert_int_equal(gps_store_handoff_claim_ids_async(b, "srvB", now, want, on_rows, &cl), 0);
    loop_until(base, &cl.calls);
    assert_int_equal(cl.nrows, 1);
    assert_string_equal(cl.cell[0][0], "job_w2");
    assert_string_equal(cl.cell[0][2], "1");

    rows_seen w2 = {0}, w1 = {0}, w1b = {0};
    assert_int_equal(gps_store_handoff_withdraw_async(a, "job_w2", on_rows, &w2), 0);
    assert_int_equal(gps_store_handoff_withdraw_async(a, "job_w1", on_rows, &w1), 0);
    assert_int_equal(gps_store_handoff_withdraw_async(a, "job_w1", on_rows, &w1b), 0);
    loop_until(base, &w2.calls);
    loop_until(base, &w1.calls);
    loop_until(base, &w1b.calls);
    assert_int_equal(w2.status, 0);
    assert_int_equal(w2.changes, 0); /* claimed first */
    assert_int_equal(w1.changes, 1); /* withdrawn */
    assert_int_equal(w1b.changes, 0);
    json_decref(want);
    want = json_pack("[s,s]", "job_w1", "job_w3");
    rows_seen cl2 = {0}, cl3 = {0};
    assert_int_equal(gps_store_handoff_claim_ids_async(b, "srvB", now, want, on_rows, &cl2), 0);
    loop_until(base, &cl2.calls);
    assert_int_equal(cl2.nrows, 1);
    assert_string_equal(cl2.cell[0][0], "job_w3");
    /* The claim without a look first skips its own server's offers too. */
    assert_int_equal(gps_store_handoff_claim_async(a, "srvA", now, tiny, 4, on_rows, &cl3), 0);
    loop_until(base, &cl3.calls);
    assert_int_equal(cl3.nrows, 0);
    assert_int_equal(failed_ops(a), 0);
    json_decref(want);
    json_decref(tiny);
    json_decref(spec);
    json_decref(plain);
    gps_store_close(a);
    gps_store_close(b);
    event_base_free(base);
}

/* The hand-off (docs/scaling.md 3e), two stores standing for servers: the
 * peers' models, an offer claimed by one of two racing claimers (attempt
 * 1), the loser's relay write refused and the winner's followed; the sweep
 * gives a dead claimer's row back (a stale write is then refused, the next
 * claim is attempt 2); a cancelled or expired offer is never claimed. */
static void test_handoffs(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    gps_store *b = open_ok(t->db, base);
    assert_true(gps_store_has_handoffs(a));
    int64_t now = 1800000000000LL;
    beat_as(a, base, "srvA", now + 10000);
    beat_as(b, base, "srvB", now + 10000);
    beat_as(b, base, "srvC", now + 10000);
    json_t *tiny = json_pack("[s]", "tiny");
    assert_int_equal(gps_store_server_models(b, "srvB", tiny), 0);
    assert_int_equal(gps_store_flush(b), 0);
    rows_seen peers = {0};
    assert_int_equal(gps_store_handoff_peers_async(a, "srvA", now, on_rows, &peers), 0);
    loop_until(base, &peers.calls);
    assert_int_equal(peers.nrows, 1);
    assert_string_equal(peers.cell[0][0], "[\"tiny\"]");

    gps_store_job_row r = {.id = "job_h", .api = "openai", .model = "tiny", .status = "queued",
                           .created_at = now};
    assert_int_equal(gps_store_job_insert_owned(a, r, "srvA"), 0);
    json_t *spec = json_pack("{s:s,s:s}", "job_id", "job_h", "model", "tiny");
    assert_int_equal(gps_store_handoff_offer(a, "job_h", "tiny", spec, "srvA", now, now + 5000),
                     0);
    r.id = "job_late";
    assert_int_equal(gps_store_job_insert_owned(a, r, "srvA"), 0);
    assert_int_equal(gps_store_handoff_offer(a, "job_late", "tiny", spec, "srvA", now, now - 1),
                     0);
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(failed_ops(a), 0);

    rows_seen cb = {0}, cc = {0};
    assert_int_equal(gps_store_handoff_claim_async(b, "srvB", now, tiny, 4, on_rows, &cb), 0);
    assert_int_equal(gps_store_handoff_claim_async(a, "srvC", now, tiny, 4, on_rows, &cc), 0);
    loop_until(base, &cb.calls);
    loop_until(base, &cc.calls);
    assert_int_equal(cb.status, 0);
    assert_int_equal(cc.status, 0);
    assert_int_equal(cb.nrows + cc.nrows, 1); /* job_late: past its deadline */
    rows_seen *won = cb.nrows ? &cb : &cc;
    const char *winner = cb.nrows ? "srvB" : "srvC", *loser = cb.nrows ? "srvC" : "srvB";
    assert_string_equal(won->cell[0][0], "job_h");
    assert_true(strstr(won->cell[0][1], "\"model\":\"tiny\"") != NULL);
    assert_string_equal(won->cell[0][2], "1");

    /* Fenced relay: the winner's batch lands, the loser's is refused. */
    json_t *ev = json_pack("[{s:s,s:s}]", "type", "token", "text", "Hi");
    long long base1 = GPS_HANDOFF_SEQ_BASE;
    rows_seen w1 = {0}, w2 = {0};
    assert_int_equal(gps_store_handoff_events_async(a, "job_h", loser, 1, base1 + 5, base1 + 5,
                                                    ev, on_rows, &w2), 0);
    assert_int_equal(gps_store_handoff_events_async(b, "job_h", winner, 1, base1, base1, ev,
                                                    on_rows, &w1), 0);
    loop_until(base, &w1.calls);
    loop_until(base, &w2.calls);
    assert_int_equal(w1.status, 0);
    assert_int_equal(w2.status, -1);
    rows_seen mine = {0};
    assert_int_equal(gps_store_handoff_mine_async(b, winner, on_rows, &mine), 0);
    loop_until(base, &mine.calls);
    assert_int_equal(mine.nrows, 1);
    assert_string_equal(mine.cell[0][1], "1");

    rows_seen f1 = {0}, f2 = {0}, f3 = {0};
    assert_int_equal(gps_store_handoff_follow_async(a, "job_h", base1, on_rows, &f1), 0);
    assert_int_equal(gps_store_handoff_follow_async(a, "job_h", base1 + 1, on_rows, &f2), 0);
    assert_int_equal(gps_store_handoff_follow_async(a, "job_none", 0, on_rows, &f3), 0);
    loop_until(base, &f1.calls);
    loop_until(base, &f2.calls);
    loop_until(base, &f3.calls);
    assert_int_equal(f1.nrows, 1);
    assert_string_equal(f1.cell[0][0], "claimed");
    assert_string_equal(f1.cell[0][1], winner);
    assert_string_equal(f1.cell[0][2], "1");
    assert_int_equal(atoll(f1.cell[0][3]), base1);
    assert_true(strstr(f1.cell[0][4], "\"Hi\"") != NULL);
    assert_int_equal(f2.nrows, 1);
    assert_string_equal(f2.cell[0][3], "(null)");
    assert_int_equal(f3.nrows, 0);

    /* The winner's lease ends: the sweep gives its row back, its late
     * write is refused, the next claim is attempt 2. */
    beat_as(b, base, winner, now - 1);
    rows_seen sw = {0};
    assert_int_equal(gps_store_handoff_sweep_async(a, now, on_rows, &sw), 0);
    loop_until(base, &sw.calls);
    assert_int_equal(sw.status, 0);
    assert_int_equal(sw.changes, 1);
    rows_seen w3 = {0}, c2 = {0};
    assert_int_equal(gps_store_handoff_events_async(b, "job_h", winner, 1, base1 + 1, base1 + 1,
                                                    ev, on_rows, &w3), 0);
    loop_until(base, &w3.calls);
    assert_int_equal(w3.status, -1);
    assert_int_equal(gps_store_handoff_claim_async(a, loser, now, tiny, 4, on_rows, &c2), 0);
    loop_until(base, &c2.calls);
    assert_int_equal(c2.nrows, 1);
    assert_string_equal(c2.cell[0][2], "2");

    /* Cancelled by its server: not claimable, and not its claimer's. */
    assert_int_equal(gps_store_handoff_end(a, "job_h", false), 0);
    assert_int_equal(gps_store_flush(a), 0);
    rows_seen mine2 = {0}, c3 = {0};
    assert_int_equal(gps_store_handoff_mine_async(a, loser, on_rows, &mine2), 0);
    loop_until(base, &mine2.calls);
    assert_int_equal(mine2.nrows, 0);
    beat_as(b, base, winner, now + 10000);
    assert_int_equal(gps_store_handoff_claim_async(b, winner, now, tiny, 4, on_rows, &c3), 0);
    loop_until(base, &c3.calls);
    assert_int_equal(c3.nrows, 0);
    /* Done: the row goes. */
    assert_int_equal(gps_store_handoff_end(a, "job_h", true), 0);
    assert_int_equal(gps_store_flush(a), 0);
    rows_seen f4 = {0};
    assert_int_equal(gps_store_handoff_follow_async(a, "job_h", 0, on_rows, &f4), 0);
    loop_until(base, &f4.calls);
    assert_int_equal(f4.nrows, 0);
    assert_int_equal(failed_ops(a), 0);

    json_decref(ev);
    json_decref(spec);
    json_decref(tiny);
    gps_store_close(a);
    gps_store_close(b);
    event_base_free(base);
}

/* A cancel asked through the row (migration 0012): it marks only an
 * unfinished native task, and the owner's read lists its own unfinished
 * tasks with a mark. */
static void test_task_cancels(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    gps_store *a = open_ok(t->db, base);
    assert_true(gps_store_has_task_cancel(a));
    int64_t now = 1800000000000LL;
    const struct {
        const char *id, *api, *owner;
        bool finished;
        int64_t changes;
    } rows[] = {
        {"job_run", "native", "srvA", false, 1},  {"job_other", "native", "srvB", false, 1},
        {"job_quiet", "native", "srvA", false, -1}, {"job_fin", "native", "srvA", true, 0},
        {"job_chat", "openai", "srvA", false, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        gps_store_job_row r = {.id = rows[i].id, .api = rows[i].api, .model = "m",
                               .status = "running", .created_at = now - 1000};
        assert_int_equal(gps_store_job_insert(a, r), 0);
        assert_int_equal(gps_store_task_own(a, rows[i].id, rows[i].owner, now + 10000, 1), 0);
        if (rows[i].finished) {
            gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(rows[i].id);
            u.status = "done";
            u.finished_at = now;
            assert_int_equal(gps_store_job_update_async(a, u), 0);
        }
    }
    assert_int_equal(gps_store_flush(a), 0);
    assert_int_equal(failed_ops(a), 0);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].changes < 0)
            continue;
        cells_seen c = {0};
        assert_int_equal(gps_store_task_cancel_request_async(a, rows[i].id, now, on_cells, &c),
                         0);
        loop_until(base, &c.calls);
        assert_int_equal(c.status, 0);
        assert_int_equal(c.changes, rows[i].changes);
    }
    cells_seen ca = {0}, cb = {0}, cn = {0};
    assert_int_equal(gps_store_task_cancels_async(a, "srvA", on_cells, &ca), 0);
    assert_int_equal(gps_store_task_cancels_async(a, "srvB", on_cells, &cb), 0);
    assert_int_equal(gps_store_task_cancels_async(a, "srvN", on_cells, &cn), 0);
    loop_until(base, &ca.calls);
    loop_until(base, &cb.calls);
    loop_until(base, &cn.calls);
    assert_int_equal(ca.nrows, 1);
    assert_string_equal(ca.first, "job_run");
    assert_int_equal(cb.nrows, 1);
    assert_string_equal(cb.first, "job_other");
    assert_int_equal(cn.nrows, 0);
    /* One task's mark (a claimant's read): set, unset, no such task. */
    cells_seen g1 = {0}, g2 = {0}, g3 = {0};
    assert_int_equal(gps_store_task_cancel_get_async(a, "job_run", on_cells, &g1), 0);
    assert_int_equal(gps_store_task_cancel_get_async(a, "job_quiet", on_cells, &g2), 0);
    assert_int_equal(gps_store_task_cancel_get_async(a, "job_none", on_cells, &g3), 0);
    loop_until(base, &g1.calls);
    loop_until(base, &g2.calls);
    loop_until(base, &g3.calls);
    assert_int_equal(g1.nrows, 1);
    assert_string_equal(g1.first, "1800000000000");
    assert_int_equal(g2.nrows, 1);
    assert_string_equal(g2.first, "");
    assert_int_equal(g3.nrows, 0);
    /* Cancelled by its owner: no longer listed. */
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT("job_run");
    u.status = "cancelled";
    u.finished_at = now;
    u.lease_attempt = 1;
    assert_int_equal(gps_store_job_update_async(a, u), 0);
    assert_int_equal(gps_store_flush(a), 0);
    cells_seen c2 = {0};
    assert_int_equal(gps_store_task_cancels_async(a, "srvA", on_cells, &c2), 0);
    loop_until(base, &c2.calls);
    assert_int_equal(c2.status, 0);
    assert_int_equal(c2.nrows, 0);
    gps_store_close(a);
    event_base_free(base);
}

static void test_db_label(void **state)
{
    (void)state;
    char out[128];
    gps_store_db_label("postgresql://gp:s3cret@db.example:5432/pool", out, sizeof out);
    assert_string_equal(out, "postgresql://gp@db.example:5432/pool");
    gps_store_db_label("postgresql://gp@h/pool", out, sizeof out);
    assert_string_equal(out, "postgresql://gp@h/pool");
    gps_store_db_label("/var/lib/gpupool/gpupool.db", out, sizeof out);
    assert_string_equal(out, "/var/lib/gpupool/gpupool.db");
    assert_true(gps_store_db_is_file("./gpupool.db"));
    assert_false(gps_store_db_is_file("postgres://u@h/d"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keys_survive_a_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_folded_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_adds_up_across_stores, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_write_keeps_its_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agents_and_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jobs_survive_a_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_responses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pins_deployments_ping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_servers_and_rereads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_leases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_owners, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoffs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_withdraw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_cancels, setup, teardown),
        cmocka_unit_test(test_db_label),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

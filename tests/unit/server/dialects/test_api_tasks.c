/* Native task API: POST /v2/tasks validation (fields, seed generation,
 * priority, session_id), the Last-Event-ID parser, a stored task's status
 * body whole or nothing under out of memory, and its event streams' frames
 * (a long event in slices, a follower's stored batches, a replay from the
 * store) whole or tried again, never a stream with an event changed or
 * left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/dialects/api_tasks.h"
#include "server/dialects/api_tasks_priv.h"
#include "server/store/store.h"

#include "../fixture_oom.h"

static int parse(const char *text, gps_job_spec *s, const char **param, char *msg, size_t n)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("test JSON does not parse: %s", text);
    int rc = gps_tasks_parse(j, s, msg, n, param);
    json_decref(j);
    return rc;
}

static void bad(const char *text, const char *want_param)
{
    gps_job_spec s;
    const char *param = "unset";
    char msg[256];
    if (parse(text, &s, &param, msg, sizeof msg) != -1)
        fail_msg("expected an error for %s", text);
    if (want_param == NULL ? param != NULL : (param == NULL || strcmp(param, want_param) != 0))
        fail_msg("%s: param %s, expected %s (%s)", text, param ? param : "NULL",
                 want_param ? want_param : "NULL", msg);
}

static void test_ok(void **state)
{
    (void)state;
    gps_job_spec s;
    const char *param;
    char msg[256];
    assert_int_equal(parse("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":5,\"seed\":42,"
                           "\"priority\":\"batch\",\"session_id\":\"s\",\"stop\":\"\\n\","
                           "\"temperature\":0,\"top_k\":3}",
                           &s, &param, msg, sizeof msg),
                     0);
    assert_int_equal(s.kind, GPS_JOB_COMPLETION);
    assert_string_equal(s.api, "native");
    assert_string_equal(s.prompt, "p");
    assert_int_equal(s.max_tokens, 5);
    assert_true(s.has_seed);
    assert_int_equal(s.seed, 42);
    assert_int_equal(s.priority, GPS_PRIO_BATCH);
    assert_string_equal(s.session, "s");
    assert_int_equal(json_array_size(s.stop), 1);
    assert_int_equal(s.top_k, 3);
    gps_job_spec_clear(&s);

    /* no seed: one is generated and recorded */
    assert_int_equal(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"max_tokens\":1}",
                           &s, &param, msg, sizeof msg),
                     0);
    assert_int_equal(s.kind, GPS_JOB_CHAT);
    assert_true(s.has_seed);
    assert_int_equal(s.priority, GPS_PRIO_INTERACTIVE);
    assert_int_equal(json_array_size(s.messages), 1);
    gps_job_spec_clear(&s);
}

/* A generated seed is random and fits 31 bits (what the agents' sampler
 * and every JSON reader take). Over 64 draws: each in [0, 2^31), and not
 * all the same (a constant, e.g. an unused random source, fails). A seed
 * of 32 random bits fails the range with probability 1 - 2^-64. */
/* session_id and x_pool_options.session both given: the pool option wins
 * and the first copy is freed (a fuzz run found it leaked; ASan says so). */
static void test_session_twice(void **state)
{
    (void)state;
    gps_job_spec s;
    char msg[256];
    const char *param = NULL;
    json_t *body = json_loads("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,"
                              "\"session_id\":\"abc\",\"x_pool_options\":{\"session\":\"xyz\"}}",
                              0, NULL);
    assert_non_null(body);
    assert_int_equal(gps_tasks_parse(body, &s, msg, sizeof msg, &param), 0);
    assert_string_equal(s.session, "xyz");
    gps_job_spec_clear(&s);
    json_decref(body);
}

static void test_generated_seed(void **state)
{
    (void)state;
    long long first = -1;
    bool varied = false;
    for (int i = 0; i < 64; i++) {
        gps_job_spec s;
        const char *param;
        char msg[256];
        assert_int_equal(parse("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1}", &s, &param,
                               msg, sizeof msg),
                         0);
        assert_true(s.has_seed);
        assert_in_range(s.seed, 0, 0x7fffffff);
        if (i == 0)
            first = s.seed;
        else if (s.seed != first)
            varied = true;
        gps_job_spec_clear(&s);
    }
    assert_true(varied);
}

static void test_bad(void **state)
{
    (void)state;
    bad("[1]", NULL);
    bad("{\"prompt\":\"p\",\"max_tokens\":5}", "model");
    bad("{\"model\":\"m\",\"max_tokens\":5}", "prompt");
    bad("{\"model\":\"m\",\"prompt\":\"p\"}", "max_tokens");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":0}", "max_tokens");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"messages\":[],\"max_tokens\":1}", "prompt");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}],\"max_tokens\":1}",
        "messages");
    bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}],\"max_tokens\":1}",
        "messages");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"priority\":\"urgent\"}", "priority");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"priority\":1}", "priority");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"seed\":\"x\"}", "seed");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"temperature\":3}", "temperature");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"stop\":[\"\"]}", "stop");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"session_id\":\"\"}", "session_id");
    bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":1,\"x_pool_options\":{\"labels\":[]}}",
        "x_pool_options.labels");
}

static void test_last_event_id(void **state)
{
    (void)state;
    assert_int_equal(gps_tasks_last_event_id(NULL), 0);
    assert_int_equal(gps_tasks_last_event_id(""), 0);
    assert_int_equal(gps_tasks_last_event_id("17"), 17);
    assert_int_equal(gps_tasks_last_event_id("-1"), -1);
    assert_int_equal(gps_tasks_last_event_id("1x"), -1);
    assert_int_equal(gps_tasks_last_event_id("99999999999999999999999"), -1);
}

/* tasks_status_cold under a failing allocator: every run gives the whole
 * status or NULL (the reply is then 500), never one without its result,
 * error, usage or timings. */
static void sweep_cold(const gps_store_job_info *j)
{
    json_t *want = tasks_status_cold(j);
    assert_non_null(want);
    size_t bad = 0, n;
    for (n = 1;; n++) {
        arm(n);
        json_t *got = tasks_status_cold(j);
        bool hit = disarm();
        if (got && !json_equal(got, want)) {
            print_message("run %zu: a status with a part missing\n", n);
            print_diff("status", got, want);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    assert_true(n > 3); /* the sweep reached the builder's allocations */
    assert_int_equal(bad, 0);
    json_decref(want);
}

static void test_status_cold_oom(void **state)
{
    (void)state;
    gps_store_job_info j = {.id = "job_1", .api = "native", .kind = "chat", .model = "m",
                            .agent_id = "a1", .status = "done", .attempts = 1,
                            .prompt_tokens = 5, .completion_tokens = 7, .queue_ms = 3,
                            .ttft_ms = 9, .total_ms = 40, .finish_reason = "length",
                            .has_seed = true, .seed = 42, .checkpoint_text = "Hello there",
                            .checkpoint_len = 11, .checkpoint_seq = -1};
    json_t *o = tasks_status_cold(&j), *want = J(
        "{\"job_id\":\"job_1\",\"status\":\"done\",\"model\":\"m\",\"priority\":"
        "\"interactive\",\"attempts\":1,\"agent_id\":\"a1\",\"seed\":42,\"timings\":"
        "{\"queue_ms\":3,\"ttft_ms\":9,\"total_ms\":40},\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":7},\"result\":{\"text\":\"Hello there\",\"finish_reason\":"
        "\"length\"}}");
    if (!json_equal(o, want)) {
        print_diff("status", o, want);
        fail();
    }
    json_decref(o);
    json_decref(want);
    sweep_cold(&j);
    j.status = "failed";
    j.error_code = "AGENT_LOST";
    j.has_seed = false;
    j.ttft_ms = -1;
    sweep_cold(&j);
}

/* ------------------------------------------------------------------ */
/* Event frames under the sweep (arm_beneath: libc's N-th allocation,   */
/* jansson's among them through gp_json's counting allocator)           */
/* ------------------------------------------------------------------ */

/* The frame json_dumps wrote for an event (the reference). */
static void want_frame(gp_buf *b, const json_t *ev)
{
    char *d = json_dumps(json_object_get(ev, "data"), JSON_COMPACT);
    assert_non_null(d);
    assert_int_equal(gp_buf_appendf(b, "event: %s\nid: %lld\ndata: %s\n\n",
                                    json_string_value(json_object_get(ev, "type")),
                                    (long long)json_integer_value(json_object_get(ev, "seq")),
                                    d),
                     0);
    free(d);
}

static bool same(const gp_buf *got, const gp_buf *want)
{
    return got->len == want->len && (!got->len || memcmp(got->data, want->data, got->len) == 0);
}

/* The end event of a long text (past CATCHUP_SLICE: written in slices),
 * its data's keys longer than jansson's dump buffer's first growths (the
 * head is dumped: json_dumps can leave a key out and succeed). */
static json_t *long_end_event(void)
{
    size_t n = CATCHUP_SLICE + CATCHUP_SLICE / 2;
    char *text = malloc(n + 1);
    assert_non_null(text);
    for (size_t i = 0; i < n; i++)
        text[i] = "Once upon a \"time\"\n there was "[i % 30];
    text[n] = '\0';
    json_t *ev = json_pack("{s:I,s:s,s:{s:s,s:{s:I,s:I},s:s}}", "seq", (json_int_t)5, "type",
                           "end", "data", "finish_reason_of_the_task", "length",
                           "usage_counted_by_the_agent", "prompt_tokens", (json_int_t)5,
                           "completion_tokens", (json_int_t)64, "text", text);
    free(text);
    assert_non_null(ev);
    return ev;
}

/* A subscriber's catch-up frames a long event a slice at a time; a slice
 * out of memory (-1) leaves out and the part as they were and is framed
 * again. Whatever allocation fails, the frames together are the event's
 * frame byte for byte. */
static void test_long_event_oom(void **state)
{
    (void)state;
    json_t *ev = long_end_event();
    gp_buf want;
    gp_buf_init(&want);
    want_frame(&want, ev);
    assert_true(want.len > CATCHUP_SLICE); /* framed in slices */
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        task_sub s;
        memset(&s, 0, sizeof s);
        gp_buf out;
        gp_buf_init(&out);
        bool armed = true, hit = false;
        arm_beneath(n);
        for (int tries = 0; tries < 64; tries++) {
            size_t len0 = out.len, part0 = s.part;
            int rc = tasks_frame_long_event(&out, &s, ev);
            if (rc < 0 && (out.len != len0 || s.part != part0)) {
                print_message("long event, run %zu: -1 with part of a slice written\n", n);
                bad++;
            }
            if (rc < 0 && armed) {
                hit = disarm(); /* tried again, as the tick does */
                armed = false;
            }
            if (rc == 1)
                break;
        }
        if (armed)
            hit = disarm();
        if (!same(&out, &want)) {
            print_message("long event, run %zu: the frame differs (%zu bytes, want %zu)\n", n,
                          out.len, want.len);
            bad++;
        }
        gp_buf_free(&out);
        if (!hit)
            break;
    }
    print_message("long event: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    assert_true(n > 3);
    gp_buf_free(&want);
    json_decref(ev);
    assert_int_equal(bad, 0);
}

/* A follower (a task another server runs) frames the stored batches it
 * reads: a batch is the owner's dump, loaded here (texts past the
 * loader's token buffer of 16, 32 and 64 bytes). Out of memory (-1)
 * stops at the first event not framed, and the next read (the same
 * batch) goes on from there: the stream is the events' frames, each once,
 * each as stored (jansson 2.14's loader can drop a byte of a long string
 * and succeed). */
static void test_follow_batch_oom(void **state)
{
    (void)state;
    json_t *evs = J("[{\"seq\":1,\"type\":\"started\",\"data\":{\"agent_id\":"
                    "\"agent_of_a_long_name\",\"attempt\":1}},"
                    "{\"seq\":2,\"type\":\"token\",\"data\":{\"text\":"
                    "\"Once upon a time there was a king who had three daughters\"}},"
                    "{\"seq\":3,\"type\":\"end\",\"data\":{\"finish_reason\":\"stop\","
                    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":12},"
                    "\"text\":\"Once upon a time there was a king who had three daughters, "
                    "and the youngest of them was the fairest of all\"}}]");
    char *text = json_dumps(evs, JSON_COMPACT);
    assert_non_null(text);
    gp_buf want;
    gp_buf_init(&want);
    for (size_t i = 1; i < json_array_size(evs); i++) /* after Last-Event-ID 1 */
        want_frame(&want, json_array_get(evs, i));
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        follow f;
        memset(&f, 0, sizeof f);
        f.next = 1;
        f.after = 1;
        arm_beneath(n);
        int rc = tasks_follow_frame_batch(&f, text);
        bool hit = disarm();
        if (rc < 0)
            rc = tasks_follow_frame_batch(&f, text); /* the next read */
        if (rc != 1 || f.next != 4 || !same(&f.s.out, &want)) {
            print_message("follow batch, run %zu: rc %d, next %lld, %zu bytes (want 1, 4, %zu)\n",
                          n, rc, f.next, f.s.out.len, want.len);
            bad++;
        }
        gp_buf_free(&f.s.out);
        if (!hit)
            break;
    }
    print_message("follow batch: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    assert_true(n > 3);
    gp_buf_free(&want);
    free(text);
    json_decref(evs);
    assert_int_equal(bad, 0);
}

/* A replay from the store (a task no longer in memory) is framed before
 * the stream starts: whole, or -1 with nothing framed (the request's 500),
 * never a replay with an event left out. */
static int sweep_cold_frames(const char *label, const gps_store_job_info *j, long long last_id)
{
    gp_buf want;
    gp_buf_init(&want);
    long long want_next = 0, next;
    int want_rc = tasks_cold_frames(j, last_id, &want, &want_next);
    assert_true(want_rc >= 0);
    assert_true(want.len > 0);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gp_buf out;
        gp_buf_init(&out);
        next = 0;
        arm_beneath(n);
        int rc = tasks_cold_frames(j, last_id, &out, &next);
        bool hit = disarm();
        if (rc < 0 ? out.len != 0 || !hit
                   : rc != want_rc || next != want_next || !same(&out, &want)) {
            print_message("%s, run %zu: rc %d, %zu bytes (want %d, %zu)\n", label, n, rc, out.len,
                          want_rc, want.len);
            bad++;
        }
        gp_buf_free(&out);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", label, n - 1, bad);
    assert_true(n > 3);
    gp_buf_free(&want);
    return bad;
}

static void test_cold_frames_oom(void **state)
{
    (void)state;
    /* Token texts of some KiB: the frames outgrow the buffer a few times. */
    char tok[3001];
    for (size_t i = 0; i < sizeof tok - 1; i++)
        tok[i] = "a \"quoted\" word\n"[i % 16];
    tok[sizeof tok - 1] = '\0';
    json_t *evs = J("[{\"seq\":1,\"type\":\"queued\",\"data\":{\"position\":0,"
                    "\"estimated_wait_ms\":0}},"
                    "{\"seq\":2,\"type\":\"started\",\"data\":{\"agent_id\":\"a1\","
                    "\"attempt\":1}}]");
    for (int i = 0; i < 4; i++)
        assert_int_equal(json_array_append_new(evs, json_pack("{s:i,s:s,s:{s:s}}", "seq", 3 + i,
                                                              "type", "token", "data", "text",
                                                              tok)),
                         0);
    assert_int_equal(json_array_append_new(
                         evs, J("{\"seq\":7,\"type\":\"end\",\"data\":{\"finish_reason\":"
                                "\"stop\",\"usage\":{\"prompt_tokens\":5,"
                                "\"completion_tokens\":4},\"text\":\"(the tokens)\"}}")),
                     0);
    gps_store_job_info j = {.id = "job_1", .api = "native", .kind = "completion", .model = "m",
                            .status = "done", .finished_at = 1700000000000, .events = evs,
                            .checkpoint_seq = -1};
    int bad = sweep_cold_frames("replay of the log", &j, 1);
    /* No log (finished before migration 0002): the end made from the row. */
    gps_store_job_info k = {.id = "job_2", .api = "native", .kind = "completion", .model = "m",
                            .status = "done", .finished_at = 1700000000000,
                            .finish_reason = "length", .prompt_tokens = 5,
                            .completion_tokens = 2, .checkpoint_text = "Hello there",
                            .checkpoint_len = 11, .checkpoint_seq = 7};
    bad += sweep_cold_frames("replay from the row", &k, 0);
    json_decref(evs);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------------------------ */
/* A failed task read back from a real SQLite file says its message   */
/* ------------------------------------------------------------------ */

typedef struct cold_read {
    int calls, status;
    json_t *status_body;   /* tasks_status_cold's */
    json_t *error_data;    /* data of the replayed terminal event */
} cold_read;

/* The replay's last frame's data: "data: {...}\n\n" at the end of out. */
static json_t *last_frame_data(const gp_buf *out)
{
    const char *d = NULL;
    for (const char *p = out->data; p && p < out->data + out->len; p++) {
        p = memmem(p, (size_t)(out->data + out->len - p), "data: ", 6);
        if (!p)
            break;
        d = p + 6;
    }
    assert_non_null(d);
    json_error_t e;
    json_t *v = json_loadb(d, strcspn(d, "\n"), 0, &e);
    assert_non_null(v);
    return v;
}

static void on_cold(void *arg, int status, const gps_store_job_info *j)
{
    cold_read *r = arg;
    r->calls++;
    r->status = status;
    if (status != 0)
        return;
    r->status_body = tasks_status_cold(j);
    gp_buf out = {0};
    long long next;
    assert_true(tasks_cold_frames(j, 0, &out, &next) >= 0);
    r->error_data = last_frame_data(&out);
    gp_buf_free(&out);
}

/* Read job id from the store s and check what GET and a replay say. */
static void check_cold(struct event_base *base, gps_store *s, const char *id,
                       const char *code, const char *message)
{
    cold_read r = {0};
    assert_int_equal(gps_store_job_get_async(s, id, on_cold, &r), 0);
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 2000 && !r.calls; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, 0);
    json_t *want = json_pack("{s:s,s:s}", "code", code, "message", message);
    json_t *got = json_object_get(r.status_body, "error");
    if (!json_equal(got, want)) {
        print_diff("GET error", got, want);
        fail();
    }
    if (!json_equal(r.error_data, want)) {
        print_diff("replayed error event", r.error_data, want);
        fail();
    }
    json_decref(want);
    json_decref(r.status_body);
    json_decref(r.error_data);
}

/* A native task's row ended failed with its code and message, no event
 * log (its last batch never recorded: the replay rebuilds the event). */
static void fail_row(gps_store *s, const char *id, const char *code, const char *message)
{
    json_t *req = json_pack("{s:s,s:s}", "model", "m", "prompt", "hi");
    assert_non_null(req);
    gps_store_job_row row = {.id = id, .api = "native", .kind = "completion", .model = "m",
                             .status = "queued", .created_at = 1000, .request = req};
    assert_int_equal(gps_store_job_insert(s, row), 0);
    json_decref(req);
    gps_store_job_update u = GPS_STORE_JOB_UPDATE_INIT(id);
    u.status = "failed";
    u.error_code = code;
    u.error_message = message;
    u.finished_at = 2000;
    assert_int_equal(gps_store_job_update_async(s, u), 0);
    assert_int_equal(gps_store_flush(s), 0);
}

static void copy_migration(const char *dir, const char *name)
{
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/migrations/%s", GP_SOURCE_DIR, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    size_t len;
    char *sql = gp_read_file(src, &len, 1 << 20);
    assert_non_null(sql);
    FILE *f = fopen(dst, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(sql, 1, len, f), len);
    fclose(f);
    free(sql);
}

static void test_failed_row_message(void **state)
{
    (void)state;
    char dir[] = "/tmp/gp_taskmsg_XXXXXX", db[128], mdir[128], cmd[256];
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/pool.db", dir);
    snprintf(mdir, sizeof mdir, "%s/mig", dir);
    assert_int_equal(mkdir(mdir, 0755), 0);
    /* A DB of the version before 0014 (its migrations as shipped). */
    static const char *const older[] = {
        "0001_init.sql", "0002_job_events.sql", "0003_key_limits.sql",
        "0004_jobs_created_index.sql", "0005_model_pins.sql", "0006_responses.sql",
        "0007_deployments.sql", "0008_responses_trim_index.sql", "0009_servers.sql",
        "0010_task_leases.sql", "0011_handoffs.sql", "0012_task_cancel.sql",
        "0013_server_free.sql"};
    for (size_t i = 0; i < sizeof older / sizeof older[0]; i++)
        copy_migration(mdir, older[i]);
    struct event_base *base = event_base_new();
    assert_non_null(base);
    char err[512] = "";
    gps_store_opts o = {.migrations_dir = mdir};
    gps_store *s = gps_store_open(db, base, &o, err, sizeof err);
    if (!s)
        fail_msg("open (older schema): %s", err);
    /* The older schema has no column: the rest of the row is written. */
    fail_row(s, "t_old", "AGENT_LOST", "the agent was lost while generating");
    gps_store_close(s);

    /* This binary's migrations, 0014 applied to the older DB. */
    s = gps_store_open(db, base, NULL, err, sizeof err);
    if (!s)
        fail_msg("open (migrated): %s", err);
    const char *lost = "the agent was lost while generating; no other agent could continue";
    fail_row(s, "t_lost", "AGENT_LOST", lost);
    /* An agent's own message past the bound: cut at 1 KiB, before the
     * 3-byte character that would straddle it. */
    char big[1100];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memcpy(big + 1022, "\xe2\x82\xac", 3); /* bytes 1022..1024: past the bound */
    fail_row(s, "t_big", "CONTEXT_OVERFLOW", big);
    gps_store_close(s);

    /* After a restart: read back from the file. */
    s = gps_store_open(db, base, NULL, err, sizeof err);
    if (!s)
        fail_msg("reopen: %s", err);
    check_cold(base, s, "t_lost", "AGENT_LOST", lost);
    big[1022] = '\0';
    check_cold(base, s, "t_big", "CONTEXT_OVERFLOW", big);
    /* A row written before 0014 keeps today's answer: its code. */
    check_cold(base, s, "t_old", "AGENT_LOST", "AGENT_LOST");
    gps_store_close(s);
    event_base_free(base);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    gp_json_init(); /* before arm swaps jansson's allocator (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ok),
        cmocka_unit_test(test_generated_seed),
        cmocka_unit_test(test_session_twice),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_last_event_id),
        cmocka_unit_test(test_status_cold_oom),
        cmocka_unit_test(test_long_event_oom),
        cmocka_unit_test(test_follow_batch_oom),
        cmocka_unit_test(test_cold_frames_oom),
        cmocka_unit_test(test_failed_row_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

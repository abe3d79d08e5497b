/* The jobs module under memory pressure (fixture_oom.h arm_beneath: the
 * N-th of the project's malloc, calloc, realloc or strdup fails, jansson's
 * through gp_json's counting allocator; N = 1, 2, ... until a run ends
 * without reaching it). What a client gets of its job is whole, or the
 * failure is the server's own and says so (INTERNAL, 500): never a token
 * missing from the middle of the text, never an event one subscriber got
 * and another did not, never an error event without its tree (a relay
 * tells one as the agent's failure, 502 AGENT_ERROR).
 *
 * Two subscribers on every job, in fixed storage (their callbacks run
 * under the failing allocator too): one that reads trees, as a native
 * task or a hand-off's proxy does, and a cursor one that reads the job's
 * text, as the relay does. Real registry, scheduler and jobs table
 * (fixture_fleet.h); an upload read by the real reader (upload_read.h).
 * And what the jobs module hands on of a job: a resumed task's text, an
 * offer's wire and constraints, whole or not at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/gp_json.h"
#include "fixture_fleet.h"
#include "fixture_oom.h"
#include "server/jobs/jobs.h"
#include "server/upload_read.h"

#define D1 "1111111111111111111111111111111111111111111111111111111111111111"

/* Memory that stays short: from the sweep's failure on, every allocation
 * of jansson's fails too (until disarm), through gp_json's counting
 * allocator as a real one would. One failure alone never fails a checked
 * load of a text the fast reader takes (gp_json_loadb: the reader gives
 * up, jansson's load then succeeds); a second one does. */
static json_malloc_t counting_malloc; /* gp_json_init's */
static bool persist;

static void *persisting_malloc(size_t n)
{
    if (persist && injected)
        countdown = 1; /* fail_now fails the next allocation: this one */
    return counting_malloc(n);
}

static void arm_persisting(size_t n, bool on)
{
    persist = on;
    arm_beneath(n);
}

static bool disarm_persisting(void)
{
    persist = false;
    return disarm();
}

/* What one subscriber saw. */
typedef struct seen {
    char text[2048];
    size_t len;
    bool overflow;
    int started, metrics, ends, failovers, errors;
    int no_tree;           /* events without the tree this subscriber reads */
    char code[48];         /* the last error event's */
    int status;
    long long retry_after;
} seen;

static void seen_text(seen *s, const char *t, size_t n)
{
    if (s->len + n >= sizeof s->text) {
        s->overflow = true;
        return;
    }
    memcpy(s->text + s->len, t, n);
    s->len += n;
    s->text[s->len] = '\0';
}

static void seen_error(seen *s, const json_t *ev)
{
    s->errors++;
    snprintf(s->code, sizeof s->code, "%s",
             json_string_value(json_object_get(ev, "code")) ? json_string_value(
                                                                  json_object_get(ev, "code"))
                                                            : "(none)");
    s->status = (int)json_integer_value(json_object_get(ev, "status"));
    s->retry_after = json_integer_value(json_object_get(ev, "retry_after"));
}

static void seen_count(seen *s, gps_event_type t)
{
    s->started += t == GPS_EV_STARTED;
    s->metrics += t == GPS_EV_METRICS;
    s->ends += t == GPS_EV_END;
    s->failovers += t == GPS_EV_FAILOVER;
}

/* A native task's way: every event's tree, a token's text from it. */
static void on_tree(gps_job *job, gps_event_type t, json_t *ev, void *arg)
{
    (void)job;
    seen *s = arg;
    if (!ev) {
        s->no_tree++;
        return;
    }
    seen_count(s, t);
    if (t == GPS_EV_TOKEN) {
        const char *x = json_string_value(json_object_get(ev, "text"));
        if (x)
            seen_text(s, x, strlen(x));
        else
            s->no_tree++;
    }
    if (t == GPS_EV_ERROR)
        seen_error(s, ev);
}

/* The relay's way: a token's text from the job's text at its cursor; an
 * error's fields from its tree (relay.c gps_relay_fail). */
static void on_cursor(gps_job *job, gps_event_type t, json_t *ev, void *arg)
{
    seen *s = arg;
    seen_count(s, t);
    if (t == GPS_EV_TOKEN && gps_job_text_len(job) > s->len)
        seen_text(s, gps_job_text(job) + s->len, gps_job_text_len(job) - s->len);
    if (t == GPS_EV_ERROR) {
        if (ev)
            seen_error(s, ev);
        else
            s->no_tree++;
    }
}

/* One run's fleet: agent a (digest D1: its token ids are kept), agent b
 * (the same model, for a failover), and a job of a's with both
 * subscribers. */
typedef struct run {
    fleet f;
    registry_agent *a, *b;
    gps_job *job;
    seen tree, cur;
} run;

/* The run's job, of spec s, submitted with both subscribers. */
static void run_submit(run *r, gps_job_spec *s)
{
    r->job = fleet_submit(&r->f, s);
    assert_int_equal(gps_job_subscribe(r->job, on_tree, &r->tree), 0);
    assert_int_equal(gps_job_subscribe_cursor(r->job, on_cursor, &r->cur), 0);
}

static void run_start(run *r, const gps_jobs_opts *o)
{
    memset(r, 0, sizeof *r);
    fleet_init(&r->f, o, NULL);
    r->a = fleet_agent(&r->f, 1, "m1", D1, 2, 1000);
    gps_job_spec s = fleet_spec("m1", 64);
    run_submit(r, &s);
    json_decref(fleet_take(&r->f, r->a));
    r->b = fleet_agent(&r->f, 2, "m1", D1, 2, 1000);
}

static void run_end(run *r)
{
    if (!gps_job_terminal(r->job))
        gps_jobs_cancel(r->f.jobs, r->job, "test");
    fleet_free(&r->f);
}

/* ---- an agent's upload ---- */

/* The tokens of the uploads: 700 bytes in all, so that the job's text
 * grows three times (gp_buf: 256, 512, 1024). */
#define NTOK 8
static const char *const TOK[NTOK] = {
    "Once upon a time",
    ", in a datacenter far away, ",
    "a model wrote a reply long enough that the buffer holding it had to grow more than once "
    "while it was being relayed to the client who asked for it, ",
    "and every token of it mattered: ",
    "a token missing from the middle of a reply is a reply quietly changed, which is worse "
    "than a reply refused, because nobody can tell; ",
    "so the server either takes a token whole or refuses the upload that carries it, and the "
    "agent sends it again, its sequence number telling the server what it already has. ",
    "The end",
    ".",
};

static void want_text(char *out, size_t cap)
{
    out[0] = '\0';
    for (int i = 0; i < NTOK; i++)
        strncat(out, TOK[i], cap - strlen(out) - 1);
}

/* The events as the agent writes them: started, the tokens (each with its
 * token_id; in the tree form every other one with token_ids too), a
 * metrics event after the third, the end with the stop string it stopped
 * on. */
static void events_text(char *out, size_t cap, bool with_ids)
{
    size_t n = (size_t)snprintf(out, cap, "[{\"type\":\"started\"}");
    for (int i = 0; i < NTOK; i++) {
        if (with_ids && i % 2)
            n += (size_t)snprintf(out + n, cap - n,
                                  ",{\"type\":\"token\",\"text\":\"%s\",\"token_id\":%d,"
                                  "\"token_ids\":[%d]}",
                                  TOK[i], 100 + i, 100 + i);
        else
            n += (size_t)snprintf(out + n, cap - n,
                                  ",{\"type\":\"token\",\"text\":\"%s\",\"token_id\":%d}", TOK[i],
                                  100 + i);
        if (i == 2)
            n += (size_t)snprintf(out + n, cap - n,
                                  ",{\"type\":\"metrics\",\"tokens_per_sec\":12.5,"
                                  "\"prompt_tokens\":3}");
    }
    snprintf(out + n, cap - n,
             ",{\"type\":\"end\",\"finish_reason\":\"stop\",\"stop_sequence\":\"THE END\","
             "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d}}]",
             NTOK);
}

/* The job as its agent's events left it, and what both subscribers got:
 * all of it. false (printed) otherwise. */
static bool upload_whole(const run *r, size_t n)
{
    char want[2048];
    want_text(want, sizeof want);
    const gps_job *job = r->job;
    bool ok = true;
#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            print_message("run %zu: ", n);                                                      \
            print_message(__VA_ARGS__);                                                         \
            print_message("\n");                                                                \
            ok = false;                                                                         \
        }                                                                                       \
    } while (0)
    CHECK(gps_job_state_of(job) == GPS_JOB_DONE, "the job is %s",
          gps_job_state_name(gps_job_state_of(job)));
    CHECK(strcmp(gps_job_text(job), want) == 0, "the job's text is '%s'", gps_job_text(job));
    CHECK(gps_job_completion_tokens(job) == NTOK, "%lld tokens",
          gps_job_completion_tokens(job));
    CHECK(gps_job_stop_sequence(job) && strcmp(gps_job_stop_sequence(job), "THE END") == 0,
          "the stop sequence is %s",
          gps_job_stop_sequence(job) ? gps_job_stop_sequence(job) : "(none)");
    CHECK(gps_job_ids_digest(job) && job->n_gen_ids == NTOK,
          "token-exact continuation lost (%zu ids, digest %s)", job->n_gen_ids,
          gps_job_ids_digest(job) ? "kept" : "dropped");
    CHECK(strcmp(r->tree.text, want) == 0, "the tree subscriber got '%s'", r->tree.text);
    CHECK(r->tree.no_tree == 0, "the tree subscriber got %d event(s) without a tree",
          r->tree.no_tree);
    CHECK(r->tree.started == 1 && r->tree.metrics == 1 && r->tree.ends == 1,
          "the tree subscriber got %d started, %d metrics, %d end", r->tree.started,
          r->tree.metrics, r->tree.ends);
    CHECK(strcmp(r->cur.text, want) == 0, "the cursor subscriber got '%s'", r->cur.text);
    CHECK(r->cur.ends == 1 && r->cur.errors == 0, "the cursor subscriber got %d end, %d error",
          r->cur.ends, r->cur.errors);
#undef CHECK
    return ok;
}

typedef struct upload_src {
    bool plain;      /* read by upload_read (tokens without trees), else a tree */
    gps_upload u;
    json_t *events;
} upload_src;

/* The agent's upload of the events from seq 0: the return of
 * gps_jobs_apply_upload or gps_jobs_apply_events. */
static int upload(run *r, upload_src *src, char *msg, size_t msglen)
{
    bool cancel = false;
    long long exp = -1;
    if (src->plain) {
        const gps_upload_job *jb = &src->u.jobs[0];
        return gps_jobs_apply_upload(r->f.jobs, jb->job_id, r->a->id, jb->seq,
                                     src->u.evs + jb->first, jb->n, &cancel, &exp, msg, msglen);
    }
    return gps_jobs_apply_events(r->f.jobs, gps_job_id(r->job), r->a->id, 0, src->events,
                                 &cancel, &exp, msg, msglen);
}

static void upload_sweep(bool plain, bool persistent)
{
    size_t n, bad = 0, refused = 0;
    for (n = 1;; n++) {
        run r;
        run_start(&r, NULL);
        static char evs[4096], body[4600];
        events_text(evs, sizeof evs, !plain);
        upload_src src = {.plain = plain};
        if (plain) {
            int len = snprintf(body, sizeof body,
                               "{\"agent_id\":\"%s\",\"jobs\":[{\"job_id\":\"%s\",\"seq\":0,"
                               "\"events\":%s}]}",
                               r.a->id, gps_job_id(r.job), evs);
            assert_true(gps_upload_read(body, (size_t)len, 16, &src.u));
            assert_int_equal(src.u.n_jobs, 1);
            /* the hot shape: tokens without trees, the others plain */
            for (size_t i = 0; i < src.u.n_evs; i++)
                assert_true(src.u.evs[i].plain || !src.u.evs[i].ev);
        } else {
            src.events = json_loads(evs, 0, NULL);
            assert_non_null(src.events);
        }
        char msg[256] = "";
        arm_persisting(n, persistent);
        int rc = upload(&r, &src, msg, sizeof msg);
        bool hit = disarm_persisting();
        if (rc == 500) {
            /* Refused for want of memory: the agent sends the same events
             * again (agent_upload.c: a 5xx is retried), and seq skips
             * those already applied. */
            if (strcmp(msg, "out of memory") != 0) {
                print_message("run %zu: refused 500 '%s'\n", n, msg);
                bad++;
            }
            refused++;
            rc = upload(&r, &src, msg, sizeof msg);
        }
        if (rc != 0) {
            print_message("run %zu: the upload got %d (%s)\n", n, rc, msg);
            bad++;
        } else if (!upload_whole(&r, n)) {
            bad++;
        }
        if (plain)
            gps_upload_free(&src.u);
        json_decref(src.events);
        run_end(&r);
        if (!hit)
            break;
    }
    print_message("%s upload sweep%s: %zu runs, %zu refused for want of memory\n",
                  plain ? "plain" : "tree", persistent ? " (memory stays short)" : "", n,
                  refused);
    assert_true(n > 20);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
}

/* An upload read without trees (upload_read.h): every token whole in the
 * job's text and with both subscribers, the plain started, metrics and end
 * given as trees to the subscriber that reads them, the stop string and
 * the token ids kept, or the upload refused 500 and sent again. The code
 * before dropped a token whose text could not be appended (its seq and
 * count moving on), or whose tree could not be made (the tree subscriber
 * went without it), handed the tree subscriber a NULL started, metrics or
 * end, ended the job without its stop string, and ended token-exact
 * continuation for good where its ids could not be stored. */
static void test_plain_upload_oom(void **state)
{
    (void)state;
    upload_sweep(true, false);
}

/* The same with memory that stays short once it ran out: where the plain
 * started, metrics or end's tree could not be read back, the code before
 * handed the tree subscriber NULL (a native task recorded an empty
 * metrics event, a hand-off's proxy never relayed the end). */
static void test_plain_upload_oom_persisting(void **state)
{
    (void)state;
    upload_sweep(true, true);
}

/* The same events as trees (gps_jobs_apply_events: the per-job route, the
 * hand-off's relayed batches), some tokens with token_ids. */
static void test_tree_upload_oom(void **state)
{
    (void)state;
    upload_sweep(false, false);
}

/* ---- events the server makes ---- */

/* What a run of the server-made events sweep does under the failing
 * allocator. */
typedef enum { CANCEL, EXHAUSTED, FINISH_EARLY, FAILOVER } server_event;
static const char *const SERVER_EVENT[] = {"cancel", "attempts exhausted", "finish early",
                                           "failover"};

/* The error a subscriber got is ok: code with status (and retry_after),
 * or the server's own out of memory. */
static bool error_ok(const seen *s, const char *code, int status, long long retry_after)
{
    if (s->errors != 1)
        return false;
    if (strcmp(s->code, "INTERNAL") == 0)
        return s->status == 500;
    return strcmp(s->code, code) == 0 && s->status == status && s->retry_after == retry_after;
}

static bool server_event_ok(const run *r, server_event what, size_t n)
{
    const seen *t = &r->tree, *c = &r->cur;
    bool ok = t->no_tree == 0 && c->no_tree == 0;
    switch (what) {
    case CANCEL: /* the row's status goes with what was told: failed for INTERNAL */
        ok = ok && error_ok(t, "CANCELLED", 499, 0) && error_ok(c, "CANCELLED", 499, 0) &&
             gps_job_state_of(r->job) ==
                 (strcmp(t->code, "INTERNAL") == 0 ? GPS_JOB_FAILED : GPS_JOB_CANCELLED);
        break;
    case EXHAUSTED:
        ok = ok && error_ok(t, "AGENT_LOST", 503, 1) && error_ok(c, "AGENT_LOST", 503, 1);
        break;
    case FINISH_EARLY: /* ended, or failed as the server's own */
        ok = ok && ((t->ends == 1 && t->errors == 0 && c->ends == 1 &&
                     gps_job_state_of(r->job) == GPS_JOB_DONE) ||
                    (error_ok(t, "INTERNAL", 500, 0) && error_ok(c, "INTERNAL", 500, 0) &&
                     gps_job_state_of(r->job) == GPS_JOB_FAILED));
        break;
    case FAILOVER: /* continued with the event told, or failed (any error, with its tree) */
        ok = ok && ((t->failovers == 1 && !gps_job_terminal(r->job)) ||
                    (t->errors == 1 && c->errors == 1 && gps_job_terminal(r->job)));
        break;
    }
    /* The request log row (jobs_persist: the job's error code) says what
     * the client was told: the server's own INTERNAL when that went. */
    bool row_ok = t->errors == 0 || strcmp(gps_job_error_code(r->job), t->code) == 0;
    if (!row_ok)
        print_message("run %zu (%s): the client was told %s, the row says %s\n", n,
                      SERVER_EVENT[what], t->code, gps_job_error_code(r->job));
    ok = ok && row_ok;
    if (!ok)
        print_message("run %zu (%s): tree subscriber: %d without a tree, %d end, %d failover, "
                      "%d error (%s %d retry %lld); cursor one: %d without a tree, %d error "
                      "(%s %d); the job %s\n",
                      n, SERVER_EVENT[what], t->no_tree, t->ends, t->failovers, t->errors,
                      t->code, t->status, t->retry_after, c->no_tree, c->errors, c->code,
                      c->status, gps_job_state_name(gps_job_state_of(r->job)));
    return ok;
}

static void server_event_sweep(server_event what)
{
    gps_jobs_opts o = fleet_opts();
    if (what == EXHAUSTED)
        o.max_attempts = 1;
    size_t n, bad = 0;
    for (n = 1;; n++) {
        run r;
        run_start(&r, &o);
        /* A token first: the job is RUNNING, and (a failover) its client
         * has output, so that another agent continues it. */
        assert_int_equal(fleet_apply(&r.f, r.job, r.a, 0,
                                     "[{\"type\":\"token\",\"text\":\"hi\",\"token_id\":1}]"),
                         0);
        gps_job_mark_output_sent(r.job);
        arm_beneath(n);
        switch (what) {
        case CANCEL:
            gps_jobs_cancel(r.f.jobs, r.job, "test");
            break;
        case EXHAUSTED:
        case FAILOVER:
            gps_jobs_agent_lost(r.f.jobs, r.a->id, "test");
            break;
        case FINISH_EARLY:
            gps_jobs_finish_early(r.f.jobs, r.job, "stop");
            break;
        }
        bool hit = disarm();
        bad += !server_event_ok(&r, what, n);
        run_end(&r);
        if (!hit)
            break;
    }
    print_message("%s sweep: %zu runs\n", SERVER_EVENT[what], n);
    assert_true(n > 3);
    assert_int_equal(bad, 0);
}

/* The events the server makes itself (a job cancelled, failed, finished
 * early, failed over) reach every subscriber with their trees: an error
 * with its code, status and retry_after, or the server's own out of
 * memory (INTERNAL, 500); an end or a failover that cannot be made fails
 * the job as the server's own when a subscriber reads trees. The code
 * before handed them NULL: a relay told the client 502 AGENT_ERROR (the
 * agent blamed), a native task's stream went without its failover and end
 * (or recorded AGENT_ERROR "the job failed"). A cancel whose subscribers
 * were told the server's INTERNAL ends failed, not cancelled (the row said
 * cancelled with the code INTERNAL before). */
static void test_cancel_oom(void **state)
{
    (void)state;
    server_event_sweep(CANCEL);
}

/* (jobs_fail_job, with a retry_after) */
static void test_attempts_exhausted_oom(void **state)
{
    (void)state;
    server_event_sweep(EXHAUSTED);
}

static void test_finish_early_oom(void **state)
{
    (void)state;
    server_event_sweep(FINISH_EARLY);
}

static void test_failover_event_oom(void **state)
{
    (void)state;
    server_event_sweep(FAILOVER);
}

/* ---- cancel records an agent's poll carries ---- */

/* The cancel a poll reply carries (gps_jobs_pending_cancels) stays on
 * record until the reply that carries it is written (gps_jobs_cancels_sent):
 * a list that cannot be made (out of memory: the poll is answered 500)
 * loses none of them. The code before dropped each record as it read it,
 * its command made or not: the agent never heard of the cancel and went
 * on generating for a client that had left. */
static bool cancels_hold(const json_t *cmds, const char *const *ids, size_t n_ids)
{
    if (json_array_size(cmds) != n_ids)
        return false;
    for (size_t i = 0; i < n_ids; i++) {
        bool found = false;
        size_t k;
        const json_t *c;
        json_array_foreach(cmds, k, c)
        {
            found |= strcmp(json_string_value(json_object_get(c, "type")), "cancel") == 0 &&
                     strcmp(json_string_value(json_object_get(c, "job_id")), ids[i]) == 0;
        }
        if (!found)
            return false;
    }
    return true;
}

/* Agent ag takes one job of f's queue: its id (into id). */
static void take_id(fleet *f, registry_agent *ag, char *id, size_t cap)
{
    json_t *w = fleet_take(f, ag);
    snprintf(id, cap, "%s", json_string_value(json_object_get(w, "job_id")));
    json_decref(w);
}

/* ag's next work request takes job, first in line. */
static void takes(fleet *f, registry_agent *ag, const gps_job *job)
{
    json_t *w = fleet_take(f, ag);
    assert_string_equal(json_string_value(json_object_get(w, "job_id")), job->id);
    json_decref(w);
}

/* n jobs of m1 submitted to f, in order. */
static void submit_m1(fleet *f, gps_job **jobs, int n)
{
    for (int i = 0; i < n; i++) {
        gps_job_spec s = fleet_spec("m1", 64);
        jobs[i] = fleet_submit(f, &s);
    }
}

static void test_pending_cancels_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, none = 0;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 2, 1000);
        registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
        gps_job *jobs[3];
        submit_m1(&f, jobs, 3);
        char ida[2][40], idb[40];
        take_id(&f, a, ida[0], sizeof ida[0]);
        take_id(&f, a, ida[1], sizeof ida[1]);
        take_id(&f, b, idb, sizeof idb);
        /* Their clients leave: each agent is to be told to stop its jobs. */
        for (int i = 0; i < 3; i++)
            gps_jobs_cancel(f.jobs, jobs[i], "client left");
        const char *IDS[] = {ida[0], ida[1]};
        arm_beneath(n);
        json_t *cmds = gps_jobs_pending_cancels(f.jobs, a->id);
        bool hit = disarm();
        if (cmds && !cancels_hold(cmds, IDS, 2)) {
            char *t = json_dumps(cmds, JSON_COMPACT);
            print_message("run %zu: a list short of a cancel: %s\n", n, t ? t : "?");
            free(t);
            bad++;
        }
        none += cmds == NULL;
        /* Not written (NULL, or a reply that then failed): the next poll's
         * list has them all; written, they are gone. */
        json_t *again = gps_jobs_pending_cancels(f.jobs, a->id);
        if (!cancels_hold(again, IDS, 2)) {
            char *t = json_dumps(again, JSON_COMPACT);
            print_message("run %zu: the next poll's list: %s\n", n, t ? t : "?");
            free(t);
            bad++;
        }
        gps_jobs_cancels_sent(f.jobs, a->id, again);
        json_t *after = gps_jobs_pending_cancels(f.jobs, a->id);
        assert_int_equal(json_array_size(after), 0);
        const char *IDB[] = {idb};
        json_t *other = gps_jobs_pending_cancels(f.jobs, b->id);
        assert_true(cancels_hold(other, IDB, 1)); /* another agent's are its own */
        json_decref(cmds);
        json_decref(again);
        json_decref(after);
        json_decref(other);
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("pending cancels sweep: %zu runs, %zu without a list\n", n, none);
    assert_true(none > 0);
    assert_int_equal(bad, 0);
}

/* ---- a job handed to a parked long-poll ---- */

/* The deliver callback of the sweep: what agents_api's does, without its
 * HTTP (the wire text kept in fixed storage: nothing allocated under the
 * failing allocator). NULL jobs: the job could not be written, the poll
 * is answered 500. */
typedef struct parked {
    fleet *f;
    int delivered, refused;
    char wire[4096];
    size_t len;
} parked;

static long long parked_deliver(registry_agent *a, const gp_buf *jobs, void *arg)
{
    parked *p = arg;
    sched_agent_unready(p->f->s, a);
    if (!jobs) {
        p->refused++;
        return -1;
    }
    p->delivered++;
    p->len = jobs->len < sizeof p->wire ? jobs->len : 0;
    if (p->len)
        memcpy(p->wire, jobs->data, p->len);
    return 7;
}

/* The one job the wire text carries is job (read after the sweep). */
static bool wire_is(const parked *p, const gps_job *job)
{
    json_t *arr = json_loadb(p->wire, p->len, 0, NULL);
    const char *id = json_string_value(json_object_get(json_array_get(arr, 0), "job_id"));
    bool ok = json_array_size(arr) == 1 && id && strcmp(id, job->id) == 0;
    json_decref(arr);
    return ok;
}

/* A job submitted while an agent's long-poll is parked goes to it at once
 * (jobs_deliver_to), whole: or, its wire not written (out of memory), the
 * poll is answered 500 and the job is back in the queue, unassigned, its
 * attempt not counted, for the next poll to take: never assigned to an
 * agent that got no job (the code before handed it an empty text and left
 * the job assigned, until a failover long after). */
static void test_deliver_to_parked_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, requeued = 0;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        parked p = {.f = &f};
        gps_jobs_set_deliver(f.jobs, parked_deliver, &p);
        registry_agent *a = fleet_agent(&f, 1, "m1", NULL, 1, 1000);
        gp_buf none;
        gp_buf_init(&none);
        /* Its long-poll parked: no job yet, the agent ready in the scheduler. */
        assert_int_equal(gps_jobs_take_for_agent(f.jobs, a, 1, 0, &none), 0);
        gp_buf_free(&none);
        gps_job_spec s = fleet_spec("m1", 64);
        gps_submit_err err = {0};
        arm_beneath(n);
        gps_job *job = gps_jobs_submit(f.jobs, &s, "corr", "", &err);
        bool hit = disarm();
        gps_job_spec_clear(&s);
        if (!job) {
            if (err.status != 500 || strcmp(err.code, "INTERNAL") != 0) {
                print_message("run %zu: refused %d %s\n", n, err.status, err.code);
                bad++;
            }
        } else if (p.delivered == 1) {
            if (!wire_is(&p, job) || job->state != GPS_JOB_ASSIGNED || job->attempts != 1 ||
                strcmp(job->agent_id, a->id) != 0 || job->delivery != 7) {
                print_message("run %zu: handed over as '%.*s': the job %s on '%s', attempt "
                              "%d\n",
                              n, (int)p.len, p.wire, gps_job_state_name(job->state),
                              job->agent_id, job->attempts);
                bad++;
            }
        } else if (p.refused == 1) {
            requeued++;
            if (job->state != GPS_JOB_QUEUED || job->agent_id[0] || job->attempts != 0) {
                print_message("run %zu: not written, the job %s on '%s', attempt %d\n", n,
                              gps_job_state_name(job->state), job->agent_id, job->attempts);
                bad++;
            } else {
                /* The agent's next poll gets it. */
                takes(&f, a, job);
                assert_int_equal(job->attempts, 1);
            }
        } else if (!gps_job_terminal(job) || strcmp(gps_job_error_code(job), "INTERNAL") != 0) {
            print_message("run %zu: never handed over, the job %s (%s)\n", n,
                          gps_job_state_name(job->state), gps_job_error_code(job));
            bad++;
        }
        if (job && !gps_job_terminal(job))
            gps_jobs_cancel(f.jobs, job, "test");
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("deliver sweep: %zu runs, %zu put back\n", n, requeued);
    assert_true(requeued > 0);
    assert_int_equal(bad, 0);
}

/* ---- jobs an agent's work request takes ---- */

#define NTAKE 3

/* f with agent 1 (NTAKE slots, returned) and NTAKE jobs queued for it, in
 * order. */
static registry_agent *ntake_fleet(fleet *f, gps_job *jobs[NTAKE])
{
    fleet_init(f, NULL, NULL);
    registry_agent *a = fleet_agent(f, 1, "m1", NULL, NTAKE, 1000);
    submit_m1(f, jobs, NTAKE);
    return a;
}

/* jobs[from..NTAKE) are back in the queue, no agent's, attempt uncounted. */
static void put_back(gps_job *const jobs[NTAKE], int from)
{
    for (int i = from; i < NTAKE; i++) {
        assert_int_equal(jobs[i]->state, GPS_JOB_QUEUED);
        assert_string_equal(jobs[i]->agent_id, "");
        assert_int_equal(jobs[i]->attempts, 0);
    }
}

/* An agent asks for work with NTAKE free slots while NTAKE jobs are queued
 * (gps_jobs_take_for_agent, the N-th allocation failing): the reply's text
 * is an array of the first k jobs, whole, or nothing at all (-1: the
 * agent's request is answered 500); a job is assigned to the agent only if
 * it is in that text, every other one is queued again with no agent and
 * its attempt uncounted, the agent is not left ready with them, and its
 * next request takes them, in their order. The code before marked every
 * job taken assigned and left out of the text one whose wire could not be
 * appended (or wrote no array at all): it stayed on the agent's books, on
 * an agent that never got it, until a failover. */
static void test_take_for_agent_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, short_ = 0;
    for (n = 1;; n++) {
        fleet f;
        gps_job *jobs[NTAKE];
        registry_agent *a = ntake_fleet(&f, jobs);
        for (int i = 0; i < NTAKE; i++)
            assert_int_equal(jobs[i]->state, GPS_JOB_QUEUED);
        gp_buf text;
        gp_buf_init(&text);
        arm_beneath(n);
        long got = (long)gps_jobs_take_for_agent(f.jobs, a, NTAKE, 9, &text);
        bool hit = disarm();
        json_t *arr = text.len ? json_loadb(text.data, text.len, 0, NULL) : NULL;
        int k = got < 0 ? 0 : (int)json_array_size(arr);
        if (got < 0 ? text.len != 0 : !json_is_array(arr) || (long)k != got) {
            print_message("run %zu: %ld taken, the text '%.*s'\n", n, got, (int)text.len,
                          text.data ? text.data : "");
            bad++;
        }
        short_ += k < NTAKE;
        for (int i = 0; i < NTAKE; i++) {
            const char *id = json_string_value(json_object_get(json_array_get(arr, (size_t)i),
                                                               "job_id"));
            bool in = i < k && id && strcmp(id, jobs[i]->id) == 0;
            if (i < k && !in) {
                print_message("run %zu: the text's job %d is %s\n", n, i, id ? id : "?");
                bad++;
            }
            gps_job *job = jobs[i];
            bool ok = in ? job->state == GPS_JOB_ASSIGNED && strcmp(job->agent_id, a->id) == 0 &&
                               job->attempts == 1 && job->delivery == 9
                         : job->state == GPS_JOB_QUEUED && !job->agent_id[0] &&
                               job->attempts == 0;
            if (!ok) {
                print_message("run %zu: job %d (%s in the text) is %s on '%s', attempt %d\n",
                              n, i, in ? "" : "not", gps_job_state_name(job->state),
                              job->agent_id, job->attempts);
                bad++;
            }
        }
        if (a->active != k || (k < NTAKE && sched_agent_is_ready(f.s, a))) {
            print_message("run %zu: the agent runs %d on the books (%d sent), %s\n", n,
                          a->active, k, sched_agent_is_ready(f.s, a) ? "ready" : "unready");
            bad++;
        }
        json_decref(arr);
        gp_buf_free(&text);
        /* Its next request takes the rest, in order. */
        if (k < NTAKE) {
            gp_buf next;
            gp_buf_init(&next);
            long more = (long)gps_jobs_take_for_agent(f.jobs, a, NTAKE, 10, &next);
            json_t *rest = json_loadb(next.data ? next.data : "", next.len, 0, NULL);
            bool ok = more == NTAKE - k && (long)json_array_size(rest) == more;
            for (int i = k; ok && i < NTAKE; i++) {
                const char *id = json_string_value(
                    json_object_get(json_array_get(rest, (size_t)(i - k)), "job_id"));
                ok = id && strcmp(id, jobs[i]->id) == 0 && jobs[i]->attempts == 1 &&
                     jobs[i]->delivery == 10;
            }
            if (!ok) {
                print_message("run %zu: the next request took %ld: '%.*s'\n", n, more,
                              (int)next.len, next.data ? next.data : "");
                bad++;
            }
            json_decref(rest);
            gp_buf_free(&next);
        }
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("take sweep: %zu runs, %zu short of a job\n", n, short_);
    assert_true(short_ > 0);
    assert_int_equal(bad, 0);
}

/* The ids of the jobs of a wire array text, in order (new reference). */
static json_t *ids_of(const json_t *arr)
{
    json_t *ids = json_array();
    size_t i;
    const json_t *w;
    json_array_foreach(arr, i, w) json_array_append(ids, json_object_get(w, "job_id"));
    return ids;
}

/* test_take_for_agent_oom with another agent parked ready (one slot): the
 * jobs left out of the reply keep their order: the first of them goes to
 * the ready agent (or, its delivery refused, waits first in line), the
 * rest wait behind it, and the agent's next request takes them in order.
 * The code before put them back the last first, each placed at once: the
 * ready agent got the last one, ahead of those before it. */
static void test_take_for_agent_oom_other_ready(void **state)
{
    (void)state;
    size_t n, bad = 0, handed = 0;
    for (n = 1;; n++) {
        fleet f;
        gps_job *jobs[NTAKE];
        registry_agent *a = ntake_fleet(&f, jobs);
        registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
        assert_int_equal(sched_agent_ready(f.s, b, 1), 0);
        gp_buf text;
        gp_buf_init(&text);
        arm_beneath(n);
        long got = (long)gps_jobs_take_for_agent(f.jobs, a, NTAKE, 9, &text);
        bool hit = disarm();
        json_t *arr = got > 0 ? json_loadb(text.data, text.len, 0, NULL) : NULL;
        json_t *order = arr ? ids_of(arr) : json_array();
        gp_buf_free(&text);
        json_decref(arr);
        int k = (int)json_array_size(order);
        /* b's delivery, then the rest as a's next request takes them. */
        if (f.delivered) {
            handed++;
            if (f.delivered_to != b)
                bad++;
            json_t *more = ids_of(f.delivery);
            json_array_extend(order, more);
            json_decref(more);
        }
        if (k + f.delivered < NTAKE) {
            gp_buf next;
            gp_buf_init(&next);
            gps_jobs_take_for_agent(f.jobs, a, NTAKE, 10, &next);
            json_t *rest = json_loadb(next.data ? next.data : "", next.len, 0, NULL);
            json_t *more = ids_of(rest);
            json_array_extend(order, more);
            json_decref(more);
            json_decref(rest);
            gp_buf_free(&next);
        }
        bool ok = json_array_size(order) == NTAKE;
        for (int i = 0; ok && i < NTAKE; i++)
            ok = strcmp(json_string_value(json_array_get(order, (size_t)i)), jobs[i]->id) == 0;
        if (!ok) {
            char *o = json_dumps(order, JSON_COMPACT);
            print_message("run %zu: %d sent, %d to the ready agent, then in the order %s\n", n,
                          k, f.delivered, o ? o : "?");
            free(o);
            bad++;
        }
        json_decref(order);
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("take sweep, another agent ready: %zu runs, %zu handed to it\n", n, handed);
    assert_true(handed > 0);
    assert_int_equal(bad, 0);
}

/* The agent's reply refused (gps_jobs_hand_out's reply: a 500 went
 * instead), again and again: every job is back in its queue, in order, no
 * agent's, attempt uncounted; the agent is not ready, so no job goes
 * straight back to it; another agent ready then takes the first in line. */
static long long refuse(registry_agent *a, const gp_buf *jobs, void *arg)
{
    (void)a, (void)jobs;
    (*(int *)arg)++;
    return -1;
}

static void test_hand_out_refused(void **state)
{
    (void)state;
    fleet f;
    gps_job *jobs[NTAKE];
    registry_agent *a = ntake_fleet(&f, jobs);
    int calls = 0;
    for (int round = 0; round < 3; round++) {
        assert_int_equal(gps_jobs_hand_out(f.jobs, a, NTAKE, refuse, &calls), -1);
        assert_int_equal(calls, round + 1);
        assert_false(sched_agent_is_ready(f.s, a));
        assert_int_equal(a->active, 0);
        put_back(jobs, 0);
    }
    registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
    takes(&f, b, jobs[0]);
    takes(&f, a, jobs[1]);
    fleet_free(&f);
}

/* The same with another agent parked ready (its long-poll open, one
 * slot): the jobs put back keep their order there too. The first in line
 * goes to it at once, the others wait in their order for the next poll.
 * The code before put them back the last first, each placed at once: the
 * last reached the ready agent and the first waited behind it. */
static void test_hand_out_refused_other_ready(void **state)
{
    (void)state;
    fleet f;
    gps_job *jobs[NTAKE];
    registry_agent *a = ntake_fleet(&f, jobs);
    registry_agent *b = fleet_agent(&f, 2, "m1", NULL, 1, 1000);
    assert_int_equal(sched_agent_ready(f.s, b, 1), 0);
    int calls = 0;
    assert_int_equal(gps_jobs_hand_out(f.jobs, a, NTAKE, refuse, &calls), -1);
    assert_int_equal(calls, 1);
    /* b got the first in line, in its parked poll. */
    assert_int_equal(f.delivered, 1);
    assert_ptr_equal(f.delivered_to, b);
    assert_int_equal(json_array_size(f.delivery), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(f.delivery, 0), "job_id")),
        jobs[0]->id);
    assert_int_equal(jobs[0]->state, GPS_JOB_ASSIGNED);
    assert_string_equal(jobs[0]->agent_id, b->id);
    /* The others wait, in order, no agent's, attempt uncounted. */
    put_back(jobs, 1);
    for (int i = 1; i < NTAKE; i++)
        takes(&f, a, jobs[i]);
    fleet_free(&f);
}

/* ---- a task resumed after a restart ---- */

#define RESUMED                                                                                 \
    "The text a native task had generated before the server restarted, which its client has " \
    "already: the resumed job's text starts with it, or the job is not made."

/* A task resubmitted after a restart (api_tasks_restore.c) with the text
 * its client already has: the job starts with that text and its count, or
 * the submit is refused 500 INTERNAL (out of memory). The code before
 * made the job with the text missing: its later tokens went to a client
 * that had the text, and a failover continued from the wrong text. (The
 * scheduler's own failure is 500 INTERNAL "scheduler error".) */
static void test_resumed_text_oom(void **state)
{
    (void)state;
    size_t n, bad = 0, refused = 0;
    for (n = 1;; n++) {
        fleet f;
        fleet_init(&f, NULL, NULL);
        fleet_agent(&f, 1, "m1", NULL, 2, 1000);
        gps_job_spec s = fleet_spec("m1", 64);
        s.api = "native";
        s.resume_id = strdup("job_0123456789abcdef01234567");
        s.resume_text = strdup(RESUMED);
        s.resume_tokens = 21;
        assert_non_null(s.resume_id);
        assert_non_null(s.resume_text);
        gps_submit_err err = {0};
        arm_beneath(n);
        gps_job *job = gps_jobs_submit(f.jobs, &s, "corr", "", &err);
        bool hit = disarm();
        if (!job) {
            refused++;
            /* (the scheduler's own out of memory says "scheduler error") */
            if (err.status != 500 || strcmp(err.code, "INTERNAL") != 0) {
                print_message("run %zu: refused %d %s %s\n", n, err.status, err.code,
                              err.message);
                bad++;
            }
        } else if (strcmp(gps_job_text(job), RESUMED) != 0 ||
                   gps_job_completion_tokens(job) != 21) {
            print_message("run %zu: resumed with '%s' (%lld tokens)\n", n, gps_job_text(job),
                          gps_job_completion_tokens(job));
            bad++;
        }
        gps_job_spec_clear(&s);
        fleet_free(&f);
        if (!hit)
            break;
    }
    print_message("resume sweep: %zu runs, %zu refused\n", n, refused);
    assert_true(refused > 0);
    assert_int_equal(bad, 0);
}

/* ---- a job offered to another server ---- */

/* A job (by hand: only the fields its wire and constraints read) with
 * every part an offer carries: messages, tools, stop strings, a response
 * format, user and session, labels, fallback models, a preferred agent,
 * a token-exact continuation. */
static gps_job *offered_job(void)
{
    gps_job *job = calloc(1, sizeof *job);
    assert_non_null(job);
    gps_job_spec *s = &job->spec;
    snprintf(job->id, sizeof job->id, "job_0123456789abcdef01234567");
    snprintf(job->correlation_id, sizeof job->correlation_id, "corr");
    snprintf(job->tenant, sizeof job->tenant, "0123456789abcdef0123456789abcdef");
    gp_buf_init(&job->text);
    assert_int_equal(gp_buf_append(&job->text, "so far", 6), 0);
    s->kind = GPS_JOB_CHAT;
    s->model = strdup("m1");
    s->max_tokens = 64;
    s->temperature = 0.5;
    s->top_p = 0.9;
    s->messages = J("[{\"role\":\"system\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":\"what is the weather like today\"}]");
    s->tools = J("[{\"type\":\"function\",\"function\":{\"name\":\"weather\","
                 "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
                 "{\"type\":\"string\"}}}}}]");
    s->tool_choice = json_string("auto");
    s->response_format = J("{\"type\":\"json_object\"}");
    s->stop = J("[\"\\n\\n\",\"END\"]");
    s->user = strdup("user-1");
    s->session = strdup("session-1");
    s->prefer_agent = strdup("agent-7");
    s->failover = GPS_FAILOVER_RESTART;
    s->labels = calloc(2, sizeof *s->labels);
    assert_non_null(s->labels);
    s->labels[0] = (registry_label){strdup("gpu"), strdup("a100")};
    s->labels[1] = (registry_label){strdup("zone"), strdup("eu-west")};
    s->n_labels = 2;
    s->fallback_models[0] = strdup("m2");
    s->fallback_models[1] = strdup("m3");
    s->n_fallback = 2;
    job->chain[0] = s->model;
    job->chain[1] = s->fallback_models[0];
    job->chain[2] = s->fallback_models[1];
    job->n_chain = 3;
    job->sj.needs_tools = true;
    job->sj.needs_generation = true;
    job->attempts = 2;
    job->continued_tokens = 3;
    job->continuation_mode = "tokens";
    job->gen_ids = calloc(3, sizeof *job->gen_ids);
    assert_non_null(job->gen_ids);
    job->n_gen_ids = job->cap_gen_ids = 3;
    snprintf(job->ids_digest, sizeof job->ids_digest, "%s", D1);
    return job;
}

static void offered_job_free(gps_job *job)
{
    gps_job_spec_clear(&job->spec);
    free(job->gen_ids);
    gp_buf_free(&job->text);
    free(job);
}

/* What a server offers a job to the others with (handoff.c offer): its
 * wire and its constraints, each whole or none (the offer is not made).
 * The code before built them with a part left out where an allocation
 * failed (the messages, a stop string, a tool, a label, a fallback
 * model...): another server ran a different request, or ran it on an
 * agent its labels exclude. */
static void test_offer_parts_oom(void **state)
{
    (void)state;
    gps_job *job = offered_job();
    json_t *want_w = gps_job_wire(job, 1000, 600), *want_c = gps_job_constraints(job);
    assert_non_null(want_w);
    assert_non_null(want_c);
    assert_non_null(json_object_get(want_w, "continuation_ids"));
    assert_int_equal(json_object_size(json_object_get(want_c, "labels")), 2);
    size_t n, bad = 0, none = 0;
    for (n = 1;; n++) {
        arm_beneath(n);
        json_t *w = gps_job_wire(job, 1000, 600);
        json_t *c = gps_job_constraints(job);
        bool hit = disarm();
        none += !w || !c;
        if (w && !json_equal(w, want_w)) {
            print_message("run %zu: the wire differs\n", n);
            print_diff("wire", w, want_w);
            bad++;
        }
        if (c && !json_equal(c, want_c)) {
            print_message("run %zu: the constraints differ\n", n);
            print_diff("constraints", c, want_c);
            bad++;
        }
        json_decref(w);
        json_decref(c);
        if (!hit)
            break;
    }
    print_message("offer parts sweep: %zu runs, %zu without a wire or constraints\n", n, none);
    assert_true(n > 20);
    assert_int_equal(bad, 0);
    json_decref(want_w);
    json_decref(want_c);
    offered_job_free(job);
}

/* ---- a queued job moved to its fallback (gps_jobs_agent_leaving) ---- */

/* Model A's only agent drains while a job of A with fallback B waits in
 * A's queue and B's agent is not ready yet: the job moves to B's queue
 * (B's first: the scheduler makes it), or, out of memory for it, fails as
 * the server's own (INTERNAL, 500) with both subscribers told; never a
 * NO_AGENT that blames the fleet for what was memory, never a job left
 * under neither model. */
static void test_drain_move_oom(void **state)
{
    (void)state;
    gps_jobs_opts o = fleet_opts();
    size_t n, bad = 0, failed = 0;
    for (n = 1;; n++) {
        run r;
        memset(&r, 0, sizeof r);
        fleet_init(&r.f, &o, NULL);
        r.a = fleet_agent(&r.f, 1, "A", NULL, 2, 1000);
        r.b = fleet_agent(&r.f, 2, "B", NULL, 2, 1000);
        gps_job_spec sp = fleet_spec("A", 16);
        sp.fallback_models[0] = strdup("B");
        sp.n_fallback = 1;
        run_submit(&r, &sp);
        assert_int_equal(gps_job_state_of(r.job), GPS_JOB_QUEUED);
        registry_set_drain(r.f.reg, r.a, true, 1000);
        sched_agent_update(r.f.s, r.a);
        arm_beneath(n);
        gps_jobs_agent_leaving(r.f.jobs, r.a->id);
        bool hit = disarm();
        bool moved = gps_job_state_of(r.job) == GPS_JOB_QUEUED &&
                     strcmp(r.job->spec.model, "B") == 0 &&
                     sched_job_queued(&r.job->sj) && r.tree.errors == 0 && r.cur.errors == 0;
        bool internal = gps_job_state_of(r.job) == GPS_JOB_FAILED &&
                        error_ok(&r.tree, "INTERNAL", 500, 0) &&
                        error_ok(&r.cur, "INTERNAL", 500, 0) &&
                        strcmp(r.tree.code, "INTERNAL") == 0 &&
                        strcmp(gps_job_error_code(r.job), "INTERNAL") == 0;
        failed += internal;
        if (!moved && !internal) {
            bad++;
            print_message("run %zu: the job %s under %s, told %d error(s) (%s %d)\n", n,
                          gps_job_state_name(gps_job_state_of(r.job)), r.job->spec.model,
                          r.tree.errors, r.tree.code, r.tree.status);
        }
        run_end(&r);
        if (!hit)
            break;
    }
    print_message("drain move sweep: %zu runs, %zu failed as out of memory\n", n, failed);
    assert_true(n > 2);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* as the server's main: jansson's allocations counted (gp_json.h) */
    json_free_t f;
    json_get_alloc_funcs(&counting_malloc, &f);
    json_set_alloc_funcs(persisting_malloc, f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_upload_oom),
        cmocka_unit_test(test_plain_upload_oom_persisting),
        cmocka_unit_test(test_tree_upload_oom),
        cmocka_unit_test(test_cancel_oom),
        cmocka_unit_test(test_attempts_exhausted_oom),
        cmocka_unit_test(test_finish_early_oom),
        cmocka_unit_test(test_failover_event_oom),
        cmocka_unit_test(test_drain_move_oom),
        cmocka_unit_test(test_pending_cancels_oom),
        cmocka_unit_test(test_deliver_to_parked_oom),
        cmocka_unit_test(test_take_for_agent_oom),
        cmocka_unit_test(test_hand_out_refused),
        cmocka_unit_test(test_hand_out_refused_other_ready),
        cmocka_unit_test(test_take_for_agent_oom_other_ready),
        cmocka_unit_test(test_resumed_text_oom),
        cmocka_unit_test(test_offer_parts_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

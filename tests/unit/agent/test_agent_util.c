/* Unit tests for src/agent/agent_util.c: SSE parsing, event queue seq logic,
 * backoff schedule, labels, agent_id persistence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent_util.h"

/* ---------------------------------------------------------------- SSE --- */

typedef struct {
    char got[16][256];
    int n;
    int stop_at; /* return 7 on this event index (-1 never) */
} sse_rec;

static int rec_cb(void *ud, const char *d, size_t len)
{
    sse_rec *r = ud;
    if (r->n < 16)
        snprintf(r->got[r->n], sizeof r->got[0], "%.*s", (int)len, d);
    r->n++;
    return r->n - 1 == r->stop_at ? 7 : 0;
}

/* Feed s split at every possible pair of positions: the result must not
 * depend on how the network cut the bytes. */
static void feed_all_splits(const char *s, const char *const *want, int nwant)
{
    size_t n = strlen(s);
    for (size_t a = 0; a <= n; a++)
        for (size_t b = a; b <= n; b++) {
            agent_sse p;
            sse_rec r = {.stop_at = -1};
            agent_sse_init(&p, 1024);
            /* Each piece from a buffer scribbled over after its feed: an
             * event is never read from bytes a feed was given before. */
            size_t cut[4] = {0, a, b, n};
            for (int k = 0; k < 3; k++) {
                char piece[256];
                size_t len = cut[k + 1] - cut[k];
                assert_true(len <= sizeof piece);
                memcpy(piece, s + cut[k], len);
                assert_int_equal(agent_sse_feed(&p, piece, len, rec_cb, &r), 0);
                memset(piece, '#', sizeof piece);
            }
            assert_int_equal(agent_sse_finish(&p, rec_cb, &r), 0);
            assert_int_equal(r.n, nwant);
            for (int i = 0; i < nwant; i++)
                assert_string_equal(r.got[i], want[i]);
            agent_sse_free(&p);
        }
}

static void sse_basic_lf(void **st)
{
    (void)st;
    const char *want[] = {"{\"a\":1}", "[DONE]"};
    feed_all_splits("data: {\"a\":1}\n\ndata: [DONE]\n\n", want, 2);
}

static void sse_crlf_and_cr(void **st)
{
    (void)st;
    const char *want[] = {"x", "y", "z"};
    feed_all_splits("data: x\r\n\r\ndata: y\r\rdata:z\n\n", want, 3);
}

static void sse_comments_and_other_fields(void **st)
{
    (void)st;
    const char *want[] = {"one", "two"};
    feed_all_splits(": keep-alive\n\nevent: message\nid: 4\nretry: 100\ndata: one\n\n:x\ndata: two\n\n",
                    want, 2);
}

static void sse_multiline_data_joined(void **st)
{
    (void)st;
    const char *want[] = {"a\nb", ""};
    feed_all_splits("data: a\ndata: b\n\ndata\n\n", want, 2);
}

static void sse_unterminated_last_event(void **st)
{
    (void)st;
    const char *want[] = {"[DONE]"};
    feed_all_splits("data: [DONE]", want, 1);
}

static void sse_no_blank_line_no_event(void **st)
{
    (void)st;
    feed_all_splits(": only a comment\n\n\n", NULL, 0);
}

static void sse_line_too_long(void **st)
{
    (void)st;
    agent_sse p;
    sse_rec r = {.stop_at = -1};
    agent_sse_init(&p, 16);
    char big[64];
    memset(big, 'x', sizeof big);
    /* split across feeds: still caught */
    assert_int_equal(agent_sse_feed(&p, "data: ", 6, rec_cb, &r), 0);
    assert_int_equal(agent_sse_feed(&p, big, sizeof big, rec_cb, &r), -1);
    agent_sse_free(&p);
    /* in one feed with its terminator */
    agent_sse_init(&p, 16);
    char line[80];
    snprintf(line, sizeof line, "data: %.40s\n\n", "0123456789012345678901234567890123456789");
    assert_int_equal(agent_sse_feed(&p, line, strlen(line), rec_cb, &r), -1);
    assert_int_equal(r.n, 0);
    agent_sse_free(&p);
}

static void sse_callback_stop_propagates(void **st)
{
    (void)st;
    agent_sse p;
    sse_rec r = {.stop_at = 0};
    agent_sse_init(&p, 1024);
    const char *s = "data: a\n\ndata: b\n\n";
    assert_int_equal(agent_sse_feed(&p, s, strlen(s), rec_cb, &r), 7);
    assert_int_equal(r.n, 1);
    agent_sse_free(&p);
}

/* ------------------------------------------------------------- evq ---- */

static json_t *ev(const char *type)
{
    return json_pack("{s:s}", "type", type);
}

/* How many events a taken batch holds: it is the inside of a JSON array
 * (agent_evq_take), which must read back as one. */
static size_t nev(json_t *b)
{
    assert_true(json_is_string(b));
    size_t len = json_string_length(b);
    char *text = malloc(len + 3);
    assert_non_null(text);
    text[0] = '[';
    memcpy(text + 1, json_string_value(b), len);
    memcpy(text + 1 + len, "]", 2);
    json_t *arr = json_loads(text, 0, NULL);
    assert_true(json_is_array(arr));
    size_t n = json_array_size(arr);
    json_decref(arr);
    free(text);
    return n;
}

static void evq_batches_everything_accumulated(void **st)
{
    (void)st;
    agent_evq q;
    size_t seq = 99;
    agent_evq_init(&q);
    assert_false(agent_evq_ready(&q));
    assert_null(agent_evq_take(&q, 0, &seq));
    agent_evq_push(&q, ev("started"));
    agent_evq_push(&q, ev("token"));
    json_t *b = agent_evq_take(&q, 0, &seq);
    assert_non_null(b);
    assert_int_equal(seq, 0);
    assert_int_equal(nev(b), 2);
    json_decref(b);
    /* While in flight, more arrives; nothing else may be taken. */
    agent_evq_push(&q, ev("token"));
    agent_evq_push(&q, ev("token"));
    assert_false(agent_evq_ready(&q));
    assert_null(agent_evq_take(&q, 0, &seq));
    agent_evq_ack(&q);
    b = agent_evq_take(&q, 0, &seq);
    assert_int_equal(seq, 2);
    assert_int_equal(nev(b), 2);
    json_decref(b);
    /* Failure: the same batch again, plus what came meanwhile. */
    agent_evq_push(&q, ev("end"));
    agent_evq_nack(&q);
    b = agent_evq_take(&q, 0, &seq);
    assert_int_equal(seq, 2);
    assert_int_equal(nev(b), 3);
    json_decref(b);
    assert_false(agent_evq_done(&q));
    agent_evq_ack(&q);
    assert_true(agent_evq_done(&q));
    assert_false(agent_evq_ready(&q));
    agent_evq_free(&q);
}

/* agent_evq_flags through a job's life: the flags a push adds are what
 * tells the agent's loop that a job needs it (agent_jobs.c job_note_locked); a
 * push that adds none (an upload in flight, or one already waiting) must
 * not, and the first output and the end must add URGENT. */
static void evq_flags_say_what_changed(void **st)
{
    (void)st;
    agent_evq q;
    size_t seq = 99;
    gp_buf b;
    gp_buf_init(&b);
    agent_evq_init(&q);
    assert_int_equal(agent_evq_flags(&q), 0);
    assert_int_equal(agent_evq_take_append(&q, 0, &seq, &b), 0);
    agent_evq_push(&q, ev("started"));
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY); /* waits for a batch */
    assert_int_equal(agent_evq_push_token(&q, "a", 1, -1), 0);
    agent_evq_mark_output(&q);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY | AGENT_EVQ_URGENT); /* TTFT */
    assert_int_equal(agent_evq_take_append(&q, 0, &seq, &b), 1);
    assert_int_equal(seq, 0);
    assert_int_equal(agent_evq_flags(&q), 0); /* in flight */
    assert_int_equal(agent_evq_push_token(&q, "b", 1, -1), 0);
    agent_evq_mark_output(&q);               /* not the first: no change */
    assert_int_equal(q.first_output, 2);
    assert_int_equal(agent_evq_flags(&q), 0); /* the ack will show it */
    agent_evq_nack(&q);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY | AGENT_EVQ_URGENT); /* not there yet */
    b.len = 0;
    assert_int_equal(agent_evq_take_append(&q, 1, &seq, &b), 1); /* max 1 */
    assert_string_equal(b.data, "{\"type\":\"started\"}");
    agent_evq_ack(&q);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY | AGENT_EVQ_URGENT);
    b.len = 0;
    assert_int_equal(agent_evq_take_append(&q, 0, &seq, &b), 1);
    assert_int_equal(seq, 1);
    agent_evq_ack(&q);
    assert_int_equal(agent_evq_flags(&q), 0);
    assert_int_equal(agent_evq_push_token(&q, "c", 1, -1), 0);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY); /* a later token: batched */
    agent_evq_push(&q, ev("end"));
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY | AGENT_EVQ_URGENT); /* the end */
    assert_int_equal(agent_evq_take_append(&q, 0, &seq, &b), 1);
    agent_evq_ack(&q);
    assert_int_equal(agent_evq_flags(&q), 0);
    assert_true(agent_evq_done(&q));
    agent_evq_free(&q);
    gp_buf_free(&b);
}

/* agent_evq_take_append writes what agent_evq_take returns, after what
 * the buffer held, and begins the same upload. */
static void evq_take_append_as_take(void **st)
{
    (void)st;
    agent_evq a, c;
    agent_evq_init(&a);
    agent_evq_init(&c);
    for (int i = 0; i < 7; i++) {
        char t[8];
        snprintf(t, sizeof t, "t\"%d", i);
        agent_evq_push_token(&a, t, strlen(t), i);
        agent_evq_push_token(&c, t, strlen(t), i);
    }
    gp_buf b;
    gp_buf_init(&b);
    for (size_t max = 3; max; max = agent_evq_ready(&a) ? max : 0) {
        size_t s1 = 0, s2 = 0;
        json_t *want = agent_evq_take(&a, 3, &s1);
        gp_buf_append(&b, "x", 1);
        assert_int_equal(agent_evq_take_append(&c, 3, &s2, &b), 1);
        assert_int_equal(s1, s2);
        assert_int_equal(b.len, 1 + json_string_length(want));
        assert_memory_equal(b.data + 1, json_string_value(want), json_string_length(want));
        assert_int_equal(c.inflight, a.inflight);
        json_decref(want);
        agent_evq_ack(&a);
        agent_evq_ack(&c);
        b.len = 0;
    }
    assert_int_equal(c.acked, 7);
    agent_evq_free(&a);
    agent_evq_free(&c);
    gp_buf_free(&b);
}

/* ----------------------------------------------------------- timers --- */

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* Nodes come out in `at` order whatever was added, moved and deleted. */
static void timers_heap_order(void **st)
{
    (void)st;
    enum { N = 300 };
    agent_timer t[N];
    agent_timers h;
    agent_timers_init(&h);
    memset(t, 0, sizeof t);
    assert_null(agent_timers_first(&h));
    agent_timers_del(&h, &t[0]); /* in no heap: nothing happens */
    assert_int_equal(agent_timers_reserve(&h, N), 0);
    uint32_t seed = 7;
    for (int i = 0; i < N; i++)
        assert_int_equal(agent_timers_set(&h, &t[i], lcg(&seed) % 1000), 0);
    assert_int_equal(h.n, N);
    for (int i = 0; i < N; i += 3) /* move some, later or earlier */
        agent_timers_set(&h, &t[i], lcg(&seed) % 1000);
    for (int i = 1; i < N; i += 4) /* delete others */
        agent_timers_del(&h, &t[i]);
    agent_timers_del(&h, &t[1]); /* twice: no-op */
    size_t left = h.n, got = 0;
    uint64_t last = 0;
    agent_timer *f;
    while ((f = agent_timers_first(&h))) {
        assert_true(f->at >= last);
        assert_int_not_equal(f->pos, 0);
        assert_true(f < t + N && f >= t && (f - t) % 4 != 1); /* never a deleted one */
        last = f->at;
        agent_timers_del(&h, f);
        assert_int_equal(f->pos, 0);
        got++;
    }
    assert_int_equal(got, left);
    assert_int_equal(left, N - N / 4);
    for (int i = 0; i < N; i++)
        assert_int_equal(t[i].pos, 0);
    /* Equal keys, and a free with nodes still in: they end in no heap. */
    agent_timers_set(&h, &t[0], 5);
    agent_timers_set(&h, &t[1], 5);
    agent_timers_set(&h, &t[2], 4);
    assert_ptr_equal(agent_timers_first(&h), &t[2]);
    agent_timers_free(&h);
    assert_int_equal(t[0].pos + t[1].pos + t[2].pos, 0);
}

static void evq_max_batch_and_rewind(void **st)
{
    (void)st;
    agent_evq q;
    size_t seq;
    agent_evq_init(&q);
    for (int i = 0; i < 10; i++)
        agent_evq_push(&q, ev("token"));
    json_t *b = agent_evq_take(&q, 4, &seq);
    assert_int_equal(nev(b), 4);
    assert_int_equal(seq, 0);
    json_decref(b);
    agent_evq_ack(&q);
    b = agent_evq_take(&q, 4, &seq);
    assert_int_equal(seq, 4);
    json_decref(b);
    agent_evq_ack(&q);
    /* Server says it only has 2: resend from 2. */
    agent_evq_rewind(&q, 2);
    b = agent_evq_take(&q, 0, &seq);
    assert_int_equal(seq, 2);
    assert_int_equal(nev(b), 8);
    json_decref(b);
    /* Rewind beyond what exists is clamped. */
    agent_evq_rewind(&q, 1000);
    assert_false(agent_evq_ready(&q));
    assert_int_equal(q.acked, 10);
    agent_evq_free(&q);
}

/* A refused upload: its events (and the later ones) make way for one
 * error event, which ends the queue (issue 25). */
/* A token event rendered once (issue 24) is what json_dumps wrote for the
 * object it replaces, for every byte class, and with the token id. */
static void evq_token_json_as_json_dumps(void **state)
{
    (void)state;
    const char *texts[] = {" tok", "", "a\"b\\c/d\n\r\t\b\f\x01\x1f\x7f", "caf\xc3\xa9 \xf0\x9f\x98\x80",
                           "bad \xc3(", "\xed\xa0\x80", NULL};
    for (int i = 0; texts[i]; i++) {
        for (int id = -1; id <= 42; id += 43) {
            json_t *t = json_string(texts[i]);
            json_t *o = json_pack("{s:s,s:o}", "type", "token", "text",
                                  t ? t : json_string("\xef\xbf\xbd"));
            if (id >= 0)
                json_object_set_new(o, "token_id", json_integer(id));
            char *want = json_dumps(o, JSON_COMPACT);
            gp_buf b;
            gp_buf_init(&b);
            assert_int_equal(agent_evq_token_json(&b, texts[i], strlen(texts[i]), id), 0);
            assert_string_equal(b.data, want);
            gp_buf_free(&b);
            free(want);
            json_decref(o);
        }
    }
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(agent_evq_token_json(&b, "a\0b", 3, -1), 0); /* a NUL, as jansson writes it */
    assert_string_equal(b.data, "{\"type\":\"token\",\"text\":\"a\\u0000b\"}");
    gp_buf_free(&b);
}

/* Issue 24 (fourth round): the queue keeps events as text. A batch taken
 * from it, between brackets, is byte for byte what json_dumps wrote for
 * the array of the same events as objects, for events whose strings need
 * escapes, with reals, and for tokens pushed as text; so is a batch taken
 * after a failed upload, a rewind and a partial take. */
static void evq_text_as_json_dumps(void **st)
{
    (void)st;
    const char *texts[] = {" tok", "a\"b\\c/d\n\x01\x7f", "caf\xc3\xa9 \xf0\x9f\x98\x80",
                           "bad \xc3(", "", NULL};
    json_t *want = json_array();
    agent_evq q;
    agent_evq_init(&q);
    json_t *e = json_pack("{s:s}", "type", "started");
    json_array_append(want, e);
    agent_evq_push(&q, e);
    for (int i = 0; texts[i]; i++) {
        int32_t id = i % 2 ? 7 * i : -1;
        json_t *t = json_string(texts[i]);
        e = json_pack("{s:s,s:o}", "type", "token", "text", t ? t : json_string("\xef\xbf\xbd"));
        if (id >= 0)
            json_object_set_new(e, "token_id", json_integer(id));
        json_array_append_new(want, e);
        assert_int_equal(agent_evq_push_token(&q, texts[i], strlen(texts[i]), id), 0);
        e = json_pack("{s:s,s:i,s:s,s:s,s:s}", "type", "tool_call", "index", i, "id", "call\"1",
                      "name", "f\u00e9", "arguments", "{\"x\":\"\\n\"}");
        json_array_append(want, e);
        agent_evq_push(&q, e);
    }
    e = json_pack("{s:s,s:f,s:f,s:I}", "type", "metrics", "ttft_ms", 12.5, "tokens_per_s",
                  1234.0 / 7, "total_ms", (json_int_t)99);
    json_array_append(want, e);
    agent_evq_push(&q, e);
    e = json_pack("{s:s,s:s,s:{s:i}}", "type", "end", "finish_reason", "stop", "usage",
                  "completion_tokens", 5);
    json_array_append(want, e);
    agent_evq_push(&q, e);
    char *dumped = json_dumps(want, JSON_COMPACT);
    size_t seq;
    for (int round = 0; round < 3; round++) {
        json_t *b = agent_evq_take(&q, 0, &seq);
        assert_int_equal(seq, 0);
        gp_buf got;
        gp_buf_init(&got);
        gp_buf_append(&got, "[", 1);
        gp_buf_append(&got, json_string_value(b), json_string_length(b));
        gp_buf_append(&got, "]", 2);
        assert_string_equal(got.data, dumped);
        gp_buf_free(&got);
        json_decref(b);
        if (round == 0)
            agent_evq_nack(&q);
        else {
            b = agent_evq_take(&q, 0, &seq); /* in flight: nothing */
            assert_null(b);
            agent_evq_ack(&q);
            agent_evq_rewind(&q, 0);
        }
    }
    /* A partial take: the first three events, as json_dumps wrote them. */
    json_t *b = agent_evq_take(&q, 3, &seq);
    json_t *first = json_array();
    for (size_t i = 0; i < 3; i++)
        json_array_append(first, json_array_get(want, i));
    char *d3 = json_dumps(first, JSON_COMPACT);
    assert_int_equal(json_string_length(b) + 2, strlen(d3));
    assert_memory_equal(json_string_value(b), d3 + 1, json_string_length(b));
    free(d3);
    json_decref(first);
    json_decref(b);
    /* Nothing after the end. */
    assert_int_equal(agent_evq_push_token(&q, "x", 1, -1), -1);
    assert_int_equal(agent_evq_push(&q, ev("token")), -1);
    free(dumped);
    json_decref(want);
    agent_evq_free(&q);
}

/* An event rendered from its fields (the metrics event) is what json_dumps
 * wrote for json_deep_copy(fields) with "type" set on it: no fields,
 * fields that need escapes, reals, nesting, a "type" among them. */
static void evq_typed_as_json_dumps(void **st)
{
    (void)st;
    json_t *cases[] = {
        json_object(),
        json_pack("{s:f,s:f,s:I}", "ttft_ms", 12.5, "tokens_per_s", 1234.0 / 7, "total_ms",
                  (json_int_t)99),
        json_pack("{s:s,s:{s:[i,n,b]}}", "k\"\\\n\x01", "caf\xc3\xa9", "nested", "a", 1, 1),
        json_pack("{s:i,s:s,s:i}", "a", 1, "type", "other", "b", 2),
        json_pack("{s:i}", "count_estimated", 1),
        NULL, /* no fields */
        json_pack("[i]", 1), /* not an object: no fields */
    };
    const char *types[] = {"metrics", "metrics", "me\"trics", "metrics", "end", "metrics",
                           "metrics"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *ev = json_is_object(cases[i]) ? json_deep_copy(cases[i]) : json_object();
        json_object_set_new(ev, "type", json_string(types[i]));
        char *want = json_dumps(ev, JSON_COMPACT);
        agent_evq q;
        agent_evq_init(&q);
        assert_int_equal(agent_evq_push_typed(&q, cases[i], types[i]), 0);
        assert_int_equal(q.terminal, strcmp(types[i], "end") == 0);
        size_t seq;
        json_t *b = agent_evq_take(&q, 0, &seq);
        assert_non_null(b);
        assert_string_equal(json_string_value(b), want);
        json_decref(b);
        agent_evq_free(&q);
        free(want);
        json_decref(ev);
        json_decref(cases[i]);
    }
}

static void evq_replace_rest(void **st)
{
    (void)st;
    agent_evq q;
    agent_evq_init(&q);
    for (int i = 0; i < 3; i++)
        agent_evq_push(&q, ev("token"));
    size_t seq;
    json_t *b = agent_evq_take(&q, 0, &seq);
    json_decref(b);
    agent_evq_ack(&q);
    agent_evq_push(&q, ev("token"));
    agent_evq_push(&q, ev("end"));
    b = agent_evq_take(&q, 0, &seq);
    json_decref(b);
    agent_evq_replace_rest(&q, ev("error"));
    assert_int_equal(agent_evq_len(&q), 4);
    assert_true(q.terminal);
    b = agent_evq_take(&q, 0, &seq);
    assert_int_equal(seq, 3);
    assert_int_equal(nev(b), 1);
    assert_string_equal(json_string_value(b), "{\"type\":\"error\"}");
    json_decref(b);
    agent_evq_ack(&q);
    assert_true(agent_evq_done(&q));
    agent_evq_free(&q);
}

static void evq_nothing_after_terminal(void **st)
{
    (void)st;
    agent_evq q;
    agent_evq_init(&q);
    assert_int_equal(agent_evq_push(&q, ev("error")), 0);
    assert_int_equal(agent_evq_push(&q, ev("token")), -1);
    assert_int_equal(agent_evq_push(&q, ev("end")), -1);
    assert_int_equal(agent_evq_push(&q, NULL), -1);
    assert_int_equal(agent_evq_len(&q), 1);
    agent_evq_free(&q);
}

/* ------------------------------------------------- evq out of memory ---- */

/* The error event a broken queue ends with (docs/protocol.md), spelled out
 * here rather than taken from the header: the wire text is the contract. */
#define OOM_EV                                                                                \
    "{\"type\":\"error\",\"code\":\"AGENT_OUT_OF_MEMORY\",\"message\":\"the agent ran out of " \
    "memory while queueing the job's output\"}"

/* Everything the queue holds from acked on, as one upload takes it, acked. */
static char *take_all(agent_evq *q)
{
    gp_buf b;
    gp_buf_init(&b);
    size_t seq = 0;
    assert_int_equal(agent_evq_take_append(q, 0, &seq, &b), 1);
    agent_evq_ack(q);
    return gp_buf_steal(&b);
}

/* A push that fails breaks the queue: the events before it stay, whole and
 * in order, none after it is taken (a later token would hide the gap),
 * and the queue ends with the AGENT_OUT_OF_MEMORY error, terminal as an
 * error event is: done once the server has it. */
static void evq_break_keeps_before_takes_nothing_after(void **st)
{
    (void)st;
    agent_evq q;
    agent_evq_init(&q);
    assert_int_equal(agent_evq_push(&q, ev("started")), 0);
    assert_int_equal(agent_evq_push_token(&q, "a", 1, 5), 0);
    agent_evq_mark_output(&q);
    assert_int_equal(agent_evq_push(&q, NULL), -1); /* an event json_pack could not build */
    assert_int_equal(agent_evq_push_token(&q, "b", 1, 6), -1);
    json_t *m = json_pack("{s:i}", "total_ms", 3);
    assert_int_equal(agent_evq_push_typed(&q, m, "metrics"), -1);
    json_decref(m);
    assert_int_equal(agent_evq_push(&q, ev("end")), -1);
    assert_true(agent_evq_broken(&q));
    assert_int_equal(agent_evq_len(&q), 3);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_READY | AGENT_EVQ_URGENT | AGENT_EVQ_BROKEN);
    assert_false(agent_evq_done(&q));
    char *got = take_all(&q);
    assert_string_equal(got, "{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"a\","
                             "\"token_id\":5}," OOM_EV);
    free(got);
    assert_true(agent_evq_done(&q));
    assert_false(agent_evq_ready(&q));
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_BROKEN);
    agent_evq_free(&q);
}

/* The out-of-memory event goes out as any other: in the batch that
 * reaches it (max), alone when the rest went before, again after a failed
 * upload or a rewind, and agent_evq_take gives the same text. A break
 * while an upload is in flight shows as BROKEN alone (the loop stops the
 * job's backend at once: agent_jobs.c job_note_locked). */
static void evq_break_event_batches_and_resends(void **st)
{
    (void)st;
    agent_evq q;
    size_t seq = 99;
    gp_buf b;
    gp_buf_init(&b);
    agent_evq_init(&q);
    for (int i = 0; i < 3; i++)
        assert_int_equal(agent_evq_push(&q, ev("token")), 0);
    assert_int_equal(agent_evq_take_append(&q, 2, &seq, &b), 1);
    assert_int_equal(agent_evq_flags(&q), 0); /* in flight */
    assert_int_equal(agent_evq_push(&q, NULL), -1);
    assert_int_equal(agent_evq_flags(&q), AGENT_EVQ_BROKEN); /* what the sink sees gained */
    agent_evq_ack(&q);
    b.len = 0;
    assert_int_equal(agent_evq_take_append(&q, 2, &seq, &b), 1);
    assert_int_equal(seq, 2);
    assert_string_equal(b.data, "{\"type\":\"token\"}," OOM_EV);
    agent_evq_nack(&q);
    json_t *s = agent_evq_take(&q, 0, &seq);
    assert_non_null(s);
    assert_string_equal(json_string_value(s), "{\"type\":\"token\"}," OOM_EV);
    json_decref(s);
    agent_evq_rewind(&q, 3); /* the server has the token: only the error is left */
    assert_true(agent_evq_ready(&q));
    b.len = 0;
    assert_int_equal(agent_evq_take_append(&q, 0, &seq, &b), 1);
    assert_int_equal(seq, 3);
    assert_string_equal(b.data, OOM_EV);
    assert_false(agent_evq_done(&q));
    agent_evq_ack(&q);
    assert_true(agent_evq_done(&q));
    agent_evq_rewind(&q, 1000); /* clamped to the events there are, the error included */
    assert_int_equal(q.acked, 4);
    assert_true(agent_evq_done(&q));
    /* A queue that breaks before any event holds the error alone. */
    agent_evq_free(&q);
    agent_evq_init(&q);
    assert_int_equal(agent_evq_push(&q, NULL), -1);
    assert_int_equal(agent_evq_push(&q, ev("started")), -1);
    char *got = take_all(&q);
    assert_string_equal(got, OOM_EV);
    free(got);
    assert_true(agent_evq_done(&q));
    agent_evq_free(&q);
    gp_buf_free(&b);
}

/* A refused upload (400) on a broken queue: the refused events, the
 * out-of-memory one among them, make way for the given error; one that
 * could not be built either (NULL) leaves the out-of-memory event. */
static void evq_break_then_replace_rest(void **st)
{
    (void)st;
    agent_evq q;
    agent_evq_init(&q);
    agent_evq_push(&q, ev("started"));
    free(take_all(&q));
    agent_evq_push(&q, ev("token"));
    agent_evq_push(&q, NULL);
    size_t seq;
    json_t *s = agent_evq_take(&q, 0, &seq);
    json_decref(s);
    agent_evq_replace_rest(&q, json_pack("{s:s,s:s}", "type", "error", "code", "X"));
    assert_false(agent_evq_broken(&q));
    char *got = take_all(&q);
    assert_string_equal(got, "{\"type\":\"error\",\"code\":\"X\"}");
    free(got);
    assert_true(agent_evq_done(&q));
    agent_evq_free(&q);

    agent_evq_init(&q);
    agent_evq_push(&q, ev("started"));
    free(take_all(&q));
    agent_evq_push(&q, ev("token"));
    s = agent_evq_take(&q, 0, &seq);
    json_decref(s);
    agent_evq_replace_rest(&q, NULL);
    assert_true(agent_evq_broken(&q));
    got = take_all(&q);
    assert_string_equal(got, OOM_EV);
    free(got);
    assert_true(agent_evq_done(&q));
    agent_evq_free(&q);
}

/* jansson's allocator fails the N-th allocation (as the server's
 * out-of-memory sweeps do, tests/unit/server/fixture_oom.h) while a job's
 * events are built with json_pack, as the agent's sinks build them, and
 * pushed: for every N the queue's text is the events up to the first one
 * lost, then the out-of-memory error, and nothing after it; a run that
 * loses none sends them all. */
static size_t oom_countdown;
static bool oom_injected;

static void *oom_malloc(size_t n)
{
    if (oom_countdown && --oom_countdown == 0) {
        oom_injected = true;
        return NULL;
    }
    return malloc(n);
}

/* m: a backend's metrics, built before the allocator fails (they are the
 * backend's, not the sink's). */
static void push_job_events(agent_evq *q, const json_t *m)
{
    agent_evq_push(q, json_pack("{s:s}", "type", "started"));
    for (int i = 0; i < 4; i++) {
        agent_evq_push(q, json_pack("{s:s,s:s,s:i,s:[i,i]}", "type", "token", "text", "tok",
                                    "token_id", i, "token_ids", i, i));
        agent_evq_push_token(q, "t", 1, i);
    }
    agent_evq_push(q, json_pack("{s:s,s:i,s:s,s:s}", "type", "tool_call", "index", 0, "id",
                                "call_1", "arguments", "{}"));
    agent_evq_push_typed(q, m, "metrics"); /* fields with a "type": a deep copy */
    agent_evq_push(q, json_pack("{s:s,s:s,s:{s:i}}", "type", "end", "finish_reason", "stop",
                                "usage", "completion_tokens", 8));
}

static void evq_break_under_jansson_oom(void **st)
{
    (void)st;
    agent_evq q;
    agent_evq_init(&q);
    json_t *m = json_pack("{s:s,s:i}", "type", "x", "total_ms", 3);
    push_job_events(&q, m);
    char *all = take_all(&q);
    agent_evq_free(&q);
    bool reached = true;
    for (size_t n = 1; reached; n++) {
        agent_evq_init(&q);
        oom_countdown = n;
        oom_injected = false;
        json_set_alloc_funcs(oom_malloc, free);
        push_job_events(&q, m);
        json_set_alloc_funcs(malloc, free);
        oom_countdown = 0;
        reached = oom_injected;
        char *got = take_all(&q);
        assert_true(agent_evq_done(&q));
        if (!reached) {
            assert_string_equal(got, all);
        } else {
            assert_true(agent_evq_broken(&q));
            size_t len = strlen(got), tail = strlen(OOM_EV);
            assert_true(len >= tail);
            assert_string_equal(got + len - tail, OOM_EV);
            /* What precedes it is a whole-event prefix of the full run. */
            size_t head = len - tail;
            if (head > 0) {
                assert_int_equal(got[head - 1], ',');
                head--;
            }
            assert_memory_equal(got, all, head);
            assert_true(head == 0 || all[head] == ','); /* ends where an event ends */
        }
        free(got);
        agent_evq_free(&q);
    }
    free(all);
    json_decref(m);
}

/* --------------------------------------------------------- backoff ---- */

static void backoff_schedule(void **st)
{
    (void)st;
    agent_backoff b;
    agent_backoff_init(&b, 500, 30000);
    /* rnd 0 gives the low end nominal/2, rnd = half gives nominal itself. */
    uint32_t nominal[] = {500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000};
    for (size_t i = 0; i < sizeof nominal / sizeof nominal[0]; i++) {
        agent_backoff c = b;
        assert_int_equal(agent_backoff_next(&c, 0), nominal[i] - nominal[i] / 2);
        assert_int_equal(agent_backoff_next(&b, nominal[i] / 2), nominal[i]);
    }
    /* Any random value stays within [nominal/2, nominal]. */
    for (uint32_t r = 0; r < 5000; r += 7) {
        agent_backoff c;
        agent_backoff_init(&c, 500, 30000);
        for (int k = 0; k < 20; k++) {
            uint32_t d = agent_backoff_next(&c, r * 2654435761u);
            assert_true(d >= 250 && d <= 30000);
        }
        uint32_t d = agent_backoff_next(&c, r);
        assert_true(d >= 15000 && d <= 30000);
    }
    agent_backoff_reset(&b);
    assert_int_equal(agent_backoff_next(&b, 0), 250);
}

/* ---------------------------------------------------------- labels ---- */

static void labels_ok(void **st)
{
    (void)st;
    char err[200];
    json_t *l = agent_labels_parse(" region = eu , tier=gold,zone/a=x y,empty=", err, sizeof err);
    assert_non_null(l);
    assert_int_equal(json_object_size(l), 4);
    assert_string_equal(json_string_value(json_object_get(l, "region")), "eu");
    assert_string_equal(json_string_value(json_object_get(l, "tier")), "gold");
    assert_string_equal(json_string_value(json_object_get(l, "zone/a")), "x y");
    assert_string_equal(json_string_value(json_object_get(l, "empty")), "");
    json_decref(l);
    l = agent_labels_parse("", err, sizeof err);
    assert_non_null(l);
    assert_int_equal(json_object_size(l), 0);
    json_decref(l);
    l = agent_labels_parse("   ", err, sizeof err);
    assert_non_null(l);
    json_decref(l);
    l = agent_labels_parse(NULL, err, sizeof err);
    assert_non_null(l);
    json_decref(l);
}

static void labels_bad(void **st)
{
    (void)st;
    const char *bad[] = {"a", "a=b,", ",a=b", "a=b,,c=d", "=v", "a b=c", "a=1,a=2",
                         "k\x01=v", "a=\x01", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[200] = "";
        json_t *l = agent_labels_parse(bad[i], err, sizeof err);
        if (l)
            fail_msg("accepted bad labels '%s'", bad[i]);
        assert_non_null(strstr(err, "labels"));
    }
}

/* ------------------------------------------------------- agent_id ---- */

static void state_id_created_and_kept(void **st)
{
    (void)st;
    char tmpl[] = "/tmp/gp-agent-test-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/sub/state", tmpl);
    snprintf(path, sizeof path, "%s/agent_id", dir);
    char id1[37], id2[37], err[300];
    assert_int_equal(agent_state_load_id(dir, id1, err, sizeof err), 0);
    assert_true(gp_uuid_valid(id1));
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(agent_state_load_id(dir, id2, err, sizeof err), 0);
    assert_string_equal(id1, id2);
    /* A damaged file is an error, never silently replaced. */
    FILE *f = fopen(path, "w");
    fputs("not-a-uuid\n", f);
    fclose(f);
    assert_int_equal(agent_state_load_id(dir, id2, err, sizeof err), -1);
    assert_non_null(strstr(err, "agent_id"));
    /* A state dir that is a file. */
    char fpath[300];
    snprintf(fpath, sizeof fpath, "%s/file", tmpl);
    f = fopen(fpath, "w");
    fclose(f);
    assert_int_equal(agent_state_load_id(fpath, id2, err, sizeof err), -1);
    assert_int_equal(agent_state_load_id("", id2, err, sizeof err), -1);
    unlink(path);
    unlink(fpath);
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/sub", tmpl);
    rmdir(dir);
    rmdir(tmpl);
}

static void agent_key_file(void **st)
{
    (void)st;
    char tmpl[] = "/tmp/gp-agent-key-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char path[300], err[300];
    snprintf(path, sizeof path, "%s/agent.key", tmpl);
    char *key = (char *)1;
    /* No file yet: 0, nothing returned. */
    assert_int_equal(agent_state_load_key(tmpl, &key, err, sizeof err), 0);
    assert_null(key);
    /* Saved 0600, read back exactly. */
    const char *k = "gpk_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_int_equal(agent_state_save_key(tmpl, k, err, sizeof err), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(agent_state_load_key(tmpl, &key, err, sizeof err), 1);
    assert_string_equal(key, k);
    free(key);
    /* Surrounding blanks (an operator's editor) are fine. */
    FILE *f = fopen(path, "w");
    fputs("  gpk_abc \n\n", f);
    fclose(f);
    assert_int_equal(agent_state_load_key(tmpl, &key, err, sizeof err), 1);
    assert_string_equal(key, "gpk_abc");
    free(key);
    /* Damaged: two words, empty, a NUL inside. Errors naming the file. */
    const char *bad[] = {"gpk_a gpk_b\n", "", "\n \n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        key = NULL;
        assert_int_equal(agent_state_load_key(tmpl, &key, err, sizeof err), -1);
        assert_null(key);
        assert_non_null(strstr(err, "agent.key"));
    }
    f = fopen(path, "w");
    fwrite("gpk_a\0b", 1, 7, f);
    fclose(f);
    assert_int_equal(agent_state_load_key(tmpl, &key, err, sizeof err), -1);
    /* A key that is not a printable token is never written. */
    assert_int_equal(agent_state_save_key(tmpl, "gpk_a\r\nX-Evil: 1", err, sizeof err), -1);
    assert_int_equal(agent_state_save_key(tmpl, "", err, sizeof err), -1);
    assert_int_equal(agent_state_load_key("", &key, err, sizeof err), -1);
    unlink(path);
    rmdir(tmpl);
}

static void agent_key_validity(void **st)
{
    (void)st;
    assert_true(agent_key_valid("gpk_0123"));
    assert_true(agent_key_valid("gp-bogus"));
    assert_false(agent_key_valid(NULL));
    assert_false(agent_key_valid(""));
    assert_false(agent_key_valid("a b"));
    assert_false(agent_key_valid("a\tb"));
    assert_false(agent_key_valid("a\r\nb"));
    assert_false(agent_key_valid("caf\xc3\xa9"));
    char big[AGENT_KEY_MAX + 2];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_false(agent_key_valid(big));
    big[AGENT_KEY_MAX] = '\0';
    assert_true(agent_key_valid(big));
}

/* ------------------------------------------------------------ idtab --- */

typedef struct idobj {
    char id[16];
    agent_idnode node;
} idobj;

static void idtab_find_add_del(void **st)
{
    (void)st;
    enum { N = 1000 };
    static idobj o[N];
    agent_idtab t;
    agent_idtab_init(&t);
    assert_null(agent_idtab_find(&t, "x")); /* empty, no buckets yet */
    assert_int_equal(agent_idtab_reserve(&t, 8), 0);
    for (int i = 0; i < N; i++) { /* grows past the reserve, rehashing */
        snprintf(o[i].id, sizeof o[i].id, "job-%d", i);
        assert_int_equal(agent_idtab_add(&t, &o[i].node, o[i].id), 0);
    }
    assert_int_equal(t.n, N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(agent_idtab_find(&t, o[i].id), &o[i].node);
    assert_null(agent_idtab_find(&t, "job-1000"));
    assert_null(agent_idtab_find(&t, ""));
    for (int i = 0; i < N; i += 2)
        agent_idtab_del(&t, &o[i].node);
    agent_idtab_del(&t, &o[0].node); /* not in it any more: nothing happens */
    assert_int_equal(t.n, N / 2);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(agent_idtab_find(&t, o[i].id), i % 2 ? &o[i].node : NULL);
    /* A key added twice: the latest is found, the earlier after its removal. */
    idobj dup;
    snprintf(dup.id, sizeof dup.id, "job-1");
    assert_int_equal(agent_idtab_add(&t, &dup.node, dup.id), 0);
    assert_ptr_equal(agent_idtab_find(&t, "job-1"), &dup.node);
    agent_idtab_del(&t, &dup.node);
    assert_ptr_equal(agent_idtab_find(&t, "job-1"), &o[1].node);
    agent_idtab_free(&t);
    assert_null(agent_idtab_find(&t, "job-1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sse_basic_lf),
        cmocka_unit_test(sse_crlf_and_cr),
        cmocka_unit_test(sse_comments_and_other_fields),
        cmocka_unit_test(sse_multiline_data_joined),
        cmocka_unit_test(sse_unterminated_last_event),
        cmocka_unit_test(sse_no_blank_line_no_event),
        cmocka_unit_test(sse_line_too_long),
        cmocka_unit_test(sse_callback_stop_propagates),
        cmocka_unit_test(evq_batches_everything_accumulated),
        cmocka_unit_test(evq_max_batch_and_rewind),
        cmocka_unit_test(evq_flags_say_what_changed),
        cmocka_unit_test(evq_take_append_as_take),
        cmocka_unit_test(timers_heap_order),
        cmocka_unit_test(idtab_find_add_del),
        cmocka_unit_test(evq_nothing_after_terminal),
        cmocka_unit_test(evq_replace_rest),
        cmocka_unit_test(evq_break_keeps_before_takes_nothing_after),
        cmocka_unit_test(evq_break_event_batches_and_resends),
        cmocka_unit_test(evq_break_then_replace_rest),
        cmocka_unit_test(evq_break_under_jansson_oom),
        cmocka_unit_test(evq_text_as_json_dumps),
        cmocka_unit_test(evq_typed_as_json_dumps),
        cmocka_unit_test(evq_token_json_as_json_dumps),
        cmocka_unit_test(backoff_schedule),
        cmocka_unit_test(labels_ok),
        cmocka_unit_test(labels_bad),
        cmocka_unit_test(state_id_created_and_kept),
        cmocka_unit_test(agent_key_file),
        cmocka_unit_test(agent_key_validity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Unit tests for the openai backend's reading of a reply (openai_stream.h),
 * driven byte by byte as libcurl would, with a recording event sink, and
 * for its request building. Both files are included for their statics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/openai_stream.c" /* its statics: handle_object, fail_status */
#include "agent/backend_openai.c"

#define GPS_FIXTURE_OOM_LIBC
#include "../server/fixture_oom.h"

typedef struct {
    gp_buf text;
    gp_buf calls;           /* "index|id|name|args;" per tool_call piece */
    int ntokens, nstarted, nend, nerror;
    char code[64];
    char finish[32];
    long long pt, ct;
} rec;

static void r_started(void *c) { ((rec *)c)->nstarted++; }
static void r_token(void *c, const char *t, size_t n, int32_t id)
{
    rec *r = c;
    (void)id;
    gp_buf_append(&r->text, t, n);
    r->ntokens++;
}
static void r_metrics(void *c, json_t *m) { (void)c; (void)m; }
static void r_end(void *c, const char *fr, long long pt, long long ct)
{
    rec *r = c;
    r->nend++;
    snprintf(r->finish, sizeof r->finish, "%s", fr);
    r->pt = pt;
    r->ct = ct;
}
static void r_error(void *c, const char *code, const char *msg)
{
    rec *r = c;
    (void)msg;
    r->nerror++;
    snprintf(r->code, sizeof r->code, "%s", code);
}

static void r_tool(void *c, int index, const char *id, const char *name, const char *args,
                   size_t n)
{
    rec *r = c;
    gp_buf_appendf(&r->calls, "%d|%s|%s|%.*s;", index, id ? id : "-", name ? name : "-", (int)n,
                   args);
}

static void job_init(oai_stream *j, rec *r, bool chat)
{
    memset(r, 0, sizeof *r);
    gp_buf_init(&r->text);
    gp_buf_init(&r->calls);
    agent_job_sink sink = {.ctx = r,
                           .started = r_started,
                           .token = r_token,
                           .metrics = r_metrics,
                           .end = r_end,
                           .error = r_error,
                           .tool_call = r_tool};
    oai_stream_init(j, &sink, "job1", chat, false, NULL, 1024);
}

static void job_done(oai_stream *j, rec *r)
{
    oai_stream_free(j);
    gp_buf_free(&r->text);
    gp_buf_free(&r->calls);
}

/* As libcurl's header callback: the line's length, or 0 to stop. */
static size_t hdr(oai_stream *j, const char *line)
{
    return oai_stream_header(j, line, strlen(line)) == 0 ? strlen(line) : 0;
}

/* Feed the body in pieces of `step` bytes; returns bytes accepted overall. */
static size_t body(oai_stream *j, const char *s, size_t step)
{
    size_t n = strlen(s), done = 0;
    while (done < n) {
        size_t k = n - done < step ? n - done : step;
        if (oai_stream_body(j, s + done, k) < 0)
            return done;
        done += k;
    }
    return done;
}

static const char *chat_stream =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
    "\"finish_reason\":null}]}\r\n\r\n"
    ": ping\r\n\r\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n"
    "data: [DONE]\n\n";

static void chat_stream_any_split(void **st)
{
    (void)st;
    for (size_t step = 1; step < 64; step++) {
        oai_stream j;
        rec r;
        job_init(&j, &r, true);
        hdr(&j, "HTTP/1.1 200 OK\r\n");
        hdr(&j, "Content-Type: text/event-stream; charset=utf-8\r\n");
        size_t n = body(&j, chat_stream, step);
        /* Everything is taken (what follows [DONE] is not parsed), so that
         * the transfer can end and its connection be reused. */
        assert_int_equal(n, strlen(chat_stream));
        assert_true(j.done_seen);
        assert_false(j.failed);
        assert_int_equal(r.ntokens, 2);
        assert_string_equal(r.text.data, "Hello \xc3\xa9");
        assert_string_equal(j.finish, "length");
        assert_int_equal(j.prompt_tokens, 7);
        assert_int_equal(j.completion_tokens, 2);
        job_done(&j, &r);
    }
}

/* OpenAI streamed tool calls: the first piece of each call has id and
 * name, later pieces only argument text (an id repeated by the upstream is
 * not sent again). */
static const char *tool_stream =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\","
    "\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
    "{\"arguments\":\"{\\\"p\\\":\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\","
    "\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\","
    "\"function\":{\"name\":\"rm\",\"arguments\":\"{}\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
    "data: [DONE]\n\n";

static void tool_calls_streamed(void **st)
{
    (void)st;
    for (size_t step = 1; step < 40; step += 7) {
        oai_stream j;
        rec r;
        job_init(&j, &r, true);
        hdr(&j, "HTTP/1.1 200 OK\r\n");
        hdr(&j, "Content-Type: text/event-stream\r\n");
        body(&j, tool_stream, step);
        assert_true(j.done_seen);
        assert_false(j.failed);
        assert_int_equal(r.ntokens, 0);
        assert_string_equal(r.calls.data,
                            "0|call_a|ls|;0|-|-|{\"p\":;0|-|-|1};1|call_b|rm|{};");
        assert_int_equal(j.ntool_calls, 2);
        assert_string_equal(j.finish, "tool_calls");
        job_done(&j, &r);
    }
}

static void tool_calls_whole_and_malformed(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    json_t *o = json_loads("{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":["
                           "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                           "\"arguments\":\"{\\\"x\\\":2}\"}}]},\"finish_reason\":\"tool_calls\"}]}",
                           0, NULL);
    assert_non_null(o);
    assert_int_equal(handle_object(&j, o, false), 0);
    json_decref(o);
    assert_string_equal(r.calls.data, "0|c1|f|{\"x\":2};");
    job_done(&j, &r);

    /* Streamed pieces without an index: a name starts a call, the rest
     * continue it. */
    job_init(&j, &r, true);
    const char *noix[] = {
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"k\",\"function\":{\"name\":\"f\"}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}}]}",
    };
    for (size_t i = 0; i < 2; i++) {
        o = json_loads(noix[i], 0, NULL);
        assert_int_equal(handle_object(&j, o, true), 0);
        json_decref(o);
    }
    assert_string_equal(r.calls.data, "0|k|f|;0|-|-|{};");
    job_done(&j, &r);

    /* A call that starts without a name, arguments that are not a string,
     * an index that skips ahead: UPSTREAM_MALFORMED. */
    const char *bad[] = {
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{}}]}}]}",
        ("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\","
         "\"arguments\":{}}}]}}]}"), /* one element in two lines (clang -Wstring-concatenation) */
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"name\":\"f\"}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"x\"}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"0\",\"function\":{\"name\":\"f\"}}]}}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        job_init(&j, &r, true);
        o = json_loads(bad[i], 0, NULL);
        assert_non_null(o);
        assert_int_equal(handle_object(&j, o, true), 2);
        assert_true(j.failed);
        assert_string_equal(j.err_code, "UPSTREAM_MALFORMED");
        json_decref(o);
        job_done(&j, &r);
    }
}

static void completion_stream(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, false);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    hdr(&j, "content-type: text/event-stream\r\n");
    const char *s = "data: {\"choices\":[{\"text\":\" a\",\"finish_reason\":null}]}\n\n"
                    "data: {\"choices\":[{\"text\":\" b\",\"finish_reason\":\"stop\"}]}\n\n"
                    "data: [DONE]\n\n";
    body(&j, s, 5);
    assert_true(j.done_seen);
    assert_string_equal(r.text.data, " a b");
    assert_string_equal(j.finish, "stop");
    job_done(&j, &r);
}

static void malformed_chunk_fails(void **st)
{
    (void)st;
    const char *bad[] = {
        "data: {\"choices\": [ nope\n\n",
        "data: [1,2]\n\n",
        "data: {\"choices\": 5}\n\n",
        "data: {\"choices\": [7]}\n\n",
        "data: {\"choices\": [{\"text\": 12}]}\n\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        oai_stream j;
        rec r;
        job_init(&j, &r, false);
        hdr(&j, "HTTP/1.1 200 OK\r\n");
        hdr(&j, "Content-Type: text/event-stream\r\n");
        size_t n = body(&j, bad[i], 1000);
        assert_true(n < strlen(bad[i]));
        assert_true(j.failed);
        assert_string_equal(j.err_code, "UPSTREAM_MALFORMED");
        job_done(&j, &r);
    }
}

/* A chunk read by jansson (a tool call: not oai_chunk's plain token),
 * with its N-th allocation failing (libc's, beneath gp_json's counting
 * allocator: fixture_oom.h arm_beneath): the job goes on as unhurt, or
 * fails as the agent's own lack of memory (AGENT_OUT_OF_MEMORY, which the
 * server fails over; or INTERNAL_ERROR from what follows the parse), never
 * UPSTREAM_MALFORMED, which blames an upstream that sent valid JSON. */
static void chunk_out_of_memory_is_not_malformed(void **st)
{
    (void)st;
    static const char chunk[] =
        "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
        "\"id\":\"call_with_a_long_identifier\",\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather_for_a_city\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "\"finish_reason\":null}]}";
    int oom_seen = 0;
    size_t n;
    for (n = 1;; n++) {
        oai_stream j;
        rec r;
        job_init(&j, &r, true);
        hdr(&j, "HTTP/1.1 200 OK\r\n");
        hdr(&j, "Content-Type: text/event-stream\r\n");
        arm_beneath(n);
        int rc = on_sse_data(&j, chunk, sizeof chunk - 1);
        bool hit = disarm();
        if (j.failed) {
            assert_int_equal(rc, 2);
            if (strcmp(j.err_code, "UPSTREAM_MALFORMED") == 0)
                fail_msg("allocation %zu failed: UPSTREAM_MALFORMED (%s)", n, j.err_msg);
            oom_seen += strcmp(j.err_code, "AGENT_OUT_OF_MEMORY") == 0;
        } else {
            assert_int_equal(rc, 0); /* (hurt: the failure was the recorder's own) */
        }
        job_done(&j, &r);
        if (!hit)
            break;
    }
    print_message("upstream chunk: %zu allocations swept, %d AGENT_OUT_OF_MEMORY\n", n - 1,
                  oom_seen);
    assert_true(oom_seen > 0);
}

static void error_object_in_stream(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    hdr(&j, "Content-Type: text/event-stream\r\n");
    body(&j, "data: {\"error\":{\"message\":\"out of memory\"}}\n\n", 1000);
    assert_true(j.failed);
    assert_string_equal(j.err_code, "UPSTREAM_ERROR");
    assert_non_null(strstr(j.err_msg, "out of memory"));
    job_done(&j, &r);
}

static void overlong_line_fails(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    hdr(&j, "Content-Type: text/event-stream\r\n");
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    body(&j, "data: ", 100);
    assert_true(body(&j, big, 100) < strlen(big));
    assert_string_equal(j.err_code, "UPSTREAM_MALFORMED");
    job_done(&j, &r);
}

/* The stall clock: bytes only mark the stream, a sweep reads the time. */
static void idle_time_from_sweeps(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    uint64_t t0 = j.last_byte_ms;
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 100), 100);
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 300), 300);
    hdr(&j, "HTTP/1.1 200 OK\r\n");               /* a header line is a byte */
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 500), 0);
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 700), 200);
    hdr(&j, "Content-Type: text/event-stream\r\n");
    hdr(&j, "\r\n");
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 900), 0);
    assert_int_equal(body(&j, ": ping\n\n", 3), 8);  /* so is a comment */
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 2000), 0);
    assert_int_equal(oai_stream_idle_ms(&j, t0 + 2000 + 60000), 60000);
    /* A clock that went back (never, monotonic; but no wrap to 2^64). */
    assert_int_equal(oai_stream_idle_ms(&j, t0), 0);
    job_done(&j, &r);
}

static void wrong_content_type_and_error_status(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    const char *ct = "Content-Type: text/html\r\n";
    assert_int_equal(hdr(&j, ct), 0);
    assert_string_equal(j.err_code, "UPSTREAM_MALFORMED");
    job_done(&j, &r);

    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 500 Internal Server Error\r\n");
    hdr(&j, "Content-Type: text/html\r\n"); /* ignored for errors */
    assert_false(j.failed);
    const char *b = "{\"error\":{\"message\":\"model exploded\"}}";
    assert_int_equal(body(&j, b, 3), strlen(b));
    fail_status(&j);
    assert_string_equal(j.err_code, "UPSTREAM_ERROR");
    assert_non_null(strstr(j.err_msg, "500"));
    assert_non_null(strstr(j.err_msg, "model exploded"));
    job_done(&j, &r);

    /* 2xx with no Content-Type at all */
    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    assert_int_equal(body(&j, "data: x\n\n", 100), 0);
    assert_string_equal(j.err_code, "UPSTREAM_MALFORMED");
    job_done(&j, &r);
}

static void json_reply_lenient(void **st)
{
    (void)st;
    oai_stream j;
    rec r;
    job_init(&j, &r, true);
    hdr(&j, "HTTP/1.1 200 OK\r\n");
    hdr(&j, "Content-Type: application/json\r\n");
    const char *b = "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"whole\"},"
                    "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}";
    body(&j, b, 7);
    json_t *o = json_loadb(j.raw.data, j.raw.len, 0, NULL);
    assert_non_null(o);
    assert_int_equal(handle_object(&j, o, false), 0);
    json_decref(o);
    assert_string_equal(r.text.data, "whole");
    job_done(&j, &r);
}

/* Issue 26 item 4: the job's stop strings are matched by the agent, in any
 * split of the stream: the text before the earliest one goes out, the
 * string and the rest do not, the reply ends "stop" naming the string, and
 * the stream counts as complete at the match (the transport drops it). */
static char stop_seen[64];
static void r_stop(void *c, const char *seq)
{
    (void)c;
    snprintf(stop_seen, sizeof stop_seen, "%s", seq);
}

/* A job with stop strings whose 200 SSE headers came. */
static void stop_job_init(oai_stream *j, rec *r, bool chat, const json_t *stops)
{
    job_init(j, r, chat);
    j->stops = stops;
    j->sink.stop_sequence = r_stop;
    stop_seen[0] = '\0';
    hdr(j, "HTTP/1.1 200 OK\r\n");
    hdr(j, "Content-Type: text/event-stream\r\n");
    hdr(j, "\r\n");
    assert_int_equal(j->status, 200);
}

static void stop_strings_matched(void **st)
{
    (void)st;
    const char *sse = "data: {\"choices\":[{\"delta\":{\"content\":\"one EN\"}}]}\n\n"
                      "data: {\"choices\":[{\"delta\":{\"content\":\"D? E\"}}]}\n\n"
                      "data: {\"choices\":[{\"delta\":{\"content\":\"ND\"}}]}\n\n"
                      "data: {\"choices\":[{\"delta\":{\"content\":\"! two\"}}]}\n\n"
                      "data: {\"choices\":[{\"delta\":{\"content\":\" more\"}}]}\n\n"
                      "data: [DONE]\n\n";
    json_t *stops = json_pack("[s,s]", "never", "END!");
    for (size_t step = 1; step < 40; step += 3) {
        oai_stream j;
        rec r;
        stop_job_init(&j, &r, true, stops);
        size_t n = strlen(sse), done = 0;
        int rc = 0;
        while (done < n && rc == 0) {
            size_t k = n - done < step ? n - done : step;
            rc = oai_stream_body(&j, sse + done, k);
            done += k;
        }
        assert_int_equal(rc, 1);          /* complete at the match, before [DONE] */
        assert_true(done < n);
        oai_stream_finish(&j, NULL, NULL);
        assert_int_equal(r.nend, 1);
        assert_string_equal(r.finish, "stop");
        assert_string_equal(stop_seen, "END!");
        assert_string_equal(r.text.data, "one END? ");
        job_done(&j, &r);
    }
    /* No match: what was held back goes out at the end. */
    oai_stream j;
    rec r;
    stop_job_init(&j, &r, false, stops);
    body(&j, "data: {\"choices\":[{\"text\":\"a nev\"}]}\n\n"
             "data: {\"choices\":[{\"text\":\"e\",\"finish_reason\":\"length\"}]}\n\n"
             "data: [DONE]\n\n", 7);
    assert_string_equal(r.text.data, "a ");
    oai_stream_finish(&j, NULL, NULL);
    assert_string_equal(r.text.data, "a neve");
    assert_string_equal(r.finish, "length");
    assert_string_equal(stop_seen, "");
    job_done(&j, &r);
    json_decref(stops);
}

static void request_building(void **st)
{
    (void)st;
    agent_options o = {0};
    o.upstream_model = "upm";
    oai_backend b = {0};
    b.o = &o;
    char err[200];
    bool chat = false, nomem = false;
    json_t *job = json_loads("{\"job_id\":\"j\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
                             "\"content\":\"hi\"}],\"params\":{\"max_tokens\":5,\"top_k\":0,"
                             "\"stop\":[\"x\"],\"seed\":null},\"continuation\":\"par\"}",
                             0, NULL);
    json_t *req = build_request(&b, job, &chat, &nomem, err, sizeof err);
    assert_non_null(req);
    assert_true(chat);
    assert_string_equal(json_string_value(json_object_get(req, "model")), "upm");
    assert_true(json_is_true(json_object_get(req, "stream")));
    assert_int_equal(json_integer_value(json_object_get(req, "max_tokens")), 5);
    assert_null(json_object_get(req, "top_k"));
    assert_null(json_object_get(req, "seed"));
    /* Issue 26 item 4: the agent matches stop strings itself. */
    assert_null(json_object_get(req, "stop"));
    json_t *msgs = json_object_get(req, "messages");
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "role")),
                        "assistant");
    /* The messages are forwarded without a copy (issue 24): the job's own
     * array stays as it was, the continuation only in the request's. */
    assert_int_equal(json_array_size(json_object_get(job, "messages")), 1);
    assert_ptr_equal(json_array_get(msgs, 0), json_array_get(json_object_get(job, "messages"), 0));
    json_decref(req);
    json_decref(job);
    job = json_loads("{\"job_id\":\"j\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"hi\"}]}",
                     0, NULL);
    req = build_request(&b, job, &chat, &nomem, err, sizeof err);
    assert_non_null(req);
    assert_true(json_equal(json_object_get(req, "messages"), json_object_get(job, "messages")));
    json_decref(req);
    json_decref(job);

    /* tools and tool_choice go upstream as they are */
    job = json_loads("{\"job_id\":\"j\",\"kind\":\"chat\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\"}}],\"tool_choice\":\"required\"}",
                     0, NULL);
    req = build_request(&b, job, &chat, &nomem, err, sizeof err);
    assert_non_null(req);
    assert_true(json_equal(json_object_get(req, "tools"), json_object_get(job, "tools")));
    assert_string_equal(json_string_value(json_object_get(req, "tool_choice")), "required");
    json_decref(req);
    json_decref(job);

    job = json_loads("{\"job_id\":\"j\",\"kind\":\"completion\",\"prompt\":7}", 0, NULL);
    assert_null(build_request(&b, job, &chat, &nomem, err, sizeof err));
    json_decref(job);
    job = json_loads("{\"job_id\":\"j\",\"kind\":\"chat\",\"messages\":[]}", 0, NULL);
    assert_null(build_request(&b, job, &chat, &nomem, err, sizeof err));
    json_decref(job);
    /* count_tokens jobs are not generation requests */
    job = json_loads("{\"job_id\":\"j\",\"kind\":\"count_tokens\",\"prompt\":\"x\"}", 0, NULL);
    assert_null(build_request(&b, job, &chat, &nomem, err, sizeof err));
    json_decref(job);
    job = json_loads("{\"job_id\":\"j\",\"kind\":\"embedding\",\"prompt\":\"x\"}", 0, NULL);
    assert_null(build_request(&b, job, &chat, &nomem, err, sizeof err));
    json_decref(job);
    assert_false(nomem); /* refusals, not memory */
}

static void endpoints(void **st)
{
    (void)st;
    char *t = root_endpoint("http://h:1/v1/", "tokenize");
    assert_string_equal(t, "http://h:1/tokenize");
    free(t);
    t = root_endpoint("http://h:1", "tokenize");
    assert_string_equal(t, "http://h:1/tokenize");
    free(t);
    char *e = endpoint("http://h:1", "completions");
    assert_string_equal(e, "http://h:1/v1/completions");
    free(e);
    e = endpoint("http://h:1/v1/", "chat/completions");
    assert_string_equal(e, "http://h:1/v1/chat/completions");
    free(e);
    e = endpoint("http://h:1/ollama/v1", "completions");
    assert_string_equal(e, "http://h:1/ollama/v1/completions");
    free(e);
}

/* Every shape of SSE the upstream may send, read the same whatever the
 * reads: whole events at the front of a read are taken where they lie
 * (sse_whole_events, issue 24), the rest by the SSE reader, and a read may
 * end anywhere, so every piece size, the whole body in one read included. */
static const char *mixed_sse =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"
    "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"}}]}\n\n"
    ": keep-alive\n\n"
    "event: message\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"d\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\n"
    "data: \"delta\":{\"content\":\"e\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"f\"}}]}\r\n\r\n"
    "data:  {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"g\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\"}}]}\r\r"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"i\"}}]}\n\n"
    "data: [DONE]\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after\"}}]}\n\n";

static void sse_every_shape_any_split(void **st)
{
    (void)st;
    size_t len = strlen(mixed_sse);
    for (size_t step = 1; step <= len; step++) {
        oai_stream j;
        rec r;
        job_init(&j, &r, true);
        hdr(&j, "HTTP/1.1 200 OK\r\n");
        hdr(&j, "Content-Type: text/event-stream\r\n");
        assert_int_equal(body(&j, mixed_sse, step), len);
        assert_true(j.done_seen);
        assert_false(j.failed);
        assert_string_equal(r.text.data, "abcdefghi"); /* nothing after [DONE] */
        assert_int_equal(r.ntokens, 9);
        job_done(&j, &r);
    }
}

/* A job's request headers: its own lines ahead of the backend's fixed
 * ones, and nothing of another job's (issue 24: the lines are the job's,
 * not a list built for each). */
static void job_header_lines(void **st)
{
    (void)st;
    agent_options o = {0};
    oai_backend b = {0};
    b.o = &o;
    b.auth_header = "Authorization: Bearer k";
    b.fixed_hdrs[0] = fixed_headers(&b, false);
    b.fixed_hdrs[1] = fixed_headers(&b, true);
    assert_non_null(b.fixed_hdrs[0]);
    oai_job *a = calloc(1, sizeof *a), *c = calloc(1, sizeof *c);
    a->b = c->b = &b;
    assert_int_equal(job_lines(a, "job-a", "corr-a", "ab12"), 0);
    assert_string_equal(a->id, "job-a");
    assert_string_equal(a->correlation_id, "corr-a");
    a->pool_options = strdup("X-Pool-Options: {\"session\":\"s\"}");
    /* A pool_via that is not ids and separators is not sent. */
    assert_int_equal(job_lines(c, "job-c", NULL, "ab\r\nX: 1"), 0);
    assert_null(c->correlation_id);
    assert_null(c->pool_via);
    c->embed = true;
    job_headers(a);
    job_headers(c);
    gp_buf la, lc;
    gp_buf_init(&la);
    gp_buf_init(&lc);
    for (struct curl_slist *h = a->hdrs; h; h = h->next)
        gp_buf_appendf(&la, "%s|", h->data);
    for (struct curl_slist *h = c->hdrs; h; h = h->next)
        gp_buf_appendf(&lc, "%s|", h->data);
    assert_string_equal(la.data,
                        "X-Gpupool-Job-Id: job-a|X-Correlation-Id: corr-a|X-Pool-Via: ab12|"
                        "X-Pool-Options: {\"session\":\"s\"}|Content-Type: application/json|"
                        "Accept: text/event-stream|Expect:|Authorization: Bearer k|");
    assert_string_equal(lc.data, "X-Gpupool-Job-Id: job-c|Content-Type: application/json|"
                                 "Accept: application/json|Expect:|Authorization: Bearer k|");
    gp_buf_free(&la);
    gp_buf_free(&lc);
    job_free(a);
    job_free(c);
    curl_slist_free_all(b.fixed_hdrs[0]);
    curl_slist_free_all(b.fixed_hdrs[1]);
}

int main(void)
{
    gp_json_init(); /* the counting allocator arm_beneath fails beneath */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_stream_any_split),
        cmocka_unit_test(tool_calls_streamed),
        cmocka_unit_test(tool_calls_whole_and_malformed),
        cmocka_unit_test(completion_stream),
        cmocka_unit_test(malformed_chunk_fails),
        cmocka_unit_test(chunk_out_of_memory_is_not_malformed),
        cmocka_unit_test(error_object_in_stream),
        cmocka_unit_test(overlong_line_fails),
        cmocka_unit_test(wrong_content_type_and_error_status),
        cmocka_unit_test(idle_time_from_sweeps),
        cmocka_unit_test(json_reply_lenient),
        cmocka_unit_test(stop_strings_matched),
        cmocka_unit_test(request_building),
        cmocka_unit_test(endpoints),
        cmocka_unit_test(sse_every_shape_any_split),
        cmocka_unit_test(job_header_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

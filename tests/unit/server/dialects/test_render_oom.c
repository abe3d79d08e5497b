/* Replies under allocation failure: a whole-reply builder returns the
 * reply whole (the unhurt run's) or NULL; a stream frame renderer writes its
 * frame whole and returns 0, or returns -1 with the output as it was. Never
 * a reply or a stream with a message, a tool call or a warning left out that
 * nobody is told about. The failing allocator (jansson's N-th allocation
 * fails, N = 1, 2, ...) is fixture_oom.h's, shared with test_parse_oom.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/dialects/anthropic_sse.h"
#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/openai_render.h"
#include "server/dialects/responses.h"

#include "fixture_oom.h"

/* ------------------------------------------------------------------ */
/* Whole replies under the sweep                                       */
/* ------------------------------------------------------------------ */

typedef json_t *(*builder)(void);

/* Each run's failing allocator: arm (jansson's N-th allocation) or
 * arm_beneath (libc's N-th, jansson's among them through gp_json's counting
 * allocator, which the checked load reads). */
static int sweep_builder_with(const char *name, builder b, void (*arm_fn)(size_t))
{
    json_t *ref = b();
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        arm_fn(n);
        json_t *got = b();
        bool hit = disarm();
        if (got && !json_equal(got, ref)) {
            print_message("%s: allocation %zu failed, the reply was built with other content:\n",
                          name, n);
            print_diff("", got, ref);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", name, n - 1, bad);
    json_decref(ref);
    return bad;
}

static int sweep_builder(const char *name, builder b)
{
    return sweep_builder_with(name, b, arm);
}

/* Two tool calls as the handlers hold them (built before the sweeps: the
 * accumulator is not what is swept). */
static gps_tool_calls CALLS;

static void calls_init(void)
{
    bool started;
    json_t *a = J("{\"index\":0,\"id\":\"call_1\",\"name\":\"get_weather\",\"arguments\":"
                  "\"{\\\"city\\\":\\\"Paris\\\"}\"}");
    json_t *b = J("{\"index\":1,\"id\":\"call_2\",\"name\":\"get_time\",\"arguments\":\"{}\"}");
    assert_true(gps_tool_calls_add(&CALLS, a, &started) >= 0);
    assert_true(gps_tool_calls_add(&CALLS, b, &started) >= 0);
    assert_int_equal(CALLS.n, 2);
    json_decref(a);
    json_decref(b);
}

/* x_pool_meta as a handler passes it (stolen by the builders; made before
 * the sweeps, as gps_pool_meta's sweep is not this one). */
static json_t *META;

static json_t *meta_arg(void)
{
    return json_incref(META);
}

static json_t *b_oa_chat_body(void)
{
    gps_oa_out o;
    gps_oa_out_init(&o, true, true, "chatcmpl-1", 1700000000, "m");
    json_t *j = gps_oa_body(&o, &CALLS, "Let me look.", 12, "tool_calls", 10, 5, meta_arg());
    gps_oa_out_clear(&o);
    return j;
}

static json_t *b_oa_tools_only_body(void)
{
    gps_oa_out o;
    gps_oa_out_init(&o, true, false, "chatcmpl-2", 1700000000, "m");
    json_t *j = gps_oa_body(&o, &CALLS, "", 0, "tool_calls", 10, 5, NULL);
    gps_oa_out_clear(&o);
    return j;
}

static json_t *b_oa_completion_body(void)
{
    return gps_openai_response(false, "cmpl-1", 1700000000, "m", "Once upon", "length", 4, 2,
                               meta_arg());
}

static json_t *b_oa_chunk(void)
{
    return gps_openai_chunk(true, "chatcmpl-1", 1700000000, "m", "Hi", true, "stop", true);
}

static json_t *b_oa_completion_chunk(void)
{
    return gps_openai_chunk(false, "cmpl-1", 1700000000, "m", "Hi", false, NULL, true);
}

static json_t *b_oa_usage_chunk(void)
{
    return gps_openai_usage_chunk(true, "chatcmpl-1", 1700000000, "m", 10, 5);
}

static json_t *b_tool_calls(void)
{
    return gps_tool_calls_openai(&CALLS);
}

static json_t *b_anthropic_message(void)
{
    return gps_anthropic_message("msg_1", "claude", "Bonjour.", "stop_sequence", "END", 10, 5,
                                 meta_arg());
}

/* The message with the calls' tool_use blocks: their inputs are the
 * arguments parsed, where running out of memory must not read as
 * arguments that are not JSON ({} and a warning), nor change a string
 * (jansson 2.14 drops a byte of a long one when its buffer cannot grow:
 * the fourth call's). A third call's arguments are not JSON: that {} and
 * its warning are the reply's. Swept with arm_beneath: the arguments are
 * read by gp_json_load_checked, which sees allocation failures through
 * gp_json's counting allocator (jansson's own replaced by arm's, it would
 * not). */
static json_t *b_anthropic_tool_use(void)
{
    /* (a copy: the warning goes into x_pool_meta's warnings) */
    json_t *meta = json_deep_copy(META);
    if (!meta)
        return NULL;
    json_t *body = gps_anthropic_message("msg_1", "claude", "Let me look.", "tool_use", NULL,
                                         10, 5, meta);
    if (body && gps_anthropic_tool_use_blocks(body, &CALLS, true) < 0) {
        json_decref(body);
        body = NULL;
    }
    return body;
}

static void test_reply_builders(void **st)
{
    (void)st;
    calls_init();
    META = json_pack("{s:s,s:s,s:I,s:[s]}", "agent_id", "a1", "model", "m", "queue_ms",
                     (json_int_t)3, "warnings", "tools were ignored");
    assert_non_null(META);
    int bad = 0;
    bad += sweep_builder("openai chat body", b_oa_chat_body);
    bad += sweep_builder("openai tools-only body", b_oa_tools_only_body);
    bad += sweep_builder("openai completion body", b_oa_completion_body);
    bad += sweep_builder("openai chunk", b_oa_chunk);
    bad += sweep_builder("openai completion chunk", b_oa_completion_chunk);
    bad += sweep_builder("openai usage chunk", b_oa_usage_chunk);
    bad += sweep_builder("openai tool calls", b_tool_calls);
    bad += sweep_builder("anthropic message", b_anthropic_message);
    bool started;
    json_t *bad_args = J("{\"index\":2,\"id\":\"call_3\",\"name\":\"f\",\"arguments\":\"{x\"}");
    assert_true(gps_tool_calls_add(&CALLS, bad_args, &started) == 2);
    json_decref(bad_args);
    json_t *long_args = J("{\"index\":3,\"id\":\"call_4\",\"name\":\"send_letter\",\"arguments\":"
                          "\"{\\\"home_address_for_mail\\\":\\\"12 Long Street, Springfield, "
                          "somewhere far away\\\"}\"}");
    assert_true(gps_tool_calls_add(&CALLS, long_args, &started) == 3);
    json_decref(long_args);
    bad += sweep_builder_with("anthropic tool_use blocks", b_anthropic_tool_use, arm_beneath);
    gps_tool_calls_free(&CALLS);
    json_decref(META);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------------------------ */
/* Stream frames under the sweep                                       */
/* ------------------------------------------------------------------ */

/* A stream frame renderer either writes its frame whole (the bytes of the
 * unhurt run) and returns 0, or returns -1 with the output as it was
 * before the call: never a stream with a frame left out or changed that
 * nobody is told about. Each case sets its renderer's state up unhurt,
 * then runs the one frame with the failing allocator. */

#ifdef GPS_FRAMES_VOID
/* (the renderers before they said so: a dropped frame is a silent 0) */
#define FR(call) ((call), 0)
#else
#define FR(call) (call)
#endif

typedef int (*frame_case)(gp_buf *sse, size_t n, bool *hit);

/* Ids made at random (Responses' msg_/fc_ items) as X's, so runs compare. */
static void normalize_ids(gp_buf *b)
{
    static const char *const pre[] = {"\"msg_", "\"fc_", "\"resp_"};
    for (size_t k = 0; k < sizeof pre / sizeof *pre; k++) {
        char *p = b->data;
        while (p && (p = strstr(p, pre[k])) != NULL) {
            p += strlen(pre[k]);
            while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))
                *p++ = 'X';
        }
    }
}

static int run_armed_end(size_t n, bool *hit, int rc)
{
    (void)n;
    *hit = disarm();
    return rc;
}

static void oa_plain(gps_oa_out *o, bool chat)
{
    gps_oa_out_init(o, chat, true, chat ? "chatcmpl-1" : "cmpl-1", 1700000000, "m");
}

static int fc_oa_open(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_open(&o, sse)));
    gps_oa_out_clear(&o);
    return rc;
}

static int fc_oa_text_tpl(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_text(&o, sse, "He said \"hi\"\n", 13)));
    gps_oa_out_clear(&o);
    return rc;
}

/* The json path (the template could not be made). */
static int oa_text_slow(gp_buf *sse, size_t n, bool *hit, bool chat)
{
    gps_oa_out o;
    oa_plain(&o, chat);
    o.tpl_tried = true;
    o.text_tpl.pre = NULL;
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_text(&o, sse, "He said \"hi\"\n", 13)));
    gps_oa_out_clear(&o);
    return rc;
}

static int fc_oa_text_slow_chat(gp_buf *sse, size_t n, bool *hit)
{
    return oa_text_slow(sse, n, hit, true);
}

static int fc_oa_text_slow_completion(gp_buf *sse, size_t n, bool *hit)
{
    return oa_text_slow(sse, n, hit, false);
}

static int fc_oa_call_started(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_call(&o, sse, &CALLS, 0, true, "{\"city\":")));
    gps_oa_out_clear(&o);
    return rc;
}

static int fc_oa_call_piece(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_call(&o, sse, &CALLS, 1, false, "\"Paris\"}")));
    gps_oa_out_clear(&o);
    return rc;
}

/* The end with x_pool_meta as a tree (the handlers' fallback). */
static int fc_oa_close(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    json_t *meta = json_deep_copy(META);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_oa_close(&o, sse, "stop", 10, 5, meta)));
    gps_oa_out_clear(&o);
    return rc;
}

/* A finish_reason that is not UTF-8 (the last chunk is refused, as
 * before): the usage chunk and the meta go through jansson. */
static int fc_oa_close_text_trees(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    static const char meta[] = "{\"agent_id\":\"a1\",\"warnings\":[\"w\"]}";
    arm(n);
    int rc = run_armed_end(
        n, hit, FR(gps_oa_close_text(&o, sse, "st\xffop", 10, 5, meta, sizeof meta - 1)));
    gps_oa_out_clear(&o);
    return rc;
}

/* The same with a meta whose strings are longer than jansson's first
 * token buffer (its loader drops a byte of one when that buffer cannot
 * grow, and succeeds), swept with arm_beneath so that the checked load's
 * counting allocator sees the failures. */
static int fc_oa_close_text_trees_long(gp_buf *sse, size_t n, bool *hit)
{
    gps_oa_out o;
    oa_plain(&o, true);
    static const char meta[] = "{\"agent_id\":\"agent_of_a_long_name\",\"warnings\":"
                               "[\"tools were ignored by this model\"]}";
    arm_beneath(n);
    int rc = run_armed_end(
        n, hit, FR(gps_oa_close_text(&o, sse, "st\xffop", 10, 5, meta, sizeof meta - 1)));
    gps_oa_out_clear(&o);
    return rc;
}

static json_t *WARNINGS;

static int fc_an_close(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    gp_buf pre;
    gp_buf_init(&pre);
    gps_an_open(&o, &pre, 10, NULL, true);
    gp_buf_free(&pre);
    json_t *meta = json_deep_copy(META);
    arm(n);
    int rc = run_armed_end(n, hit,
                           FR(gps_an_close(&o, sse, "end_turn", NULL, 10, 5, meta)));
    gps_an_out_clear(&o);
    return rc;
}

static int fc_an_open(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_an_open(&o, sse, 10, WARNINGS, true)));
    gps_an_out_clear(&o);
    return rc;
}

/* The first delta of a block (its template made here). */
static int fc_an_text_first(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    gp_buf pre;
    gp_buf_init(&pre);
    gps_an_open(&o, &pre, 10, NULL, true);
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_an_text(&o, sse, "He said \"hi\"\n", 13)));
    gps_an_out_clear(&o);
    return rc;
}

/* Text after a tool call: the call's block closed, a text block opened. */
static int fc_an_text_after_call(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    gp_buf pre;
    gp_buf_init(&pre);
    gps_an_open(&o, &pre, 10, NULL, false);
    gps_an_call(&o, &pre, &CALLS, 0, true, "{}");
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_an_text(&o, sse, "Done.", 5)));
    gps_an_out_clear(&o);
    return rc;
}

static int fc_an_call_started(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    gp_buf pre;
    gp_buf_init(&pre);
    gps_an_open(&o, &pre, 10, NULL, true);
    gps_an_text(&o, &pre, "Let me look.", 12);
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_an_call(&o, sse, &CALLS, 0, true, "{\"city\":")));
    gps_an_out_clear(&o);
    return rc;
}

static int fc_an_call_piece(gp_buf *sse, size_t n, bool *hit)
{
    gps_an_out o;
    gps_an_out_init(&o, "msg_1", "claude");
    gp_buf pre;
    gp_buf_init(&pre);
    gps_an_open(&o, &pre, 10, NULL, false);
    gps_an_call(&o, &pre, &CALLS, 0, true, NULL);
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_an_call(&o, sse, &CALLS, 0, false, "\"Paris\"}")));
    gps_an_out_clear(&o);
    return rc;
}

static void resp_init(gps_resp_out *o)
{
    gps_resp_out_init(o, "m", NULL);
    snprintf(o->id, sizeof o->id, "resp_1");
    o->created = 1700000000;
}

static int fc_resp_open(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_resp_open(&o, sse)));
    gps_resp_out_clear(&o);
    return rc;
}

static int fc_resp_text(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    arm(n);
    int rc = run_armed_end(n, hit, FR(gps_resp_text(&o, sse, "He said \"hi\"\n", 13)));
    gps_resp_out_clear(&o);
    return rc;
}

/* A call after text: the message's done events, then the call's. */
static int fc_resp_call_started(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    gp_buf pre;
    gp_buf_init(&pre);
    gps_resp_text(&o, &pre, "Let me look.", 12);
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit,
                           FR(gps_resp_call(&o, sse, &CALLS, 0, true, "{\"city\":")));
    gps_resp_out_clear(&o);
    return rc;
}

static int fc_resp_call_piece(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    gp_buf pre;
    gp_buf_init(&pre);
    gps_resp_call(&o, &pre, &CALLS, 0, true, NULL);
    gp_buf_free(&pre);
    arm(n);
    int rc = run_armed_end(n, hit,
                           FR(gps_resp_call(&o, sse, &CALLS, 0, false, "\"Paris\"}")));
    gps_resp_out_clear(&o);
    return rc;
}

/* The end after text and a call: the message's and the call's done
 * events (the call's through jansson), then response.completed. */
static int fc_resp_close(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    gp_buf pre, fin;
    gp_buf_init(&pre);
    gp_buf_init(&fin);
    gps_resp_text(&o, &pre, "Let me look.", 12);
    gps_resp_call(&o, &pre, &CALLS, 0, true, NULL);
    gp_buf_free(&pre);
    static const char meta[] = "{\"agent_id\":\"a1\"}";
    arm(n);
    int rc = run_armed_end(n, hit,
                           FR(gps_resp_close_meta_text(&o, sse, &CALLS, "tool_calls", 10, 5,
                                                       meta, sizeof meta - 1, &fin)));
    if (rc < 0 && fin.len != 0)
        rc = -2; /* the stored response must not be kept either */
    gp_buf_free(&fin);
    gps_resp_out_clear(&o);
    return rc;
}

/* The end where the response object is not written by hand (an echoed
 * request field that could not be: echo_ok false) but as jansson's tree,
 * x_pool_meta loaded from its text: every string of it as sent, or -1
 * (jansson's loader alone drops a byte of a long string when its buffer
 * cannot grow, and succeeds). arm_beneath: the checked load's counting
 * allocator sees the failures. */
static int fc_resp_close_trees(gp_buf *sse, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    o.echo_ok = false;
    gp_buf pre, fin;
    gp_buf_init(&pre);
    gp_buf_init(&fin);
    gps_resp_text(&o, &pre, "Let me look.", 12);
    gp_buf_free(&pre);
    static const char meta[] = "{\"agent_id\":\"agent_of_a_long_name\",\"warnings\":"
                               "[\"tools were ignored by this model\"]}";
    arm_beneath(n);
    int rc = run_armed_end(n, hit,
                           FR(gps_resp_close_meta_text(&o, sse, NULL, "stop", 10, 5, meta,
                                                       sizeof meta - 1, &fin)));
    if (rc < 0 && fin.len != 0)
        rc = -2; /* the stored response must not be kept either */
    gp_buf_free(&fin);
    gps_resp_out_clear(&o);
    return rc;
}

/* The non-streaming body: gps_resp_whole makes the output items (the
 * text as one message, then the calls) and gps_resp_render writes them.
 * The items and the text are libc's allocations: the sweep counts those
 * too. gps_resp_whole fails whole: o keeps the output it had (an earlier
 * one here). */
static int fc_resp_whole(gp_buf *out, size_t n, bool *hit)
{
    gps_resp_out o;
    resp_init(&o);
    assert_int_equal(gps_resp_whole(&o, NULL, "old", 3), 0);
    arm_libc(n);
    int rc = gps_resp_whole(&o, &CALLS, "Let me look.", 12);
    if (rc == 0)
        rc = gps_resp_render(out, &o, &CALLS, "tool_calls", 10, 5);
    else if (o.n_items != 1 || o.items[0].is_call || o.text.len != 3 ||
             memcmp(o.text.data, "old", 3) != 0)
        rc = -2;
    *hit = disarm();
    gps_resp_out_clear(&o);
    return rc;
}

#define PREFIX "data: {\"earlier\":\"frame\"}\n\n"

/* Returns the runs that broke the rule; *dropped: of those, the runs that
 * returned 0 with other output (a frame dropped or changed silently). */
static int sweep_frame(const char *name, frame_case fc, int *dropped)
{
    gp_buf ref;
    gp_buf_init(&ref);
    bool hit;
    assert_int_equal(gp_buf_append(&ref, PREFIX, sizeof PREFIX - 1), 0);
    assert_int_equal(fc(&ref, 0, &hit), 0);
    normalize_ids(&ref);
    assert_true(ref.len > sizeof PREFIX - 1); /* the unhurt run wrote a frame */
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gp_buf got;
        gp_buf_init(&got);
        assert_int_equal(gp_buf_append(&got, PREFIX, sizeof PREFIX - 1), 0);
        int rc = fc(&got, n, &hit);
        normalize_ids(&got);
        if (rc < -1) {
            print_message("%s: allocation %zu failed: -1 with its state changed (a stored "
                          "response kept, output items not as they were)\n",
                          name, n);
            bad++;
        } else if (rc < 0 && (got.len != sizeof PREFIX - 1 || memcmp(got.data, PREFIX, got.len) != 0)) {
            print_message("%s: allocation %zu failed: -1 with part of a frame written:\n%s\n",
                          name, n, got.data);
            bad++;
        } else if (rc == 0 && (got.len != ref.len || memcmp(got.data, ref.data, ref.len) != 0)) {
            print_message("%s: allocation %zu failed: 0 with other output:\n%s\nwanted:\n%s\n",
                          name, n, got.data + sizeof PREFIX - 1, ref.data + sizeof PREFIX - 1);
            bad++;
            (*dropped)++;
        }
        gp_buf_free(&got);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", name, n - 1, bad);
    gp_buf_free(&ref);
    return bad;
}

static void test_stream_frames(void **st)
{
    (void)st;
    memset(&CALLS, 0, sizeof CALLS);
    calls_init();
    WARNINGS = json_pack("[s]", "tools were ignored");
    assert_non_null(WARNINGS);
    META = json_pack("{s:s,s:s,s:I,s:[s]}", "agent_id", "a1", "model", "m", "queue_ms",
                     (json_int_t)3, "warnings", "tools were ignored");
    assert_non_null(META);
    static const struct {
        const char *name;
        frame_case fc;
    } cases[] = {
        {"gps_oa_open", fc_oa_open},
        {"gps_oa_text (template)", fc_oa_text_tpl},
        {"gps_oa_text (json, chat)", fc_oa_text_slow_chat},
        {"gps_oa_text (json, completion)", fc_oa_text_slow_completion},
        {"gps_oa_call (started)", fc_oa_call_started},
        {"gps_oa_call (piece)", fc_oa_call_piece},
        {"gps_oa_close", fc_oa_close},
        {"gps_oa_close_text (trees)", fc_oa_close_text_trees},
        {"gps_oa_close_text (trees, long meta)", fc_oa_close_text_trees_long},
        {"gps_an_open", fc_an_open},
        {"gps_an_text (first delta)", fc_an_text_first},
        {"gps_an_text (after a call)", fc_an_text_after_call},
        {"gps_an_call (started)", fc_an_call_started},
        {"gps_an_call (piece)", fc_an_call_piece},
        {"gps_an_close", fc_an_close},
        {"gps_resp_open", fc_resp_open},
        {"gps_resp_text", fc_resp_text},
        {"gps_resp_call (started, after text)", fc_resp_call_started},
        {"gps_resp_call (piece)", fc_resp_call_piece},
        {"gps_resp_close_meta_text", fc_resp_close},
        {"gps_resp_close_meta_text (trees)", fc_resp_close_trees},
        {"gps_resp_whole + gps_resp_render", fc_resp_whole},
    };
    int bad = 0, dropped = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        bad += sweep_frame(cases[i].name, cases[i].fc, &dropped);
    print_message("stream frames: %d runs broke the rule, %d of them a silent 0\n", bad,
                  dropped);
    gps_tool_calls_free(&CALLS);
    json_decref(WARNINGS);
    json_decref(META);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* before arm swaps jansson's allocator (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_builders),
        cmocka_unit_test(test_stream_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

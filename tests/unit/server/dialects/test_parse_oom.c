/* Request parsers under allocation failure: a parse either fails (with a
 * message) or yields exactly what it yields with memory to spare; it never
 * "succeeds" with a message, a tool or a warning missing (the model would
 * answer another prompt than the client sent). A failure is told by its
 * code: GPS_PARSE_OOM, which the handlers refuse with 500 naming no field,
 * never -1 (a 400 blaming the client); and a body that is wrong returns -1,
 * never GPS_PARSE_OOM.
 *
 * jansson's allocator is replaced by one that fails the N-th allocation;
 * every parser runs on rich bodies for N = 1, 2, 3, ... until a run ends
 * without the failure being reached. A successful run's result, summed up
 * as JSON once the allocator is back, must equal the unhurt run's. libc's
 * malloc (strdup, gp_buf) is not hooked: those paths were fixed by reading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/api_tasks_priv.h"
#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/dialects/embeddings.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/resp_state.h"
#include "server/dialects/rformat.h"
#include "server/dialects/responses.h"

#include "fixture_oom.h"

/* ------------------------------------------------------------------ */
/* Results summed up as JSON (built with the allocator restored)       */
/* ------------------------------------------------------------------ */

static json_t *labels_json(const gps_job_spec *s)
{
    json_t *o = json_object();
    for (size_t i = 0; i < s->n_labels; i++)
        json_object_set_new(o, s->labels[i].key, json_string(s->labels[i].value));
    return o;
}

static json_t *fallback_json(const gps_job_spec *s)
{
    json_t *a = json_array();
    for (size_t i = 0; i < s->n_fallback; i++)
        json_array_append_new(a, json_string(s->fallback_models[i]));
    return a;
}

/* Every field a parser fills in a job spec. */
static json_t *spec_json(const gps_job_spec *s)
{
    json_t *j = json_pack(
        "{s:i,s:s?,s:s?,s:O?,s:O?,s:O?,s:O?,s:O?,s:I,s:f,s:f,s:I,s:O?,s:b,s:I,s:s?,s:i,s:s?,"
        "s:s?,s:s?,s:o,s:i,s:o,s:s?,s:b}",
        "kind", (int)s->kind, "model", s->model, "prompt", s->prompt, "messages", s->messages,
        "input", s->input, "tools", s->tools, "tool_choice", s->tool_choice, "response_format",
        s->response_format, "max_tokens", (json_int_t)s->max_tokens, "temperature",
        s->temperature, "top_p", s->top_p, "top_k", (json_int_t)s->top_k, "stop", s->stop,
        "has_seed", (int)s->has_seed, "seed", (json_int_t)s->seed, "user", s->user, "priority",
        (int)s->priority, "prefer_agent", s->prefer_agent, "session", s->session, "tenant_sub",
        s->tenant_sub, "labels", labels_json(s), "failover", (int)s->failover,
        "fallback_models", fallback_json(s), "api", s->api, "prompt_tokens_first",
        (int)s->prompt_tokens_first);
    assert_non_null(j);
    return j;
}

/* ------------------------------------------------------------------ */
/* One parser: parse (under the failing allocator), sum up, clear      */
/* ------------------------------------------------------------------ */

typedef struct parser {
    const char *name;
    /* 0 with *res set (the parse's output, summed up by the caller's
     * sum), or -1 / GPS_PARSE_OOM with msg and *param (NULL where the
     * dialect names no field). */
    int (*parse)(const json_t *body, void *res, char *msg, size_t msglen, const char **param);
    json_t *(*sum)(void *res);
    void (*clear)(void *res);
    size_t res_size;
} parser;

static int openai_chat_parse(const json_t *body, void *res, char *msg, size_t msglen,
                             const char **param)
{
    return gps_openai_parse(body, true, res, msg, msglen, param);
}

static int openai_completion_parse(const json_t *body, void *res, char *msg, size_t msglen,
                                   const char **param)
{
    return gps_openai_parse(body, false, res, msg, msglen, param);
}

static json_t *openai_sum(void *res)
{
    gps_openai_req *r = res;
    json_t *j = spec_json(&r->spec);
    json_object_set_new(j, "x_chat", json_boolean(r->chat));
    json_object_set_new(j, "x_stream", json_boolean(r->stream));
    json_object_set_new(j, "x_include_usage", json_boolean(r->include_usage));
    return j;
}

static void openai_clear(void *res)
{
    gps_job_spec_clear(&((gps_openai_req *)res)->spec);
}

/* The Anthropic handler's two steps: parse, then assemble (the system
 * message and, with tools, the OpenAI-form conversation). */
static int anthropic_run(const json_t *body, bool count_only, bool tools, void *res,
                         char *msg, size_t msglen, const char **param)
{
    gps_anthropic_req *r = res;
    *param = NULL; /* the handler names no field */
    int rc = gps_anthropic_parse(body, count_only, r, msg, msglen);
    if (rc < 0)
        return rc;
    rc = gps_anthropic_assemble(r, 1000000, tools, msg, msglen);
    if (rc < 0)
        gps_anthropic_req_clear(r);
    return rc;
}

static int anthropic_tools_parse(const json_t *body, void *res, char *msg, size_t msglen,
                                 const char **param)
{
    return anthropic_run(body, false, true, res, msg, msglen, param);
}

static int anthropic_text_parse(const json_t *body, void *res, char *msg, size_t msglen,
                                const char **param)
{
    return anthropic_run(body, false, false, res, msg, msglen, param);
}

static int anthropic_count_parse(const json_t *body, void *res, char *msg, size_t msglen,
                                 const char **param)
{
    return anthropic_run(body, true, false, res, msg, msglen, param);
}

static json_t *anthropic_sum(void *res)
{
    gps_anthropic_req *r = res;
    json_t *j = spec_json(&r->spec);
    json_t *x = json_pack("{s:b,s:b,s:s?,s:s?,s:O?,s:O?,s:O?,s:O?,s:O?,s:I}", "stream",
                          (int)r->stream, "count_only", (int)r->count_only, "system",
                          r->system, "tools_text", r->tools_text, "tools", r->tools,
                          "tool_choice", r->tool_choice, "tool_messages", r->tool_messages,
                          "stop_sequences", r->stop_sequences, "warnings", r->warnings,
                          "prompt_bytes", (json_int_t)r->prompt_bytes);
    assert_non_null(x);
    json_object_set_new(j, "x", x);
    return j;
}

static void anthropic_clear(void *res)
{
    gps_anthropic_req_clear(res);
}

static int resp_parse(const json_t *body, void *res, char *msg, size_t msglen,
                      const char **param)
{
    return gps_resp_parse(body, res, msg, msglen, param);
}

static json_t *resp_sum(void *res)
{
    gps_resp_req *r = res;
    json_t *j = spec_json(&r->spec);
    json_t *x = json_pack("{s:b,s:b,s:O?,s:O?,s:s?,s:O?,s:I}", "stream", (int)r->stream,
                          "store", (int)r->store, "echo", r->echo, "warnings", r->warnings,
                          "prev_id", r->prev_id, "refs", r->refs, "n_instr",
                          (json_int_t)r->n_instr);
    assert_non_null(x);
    json_object_set_new(j, "x", x);
    return j;
}

static void resp_clear(void *res)
{
    gps_resp_req_clear(res);
}

static int tasks_parse(const json_t *body, void *res, char *msg, size_t msglen,
                       const char **param)
{
    return gps_tasks_parse(body, res, msg, msglen, param);
}

static json_t *tasks_sum(void *res)
{
    return spec_json(res);
}

static void tasks_clear(void *res)
{
    gps_job_spec_clear(res);
}

static int embed_parse(const json_t *body, void *res, char *msg, size_t msglen,
                       const char **param)
{
    return gps_embed_parse(body, 0, res, msg, msglen, param);
}

static json_t *embed_sum(void *res)
{
    gps_embed_req *r = res;
    json_t *j = json_pack("{s:s?,s:O?,s:b,s:I,s:s?}", "model", r->model, "input", r->input,
                          "base64", (int)r->base64, "dimensions", (json_int_t)r->dimensions,
                          "user", r->user);
    assert_non_null(j);
    return j;
}

static void embed_clear(void *res)
{
    gps_embed_req_clear(res);
}

/* ------------------------------------------------------------------ */
/* The sweep                                                           */
/* ------------------------------------------------------------------ */

#define MAX_RES 4096 /* room for any parser's output struct */

/* A failure under the failing allocator: exactly GPS_PARSE_OOM, which the
 * handlers answer 500 INTERNAL without a param. false (printed) when not. */
static bool oom_refusal_ok(const char *what, size_t n, int rc, const char *msg,
                           const char *param)
{
    const char *code = NULL;
    int status = gps_parse_refusal(rc, &code);
    if (rc == GPS_PARSE_OOM && status == 500 && strcmp(code, "INTERNAL") == 0 && !param &&
        strcmp(msg, "out of memory") == 0)
        return true;
    print_message("%s: allocation %zu failed: rc %d (want GPS_PARSE_OOM %d), status %d %s, "
                  "param %s, \"%s\"\n",
                  what, n, rc, GPS_PARSE_OOM, status, code, param ? param : "(none)", msg);
    return false;
}

/* Runs p on body for N = 1, 2, ..., each run's failure armed by arm_fn:
 * arm (jansson's N-th allocation) or arm_beneath (libc's N-th, jansson's
 * among them through gp_json's counting allocator: what gp_json_dumps,
 * gp_json_dump_append and the checked load see). Returns the number of
 * runs whose outcome broke the rule (printed), 0 when every one kept it. */
static int sweep_with(const parser *p, const char *label, const char *text,
                      void (*arm_fn)(size_t))
{
    assert_true(p->res_size <= MAX_RES);
    json_t *body = J(text);
    _Alignas(max_align_t) unsigned char ref_res[MAX_RES], res[MAX_RES];
    char msg[512] = "";
    const char *param = NULL;
    if (p->parse(body, ref_res, msg, sizeof msg, &param) != 0)
        fail_msg("%s %s: the unhurt parse failed: %s", p->name, label, msg);
    json_t *ref = p->sum(ref_res);
    p->clear(ref_res);

    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        msg[0] = '\0';
        param = "(not set)";
        arm_fn(n);
        int rc = p->parse(body, res, msg, sizeof msg, &param);
        bool hit = disarm();
        if (rc == 0) {
            json_t *got = p->sum(res);
            p->clear(res);
            if (!json_equal(got, ref)) {
                print_message("%s %s: allocation %zu failed, the parse succeeded with other "
                              "content:\n",
                              p->name, label, n);
                print_diff("", got, ref);
                bad++;
            }
            json_decref(got);
        } else if (msg[0] == '\0') {
            print_message("%s %s: allocation %zu failed, the parse failed without a message\n",
                          p->name, label, n);
            bad++;
        } else if (!hit) {
            print_message("%s %s: run %zu failed (%s) with no allocation failed\n", p->name,
                          label, n, msg);
            bad++;
        } else {
            char what[128];
            snprintf(what, sizeof what, "%s %s", p->name, label);
            bad += !oom_refusal_ok(what, n, rc, msg, param);
        }
        if (!hit)
            break;
    }
    print_message("%s %s: %zu allocations swept, %d broke the rule\n", p->name, label, n - 1,
                  bad);
    json_decref(ref);
    json_decref(body);
    return bad;
}

static int sweep(const parser *p, const char *label, const char *text)
{
    return sweep_with(p, label, text, arm);
}

static const parser OPENAI_CHAT = {"openai chat", openai_chat_parse, openai_sum, openai_clear,
                                   sizeof(gps_openai_req)};
static const parser OPENAI_COMPLETION = {"openai completion", openai_completion_parse,
                                         openai_sum, openai_clear, sizeof(gps_openai_req)};
static const parser ANTHROPIC_TOOLS = {"anthropic (tools taken)", anthropic_tools_parse,
                                       anthropic_sum, anthropic_clear,
                                       sizeof(gps_anthropic_req)};
static const parser ANTHROPIC_TEXT = {"anthropic (tools as text)", anthropic_text_parse,
                                      anthropic_sum, anthropic_clear,
                                      sizeof(gps_anthropic_req)};
static const parser ANTHROPIC_COUNT = {"anthropic count_tokens", anthropic_count_parse,
                                       anthropic_sum, anthropic_clear,
                                       sizeof(gps_anthropic_req)};
static const parser RESPONSES = {"responses", resp_parse, resp_sum, resp_clear,
                                 sizeof(gps_resp_req)};
static const parser TASKS = {"tasks", tasks_parse, tasks_sum, tasks_clear,
                             sizeof(gps_job_spec)};
static const parser EMBED = {"embeddings", embed_parse, embed_sum, embed_clear,
                             sizeof(gps_embed_req)};

/* The pool extension, the same in every dialect. */
#define XPO                                                                                    \
    "\"x_pool_options\":{\"priority\":\"batch\",\"prefer_agent\":\"a1\",\"session\":\"s1\","  \
    "\"tenant\":\"t1\",\"labels\":{\"gpu\":\"h100\",\"zone\":\"eu\"},\"failover\":\"restart\"," \
    "\"fallback_models\":[\"m2\",\"m3\"]}"

static void test_openai(void **st)
{
    (void)st;
    int bad = 0;
    bad += sweep(&OPENAI_CHAT, "rich chat",
                 "{\"model\":\"m\",\"messages\":["
                 "{\"role\":\"system\",\"content\":\"Be brief.\"},"
                 "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"dev a\"},"
                 "{\"type\":\"text\",\"text\":\"dev b\"}]},"
                 "{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"},"
                 "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
                 "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"call_0\"},"
                 "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Sunny.\"}],"
                 "\"tool_calls\":[{\"id\":\"call_2\",\"type\":\"function\",\"function\":"
                 "{\"name\":\"x\",\"arguments\":\"{}\"}}]},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"thanks\"}]}],"
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                 "\"string\"}}}}}],"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                 "\"stop\":[\"END\",\"STOP\"],\"user\":\"u-1\",\"seed\":42,\"temperature\":0.3,"
                 "\"top_p\":0.9,\"top_k\":40,\"max_tokens\":100,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true},\"presence_penalty\":0.5,"
                 "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                 "\"out\",\"description\":\"d\",\"strict\":true,\"schema\":{\"type\":\"object\","
                 "\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}}}," XPO "}");
    bad += sweep(&OPENAI_CHAT, "plain chat",
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                 "\"stop\":\"\\n\",\"response_format\":{\"type\":\"json_object\"}}");
    bad += sweep(&OPENAI_COMPLETION, "completion",
                 "{\"model\":\"m\",\"prompt\":[\"Once upon a time\"],\"stop\":\"\\n\","
                 "\"user\":\"u\",\"max_tokens\":5,\"echo\":false," XPO "}");
    assert_int_equal(bad, 0);
}

static void test_anthropic(void **st)
{
    (void)st;
    static const char *const rich =
        "{\"model\":\"claude\",\"max_tokens\":300,"
        "\"system\":[{\"type\":\"text\",\"text\":\"You are terse.\"},"
        "{\"type\":\"text\",\"text\":\"Answer in French.\"}],"
        "\"messages\":["
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"And Lyon.\"}]},"
        "{\"role\":\"system\",\"content\":\"Mid-conversation rule.\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\"},"
        "{\"type\":\"text\",\"text\":\"Let me look.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
        "\"input\":{\"city\":\"Paris\"}},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"get_weather\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":\"sunny\"},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\","
        "\"is_error\":true,\"content\":[{\"type\":\"text\",\"text\":\"no such city\"}]},"
        "{\"type\":\"text\",\"text\":\"Thanks!\"}]},"
        "{\"role\":\"assistant\",\"content\":\"You are welcome.\"},"
        "{\"role\":\"user\",\"content\":\"Bye.\"}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather now\",\"strict\":true,"
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}},"
        "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\"},"
        "\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],\"temperature\":0.2,\"top_p\":0.8,"
        "\"top_k\":10,\"metadata\":{\"user_id\":\"user-7\"},\"stream\":true,"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},\"foo\":1,"
        "\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\","
        "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}},"
        XPO "}";
    int bad = 0;
    bad += sweep(&ANTHROPIC_TOOLS, "rich", rich);
    bad += sweep(&ANTHROPIC_TEXT, "rich", rich);
    bad += sweep(&ANTHROPIC_COUNT, "rich", rich);
    bad += sweep(&ANTHROPIC_TEXT, "plain",
                 "{\"model\":\"claude\",\"max_tokens\":10,\"system\":\"Be kind.\","
                 "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                 "\"output_format\":{\"type\":\"json_schema\",\"schema\":{}}}");
    assert_int_equal(bad, 0);
}

/* A tool_use block's input is dumped, as the prompt's text (tools not
 * taken) and as an OpenAI tool call's arguments (tools taken): whole, or
 * out of memory. jansson 2.14's json_dumps can leave a key out and still
 * succeed (the call would read as made with other arguments), so the
 * sweep counts libc's allocations, jansson's among them (arm_beneath),
 * with keys longer than its dump buffer's first growth. */
static void test_anthropic_tool_input(void **st)
{
    (void)st;
    static const char *const body =
        "{\"model\":\"claude\",\"max_tokens\":30,\"messages\":["
        "{\"role\":\"user\",\"content\":\"Send it.\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\","
        "\"name\":\"send_letter\",\"input\":{\"home_address_for_mail\":\"12 Long Street\","
        "\"recipient_full_name\":\"Ada\",\"postage_class_of_letter\":\"first\"}},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"noop\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
        "\"toolu_1\",\"content\":\"sent\"}]}],"
        "\"tools\":[{\"name\":\"send_letter\",\"input_schema\":{\"type\":\"object\"}},"
        "{\"name\":\"noop\",\"input_schema\":{\"type\":\"object\"}}]}";
    int bad = sweep_with(&ANTHROPIC_TOOLS, "tool_use input", body, arm_beneath);
    bad += sweep_with(&ANTHROPIC_TEXT, "tool_use input", body, arm_beneath);
    assert_int_equal(bad, 0);
}

/* A structured-output schema is dumped for the engine's checker: the
 * check must be of the client's schema or out of memory (500), never a
 * 400 naming a keyword the client did not send, nor a pass for one it did
 * (json_dumps can leave a key out and succeed: arm_beneath, as above). */
static int sweep_rformat(const char *label, const char *text)
{
    json_t *rf = J(text);
    char want_msg[512] = "", msg[512];
    json_t *want = NULL, *got;
    int want_rc = gps_rformat_chat(rf, &want, want_msg, sizeof want_msg);
    assert_true(want_rc == 0 || want_rc == -1);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        msg[0] = '\0';
        got = NULL;
        arm_beneath(n);
        int rc = gps_rformat_chat(rf, &got, msg, sizeof msg);
        bool hit = disarm();
        if (rc == GPS_PARSE_OOM && hit) {
            bad += !oom_refusal_ok(label, n, rc, msg, NULL);
        } else if (rc != want_rc || (rc == 0 && !json_equal(got, want)) ||
                   (rc < 0 && strcmp(msg, want_msg) != 0)) {
            print_message("%s: allocation %zu failed: rc %d \"%s\" (unhurt: %d \"%s\")\n", label,
                          n, rc, msg, want_rc, want_msg);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", label, n - 1, bad);
    json_decref(want);
    json_decref(rf);
    return bad;
}

/* Keys that cross the dump buffer's first growths (16, then 32 bytes):
 * jansson's dump leaves such a key out ("") when that growth fails. */
static void test_rformat_schema(void **st)
{
    (void)st;
    int bad = sweep_rformat(
        "schema refused",
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"out\",\"schema\":"
        "{\"type\":\"object\",\"patternProperties\":{},\"properties\":"
        "{\"home_address_for_mail\":{\"type\":\"string\"}}}}}");
    bad += sweep_rformat(
        "schema taken",
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"out\",\"strict\":true,"
        "\"schema\":{\"type\":\"object\",\"additionalProperties\":false,\"properties\":"
        "{\"home_address_for_mail\":{\"type\":\"string\",\"description\":"
        "\"where the letter goes\"}},\"required\":[\"home_address_for_mail\"]}}}");
    assert_int_equal(bad, 0);
}

static void test_responses(void **st)
{
    (void)st;
    int bad = 0;
    bad += sweep(&RESPONSES, "items",
                 "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
                 "{\"role\":\"developer\",\"content\":\"Developer rule.\"},"
                 "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
                 "\"text\":\"Weather in \"},{\"type\":\"input_text\",\"text\":\"Paris?\"}]},"
                 "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
                 "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
                 "\"output_text\",\"text\":\"Let me look.\"}]},"
                 "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get_weather\","
                 "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
                 "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"get_time\","
                 "\"arguments\":\"{}\"},"
                 "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"sunny\"},"
                 "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":"
                 "\"input_text\",\"text\":\"noon\"}]},"
                 "{\"type\":\"function_call\",\"call_id\":\"c3\",\"name\":\"get_time\","
                 "\"arguments\":\"{}\"},"
                 "{\"type\":\"item_reference\",\"id\":\"msg_1\"},"
                 "{\"role\":\"user\",\"content\":\"Thanks.\"}],"
                 "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":"
                 "\"Weather now\",\"strict\":false,\"parameters\":{\"type\":\"object\","
                 "\"properties\":{\"city\":{\"type\":\"string\"}}}},"
                 "{\"type\":\"web_search\"},"
                 "{\"type\":\"function\",\"name\":\"get_time\"}],"
                 "\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"},"
                 "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"out\",\"schema\":"
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}},"
                 "\"metadata\":{\"k\":\"v\"},\"user\":\"u-1\",\"previous_response_id\":"
                 "\"resp_1\",\"max_output_tokens\":50,\"temperature\":0.4,\"top_p\":0.7,"
                 "\"parallel_tool_calls\":false,\"store\":false,\"stream\":true," XPO "}");
    bad += sweep(&RESPONSES, "string input",
                 "{\"model\":\"m\",\"input\":\"Hi\",\"instructions\":\"Be kind.\","
                 "\"tool_choice\":\"auto\",\"text\":{\"format\":{\"type\":\"json_object\"}}}");
    assert_int_equal(bad, 0);
}

static void test_tasks(void **st)
{
    (void)st;
    int bad = 0;
    bad += sweep(&TASKS, "messages",
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                 "{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":"
                 "\"Hello\"},{\"role\":\"user\",\"content\":\"Bye\"}],\"max_tokens\":20,"
                 "\"seed\":7,\"stop\":[\"END\"],\"top_k\":5,\"priority\":\"batch\","
                 "\"session_id\":\"sess\"," XPO "}");
    bad += sweep(&TASKS, "prompt",
                 "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":20,\"seed\":7,"
                 "\"stop\":\"\\n\"}");
    assert_int_equal(bad, 0);
}

static void test_embeddings(void **st)
{
    (void)st;
    int bad = 0;
    bad += sweep(&EMBED, "mixed inputs",
                 "{\"model\":\"e\",\"input\":[\"one\",\"two\",[1,2,3]],\"user\":\"u\","
                 "\"dimensions\":8,\"encoding_format\":\"base64\"}");
    bad += sweep(&EMBED, "string", "{\"model\":\"e\",\"input\":\"one\"}");
    bad += sweep(&EMBED, "tokens", "{\"model\":\"e\",\"input\":[5,6,7]}");
    assert_int_equal(bad, 0);
}

/* The embeddings reply is built from the agent's vectors: under the same
 * sweep it is either refused as out of memory or whole (a number missing
 * would hand the client a shorter vector). */
static int sweep_embed_reply(const char *text)
{
    json_t *body = J(text);
    gps_embed_req req;
    char msg[512] = "";
    const char *param;
    assert_int_equal(gps_embed_parse(body, 0, &req, msg, sizeof msg, &param), 0);
    json_t *vecs = json_array();
    for (size_t i = 0; i < json_array_size(req.input); i++) {
        float v[16];
        for (int k = 0; k < 16; k++)
            v[k] = (float)(i * 16 + k) / 7.0f;
        char *b64 = gp_base64_encode(v, sizeof v);
        assert_non_null(b64);
        json_array_append_new(vecs, json_string(b64));
        free(b64);
    }
    json_t *ref;
    assert_int_equal(gps_embed_response(&req, "e", vecs, 9, &ref, msg, sizeof msg, &param), 0);
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        msg[0] = '\0';
        json_t *got;
        arm(n);
        int rc = gps_embed_response(&req, "e", vecs, 9, &got, msg, sizeof msg, &param);
        bool hit = disarm();
        if (rc == 0 && !json_equal(got, ref)) {
            print_message("embeddings reply: allocation %zu failed: a reply unlike the unhurt "
                          "one\n", n);
            bad++;
        } else if (rc != 0) {
            bad += !oom_refusal_ok("embeddings reply", n, rc, msg, param);
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("embeddings reply: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    json_decref(ref);
    json_decref(vecs);
    gps_embed_req_clear(&req);
    json_decref(body);
    return bad;
}

static void test_embeddings_reply(void **st)
{
    (void)st;
    int bad = sweep_embed_reply("{\"model\":\"e\",\"input\":[\"one\",\"two\",\"three\"]}");
    bad += sweep_embed_reply("{\"model\":\"e\",\"input\":[\"one\",\"two\"],"
                             "\"encoding_format\":\"base64\"}");
    assert_int_equal(bad, 0);
}

/* A reply builder under the sweep: NULL (the handler answers 500) or
 * exactly the unhurt reply; never one with a part left out. */

/* Stop sequences that run out of memory are the server's fault: no param
 * (the handler answers 500 without naming a field), as every other
 * out-of-memory refusal. */
static void test_sampling_param(void **st)
{
    (void)st;
    json_t *body = J("{\"temperature\":0.5,\"stop\":[\"END\",\"STOP\"]}");
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gps_job_spec s;
        memset(&s, 0, sizeof s);
        char msg[256] = "";
        const char *param = NULL;
        arm(n);
        int rc = gps_sampling_parse(body, &s, 2, 4, msg, sizeof msg, &param);
        bool hit = disarm();
        if (rc < 0)
            bad += !oom_refusal_ok("sampling", n, rc, msg, param);
        json_decref(s.stop);
        if (!hit)
            break;
    }
    print_message("sampling: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    json_decref(body);
    assert_int_equal(bad, 0);
}

/* What the handlers answer for a failed parse: the client's fault (400)
 * unless the server ran out of memory (500, retryable). */
static void test_refusal_status(void **st)
{
    (void)st;
    const char *code = NULL;
    assert_int_equal(gps_parse_refusal(GPS_PARSE_OOM, &code), 500);
    assert_string_equal(code, "INTERNAL");
    assert_int_equal(gps_parse_refusal(-1, &code), 400);
    assert_string_equal(code, "INVALID_REQUEST");
    /* The message plays no part: a client's text that reads "out of
     * memory" is still the client's. */
    char msg[64];
    assert_int_equal(gps_parse_oom(msg, sizeof msg), GPS_PARSE_OOM);
    assert_string_equal(msg, "out of memory");
}

/* Bodies that are wrong, parsed with memory to spare: -1 (400), never
 * GPS_PARSE_OOM, each naming the field its dialect names. Many go through
 * a helper whose failure is passed up (content parts, response formats,
 * stop lists, pool options), where a wrong code would slip through. */
typedef struct invalid_case {
    const parser *p;
    const char *body;
    const char *param; /* the field named, NULL for none */
} invalid_case;

static void test_invalid_is_not_oom(void **st)
{
    (void)st;
    static const invalid_case cases[] = {
        {&OPENAI_CHAT, "[]", NULL},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                       "[{\"type\":\"image_url\"}]}]}", "messages"},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\","
                       "\"tool_calls\":[{\"id\":1}]}]}", "messages"},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"tool_call_id\":"
                       "\"c\",\"content\":7}]}", "messages"},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"stop\":[\"\"]}", "stop"},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                       "\"o\",\"schema\":{\"type\":\"object\",\"patternProperties\":{}}}}}",
         "response_format"},
        {&OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"x_pool_options\":{\"labels\":{\"k\":1}}}", "x_pool_options.labels"},
        {&OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"tools\":[]}", "tools"},
        {&ANTHROPIC_TEXT, "{\"model\":\"c\",\"max_tokens\":5,\"messages\":[{\"role\":"
                          "\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":"
                          "[{\"type\":\"image\"}]}]}]}", NULL},
        {&ANTHROPIC_TEXT, "{\"model\":\"c\",\"max_tokens\":5,\"messages\":[{\"role\":"
                          "\"user\",\"content\":\"x\"}],\"output_format\":{\"type\":"
                          "\"json_schema\",\"schema\":{\"type\":\"object\","
                          "\"patternProperties\":{}}}}", NULL},
        {&ANTHROPIC_COUNT, "{\"model\":\"c\",\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"x\"}],\"x_pool_options\":{\"priority\":\"now\"}}", NULL},
        {&RESPONSES, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
                     "\"input_image\"}]}]}", "input"},
        {&RESPONSES, "{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\","
                     "\"call_id\":\"c\",\"output\":7}]}", "input"},
        {&RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":"
                     "\"xml\"}}}", "text.format"},
        {&RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}",
         "tools"},
        {&TASKS, "{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":5,\"stop\":7}", "stop"},
        {&TASKS, "{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":5,\"x_pool_options\":"
                 "{\"fallback_models\":[\"\"]}}", "x_pool_options.fallback_models"},
        {&EMBED, "{\"model\":\"e\",\"input\":[\"a\",\"\"]}", "input"},
        {&EMBED, "{\"model\":\"e\",\"input\":[1,-2]}", "input"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const invalid_case *c = &cases[i];
        json_t *body = J(c->body);
        _Alignas(max_align_t) unsigned char res[MAX_RES];
        char msg[512] = "";
        const char *param = "(not set)";
        int rc = c->p->parse(body, res, msg, sizeof msg, &param);
        const char *code = NULL;
        int status = rc < 0 ? gps_parse_refusal(rc, &code) : 0;
        bool param_ok = c->param ? param && strcmp(param, c->param) == 0 : !param;
        if (rc != -1 || status != 400 || !msg[0] || !param_ok) {
            print_message("%s case %zu: rc %d status %d param %s \"%s\" (want -1, 400, %s)\n",
                          c->p->name, i, rc, status, param ? param : "(none)", msg,
                          c->param ? c->param : "(none)");
            bad++;
        }
        if (rc == 0)
            c->p->clear(res);
        json_decref(body);
    }
    assert_int_equal(bad, 0);
}

/* The X-Pool-Options header joins the body before any parser: out of
 * memory there is GPS_PARSE_OOM too (500), never a 400 for the header.
 * Swept with arm_beneath: the header is read by gp_json_load_checked,
 * which sees allocation failures through gp_json's counting allocator. */
static void test_merge_header(void **st)
{
    (void)st;
    int bad = 0;
    size_t n;
    /* Keys longer than jansson's first token buffer (a byte dropped there
     * would go unnoticed by jansson). */
#define HEADER "{\"session\":\"session_of_many_bytes\",\"labels\":{\"a_long_label_key\":\"b\"}}"
    json_t *want_set = J("{\"model\":\"m\",\"x_pool_options\":" HEADER "}");
    /* Without x_pool_options in the body the header's object is set into
     * it (an allocation that can fail; jansson's update_missing, used when
     * the body has one, drops a failed set without telling). */
    for (n = 1;; n++) {
        json_t *body = J("{\"model\":\"m\"}");
        char msg[256] = "";
        arm_beneath(n);
        int rc = gps_pool_options_merge_header(body, HEADER, msg, sizeof msg);
        bool hit = disarm();
        /* (jansson 2.14 alone words most of its allocation failures as a
         * syntax error: the header refused as not an object, 400) */
        if (rc == 0 && !json_equal(body, want_set)) {
            print_message("merge header, run %zu: the header's object changed\n", n);
            print_diff("body", body, want_set);
            bad++;
        } else if (rc != 0) {
            bad += !oom_refusal_ok("merge header", n, rc, msg, NULL);
        }
        json_decref(body);
        if (!hit)
            break;
    }
    print_message("merge header: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    /* With x_pool_options in the body the header's keys join it: every one
     * of them, or a refusal (a label constraint lost would let the job run
     * where the client forbade it). */
    json_t *want = J("{\"model\":\"m\",\"x_pool_options\":{\"prefer_agent\":\"x\","
                     "\"session\":\"session_of_many_bytes\",\"labels\":{\"a_long_label_key\":"
                     "\"b\"}}}");
    for (n = 1;; n++) {
        json_t *body = J("{\"model\":\"m\",\"x_pool_options\":{\"prefer_agent\":\"x\"}}");
        char msg[256] = "";
        arm_beneath(n);
        int rc = gps_pool_options_merge_header(body, HEADER, msg, sizeof msg);
        bool hit = disarm();
        if (rc == 0 && !json_equal(body, want)) {
            print_message("merge into x_pool_options, run %zu: a key left out or changed\n", n);
            print_diff("body", body, want);
            bad++;
        } else if (rc != 0) {
            bad += !oom_refusal_ok("merge into x_pool_options", n, rc, msg, NULL);
        }
        json_decref(body);
        if (!hit)
            break;
    }
    json_decref(want);
    json_decref(want_set);
#undef HEADER
    json_t *body = J("{\"model\":\"m\"}");
    char msg[256] = "";
    assert_int_equal(gps_pool_options_merge_header(body, "[1]", msg, sizeof msg), -1);
    json_decref(body);
    assert_int_equal(bad, 0);
}

/* Stored state spliced into a Responses request: out of memory is
 * GPS_PARSE_OOM without a param; an item not found is -1 naming input. */
static void test_resp_splice(void **st)
{
    (void)st;
    json_t *body = J("{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
                     "{\"type\":\"item_reference\",\"id\":\"fc_1\"},"
                     "{\"role\":\"user\",\"content\":\"And now?\"}],"
                     "\"previous_response_id\":\"resp_1\"}");
    json_t *prev = J("[{\"role\":\"user\",\"content\":\"Hi\"},"
                     "{\"role\":\"assistant\",\"content\":\"Hello\"}]");
    json_t *items = J("{\"fc_1\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                      "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                      "\"arguments\":\"{}\"}}]}}");
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        gps_resp_req r;
        char msg[512] = "";
        const char *param = "(not set)";
        assert_int_equal(gps_resp_parse(body, &r, msg, sizeof msg, &param), 0);
        arm(n);
        int rc = gps_resp_splice(&r, prev, items, msg, sizeof msg, &param);
        bool hit = disarm();
        if (rc != 0)
            bad += !oom_refusal_ok("splice", n, rc, msg, param);
        gps_resp_req_clear(&r);
        if (!hit)
            break;
    }
    print_message("splice: %zu allocations swept, %d broke the rule\n", n - 1, bad);
    gps_resp_req r;
    char msg[512] = "";
    const char *param = NULL;
    assert_int_equal(gps_resp_parse(body, &r, msg, sizeof msg, &param), 0);
    json_t *none = J("{}");
    assert_int_equal(gps_resp_splice(&r, prev, none, msg, sizeof msg, &param), -1);
    assert_string_equal(param, "input");
    gps_resp_req_clear(&r);
    json_decref(none);
    json_decref(items);
    json_decref(prev);
    json_decref(body);
    assert_int_equal(bad, 0);
}

/* A stored response's rows, loaded: the tree the text says, or -2 (the
 * request's 500) when memory ran out; never a previous response "not
 * found" (400), an item left out, nor a long string with a byte dropped
 * (jansson 2.14's loader can, and succeed: arm_beneath, so that the
 * checked load's counting allocator sees the failures). */
typedef int (*stored_load)(const gps_store_cells *res, json_t **out);

static int sweep_stored(const char *label, stored_load load, const gps_store_cells *res,
                        int want_rc)
{
    json_t *want = NULL, *got;
    assert_int_equal(load(res, &want), want_rc);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        got = NULL;
        arm_beneath(n);
        int rc = load(res, &got);
        bool hit = disarm();
        if (rc == want_rc && json_equal(got, want) == (want != NULL)) {
            /* whole */
        } else if (rc == -2 && hit && !got) {
            /* out of memory: the request's 500 */
        } else {
            print_message("%s: allocation %zu failed: rc %d (unhurt %d)%s\n", label, n, rc,
                          want_rc, rc == want_rc ? ", another tree" : "");
            if (got && want)
                print_diff("", got, want);
            bad++;
        }
        json_decref(got);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", label, n - 1, bad);
    json_decref(want);
    return bad;
}

static void test_resp_stored(void **st)
{
    (void)st;
    /* Strings past the loader's first token buffer (16 bytes). */
    static const char *const prev[] = {
        "{\"id\":\"resp_1\"}",
        "[{\"role\":\"user\",\"content\":\"What is the weather in Paris today?\"},"
        "{\"role\":\"assistant\",\"content\":\"Sunny, with a light breeze.\"}]"};
    static const char *const items[] = {
        "fc_1", "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
                "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                "\"arguments\":\"{\\\"home_address_for_mail\\\":\\\"Paris\\\"}\"}}]}",
        "msg_1", "{\"role\":\"assistant\",\"content\":\"Let me look that up for you.\"}"};
    static const char *const object[] = {
        "{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[{\"type\":\"message\","
        "\"content\":[{\"type\":\"output_text\",\"text\":\"Sunny, with a light breeze.\"}]}]}"};
    gps_store_cells p = {.nrows = 1, .ncols = 2, .cell = prev};
    gps_store_cells it = {.nrows = 2, .ncols = 2, .cell = items};
    gps_store_cells ob = {.nrows = 1, .ncols = 1, .cell = object};
    int bad = sweep_stored("previous response", gps_resp_state_prev_load, &p, 0);
    bad += sweep_stored("stored items", gps_resp_state_items_load, &it, 0);
    bad += sweep_stored("stored object (GET)", gps_resp_state_object_load, &ob, 0);
    /* not found: no row, a row without an array (1), GET's row gone */
    gps_store_cells none = {.nrows = 0, .ncols = 2, .cell = prev};
    static const char *const not_array[] = {"{}", "{\"a\":1}"};
    gps_store_cells na = {.nrows = 1, .ncols = 2, .cell = not_array};
    json_t *j = NULL;
    assert_int_equal(gps_resp_state_prev_load(&none, &j), 1);
    assert_null(j);
    assert_int_equal(gps_resp_state_prev_load(&na, &j), 1);
    assert_null(j);
    gps_store_cells ob_none = {.nrows = 0, .ncols = 1, .cell = object};
    assert_int_equal(gps_resp_state_object_load(&ob_none, &j), 1);
    /* damaged in the store (not JSON): GET's 500, told apart */
    static const char *const damaged[] = {"{\"id\":"};
    gps_store_cells dm = {.nrows = 1, .ncols = 1, .cell = damaged};
    assert_int_equal(gps_resp_state_object_load(&dm, &j), -1);
    assert_null(j);
    assert_int_equal(bad, 0);
}

int main(void)
{
    gp_json_init(); /* before arm swaps jansson's allocator (gp_json.h) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai),           cmocka_unit_test(test_anthropic),
        cmocka_unit_test(test_responses),        cmocka_unit_test(test_tasks),
        cmocka_unit_test(test_embeddings),       cmocka_unit_test(test_embeddings_reply),
        cmocka_unit_test(test_sampling_param),   cmocka_unit_test(test_refusal_status),
        cmocka_unit_test(test_invalid_is_not_oom), cmocka_unit_test(test_merge_header),
        cmocka_unit_test(test_resp_splice),     cmocka_unit_test(test_anthropic_tool_input),
        cmocka_unit_test(test_rformat_schema),   cmocka_unit_test(test_resp_stored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

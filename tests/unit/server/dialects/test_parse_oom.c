/* Request parsers under allocation failure: a parse either fails (with a
 * message) or yields exactly what it yields with memory to spare; it never
 * "succeeds" with a message, a tool or a warning missing (the model would
 * answer another prompt than the client sent).
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

#include "server/dialects/anthropic_sse.h"
#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/api_tasks_priv.h"
#include "common/gp_util.h"
#include "server/dialects/embeddings.h"
#include "server/dialects/openai_render.h"
#include "server/dialects/reqcheck.h"
#include "server/dialects/responses.h"

/* ------------------------------------------------------------------ */
/* The failing allocator                                               */
/* ------------------------------------------------------------------ */

static size_t countdown; /* 0: never fail; else fail when it reaches 0 */
static bool injected;    /* the failure was handed out */

static void *failing_malloc(size_t n)
{
    if (countdown && --countdown == 0) {
        injected = true;
        return NULL;
    }
    return malloc(n);
}

static void arm(size_t n)
{
    countdown = n;
    injected = false;
    json_set_alloc_funcs(failing_malloc, free);
}

/* Back to libc's allocator (what the rest of the run uses). Returns
 * whether the failure was reached. */
static bool disarm(void)
{
    json_set_alloc_funcs(malloc, free);
    countdown = 0;
    return injected;
}

static json_t *J(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s (%s)", e.text, s);
    return j;
}

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
     * sum), or -1 with msg. */
    int (*parse)(const json_t *body, void *res, char *msg, size_t msglen);
    json_t *(*sum)(void *res);
    void (*clear)(void *res);
    size_t res_size;
} parser;

static int openai_chat_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    const char *param;
    return gps_openai_parse(body, true, res, msg, msglen, &param);
}

static int openai_completion_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    const char *param;
    return gps_openai_parse(body, false, res, msg, msglen, &param);
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
                         char *msg, size_t msglen)
{
    gps_anthropic_req *r = res;
    if (gps_anthropic_parse(body, count_only, r, msg, msglen) < 0)
        return -1;
    if (gps_anthropic_assemble(r, 1000000, tools, msg, msglen) < 0) {
        gps_anthropic_req_clear(r);
        return -1;
    }
    return 0;
}

static int anthropic_tools_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    return anthropic_run(body, false, true, res, msg, msglen);
}

static int anthropic_text_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    return anthropic_run(body, false, false, res, msg, msglen);
}

static int anthropic_count_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    return anthropic_run(body, true, false, res, msg, msglen);
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

static int resp_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    const char *param;
    return gps_resp_parse(body, res, msg, msglen, &param);
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

static int tasks_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    const char *param;
    return gps_tasks_parse(body, res, msg, msglen, &param);
}

static json_t *tasks_sum(void *res)
{
    return spec_json(res);
}

static void tasks_clear(void *res)
{
    gps_job_spec_clear(res);
}

static int embed_parse(const json_t *body, void *res, char *msg, size_t msglen)
{
    const char *param;
    return gps_embed_parse(body, 0, res, msg, msglen, &param);
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

/* The fields where got and want differ (objects: by key, to any depth). */
static void print_diff(const char *path, const json_t *got, const json_t *want)
{
    if (json_is_object(got) && json_is_object(want)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (!json_equal(json_object_get(got, k), v))
                print_diff(sub, json_object_get(got, k), v);
        }
        return;
    }
    char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
    char *w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
    print_message("  %s: got %.300s\n  %*s want %.300s\n", path, g ? g : "(nothing)",
                  (int)strlen(path), "", w ? w : "(nothing)");
    free(g);
    free(w);
}

#define MAX_RES 4096 /* room for any parser's output struct */

/* Runs p on body for N = 1, 2, ... Returns the number of runs whose
 * outcome broke the rule (printed), 0 when every one kept it. */
static int sweep(const parser *p, const char *label, const char *text)
{
    assert_true(p->res_size <= MAX_RES);
    json_t *body = J(text);
    _Alignas(max_align_t) unsigned char ref_res[MAX_RES], res[MAX_RES];
    char msg[512] = "";
    if (p->parse(body, ref_res, msg, sizeof msg) != 0)
        fail_msg("%s %s: the unhurt parse failed: %s", p->name, label, msg);
    json_t *ref = p->sum(ref_res);
    p->clear(ref_res);

    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        msg[0] = '\0';
        arm(n);
        int rc = p->parse(body, res, msg, sizeof msg);
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
    json_t *ref = gps_embed_response(&req, "e", vecs, 9, msg, sizeof msg, &param);
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        msg[0] = '\0';
        arm(n);
        json_t *got = gps_embed_response(&req, "e", vecs, 9, msg, sizeof msg, &param);
        bool hit = disarm();
        if (got ? !json_equal(got, ref) : strcmp(msg, "out of memory") != 0 || param) {
            print_message("embeddings reply: allocation %zu failed: %s\n", n,
                          got ? "a reply unlike the unhurt one" : msg);
            bad++;
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
typedef json_t *(*builder)(void);

static int sweep_builder(const char *name, builder b)
{
    json_t *ref = b();
    assert_non_null(ref);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        arm(n);
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
            print_message("%s: allocation %zu failed: -1 with the stored response kept\n", name,
                          n);
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
        if (rc < 0 && (strcmp(msg, "out of memory") != 0 || param)) {
            print_message("sampling: allocation %zu failed: \"%s\" param %s\n", n, msg,
                          param ? param : "(none)");
            bad++;
        }
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
    assert_int_equal(gps_parse_refusal("out of memory", &code), 500);
    assert_string_equal(code, "INTERNAL");
    assert_int_equal(gps_parse_refusal("'messages' must be an array", &code), 400);
    assert_string_equal(code, "INVALID_REQUEST");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai),    cmocka_unit_test(test_anthropic),
        cmocka_unit_test(test_responses), cmocka_unit_test(test_tasks),
        cmocka_unit_test(test_embeddings), cmocka_unit_test(test_embeddings_reply),
        cmocka_unit_test(test_refusal_status), cmocka_unit_test(test_reply_builders),
        cmocka_unit_test(test_sampling_param), cmocka_unit_test(test_stream_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Unit tests for src/engine/chat.c: family detection from real template
 * texts, and each family's rendering against the exact prompt strings its
 * official template produces for (a) one user message, (b) system + user,
 * (c) system + user + assistant + user, all with add_assistant = true.
 *
 * Expected strings written by hand from the families' documented formats:
 *   chatml   OpenHermes-2.5 / Qwen tokenizer_config.json chat_template
 *   llama-2  meta-llama/Llama-2-7b-chat-hf chat_template (bos + "[INST] "
 *            + content.strip() + " [/INST]", " " + answer + " " + eos)
 *   llama-3  meta-llama/Meta-Llama-3-8B-Instruct chat_template
 *   mistral  mistralai/Mistral-7B-Instruct-v0.2 chat_template (output
 *            "<s>[INST] hello [/INST]response</s>[INST] again [/INST]" as
 *            listed in llama.cpp's chat-template wiki); system prepended to
 *            the first user message as in mistral-common (mistralai/cookbook
 *            concept-deep-dive/tokenization/chat_templates.md)
 *   zephyr   HuggingFaceH4/zephyr-7b-beta chat_template
 *   gemma    google/gemma-7b-it chat_template (system folded in as Gemma 3)
 *   phi-3    microsoft/Phi-3-mini-4k-instruct chat_template
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <gpupool/engine.h>
#include "engine/chat.h"

static const gpe_chat_msg MSG_A[] = {{"user", "Hello"}};
static const gpe_chat_msg MSG_B[] = {{"system", "Be brief."}, {"user", "Hello"}};
static const gpe_chat_msg MSG_C[] = {{"system", "Be brief."},
                                     {"user", "Hello"},
                                     {"assistant", "Hi there."},
                                     {"user", "How are you?"}};

struct expect {
    const char *family;
    const char *a, *b, *c;
};

static const struct expect EXPECT[] = {
    {"chatml",
     "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
     "<|im_start|>assistant\n",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
     "<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n"
     "<|im_start|>assistant\n"},
    {"llama-2",
     "<s>[INST] Hello [/INST]",
     "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST]",
     "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST] Hi there. </s>"
     "<s>[INST] How are you? [/INST]"},
    {"llama-3",
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"mistral",
     "<s>[INST] Hello [/INST]",
     "<s>[INST] Be brief.\n\nHello [/INST]",
     "<s>[INST] Be brief.\n\nHello [/INST]Hi there.</s>[INST] How are you? [/INST]"},
    {"zephyr",
     "<|user|>\nHello</s>\n<|assistant|>\n",
     "<|system|>\nBe brief.</s>\n<|user|>\nHello</s>\n<|assistant|>\n",
     "<|system|>\nBe brief.</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there.</s>\n"
     "<|user|>\nHow are you?</s>\n<|assistant|>\n"},
    {"gemma",
     "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
     "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\n",
     "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"
     "<start_of_turn>model\nHi there.<end_of_turn>\n"
     "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"},
    {"phi-3",
     "<|user|>\nHello<|end|>\n<|assistant|>\n",
     "<|system|>\nBe brief.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n",
     "<|system|>\nBe brief.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there.<|end|>\n"
     "<|user|>\nHow are you?<|end|>\n<|assistant|>\n"},
    {"fallback",
     "Hello",
     "Be brief.\nHello",
     "Be brief.\nHello\nHi there.\nHow are you?"},
};

static void check(const char *family, const gpe_chat_msg *m, size_t n, bool add,
                  const char *bos, const char *eos, const char *want)
{
    char err[256] = "";
    char *got = gpe_chat_apply_format(family, bos, eos, m, n, add, err, sizeof err);
    if (!got)
        fail_msg("%s: %s", family, err);
    if (strcmp(got, want) != 0)
        fail_msg("%s:\n got: [%s]\nwant: [%s]", family, got, want);
    free(got);
}

static void test_families(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof EXPECT / sizeof EXPECT[0]; i++) {
        const struct expect *e = &EXPECT[i];
        check(e->family, MSG_A, 1, true, NULL, NULL, e->a);
        check(e->family, MSG_B, 2, true, NULL, NULL, e->b);
        check(e->family, MSG_C, 4, true, NULL, NULL, e->c);
    }
}

static void test_bos_eos_from_model(void **state)
{
    (void)state;
    /* the texts given by the model replace the family defaults */
    check("llama-2", MSG_C + 1, 3, true, "<BOS>", "<EOS>",
          "<BOS>[INST] Hello [/INST] Hi there. <EOS><BOS>[INST] How are you? [/INST]");
    check("zephyr", MSG_A, 1, true, NULL, "<|endoftext|>",
          "<|user|>\nHello<|endoftext|>\n<|assistant|>\n");
    check("llama-3", MSG_A, 1, false, "", NULL,
          "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>");
}

static void test_no_generation_prompt_and_trim(void **state)
{
    (void)state;
    const gpe_chat_msg ws[] = {{"user", "  Hello \n"}};
    check("chatml", ws, 1, false, NULL, NULL, "<|im_start|>user\n  Hello \n<|im_end|>\n");
    check("llama-3", ws, 1, true, NULL, NULL,
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check("llama-2", ws, 1, false, NULL, NULL, "<s>[INST] Hello [/INST]");
    check("gemma", ws, 1, false, NULL, NULL, "<bos><start_of_turn>user\nHello<end_of_turn>\n");
    check("phi-3", MSG_A, 1, false, NULL, NULL, "<|user|>\nHello<|end|>\n<|endoftext|>");
    check("zephyr", MSG_A, 1, false, NULL, NULL, "<|user|>\nHello</s>\n");
    /* aliases */
    check("llama2", MSG_A, 1, true, NULL, NULL, "<s>[INST] Hello [/INST]");
    check("phi3", MSG_A, 1, true, NULL, NULL, "<|user|>\nHello<|end|>\n<|assistant|>\n");
    check(NULL, MSG_A, 1, true, NULL, NULL, "Hello");
}

static void test_roles_beyond_templates(void **state)
{
    (void)state;
    /* other roles pass through in chatml / llama-3, are skipped by zephyr and
     * phi-3, and become user turns in gemma */
    const gpe_chat_msg t[] = {{"user", "Q"}, {"tool", "42"}};
    check("chatml", t, 2, true, NULL, NULL,
          "<|im_start|>user\nQ<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n"
          "<|im_start|>assistant\n");
    check("phi-3", t, 2, true, NULL, NULL, "<|user|>\nQ<|end|>\n<|assistant|>\n");
    /* system only */
    const gpe_chat_msg s[] = {{"system", "Rules."}};
    check("mistral", s, 1, true, NULL, NULL, "<s>[INST] Rules. [/INST]");
    check("gemma", s, 1, true, NULL, NULL,
          "<bos><start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n");
    /* NULL content is empty; empty contents are skipped by the fallback */
    const gpe_chat_msg nc[] = {{"user", NULL}, {"user", "x"}};
    check("fallback", nc, 2, true, NULL, NULL, "x");
    check("chatml", nc, 1, false, NULL, NULL, "<|im_start|>user\n<|im_end|>\n");
    /* no messages */
    check("chatml", NULL, 0, true, NULL, NULL, "<|im_start|>assistant\n");
    check("fallback", NULL, 0, true, NULL, NULL, "");
}

static void test_errors(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(gpe_chat_apply_format("vicuna", NULL, NULL, MSG_A, 1, true, err, sizeof err));
    assert_non_null(strstr(err, "unknown chat format 'vicuna'"));
    const gpe_chat_msg bad[] = {{"user", "a"}, {NULL, "b"}};
    err[0] = 0;
    assert_null(gpe_chat_apply_format("chatml", NULL, NULL, bad, 2, true, err, sizeof err));
    assert_non_null(strstr(err, "message 1 has no role"));
    err[0] = 0;
    assert_null(gpe_chat_apply_format("chatml", NULL, NULL, NULL, 3, true, err, sizeof err));
    assert_true(err[0] != 0);
    /* a NULL/short err buffer is fine */
    assert_null(gpe_chat_apply_format("nope", NULL, NULL, MSG_A, 1, true, NULL, 0));
}

/* Template texts abbreviated from real tokenizer.chat_template values. */
static void test_detect(void **state)
{
    (void)state;
    assert_string_equal(gpe_chat_detect(NULL), "fallback");
    assert_string_equal(gpe_chat_detect(""), "fallback");
    assert_string_equal(gpe_chat_detect("{{ messages }}"), "fallback");
    assert_string_equal(
        gpe_chat_detect("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                        "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
        "chatml");
    assert_string_equal(
        gpe_chat_detect("{% set loop_messages = messages %}{% for message in loop_messages %}{% set "
                        "content = '<|start_header_id|>' + message['role'] + "
                        "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"),
        "llama-3");
    assert_string_equal(
        gpe_chat_detect("{% if messages[0]['role'] == 'system' %}{% set system_message = "
                        "messages[0]['content'] %}{% endif %}{% if loop.index0 == 0 and "
                        "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
                        "'\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{{ bos_token + "
                        "'[INST] ' + content.strip() + ' [/INST]' }}"),
        "llama-2");
    assert_string_equal(
        gpe_chat_detect("{{ bos_token }}{% for message in messages %}{% if message['role'] == "
                        "'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
                        "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"),
        "mistral");
    assert_string_equal(
        gpe_chat_detect("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ "
                        "'<|user|>\\n' + message['content'] + eos_token }}\n{% elif "
                        "message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + "
                        "eos_token }}"),
        "zephyr");
    assert_string_equal(gpe_chat_detect("{{ '<|user|>\\n' + message['content'] + '</s>' }}"),
                        "zephyr");
    assert_string_equal(
        gpe_chat_detect("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ "
                        "raise_exception('System role not supported') }}{% endif %}{{ "
                        "'<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                        "'<end_of_turn>\\n' }}"),
        "gemma");
    assert_string_equal(
        gpe_chat_detect("{% for message in messages %}{% if message['role'] == 'system' %}{{"
                        "'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif "
                        "message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + "
                        "'<|end|>\\n'}}"),
        "phi-3");
    /* detected names are the canonical static strings */
    assert_ptr_equal(gpe_chat_detect("<|im_start|>"), gpe_chat_family_name("chatml"));
    assert_null(gpe_chat_family_name("vicuna"));
}

static void test_helpers(void **state)
{
    (void)state;
    assert_true(gpe_chat_writes_bos("llama-3"));
    assert_true(gpe_chat_writes_bos("llama-2"));
    assert_true(gpe_chat_writes_bos("mistral"));
    assert_true(gpe_chat_writes_bos("gemma"));
    assert_false(gpe_chat_writes_bos("chatml"));
    assert_false(gpe_chat_writes_bos("zephyr"));
    assert_false(gpe_chat_writes_bos("phi-3"));
    assert_false(gpe_chat_writes_bos("fallback"));
    assert_false(gpe_chat_writes_bos("nope"));
    assert_string_equal(gpe_chat_end_of_turn("chatml"), "<|im_end|>");
    assert_string_equal(gpe_chat_end_of_turn("llama-3"), "<|eot_id|>");
    assert_string_equal(gpe_chat_end_of_turn("gemma"), "<end_of_turn>");
    assert_string_equal(gpe_chat_end_of_turn("phi-3"), "<|end|>");
    assert_string_equal(gpe_chat_end_of_turn("fallback"), "");
    assert_string_equal(gpe_chat_default_bos("gemma"), "<bos>");
    assert_string_equal(gpe_chat_default_eos("zephyr"), "</s>");
}


/* ------------------------------------------------------------------ tools */

/* Tools and tool messages. Expected strings written by hand from the
 * published tool-capable templates (tokenizer_config.json chat_template):
 *   chatml   Qwen/Qwen2.5-7B-Instruct (Hermes style: "# Tools" system
 *            section, <tools></tools>, <tool_call>, <tool_response> in a
 *            user turn); rendered tool calls as in modelscope/AgentJet
 *            documents/tokenizer_nodes.md (Qwen2.5 apply_chat_template)
 *   llama-3  meta-llama/Llama-3.1-8B-Instruct (tools_in_user_message,
 *            t | tojson(indent=4), "ipython" role, content | tojson)
 *   mistral  mistralai/Mistral-7B-Instruct-v0.3 ([AVAILABLE_TOOLS],
 *            [TOOL_CALLS] function|tojson minus "}" + id, [TOOL_RESULTS])
 * The parameters/arguments are given compact, as jansson writes them, to
 * check the re-spacing into Python's json.dumps form. */
static const gpe_chat_tool TOOLS[] = {
    {"get_weather", "Get the weather",
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
     "\"required\":[\"city\"]}"},
};
static const gpe_chat_tool_call CALL[] = {{"abc123def", "get_weather", "{\"city\":\"Paris\"}"}};
static const gpe_chat_msg TMSG[] = {{"system", "Be brief."},
                                    {"user", "Weather in Paris?"},
                                    {"assistant", NULL},
                                    {"tool", "22 C"}};
static const gpe_chat_msg_tools TX[] = {{NULL, 0, NULL},
                                        {NULL, 0, NULL},
                                        {CALL, 1, NULL},
                                        {NULL, 0, "abc123def"}};

static void check_tools(const char *family, bool fmt, const gpe_chat_tool *tools, size_t nt,
                        const gpe_chat_msg *m, const gpe_chat_msg_tools *x, size_t n, bool add,
                        const char *want)
{
    char err[256] = "";
    char *got = gpe_chat_apply_format_tools(family, NULL, NULL, fmt, tools, nt, m, x, n, add, err,
                                            sizeof err);
    if (!got)
        fail_msg("%s: %s", family, err);
    if (strcmp(got, want) != 0)
        fail_msg("%s:\n got: [%s]\nwant: [%s]", family, got, want);
    free(got);
}

static void test_tools_chatml(void **state)
{
    (void)state;
    check_tools(
        "chatml", true, TOOLS, 1, TMSG, TX, 4, true,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n");
    /* no system message: the tools section opens the system turn (Qwen3);
     * content + two calls; consecutive results share one user turn */
    const gpe_chat_tool_call two[] = {{"a", "f", "{}"}, {"b", "g", " { \"x\" : [1, 2] } "}};
    const gpe_chat_msg m[] = {{"user", "Go"}, {"assistant", "Calling."}, {"tool", "r1"},
                              {"tool", "r2"}};
    const gpe_chat_msg_tools x[] = {{NULL, 0, NULL}, {two, 2, NULL}, {NULL, 0, "a"},
                                    {NULL, 0, "b"}};
    const gpe_chat_tool bare[] = {{"f", NULL, NULL}};
    check_tools("chatml", true, bare, 1, m, x, 4, false,
                "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with "
                "the user query.\n\nYou are provided with function signatures within "
                "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "
                "{\"name\": \"f\"}}\n</tools>\n\nFor each function call, return a json object "
                "with function name and arguments within <tool_call></tool_call> XML tags:\n"
                "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                "</tool_call><|im_end|>\n<|im_start|>user\nGo<|im_end|>\n"
                "<|im_start|>assistant\nCalling.\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                "{}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": [1, "
                "2]}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n"
                "</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n");
    /* tool format but no tools and no tool messages: plain chatml */
    check_tools("chatml", true, NULL, 0, MSG_C, NULL, 4, true, EXPECT[0].c);
}

static void test_tools_llama31(void **state)
{
    (void)state;
    check_tools(
        "llama-3", true, TOOLS, 1, TMSG, TX, 4, true,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers the "
        "given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n"
        "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
        "        \"description\": \"Get the weather\",\n        \"parameters\": {\n"
        "            \"type\": \"object\",\n            \"properties\": {\n"
        "                \"city\": {\n                    \"type\": \"string\"\n"
        "                }\n            },\n            \"required\": [\n"
        "                \"city\"\n            ]\n        }\n    }\n}\n\n"
        "Weather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
        "\"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n\"22 C\"<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* no tools: the 3.1 system header without "Environment"; a string
     * result is JSON-quoted (tojson) with escapes */
    const gpe_chat_msg m[] = {{"user", "Hi"}, {"tool", "a \"b\"\n\x01"}};
    check_tools("llama-3", true, NULL, 0, m, NULL, 2, false,
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>ipython<|end_header_id|>\n\n\"a \\\"b\\\"\\n\\u0001\""
                "<|eot_id|>");
}

static void test_tools_mistral(void **state)
{
    (void)state;
    check_tools(
        "mistral", true, TOOLS, 1, TMSG, TX, 4, true,
        "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
        "[/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in Paris?[/INST]"
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
        "\"id\": \"abc123def\"}]</s>"
        "[TOOL_RESULTS] {\"content\": 22 C, \"call_id\": \"abc123def\"}[/TOOL_RESULTS]");
    /* tools and system go with the LAST user message; answers " " + trimmed
     * + EOS; invalid argument JSON is written as given */
    const gpe_chat_tool_call bad[] = {{"xyz987abc", "f", "not json"}};
    const gpe_chat_msg m[] = {{"system", "S"}, {"user", "A"}, {"assistant", " B "},
                              {"user", "C"}, {"assistant", NULL}};
    const gpe_chat_msg_tools x[] = {{0}, {0}, {0}, {0}, {bad, 1, NULL}};
    const gpe_chat_tool t2[] = {{"f", "d", NULL}, {"g", NULL, "{}"}};
    check_tools("mistral", true, t2, 2, m, x, 5, true,
                "<s>[INST] A[/INST] B</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", "
                "\"function\": {\"name\": \"f\", \"description\": \"d\"}}, {\"type\": "
                "\"function\", \"function\": {\"name\": \"g\", \"parameters\": {}}}]"
                "[/AVAILABLE_TOOLS][INST] S\n\nC[/INST][TOOL_CALLS] [{\"name\": \"f\", "
                "\"arguments\": not json, \"id\": \"xyz987abc\"}]</s>");
}

/* Templates without a tools format (and the fallback of stories260K):
 * tools ignored, calls and results as plain text. */
static void test_tools_as_text(void **state)
{
    (void)state;
    check_tools("fallback", true, TOOLS, 1, TMSG, TX, 4, true,
                "Be brief.\nWeather in Paris?\nTool call: get_weather({\"city\":\"Paris\"})\n"
                "Tool result: 22 C");
    check_tools("zephyr", true, TOOLS, 1, TMSG + 1, TX + 1, 3, true,
                "<|user|>\nWeather in Paris?</s>\n<|assistant|>\nTool call: "
                "get_weather({\"city\":\"Paris\"})</s>\n<|user|>\nTool result: 22 C</s>\n"
                "<|assistant|>\n");
    /* a chatml template without tool support (tool_format false) */
    check_tools("chatml", false, TOOLS, 1, TMSG + 2, TX + 2, 2, false,
                "<|im_start|>assistant\nTool call: get_weather({\"city\":\"Paris\"})<|im_end|>\n"
                "<|im_start|>user\nTool result: 22 C<|im_end|>\n");
    /* content and a call: content first, then the call line */
    const gpe_chat_msg m[] = {{"assistant", "Sure."}};
    const gpe_chat_msg_tools x[] = {{CALL, 1, NULL}};
    check_tools("gemma", true, NULL, 0, m, x, 1, false,
                "<bos><start_of_turn>model\nSure.\nTool call: get_weather({\"city\":\"Paris\"})"
                "<end_of_turn>\n");
}

static void test_tools_detect_and_errors(void **state)
{
    (void)state;
    /* abbreviated from real templates */
    const char *qwen25 =
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- \"\\n\\n# Tools\\n\\n<tools>\" }}"
        "{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{%- for message in messages %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' }}{%- endfor %}";
    const char *openhermes = "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                             "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    const char *llama31 = "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}{{- "
                          "\"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{%- if tools "
                          "is not none %}{{- \"Environment: ipython\\n\" }}{%- endif %}{{- "
                          "\"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}";
    const char *llama30 = "{% set content = '<|start_header_id|>' + message['role'] + "
                          "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}";
    const char *mistral03 = "{%- if tools is not none and (message == user_messages[-1]) %}{{- "
                            "\"[AVAILABLE_TOOLS] [\" }}{%- endif %}{{- \"[INST] \" + "
                            "message[\"content\"] + \"[/INST]\" }}";
    const char *mistral02 = "{{ bos_token }}{% for message in messages %}{{ '[INST] ' + "
                            "message['content'] + ' [/INST]' }}{% endfor %}";
    assert_true(gpe_chat_template_supports_tools(qwen25));
    assert_false(gpe_chat_template_supports_tools(openhermes));
    assert_true(gpe_chat_template_supports_tools(llama31));
    assert_false(gpe_chat_template_supports_tools(llama30));
    assert_true(gpe_chat_template_supports_tools(mistral03));
    assert_false(gpe_chat_template_supports_tools(mistral02));
    assert_false(gpe_chat_template_supports_tools("<start_of_turn>{{ tools }}"));
    assert_false(gpe_chat_template_supports_tools(NULL));
    assert_false(gpe_chat_template_supports_tools(""));
    assert_true(gpe_chat_format_has_tools("chatml"));
    assert_true(gpe_chat_format_has_tools("llama3"));
    assert_true(gpe_chat_format_has_tools("mistral"));
    assert_false(gpe_chat_format_has_tools("fallback"));
    assert_false(gpe_chat_format_has_tools(NULL));
    assert_false(gpe_chat_format_has_tools("vicuna"));

    char err[256] = "";
    const gpe_chat_tool noname[] = {{NULL, "d", NULL}};
    assert_null(gpe_chat_apply_format_tools("chatml", NULL, NULL, true, noname, 1, MSG_A, NULL, 1,
                                            true, err, sizeof err));
    assert_non_null(strstr(err, "tool 0 has no name"));
    const gpe_chat_tool_call nc[] = {{"id", "", "{}"}};
    const gpe_chat_msg_tools x[] = {{nc, 1, NULL}};
    const gpe_chat_msg m[] = {{"assistant", NULL}};
    err[0] = 0;
    assert_null(gpe_chat_apply_format_tools("fallback", NULL, NULL, true, NULL, 0, m, x, 1, true,
                                            err, sizeof err));
    assert_non_null(strstr(err, "tool call 0 has no name"));
    err[0] = 0;
    assert_null(gpe_chat_apply_format_tools("chatml", NULL, NULL, true, NULL, 2, MSG_A, NULL, 1,
                                            true, err, sizeof err));
    assert_true(err[0] != 0);
    err[0] = 0;
    assert_null(gpe_chat_apply_format_tools("vicuna", NULL, NULL, true, NULL, 0, MSG_A, NULL, 1,
                                            true, err, sizeof err));
    assert_non_null(strstr(err, "unknown chat format"));
    /* unbalanced / deep JSON never crashes: written as given */
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 299);
    deep[599] = 0;
    const gpe_chat_tool_call dc[] = {{"i", "f", deep}, {"j", "g", "{\"a\":}}"}, {"k", "h", NULL}};
    const gpe_chat_msg_tools dx[] = {{dc, 3, NULL}};
    char *got = gpe_chat_apply_format_tools("chatml", NULL, NULL, true, NULL, 0, m, dx, 1, false,
                                            err, sizeof err);
    assert_non_null(got);
    assert_non_null(strstr(got, deep));
    assert_non_null(strstr(got, "\"arguments\": {\"a\":}}}"));
    assert_non_null(strstr(got, "{\"name\": \"h\", \"arguments\": {}}"));
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_bos_eos_from_model),
        cmocka_unit_test(test_no_generation_prompt_and_trim),
        cmocka_unit_test(test_roles_beyond_templates),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_tools_chatml),
        cmocka_unit_test(test_tools_llama31),
        cmocka_unit_test(test_tools_mistral),
        cmocka_unit_test(test_tools_as_text),
        cmocka_unit_test(test_tools_detect_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* openai_count: the bodies the openai backend sends to count a prompt, the
 * estimate it falls back to, and the replies it accepts (gpupool/Anthropic
 * count_tokens, llama-server and vLLM /tokenize). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/openai_count.h"
#include "common/gp_count.h"

static json_t *J(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

static void test_messages_body(void **st)
{
    (void)st;
    bool nomem;
    json_t *job = J("{\"kind\":\"count_tokens\",\"messages\":["
                    "{\"role\":\"system\",\"content\":\"Be brief.\"},"
                    "{\"role\":\"system\",\"content\":\"Use English.\"},"
                    "{\"role\":\"user\",\"content\":\"Hi\"},"
                    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                    "\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":"
                    "\"{\\\"x\\\":1}\"}}]},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and \"},"
                    "{\"type\":\"text\",\"text\":\"you?\"}]}]}");
    json_t *b = oai_count_messages_body(job, "up-model", &nomem);
    assert_non_null(b);
    assert_string_equal(json_string_value(json_object_get(b, "model")), "up-model");
    assert_string_equal(json_string_value(json_object_get(b, "system")),
                        "Be brief.\nUse English.");
    json_t *m = json_object_get(b, "messages");
    assert_int_equal(json_array_size(m), 4);
    const char *want[][2] = {{"user", "Hi"},
                             {"assistant", "get{\"x\":1}"},
                             {"user", "42"},
                             {"user", "and you?"}};
    for (size_t i = 0; i < 4; i++) {
        json_t *x = json_array_get(m, i);
        assert_string_equal(json_string_value(json_object_get(x, "role")), want[i][0]);
        assert_string_equal(json_string_value(json_object_get(x, "content")), want[i][1]);
    }
    json_decref(b);
    json_decref(job);

    job = J("{\"prompt\":\"Once upon\"}");
    b = oai_count_messages_body(job, "m", &nomem);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(b, "messages"), 0),
                                          "content")),
        "Once upon");
    json_decref(b);
    json_decref(job);
    /* Only a system prompt: counted as the user's (a body must have a message). */
    job = J("{\"messages\":[{\"role\":\"system\",\"content\":\"S\"}]}");
    b = oai_count_messages_body(job, "m", &nomem);
    assert_int_equal(json_array_size(json_object_get(b, "messages")), 1);
    json_decref(b);
    json_decref(job);
    job = J("{\"kind\":\"count_tokens\"}");
    assert_null(oai_count_messages_body(job, "m", &nomem));
    assert_false(nomem);
    assert_null(gp_count_text(job));
    assert_int_equal(gp_count_estimate(job), 0);
    json_decref(job);
}

static void test_text_and_estimate(void **st)
{
    (void)st;
    json_t *job = J("{\"messages\":[{\"role\":\"user\",\"content\":\"12345678\"},"
                    "{\"role\":\"assistant\",\"content\":\"abc\"}]}");
    char *t = gp_count_text(job);
    assert_string_equal(t, "12345678\nabc");
    free(t);
    /* 12 bytes -> 3, plus 4 per message. */
    assert_int_equal(gp_count_estimate(job), 3 + 8);
    json_decref(job);
    job = J("{\"prompt\":\"x\"}");
    assert_int_equal(gp_count_estimate(job), 1);
    json_decref(job);
}

static void test_parse(void **st)
{
    (void)st;
    long long n = -1;
    bool est = true;
    const char *a = "{\"input_tokens\":17}";
    assert_int_equal(oai_count_parse(OAI_COUNT_MESSAGES, a, strlen(a), &n, &est), 0);
    assert_int_equal(n, 17);
    assert_false(est);
    const char *b = "{\"input_tokens\":9,\"x_pool_meta\":{\"estimated\":true}}";
    assert_int_equal(oai_count_parse(OAI_COUNT_MESSAGES, b, strlen(b), &n, &est), 0);
    assert_int_equal(n, 9);
    assert_true(est);
    const char *c = "{\"tokens\":[1,2,3]}";
    assert_int_equal(oai_count_parse(OAI_COUNT_TOKENIZE, c, strlen(c), &n, &est), 0);
    assert_int_equal(n, 3);
    const char *d = "{\"count\":5,\"tokens\":[1]}";
    assert_int_equal(oai_count_parse(OAI_COUNT_TOKENIZE, d, strlen(d), &n, &est), 0);
    assert_int_equal(n, 5);
    /* Not a count: wrong method's shape, negative, not JSON, empty. */
    assert_int_equal(oai_count_parse(OAI_COUNT_MESSAGES, c, strlen(c), &n, &est), -1);
    assert_int_equal(oai_count_parse(OAI_COUNT_TOKENIZE, a, strlen(a), &n, &est), -1);
    const char *e = "{\"input_tokens\":-1}";
    assert_int_equal(oai_count_parse(OAI_COUNT_MESSAGES, e, strlen(e), &n, &est), -1);
    assert_int_equal(oai_count_parse(OAI_COUNT_MESSAGES, "<html>", 6, &n, &est), -1);
    assert_int_equal(oai_count_parse(OAI_COUNT_TOKENIZE, NULL, 0, &n, &est), -1);
    /* llama-server's answer to a /tokenize body without "content" */
    assert_int_equal(oai_count_parse(OAI_COUNT_TOKENIZE, "{\"tokens\":[]}", 13, &n, &est), -1);
    assert_int_equal(oai_count_parse(OAI_COUNT_TEMPLATE, c, strlen(c), &n, &est), 0);
    assert_int_equal(n, 3);
}

/* Issue 26 item 4: the chat-template methods (llama-server's
 * /apply-template then /tokenize; vLLM's /tokenize with messages). */
static void test_template_and_tokenize_bodies(void **st)
{
    (void)st;
    bool nomem;
    json_t *job = J("{\"kind\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                    "{\"role\":\"user\",\"content\":\"a b\"}],\"tools\":[{\"type\":"
                    "\"function\",\"function\":{\"name\":\"f\"}}]}");
    json_t *t = oai_count_template_body(job, "m", &nomem);
    assert_string_equal(json_string_value(json_object_get(t, "model")), "m");
    assert_true(json_equal(json_object_get(t, "messages"), json_object_get(job, "messages")));
    assert_true(json_equal(json_object_get(t, "tools"), json_object_get(job, "tools")));
    json_decref(t);
    json_t *k = oai_count_tokenize_body(job, "m", &nomem);
    assert_string_equal(json_string_value(json_object_get(k, "content")), "S\na b");
    assert_true(json_equal(json_object_get(k, "messages"), json_object_get(job, "messages")));
    assert_true(json_is_true(json_object_get(k, "add_generation_prompt")));
    assert_null(json_object_get(k, "prompt")); /* vLLM: a chat, not a prompt */
    json_decref(k);
    json_decref(job);

    job = J("{\"kind\":\"completion\",\"prompt\":\"Once upon\"}");
    assert_null(oai_count_template_body(job, "m", &nomem));
    assert_false(nomem);
    k = oai_count_tokenize_body(job, "m", &nomem);
    assert_string_equal(json_string_value(json_object_get(k, "content")), "Once upon");
    assert_string_equal(json_string_value(json_object_get(k, "prompt")), "Once upon");
    assert_true(json_is_true(json_object_get(k, "add_special")));
    assert_null(json_object_get(k, "messages"));
    json_decref(k);
    json_decref(job);
    job = J("{\"kind\":\"count_tokens\"}");
    assert_null(oai_count_tokenize_body(job, "m", &nomem));
    assert_false(nomem);
    json_decref(job);

    const char *reply = "{\"prompt\":\"<|user|>a b<|end|>\"}";
    char *body = oai_count_template_tokenize(reply, strlen(reply), &nomem);
    assert_non_null(body);
    k = J(body);
    free(body);
    assert_string_equal(json_string_value(json_object_get(k, "content")), "<|user|>a b<|end|>");
    assert_true(json_is_true(json_object_get(k, "add_special")));
    assert_true(json_is_true(json_object_get(k, "parse_special")));
    json_decref(k);
    assert_null(oai_count_template_tokenize("{\"tokens\":[1]}", 14, &nomem));
    assert_false(nomem);
    assert_null(oai_count_template_tokenize("<html>", 6, &nomem));
    assert_false(nomem);
    assert_null(oai_count_template_tokenize(NULL, 0, &nomem));
    assert_false(nomem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages_body),
        cmocka_unit_test(test_text_and_estimate),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_template_and_tokenize_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Unit tests for tool calls read out of generated text (src/engine/toolcall.c):
 * each family's format, fed whole and one byte at a time (the same content
 * and calls either way), text that only looks like a call, bodies that do
 * not parse (given back as text), calls without their closer at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <gpupool/engine.h>

typedef struct result {
    char content[1024];
    size_t n_calls;
    char names[4][32];
    char args[4][256];
} result;

static void append(result *r, const char *s, size_t n)
{
    size_t have = strlen(r->content);
    assert_true(have + n < sizeof r->content);
    memcpy(r->content + have, s, n);
    r->content[have + n] = '\0';
}

/* Run text through a parser of family in pieces of `step` bytes (0: whole). */
static void run(const char *family, const char *text, size_t step, result *r)
{
    memset(r, 0, sizeof *r);
    gpe_toolparse *p = gpe_toolparse_new(family);
    assert_non_null(p);
    size_t len = strlen(text);
    const char *emit;
    size_t elen;
    for (size_t at = 0; at < len;) {
        size_t n = step && len - at > step ? step : len - at;
        assert_int_equal(gpe_toolparse_feed(p, text + at, n, &emit, &elen), GPE_OK);
        append(r, emit, elen);
        at += n;
    }
    gpe_toolparse_finish(p, &emit, &elen);
    append(r, emit, elen);
    r->n_calls = gpe_toolparse_n_calls(p);
    for (size_t i = 0; i < r->n_calls && i < 4; i++) {
        const char *nm, *a;
        assert_true(gpe_toolparse_call(p, i, &nm, &a));
        snprintf(r->names[i], sizeof r->names[i], "%s", nm);
        snprintf(r->args[i], sizeof r->args[i], "%s", a);
    }
    const char *nm, *a;
    assert_false(gpe_toolparse_call(p, r->n_calls, &nm, &a));
    gpe_toolparse_free(p);
}

/* Whole, in 1-, 2- and 5-byte pieces: all must agree with the expectation. */
static void check(const char *family, const char *text, const char *content, size_t n_calls,
                  const char *const *names, const char *const *args)
{
    static const size_t steps[] = {0, 1, 2, 5};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        result r;
        run(family, text, steps[s], &r);
        assert_string_equal(r.content, content);
        assert_int_equal(r.n_calls, n_calls);
        for (size_t i = 0; i < n_calls; i++) {
            assert_string_equal(r.names[i], names[i]);
            assert_string_equal(r.args[i], args[i]);
        }
    }
}

static void test_chatml_calls(void **state)
{
    (void)state;
    const char *n1[] = {"list_dir"}, *a1[] = {"{\"path\":\"/tmp\"}"};
    check("chatml",
          "Let me look.\n<tool_call>\n{\"name\": \"list_dir\", \"arguments\": {\"path\": \"/tmp\"}}"
          "\n</tool_call>",
          "Let me look.\n", 1, n1, a1);
    const char *n2[] = {"a", "b"}, *a2[] = {"{}", "{\"k\":[1,2]}"};
    check("chatml",
          "<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>\n"
          "<tool_call>\n{\"name\":\"b\",\"arguments\":{\"k\":[1, 2]}}\n</tool_call>\n",
          "", 2, n2, a2);
    /* EOS right after the JSON, no closer: still a call */
    const char *n3[] = {"f"}, *a3[] = {"{\"x\":1}"};
    check("chatml", "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n", "", 1, n3, a3);
    /* arguments written as a JSON string are taken as the arguments' text */
    const char *a4[] = {"{\"x\": 1}"};
    check("chatml", "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}</tool_call>", "",
          1, n3, a4);
}

static void test_chatml_text(void **state)
{
    (void)state;
    check("chatml", "if a < b and c <tool then", "if a < b and c <tool then", 0, NULL, NULL);
    check("chatml", "ends with <tool_c", "ends with <tool_c", 0, NULL, NULL);
    /* not a call: given back, opener and all */
    check("chatml", "x <tool_call>oops</tool_call> y", "x <tool_call>oops</tool_call> y", 0, NULL,
          NULL);
    check("chatml", "<tool_call>{\"arguments\":{}}", "<tool_call>{\"arguments\":{}}", 0, NULL,
          NULL);
    /* text after a call is content; the newline right after it is not */
    const char *n[] = {"f"}, *a[] = {"{}"};
    check("chatml", "<tool_call>{\"name\":\"f\"}</tool_call>\nDone.", "\nDone.", 1, n, a);
    check("chatml", "<tool_call>{\"name\":\"f\"}</tool_call>\n \n", "", 1, n, a);
    /* found by fuzz_toolparse: only the whitespace right after a call waits */
    check("chatml", "<tool_call>{\"name\":\"f\"}</tool_call>[\n", "[\n", 1, n, a);
    check("chatml", "héllo wörld ✓", "héllo wörld ✓", 0, NULL, NULL);
}

static void test_llama3(void **state)
{
    (void)state;
    const char *n[] = {"get_weather"}, *a[] = {"{\"city\":\"Paris\"}"};
    check("llama-3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1,
          n, a);
    check("llama-3", "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
          "", 1, n, a);
    check("llama-3", "\n {\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}", "", 1, n,
          a);
    check("llama-3", "The answer is {42}.", "The answer is {42}.", 0, NULL, NULL);
    check("llama-3", "{not json", "{not json", 0, NULL, NULL);
    check("llama-3", "<|python", "<|python", 0, NULL, NULL);
    check("llama-3", "<b>bold</b>", "<b>bold</b>", 0, NULL, NULL);
}

static void test_mistral(void **state)
{
    (void)state;
    const char *n[] = {"a", "b"}, *a[] = {"{}", "{\"k\":\"v\"}"};
    check("mistral",
          "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcdefghi\"}, "
          "{\"name\": \"b\", \"arguments\": {\"k\": \"v\"}}]",
          "", 2, n, a);
    check("mistral", "Plain [TOOL answer", "Plain [TOOL answer", 0, NULL, NULL);
    check("mistral", "[TOOL_CALLS] [{\"arguments\": {}}]", "[TOOL_CALLS] [{\"arguments\": {}}]", 0,
          NULL, NULL);
    check("mistral", "[TOOL_CALLS] []", "[TOOL_CALLS] []", 0, NULL, NULL);
    /* found by fuzz_toolparse: an empty name is not a call (text kept) */
    check("mistral", "[TOOL_CALLS] [{\"name\": \"\"}]", "[TOOL_CALLS] [{\"name\": \"\"}]", 0,
          NULL, NULL);
}

static void test_families(void **state)
{
    (void)state;
    assert_null(gpe_toolparse_new("llama-2"));
    assert_null(gpe_toolparse_new("nonsense"));
    assert_null(gpe_toolparse_new(NULL));
    assert_string_equal(gpe_toolparse_forced_prefix("chatml"), "<tool_call>\n");
    assert_string_equal(gpe_toolparse_forced_prefix("llama-3"), "");
    assert_string_equal(gpe_toolparse_forced_prefix("mistral"), "[TOOL_CALLS]");
    assert_null(gpe_toolparse_forced_prefix("gemma"));
    gpe_toolparse_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml_calls), cmocka_unit_test(test_chatml_text),
        cmocka_unit_test(test_llama3),       cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

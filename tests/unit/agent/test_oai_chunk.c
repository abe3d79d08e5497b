/* Unit tests for oai_chunk.h (issue 24): the scanner takes the chunks it
 * should, refuses the rest, and whatever it takes it reads as jansson
 * would (the jansson path of openai_stream.c is the oracle: same text, and
 * never a chunk that jansson refuses). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "agent/oai_chunk.h"
#include "../common/mutate.h"

/* What handle_object takes from a chunk (the oracle): 1 and what it
 * reads, or 0 when jansson refuses the chunk. */
static int oracle(const char *p, size_t n, bool chat, oai_chunk *o, json_t **keep)
{
    memset(o, 0, sizeof *o);
    o->prompt_tokens = o->completion_tokens = -1;
    json_t *obj = json_loadb(p, n, 0, NULL);
    *keep = obj;
    if (!obj)
        return 0;
    json_t *c0 = json_array_get(json_object_get(obj, "choices"), 0);
    json_t *t = chat ? json_object_get(json_object_get(c0, "delta"), "content")
                     : json_object_get(c0, "text");
    if (json_is_string(t)) {
        o->text = json_string_value(t);
        o->len = json_string_length(t);
    }
    json_t *fr = json_object_get(c0, "finish_reason");
    if (json_is_string(fr) && json_string_length(fr) > 0) {
        o->finish = json_string_value(fr);
        o->finish_len = json_string_length(fr);
    }
    json_t *u = json_object_get(obj, "usage");
    if (json_is_integer(json_object_get(u, "prompt_tokens")))
        o->prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
    if (json_is_integer(json_object_get(u, "completion_tokens")))
        o->completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
    return 1;
}

/* Scan p both ways; returns whether the scanner took it, after checking
 * that it agrees with jansson when it did. */
static bool check(const char *p, size_t n, bool chat)
{
    gp_buf scratch;
    gp_buf_init(&scratch);
    oai_chunk f, o;
    json_t *keep;
    bool took = oai_chunk_scan(p, n, chat, &scratch, &f);
    int ok = oracle(p, n, chat, &o, &keep);
    if (took) {
        if (!ok)
            fail_msg("scanner took what jansson refuses: %.*s", (int)n, p);
        assert_int_equal(f.text == NULL, o.text == NULL);
        if (f.text) {
            assert_int_equal(f.len, o.len);
            assert_memory_equal(f.text, o.text, f.len);
        }
        assert_int_equal(f.finish_len > 0, o.finish != NULL);
        if (o.finish) {
            assert_int_equal(f.finish_len, o.finish_len);
            assert_memory_equal(f.finish, o.finish, f.finish_len);
        }
        assert_int_equal(f.prompt_tokens, o.prompt_tokens);
        assert_int_equal(f.completion_tokens, o.completion_tokens);
    }
    json_decref(keep);
    gp_buf_free(&scratch);
    return took;
}

/* The memo (oai_chunk_read) reads p exactly as the plain scan does,
 * whatever chunk it held before. */
static bool same_read(oai_chunk_memo *m, const char *p, size_t n, bool chat)
{
    gp_buf s1, s2;
    gp_buf_init(&s1);
    gp_buf_init(&s2);
    oai_chunk a, b;
    bool ta = oai_chunk_scan(p, n, chat, &s1, &a);
    bool tb = oai_chunk_read(m, p, n, chat, &s2, &b);
    assert_int_equal(ta, tb);
    if (ta) {
        assert_int_equal(a.text == NULL, b.text == NULL);
        if (a.text) {
            assert_int_equal(a.len, b.len);
            assert_memory_equal(a.text, b.text, a.len);
        }
        assert_ptr_equal(a.finish, b.finish); /* both point into p */
        assert_int_equal(a.finish_len, b.finish_len);
        assert_int_equal(a.prompt_tokens, b.prompt_tokens);
        assert_int_equal(a.completion_tokens, b.completion_tokens);
    }
    gp_buf_free(&s1);
    gp_buf_free(&s2);
    return ta;
}

static bool check_s(const char *s, bool chat)
{
    return check(s, strlen(s), chat);
}

#define CMPL "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1764200000," \
             "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":" 
#define CMPL_END ",\"logprobs\":null,\"finish_reason\":null}]}"
#define CHAT "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\"," \
             "\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":"
#define CHAT_END ",\"logprobs\":null,\"finish_reason\":null}]}"

static const char *const taken_cmpl[] = {
    CMPL "\" tok\"" CMPL_END,
    CMPL "\"\"" CMPL_END,
    CMPL "null" CMPL_END,
    CMPL "\"a\\nb\\t\\\"c\\\\d\\/e\\b\\f\\r\"" CMPL_END,
    CMPL "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"" CMPL_END,
    " {\"choices\":[]} \r\n",
    "{}",
    "{\"choices\":[{}]}",
    "{\"created\":-0,\"usage\":null,\"choices\":[{\"index\":123456789012345678,\"text\":\"x\"}]}",
    CMPL "\"x\",\"logprobs\":null,\"finish_reason\":\"length\"}]}",
    CMPL "\"\",\"logprobs\":null,\"finish_reason\":\"\"}]}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}",
    "{\"choices\":[],\"usage\":{\"completion_tokens\":0}}",
    "{\"choices\":[],\"usage\":{}}",
    NULL,
};

static const char *const taken_chat[] = {
    CHAT "{\"role\":\"assistant\",\"content\":\"\"}" CHAT_END,
    CHAT "{\"content\":\" tok\"}" CHAT_END,
    CHAT "{\"content\":null}" CHAT_END,
    CHAT "{}" CHAT_END,
    CHAT "{\"content\":\"line\\n\"}" CHAT_END,
    NULL,
};

/* Each is either valid JSON the scanner leaves to jansson (a shape it does
 * not know) or invalid JSON; both go to jansson. */
static const char *const refused_cmpl[] = {
    CMPL "\"x\",\"logprobs\":null,\"finish_reason\":\"len\\ngth\"}]}",
    CMPL "\"x\",\"logprobs\":null,\"finish_reason\":1}]}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":-1}}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":{}}}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":1.0}}",
    CMPL "\"\\u00e9\"" CMPL_END,
    CMPL "\"\\u0000\"" CMPL_END,
    CMPL "\"\\x\"" CMPL_END,
    CMPL "\"a\x01\"" CMPL_END,
    CMPL "\"\xc3\"" CMPL_END,
    CMPL "\"\xc0\xaf\"" CMPL_END,
    CMPL "\"\xed\xa0\x80\"" CMPL_END,
    CMPL "\"\xf4\x90\x80\x80\"" CMPL_END,
    CMPL "1" CMPL_END,
    CMPL "\"x\"" CMPL_END "x",
    CMPL "\"x\"" CMPL_END "{}",
    "{\"choices\":[{\"text\":\"a\"},{\"text\":\"b\"}]}",
    "{\"choices\":[{\"text\":\"a\",\"text\":\"b\"}]}",
    "{\"error\":{\"message\":\"boom\"}}",
    "{\"choices\":[{\"text\":\"a\",\"stop_reason\":null}]}",
    "{\"choices\":[{\"text\":\"a\"}],\"x_pool_meta\":{}}",
    "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}",
    "{\"created\":1.5,\"choices\":[]}",
    "{\"created\":1e3,\"choices\":[]}",
    "{\"created\":01,\"choices\":[]}",
    "{\"created\":1234567890123456789,\"choices\":[]}",
    "{\"created\":123456789012345678901234567890,\"choices\":[]}",
    "{\"created\":-,\"choices\":[]}",
    "{\"id\":\"a\",}",
    "{\"id\" \"a\"}",
    "{\"i\\u0064\":\"a\"}",
    "{\"choices\":{}}",
    "{\"choices\":[{\"text\":\"a\"}]",
    "[]",
    "",
    "nul",
    "{\"usage\":nul}",
    NULL,
};

static const char *const refused_chat[] = {
    CHAT "{\"content\":\"a\",\"tool_calls\":[]}" CHAT_END,
    CHAT "{\"content\":\"a\",\"reasoning_content\":\"b\"}" CHAT_END,
    CHAT "{\"content\":1}" CHAT_END,
    CHAT "\"x\"" CHAT_END,
    "{\"choices\":[{\"text\":\"a\"}]}",
    NULL,
};

static void test_taken(void **state)
{
    (void)state;
    for (int i = 0; taken_cmpl[i]; i++)
        if (!check_s(taken_cmpl[i], false))
            fail_msg("completion chunk %d not taken: %s", i, taken_cmpl[i]);
    for (int i = 0; taken_chat[i]; i++)
        if (!check_s(taken_chat[i], true))
            fail_msg("chat chunk %d not taken: %s", i, taken_chat[i]);
}

static void test_refused(void **state)
{
    (void)state;
    for (int i = 0; refused_cmpl[i]; i++)
        if (check_s(refused_cmpl[i], false))
            fail_msg("completion chunk %d taken: %s", i, refused_cmpl[i]);
    for (int i = 0; refused_chat[i]; i++)
        if (check_s(refused_chat[i], true))
            fail_msg("chat chunk %d taken: %s", i, refused_chat[i]);
}

/* The chunks above with bytes changed, inserted and dropped at random:
 * whatever the scanner takes, jansson takes and reads the same. */
static void test_mutations_agree_with_jansson(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ -0123456789.eEnulltrfabn/\x01\x80\xc3\xa9\xed\xf4";
    const char *const *sets[] = {taken_cmpl, taken_chat, refused_cmpl, refused_chat};
    unsigned seed = 24;
    char buf[512];
    long taken = 0;
    oai_chunk_memo m; /* and through a memo of the chunks before (oai_chunk_read) */
    oai_chunk_memo_init(&m);
    for (int round = 0; round < 4000; round++) {
        const char *const *set = sets[round % 4];
        int count = 0;
        while (set[count])
            count++;
        const char *src = set[(unsigned)rand_r(&seed) % (unsigned)count];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        mutate(buf, &n, sizeof buf, &seed, alphabet, sizeof alphabet - 1);
        bool chat = set == taken_chat || set == refused_chat;
        taken += check(buf, n, chat);
        same_read(&m, buf, n, chat);
    }
    oai_chunk_memo_free(&m);
    assert_true(taken > 100); /* the mutations did reach the accepting path */
}

/* Every byte value at every position of a text longer than the scanner's
 * 8-byte step (and at the ends of those steps): what it takes agrees with
 * jansson, and plain text is always taken. */
static void test_every_byte_at_every_position(void **state)
{
    (void)state;
    const char *pre = "{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                      "\"text\":\"";
    const char *post = "\",\"logprobs\":null,\"finish_reason\":null}]}";
    char buf[256];
    for (int len = 1; len <= 19; len += 9)
        for (int at = 0; at < len; at++)
            for (int byte = 1; byte < 256; byte++) {
                size_t n = (size_t)snprintf(buf, sizeof buf, "%s", pre);
                size_t t0 = n;
                memset(buf + n, 'a', (size_t)len);
                buf[t0 + (size_t)at] = (char)byte;
                n += (size_t)len;
                n += (size_t)snprintf(buf + n, sizeof buf - n, "%s", post);
                bool took = check(buf, n, false);
                bool plain = byte >= 0x20 && byte < 0x80 && byte != '"' && byte != '\\';
                if (plain)
                    assert_true(took);
            }
}

/* Issue 24 (fourth round): a stream of chunks that differ only in their
 * text, with now and then another shape or a broken text in between; the
 * memo reads each as the plain scan does, and takes the fast path for the
 * repeats. Texts need escapes, hold quotes that would end the string
 * early, multi-byte and invalid UTF-8, and are empty. */
static void test_memo_reads_as_scan(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "\" tok\"", "\"\"", "\"a\\\"b\"", "\"\\n\\t\\u0041\"", "\"caf\xc3\xa9\"",
        "\"\xc3\"", "\"x\",\"y\"", "\"\x01\"", "null", "\"\\\"", "\"tok\\/\"",
    };
    static const char *const around[][2] = {
        {CMPL, CMPL_END},
        {CMPL, ",\"logprobs\":null,\"finish_reason\":\"length\"}]}"},
        {"{\"choices\":[{\"finish_reason\":\"stop\",\"text\":",
         "}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}"},
        {"{\"usage\":null,\"choices\":[{\"text\":", ",\"finish_reason\":\"\"}]}"},
        {CMPL, CMPL_END " "},
        {CHAT "{\"content\":", "}" CHAT_END},
        {CHAT "{\"role\":\"assistant\",\"content\":", "}" CHAT_END},
    };
    const size_t nt = sizeof texts / sizeof *texts, na = sizeof around / sizeof *around;
    oai_chunk_memo m;
    oai_chunk_memo_init(&m);
    unsigned seed = 2404;
    char buf[512];
    for (int round = 0; round < 20000; round++) {
        size_t ai = round % 5 ? (size_t)(round / 400) % na : (unsigned)rand_r(&seed) % na;
        const char *t = texts[(unsigned)rand_r(&seed) % nt];
        int n = snprintf(buf, sizeof buf, "%s%s%s", around[ai][0], t, around[ai][1]);
        bool chat = ai >= 5;
        if (round % 7 == 0)
            chat = !chat; /* a memo of the other kind is not used */
        same_read(&m, buf, (size_t)n, chat);
    }
    /* The fast path is taken for a repeat: the same chunk with the memo's
     * bytes changed at the text is still read right. */
    int n = snprintf(buf, sizeof buf, "%s\" tok\"%s", CMPL, CMPL_END);
    assert_true(same_read(&m, buf, (size_t)n, false));
    n = snprintf(buf, sizeof buf, "%s\" other\"%s", CMPL, CMPL_END);
    assert_true(same_read(&m, buf, (size_t)n, false));
    assert_true(m.valid);
    oai_chunk_memo_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_mutations_agree_with_jansson),
        cmocka_unit_test(test_every_byte_at_every_position),
        cmocka_unit_test(test_memo_reads_as_scan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

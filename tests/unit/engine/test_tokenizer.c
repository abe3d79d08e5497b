/*
 * Tokenizer tests: Unicode tables, pre-tokenizer splits on hand-made cases,
 * llama.cpp's vocabulary test vectors (tests/data/vocab/ggml-vocab-NAME.gguf.inp/.out), the
 * stories260K reference tokenization, detokenization round trips, metadata
 * defaults/errors on in-memory GGUFs, and hostile input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "engine/unicode.h"

/* ---------------------------------------------------------------- helpers */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}



static gpe_tokenizer *load_path(const char *path)
{
    char err[256];
    gpe_gguf *g = NULL;
    if (gpe_gguf_open(path, &g, err, sizeof err) != GPE_OK) {
        print_error("%s: %s\n", path, err);
        return NULL;
    }
    gpe_tokenizer *t = gpe_tokenizer_load(g, err, sizeof err);
    if (!t)
        print_error("%s: %s\n", path, err);
    /* the tokenizer must not keep pointers into the GGUF */
    gpe_gguf_close(g);
    return t;
}

static gpe_tokenizer *load_vocab(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", GP_TEST_DATA, name);
    return load_path(path);
}

/* Tokenize into a malloc'd array (retrying with the size asked for). */
static int32_t *encode(const gpe_tokenizer *t, const char *s, size_t len, bool add_special,
                       bool parse_special, int *n_out)
{
    int cap = 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = gpe_tokenizer_encode(t, s, len, add_special, parse_special, ids, cap);
    if (n < 0 && n != INT32_MIN) {
        cap = -n;
        ids = realloc(ids, (size_t)cap * sizeof *ids);
        n = gpe_tokenizer_encode(t, s, len, add_special, parse_special, ids, cap);
    }
    *n_out = n;
    return ids;
}

/* Concatenated pieces of ids (malloc'd, NUL-terminated). */
static char *detok(const gpe_tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, at = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = gpe_tokenizer_piece(t, ids[i], out + at, cap - at - 1, false);
        if (k < 0) {
            cap = (cap + (size_t)-k) * 2;
            out = realloc(out, cap);
            k = gpe_tokenizer_piece(t, ids[i], out + at, cap - at - 1, false);
        }
        assert_true(k >= 0);
        at += (size_t)k;
    }
    out[at] = 0;
    *len = at;
    return out;
}

static void hostile_one(const char *name, char fill);

/* ---------------------------------------------------------------- unicode */

static void test_unicode(void **state)
{
    (void)state;
    assert_int_equal(gpe_ucat('a'), GPE_UCAT_L);
    assert_int_equal(gpe_ucat('7'), GPE_UCAT_N);
    assert_int_equal(gpe_ucat('$'), GPE_UCAT_S);
    assert_int_equal(gpe_ucat('!'), GPE_UCAT_P);
    assert_int_equal(gpe_ucat(0x00FC), GPE_UCAT_L);   /* ü */
    assert_int_equal(gpe_ucat(0x00BD), GPE_UCAT_N);   /* ½ */
    assert_int_equal(gpe_ucat(0x0439), GPE_UCAT_L);   /* й */
    assert_int_equal(gpe_ucat(0x6211), GPE_UCAT_L);   /* 我 */
    assert_int_equal(gpe_ucat(0x17B6), GPE_UCAT_M);   /* Khmer vowel sign */
    assert_int_equal(gpe_ucat(0x1F999), GPE_UCAT_S);  /* 🦙 */
    assert_int_equal(gpe_ucat(0x200D), GPE_UCAT_C);   /* ZWJ */
    assert_int_equal(gpe_ucat(0xFF5E), GPE_UCAT_S);   /* ～ */
    assert_int_equal(gpe_ucat(0x0378), GPE_UCAT_UNASSIGNED);
    assert_int_equal(gpe_ucat(0x110000), GPE_UCAT_UNASSIGNED);
    assert_true(gpe_uspace(' ') && gpe_uspace('\n') && gpe_uspace(0x3000) && gpe_uspace(0xA0));
    assert_false(gpe_uspace(0x1C) || gpe_uspace('a') || gpe_uspace(0x200B));

    size_t adv;
    const unsigned char ok[] = {0xF0, 0x9F, 0xA6, 0x99};
    assert_int_equal(gpe_utf8_decode(ok, 4, &adv), 0x1F999);
    assert_int_equal(adv, 4);
    assert_int_equal(gpe_utf8_decode(ok, 3, &adv), 0xFFFD);   /* truncated */
    assert_int_equal(adv, 1);
    const unsigned char cont[] = {0x80, 'a'};
    assert_int_equal(gpe_utf8_decode(cont, 2, &adv), 0xFFFD);
    assert_int_equal(adv, 1);
    const unsigned char ff[] = {0xFF};
    assert_int_equal(gpe_utf8_decode(ff, 1, &adv), 0xFFFD);
    const unsigned char big[] = {0xF5, 0x80, 0x80, 0x80};
    assert_int_equal(gpe_utf8_decode(big, 4, &adv), 0xFFFD);
    char u[4];
    assert_int_equal(gpe_utf8_encode(0x2581, u), 3);
    assert_memory_equal(u, "\xE2\x96\x81", 3);
}

/* ------------------------------------------------------ pre-tokenizer */

/* Compare the split of text by pre with the expected pieces (NULL-ended). */
static void check_split(const char *pre, const char *text, ...)
{
    size_t n;
    char *p = gpe_pretok_split(pre, text, strlen(text), &n);
    assert_non_null(p);
    va_list ap;
    va_start(ap, text);
    const char *q = p;
    size_t i = 0;
    for (const char *want; (want = va_arg(ap, const char *)) != NULL; i++) {
        if (i >= n || strcmp(q, want) != 0) {
            print_error("pre %s, text \"%s\": piece %zu is \"%s\", expected \"%s\"\n", pre, text,
                        i, i < n ? q : "(none)", want);
            fail();
        }
        q += strlen(q) + 1;
    }
    va_end(ap);
    if (i != n) {
        print_error("pre %s, text \"%s\": %zu pieces, expected %zu\n", pre, text, n, i);
        fail();
    }
    free(p);
}

static void test_split_gpt2(void **state)
{
    (void)state;
    check_split("gpt-2", "Hello world", "Hello", " world", NULL);
    check_split("gpt-2", "I'm here, it's 2024!", "I", "'m", " here", ",", " it", "'s", " 2024",
                "!", NULL);
    check_split("gpt-2", "DON'T", "DON", "'", "T", NULL);   /* case-sensitive */
    check_split("gpt-2", "hello   world  ", "hello", "  ", " world", "  ", NULL);
    check_split("gpt-2", "a\n\nb", "a", "\n", "\n", "b", NULL);
    check_split("gpt-2", "$hello 12345", "$", "hello", " 12345", NULL);
    check_split("gpt-2", " ?!x", " ?!", "x", NULL);
    check_split("gpt-2", "", NULL);
    /* unknown names use the gpt-2 split */
    check_split("no-such-pre", "I'm", "I", "'m", NULL);
    /* starcoder: digits one by one first */
    check_split("starcoder", "ab 123", "ab", " ", "1", "2", "3", NULL);
    /* falcon: punctuation runs first, then digit triples */
    check_split("falcon", "x=1234;", "x", "=", "123", "4", ";", NULL);
}

static void test_split_llama3(void **state)
{
    (void)state;
    /* contractions, case-insensitive */
    check_split("llama-bpe", "I'M don't WE'LL you'Re", "I", "'M", " don", "'t", " WE", "'LL",
                " you", "'Re", NULL);
    /* \p{N}{1,3} digit grouping */
    check_split("llama-bpe", "1234567", "123", "456", "7", NULL);
    check_split("llama-bpe", "x 12", "x", " ", "12", NULL);
    /* one non-letter/number glued before letters */
    check_split("llama-bpe", "$hello (world", "$hello", " (", "world", NULL);
    /* newlines end punctuation runs and gather with preceding white space */
    check_split("llama-bpe", "hi!\n\nthere  \n x", "hi", "!\n\n", "there", "  \n", " x", NULL);
    check_split("llama-bpe", "a  b   ", "a", " ", " b", "   ", NULL);
    check_split("llama-bpe", "\t\tz", "\t", "\tz", NULL);
    check_split("llama3", "Führer 3.14", "Führer", " ", "3", ".", "14", NULL);
}

static void test_split_qwen2(void **state)
{
    (void)state;
    /* same as llama-3 except single digits */
    check_split("qwen2", "1234567", "1", "2", "3", "4", "5", "6", "7", NULL);
    check_split("qwen2", "I'VE 42x", "I", "'VE", " ", "4", "2", "x", NULL);
    check_split("qwen2", "我想在apple工作", "我想在apple工作", NULL);
    check_split("qwen2", "ok?\r\n", "ok", "?\r\n", NULL);
}

static void test_split_deepseek(void **state)
{
    (void)state;
    check_split("deepseek-coder", "abc123 def", "abc", "1", "2", "3", " def", NULL);
    check_split("deepseek-coder", "Hi 你好", "Hi", " ", "你好", NULL);
    check_split("deepseek-llm", "Hi, 你好 42\n", "Hi", ",", " ", "你好", " ", "42", "\n", NULL);
    check_split("deepseek-llm", "x   ", "x", "   ", NULL);
}

/* ---------------------------------------------------- vocabulary vectors */

#define SEP "\n__ggml_vocab_test__\n"

/* Run one vocabulary's .inp/.out pairs; returns the number of mismatches.
 * Also checks that the pieces of each result give back the text (spm:
 * without the added leading space). */
enum { RT_NONE, RT_BPE, RT_SPM };

static int run_vocab(const char *name, int rt)
{
    char path[512];
    size_t inlen, outlen;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.inp", GP_TEST_DATA, name);
    char *inp = read_file(path, &inlen);
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.out", GP_TEST_DATA, name);
    char *out = read_file(path, &outlen);
    assert_non_null(inp);
    assert_non_null(out);
    gpe_tokenizer *t = load_vocab(name);
    assert_non_null(t);

    int cases = 0, pass = 0, roundtrip = 0;
    char *ip = inp, *op = out;
    for (;;) {
        char *sep = strstr(ip, SEP);
        if (!sep)
            break;
        size_t len = (size_t)(sep - ip);
        char *eol = strchr(op, '\n');
        assert_non_null(eol);
        *eol = 0;
        /* expected ids */
        int32_t want[1024];
        int nw = 0;
        for (char *q = op; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q)
                break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        int n;
        int32_t *got = encode(t, ip, len, false, false, &n);
        cases++;
        bool same = n == nw && memcmp(got, want, (size_t)n * sizeof *got) == 0;
        if (same) {
            pass++;
        } else {
            print_error("%s case %d \"%.*s\": got", name, cases, (int)(len > 60 ? 60 : len), ip);
            for (int i = 0; i < n && i < 40; i++)
                print_error(" %d", got[i]);
            print_error("\n   expected %s\n", op);
        }
        size_t dl;
        char *d = detok(t, got, n > 0 ? n : 0, &dl);
        const char *cmp = d;
        bool spm = rt == RT_SPM;
        if (spm && dl > 0 && d[0] == ' ' && (len == 0 || ip[0] != ' ' || dl == len + 1)) {
            cmp++;
            dl--;
        }
        if (rt == RT_NONE || (dl == len && memcmp(cmp, ip, len) == 0))
            roundtrip++;
        else
            print_error("%s case %d: pieces give \"%s\"\n", name, cases, d);
        free(d);
        free(got);
        ip = sep + strlen(SEP);
        op = eol + 1;
    }
    printf("vocab %-15s %d/%d ids identical, %d/%d round trips%s\n", name, pass, cases,
           roundtrip, cases, rt == RT_NONE ? " (not checked: lowercasing)" : "");
    gpe_tokenizer_free(t);
    free(inp);
    free(out);
    assert_true(cases > 0);
    return (cases - pass) + (cases - roundtrip);
}

#define VOCAB_TEST(fn, name, rt)                  \
    static void fn(void **state)                  \
    {                                             \
        (void)state;                              \
        assert_int_equal(run_vocab(name, rt), 0); \
    }

VOCAB_TEST(test_vocab_llama_spm, "llama-spm", RT_SPM)
VOCAB_TEST(test_vocab_phi3, "phi-3", RT_SPM)
VOCAB_TEST(test_vocab_gpt2, "gpt-2", RT_BPE)
VOCAB_TEST(test_vocab_deepseek_coder, "deepseek-coder", RT_BPE)
VOCAB_TEST(test_vocab_deepseek_llm, "deepseek-llm", RT_BPE)
VOCAB_TEST(test_vocab_falcon, "falcon", RT_BPE)
VOCAB_TEST(test_vocab_mpt, "mpt", RT_BPE)
VOCAB_TEST(test_vocab_refact, "refact", RT_BPE)
VOCAB_TEST(test_vocab_starcoder, "starcoder", RT_BPE)
VOCAB_TEST(test_vocab_bert_bge, "bert-bge", RT_NONE)

static void test_vocab_meta(void **state)
{
    (void)state;
    gpe_tokenizer *t = load_vocab("llama-spm");
    assert_non_null(t);
    assert_string_equal(gpe_tokenizer_kind(t), "llama");
    assert_int_equal(gpe_tokenizer_n_vocab(t), 32000);
    assert_int_equal(gpe_tokenizer_bos(t), 1);
    assert_int_equal(gpe_tokenizer_eos(t), 2);
    assert_true(gpe_tokenizer_add_bos(t));
    assert_false(gpe_tokenizer_add_eos(t));
    assert_true(gpe_tokenizer_is_eog(t, 2));
    assert_false(gpe_tokenizer_is_eog(t, 1));
    size_t len;
    assert_string_equal(gpe_tokenizer_token_text(t, 1, &len), "<s>");
    assert_int_equal(len, 3);
    assert_null(gpe_tokenizer_token_text(t, 32000, NULL));
    assert_null(gpe_tokenizer_warning(t));
    /* control tokens render only when asked */
    char buf[16];
    assert_int_equal(gpe_tokenizer_piece(t, 1, buf, sizeof buf, false), 0);
    assert_int_equal(gpe_tokenizer_piece(t, 1, buf, sizeof buf, true), 3);
    assert_int_equal(gpe_tokenizer_piece(t, 1, buf, 2, true), -3);
    assert_int_equal(gpe_tokenizer_piece(t, -5, buf, sizeof buf, true), 0);
    /* "<s>" is text unless parse_special */
    int n;
    int32_t *ids = encode(t, "<s>hi", 5, false, true, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[0], 1);
    free(ids);
    ids = encode(t, "<s>hi", 5, false, false, &n);
    assert_true(n >= 2 && ids[0] != 1 && ids[1] != 1);
    free(ids);
    /* add_special: BOS first */
    ids = encode(t, "hi", 2, true, false, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[0], 1);
    free(ids);
    /* too small a buffer: -(needed), first max ids written */
    int32_t two[2];
    int need = gpe_tokenizer_encode(t, "Hello world again", 17, true, false, two, 2);
    assert_true(need < -2);
    assert_int_equal(two[0], 1);
    assert_int_equal(gpe_tokenizer_encode(t, "", 0, true, false, two, 2), 1);
    assert_int_equal(gpe_tokenizer_encode(t, "", 0, false, false, two, 2), 0);
    gpe_tokenizer_free(t);

    t = load_vocab("phi-3");
    assert_non_null(t);
    assert_int_equal(gpe_tokenizer_eos(t), 32000);
    assert_true(gpe_tokenizer_is_eog(t, 32007));   /* <|end|> */
    assert_true(gpe_tokenizer_is_eog(t, 32000));   /* <|endoftext|> */
    /* specials with parse_special; phi-3 strips white space after <|end|> */
    const char *chat = "<|user|>\nHi<|end|>\n<|assistant|>";
    ids = encode(t, chat, strlen(chat), false, true, &n);
    assert_true(n >= 4);
    assert_int_equal(ids[0], 32010);
    assert_int_equal(ids[n - 1], 32001);
    assert_int_equal(ids[n - 2], 32007);
    free(ids);
    gpe_tokenizer_free(t);

    t = load_vocab("gpt-2");
    assert_non_null(t);
    assert_string_equal(gpe_tokenizer_kind(t), "gpt2");
    assert_string_equal(gpe_tokenizer_pre(t), "gpt-2");
    assert_false(gpe_tokenizer_add_bos(t));   /* bpe default */
    assert_true(gpe_tokenizer_is_eog(t, 50256));
    ids = encode(t, "<|endoftext|>", 13, false, true, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 50256);
    free(ids);
    ids = encode(t, "<|endoftext|>", 13, false, false, &n);
    assert_true(n > 1);
    free(ids);
    gpe_tokenizer_free(t);
}

static void test_vocab_meta_bert(void **state)
{
    (void)state;
    gpe_tokenizer *t = load_vocab("bert-bge");
    assert_non_null(t);
    assert_string_equal(gpe_tokenizer_kind(t), "bert");
    int n;
    int32_t *ids = encode(t, "Hello World", 11, true, false, &n);
    assert_int_equal(n, 4);   /* [CLS] hello world [SEP] */
    assert_int_equal(ids[0], 101);
    assert_int_equal(ids[3], 102);
    char piece[16];
    assert_int_equal(gpe_tokenizer_piece(t, ids[1], piece, sizeof piece, false), 6);
    assert_memory_equal(piece, " hello", 6);
    free(ids);
    ids = encode(t, "[CLS] x [MASK]", 14, false, true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 101);
    assert_int_equal(ids[2], 103);
    free(ids);
    gpe_tokenizer_free(t);
#ifndef GPUPOOL_SANITIZED
    hostile_one("bert-bge", 'a');
#endif
}

/* -------------------------------------------------------- stories260K */

static void test_stories(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(GP_TEST_DATA "/stories260K.tokenize.json", 0, &jerr);
    assert_non_null(root);
    char path[512];
    snprintf(path, sizeof path, "%s/../../models/stories260K.gguf", GP_TEST_DATA);
    gpe_tokenizer *t = load_path(path);
    assert_non_null(t);
    json_t *cases = json_object_get(root, "cases");
    size_t i, total = 0, pass = 0, total_pieces = 0, pass_pieces = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *hex = json_string_value(json_object_get(c, "text_hex"));
        size_t len = strlen(hex) / 2;
        char *text = malloc(len + 1);
        for (size_t k = 0; k < len; k++) {
            unsigned v;
            sscanf(hex + 2 * k, "%2x", &v);
            text[k] = (char)v;
        }
        for (int bos = 0; bos < 2; bos++) {
            json_t *want = json_object_get(c, bos ? "ids_with_bos" : "ids_no_bos");
            int n;
            int32_t *got = encode(t, text, len, bos, false, &n);
            bool same = n == (int)json_array_size(want);
            for (int k = 0; same && k < n; k++)
                same = got[k] == json_integer_value(json_array_get(want, (size_t)k));
            total++;
            if (same)
                pass++;
            else
                print_error("stories case %zu (bos %d) differs\n", i, bos);
            free(got);
        }
        /* pieces (hex) of ids_no_bos */
        json_t *ids = json_object_get(c, "ids_no_bos"), *ph = json_object_get(c, "pieces_hex");
        assert_int_equal(json_array_size(ids), json_array_size(ph));
        for (size_t k = 0; k < json_array_size(ids); k++) {
            char piece[64], hexp[129];
            int n = gpe_tokenizer_piece(t, (int32_t)json_integer_value(json_array_get(ids, k)),
                                        piece, sizeof piece, false);
            assert_true(n >= 0 && n <= 64);
            for (int j = 0; j < n; j++)
                snprintf(hexp + 2 * j, 3, "%02x", (unsigned char)piece[j]);
            hexp[2 * n] = 0;
            total_pieces++;
            if (strcmp(hexp, json_string_value(json_array_get(ph, k))) == 0)
                pass_pieces++;
            else
                print_error("stories case %zu piece %zu: %s\n", i, k, hexp);
        }
        free(text);
    }
    printf("stories260K: %zu/%zu identical, pieces %zu/%zu\n", pass, total, pass_pieces,
           total_pieces);
    assert_int_equal(pass_pieces, total_pieces);
    assert_int_equal(pass, total);
    assert_true(total >= 22);
    gpe_tokenizer_free(t);
    json_decref(root);
}

/* --------------------------------------------------- in-memory GGUFs */

typedef struct gbuf { unsigned char *p; size_t n, cap; } gbuf;

static void put(gbuf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gbuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(gbuf *b, const char *k, const char *v)
{
    put_str(b, k);
    put_u32(b, GPE_GGUF_STRING);
    put_str(b, v);
}
static void kv_strs(gbuf *b, const char *k, const char *const *v, size_t n)
{
    put_str(b, k);
    put_u32(b, GPE_GGUF_ARRAY);
    put_u32(b, GPE_GGUF_STRING);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++)
        put_str(b, v[i]);
}
static void kv_i32s(gbuf *b, const char *k, const int32_t *v, size_t n)
{
    put_str(b, k);
    put_u32(b, GPE_GGUF_ARRAY);
    put_u32(b, GPE_GGUF_I32);
    put_u64(b, n);
    put(b, v, n * 4);
}
static void kv_bool(gbuf *b, const char *k, bool v)
{
    put_str(b, k);
    put_u32(b, GPE_GGUF_BOOL);
    unsigned char c = v;
    put(b, &c, 1);
}

static void gguf_begin(gbuf *b, uint64_t n_kv)
{
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, 0);
    put_u64(b, n_kv);
}

static gpe_tokenizer *load_buf(gbuf *b, char *err, size_t errlen)
{
    gpe_gguf *g = NULL;
    char gerr[256];
    if (gpe_gguf_open_buffer(b->p, b->n, &g, gerr, sizeof gerr) != GPE_OK) {
        print_error("gguf: %s\n", gerr);
        return NULL;
    }
    gpe_tokenizer *t = gpe_tokenizer_load(g, err, errlen);
    gpe_gguf_close(g);
    return t;
}

static void test_synthetic(void **state)
{
    (void)state;
    gbuf b = {0};
    char err[256] = "";
    static const char *const toks[] = {"a", "b", "ab", "Ġ", "Ġab"};
    static const char *const merges[] = {"a b", "Ġ ab"};

    /* unknown model: refused with a clear message */
    gguf_begin(&b, 2);
    kv_str(&b, "tokenizer.ggml.model", "t5");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    assert_null(load_buf(&b, err, sizeof err));
    assert_non_null(strstr(err, "unsupported tokenizer.ggml.model 't5'"));

    /* no tokens */
    gguf_begin(&b, 1);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    assert_null(load_buf(&b, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer.ggml.tokens"));

    /* gpt2 without merges */
    gguf_begin(&b, 2);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    assert_null(load_buf(&b, err, sizeof err));
    assert_non_null(strstr(err, "merges"));

    /* token_type of the wrong length */
    int32_t types[3] = {1, 1, 1};
    gguf_begin(&b, 3);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, 3);
    assert_null(load_buf(&b, err, sizeof err));
    assert_non_null(strstr(err, "token_type"));

    /* unknown pre: gpt-2 split with a warning; llama-bpe: BOS by default */
    gguf_begin(&b, 4);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "mystery-tokenizer");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&b, "tokenizer.ggml.merges", merges, 2);
    gpe_tokenizer *t = load_buf(&b, err, sizeof err);
    assert_non_null(t);
    assert_non_null(gpe_tokenizer_warning(t));
    assert_non_null(strstr(gpe_tokenizer_warning(t), "mystery-tokenizer"));
    assert_string_equal(gpe_tokenizer_pre(t), "gpt-2");
    assert_false(gpe_tokenizer_add_bos(t));
    int32_t ids[8];
    assert_int_equal(gpe_tokenizer_encode(t, "ab ab", 5, true, false, ids, 8), 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 4);
    char piece[8];
    assert_int_equal(gpe_tokenizer_piece(t, 4, piece, sizeof piece, false), 3);
    assert_memory_equal(piece, " ab", 3);
    gpe_tokenizer_free(t);

    /* add_bos_token / add_eos_token override the defaults; the default BOS
     * id (11 for bpe) does not exist here, so nothing is added */
    gguf_begin(&b, 6);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "llama-bpe");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&b, "tokenizer.ggml.merges", merges, 2);
    kv_bool(&b, "tokenizer.ggml.add_eos_token", true);
    kv_bool(&b, "tokenizer.ggml.add_bos_token", true);
    t = load_buf(&b, err, sizeof err);
    assert_non_null(t);
    assert_null(gpe_tokenizer_warning(t));
    assert_int_equal(gpe_tokenizer_bos(t), -1);
    assert_false(gpe_tokenizer_add_bos(t));
    assert_int_equal(gpe_tokenizer_encode(t, "ab", 2, true, false, ids, 8), 1);
    gpe_tokenizer_free(t);

    /* llama-bpe adds BOS by default and keeps whole-token pieces unmerged;
     * other bpe pre-tokenizers add nothing by default */
    for (int k = 0; k < 2; k++) {
        gguf_begin(&b, 5);
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_str(&b, "tokenizer.ggml.pre", k ? "llama-bpe" : "dbrx");
        kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
        kv_strs(&b, "tokenizer.ggml.merges", merges, 2);
        put_str(&b, "tokenizer.ggml.bos_token_id");
        put_u32(&b, GPE_GGUF_U32);
        put_u32(&b, 3);
        t = load_buf(&b, err, sizeof err);
        assert_non_null(t);
        assert_int_equal(gpe_tokenizer_add_bos(t), k == 1);
        int n = gpe_tokenizer_encode(t, "ab", 2, true, false, ids, 8);
        assert_int_equal(n, k ? 2 : 1);
        assert_int_equal(ids[n - 1], 2);
        if (k)
            assert_int_equal(ids[0], 3);
        gpe_tokenizer_free(t);
    }

    /* ignore_merges (llama-bpe only): a piece that is a token stays whole */
    static const char *const itoks[] = {"a", "b", "c", "bc", "abc"};
    static const char *const imerges[] = {"b c"};
    for (int k = 0; k < 2; k++) {
        gguf_begin(&b, 4);
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_str(&b, "tokenizer.ggml.pre", k ? "llama-bpe" : "gpt-2");
        kv_strs(&b, "tokenizer.ggml.tokens", itoks, 5);
        kv_strs(&b, "tokenizer.ggml.merges", imerges, 1);
        t = load_buf(&b, err, sizeof err);
        assert_non_null(t);
        int n = gpe_tokenizer_encode(t, "abc", 3, false, false, ids, 8);
        if (k) {
            assert_int_equal(n, 1);
            assert_int_equal(ids[0], 4);
        } else {
            assert_int_equal(n, 2);
            assert_int_equal(ids[0], 0);
            assert_int_equal(ids[1], 3);
        }
        gpe_tokenizer_free(t);
    }

    /* spm without byte tokens or scores: unknown characters become <unk>
     * when there is one (id 0 by default) */
    static const char *const stoks[] = {"<unk>", "<s>", "</s>", "▁", "a", "▁a"};
    int32_t stypes[6] = {2, 3, 3, 1, 1, 1};
    gguf_begin(&b, 3);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", stoks, 6);
    kv_i32s(&b, "tokenizer.ggml.token_type", stypes, 6);
    t = load_buf(&b, err, sizeof err);
    assert_non_null(t);
    assert_int_equal(gpe_tokenizer_encode(t, "a z", 3, true, false, ids, 8), 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], 3);
    assert_int_equal(ids[3], 0);
    gpe_tokenizer_free(t);
    free(b.p);
}

/* ------------------------------------------------- chunking is exact */

/* Long texts are cut into chunks merged separately; the ids must be those
 * of one global merge run. Texts: random mixes of the vocabulary test
 * strings, words, white-space runs and random code points. */
static void chunk_check(const char *name)
{
    gpe_tokenizer *t = load_vocab(name);
    assert_non_null(t);
    static const char *const parts[] = {
        "Hello", " world", "  ", "\n", "\n\n", "\t", "3333", " 3.14", "Führer", "нещо",
        " на", "我想在apple工作", "\xF0\x9F\xA6\x99", "\xF0\x9F\x98\xB6\xE2\x80\x8D",
        "'ll", "!!!", "......", "```", "    ", "Cửa Việt", "កាន់តែ", " discards", "aaaa",
        "\xE2\x96\x81", "<0x0A>", "<s>", "<|endoftext|>", "\xFF", "\x80\x80", "\xC3",
    };
    uint32_t x = 2024;
    for (int round = 0; round < 6; round++) {
        size_t len = 0, cap = 40000;
        char *text = malloc(cap + 64);
        while (len < cap) {
            x = x * 1103515245u + 12345u;
            const char *p = parts[(x >> 16) % (sizeof parts / sizeof parts[0])];
            int rep = 1 + (int)((x >> 8) % (8 * round + 1));
            for (int r = 0; r < rep && len < cap; r++) {
                memcpy(text + len, p, strlen(p));
                len += strlen(p);
            }
        }
        int n1, n2;
        gpe_tokenizer_set_chunking(t, true);
        int32_t *a = encode(t, text, len, true, false, &n1);
        gpe_tokenizer_set_chunking(t, false);
        int32_t *b = encode(t, text, len, true, false, &n2);
        assert_true(n1 > 0);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, (size_t)n1 * sizeof *a);
        free(a);
        free(b);
        free(text);
    }
    gpe_tokenizer_free(t);
}

static void test_chunking_exact(void **state)
{
    (void)state;
    chunk_check("llama-spm");
    chunk_check("phi-3");
    chunk_check("gpt-2");
    chunk_check("deepseek-llm");
    chunk_check("mpt");
}

/* ------------------------------------------------------------ hostile */

/* Never crash, ids always in range: invalid UTF-8, NUL bytes, 1 MB inputs
 * (mixed text, a run of one character, random bytes). Speed is measured by
 * bench/bench_tokenizer, not here. */
static void check_ids(const gpe_tokenizer *t, const char *text, size_t len, bool special)
{
    int n;
    int32_t *ids = encode(t, text, len, true, special, &n);
    assert_true(n > 0);
    for (int i = 0; i < n; i++)
        assert_true(ids[i] >= 0 && ids[i] < gpe_tokenizer_n_vocab(t));
    free(ids);
}

static void hostile_one(const char *name, char fill)
{
    gpe_tokenizer *t = load_vocab(name);
    assert_non_null(t);
    static const char bad[] = "a\xFF\xFE\x80\xC0\x80 b\0c\xE2\x96 \xF4\x90\x80\x80\xED\xA0\x80z\xF0";
    check_ids(t, bad, sizeof bad - 1, true);
    check_ids(t, bad, sizeof bad - 1, false);
    check_ids(t, "\0\0\0", 3, false);

    size_t len = 1 << 20;
    char *big = malloc(len);
    static const char sample[] =
        "Once upon a time, there was a little girl named Lily. She loved 3.14159 and "
        "\xF0\x9F\xA6\x99 llamas; \"we'll go\" \t\n  nещо 我想在apple工作 <|endoftext|> ";
    for (size_t i = 0; i < len; i++)
        big[i] = sample[i % (sizeof sample - 1)];
    check_ids(t, big, len, true);
    memset(big, fill, len);
    check_ids(t, big, len, false);
    uint32_t x = 12345;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        big[i] = (char)(x >> 16);
    }
    check_ids(t, big, len, true);
    free(big);
    gpe_tokenizer_free(t);
}

static void test_hostile_spm(void **state)
{
    (void)state;
    hostile_one("llama-spm", ' ');
}

static void test_hostile_bpe(void **state)
{
    (void)state;
    hostile_one("gpt-2", 'a');
#ifndef GPUPOOL_SANITIZED   /* keep the sanitizer run short: one bpe vocabulary */
    hostile_one("deepseek-llm", '\n');
    hostile_one("mpt", '!');
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unicode),
        cmocka_unit_test(test_split_gpt2),
        cmocka_unit_test(test_split_llama3),
        cmocka_unit_test(test_split_qwen2),
        cmocka_unit_test(test_split_deepseek),
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_phi3),
        cmocka_unit_test(test_vocab_gpt2),
        cmocka_unit_test(test_vocab_deepseek_coder),
        cmocka_unit_test(test_vocab_deepseek_llm),
        cmocka_unit_test(test_vocab_falcon),
        cmocka_unit_test(test_vocab_mpt),
        cmocka_unit_test(test_vocab_refact),
        cmocka_unit_test(test_vocab_starcoder),
        cmocka_unit_test(test_vocab_bert_bge),
        cmocka_unit_test(test_vocab_meta),
        cmocka_unit_test(test_vocab_meta_bert),
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_chunking_exact),
        cmocka_unit_test(test_hostile_spm),
        cmocka_unit_test(test_hostile_bpe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

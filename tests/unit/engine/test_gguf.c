/*
 * GGUF reader: real files load with the expected tables; hostile files built
 * here (truncations, absurd counts, bad lengths, offsets, dims, types,
 * magic, version, ...) give a clear error, never a crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/gguf.h"

/* ------------------------------------------------------------ real files */

typedef struct file_case {
    const char *path;   /* relative to GP_SOURCE_DIR; "@name": GP_MODEL_DATA/name (generated) */
    int64_t n_kv, n_tensors;
} file_case;

/* Counts cross-checked with an independent Python reading of the files. */
static const file_case k_files[] = {
    {"models/stories260K.gguf", 19, 48},
    {"@tiny-random-f16.gguf", 23, 21},
    {"@tiny-random-q4_0.gguf", 24, 21},
    {"@tiny-random-q4_k_m.gguf", 24, 21},
    {"@tiny-random-q5_k_m.gguf", 24, 21},
    {"@tiny-random-q6_k.gguf", 24, 21},
    {"@tiny-random-q8_0.gguf", 24, 21},
    {"tests/data/vocab/ggml-vocab-bert-bge.gguf", 20, 0},
    {"tests/data/vocab/ggml-vocab-deepseek-coder.gguf", 25, 0},
    {"tests/data/vocab/ggml-vocab-deepseek-llm.gguf", 23, 0},
    {"tests/data/vocab/ggml-vocab-falcon.gguf", 18, 0},
    {"tests/data/vocab/ggml-vocab-gpt-2.gguf", 16, 0},
    {"tests/data/vocab/ggml-vocab-llama-spm.gguf", 22, 0},
    {"tests/data/vocab/ggml-vocab-mpt.gguf", 17, 0},
    {"tests/data/vocab/ggml-vocab-phi-3.gguf", 26, 0},
    {"tests/data/vocab/ggml-vocab-refact.gguf", 18, 0},
    {"tests/data/vocab/ggml-vocab-starcoder.gguf", 19, 0},
};

static gpe_gguf *open_src(const char *rel)
{
    char path[1024], err[512] = "";
    if (rel[0] == '@')
        snprintf(path, sizeof path, "%s/%s", GP_MODEL_DATA, rel + 1);
    else
        snprintf(path, sizeof path, "%s/%s", GP_SOURCE_DIR, rel);
    gpe_gguf *g = NULL;
    gpe_status st = gpe_gguf_open(path, &g, err, sizeof err);
    if (st != GPE_OK)
        fail_msg("%s: %s", rel, err);
    return g;
}

static void test_real_files(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_files / sizeof k_files[0]; i++) {
        gpe_gguf *g = open_src(k_files[i].path);
        assert_int_equal(gpe_gguf_version(g), 3);
        assert_int_equal(gpe_gguf_n_kv(g), k_files[i].n_kv);
        assert_int_equal(gpe_gguf_n_tensors(g), k_files[i].n_tensors);
        assert_int_equal(gpe_gguf_alignment(g), 32);
        assert_non_null(gpe_gguf_get_str(g, "general.architecture", NULL));
        /* every key is findable by its own name; every tensor too */
        for (int64_t k = 0; k < gpe_gguf_n_kv(g); k++)
            assert_int_equal(gpe_gguf_find_key(g, gpe_gguf_key(g, k)), k);
        uint64_t total = 0;
        for (int64_t t = 0; t < gpe_gguf_n_tensors(g); t++) {
            const gpe_gguf_tensor *te = gpe_gguf_tensor_at(g, t);
            assert_int_equal(gpe_gguf_find_tensor(g, te->name), t);
            assert_true(te->offset % 32 == 0);
            assert_true(te->offset + te->nbytes <= gpe_gguf_file_size(g));
            assert_true(gpe_type_supported(te->type));
            total += te->nbytes;
        }
        assert_true(total <= gpe_gguf_file_size(g));
        /* tokens array present everywhere */
        int64_t ti = gpe_gguf_find_key(g, "tokenizer.ggml.tokens");
        gpe_gguf_vtype et;
        uint64_t n;
        assert_true(gpe_gguf_arr_info(g, ti, &et, &n));
        assert_int_equal(et, GPE_GGUF_STRING);
        assert_true(n > 0);
        assert_non_null(gpe_gguf_arr_str(g, ti, n - 1, NULL));
        assert_null(gpe_gguf_arr_str(g, ti, n, NULL));
        gpe_gguf_close(g);
    }
}

static void test_stories_metadata(void **state)
{
    (void)state;
    gpe_gguf *g = open_src("models/stories260K.gguf");
    uint32_t u;
    int32_t i32;
    int64_t i64;
    float f;
    assert_true(gpe_gguf_get_u32(g, "llama.embedding_length", &u));
    assert_int_equal(u, 64);
    assert_true(gpe_gguf_get_u32(g, "llama.block_count", &u));
    assert_int_equal(u, 5);
    assert_true(gpe_gguf_get_i32(g, "llama.context_length", &i32));
    assert_int_equal(i32, 512);
    assert_true(gpe_gguf_get_i64(g, "llama.attention.head_count", &i64));
    assert_int_equal(i64, 8);
    assert_true(gpe_gguf_get_u32(g, "llama.attention.head_count_kv", &u));
    assert_int_equal(u, 4);
    assert_true(gpe_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
    assert_true(f > 9.99e-6f && f < 1.001e-5f);
    /* u32 0xFFFFFFFF does not fit an i32 */
    assert_true(gpe_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &u));
    assert_int_equal(u, 0xFFFFFFFFu);
    assert_false(gpe_gguf_get_i32(g, "tokenizer.ggml.padding_token_id", &i32));
    assert_false(gpe_gguf_get_u32(g, "no.such.key", &u));
    assert_false(gpe_gguf_get_u32(g, "general.architecture", &u));   /* a string */
    assert_string_equal(gpe_gguf_get_str(g, "tokenizer.ggml.model", NULL), "llama");

    int64_t ti = gpe_gguf_find_key(g, "tokenizer.ggml.tokens");
    size_t len;
    assert_string_equal(gpe_gguf_arr_str(g, ti, 1, &len), "<s>");
    assert_int_equal(len, 3);
    assert_string_equal(gpe_gguf_arr_str(g, ti, 3, NULL), "<0x00>");
    int64_t tt = gpe_gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t v;
    assert_true(gpe_gguf_arr_i64(g, tt, 0, &v));
    assert_int_equal(v, 2);
    assert_true(gpe_gguf_arr_i64(g, tt, 1, &v));
    assert_int_equal(v, 3);
    assert_null(gpe_gguf_arr_str(g, tt, 0, NULL));
    assert_non_null(gpe_gguf_arr_data(g, tt));

    const gpe_gguf_tensor *te = gpe_gguf_tensor_get(g, "token_embd.weight");
    assert_non_null(te);
    assert_int_equal(te->type, GPE_TYPE_F32);
    assert_int_equal(te->n_dims, 2);
    assert_int_equal(te->ne[0], 64);
    assert_int_equal(te->ne[1], 512);
    assert_int_equal(te->n_elements, 64 * 512);
    assert_int_equal(te->nbytes, 64 * 512 * 4);
    assert_ptr_equal(te->data, (const uint8_t *)gpe_gguf_tensor_at(g, 0)->data);
    te = gpe_gguf_tensor_get(g, "output_norm.weight");
    assert_non_null(te);
    assert_int_equal(te->n_dims, 1);
    assert_int_equal(te->ne[1], 1);
    assert_non_null(gpe_gguf_tensor_get(g, "blk.4.ffn_down.weight"));
    assert_null(gpe_gguf_tensor_get(g, "blk.5.ffn_down.weight"));

    char buf[256];
    gpe_gguf_kv_render(g, gpe_gguf_find_key(g, "llama.block_count"), buf, sizeof buf, 4);
    assert_string_equal(buf, "5");
    gpe_gguf_kv_render(g, ti, buf, sizeof buf, 3);
    assert_string_equal(buf, "[\"<unk>\", \"<s>\", \"</s>\", ... (512 items)]");
    gpe_gguf_kv_render(g, ti, buf, 10, 3);   /* truncation stays terminated */
    assert_int_equal(strlen(buf), 9);
    gpe_gguf_close(g);
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[512] = "";
    gpe_gguf *g = (gpe_gguf *)1;
    assert_int_equal(gpe_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err), GPE_ERR_IO);
    assert_null(g);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(gpe_gguf_open(GP_SOURCE_DIR, &g, err, sizeof err), GPE_ERR_IO);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/SOURCES.md", GP_SOURCE_DIR);
    assert_int_equal(gpe_gguf_open(path, &g, err, sizeof err), GPE_ERR_FORMAT);
    assert_non_null(strstr(err, "bad magic"));
}

/* --------------------------------------------------------- built in memory */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static void w_bytes(wbuf *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void w_u32(wbuf *b, uint32_t v) { w_bytes(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_bytes(b, &v, 8); }
static void w_str(wbuf *b, const char *s)
{
    w_u64(b, strlen(s));
    w_bytes(b, s, strlen(s));
}

/* Offsets of interesting fields in the built file. */
typedef struct layout {
    size_t n_tensors, n_kv, key0_len, align_type, align_val, arr_type, arr_len, t0_ndims,
        t0_ne0, t0_type, t0_off, t1_off, t1_name, data;
} layout;

/* A small valid v3 file: 9 metadata entries, 2 tensors (F32 [4,2] and Q8_0
 * [32]); the file ends exactly at the end of the last tensor. */
static wbuf build(layout *L)
{
    wbuf b = {0};
    w_bytes(&b, "GGUF", 4);
    w_u32(&b, 3);
    L->n_tensors = b.len;
    w_u64(&b, 2);
    L->n_kv = b.len;
    w_u64(&b, 9);
    L->key0_len = b.len;
    w_str(&b, "general.architecture");
    w_u32(&b, GPE_GGUF_STRING);
    w_str(&b, "llama");
    w_str(&b, "general.alignment");
    L->align_type = b.len;
    w_u32(&b, GPE_GGUF_U32);
    L->align_val = b.len;
    w_u32(&b, 32);
    w_str(&b, "t.u32");
    w_u32(&b, GPE_GGUF_U32);
    w_u32(&b, 7);
    w_str(&b, "t.i32");
    w_u32(&b, GPE_GGUF_I32);
    w_u32(&b, (uint32_t)-3);
    w_str(&b, "t.f32");
    w_u32(&b, GPE_GGUF_F32);
    float f = 1.5f;
    w_bytes(&b, &f, 4);
    w_str(&b, "t.bool");
    w_u32(&b, GPE_GGUF_BOOL);
    w_bytes(&b, "\1", 1);
    w_str(&b, "t.u64");
    w_u32(&b, GPE_GGUF_U64);
    w_u64(&b, 1ull << 40);
    w_str(&b, "t.tokens");
    w_u32(&b, GPE_GGUF_ARRAY);
    L->arr_type = b.len;
    w_u32(&b, GPE_GGUF_STRING);
    L->arr_len = b.len;
    w_u64(&b, 3);
    w_str(&b, "a");
    w_str(&b, "bc");
    w_str(&b, "");
    w_str(&b, "t.scores");
    w_u32(&b, GPE_GGUF_ARRAY);
    w_u32(&b, GPE_GGUF_F32);
    w_u64(&b, 2);
    float sc[2] = {0.5f, -1.0f};
    w_bytes(&b, sc, 8);
    /* tensors */
    w_str(&b, "t0");
    L->t0_ndims = b.len;
    w_u32(&b, 2);
    L->t0_ne0 = b.len;
    w_u64(&b, 4);
    w_u64(&b, 2);
    L->t0_type = b.len;
    w_u32(&b, GPE_TYPE_F32);
    L->t0_off = b.len;
    w_u64(&b, 0);
    L->t1_name = b.len;
    w_str(&b, "t1");
    w_u32(&b, 1);
    w_u64(&b, 32);
    w_u32(&b, GPE_TYPE_Q8_0);
    L->t1_off = b.len;
    w_u64(&b, 32);
    while (b.len % 32)
        w_bytes(&b, "\0", 1);
    L->data = b.len;
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        w_bytes(&b, &v, 4);
    }
    uint8_t blk[34];
    for (int i = 0; i < 34; i++)
        blk[i] = (uint8_t)i;
    w_bytes(&b, blk, 34);
    return b;
}

/* Open a private exact-size copy (so ASan sees any over-read). */
static gpe_status open_copy(const uint8_t *p, size_t n, char *err, size_t errlen, gpe_gguf **out)
{
    uint8_t *c = malloc(n ? n : 1);
    assert_non_null(c);
    if (n)
        memcpy(c, p, n);
    gpe_gguf *g = NULL;
    gpe_status st = gpe_gguf_open_buffer(c, n, &g, err, errlen);
    if (st == GPE_OK) {
        /* walk everything while the buffer is alive */
        for (int64_t i = 0; i < gpe_gguf_n_kv(g); i++) {
            char buf[128];
            gpe_gguf_kv_render(g, i, buf, sizeof buf, 4);
        }
        for (int64_t i = 0; i < gpe_gguf_n_tensors(g); i++) {
            const gpe_gguf_tensor *t = gpe_gguf_tensor_at(g, i);
            volatile uint8_t s = 0;
            for (uint64_t k = 0; k < t->nbytes; k++)
                s ^= ((const uint8_t *)t->data)[k];
            (void)s;
        }
    }
    if (out && st == GPE_OK)
        *out = g;
    else
        gpe_gguf_close(g);
    if (!(out && st == GPE_OK))
        free(c);
    return st;
}

static void test_built_valid(void **state)
{
    (void)state;
    layout L;
    wbuf b = build(&L);
    char err[512] = "";
    gpe_gguf *g = NULL;
    assert_int_equal(gpe_gguf_open_buffer(b.p, b.len, &g, err, sizeof err), GPE_OK);
    assert_int_equal(gpe_gguf_n_kv(g), 9);
    assert_int_equal(gpe_gguf_n_tensors(g), 2);
    assert_int_equal(gpe_gguf_data_offset(g), L.data);
    uint32_t u;
    int32_t i;
    int64_t i64;
    uint64_t u64;
    float f;
    bool bo;
    assert_true(gpe_gguf_get_u32(g, "t.u32", &u));
    assert_int_equal(u, 7);
    assert_true(gpe_gguf_get_i32(g, "t.i32", &i));
    assert_int_equal(i, -3);
    assert_false(gpe_gguf_get_u32(g, "t.i32", &u));    /* negative */
    assert_false(gpe_gguf_get_u64(g, "t.i32", &u64));
    assert_true(gpe_gguf_get_i64(g, "t.u32", &i64));
    assert_int_equal(i64, 7);
    assert_true(gpe_gguf_get_u64(g, "t.u64", &u64));
    assert_int_equal(u64, 1ull << 40);
    assert_false(gpe_gguf_get_u32(g, "t.u64", &u));    /* too big */
    assert_true(gpe_gguf_get_f32(g, "t.f32", &f));
    assert_true(f == 1.5f);
    assert_false(gpe_gguf_get_i64(g, "t.f32", &i64));
    assert_true(gpe_gguf_get_f32(g, "t.u32", &f));
    assert_true(f == 7.0f);
    assert_true(gpe_gguf_get_bool(g, "t.bool", &bo));
    assert_true(bo);
    assert_false(gpe_gguf_get_bool(g, "t.u32", &bo));
    assert_int_equal(gpe_gguf_kv_type(g, gpe_gguf_find_key(g, "t.bool")), GPE_GGUF_BOOL);
    int64_t k = gpe_gguf_find_key(g, "t.tokens");
    size_t len = 99;
    assert_string_equal(gpe_gguf_arr_str(g, k, 1, &len), "bc");
    assert_int_equal(len, 2);
    assert_string_equal(gpe_gguf_arr_str(g, k, 2, &len), "");
    assert_int_equal(len, 0);
    k = gpe_gguf_find_key(g, "t.scores");
    assert_true(gpe_gguf_arr_f32(g, k, 1, &f));
    assert_true(f == -1.0f);
    assert_false(gpe_gguf_arr_f32(g, k, 2, &f));
    assert_false(gpe_gguf_arr_i64(g, k, 0, &i64));   /* not an integer */
    char buf[64];
    gpe_gguf_kv_render(g, k, buf, sizeof buf, 8);
    assert_string_equal(buf, "[0.5, -1]");
    const gpe_gguf_tensor *t1 = gpe_gguf_tensor_get(g, "t1");
    assert_non_null(t1);
    assert_int_equal(t1->offset, L.data + 32);
    assert_int_equal(t1->nbytes, 34);
    assert_ptr_equal(t1->data, b.p + L.data + 32);
    assert_true((int)gpe_gguf_kv_type(g, 99) == -1);
    assert_null(gpe_gguf_key(g, -1));
    assert_null(gpe_gguf_tensor_at(g, 2));
    gpe_gguf_close(g);
    free(b.p);
}

static void test_every_prefix_fails(void **state)
{
    (void)state;
    layout L;
    wbuf b = build(&L);
    char err[512];
    for (size_t n = 0; n < b.len; n++) {
        err[0] = '\0';
        gpe_status st = open_copy(b.p, n, err, sizeof err, NULL);
        if (st == GPE_OK)
            fail_msg("prefix of %zu bytes (of %zu) opened", n, b.len);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(open_copy(b.p, b.len, err, sizeof err, NULL), GPE_OK);
    free(b.p);
}

typedef void (*mutate_fn)(uint8_t *p, const layout *L);

static void put32(uint8_t *p, size_t off, uint32_t v) { memcpy(p + off, &v, 4); }
static void put64(uint8_t *p, size_t off, uint64_t v) { memcpy(p + off, &v, 8); }

static void m_magic(uint8_t *p, const layout *L) { (void)L; p[0] = 'X'; }
static void m_v1(uint8_t *p, const layout *L) { (void)L; put32(p, 4, 1); }
static void m_v4(uint8_t *p, const layout *L) { (void)L; put32(p, 4, 4); }
static void m_big_endian(uint8_t *p, const layout *L) { (void)L; put32(p, 4, 0x03000000u); }
static void m_many_kv(uint8_t *p, const layout *L) { put64(p, L->n_kv, 1ull << 40); }
static void m_many_tensors(uint8_t *p, const layout *L) { put64(p, L->n_tensors, UINT64_MAX); }
static void m_key_len(uint8_t *p, const layout *L) { put64(p, L->key0_len, 1ull << 62); }
static void m_key_empty(uint8_t *p, const layout *L)
{
    /* key "general.architecture" -> length 0: the following bytes then
     * parse as garbage or the empty key is reported */
    put64(p, L->key0_len, 0);
}
static void m_bad_vtype(uint8_t *p, const layout *L) { put32(p, L->align_type, 77); }
static void m_align_type(uint8_t *p, const layout *L) { put32(p, L->align_type, GPE_GGUF_I32); }
static void m_align_3(uint8_t *p, const layout *L) { put32(p, L->align_val, 3); }
static void m_align_0(uint8_t *p, const layout *L) { put32(p, L->align_val, 0); }
static void m_arr_nested(uint8_t *p, const layout *L) { put32(p, L->arr_type, GPE_GGUF_ARRAY); }
static void m_arr_len(uint8_t *p, const layout *L) { put64(p, L->arr_len, 1ull << 61); }
static void m_ndims0(uint8_t *p, const layout *L) { put32(p, L->t0_ndims, 0); }
static void m_ndims5(uint8_t *p, const layout *L) { put32(p, L->t0_ndims, 5); }
static void m_dim_huge(uint8_t *p, const layout *L) { put64(p, L->t0_ne0, 1ull << 63); }
static void m_dim_overflow(uint8_t *p, const layout *L) { put64(p, L->t0_ne0, 1ull << 62); }
static void m_type_unknown(uint8_t *p, const layout *L) { put32(p, L->t0_type, 4); }
static void m_type_huge(uint8_t *p, const layout *L) { put32(p, L->t0_type, 1000); }
static void m_type_blocksize(uint8_t *p, const layout *L) { put32(p, L->t0_type, GPE_TYPE_Q8_0); }
static void m_misaligned(uint8_t *p, const layout *L) { put64(p, L->t1_off, 33); }
static void m_past_end(uint8_t *p, const layout *L) { put64(p, L->t1_off, 64); }
static void m_far_past(uint8_t *p, const layout *L) { put64(p, L->t1_off, UINT64_MAX - 31); }
static void m_dup_tensor(uint8_t *p, const layout *L) { p[L->t1_name + 9] = '0'; }
static void m_dup_key(uint8_t *p, const layout *L)
{
    /* "t.i32" -> "t.u32" */
    (void)L;
    uint8_t *k = memmem(p, 400, "t.i32", 5);
    assert_non_null(k);
    k[2] = 'u';
}

typedef struct mut_case {
    const char *name;
    mutate_fn fn;
    gpe_status want;
    const char *msg;   /* substring expected in the error */
} mut_case;

static const mut_case k_muts[] = {
    {"magic", m_magic, GPE_ERR_FORMAT, "bad magic"},
    {"version 1", m_v1, GPE_ERR_UNSUPPORTED, "version 1"},
    {"version 4", m_v4, GPE_ERR_UNSUPPORTED, "version 4"},
    {"big endian", m_big_endian, GPE_ERR_UNSUPPORTED, "big-endian"},
    {"many kv", m_many_kv, GPE_ERR_FORMAT, "metadata count"},
    {"many tensors", m_many_tensors, GPE_ERR_FORMAT, "tensor count"},
    {"key length", m_key_len, GPE_ERR_FORMAT, "extends past end of file"},
    {"key empty", m_key_empty, GPE_ERR_FORMAT, "invalid key"},
    {"value type", m_bad_vtype, GPE_ERR_FORMAT, "invalid value type 77"},
    {"alignment type", m_align_type, GPE_ERR_FORMAT, "general.alignment"},
    {"alignment 3", m_align_3, GPE_ERR_FORMAT, "power of two"},
    {"alignment 0", m_align_0, GPE_ERR_FORMAT, "power of two"},
    {"nested array", m_arr_nested, GPE_ERR_FORMAT, "nested"},
    {"array length", m_arr_len, GPE_ERR_FORMAT, "string array"},
    {"n_dims 0", m_ndims0, GPE_ERR_FORMAT, "n_dims 0"},
    {"n_dims 5", m_ndims5, GPE_ERR_FORMAT, "n_dims 5"},
    {"dim huge", m_dim_huge, GPE_ERR_FORMAT, "overflow"},
    {"dim overflow", m_dim_overflow, GPE_ERR_FORMAT, "t0"},
    {"type 4", m_type_unknown, GPE_ERR_FORMAT, "unknown type 4"},
    {"type 1000", m_type_huge, GPE_ERR_FORMAT, "unknown type 1000"},
    {"block size", m_type_blocksize, GPE_ERR_FORMAT, "not a multiple"},
    {"misaligned", m_misaligned, GPE_ERR_FORMAT, "not a multiple of the alignment"},
    {"past end", m_past_end, GPE_ERR_FORMAT, "tensor 't1': data ["},
    {"far past end", m_far_past, GPE_ERR_FORMAT, "extends past end of file"},
    {"dup tensor", m_dup_tensor, GPE_ERR_FORMAT, "duplicate tensor name 't0'"},
    {"dup key", m_dup_key, GPE_ERR_FORMAT, "duplicate metadata key 't.u32'"},
};

static void test_mutations(void **state)
{
    (void)state;
    layout L;
    wbuf b = build(&L);
    for (size_t i = 0; i < sizeof k_muts / sizeof k_muts[0]; i++) {
        uint8_t *c = malloc(b.len);
        memcpy(c, b.p, b.len);
        k_muts[i].fn(c, &L);
        char err[512] = "";
        gpe_status st = open_copy(c, b.len, err, sizeof err, NULL);
        if (st != k_muts[i].want || !strstr(err, k_muts[i].msg))
            fail_msg("mutation '%s': status %d, error '%s' (want %d, '%s')", k_muts[i].name, st,
                     err, k_muts[i].want, k_muts[i].msg);
        free(c);
    }
    free(b.p);
}

/* Random byte flips: any outcome but a crash (ASan/UBSan builds check). */
static void test_random_corruption(void **state)
{
    (void)state;
    layout L;
    wbuf b = build(&L);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *c = malloc(b.len);
        memcpy(c, b.p, b.len);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            c[(s >> 8) % L.data] = (uint8_t)(s >> 40);
        }
        char err[256] = "";
        if (open_copy(c, b.len, err, sizeof err, NULL) == GPE_OK)
            ok++;
        else {
            bad++;
            assert_true(strlen(err) > 0);
        }
        free(c);
    }
    print_message("random corruption: %d opened, %d rejected\n", ok, bad);
    assert_true(bad > 0);
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_stories_metadata),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_built_valid),
        cmocka_unit_test(test_every_prefix_fails),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_random_corruption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

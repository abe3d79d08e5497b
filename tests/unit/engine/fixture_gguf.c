/* fixture_gguf: see fixture_gguf.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture_gguf.h"

/* GGUF facts (the format's specification): "GGUF", u32 version, u64
 * tensor count, u64 key-value count, the key-values (u64-length key, u32
 * type, value), the tensor infos, padding to general.alignment (32 by
 * default), the tensor data (offsets relative to its start). */
#define GGUF_HEADER 24
#define GGUF_U32 4
#define GGUF_STRING 8
#define GGUF_ARRAY 9

static size_t scalar_size(uint32_t t)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof sz / sizeof sz[0] ? sz[t] : 0;
}

static uint64_t u64_at(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t u32_at(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The offset after a value of type t at off. */
static size_t skip_value(const unsigned char *buf, size_t off, uint32_t t)
{
    if (t == GGUF_STRING)
        return off + 8 + (size_t)u64_at(buf + off);
    if (t == GGUF_ARRAY) {
        uint32_t at = u32_at(buf + off);
        uint64_t n = u64_at(buf + off + 4);
        off += 12;
        if (scalar_size(at))
            return off + scalar_size(at) * (size_t)n;
        for (uint64_t i = 0; i < n; i++)
            off = skip_value(buf, off, at);
        return off;
    }
    return off + scalar_size(t);
}

static void put_str(FILE *f, const char *s)
{
    uint64_t n = strlen(s);
    fwrite(&n, 8, 1, f);
    fwrite(s, 1, n, f);
}

/* A GGUF file read whole; its header checked and taken apart. */
typedef struct gguf {
    unsigned char *buf;
    size_t len;
    uint64_t n_t, n_kv;
    size_t align;   /* general.alignment, once the key-values are walked */
} gguf;

static void gguf_load(gguf *g, const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    g->len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g->buf = malloc(g->len);
    assert_non_null(g->buf);
    assert_int_equal(fread(g->buf, 1, g->len, f), g->len);
    fclose(f);
    assert_true(g->len >= GGUF_HEADER);
    assert_memory_equal(g->buf, "GGUF", 4);
    g->n_t = u64_at(g->buf + 8);
    g->n_kv = u64_at(g->buf + 16);
    g->align = 32;
}

/* One key-value of g's, from start to end; its value at val. */
typedef struct kv {
    size_t start, val, end;
    const char *key;
    size_t klen;
    uint32_t t;
} kv;

/* The key-value at off; general.alignment noted into g. */
static kv gguf_kv(gguf *g, size_t off)
{
    kv e = {.start = off};
    e.klen = (size_t)u64_at(g->buf + off);
    e.key = (const char *)g->buf + off + 8;
    off += 8 + e.klen;
    e.t = u32_at(g->buf + off);
    e.val = off + 4;
    e.end = skip_value(g->buf, e.val, e.t);
    assert_true(e.end <= g->len);
    if (e.klen == 17 && memcmp(e.key, "general.alignment", 17) == 0 && e.t == GGUF_U32)
        g->align = u32_at(g->buf + e.end - 4);
    return e;
}

static bool kv_is(const kv *e, const char *key)
{
    return e->klen == strlen(key) && memcmp(e->key, key, e->klen) == 0;
}

/* What follows the key-values (from off) to o: the tensor infos as they
 * are, padding to g's alignment where o now is, the tensor data. */
static void gguf_copy_tensors(FILE *o, const gguf *g, size_t off)
{
    size_t info = off;
    for (uint64_t i = 0; i < g->n_t; i++) {
        off += 8 + (size_t)u64_at(g->buf + off);
        uint32_t nd = u32_at(g->buf + off);
        off += 4 + 8 * (size_t)nd + 4 + 8;
    }
    fwrite(g->buf + info, 1, off - info, o);
    long at = ftell(o);
    static const char zero[64];
    fwrite(zero, 1, (g->align - (size_t)at % g->align) % g->align, o);
    size_t data = (off + g->align - 1) / g->align * g->align;
    fwrite(g->buf + data, 1, g->len - data, o);
}

/* The strings of the tokens array from at, n of them, to o: from[k]
 * spelled to[k] (ids[k] its id). */
static void put_tokens(FILE *o, const unsigned char *buf, size_t at, uint64_t n,
                       const char *const *from, const char *const *to, int32_t *ids, int nr)
{
    for (uint64_t e = 0; e < n; e++) {
        size_t sl = (size_t)u64_at(buf + at);
        int k = 0;
        while (k < nr && !(sl == strlen(from[k]) && memcmp(buf + at + 8, from[k], sl) == 0))
            k++;
        if (k < nr) {
            put_str(o, to[k]);
            ids[k] = (int32_t)e;
        } else {
            fwrite(buf + at, 1, 8 + sl, o);
        }
        at += 8 + sl;
    }
}

/* How gguf_rewrite changes a file: kv writes the key-value e to o as it
 * should be (false: dropped), add appends key-values after the kept ones
 * (how many; NULL: none). */
typedef struct rewrite {
    bool (*kv)(FILE *o, const gguf *g, const kv *e, void *ctx);
    uint64_t (*add)(FILE *o, void *ctx);
    void *ctx;
} rewrite;

/* src copied to dst through rw; the tensors as they are. */
static void gguf_rewrite(const char *src, const char *dst, const rewrite *rw)
{
    gguf g;
    gguf_load(&g, src);
    FILE *o = fopen(dst, "wb");
    assert_non_null(o);
    /* the header is written again once the key-values kept are counted */
    fwrite(g.buf, 1, GGUF_HEADER, o);
    uint64_t n_out = 0;
    size_t off = GGUF_HEADER;
    for (uint64_t i = 0; i < g.n_kv; i++) {
        kv e = gguf_kv(&g, off);
        off = e.end;
        if (rw->kv(o, &g, &e, rw->ctx))
            n_out++;
    }
    if (rw->add)
        n_out += rw->add(o, rw->ctx);
    gguf_copy_tensors(o, &g, off);
    fseek(o, 16, SEEK_SET);
    fwrite(&n_out, 8, 1, o);
    assert_int_equal(fclose(o), 0);
    free(g.buf);
}

static void put_kv(FILE *o, const gguf *g, const kv *e)
{
    fwrite(g->buf + e->start, 1, e->end - e->start, o);
}

/* ------------------------------------------------------------ the tokens */

typedef struct tokens {
    const char *const *from, *const *to;
    int32_t *ids;
    int nr;
} tokens;

static bool tokens_kv(FILE *o, const gguf *g, const kv *e, void *ctx)
{
    const tokens *tk = ctx;
    if (!(kv_is(e, "tokenizer.ggml.tokens") && e->t == GGUF_ARRAY &&
          u32_at(g->buf + e->val) == GGUF_STRING)) {
        put_kv(o, g, e);
        return true;
    }
    /* key, type, element type and count as they are; the strings one by
     * one */
    fwrite(g->buf + e->start, 1, e->val + 12 - e->start, o);
    put_tokens(o, g->buf, e->val + 12, u64_at(g->buf + e->val + 4), tk->from, tk->to, tk->ids,
               tk->nr);
    return true;
}

void fixture_gguf_with_tokens(const char *src, const char *dst, const char *const *from,
                              const char *const *to, int32_t *ids, int nr)
{
    tokens tk = {from, to, ids, nr};
    rewrite rw = {tokens_kv, NULL, &tk};
    for (int k = 0; k < nr; k++)
        ids[k] = -1;
    gguf_rewrite(src, dst, &rw);
    for (int k = 0; k < nr; k++)
        assert_true(ids[k] >= 0);
}

/* -------------------------------------------------------- the template */

typedef struct chat {
    const char *tmpl;
    uint32_t ctx;
} chat;

static bool chat_kv(FILE *o, const gguf *g, const kv *e, void *ctx)
{
    (void)ctx;
    if (kv_is(e, "tokenizer.chat_template") || kv_is(e, "llama.context_length"))
        return false;
    put_kv(o, g, e);
    return true;
}

static uint64_t chat_add(FILE *o, void *ctx)
{
    const chat *c = ctx;
    uint32_t t_str = GGUF_STRING, t_u32 = GGUF_U32;
    put_str(o, "tokenizer.chat_template");
    fwrite(&t_str, 4, 1, o);
    put_str(o, c->tmpl);
    put_str(o, "llama.context_length");
    fwrite(&t_u32, 4, 1, o);
    fwrite(&c->ctx, 4, 1, o);
    return 2;
}

void fixture_gguf_with_template(const char *src, const char *dst, const char *tmpl,
                                uint32_t ctx)
{
    chat c = {tmpl, ctx};
    rewrite rw = {chat_kv, chat_add, &c};
    gguf_rewrite(src, dst, &rw);
}

void fixture_gguf_tmp(char *path)
{
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
}

/* synth_gguf: in-memory GGUF v3 builder and raw key/value source (see
 * synth_gguf.h). Format facts from the GGUF specification in ggml's docs. */
#include "synth_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRC_MAX_KV 4096

struct synth_src {
    char *path;
    uint8_t *bytes;
    size_t size;
    uint64_t n_kv;
    size_t *kv_off, *kv_len;   /* each entry's bytes: key, type, value */
};

/* ------------------------------------------------------------ builder */

void synth_gguf_init(synth_gguf *g)
{
    memset(g, 0, sizeof *g);
}

void synth_gguf_free(synth_gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_t; i++) {
        free(g->t[i].name);
        free(g->t[i].data);
    }
    free(g->t);
    free(g->kv);
    memset(g, 0, sizeof *g);
}

static bool kv_put(synth_gguf *g, const void *p, size_t n, char *err, size_t errlen)
{
    if (g->kv_len + n > g->kv_cap) {
        size_t cap = g->kv_cap ? g->kv_cap : 4096;
        while (cap < g->kv_len + n)
            cap *= 2;
        uint8_t *nb = realloc(g->kv, cap);
        if (!nb) {
            snprintf(err, errlen, "out of memory (%zu bytes of metadata)", cap);
            return false;
        }
        g->kv = nb;
        g->kv_cap = cap;
    }
    memcpy(g->kv + g->kv_len, p, n);
    g->kv_len += n;
    return true;
}

/* The format is little endian; so are the hosts this builds on (x86-64,
 * aarch64), so integers are copied as they are in memory. */
static bool kv_head(synth_gguf *g, const char *key, uint32_t type, char *err, size_t errlen)
{
    uint64_t n = strlen(key);
    if (!kv_put(g, &n, 8, err, errlen) || !kv_put(g, key, n, err, errlen) ||
        !kv_put(g, &type, 4, err, errlen))
        return false;
    g->n_kv++;
    return true;
}

bool synth_gguf_add_str(synth_gguf *g, const char *key, const char *val, char *err, size_t errlen)
{
    uint64_t n = strlen(val);
    return kv_head(g, key, SYNTH_V_STRING, err, errlen) && kv_put(g, &n, 8, err, errlen) &&
           kv_put(g, val, n, err, errlen);
}

bool synth_gguf_add_u32(synth_gguf *g, const char *key, uint32_t val, char *err, size_t errlen)
{
    return kv_head(g, key, SYNTH_V_U32, err, errlen) && kv_put(g, &val, 4, err, errlen);
}

bool synth_gguf_add_i32(synth_gguf *g, const char *key, int32_t val, char *err, size_t errlen)
{
    return kv_head(g, key, SYNTH_V_I32, err, errlen) && kv_put(g, &val, 4, err, errlen);
}

bool synth_gguf_add_u64(synth_gguf *g, const char *key, uint64_t val, char *err, size_t errlen)
{
    return kv_head(g, key, SYNTH_V_U64, err, errlen) && kv_put(g, &val, 8, err, errlen);
}

bool synth_gguf_add_f32(synth_gguf *g, const char *key, float val, char *err, size_t errlen)
{
    return kv_head(g, key, SYNTH_V_F32, err, errlen) && kv_put(g, &val, 4, err, errlen);
}

bool synth_gguf_add_bool(synth_gguf *g, const char *key, bool val, char *err, size_t errlen)
{
    uint8_t b = val ? 1 : 0;
    return kv_head(g, key, SYNTH_V_BOOL, err, errlen) && kv_put(g, &b, 1, err, errlen);
}

bool synth_gguf_copy_kv(synth_gguf *g, const synth_src *src, const char *key, char *err,
                        size_t errlen)
{
    size_t klen = strlen(key);
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const uint8_t *e = src->bytes + src->kv_off[i];
        uint64_t n;
        memcpy(&n, e, 8);
        if (n == klen && memcmp(e + 8, key, klen) == 0) {
            if (!kv_put(g, e, src->kv_len[i], err, errlen))
                return false;
            g->n_kv++;
            return true;
        }
    }
    snprintf(err, errlen, "%s has no key '%s'", src->path, key);
    return false;
}

void synth_gguf_move_kv(synth_gguf *dst, synth_gguf *src)
{
    free(dst->kv);
    dst->kv = src->kv;
    dst->kv_len = src->kv_len;
    dst->kv_cap = src->kv_cap;
    dst->n_kv = src->n_kv;
    src->kv = NULL;
    src->kv_len = src->kv_cap = 0;
    src->n_kv = 0;
}

bool synth_gguf_add_tensor(synth_gguf *g, const char *name, int n_dims, const int64_t *ne,
                           uint32_t type, void *data, size_t nbytes, char *err, size_t errlen)
{
    if (n_dims < 1 || n_dims > SYNTH_MAX_DIMS) {
        snprintf(err, errlen, "tensor '%s': %d dimensions (1..%d)", name, n_dims, SYNTH_MAX_DIMS);
        goto fail;
    }
    if (g->n_t == g->cap_t) {
        size_t cap = g->cap_t ? g->cap_t * 2 : 64;
        synth_tensor *nt = realloc(g->t, cap * sizeof *nt);
        if (!nt)
            goto oom;
        g->t = nt;
        g->cap_t = cap;
    }
    synth_tensor *t = &g->t[g->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name)
        goto oom;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->type = type;
    t->data = data;
    t->nbytes = nbytes;
    g->n_t++;
    return true;
oom:
    snprintf(err, errlen, "out of memory adding tensor '%s'", name);
fail:
    free(data);
    return false;
}

static size_t align_up(size_t x)
{
    return (x + SYNTH_ALIGN - 1) / SYNTH_ALIGN * SYNTH_ALIGN;
}

static uint8_t *put(uint8_t *p, const void *src, size_t n)
{
    memcpy(p, src, n);
    return p + n;
}

bool synth_gguf_serialise(const synth_gguf *g, uint8_t **out, size_t *len, char *err,
                          size_t errlen)
{
    size_t head = 4 + 4 + 8 + 8 + g->kv_len;
    for (size_t i = 0; i < g->n_t; i++)
        head += 8 + strlen(g->t[i].name) + 4 + 8 * (size_t)g->t[i].n_dims + 4 + 8;
    size_t data_start = align_up(head), data_len = 0;
    for (size_t i = 0; i < g->n_t; i++)
        data_len += align_up(g->t[i].nbytes);
    size_t total = data_start + data_len;
    uint8_t *buf = calloc(1, total);   /* zeros are the padding */
    if (!buf) {
        snprintf(err, errlen, "out of memory (%zu-byte file)", total);
        return false;
    }
    uint32_t version = 3;
    uint64_t n_t = g->n_t;
    uint8_t *p = put(buf, "GGUF", 4);
    p = put(p, &version, 4);
    p = put(p, &n_t, 8);
    p = put(p, &g->n_kv, 8);
    p = put(p, g->kv, g->kv_len);
    uint64_t off = 0;
    for (size_t i = 0; i < g->n_t; i++) {
        const synth_tensor *t = &g->t[i];
        uint64_t n = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims;
        p = put(p, &n, 8);
        p = put(p, t->name, n);
        p = put(p, &nd, 4);
        for (int d = 0; d < t->n_dims; d++)
            p = put(p, &t->ne[d], 8);
        p = put(p, &t->type, 4);
        p = put(p, &off, 8);
        memcpy(buf + data_start + off, t->data, t->nbytes);
        off += align_up(t->nbytes);
    }
    *out = buf;
    *len = total;
    return true;
}

/* ---------------------------------------------------------- half floats */

uint16_t synth_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)   /* inf stays inf; NaN keeps its top payload bits, quiet */
        return sign | (ax > 0x7f800000u ? (uint16_t)(0x7e00u | ((ax >> 13) & 0x3ffu)) : 0x7c00u);
    if (ax >= 0x477ff000u)   /* rounds to >= 65520: overflow */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {  /* below 2^-14: a subnormal half (or zero) */
        if (ax < 0x33000000u)   /* below half of the smallest subnormal: +-0 */
            return sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;   /* 14..24: bits dropped below the half's 2^-24 unit */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u)))
            h++;
        return sign | (uint16_t)h;
    }
    /* Normal: rebias the exponent, round the 13 dropped mantissa bits; a
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t h = ((ax >> 13) - ((127u - 15u) << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return sign | (uint16_t)h;
}

float synth_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 127u - 15u) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else {   /* subnormal half: normalise */
        e = 127u - 15u + 1u;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ------------------------------------------------------------- source */

/* Bytes taken by a value of type t at p (within [p, end)), or 0 when it
 * runs past end or the type is unknown. Arrays of arrays are not needed. */
static size_t value_size(const uint8_t *p, const uint8_t *end, uint32_t t)
{
    static const size_t fixed[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t > 12)
        return 0;
    if (t == SYNTH_V_STRING) {
        uint64_t n;
        if (end - p < 8)
            return 0;
        memcpy(&n, p, 8);
        return n <= (uint64_t)(end - p - 8) ? 8 + n : 0;
    }
    if (t != 9)
        return (size_t)(end - p) >= fixed[t] ? fixed[t] : 0;
    uint32_t et;
    uint64_t n;
    if (end - p < 12)
        return 0;
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    if (et == 9 || et > 12)
        return 0;
    const uint8_t *q = p + 12;
    if (et != SYNTH_V_STRING) {
        if (n > (uint64_t)(end - q) / fixed[et])
            return 0;
        return 12 + n * fixed[et];
    }
    for (uint64_t i = 0; i < n; i++) {
        size_t s = value_size(q, end, et);
        if (!s)
            return 0;
        q += s;
    }
    return (size_t)(q - p);
}

static bool src_index(synth_src *s, char *err, size_t errlen)
{
    const uint8_t *end = s->bytes + s->size;
    if (s->size < 24 || memcmp(s->bytes, "GGUF", 4) != 0) {
        snprintf(err, errlen, "%s: not a GGUF file", s->path);
        return false;
    }
    memcpy(&s->n_kv, s->bytes + 16, 8);
    if (s->n_kv > SRC_MAX_KV) {
        snprintf(err, errlen, "%s: %llu keys (at most %d)", s->path,
                 (unsigned long long)s->n_kv, SRC_MAX_KV);
        return false;
    }
    s->kv_off = calloc(s->n_kv + 1, sizeof *s->kv_off);
    s->kv_len = calloc(s->n_kv + 1, sizeof *s->kv_len);
    if (!s->kv_off || !s->kv_len) {
        snprintf(err, errlen, "out of memory indexing %s", s->path);
        return false;
    }
    const uint8_t *p = s->bytes + 24;
    for (uint64_t i = 0; i < s->n_kv; i++) {
        size_t ks = value_size(p, end, SYNTH_V_STRING);
        uint32_t t;
        if (!ks || end - p - (ptrdiff_t)ks < 4)
            goto bad;
        memcpy(&t, p + ks, 4);
        size_t vs = value_size(p + ks + 4, end, t);
        if (!vs)
            goto bad;
        s->kv_off[i] = (size_t)(p - s->bytes);
        s->kv_len[i] = ks + 4 + vs;
        p += ks + 4 + vs;
    }
    return true;
bad:
    snprintf(err, errlen, "%s: malformed key/value section at byte %zu", s->path,
             (size_t)(p - s->bytes));
    return false;
}

bool synth_src_open(const char *path, synth_src **out, char *err, size_t errlen)
{
    synth_src *s = calloc(1, sizeof *s);
    FILE *f = NULL;
    *out = NULL;
    if (!s || !(s->path = strdup(path))) {
        snprintf(err, errlen, "out of memory opening %s", path);
        goto fail;
    }
    f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) {
        snprintf(err, errlen, "cannot open %s", path);
        goto fail;
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errlen, "cannot size %s", path);
        goto fail;
    }
    s->size = (size_t)size;
    s->bytes = malloc(s->size ? s->size : 1);
    if (!s->bytes || fread(s->bytes, 1, s->size, f) != s->size) {
        snprintf(err, errlen, "cannot read %s", path);
        goto fail;
    }
    fclose(f);
    f = NULL;
    if (!src_index(s, err, errlen))
        goto fail;
    *out = s;
    return true;
fail:
    if (f)
        fclose(f);
    synth_src_close(s);
    return false;
}

void synth_src_close(synth_src *s)
{
    if (!s)
        return;
    free(s->kv_off);
    free(s->kv_len);
    free(s->bytes);
    free(s->path);
    free(s);
}

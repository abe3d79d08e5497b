/*
 * gguf: strict GGUF reader. Everything is validated in gpe_gguf_open*; the
 * accessors then trust the parsed tables.
 *
 * Parsing happens in one pass over the file with a bounds-checked cursor.
 * Strings are first recorded as (pointer into the file, length) and, once
 * the whole header is known to be sound, copied NUL-terminated into one
 * arena so that callers can use them as C strings.
 */
#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define DEFAULT_ALIGNMENT 32
#define MAX_KEY_LEN 65535   /* GGUF spec: keys are at most 2^16-1 bytes */

typedef struct str {
    const char *p;   /* into the file while parsing, into the arena after */
    size_t len;
} str;

typedef struct kv {
    str key;
    gpe_gguf_vtype type;
    /* scalars: raw little-endian bytes of the value (up to 8) */
    uint8_t raw[8];
    str s;                      /* STRING */
    gpe_gguf_vtype etype;       /* ARRAY: element type */
    uint64_t n;                 /* ARRAY: element count */
    const uint8_t *adata;       /* ARRAY of numbers: elements in the file */
    str *astr;                  /* ARRAY of strings: n entries (malloc'd) */
} kv;

struct gpe_gguf {
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    int64_t n_kv;
    kv *kvs;
    int64_t n_tensors;
    gpe_gguf_tensor *tensors;
    str *tnames;                /* tensor names (parallel to tensors) */
    uint32_t *kv_hash, *t_hash; /* open addressing: index+1, 0 = empty */
    size_t kv_hash_cap, t_hash_cap;
    char *arena;
};

/* --------------------------------------------------------------- helpers */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case GPE_GGUF_U8: case GPE_GGUF_I8: case GPE_GGUF_BOOL: return 1;
    case GPE_GGUF_U16: case GPE_GGUF_I16: return 2;
    case GPE_GGUF_U32: case GPE_GGUF_I32: case GPE_GGUF_F32: return 4;
    case GPE_GGUF_U64: case GPE_GGUF_I64: case GPE_GGUF_F64: return 8;
    default: return 0;   /* STRING, ARRAY, unknown */
    }
}

const char *gpe_gguf_vtype_name(gpe_gguf_vtype t)
{
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Insert names[0..n) into a new table; returns the index of the first
 * duplicate found (>= 0), -1 when all are distinct, -2 on out of memory. */
static int64_t hash_build(const str *names, size_t stride, int64_t n, uint32_t **tab, size_t *cap)
{
    size_t c = 16;
    while (c < (size_t)n * 2)
        c <<= 1;
    uint32_t *t = calloc(c, sizeof *t);
    if (!t)
        return -2;
    for (int64_t i = 0; i < n; i++) {
        const str *s = (const str *)((const char *)names + (size_t)i * stride);
        size_t h = (size_t)hash_bytes(s->p, s->len) & (c - 1);
        while (t[h]) {
            const str *o = (const str *)((const char *)names + (size_t)(t[h] - 1) * stride);
            if (o->len == s->len && memcmp(o->p, s->p, s->len) == 0) {
                free(t);
                return i;
            }
            h = (h + 1) & (c - 1);
        }
        t[h] = (uint32_t)(i + 1);
    }
    *tab = t;
    *cap = c;
    return -1;
}

static int64_t hash_find(const uint32_t *t, size_t cap, const str *names, size_t stride,
                         const char *key)
{
    if (!t || !key)
        return -1;
    const size_t len = strlen(key);
    size_t h = (size_t)hash_bytes(key, len) & (cap - 1);
    while (t[h]) {
        const str *o = (const str *)((const char *)names + (size_t)(t[h] - 1) * stride);
        if (o->len == len && memcmp(o->p, key, len) == 0)
            return (int64_t)t[h] - 1;
        h = (h + 1) & (cap - 1);
    }
    return -1;
}

/* ---------------------------------------------------------------- cursor */

typedef struct rd {
    const uint8_t *p;
    size_t size, off;
    char *err;
    size_t errlen;
    bool nomem;   /* the failure was an allocation, not the file: GPE_ERR_NOMEM */
} rd;

static bool rd_need(rd *r, uint64_t n, const char *what)
{
    if (n > r->size - r->off) {
        seterr(r->err, r->errlen,
               "truncated file: %s at offset %zu needs %" PRIu64 " bytes but only %zu remain "
               "(file size %zu)", what, r->off, n, r->size - r->off, r->size);
        return false;
    }
    return true;
}

static bool rd_u32(rd *r, uint32_t *v, const char *what)
{
    if (!rd_need(r, 4, what))
        return false;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return true;
}

static bool rd_u64(rd *r, uint64_t *v, const char *what)
{
    if (!rd_need(r, 8, what))
        return false;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return true;
}

static bool rd_str(rd *r, str *s, const char *what)
{
    uint64_t len;
    if (!rd_u64(r, &len, what))
        return false;
    if (len > r->size - r->off) {
        seterr(r->err, r->errlen,
               "%s: string length %" PRIu64 " at offset %zu extends past end of file (size %zu)",
               what, len, r->off - 8, r->size);
        return false;
    }
    s->p = (const char *)r->p + r->off;
    s->len = (size_t)len;
    r->off += (size_t)len;
    return true;
}

/* Print a name for messages: at most 64 bytes, non-printables as '?'. */
static const char *show(const str *s, char buf[80])
{
    size_t n = s->len < 64 ? s->len : 64, j = 0;
    for (size_t i = 0; i < n; i++)
        buf[j++] = (s->p[i] >= 32 && s->p[i] < 127) ? s->p[i] : '?';
    if (s->len > 64) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

/* ----------------------------------------------------------------- parse */

static bool parse_kv(rd *r, kv *e, int64_t idx)
{
    char nb[80];
    if (!rd_str(r, &e->key, "metadata key"))
        return false;
    if (e->key.len == 0 || e->key.len > MAX_KEY_LEN || memchr(e->key.p, 0, e->key.len)) {
        seterr(r->err, r->errlen, "metadata entry %" PRId64 ": invalid key (length %zu%s)", idx,
               e->key.len, e->key.len && memchr(e->key.p, 0, e->key.len) ? ", contains NUL" : "");
        return false;
    }
    uint32_t t;
    if (!rd_u32(r, &t, "metadata value type"))
        return false;
    e->type = (gpe_gguf_vtype)t;
    if (t == GPE_GGUF_STRING) {
        return rd_str(r, &e->s, "metadata string value");
    }
    if (t == GPE_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        if (!rd_u32(r, &et, "array element type") || !rd_u64(r, &n, "array length"))
            return false;
        e->etype = (gpe_gguf_vtype)et;
        e->n = n;
        if (et == GPE_GGUF_STRING) {
            /* every element needs at least its 8-byte length */
            if (n > (r->size - r->off) / 8) {
                seterr(r->err, r->errlen,
                       "key '%s': string array of %" PRIu64 " elements cannot fit in the %zu "
                       "bytes left in the file", show(&e->key, nb), n, r->size - r->off);
                return false;
            }
            e->astr = malloc((size_t)(n ? n : 1) * sizeof *e->astr);
            if (!e->astr) {
                seterr(r->err, r->errlen, "out of memory for array '%s'", show(&e->key, nb));
                r->nomem = true;
                return false;
            }
            for (uint64_t j = 0; j < n; j++)
                if (!rd_str(r, &e->astr[j], "array string element"))
                    return false;
            return true;
        }
        const size_t es = vtype_size(et);
        if (es == 0) {
            seterr(r->err, r->errlen, "key '%s': invalid array element type %u%s",
                   show(&e->key, nb), et, et == GPE_GGUF_ARRAY ? " (nested arrays)" : "");
            return false;
        }
        if (n > (r->size - r->off) / es) {
            seterr(r->err, r->errlen,
                   "key '%s': array of %" PRIu64 " %s elements extends past end of file "
                   "(offset %zu, size %zu)", show(&e->key, nb), n, gpe_gguf_vtype_name(et),
                   r->off, r->size);
            return false;
        }
        e->adata = r->p + r->off;
        r->off += (size_t)n * es;
        return true;
    }
    const size_t vs = vtype_size(t);
    if (vs == 0) {
        seterr(r->err, r->errlen, "key '%s': invalid value type %u", show(&e->key, nb), t);
        return false;
    }
    if (!rd_need(r, vs, "metadata value"))
        return false;
    memcpy(e->raw, r->p + r->off, vs);
    r->off += vs;
    return true;
}

static bool parse_tensor(rd *r, gpe_gguf_tensor *t, str *name, int64_t idx)
{
    char nb[80];
    if (!rd_str(r, name, "tensor name"))
        return false;
    if (name->len == 0 || name->len >= GPE_GGUF_MAX_NAME || memchr(name->p, 0, name->len)) {
        seterr(r->err, r->errlen, "tensor %" PRId64 ": invalid name '%s' (length %zu, max %d)",
               idx, show(name, nb), name->len, GPE_GGUF_MAX_NAME - 1);
        return false;
    }
    uint32_t nd;
    if (!rd_u32(r, &nd, "tensor n_dims"))
        return false;
    if (nd < 1 || nd > GPE_GGUF_MAX_DIMS) {
        seterr(r->err, r->errlen, "tensor '%s': n_dims %u out of range 1..%d", show(name, nb), nd,
               GPE_GGUF_MAX_DIMS);
        return false;
    }
    t->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < GPE_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if ((uint32_t)d < nd && !rd_u64(r, &v, "tensor dimension"))
            return false;
        if (v > (uint64_t)INT64_MAX || __builtin_mul_overflow(nel, (int64_t)v, &nel)) {
            seterr(r->err, r->errlen, "tensor '%s': dimensions overflow the element count",
                   show(name, nb));
            return false;
        }
        t->ne[d] = (int64_t)v;
    }
    t->n_elements = nel;
    uint32_t type;
    if (!rd_u32(r, &type, "tensor type"))
        return false;
    if (!gpe_type_known(type)) {
        seterr(r->err, r->errlen, "tensor '%s': unknown type %u", show(name, nb), type);
        return false;
    }
    t->type = (gpe_type)type;
    const int64_t bs = gpe_type_block_size(type);
    if (t->ne[0] % bs != 0) {
        seterr(r->err, r->errlen, "tensor '%s': row length %" PRId64 " is not a multiple of the "
               "%s block size %" PRId64, show(name, nb), t->ne[0], gpe_type_name(type), bs);
        return false;
    }
    /* nel is a multiple of bs since ne[0] is */
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)(nel / bs), (uint64_t)gpe_type_block_bytes(type), &nbytes)) {
        seterr(r->err, r->errlen, "tensor '%s': byte size overflows", show(name, nb));
        return false;
    }
    t->nbytes = nbytes;
    return rd_u64(r, &t->offset, "tensor offset");   /* relative for now */
}

static void gguf_free_tables(gpe_gguf *g)
{
    if (g->kvs)
        for (int64_t i = 0; i < g->n_kv; i++)
            free(g->kvs[i].astr);
    free(g->kvs);
    free(g->tensors);
    free(g->tnames);
    free(g->kv_hash);
    free(g->t_hash);
    free(g->arena);
}

void gpe_gguf_close(gpe_gguf *g)
{
    if (!g)
        return;
    gguf_free_tables(g);
    if (g->mapped)
        munmap((void *)g->base, g->size);
    free(g);
}

/* Copy every string into one NUL-terminated arena and repoint. */
static bool build_arena(gpe_gguf *g)
{
    size_t total = 1;
    for (int64_t i = 0; i < g->n_kv; i++) {
        kv *e = &g->kvs[i];
        total += e->key.len + 1;
        if (e->type == GPE_GGUF_STRING)
            total += e->s.len + 1;
        if (e->astr)
            for (uint64_t j = 0; j < e->n; j++)
                total += e->astr[j].len + 1;   /* bounded by the file size + n */
    }
    for (int64_t i = 0; i < g->n_tensors; i++)
        total += g->tnames[i].len + 1;
    char *a = malloc(total);
    if (!a)
        return false;
    g->arena = a;
#define COPY(s)                                   \
    do {                                          \
        memcpy(a, (s).p, (s).len);                \
        a[(s).len] = '\0';                        \
        (s).p = a;                                \
        a += (s).len + 1;                         \
    } while (0)
    for (int64_t i = 0; i < g->n_kv; i++) {
        kv *e = &g->kvs[i];
        COPY(e->key);
        if (e->type == GPE_GGUF_STRING)
            COPY(e->s);
        if (e->astr)
            for (uint64_t j = 0; j < e->n; j++)
                COPY(e->astr[j]);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        COPY(g->tnames[i]);
        g->tensors[i].name = g->tnames[i].p;
    }
#undef COPY
    return true;
}

static gpe_status parse(gpe_gguf *g, char *err, size_t errlen)
{
    rd r = {.p = g->base, .size = g->size, .off = 0, .err = err, .errlen = errlen};
    char nb[80];
    if (g->size < 4 || memcmp(g->base, GGUF_MAGIC, 4) != 0) {
        seterr(err, errlen, "not a GGUF file (bad magic%s)", g->size < 4 ? ", file too short" : "");
        return GPE_ERR_FORMAT;
    }
    r.off = 4;
    if (!rd_u32(&r, &g->version, "version"))
        return GPE_ERR_FORMAT;
    if (g->version == 1) {
        seterr(err, errlen, "GGUF version 1 is not supported (only 2 and 3)");
        return GPE_ERR_UNSUPPORTED;
    }
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && (g->version >> 24) >= 1 && (g->version >> 24) <= 3)
            seterr(err, errlen, "big-endian GGUF files are not supported");
        else
            seterr(err, errlen, "unsupported GGUF version %u (only 2 and 3)", g->version);
        return GPE_ERR_UNSUPPORTED;
    }
    uint64_t nt, nkv;
    if (!rd_u64(&r, &nt, "tensor count") || !rd_u64(&r, &nkv, "metadata count"))
        return GPE_ERR_FORMAT;
    /* each metadata entry takes >= 13 bytes, each tensor info >= 29 */
    if (nkv > GPE_GGUF_MAX_KV || nkv > (g->size - r.off) / 13) {
        seterr(err, errlen, "metadata count %" PRIu64 " is absurd (max %d, file size %zu)", nkv,
               GPE_GGUF_MAX_KV, g->size);
        return GPE_ERR_FORMAT;
    }
    if (nt > GPE_GGUF_MAX_TENSORS || nt > (g->size - r.off) / 29) {
        seterr(err, errlen, "tensor count %" PRIu64 " is absurd (max %d, file size %zu)", nt,
               GPE_GGUF_MAX_TENSORS, g->size);
        return GPE_ERR_FORMAT;
    }
    g->kvs = calloc(nkv ? nkv : 1, sizeof *g->kvs);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    g->tnames = calloc(nt ? nt : 1, sizeof *g->tnames);
    if (!g->kvs || !g->tensors || !g->tnames)
        goto nomem;
    for (uint64_t i = 0; i < nkv; i++) {
        g->n_kv = (int64_t)i + 1;   /* so that cleanup frees a partial entry */
        if (!parse_kv(&r, &g->kvs[i], (int64_t)i))
            return r.nomem ? GPE_ERR_NOMEM : GPE_ERR_FORMAT;   /* a retry may pass */
    }
    g->n_kv = (int64_t)nkv;
    int64_t dup = hash_build(&g->kvs[0].key, sizeof(kv), g->n_kv, &g->kv_hash, &g->kv_hash_cap);
    if (dup == -2)
        goto nomem;
    if (dup >= 0) {
        seterr(err, errlen, "duplicate metadata key '%s'", show(&g->kvs[dup].key, nb));
        return GPE_ERR_FORMAT;
    }
    g->alignment = DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < g->n_kv; i++) {
        const kv *e = &g->kvs[i];
        if (e->key.len == 17 && memcmp(e->key.p, "general.alignment", 17) == 0) {
            uint32_t a;
            memcpy(&a, e->raw, 4);
            if (e->type != GPE_GGUF_U32 || a == 0 || (a & (a - 1)) != 0) {
                seterr(err, errlen, "general.alignment must be a u32 power of two (got %s %u)",
                       gpe_gguf_vtype_name(e->type), e->type == GPE_GGUF_U32 ? a : 0);
                return GPE_ERR_FORMAT;
            }
            g->alignment = a;
        }
    }
    for (uint64_t i = 0; i < nt; i++) {
        if (!parse_tensor(&r, &g->tensors[i], &g->tnames[i], (int64_t)i))
            return GPE_ERR_FORMAT;
        g->n_tensors = (int64_t)i + 1;
    }
    g->n_tensors = (int64_t)nt;
    dup = hash_build(g->tnames, sizeof(str), g->n_tensors, &g->t_hash, &g->t_hash_cap);
    if (dup == -2)
        goto nomem;
    if (dup >= 0) {
        seterr(err, errlen, "duplicate tensor name '%s'", show(&g->tnames[dup], nb));
        return GPE_ERR_FORMAT;
    }
    /* data section: header end rounded up to the alignment */
    g->data_off = ((uint64_t)r.off + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gpe_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            seterr(err, errlen, "tensor '%s': data offset %" PRIu64 " is not a multiple of the "
                   "alignment %u", show(&g->tnames[i], nb), t->offset, g->alignment);
            return GPE_ERR_FORMAT;
        }
        const uint64_t start = g->data_off + t->offset;   /* no overflow: both < 2^63 checked below */
        if (t->offset > (uint64_t)g->size || start > (uint64_t)g->size ||
            t->nbytes > (uint64_t)g->size - start) {
            seterr(err, errlen, "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") extends past end of "
                   "file (size %zu)", show(&g->tnames[i], nb),
                   t->offset > (uint64_t)g->size ? t->offset : start,
                   (t->offset > (uint64_t)g->size ? t->offset : start) + t->nbytes, g->size);
            return GPE_ERR_FORMAT;
        }
        t->offset = start;
        t->data = g->base + start;
    }
    if (!build_arena(g))
        goto nomem;
    return GPE_OK;
nomem:
    seterr(err, errlen, "out of memory parsing GGUF header");
    return GPE_ERR_NOMEM;
}

static gpe_status open_common(gpe_gguf *g, gpe_gguf **out, char *err, size_t errlen)
{
    gpe_status st = parse(g, err, errlen);
    if (st != GPE_OK) {
        gpe_gguf_close(g);
        return st;
    }
    *out = g;
    return GPE_OK;
}

gpe_status gpe_gguf_open_buffer(const void *buf, size_t size, gpe_gguf **out, char *err,
                                size_t errlen)
{
    if (!out || (!buf && size)) {
        seterr(err, errlen, "gpe_gguf_open_buffer: bad arguments");
        return GPE_ERR_ARG;
    }
    *out = NULL;
    gpe_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        seterr(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = size;
    return open_common(g, out, err, errlen);
}

gpe_status gpe_gguf_open(const char *path, gpe_gguf **out, char *err, size_t errlen)
{
    if (!out || !path) {
        seterr(err, errlen, "gpe_gguf_open: bad arguments");
        return GPE_ERR_ARG;
    }
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return GPE_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        seterr(err, errlen, "%s: not a regular file", path);
        close(fd);
        return GPE_ERR_IO;
    }
    if (st.st_size < 4) {
        seterr(err, errlen, "%s: not a GGUF file (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return GPE_ERR_FORMAT;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        seterr(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return GPE_ERR_IO;
    }
    gpe_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(p, (size_t)st.st_size);
        seterr(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    g->base = p;
    g->size = (size_t)st.st_size;
    g->mapped = true;
    gpe_status s = open_common(g, out, err, errlen);
    if (s != GPE_OK && err && errlen > 0) {
        /* prefix the path for context */
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", err);
        seterr(err, errlen, "%s: %s", path, tmp);
    }
    return s;
}

/* ------------------------------------------------------------- accessors */

uint32_t gpe_gguf_version(const gpe_gguf *g) { return g->version; }
uint64_t gpe_gguf_file_size(const gpe_gguf *g) { return g->size; }
uint32_t gpe_gguf_alignment(const gpe_gguf *g) { return g->alignment; }
uint64_t gpe_gguf_data_offset(const gpe_gguf *g) { return g->data_off; }
int64_t gpe_gguf_n_kv(const gpe_gguf *g) { return g->n_kv; }

int64_t gpe_gguf_find_key(const gpe_gguf *g, const char *key)
{
    return hash_find(g->kv_hash, g->kv_hash_cap, &g->kvs[0].key, sizeof(kv), key);
}

static const kv *kv_at(const gpe_gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? &g->kvs[i] : NULL;
}

const char *gpe_gguf_key(const gpe_gguf *g, int64_t i)
{
    const kv *e = kv_at(g, i);
    return e ? e->key.p : NULL;
}

gpe_gguf_vtype gpe_gguf_kv_type(const gpe_gguf *g, int64_t i)
{
    const kv *e = kv_at(g, i);
    return e ? e->type : (gpe_gguf_vtype)-1;
}

/* A numeric value in all its forms. is_int: integer types (and bool). */
typedef struct num {
    bool is_int, neg;
    uint64_t u;     /* magnitude bits when !neg; the value when is_int && !neg */
    int64_t i;      /* the value when is_int && neg (or fits) */
    double f;
} num;

static bool num_of(gpe_gguf_vtype t, const uint8_t *p, num *o)
{
    memset(o, 0, sizeof *o);
    o->is_int = true;
    switch (t) {
    case GPE_GGUF_U8: o->u = p[0]; break;
    case GPE_GGUF_BOOL: o->u = p[0] != 0; break;
    case GPE_GGUF_I8: o->i = (int8_t)p[0]; o->neg = o->i < 0; o->u = (uint64_t)o->i; break;
    case GPE_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); o->u = v; break; }
    case GPE_GGUF_I16: { int16_t v; memcpy(&v, p, 2); o->i = v; o->neg = v < 0; o->u = (uint64_t)o->i; break; }
    case GPE_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); o->u = v; break; }
    case GPE_GGUF_I32: { int32_t v; memcpy(&v, p, 4); o->i = v; o->neg = v < 0; o->u = (uint64_t)o->i; break; }
    case GPE_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); o->u = v; break; }
    case GPE_GGUF_I64: { int64_t v; memcpy(&v, p, 8); o->i = v; o->neg = v < 0; o->u = (uint64_t)v; break; }
    case GPE_GGUF_F32: { float v; memcpy(&v, p, 4); o->is_int = false; o->f = v; return true; }
    case GPE_GGUF_F64: { double v; memcpy(&v, p, 8); o->is_int = false; o->f = v; return true; }
    default: return false;
    }
    if (!o->neg)
        o->i = (int64_t)o->u;   /* meaningful only when u <= INT64_MAX */
    o->f = o->neg ? (double)o->i : (double)o->u;
    return true;
}

static bool num_i64(const num *n, int64_t *out)
{
    if (!n->is_int || (!n->neg && n->u > (uint64_t)INT64_MAX))
        return false;
    *out = n->i;
    return true;
}

static bool num_u64(const num *n, uint64_t *out)
{
    if (!n->is_int || n->neg)
        return false;
    *out = n->u;
    return true;
}

static bool kv_num(const gpe_gguf *g, int64_t i, num *n)
{
    const kv *e = kv_at(g, i);
    return e && num_of(e->type, e->raw, n);
}

bool gpe_gguf_kv_i64(const gpe_gguf *g, int64_t i, int64_t *out)
{
    num n;
    return kv_num(g, i, &n) && num_i64(&n, out);
}

bool gpe_gguf_kv_u64(const gpe_gguf *g, int64_t i, uint64_t *out)
{
    num n;
    return kv_num(g, i, &n) && num_u64(&n, out);
}

bool gpe_gguf_kv_f64(const gpe_gguf *g, int64_t i, double *out)
{
    num n;
    if (!kv_num(g, i, &n))
        return false;
    *out = n.f;
    return true;
}

const char *gpe_gguf_kv_str(const gpe_gguf *g, int64_t i, size_t *len)
{
    const kv *e = kv_at(g, i);
    if (!e || e->type != GPE_GGUF_STRING)
        return NULL;
    if (len)
        *len = e->s.len;
    return e->s.p;
}

bool gpe_gguf_get_i64(const gpe_gguf *g, const char *key, int64_t *out)
{
    return gpe_gguf_kv_i64(g, gpe_gguf_find_key(g, key), out);
}

bool gpe_gguf_get_u64(const gpe_gguf *g, const char *key, uint64_t *out)
{
    return gpe_gguf_kv_u64(g, gpe_gguf_find_key(g, key), out);
}

bool gpe_gguf_get_u32(const gpe_gguf *g, const char *key, uint32_t *out)
{
    uint64_t v;
    if (!gpe_gguf_get_u64(g, key, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool gpe_gguf_get_i32(const gpe_gguf *g, const char *key, int32_t *out)
{
    int64_t v;
    if (!gpe_gguf_get_i64(g, key, &v) || v < INT32_MIN || v > INT32_MAX)
        return false;
    *out = (int32_t)v;
    return true;
}

bool gpe_gguf_get_f32(const gpe_gguf *g, const char *key, float *out)
{
    const int64_t i = gpe_gguf_find_key(g, key);
    if (gpe_gguf_kv_type(g, i) == GPE_GGUF_BOOL)
        return false;
    double d;
    if (!gpe_gguf_kv_f64(g, i, &d))
        return false;
    *out = (float)d;
    return true;
}

bool gpe_gguf_get_bool(const gpe_gguf *g, const char *key, bool *out)
{
    const kv *e = kv_at(g, gpe_gguf_find_key(g, key));
    if (!e || e->type != GPE_GGUF_BOOL)
        return false;
    *out = e->raw[0] != 0;
    return true;
}

const char *gpe_gguf_get_str(const gpe_gguf *g, const char *key, size_t *len)
{
    return gpe_gguf_kv_str(g, gpe_gguf_find_key(g, key), len);
}

bool gpe_gguf_arr_info(const gpe_gguf *g, int64_t i, gpe_gguf_vtype *etype, uint64_t *n)
{
    const kv *e = kv_at(g, i);
    if (!e || e->type != GPE_GGUF_ARRAY)
        return false;
    if (etype)
        *etype = e->etype;
    if (n)
        *n = e->n;
    return true;
}

const char *gpe_gguf_arr_str(const gpe_gguf *g, int64_t i, uint64_t j, size_t *len)
{
    const kv *e = kv_at(g, i);
    if (!e || e->type != GPE_GGUF_ARRAY || !e->astr || j >= e->n)
        return NULL;
    if (len)
        *len = e->astr[j].len;
    return e->astr[j].p;
}

static bool arr_num(const gpe_gguf *g, int64_t i, uint64_t j, num *n)
{
    const kv *e = kv_at(g, i);
    if (!e || e->type != GPE_GGUF_ARRAY || !e->adata || j >= e->n)
        return false;
    return num_of(e->etype, e->adata + j * vtype_size(e->etype), n);
}

bool gpe_gguf_arr_i64(const gpe_gguf *g, int64_t i, uint64_t j, int64_t *out)
{
    num n;
    return arr_num(g, i, j, &n) && num_i64(&n, out);
}

bool gpe_gguf_arr_f32(const gpe_gguf *g, int64_t i, uint64_t j, float *out)
{
    num n;
    if (!arr_num(g, i, j, &n))
        return false;
    *out = (float)n.f;
    return true;
}

const void *gpe_gguf_arr_data(const gpe_gguf *g, int64_t i)
{
    const kv *e = kv_at(g, i);
    return (e && e->type == GPE_GGUF_ARRAY) ? (const void *)e->adata : NULL;
}

/* Append to a bounded buffer (always NUL-terminated). */
typedef struct sbuf {
    char *p;
    size_t cap, len;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->cap == 0 || b->len >= b->cap - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len = (size_t)n < b->cap - b->len ? b->len + (size_t)n : b->cap - 1;
}

static void sb_num(sbuf *b, gpe_gguf_vtype t, const uint8_t *p)
{
    num n;
    if (!num_of(t, p, &n))
        return;
    if (t == GPE_GGUF_BOOL)
        sb_add(b, "%s", n.u ? "true" : "false");
    else if (!n.is_int)
        sb_add(b, "%g", n.f);
    else if (n.neg)
        sb_add(b, "%" PRId64, n.i);
    else
        sb_add(b, "%" PRIu64, n.u);
}

size_t gpe_gguf_kv_render(const gpe_gguf *g, int64_t i, char *buf, size_t buflen, int max_items)
{
    sbuf b = {buf, buflen, 0};
    if (buflen)
        buf[0] = '\0';
    const kv *e = kv_at(g, i);
    if (!e)
        return 0;
    if (e->type == GPE_GGUF_STRING) {
        sb_add(&b, "%s", e->s.p);
    } else if (e->type == GPE_GGUF_ARRAY) {
        sb_add(&b, "[");
        uint64_t shown = e->n < (uint64_t)(max_items > 0 ? max_items : 0) ? e->n
                                                                          : (uint64_t)(max_items > 0 ? max_items : 0);
        for (uint64_t j = 0; j < shown; j++) {
            if (j)
                sb_add(&b, ", ");
            if (e->astr)
                sb_add(&b, "\"%s\"", e->astr[j].p);
            else
                sb_num(&b, e->etype, e->adata + j * vtype_size(e->etype));
        }
        if (shown < e->n)
            sb_add(&b, "%s... (%" PRIu64 " items)", shown ? ", " : "", e->n);
        sb_add(&b, "]");
    } else {
        sb_num(&b, e->type, e->raw);
    }
    return b.len;
}

int64_t gpe_gguf_n_tensors(const gpe_gguf *g) { return g->n_tensors; }

int64_t gpe_gguf_find_tensor(const gpe_gguf *g, const char *name)
{
    return hash_find(g->t_hash, g->t_hash_cap, g->tnames, sizeof(str), name);
}

const gpe_gguf_tensor *gpe_gguf_tensor_at(const gpe_gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const gpe_gguf_tensor *gpe_gguf_tensor_get(const gpe_gguf *g, const char *name)
{
    return gpe_gguf_tensor_at(g, gpe_gguf_find_tensor(g, name));
}

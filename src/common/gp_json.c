/*
 * gp_json: see gp_json.h. A strict recursive reader that builds the
 * tree with jansson's own constructors; every doubt is a NULL that sends
 * the whole text to json_loadb.
 */
#include "common/gp_json.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

#define MAX_DEPTH 64      /* deeper: jansson's (its limit is 2048) */
#define MAX_NUMBER 64     /* a longer number: jansson's */

typedef struct {
    const char *p, *end;
    gp_buf scratch; /* a string with escapes, decoded */
    int depth;
} rd;

/* Bytes a string's fast loop stops at: '"', '\\', control characters and
 * the lead of a multi-byte UTF-8 sequence. */
static const unsigned char stop_byte[256] = {
    [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 1,
};

static inline void ws(rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

/* A string after its opening quote: its bytes in *s and *n (decoded into
 * r->scratch when it had escapes). The escapes jansson takes, except \u
 * (surrogate pairs and \u0000 are jansson's). */
static bool read_str(rd *r, const char **s, size_t *n)
{
    const char *start = r->p;
    bool escaped = false;
    for (;;) {
        while (r->p < r->end && !stop_byte[(unsigned char)*r->p])
            r->p++;
        if (r->p >= r->end)
            return false;
        unsigned char ch = (unsigned char)*r->p;
        if (ch == '"')
            break;
        if (ch < 0x20)
            return false;
        if (ch == '\\') {
            if (r->p + 1 >= r->end || !memchr("\"\\/bfnrt", r->p[1], 8))
                return false;
            escaped = true;
            r->p += 2;
        } else {
            size_t k = gp_utf8_seq_len((const unsigned char *)r->p, (const unsigned char *)r->end);
            if (k == 0)
                return false;
            r->p += k;
        }
    }
    size_t len = (size_t)(r->p - start);
    r->p++; /* the closing quote */
    if (!escaped) {
        *s = start;
        *n = len;
        return true;
    }
    r->scratch.len = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = start[i];
        if (ch == '\\') {
            char e = start[++i];
            ch = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r'
                 : e == 't' ? '\t' : e; /* '"', '\\', '/' stand for themselves */
        }
        if (gp_buf_append(&r->scratch, &ch, 1) < 0)
            return false;
    }
    *s = r->scratch.data ? r->scratch.data : "";
    *n = r->scratch.len;
    return true;
}

static inline bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* A number in JSON's grammar: an integer of 1-18 digits as json_integer,
 * anything with a fraction or an exponent as jansson's real (strtod, an
 * overflow refused). */
static json_t *read_number(rd *r)
{
    const char *s = r->p, *q = s;
    if (q < r->end && *q == '-')
        q++;
    const char *d = q;
    if (q < r->end && *q == '0')
        q++;
    else
        while (q < r->end && is_digit(*q))
            q++;
    size_t nd = (size_t)(q - d);
    if (nd == 0)
        return NULL;
    bool real = false;
    if (q < r->end && *q == '.') {
        real = true;
        const char *f = ++q;
        while (q < r->end && is_digit(*q))
            q++;
        if (q == f)
            return NULL;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        real = true;
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        const char *e = q;
        while (q < r->end && is_digit(*q))
            q++;
        if (q == e)
            return NULL;
    }
    if (q < r->end && is_digit(*q))
        return NULL; /* "01": jansson's error */
    r->p = q;
    if (!real) {
        /* 19 digits fit in 64 unsigned bits; what strtoll takes is kept
         * (a server's sampler seed has 19), the rest is jansson's error. */
        if (nd > 19)
            return NULL;
        unsigned long long v = 0;
        for (const char *c = d; c < q; c++)
            v = v * 10 + (unsigned)(*c - '0');
        if (*s == '-')
            return v <= (unsigned long long)LLONG_MAX + 1 ? json_integer((json_int_t)(0 - v))
                                                         : NULL;
        return v <= (unsigned long long)LLONG_MAX ? json_integer((json_int_t)v) : NULL;
    }
    size_t len = (size_t)(q - s);
    char buf[MAX_NUMBER + 1];
    if (len > MAX_NUMBER)
        return NULL;
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    char *stop;
    double v = strtod(buf, &stop);
    if (stop != buf + len || (errno == ERANGE && v != 0))
        return NULL; /* overflow: jansson's error */
    return json_real(v);
}

static json_t *read_value(rd *r);

static json_t *read_object(rd *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return o;
    }
    for (;;) {
        ws(r);
        const char *k;
        size_t kn;
        if (r->p >= r->end || *r->p != '"')
            goto fail;
        r->p++;
        if (!read_str(r, &k, &kn))
            goto fail;
        /* A key with escapes is decoded into scratch, which the value may
         * reuse: kept aside first. */
        char small[128], *key = small;
        if (kn >= sizeof small && !(key = malloc(kn + 1)))
            goto fail;
        memcpy(key, k, kn);
        ws(r);
        json_t *v = NULL;
        if (r->p < r->end && *r->p == ':') {
            r->p++;
            v = read_value(r);
        }
        /* A duplicate key declines: json_loadb then decides, by the
         * caller's flags (the last one wins by default; the server's
         * request bodies are read with JSON_REJECT_DUPLICATES, an error). */
        if (v && json_object_getn(o, key, kn)) {
            json_decref(v);
            v = NULL;
        }
        int rc = v ? json_object_setn_new_nocheck(o, key, kn, v) : -1;
        if (key != small)
            free(key);
        if (rc < 0)
            goto fail;
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return o;
        }
        goto fail;
    }
fail:
    json_decref(o);
    return NULL;
}

static json_t *read_array(rd *r)
{
    json_t *a = json_array();
    if (!a)
        return NULL;
    ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return a;
    }
    for (;;) {
        json_t *v = read_value(r);
        if (!v || json_array_append_new(a, v) < 0)
            goto fail;
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == ']') {
            r->p++;
            return a;
        }
        goto fail;
    }
fail:
    json_decref(a);
    return NULL;
}

static bool word(rd *r, const char *w, size_t n)
{
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n) != 0)
        return false;
    r->p += n;
    return true;
}

static json_t *read_value(rd *r)
{
    ws(r);
    if (r->p >= r->end)
        return NULL;
    json_t *v = NULL;
    switch (*r->p) {
    case '{':
    case '[':
        if (++r->depth > MAX_DEPTH)
            return NULL;
        r->p++;
        v = r->p[-1] == '{' ? read_object(r) : read_array(r);
        r->depth--;
        return v;
    case '"': {
        const char *s;
        size_t n;
        r->p++;
        return read_str(r, &s, &n) ? json_stringn_nocheck(s, n) : NULL;
    }
    case 't':
        return word(r, "true", 4) ? json_true() : NULL;
    case 'f':
        return word(r, "false", 5) ? json_false() : NULL;
    case 'n':
        return word(r, "null", 4) ? json_null() : NULL;
    default:
        return read_number(r);
    }
}

/* Reals are read with strtod, as jansson reads them, only where the
 * locale's decimal point is jansson's (it swaps it in otherwise). */
static bool c_decimal_point(void)
{
    const struct lconv *lc = localeconv();
    return lc && lc->decimal_point && strcmp(lc->decimal_point, ".") == 0;
}

json_t *gp_json_read(const char *p, size_t n)
{
    rd r = {.p = p, .end = p + n};
    gp_buf_init(&r.scratch);
    json_t *v = NULL;
    ws(&r);
    if (p && r.p < r.end && (*r.p == '{' || *r.p == '[') && c_decimal_point())
        v = read_value(&r);
    ws(&r);
    if (v && r.p != r.end) {
        json_decref(v); /* trailing bytes: jansson's error */
        v = NULL;
    }
    gp_buf_free(&r.scratch);
    return v;
}

/* ------------------------------------------------------------------ */
/* Checked loads                                                       */
/* ------------------------------------------------------------------ */

/* Allocations of jansson's that failed on this thread (never reset: a
 * load compares it before and after, so a load inside a load would not
 * hide an earlier failure from the outer one). */
static _Thread_local unsigned long failed_allocs;

/* malloc, not libc's directly: a test linked with ld --wrap=malloc fails
 * it beneath this wrapper, and the count sees that failure. */
static void *counted_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        failed_allocs++;
    return p;
}

static void counted_free(void *p)
{
    free(p);
}

static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;

static void alloc_install(void)
{
    json_set_alloc_funcs(counted_malloc, counted_free);
}

void gp_json_init(void)
{
    pthread_once(&alloc_once, alloc_install);
}

unsigned long gp_json_alloc_failures(void)
{
    return failed_allocs;
}

/* What jansson would have written for an out-of-memory error, had it
 * noticed: its code sits in the text's last byte (jansson.h,
 * json_error_code). */
static void set_oom(json_error_t *err)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    err->line = err->column = err->position = -1;
    snprintf(err->source, sizeof err->source, "<buffer>");
    snprintf(err->text, sizeof err->text, "out of memory");
    err->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
}

json_t *gp_json_load_checked(const char *p, size_t n, size_t flags, json_error_t *err)
{
    gp_json_init();
    unsigned long before = failed_allocs;
    json_t *v = json_loadb(p, n, flags, err);
    if (failed_allocs == before)
        return v;
    /* Even a tree: a string may have lost a byte. */
    json_decref(v);
    set_oom(err);
    return NULL;
}

json_t *gp_json_loadb(const char *p, size_t n, json_error_t *err)
{
    json_t *v = gp_json_read(p, n);
    return v ? v : gp_json_load_checked(p, n, 0, err);
}

char *gp_json_dumps_checked(const json_t *v, size_t flags)
{
    gp_json_init();
    unsigned long before = failed_allocs;
    char *s = json_dumps(v, flags);
    if (failed_allocs == before)
        return s;
    /* Even a text: an object may have lost a member. */
    free(s);
    return NULL;
}

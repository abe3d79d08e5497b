/*
 * gp_json: see gp_json.h. The reader: one pass over the text, recursive by
 * nesting, that builds the tree with jansson's own constructors (so the
 * tree is the one json_loadb builds: the same types, key order and
 * duplicate-key handling) and refuses with its own error what json_loadb
 * refuses. Nothing here calls jansson's decoder.
 */
#include "common/gp_json.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

/* jansson reads an integer with strtoll into json_int_t: the range checks
 * below are long long's. */
#if !JSON_INTEGER_IS_LONG_LONG
#error "gp_json reads integers as jansson does when json_int_t is long long"
#endif

/* jansson's own limit (jansson_config.h). It counts every value, scalars
 * too: in "[[1]]" the 1 sits at depth 3. */
#define MAX_DEPTH JSON_PARSER_MAX_DEPTH

/* A real this long is read from a copy on the stack (strtod needs its end
 * marked); a longer one from a copy on the heap. */
#define SHORT_NUMBER 64

typedef struct {
    const char *p, *begin, *end;
    size_t flags;
    int depth;      /* values open, jansson's way (MAX_DEPTH) */
    gp_buf scratch; /* the string just read, when it had escapes: decoded */
    gp_buf keys;    /* keys with escapes, waiting for their values: a stack */
    bool nul;       /* the decoded string holds a \u0000 */
    size_t skipped; /* NUL bytes passed over after a token (skip_nul) */
    /* The first refusal: where, jansson's code for it, what. */
    bool refused;
    const char *bad_at;
    enum json_error_code bad_code;
    char bad_msg[112];
} rd;

/* Bytes a string's fast loop stops at: '"', '\\', control characters and
 * the lead of a multi-byte UTF-8 sequence. */
static const unsigned char stop_byte[256] = {
    [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 1,
};

/* A hex digit's value, -1 for another byte. */
static inline int hex_val(unsigned char c)
{
    if ((unsigned)(c - '0') < 10)
        return c - '0';
    c |= 0x20; /* lower case */
    if ((unsigned)(c - 'a') < 6)
        return c - 'a' + 10;
    return -1;
}

/* Only the first refusal counts: what follows it is its consequence. */
__attribute__((format(printf, 4, 5))) static void refuse(rd *r, const char *at,
                                                        enum json_error_code code,
                                                        const char *fmt, ...)
{
    if (r->refused)
        return;
    r->refused = true;
    r->bad_at = at;
    r->bad_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->bad_msg, sizeof r->bad_msg, fmt, ap);
    va_end(ap);
}

static void *oom(rd *r)
{
    refuse(r, r->p, json_error_out_of_memory, "out of memory");
    return NULL;
}

/* What stood at `at` where `wanted` was due: the text's end, bytes that
 * are not UTF-8 (jansson's own code for them), or another byte. */
static void *unexpected(rd *r, const char *at, enum json_error_code code, const char *wanted)
{
    if (at >= r->end) {
        refuse(r, at, json_error_premature_end_of_input, "the text ends where %s was expected",
               wanted);
        return NULL;
    }
    unsigned char c = (unsigned char)*at;
    if (c >= 0x80 && !gp_utf8_seq_len((const unsigned char *)at, (const unsigned char *)r->end))
        refuse(r, at, json_error_invalid_utf8, "invalid UTF-8 (byte 0x%02x) where %s was expected",
               c, wanted);
    else if (c > 0x20 && c < 0x7F)
        refuse(r, at, code, "expected %s, not '%c'", wanted, c);
    else
        refuse(r, at, code, "expected %s, not byte 0x%02x", wanted, c);
    return NULL;
}

/* jansson's lexer reads one byte past a number or a word (true, false,
 * null) and puts it back; a NUL byte put back is lost (its stream takes a
 * NUL in its one-byte buffer for an empty buffer), so jansson 2.14 reads
 * "[1\0]" as [1]. Accepting exactly what it accepts means passing over
 * that byte too; it is not counted in the bytes read. */
static inline void skip_nul(rd *r)
{
    if (r->p < r->end && *r->p == '\0') {
        r->p++;
        r->skipped++;
    }
}

static inline void ws(rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

/* ------------------------------------------------------------------ */
/* Strings                                                             */
/* ------------------------------------------------------------------ */

static unsigned hex4(const char *s)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 4 | (unsigned)hex_val((unsigned char)s[i]);
    return v;
}

/* cp (a Unicode scalar value) in UTF-8 at o; the bytes written. */
static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The \u escape at s (a high surrogate takes the low one after it): its
 * code point in *cp, its length in *len; false for a surrogate alone or
 * a pair that is not one. (s's escapes were checked: four hex digits.) */
static bool unicode_escape(rd *r, const char *s, const char *e, unsigned *cp, size_t *len)
{
    unsigned hi = hex4(s + 2);
    *cp = hi;
    *len = 6;
    if (hi >= 0xDC00 && hi <= 0xDFFF) {
        refuse(r, s, json_error_invalid_syntax, "lone UTF-16 surrogate \\u%04X in a string", hi);
        return false;
    }
    if (hi < 0xD800 || hi > 0xDBFF)
        return true;
    if (e - s < 12 || s[6] != '\\' || s[7] != 'u') {
        refuse(r, s, json_error_invalid_syntax, "lone UTF-16 surrogate \\u%04X in a string", hi);
        return false;
    }
    unsigned lo = hex4(s + 8);
    if (lo < 0xDC00 || lo > 0xDFFF) {
        refuse(r, s, json_error_invalid_syntax,
               "invalid UTF-16 surrogate pair \\u%04X\\u%04X in a string", hi, lo);
        return false;
    }
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    *len = 12;
    return true;
}

/* The n bytes at s (a string's, escapes checked) decoded into r->scratch;
 * r->nul says whether a \u0000 was among them. */
static bool decode_str(rd *r, const char *s, size_t n)
{
    /* Decoding never lengthens: one reservation for the whole string. */
    r->scratch.len = 0;
    if (n >= r->scratch.cap && gp_buf_grow_(&r->scratch, n) < 0) {
        oom(r);
        return false;
    }
    char *o = r->scratch.data;
    const char *q = s, *e = s + n;
    r->nul = false;
    while (q < e) {
        const char *b = memchr(q, '\\', (size_t)(e - q));
        size_t run = (size_t)((b ? b : e) - q);
        memcpy(o, q, run);
        o += run;
        q += run;
        if (!b)
            break;
        char c = q[1];
        if (c != 'u') {
            *o++ = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r'
                 : c == 't' ? '\t' : c; /* '"', '\\', '/' stand for themselves */
            q += 2;
            continue;
        }
        unsigned cp;
        size_t len;
        if (!unicode_escape(r, q, e, &cp, &len))
            return false;
        r->nul |= cp == 0;
        o += put_utf8(o, cp);
        q += len;
    }
    r->scratch.len = (size_t)(o - r->scratch.data);
    r->scratch.data[r->scratch.len] = '\0';
    return true;
}

/* An escape at s (the backslash) in a string: checked, its length. 0: not
 * an escape jansson takes (refused). */
static size_t check_escape(rd *r, const char *s)
{
    char c = s + 1 < r->end ? s[1] : '\0';
    if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
        c == 't')
        return 2;
    if (c == 'u') {
        for (int i = 2; i < 6; i++)
            if (s + i >= r->end || hex_val((unsigned char)s[i]) < 0) {
                refuse(r, s, json_error_invalid_syntax,
                       "invalid \\u escape in a string (four hex digits expected)");
                return 0;
            }
        return 6;
    }
    if (s + 1 >= r->end)
        refuse(r, s, json_error_invalid_syntax, "the text ends inside an escape");
    else if (c > 0x20 && c < 0x7F)
        refuse(r, s, json_error_invalid_syntax, "invalid escape '\\%c' in a string", c);
    else
        refuse(r, s, json_error_invalid_syntax, "invalid escape (byte 0x%02x) in a string",
               (unsigned char)c);
    return 0;
}

/* A string after its opening quote: its bytes in *s and *n (decoded into
 * r->scratch when *escaped). Refuses what jansson's lexer does: the end
 * of the text, a control character, an escape it does not know, bytes
 * that are not UTF-8 (overlong forms and surrogates included), a lone
 * surrogate. */
static bool read_str(rd *r, const char **s, size_t *n, bool *escaped)
{
    const char *start = r->p, *q = r->p;
    *escaped = false;
    for (;;) {
        while (q < r->end && !stop_byte[(unsigned char)*q])
            q++;
        if (q >= r->end) {
            refuse(r, r->end, json_error_premature_end_of_input,
                   "the text ends inside a string");
            return false;
        }
        unsigned char ch = (unsigned char)*q;
        if (ch == '"')
            break;
        size_t k;
        if (ch == '\\') {
            *escaped = true;
            k = check_escape(r, q);
        } else if (ch < 0x20) {
            refuse(r, q, json_error_invalid_syntax, "control character 0x%02x in a string",
                   ch);
            return false;
        } else {
            k = gp_utf8_seq_len((const unsigned char *)q, (const unsigned char *)r->end);
            if (!k)
                refuse(r, q, json_error_invalid_utf8, "invalid UTF-8 (byte 0x%02x) in a string",
                       ch);
        }
        if (!k)
            return false;
        q += k;
    }
    r->p = q + 1; /* past the closing quote */
    if (!*escaped) {
        *s = start;
        *n = (size_t)(q - start);
        return true;
    }
    if (!decode_str(r, start, (size_t)(q - start)))
        return false;
    *s = r->scratch.data;
    *n = r->scratch.len;
    return true;
}

static json_t *read_string_value(rd *r)
{
    const char *at = r->p++;
    const char *s;
    size_t n;
    bool escaped;
    if (!read_str(r, &s, &n, &escaped))
        return NULL;
    if (escaped && r->nul && !(r->flags & JSON_ALLOW_NUL)) {
        refuse(r, at, json_error_null_character,
               "\\u0000 in a string (not allowed without JSON_ALLOW_NUL)");
        return NULL;
    }
    json_t *v = json_stringn_nocheck(s, n);
    return v ? v : oom(r);
}

/* ------------------------------------------------------------------ */
/* Numbers and literals                                                */
/* ------------------------------------------------------------------ */

static inline bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The C locale's numbers, whatever the process's locale: strtod_l reads a
 * real as jansson does (it swaps the locale's decimal point in for '.').
 * Made once; a failure (no memory) is tried again next time. */
static _Atomic(locale_t) c_numeric;

static locale_t c_locale(void)
{
    locale_t l = atomic_load_explicit(&c_numeric, memory_order_acquire);
    if (l)
        return l;
    l = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!l)
        return (locale_t)0;
    locale_t none = (locale_t)0;
    if (!atomic_compare_exchange_strong(&c_numeric, &none, l)) {
        freelocale(l); /* another thread's came first */
        l = none;
    }
    return l;
}

/* The n bytes at s, a real in JSON's grammar, as jansson reads it:
 * strtod, an overflow to infinity refused, an underflow taken. */
static json_t *make_real(rd *r, const char *s, size_t n)
{
    char small[SHORT_NUMBER + 1], *buf = small;
    json_t *v = NULL;
    locale_t loc = c_locale();
    if (!loc)
        return oom(r);
    if (n > SHORT_NUMBER && !(buf = malloc(n + 1)))
        return oom(r);
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    double d = strtod_l(buf, NULL, loc);
    if (errno == ERANGE && isinf(d))
        refuse(r, s, json_error_numeric_overflow, "number out of range (%.20s%s)", buf,
               n > 20 ? "..." : "");
    else if (!(v = json_real(d)))
        oom(r);
    if (buf != small)
        free(buf);
    return v;
}

/* A number: the grammar's, then jansson's types: an integer (no fraction,
 * no exponent, no JSON_DECODE_INT_AS_REAL) in long long's range, else a
 * real. */
static json_t *read_number(rd *r)
{
    const char *s = r->p, *q = s;
    if (*q == '-')
        q++;
    const char *d = q;
    if (q < r->end && *q == '0')
        q++;
    else
        while (q < r->end && is_digit(*q))
            q++;
    size_t nd = (size_t)(q - d);
    if (nd == 0)
        return unexpected(r, q, json_error_invalid_syntax, "a digit");
    if (q < r->end && is_digit(*q)) {
        refuse(r, s, json_error_invalid_syntax, "a number with a leading zero");
        return NULL;
    }
    bool real = r->flags & JSON_DECODE_INT_AS_REAL;
    if (q < r->end && *q == '.') {
        real = true;
        if (++q >= r->end || !is_digit(*q))
            return unexpected(r, q, json_error_invalid_syntax, "a digit after '.'");
        while (q < r->end && is_digit(*q))
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        real = true;
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || !is_digit(*q))
            return unexpected(r, q, json_error_invalid_syntax, "a digit in the exponent");
        while (q < r->end && is_digit(*q))
            q++;
    }
    r->p = q;
    skip_nul(r);
    if (real)
        return make_real(r, s, (size_t)(q - s));
    /* No leading zeros: 20 digits or more are past 64 bits; 19 fit in 64
     * unsigned ones, and strtoll's range is checked there. */
    unsigned long long v = 0;
    bool in_range = nd <= 19;
    if (in_range) {
        for (const char *c = d; c < q; c++)
            v = v * 10 + (unsigned)(*c - '0');
        unsigned long long max = (unsigned long long)LLONG_MAX;
        in_range = v <= (*s == '-' ? max + 1 : max);
    }
    if (!in_range) {
        size_t len = (size_t)(q - s);
        refuse(r, s, json_error_numeric_overflow, "integer out of range (%.*s%s)",
               (int)(len < 20 ? len : 20), s, len > 20 ? "..." : "");
        return NULL;
    }
    json_t *j = json_integer(*s == '-' ? (json_int_t)(0 - v) : (json_int_t)v);
    return j ? j : oom(r);
}

static inline bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* true, false or null: jansson takes the whole run of letters as the word
 * ("truex" is not true followed by x). */
static json_t *read_literal(rd *r)
{
    const char *s = r->p, *q = s;
    while (q < r->end && is_alpha(*q))
        q++;
    size_t n = (size_t)(q - s);
    json_t *v = n == 4 && memcmp(s, "true", 4) == 0    ? json_true()
                : n == 5 && memcmp(s, "false", 5) == 0 ? json_false()
                : n == 4 && memcmp(s, "null", 4) == 0  ? json_null()
                                                       : NULL;
    if (!v) {
        refuse(r, s, json_error_invalid_syntax,
               "invalid word '%.*s%s' (expected a value: true, false, null, ...)",
               (int)(n < 20 ? n : 20), s, n > 20 ? "..." : "");
        return NULL;
    }
    r->p = q;
    skip_nul(r);
    return v;
}

/* ------------------------------------------------------------------ */
/* Containers                                                          */
/* ------------------------------------------------------------------ */

static json_t *read_value(rd *r);

/* Members after '{': a key, ':', a value, then ',' or '}'. A key with
 * escapes waits on r->keys (r->scratch is the value's to use). */
static json_t *read_object(rd *r)
{
    json_t *o = json_object();
    if (!o)
        return oom(r);
    ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return o;
    }
    for (;;) {
        const char *at = r->p, *k;
        size_t kn, koff = 0;
        bool escaped;
        if (r->p >= r->end || *r->p != '"') {
            unexpected(r, r->p, json_error_invalid_syntax, "a string (an object key)");
            goto fail;
        }
        r->p++;
        if (!read_str(r, &k, &kn, &escaped))
            goto fail;
        if (escaped) {
            if (r->nul) {
                refuse(r, at, json_error_null_byte_in_key, "\\u0000 in an object key");
                goto fail;
            }
            koff = r->keys.len;
            if (gp_buf_append(&r->keys, k, kn) < 0) {
                oom(r);
                goto fail;
            }
        }
        if ((r->flags & JSON_REJECT_DUPLICATES) && json_object_getn(o, k, kn)) {
            refuse(r, at, json_error_duplicate_key, "duplicate object key \"%.*s%s\"",
                   (int)(kn < 40 ? kn : 40), k, kn > 40 ? "..." : "");
            goto fail;
        }
        ws(r);
        if (r->p >= r->end || *r->p != ':') {
            unexpected(r, r->p, json_error_invalid_syntax, "':' after an object key");
            goto fail;
        }
        r->p++;
        ws(r);
        json_t *v = read_value(r);
        if (!v)
            goto fail;
        if (escaped)
            k = r->keys.data + koff; /* (the stack may have moved) */
        /* A duplicate's value replaces the earlier one in its place, as
         * in json_loadb: the same call. */
        if (json_object_setn_new_nocheck(o, k, kn, v) < 0) {
            oom(r);
            goto fail;
        }
        if (escaped)
            gp_buf_truncate(&r->keys, koff);
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            ws(r);
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return o;
        }
        unexpected(r, r->p, json_error_invalid_syntax, "',' or '}' after an object member");
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
        return oom(r);
    ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return a;
    }
    for (;;) {
        json_t *v = read_value(r);
        if (!v)
            goto fail;
        if (json_array_append_new(a, v) < 0) {
            oom(r);
            goto fail;
        }
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            ws(r);
            continue;
        }
        if (r->p < r->end && *r->p == ']') {
            r->p++;
            return a;
        }
        unexpected(r, r->p, json_error_invalid_syntax, "',' or ']' after an array element");
        goto fail;
    }
fail:
    json_decref(a);
    return NULL;
}

/* A value at r->p (whitespace before it skipped). */
static json_t *read_value(rd *r)
{
    if (r->p >= r->end)
        return unexpected(r, r->p, json_error_invalid_syntax, "a value");
    if (r->depth >= MAX_DEPTH) {
        refuse(r, r->p, json_error_stack_overflow, "nested deeper than %d values",
               MAX_DEPTH);
        return NULL;
    }
    r->depth++;
    json_t *v;
    switch (*r->p) {
    case '{':
        r->p++;
        v = read_object(r);
        break;
    case '[':
        r->p++;
        v = read_array(r);
        break;
    case '"':
        v = read_string_value(r);
        break;
    case '-':
    case '0' ... '9':
        v = read_number(r);
        break;
    case 'a' ... 'z':
    case 'A' ... 'Z':
        v = read_literal(r);
        break;
    default:
        v = unexpected(r, r->p, json_error_invalid_syntax, "a value");
        break;
    }
    r->depth--;
    return v;
}

/* ------------------------------------------------------------------ */
/* Errors and the whole text                                           */
/* ------------------------------------------------------------------ */

/* jansson's layout: the code sits in the text's last byte (jansson.h,
 * json_error_code). */
static void set_error(json_error_t *err, int line, int column, int position,
                      enum json_error_code code, const char *text)
{
    memset(err, 0, sizeof *err);
    err->line = line;
    err->column = column;
    err->position = position;
    memcpy(err->source, "<buffer>", sizeof "<buffer>");
    /* cut to leave the code's byte alone */
    size_t k = strnlen(text, JSON_ERROR_TEXT_LENGTH - 2);
    memcpy(err->text, text, k);
    err->text[k] = '\0';
    err->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)code;
}

static void set_oom(json_error_t *err)
{
    if (err)
        set_error(err, -1, -1, -1, json_error_out_of_memory, "out of memory");
}

static int clamp_int(size_t n)
{
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* The refusal in err, with its place as jansson counts it: line from 1,
 * column in characters from 1 (the character at fault's), position in
 * bytes up to and with it; at the end, the text's end. A newline at fault
 * (inside a string) counts on its string's line. */
static void set_refusal(json_error_t *err, const rd *r)
{
    if (r->bad_code == json_error_out_of_memory) {
        set_oom(err);
        return;
    }
    const char *stop = r->bad_at < r->end && *r->bad_at != '\n' ? r->bad_at + 1 : r->bad_at;
    size_t line = 1, column = 0;
    for (const char *q = r->begin; q < stop; q++) {
        if (*q == '\n') {
            line++;
            column = 0;
        } else if (((unsigned char)*q & 0xC0) != 0x80) {
            column++;
        }
    }
    char text[sizeof r->bad_msg + 64];
    snprintf(text, sizeof text, "%s at line %zu, column %zu", r->bad_msg, line, column);
    set_error(err, clamp_int(line), clamp_int(column), clamp_int((size_t)(stop - r->begin)),
              r->bad_code, text);
}

/* The reader over p[0..n) with jansson's load flags: the tree, or NULL
 * with err (may be NULL) saying why. */
static json_t *read_text(const char *p, size_t n, size_t flags, json_error_t *err)
{
    if (!p) {
        if (err)
            set_error(err, -1, -1, 0, json_error_invalid_argument,
                      "no JSON text (a NULL buffer)");
        return NULL;
    }
    rd r = {.p = p, .begin = p, .end = p + n, .flags = flags};
    gp_buf_init(&r.scratch);
    gp_buf_init(&r.keys);
    json_t *v = NULL;
    ws(&r);
    if (!(flags & JSON_DECODE_ANY) && (r.p >= r.end || (*r.p != '{' && *r.p != '[')))
        unexpected(&r, r.p, json_error_invalid_syntax, "'{' or '[' (an object or an array)");
    else
        v = read_value(&r);
    if (v && !(flags & JSON_DISABLE_EOF_CHECK)) {
        ws(&r);
        if (r.p < r.end) {
            unexpected(&r, r.p, json_error_end_of_input_expected,
                       "the end of the text after the value");
            json_decref(v);
            v = NULL;
        }
    }
    gp_buf_free(&r.scratch);
    gp_buf_free(&r.keys);
    if (!err)
        return v;
    if (v) /* as jansson leaves it: no text, the bytes read in position */
        set_error(err, -1, -1, clamp_int((size_t)(r.p - p) - r.skipped), json_error_unknown,
                  "");
    else
        set_refusal(err, &r);
    return v;
}

json_t *gp_json_read(const char *p, size_t n)
{
    return gp_json_load_checked(p, n, JSON_REJECT_DUPLICATES, NULL);
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

json_t *gp_json_load_checked(const char *p, size_t n, size_t flags, json_error_t *err)
{
    gp_json_init();
    unsigned long before = failed_allocs;
    json_t *v = read_text(p, n, flags, err);
    if (failed_allocs == before)
        return v;
    /* The reader sees every failed constructor itself; this is for a
     * failure jansson might have kept to itself. */
    json_decref(v);
    set_oom(err);
    return NULL;
}

json_t *gp_json_loadb(const char *p, size_t n, json_error_t *err)
{
    return gp_json_load_checked(p, n, 0, err);
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

/* jregex: JSON Schema patterns as position automata (jregex.h). */
#include "jregex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A syntax tree of the pattern; quantifiers are expanded into copies, so
 * that every leaf is one position of the automaton. */
enum { R_EMPTY, R_CLS, R_CAT, R_ALT, R_STAR, R_OPT };

#define RE_MAX_NODES 2048

typedef struct re_node {
    uint8_t op;
    int a, b;
    uint8_t cls[32];
} re_node;

typedef struct re_ctx {
    const char *s;
    size_t at;
    re_node *nodes;     /* [RE_MAX_NODES] */
    int n;
    char *err;
    size_t errlen;
    bool failed;
    bool oom;           /* the failure was an allocation (oom), not the pattern */
    bool full;          /* gpe_jre_compile_full: every character, ECMA-262's classes */
} re_ctx;

static int fail(re_ctx *c, const char *fmt, ...)
{
    if (!c->failed && c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    c->failed = true;
    return -1;
}

/* Every allocation failure comes here: the caller's status says out of
 * memory (the server's fault, retryable) rather than a pattern refused. */
static int oom(re_ctx *c)
{
    c->oom = true;
    return fail(c, "out of memory");
}

static int node(re_ctx *c, int op, int a, int b)
{
    if (c->failed)
        return -1;
    if (c->n >= RE_MAX_NODES)
        return fail(c, "pattern is too complex (its quantifiers expand too far)");
    re_node *r = &c->nodes[c->n];
    memset(r, 0, sizeof *r);
    r->op = (uint8_t)op;
    r->a = a;
    r->b = b;
    return c->n++;
}

static void set_bit(uint8_t *cls, unsigned ch)
{
    cls[ch >> 3] |= (uint8_t)(1u << (ch & 7));
}

/* Bytes a character of a JSON string written without escapes may start
 * with: printable ASCII but '"' and '\', DEL, UTF-8 lead bytes. */
static bool raw_ok(unsigned ch)
{
    return (ch >= 0x20 && ch <= 0x7F && ch != '"' && ch != '\\') || (ch >= 0xC2 && ch <= 0xF4);
}

/* The bytes a character may start with: those a raw JSON string holds, or
 * in full mode any (ASCII or a UTF-8 lead byte). */
static bool char_ok(const re_ctx *c, unsigned ch)
{
    return c->full ? ch < 0x80 || (ch >= 0xC2 && ch <= 0xF4) : raw_ok(ch);
}

/* Any character; `.` (dot) in full mode leaves out the line terminators
 * ECMA-262 names that one byte tells apart (\n, \r; U+2028/2029 share their
 * lead byte with other characters and are taken). */
static void cls_any(const re_ctx *c, uint8_t *cls, bool dot)
{
    for (unsigned ch = 0; ch < 256; ch++)
        if (char_ok(c, ch) && !(c->full && dot && (ch == '\n' || ch == '\r')))
            set_bit(cls, ch);
}

/* A negated set: every character but the ASCII ones in set. */
static void cls_negate(const re_ctx *c, uint8_t *cls)
{
    for (unsigned ch = 0; ch < 256; ch++) {
        bool in = cls[ch >> 3] & (1u << (ch & 7));
        cls[ch >> 3] &= (uint8_t)~(1u << (ch & 7));
        if (char_ok(c, ch) && (ch >= 0x80 || !in))
            set_bit(cls, ch);
    }
}

static void cls_range(uint8_t *cls, unsigned lo, unsigned hi)
{
    for (unsigned ch = lo; ch <= hi; ch++)
        set_bit(cls, ch);
}

/* \d \w \s and their negations into cls; false for another letter. */
static bool cls_shorthand(const re_ctx *c, uint8_t *cls, char e)
{
    uint8_t t[32] = {0};
    switch (e | 0x20) {
    case 'd':
        cls_range(t, '0', '9');
        break;
    case 'w':
        cls_range(t, '0', '9');
        cls_range(t, 'a', 'z');
        cls_range(t, 'A', 'Z');
        set_bit(t, '_');
        break;
    case 's':
        set_bit(t, ' ');   /* the only space a raw JSON string holds in ASCII */
        if (c->full)       /* ECMA-262's ASCII white space (non-ASCII: not matched) */
            for (const char *w = "\t\n\v\f\r"; *w; w++)
                set_bit(t, (unsigned char)*w);
        break;
    default:
        return false;
    }
    if (e >= 'A' && e <= 'Z')
        cls_negate(c, t);
    for (int i = 0; i < 32; i++)
        cls[i] |= t[i];
    return true;
}

/* One escaped character (after the backslash) as a literal byte, or a
 * shorthand class; -1 on what the subset refuses. */
static int escape(re_ctx *c, uint8_t *cls, int *lit)
{
    char e = c->s[c->at];
    if (!e)
        return fail(c, "pattern ends with a lone '\\'");
    c->at++;
    *lit = -1;
    if (cls_shorthand(c, cls, e))
        return 0;
    if (strchr("tnrfv", e) && e) {
        *lit = e == 't' ? '\t' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 'f' ? '\f' : '\v';
        return 0;
    }
    if (strchr(".\\/-[](){}*+?|^$", e)) {
        *lit = (unsigned char)e;
        return 0;
    }
    if (e == 'b' || e == 'B')
        return fail(c, "pattern: word boundaries (\\%c) are not supported", e);
    if (e >= '0' && e <= '9')
        return fail(c, "pattern: backreferences and \\0 are not supported");
    return fail(c, "pattern: the escape \\%c is not supported", e);
}

static int class_atom(re_ctx *c)
{
    int id = node(c, R_CLS, -1, -1);
    if (id < 0)
        return -1;
    uint8_t *cls = c->nodes[id].cls;
    bool neg = c->s[c->at] == '^';
    c->at += neg;
    bool first = true;
    while (c->s[c->at] && (c->s[c->at] != ']' || first)) {
        first = false;
        int lo;
        if (c->s[c->at] == '\\') {
            c->at++;
            if (escape(c, cls, &lo) < 0)
                return -1;
            if (lo < 0)
                continue;   /* a shorthand class */
        } else {
            lo = (unsigned char)c->s[c->at++];
        }
        int hi = lo;
        if (c->s[c->at] == '-' && c->s[c->at + 1] && c->s[c->at + 1] != ']') {
            c->at++;
            if (c->s[c->at] == '\\') {
                c->at++;
                if (escape(c, cls, &hi) < 0)
                    return -1;
                if (hi < 0)
                    return fail(c, "pattern: a class shorthand cannot end a range");
            } else {
                hi = (unsigned char)c->s[c->at++];
            }
        }
        if (lo >= 0x80 || hi >= 0x80)
            return fail(c, "pattern: non-ASCII characters are not supported");
        if (hi < lo)
            return fail(c, "pattern: range out of order in a class");
        cls_range(cls, (unsigned)lo, (unsigned)hi);
    }
    if (c->s[c->at] != ']')
        return fail(c, "pattern: unterminated character class");
    c->at++;
    if (neg)
        cls_negate(c, cls);
    for (unsigned ch = 0; ch < 256; ch++)
        if (!char_ok(c, ch))
            cls[ch >> 3] &= (uint8_t)~(1u << (ch & 7));
    return id;
}

static int parse_alt(re_ctx *c);

static int atom(re_ctx *c)
{
    char ch = c->s[c->at];
    if (ch == '(') {
        c->at++;
        if (c->s[c->at] == '?') {
            if (c->s[c->at + 1] != ':')
                return fail(c, "pattern: lookaround and named groups are not supported");
            c->at += 2;
        }
        int in = parse_alt(c);
        if (in < 0)
            return -1;
        if (c->s[c->at] != ')')
            return fail(c, "pattern: missing ')'");
        c->at++;
        return in;
    }
    if (ch == '[') {
        c->at++;
        return class_atom(c);
    }
    if (ch == '^' || ch == '$')
        return fail(c, "pattern: '%c' is supported only at the %s", ch,
                    ch == '^' ? "start" : "end");
    if (strchr("*+?{", ch))
        return fail(c, "pattern: '%c' has nothing to repeat", ch);
    if (ch == ')')
        return fail(c, "pattern: unmatched ')'");
    int id = node(c, R_CLS, -1, -1);
    if (id < 0)
        return -1;
    uint8_t *cls = c->nodes[id].cls;
    c->at++;
    if (ch == '.') {
        cls_any(c, cls, true);
        return id;
    }
    int lit = (unsigned char)ch;
    if (ch == '\\' && escape(c, cls, &lit) < 0)
        return -1;
    if (lit >= 0x80)
        return fail(c, "pattern: non-ASCII characters are not supported");
    if (lit >= 0 && char_ok(c, (unsigned)lit))
        set_bit(cls, (unsigned)lit);
    return id;
}

static int clone(re_ctx *c, int t)
{
    if (t < 0)
        return -1;
    re_node r = c->nodes[t];
    int a = r.a >= 0 ? clone(c, r.a) : -1;
    int b = r.b >= 0 ? clone(c, r.b) : -1;
    if ((r.a >= 0 && a < 0) || (r.b >= 0 && b < 0))
        return -1;
    int id = node(c, r.op, a, b);
    if (id >= 0)
        memcpy(c->nodes[id].cls, r.cls, sizeof r.cls);
    return id;
}

static int cat(re_ctx *c, int a, int b)
{
    return a < 0 || b < 0 ? -1 : node(c, R_CAT, a, b);
}

/* t repeated lo..hi times (hi < 0: unbounded), as copies of t. */
static int repeat(re_ctx *c, int t, long lo, long hi)
{
    int out = node(c, R_EMPTY, -1, -1);
    for (long i = 0; i < lo && out >= 0; i++)
        out = cat(c, out, i == 0 ? t : clone(c, t));
    int tail;
    if (hi < 0) {
        tail = node(c, R_STAR, lo ? clone(c, t) : t, -1);
    } else {
        tail = node(c, R_EMPTY, -1, -1);
        for (long i = lo; i < hi && tail >= 0; i++)
            tail = node(c, R_OPT, cat(c, i == lo && lo == 0 ? t : clone(c, t), tail), -1);
    }
    return cat(c, out, tail);
}

/* {n}, {n,}, {n,m} after the '{'; false when it is not a quantifier. */
static bool braces(re_ctx *c, long *lo, long *hi)
{
    char *end;
    const char *p = c->s + c->at;
    if (*p < '0' || *p > '9')
        return false;
    *lo = strtol(p, &end, 10);
    *hi = *lo;
    if (*end == ',') {
        end++;
        *hi = -1;
        if (*end >= '0' && *end <= '9')
            *hi = strtol(end, &end, 10);
    }
    if (*end != '}')
        return false;
    c->at = (size_t)(end + 1 - c->s);
    return true;
}

static int parse_repeat(re_ctx *c)
{
    int t = atom(c);
    for (;;) {
        if (t < 0)
            return -1;
        char q = c->s[c->at];
        long lo, hi;
        if (q == '*' || q == '+' || q == '?') {
            c->at++;
            lo = q == '+';
            hi = q == '?' ? 1 : -1;
        } else if (q == '{') {
            c->at++;
            if (!braces(c, &lo, &hi))
                return fail(c, "pattern: '{' must start a {n}, {n,} or {n,m} quantifier");
            if (lo > 1000 || hi > 1000 || (hi >= 0 && hi < lo))
                return fail(c, "pattern: quantifier {%ld,%ld} out of range", lo, hi);
        } else {
            return t;
        }
        if (c->s[c->at] == '?')
            c->at++;   /* lazy: the same strings */
        t = repeat(c, t, lo, hi);
    }
}

static int parse_cat(re_ctx *c)
{
    int t = node(c, R_EMPTY, -1, -1);
    while (t >= 0 && c->s[c->at] && c->s[c->at] != '|' && c->s[c->at] != ')')
        t = cat(c, t, parse_repeat(c));
    return t;
}

static int parse_alt(re_ctx *c)
{
    int t = parse_cat(c);
    while (t >= 0 && c->s[c->at] == '|') {
        c->at++;
        int u = parse_cat(c);
        t = u < 0 ? -1 : node(c, R_ALT, t, u);
    }
    return t;
}

/* Glushkov construction: positions numbered in leaf order. */
typedef struct gl {
    bool nullable;
    uint64_t first, last;
} gl;

static int build(re_ctx *c, gpe_jre *r, int t, gl *out)
{
    re_node *n = &c->nodes[t];
    gl a = {true, 0, 0}, b = {true, 0, 0};
    switch (n->op) {
    case R_EMPTY:
        *out = a;
        return 0;
    case R_CLS:
        if (r->n >= GPE_JRE_MAX)
            return fail(c, "pattern is too complex (more than %d positions once its "
                        "quantifiers are expanded)", GPE_JRE_MAX);
        memcpy(r->cls[r->n], n->cls, sizeof n->cls);
        out->nullable = false;
        out->first = out->last = (uint64_t)1 << r->n;
        r->n++;
        return 0;
    default:
        break;
    }
    if (build(c, r, n->a, &a) < 0 || (n->b >= 0 && build(c, r, n->b, &b) < 0))
        return -1;
    switch (n->op) {
    case R_CAT:
        for (uint64_t s = a.last; s; s &= s - 1)
            r->follow[__builtin_ctzll(s)] |= b.first;
        out->nullable = a.nullable && b.nullable;
        out->first = a.first | (a.nullable ? b.first : 0);
        out->last = b.last | (b.nullable ? a.last : 0);
        return 0;
    case R_ALT:
        out->nullable = a.nullable || b.nullable;
        out->first = a.first | b.first;
        out->last = a.last | b.last;
        return 0;
    case R_STAR:
        for (uint64_t s = a.last; s; s &= s - 1)
            r->follow[__builtin_ctzll(s)] |= a.first;
        /* fallthrough */
    default:   /* R_OPT */
        *out = a;
        out->nullable = true;
        return 0;
    }
}

static bool cls_empty(const uint8_t *cls)
{
    for (int i = 0; i < 32; i++)
        if (cls[i])
            return false;
    return true;
}

/* Fewest characters after each position to a match (Bellman-Ford over at
 * most 63 positions); a position no character matches is dead. */
static void distances(gpe_jre *r)
{
    for (int p = 0; p < r->n; p++)
        r->dist[p] = (r->last >> p) & 1 ? 0 : GPE_JRE_DEAD;
    for (int round = 0; round < r->n; round++) {
        bool changed = false;
        for (int p = 0; p < r->n; p++)
            for (uint64_t s = r->follow[p]; s; s &= s - 1) {
                int q = __builtin_ctzll(s);
                if (r->dist[q] != GPE_JRE_DEAD && !cls_empty(r->cls[q]) &&
                    r->dist[q] + 1 < r->dist[p]) {
                    r->dist[p] = r->dist[q] + 1;
                    changed = true;
                }
            }
        if (!changed)
            break;
    }
    r->start_dist = r->nullable ? 0 : GPE_JRE_DEAD;
    for (uint64_t s = r->first; s; s &= s - 1) {
        int q = __builtin_ctzll(s);
        if (r->dist[q] != GPE_JRE_DEAD && !cls_empty(r->cls[q]) && r->dist[q] + 1 < r->start_dist)
            r->start_dist = r->dist[q] + 1;
    }
}

int32_t gpe_jre_remaining(const gpe_jre *r, uint64_t st)
{
    if (st & GPE_JRE_START)
        return r->start_dist;
    int32_t m = GPE_JRE_DEAD;
    for (uint64_t s = st; s; s &= s - 1) {
        int p = __builtin_ctzll(s);
        m = r->dist[p] < m ? r->dist[p] : m;
    }
    return m;
}

/* The pattern's tree, the anchors stripped; -1 on failure (c says why). */
static int parse_pattern(re_ctx *c, const char *pattern, bool *head, bool *tail)
{
    size_t len = strlen(pattern);
    *head = len > 0 && pattern[0] == '^';
    /* a final '$' not itself escaped (an even number of '\' before it) */
    size_t bs = 0;
    while (len >= 2 + bs && pattern[len - 2 - bs] == '\\')
        bs++;
    *tail = len > (size_t)*head && pattern[len - 1] == '$' && bs % 2 == 0;
    char *body = strndup(pattern + *head, len - *head - *tail);
    if (!body)
        return oom(c);
    c->s = body;
    int t = parse_alt(c);
    if (t >= 0 && c->s[c->at])
        t = fail(c, "pattern: unmatched ')'");
    /* unanchored: anything may come before or after (JSON Schema searches) */
    if (t >= 0 && !*head) {
        int any = node(c, R_CLS, -1, -1);
        if (any >= 0)
            cls_any(c, c->nodes[any].cls, false);
        t = cat(c, node(c, R_STAR, any, -1), t);
    }
    if (t >= 0 && !*tail) {
        int any = node(c, R_CLS, -1, -1);
        if (any >= 0)
            cls_any(c, c->nodes[any].cls, false);
        t = cat(c, t, node(c, R_STAR, any, -1));
    }
    c->s = NULL;
    free(body);
    return t;
}

static gpe_jre *compile_generic(const char *pattern, bool full, char *err, size_t errlen,
                                gpe_status *st)
{
    re_ctx c = {.err = err, .errlen = errlen, .full = full};
    gpe_jre *r = NULL;
    bool head, tail;
    gl g;
    c.nodes = malloc(RE_MAX_NODES * sizeof *c.nodes);
    if (!c.nodes) {
        oom(&c);
        goto fail;
    }
    int t = parse_pattern(&c, pattern, &head, &tail);
    if (t < 0)
        goto fail;
    if (!(r = calloc(1, sizeof *r))) {
        oom(&c);
        goto fail;
    }
    if (build(&c, r, t, &g) < 0)
        goto fail;
    r->nullable = g.nullable;
    r->first = g.first;
    r->last = g.last;
    for (int p = 0; p < r->n; p++)
        for (unsigned ch = 0; ch < 256; ch++)
            if (r->cls[p][ch >> 3] & (1u << (ch & 7)))
                r->by_byte[ch] |= (uint64_t)1 << p;
    distances(r);
    if (r->start_dist == GPE_JRE_DEAD) {
        fail(&c, "pattern '%s' matches no %s", pattern,
             full ? "string" : "JSON string written without escapes");
        goto fail;
    }
    free(c.nodes);
    if (st)
        *st = GPE_OK;
    return r;
fail:
    free(c.nodes);
    free(r);
    if (st)
        *st = c.oom ? GPE_ERR_NOMEM : GPE_ERR_UNSUPPORTED;
    return NULL;
}

gpe_jre *gpe_jre_compile(const char *pattern, char *err, size_t errlen)
{
    return compile_generic(pattern, false, err, errlen, NULL);
}

gpe_jre *gpe_jre_compile_full(const char *pattern, char *err, size_t errlen)
{
    return compile_generic(pattern, true, err, errlen, NULL);
}

gpe_jre *gpe_jre_compile_status(const char *pattern, bool full, char *err, size_t errlen,
                                gpe_status *st)
{
    return compile_generic(pattern, full, err, errlen, st);
}

void gpe_jre_free(gpe_jre *r)
{
    free(r);
}

/* Facts: the syntax of RFC 3339 full-date / full-time / date-time (offset
 * required, upper-case T and Z), RFC 4122 UUIDs, dotted-quad IPv4; email as
 * the common local@domain.tld shape (a subset of RFC 5321 addresses). */
const char *gpe_jre_format_pattern(const char *format)
{
#define JRE_DATE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define JRE_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define JRE_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    static const char *const table[][2] = {
        {"date", "^" JRE_DATE "$"},
        {"time", "^" JRE_TIME "$"},
        {"date-time", "^" JRE_DATE "T" JRE_TIME "$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"email", "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$"},
        {"ipv4", "^" JRE_OCTET "(\\." JRE_OCTET "){3}$"},
    };
    for (size_t i = 0; format && i < sizeof table / sizeof table[0]; i++)
        if (strcmp(format, table[i][0]) == 0)
            return table[i][1];
    return NULL;
}

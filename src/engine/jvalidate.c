/*
 * jvalidate: checking a finished JSON value against a JSON Schema.
 * Interface and the keywords understood in jvalidate.h.
 *
 * gpe_jv_new walks every schema reachable from the root (through $ref too,
 * each once), refusing what it does not know and compiling each pattern and
 * format once; gpe_jv_check then interprets the schema tree directly over
 * the value, looking compiled patterns up by their schema object.
 */
#include "jvalidate.h"

#include "jcheck.h"
#include "jregex.h"
#include "jschema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WALK_DEPTH 128       /* schema nesting gpe_jv_new follows */
#define MAX_CHECK_DEPTH 1024     /* schema applications in one check, nested */
#define CHECK_BUDGET (1L << 22)  /* schema applications in one check, in all: about
                                    0.5 s of the openai loop thread at worst */
#define PATH_MAX_LEN 400

/* A compiled pattern or format, found by the schema object that holds it. */
typedef struct jv_re {
    const json_t *owner;
    bool format;
    gpe_jre *re;
} jv_re;

struct gpe_jv {
    json_t *root;          /* a reference */
    jv_re *re;
    int n_re, cap_re;
    const json_t **seen;   /* gpe_jv_new: schema objects walked */
    int n_seen, cap_seen;
};

/* =========================================================== making one */

typedef struct wctx {
    gpe_jv *v;
    char *err;
    size_t errlen;
    bool oom;   /* the failure was an allocation's (woom), not the schema's */
} wctx;

static int wfail(wctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wfail(wctx *c, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Every allocation failure comes here, so that the status says out of
 * memory (the agent's own failure: the job fails over) and not a schema
 * refused (the client's INVALID_REQUEST), as jschema.c's oom() does. */
static int woom(wctx *c)
{
    c->oom = true;
    return wfail(c, "out of memory");
}

static bool in_list(const char *k, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i]))
            return true;
    return false;
}

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment",
                                          "default", "examples", "deprecated", "readOnly",
                                          "writeOnly", NULL};
static const char *const counts[] = {"minItems", "maxItems", "minLength", "maxLength", NULL};
static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum", NULL};
static const char *const subs[] = {"items", "additionalProperties", NULL};
static const char *const lists[] = {"anyOf", "oneOf", "allOf", NULL};
static const char *const maps[] = {"properties", NULL};
/* Definitions are walked only as far as a $ref reaches, as jschema
 * compiles them: one that nothing uses may hold anything. */
static const char *const defs[] = {"$defs", "definitions", NULL};
static const char *const types[] = {"object", "array", "string", "number", "integer",
                                    "boolean", "null", NULL};

static int add_re(wctx *c, const json_t *owner, bool format, const char *text, const char *path)
{
    gpe_jv *v = c->v;
    if (v->n_re == v->cap_re) {
        int cap = v->cap_re ? v->cap_re * 2 : 8;
        jv_re *n = realloc(v->re, (size_t)cap * sizeof *n);
        if (!n)
            return woom(c);
        v->re = n;
        v->cap_re = cap;
    }
    char why[200];
    gpe_status st;
    gpe_jre *re = gpe_jre_compile_status(text, true, why, sizeof why, &st);
    if (!re)
        return st == GPE_ERR_NOMEM ? woom(c) : wfail(c, "%s at %s", why, path);
    v->re[v->n_re++] = (jv_re){.owner = owner, .format = format, .re = re};
    return 0;
}

static int walk(wctx *c, const json_t *s, const char *path, int depth);

/* One keyword of schema object s: its value's kind, and the schemas in it. */
static int walk_keyword(wctx *c, const json_t *s, const char *k, const json_t *val,
                        const char *path, int depth)
{
    char sub[512];
    if (in_list(k, annotations))
        return 0;
    if (in_list(k, defs)) {
        if (!json_is_object(val))
            return wfail(c, "'%s' at %s must be an object", k, path);
        return 0;
    }
    if (!strcmp(k, "type")) {
        const json_t *t;
        size_t i;
        if (json_is_string(val) && in_list(json_string_value(val), types))
            return 0;
        if (!json_is_array(val) || json_array_size(val) == 0)
            return wfail(c, "'type' at %s must be a type name or an array of them", path);
        json_array_foreach(val, i, t) {
            if (!json_is_string(t) || !in_list(json_string_value(t), types))
                return wfail(c, "'type' at %s must list type names", path);
        }
        return 0;
    }
    if (in_list(k, counts)) {
        if (!json_is_integer(val) || json_integer_value(val) < 0)
            return wfail(c, "'%s' at %s must be a non-negative integer", k, path);
        return 0;
    }
    if (in_list(k, bounds)) {
        if (!json_is_number(val))
            return wfail(c, "'%s' at %s must be a number", k, path);
        return 0;
    }
    if (!strcmp(k, "uniqueItems")) {
        if (!json_is_false(val))
            return wfail(c, "unsupported JSON Schema keyword 'uniqueItems' at %s (only false)",
                         path);
        return 0;
    }
    if (!strcmp(k, "enum")) {
        if (!json_is_array(val))
            return wfail(c, "'enum' at %s must be an array", path);
        return 0;
    }
    if (!strcmp(k, "const"))
        return 0;
    if (!strcmp(k, "required")) {
        const json_t *r;
        size_t i;
        if (!json_is_array(val))
            return wfail(c, "'required' at %s must be an array", path);
        json_array_foreach(val, i, r) {
            if (!json_is_string(r))
                return wfail(c, "'required' at %s must list strings", path);
        }
        return 0;
    }
    if (!strcmp(k, "pattern") || !strcmp(k, "format")) {
        bool fmt = k[0] == 'f';
        if (!json_is_string(val))
            return wfail(c, "'%s' at %s must be a string", k, path);
        const char *text = json_string_value(val);
        if (fmt && !(text = gpe_jre_format_pattern(text)))
            return wfail(c, "'format' '%s' at %s is not supported (supported: date, time, "
                         "date-time, uuid, email, ipv4)", json_string_value(val), path);
        return add_re(c, s, fmt, text, path);
    }
    if (!strcmp(k, "$ref")) {
        const json_t *t =
            json_is_string(val) ? gpe_jschema_pointer(c->v->root, json_string_value(val)) : NULL;
        if (!t)
            return wfail(c, "'$ref' at %s: only local references (\"#/$defs/name\") that "
                         "resolve are supported", path);
        return walk(c, t, json_string_value(val), depth + 1);
    }
    if (in_list(k, subs)) {
        if (!strcmp(k, "items") && json_is_array(val))
            return wfail(c, "unsupported JSON Schema keyword 'items' (array form) at %s", path);
        snprintf(sub, sizeof sub, "%s/%s", path, k);
        return walk(c, val, sub, depth + 1);
    }
    if (in_list(k, lists)) {
        const json_t *a;
        size_t i;
        if (!json_is_array(val) || json_array_size(val) == 0)
            return wfail(c, "'%s' at %s must be a non-empty array of schemas", k, path);
        json_array_foreach(val, i, a) {
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, k, i);
            if (walk(c, a, sub, depth + 1) < 0)
                return -1;
        }
        return 0;
    }
    if (in_list(k, maps)) {
        const char *pk;
        const json_t *ps;
        if (!json_is_object(val))
            return wfail(c, "'%s' at %s must be an object", k, path);
        json_object_foreach((json_t *)val, pk, ps) {
            snprintf(sub, sizeof sub, "%s/%s/%s", path, k, pk);
            if (walk(c, ps, sub, depth + 1) < 0)
                return -1;
        }
        return 0;
    }
    return wfail(c, "unsupported JSON Schema keyword '%s' at %s", k, path);
}

/* Schema s (true, false or an object) and everything it reaches, once. */
static int walk(wctx *c, const json_t *s, const char *path, int depth)
{
    gpe_jv *v = c->v;
    if (json_is_boolean(s))
        return 0;
    if (!json_is_object(s))
        return wfail(c, "schema at %s must be an object or a boolean", path);
    for (int i = 0; i < v->n_seen; i++)
        if (v->seen[i] == s)
            return 0;
    if (depth > MAX_WALK_DEPTH)
        return wfail(c, "schema nested too deeply at %s", path);
    if (v->n_seen == v->cap_seen) {
        int cap = v->cap_seen ? v->cap_seen * 2 : 32;
        const json_t **n = realloc(v->seen, (size_t)cap * sizeof *n);
        if (!n)
            return woom(c);
        v->seen = n;
        v->cap_seen = cap;
    }
    v->seen[v->n_seen++] = s;
    const char *k;
    const json_t *val;
    json_object_foreach((json_t *)s, k, val) {
        if (walk_keyword(c, s, k, val, path, depth) < 0)
            return -1;
    }
    return 0;
}

gpe_jv *gpe_jv_new_status(const json_t *schema, char *err, size_t errlen, gpe_status *st)
{
    gpe_jv *v = calloc(1, sizeof *v);
    wctx c = {.v = v, .err = err, .errlen = errlen};
    gpe_status why = GPE_ERR_UNSUPPORTED;
    if (!v) {
        woom(&c);
        goto fail;
    }
    v->root = json_incref((json_t *)schema);
    if (!schema) {
        wfail(&c, "no schema");
        why = GPE_ERR_ARG;
        goto fail;
    }
    if (walk(&c, schema, "#", 0) < 0)
        goto fail;
    free(v->seen);   /* only the walk needs it */
    v->seen = NULL;
    v->n_seen = v->cap_seen = 0;
    if (st)
        *st = GPE_OK;
    return v;
fail:
    gpe_jv_free(v);
    if (st)
        *st = c.oom ? GPE_ERR_NOMEM : why;
    return NULL;
}

gpe_jv *gpe_jv_new(const json_t *schema, char *err, size_t errlen)
{
    return gpe_jv_new_status(schema, err, errlen, NULL);
}

void gpe_jv_free(gpe_jv *v)
{
    if (!v)
        return;
    for (int i = 0; i < v->n_re; i++)
        gpe_jre_free(v->re[i].re);
    free(v->re);
    free(v->seen);
    json_decref(v->root);
    free(v);
}

/* ============================================================= checking */

typedef struct cctx {
    gpe_jv *v;
    char *msg;
    size_t msglen;
    char path[PATH_MAX_LEN + 8];   /* the value's place, a JSON Pointer */
    size_t plen;
    long budget;
    bool over;                     /* the budget or the depth ran out: ERROR */
} cctx;

static int cfail(cctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(cctx *c, const char *fmt, ...)
{
    if (c->msg && c->msglen) {
        int n = snprintf(c->msg, c->msglen, "at %s: ", c->plen ? c->path : "/");
        if (n >= 0 && (size_t)n < c->msglen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->msg + n, c->msglen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return 1;
}

/* Append one pointer segment (~ and / escaped); returns the length to
 * restore. A path past PATH_MAX_LEN ends in "/...". */
static size_t path_push(cctx *c, const char *seg, size_t seglen)
{
    size_t at = c->plen;
    if (c->plen >= PATH_MAX_LEN)
        return at;
    c->path[c->plen++] = '/';
    for (size_t i = 0; i < seglen && c->plen < PATH_MAX_LEN; i++) {
        if (seg[i] == '~' || seg[i] == '/') {
            c->path[c->plen++] = '~';
            c->path[c->plen++] = seg[i] == '~' ? '0' : '1';
        } else {
            c->path[c->plen++] = seg[i];
        }
    }
    if (c->plen >= PATH_MAX_LEN) {
        memcpy(c->path + PATH_MAX_LEN, "/...", 4);
        c->plen = PATH_MAX_LEN + 4;
    }
    c->path[c->plen] = '\0';
    return at;
}

static void path_pop(cctx *c, size_t at)
{
    c->plen = at;
    c->path[at] = '\0';
}

/* JSON equality as JSON Schema has it: numbers by value (1 == 1.0). */
static bool same(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b))
        return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    }
    if (json_is_object(a)) {
        const char *k;
        const json_t *x;
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach((json_t *)a, k, x) {
            const json_t *y = json_object_get(b, k);
            if (!y || !same(x, y))
                return false;
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b);   /* strings, true, false, null */
}

static bool is_type(const json_t *v, const char *t)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return !strcmp(t, "object");
    case JSON_ARRAY:
        return !strcmp(t, "array");
    case JSON_STRING:
        return !strcmp(t, "string");
    case JSON_INTEGER:
        return !strcmp(t, "integer") || !strcmp(t, "number");
    case JSON_REAL: {
        double d = json_real_value(v);
        return !strcmp(t, "number") || (!strcmp(t, "integer") && d == floor(d));
    }
    case JSON_TRUE:
    case JSON_FALSE:
        return !strcmp(t, "boolean");
    case JSON_NULL:
        return !strcmp(t, "null");
    }
    return false;
}

static const char *type_name(const json_t *v)
{
    static const char *const names[] = {"an object", "an array", "a string", "an integer",
                                        "a number", "true", "false", "null"};
    return names[json_typeof(v)];
}

/* v < b: -1, equal: 0, v > b: 1 (exact for two integers). */
static int num_cmp(const json_t *v, const json_t *b)
{
    if (json_is_integer(v) && json_is_integer(b)) {
        json_int_t x = json_integer_value(v), y = json_integer_value(b);
        return x < y ? -1 : x > y;
    }
    double x = json_number_value(v), y = json_number_value(b);
    return x < y ? -1 : x > y;
}

static int check(cctx *c, const json_t *s, const json_t *v, int depth);

static int check_type(cctx *c, const json_t *t, const json_t *v)
{
    if (json_is_string(t)) {
        if (is_type(v, json_string_value(t)))
            return 0;
        return cfail(c, "%s, not of type '%s'", type_name(v), json_string_value(t));
    }
    size_t i;
    const json_t *x;
    json_array_foreach(t, i, x) {
        if (is_type(v, json_string_value(x)))
            return 0;
    }
    return cfail(c, "%s, not of the types the schema lists", type_name(v));
}

static int check_number(cctx *c, const json_t *s, const json_t *v)
{
    static const struct {
        const char *kw;
        int bad;          /* num_cmp results that break it */
        int bad2;
        const char *what;
    } rules[] = {{"minimum", -1, -1, "less than"},
                 {"maximum", 1, 1, "greater than"},
                 {"exclusiveMinimum", -1, 0, "not greater than"},
                 {"exclusiveMaximum", 1, 0, "not less than"}};
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const json_t *b = json_object_get(s, rules[i].kw);
        if (!b)
            continue;
        int r = num_cmp(v, b);
        if (r == rules[i].bad || r == rules[i].bad2) {
            char vb[64], bb[64];
            snprintf(vb, sizeof vb, "%.17g", json_number_value(v));
            snprintf(bb, sizeof bb, "%.17g", json_number_value(b));
            return cfail(c, "%s is %s %s %s", vb, rules[i].what, rules[i].kw, bb);
        }
    }
    return 0;
}

static gpe_jre *find_re(const gpe_jv *jv, const json_t *owner, bool format)
{
    for (int i = 0; i < jv->n_re; i++)
        if (jv->re[i].owner == owner && jv->re[i].format == format)
            return jv->re[i].re;
    return NULL;
}

/* Does the string match the automaton? Characters are stepped by their
 * first byte (jregex.h). */
static bool re_match(const gpe_jre *re, const char *p, size_t n)
{
    uint64_t st = GPE_JRE_START;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)p[i];
        if (b >= 0x80 && b < 0xC0)
            continue;   /* a continuation byte */
        if (!(st = gpe_jre_step(re, st, b)))
            return false;
    }
    return gpe_jre_accepts(re, st);
}

static int check_string(cctx *c, const json_t *s, const json_t *v)
{
    const char *p = json_string_value(v);
    size_t n = json_string_length(v), chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)p[i] & 0xC0) != 0x80;
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if (mn && (json_int_t)chars < json_integer_value(mn))
        return cfail(c, "string of %zu characters, shorter than minLength %lld", chars,
                     (long long)json_integer_value(mn));
    if (mx && (json_int_t)chars > json_integer_value(mx))
        return cfail(c, "string of %zu characters, longer than maxLength %lld", chars,
                     (long long)json_integer_value(mx));
    for (int f = 0; f < 2; f++) {
        const json_t *kw = json_object_get(s, f ? "format" : "pattern");
        const gpe_jre *re = kw ? find_re(c->v, s, f) : NULL;
        if (re && !re_match(re, p, n))
            return cfail(c, "string does not match %s '%.80s'", f ? "format" : "pattern",
                         json_string_value(kw));
    }
    return 0;
}

static int check_array(cctx *c, const json_t *s, const json_t *v, int depth)
{
    size_t n = json_array_size(v);
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if (mn && (json_int_t)n < json_integer_value(mn))
        return cfail(c, "%zu items, fewer than minItems %lld", n,
                     (long long)json_integer_value(mn));
    if (mx && (json_int_t)n > json_integer_value(mx))
        return cfail(c, "%zu items, more than maxItems %lld", n,
                     (long long)json_integer_value(mx));
    const json_t *items = json_object_get(s, "items");
    for (size_t i = 0; items && i < n; i++) {
        char seg[24];
        int len = snprintf(seg, sizeof seg, "%zu", i);
        size_t at = path_push(c, seg, (size_t)len);
        int r = check(c, items, json_array_get(v, i), depth + 1);
        if (r != 0)
            return r;   /* the path stays: it names the violation */
        path_pop(c, at);
    }
    return 0;
}

static int check_object(cctx *c, const json_t *s, const json_t *v, int depth)
{
    const json_t *req = json_object_get(s, "required");
    const json_t *props = json_object_get(s, "properties");
    const json_t *add = json_object_get(s, "additionalProperties");
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_object_get(v, json_string_value(r)))
            return cfail(c, "required property '%.80s' is missing", json_string_value(r));
    }
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        const json_t *ps = json_object_get(props, k);
        if (!ps && json_is_false(add))
            return cfail(c, "property '%.80s' is not allowed (additionalProperties false)", k);
        if (!ps)
            ps = add;
        if (!ps)
            continue;
        size_t at = path_push(c, k, strlen(k));
        int rc = check(c, ps, x, depth + 1);
        if (rc != 0)
            return rc;
        path_pop(c, at);
    }
    return 0;
}

/* anyOf (exactly = false) or oneOf (true) over the alternatives in arr. */
static int check_union(cctx *c, const json_t *arr, const json_t *v, bool exactly, int depth)
{
    size_t i, n_ok = 0, first = 0, at = c->plen;
    const json_t *a;
    json_array_foreach(arr, i, a) {
        int r = check(c, a, v, depth + 1);
        path_pop(c, at);   /* an alternative's violation is not the value's */
        if (r < 0)
            return r;
        if (r == 0 && n_ok++ == 0)
            first = i;
        if (n_ok > 0 && !exactly)
            return 0;
        if (n_ok > 1)
            return cfail(c, "matches oneOf alternatives %zu and %zu (exactly one must match)",
                         first, i);
    }
    if (n_ok == 1)
        return 0;
    return cfail(c, "matches none of the %zu %s alternatives", json_array_size(arr),
                 exactly ? "oneOf" : "anyOf");
}

/* Schema s applied to v: 0 valid, 1 invalid (c->msg says why), -1 over
 * the cost bound. */
static int check(cctx *c, const json_t *s, const json_t *v, int depth)
{
    if (--c->budget < 0 || depth > MAX_CHECK_DEPTH) {
        c->over = true;
        snprintf(c->msg, c->msglen, "the schema costs too much to check on this value");
        return -1;
    }
    if (json_is_true(s))
        return 0;
    if (!json_is_object(s))
        return cfail(c, "no value is allowed here (schema false)");
    int r;
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *target =
        json_is_string(ref) ? gpe_jschema_pointer(c->v->root, json_string_value(ref)) : NULL;
    if (ref && (r = check(c, target, v, depth + 1)))
        return r;
    const json_t *all = json_object_get(s, "allOf"), *a;
    size_t i;
    json_array_foreach(all, i, a) {
        if ((r = check(c, a, v, depth + 1)))
            return r;
    }
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any && (r = check_union(c, any, v, false, depth)))
        return r;
    if (one && (r = check_union(c, one, v, true, depth)))
        return r;
    const json_t *t = json_object_get(s, "type");
    if (t && (r = check_type(c, t, v)))
        return r;
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"), *e;
    if (cn && !same(cn, v))
        return cfail(c, "not the const value");
    if (en) {
        bool found = false;
        json_array_foreach(en, i, e) {
            if ((found = same(e, v)))
                break;
        }
        if (!found)
            return cfail(c, "not one of the %zu enum values", json_array_size(en));
    }
    if (json_is_number(v))
        return check_number(c, s, v);
    if (json_is_string(v))
        return check_string(c, s, v);
    if (json_is_array(v))
        return check_array(c, s, v, depth);
    if (json_is_object(v))
        return check_object(c, s, v, depth);
    return 0;
}

gpe_jv_result gpe_jv_check(gpe_jv *v, const json_t *value, char *msg, size_t msglen)
{
    cctx c = {.v = v, .msg = msg, .msglen = msglen, .budget = CHECK_BUDGET};
    char scratch[1];
    if (!msg || !msglen) {
        c.msg = scratch;
        c.msglen = sizeof scratch;
    }
    c.path[0] = '\0';
    int r = check(&c, v->root, value, 0);
    if (r < 0 || c.over)
        return GPE_JV_ERROR;
    if (r == 0 && msg && msglen)
        msg[0] = '\0';
    return r == 0 ? GPE_JV_VALID : GPE_JV_INVALID;
}

gpe_jv_result gpe_jv_check_text(gpe_jv *v, const char *text, size_t len, char *msg,
                                size_t msglen)
{
    json_error_t je;
    json_t *value = NULL;
    if (!text)
        text = "";
    /* gpe_js_load: a reply jansson could not read for want of memory is not
     * "not JSON", nor one it read with a byte dropped another value. */
    size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL;
    gpe_status st = gpe_js_load(text, len, flags, &value, &je);
    /* an integer past 64 bits is still JSON (by its code: the host's
     * loader words it its own way; a real's overflow is refused again) */
    if (st == GPE_ERR_ARG && json_error_code(&je) == json_error_numeric_overflow)
        st = gpe_js_load(text, len, flags | JSON_DECODE_INT_AS_REAL, &value, &je);
    if (st == GPE_ERR_NOMEM) {
        if (msg && msglen)
            snprintf(msg, msglen, "out of memory");
        return GPE_JV_NOMEM;
    }
    if (st != GPE_OK) {
        if (msg && msglen)
            snprintf(msg, msglen, "not JSON: %s (byte %d)", je.text, je.position);
        return GPE_JV_INVALID;
    }
    gpe_jv_result r = gpe_jv_check(v, value, msg, msglen);
    json_decref(value);
    return r;
}

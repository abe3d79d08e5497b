/*
 * jschema: compiling a JSON Schema (a jansson tree) into gpe_jschema nodes.
 * Interface in jschema.h; the keywords understood are listed in docs/api.md
 * "Structured outputs".
 *
 * Each schema object becomes a REF placeholder first (memoised by its
 * json_t pointer) whose target is the node of its body, so that $ref cycles
 * (recursive schemas) resolve to the placeholder. Minimum lengths and first
 * bytes are fixpoints computed once everything is compiled; unions are then
 * checked to be decidable on their first byte.
 */
#include "jschema.h"
#include "jcheck.h"

#include <gpupool/engine.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 4096
#define MAX_PROPS 64
#define MAX_LITS 1024
#define NUM_LIMIT 999999999999999LL   /* 15 digits: the matcher's limit per part */

typedef struct cctx {
    gpe_jschema *p;
    const json_t *root;
    const json_t **memo_key;   /* [cap] schema object of each memoised node */
    int *memo_node;
    int n_memo, memo_cap;
    char *err;
    size_t errlen;
    int depth;
    int *tag_alt;              /* tag_values' map, handed to tag_union */
    bool oom;                  /* the failure was an allocation (oom), not the schema */
} cctx;

static int fail(cctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Every allocation failure comes here, so that the status says out of
 * memory (the server's fault, 500 and retryable) and not a schema refused
 * (the client's, 400). */
static int oom(cctx *c)
{
    c->oom = true;
    return fail(c, "out of memory");
}

static int new_node(cctx *c, gpe_js_kind kind)
{
    gpe_jschema *p = c->p;
    if (p->n_nodes >= MAX_NODES)
        return fail(c, "schema too large (more than %d nodes)", MAX_NODES);
    if (p->n_nodes == p->cap) {
        int cap = p->cap ? p->cap * 2 : 32;
        gpe_js_node *n = realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return oom(c);
        p->nodes = n;
        p->cap = cap;
    }
    gpe_js_node *n = &p->nodes[p->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->min_len = GPE_JS_INF;
    n->extra = -1;
    n->items = GPE_JS_N_ANY;
    n->max_items = -1;
    n->max_chars = -1;
    n->lo = -NUM_LIMIT;
    n->hi = NUM_LIMIT;
    n->allow_frac = true;
    n->target = -1;
    return p->n_nodes++;
}

/* ------------------------------------------------------------ literals */

static int cmp_lit(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A literals node from values (borrowed), those not of an allowed type
 * dropped; types NULL = all. */
static int lit_node(cctx *c, const json_t *const *vals, size_t n, const json_t *types,
                    const char *kw)
{
    if (n > MAX_LITS)
        return fail(c, "'%s' has more than %d values", kw, MAX_LITS);
    int id = new_node(c, GPE_JS_LITERALS);
    if (id < 0)
        return -1;
    gpe_js_node *nd = &c->p->nodes[id];
    nd->lits = calloc(n ? n : 1, sizeof *nd->lits);
    nd->lit_len = calloc(n ? n : 1, sizeof *nd->lit_len);
    if (!nd->lits || !nd->lit_len)
        return oom(c);
    for (size_t i = 0; i < n; i++) {
        if (types) {
            bool ok = false;
            size_t ti;
            const json_t *t;
            json_array_foreach(types, ti, t) {
                const char *s = json_string_value(t);
                int ty = json_typeof(vals[i]);
                if (s && ((!strcmp(s, "string") && ty == JSON_STRING) ||
                          (!strcmp(s, "integer") && ty == JSON_INTEGER) ||
                          (!strcmp(s, "number") && (ty == JSON_INTEGER || ty == JSON_REAL)) ||
                          (!strcmp(s, "boolean") && (ty == JSON_TRUE || ty == JSON_FALSE)) ||
                          (!strcmp(s, "null") && ty == JSON_NULL) ||
                          (!strcmp(s, "object") && ty == JSON_OBJECT) ||
                          (!strcmp(s, "array") && ty == JSON_ARRAY)))
                    ok = true;
            }
            if (!ok)
                continue;
        }
        char *s = gpe_js_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s)
            return oom(c);
        nd->lits[nd->n_lits++] = s;
    }
    if (nd->n_lits == 0)
        return fail(c, "'%s' has no value of the schema's type", kw);
    qsort(nd->lits, (size_t)nd->n_lits, sizeof *nd->lits, cmp_lit);
    int k = 0;
    for (int i = 0; i < nd->n_lits; i++) {
        if (k > 0 && strcmp(nd->lits[k - 1], nd->lits[i]) == 0) {
            free(nd->lits[i]);
            continue;
        }
        nd->lits[k++] = nd->lits[i];
    }
    nd->n_lits = k;
    for (int i = 0; i < k; i++)
        nd->lit_len[i] = (int)strlen(nd->lits[i]);
    return id;
}

/* A literals node of up to three singletons (true, false, null). */
static int lit_words(cctx *c, json_t *a, json_t *b, json_t *d)
{
    json_t *v[3] = {a, b, d};
    size_t n = d ? 3 : b ? 2 : 1;
    return lit_node(c, (const json_t *const *)v, n, NULL, "type");
}

/* ---------------------------------------------------------- the walker */

static int compile(cctx *c, const json_t *s, const char *path);

static bool is_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "$schema", "$id", "$comment",
                                      "default", "examples", "deprecated", "readOnly",
                                      "writeOnly", "$defs", "definitions", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i]))
            return true;
    return false;
}

/* Keywords each type understands (type-specific ones are allowed whatever
 * the type: JSON Schema applies them only to instances of their type). */
static bool is_known(const char *k)
{
    static const char *const kw[] = {"type", "properties", "required", "additionalProperties",
                                     "items", "minItems", "maxItems", "minLength",
                                     "maxLength", "minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum", "enum", "const", "anyOf", "oneOf",
                                     "allOf", "$ref", "pattern", "format", NULL};
    for (int i = 0; kw[i]; i++)
        if (!strcmp(k, kw[i]))
            return true;
    return is_annotation(k);
}

static int get_count(cctx *c, const json_t *s, const char *kw, int64_t *out, const char *path)
{
    const json_t *v = json_object_get(s, kw);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fail(c, "'%s' at %s must be a non-negative integer", kw, path);
    *out = json_integer_value(v);
    return 0;
}

static int get_bound(cctx *c, const json_t *s, const char *kw, double *out, bool *has,
                     const char *path)
{
    const json_t *v = json_object_get(s, kw);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return fail(c, "'%s' at %s must be a number", kw, path);
    *out = json_number_value(v);
    *has = true;
    return 0;
}

static int number_node(cctx *c, const json_t *s, bool integer, const char *path)
{
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    bool hmn = false, hmx = false, hxmn = false, hxmx = false;
    if (get_bound(c, s, "minimum", &mn, &hmn, path) < 0 ||
        get_bound(c, s, "maximum", &mx, &hmx, path) < 0 ||
        get_bound(c, s, "exclusiveMinimum", &xmn, &hxmn, path) < 0 ||
        get_bound(c, s, "exclusiveMaximum", &xmx, &hxmx, path) < 0)
        return -1;
    int id = new_node(c, GPE_JS_NUMBER);
    if (id < 0)
        return -1;
    gpe_js_node *n = &c->p->nodes[id];
    n->allow_frac = !integer;
    /* Bounds apply to the integer part; a fraction is only written where
     * every fraction keeps the value in range (see jsongram.c). */
    double lo = -(double)NUM_LIMIT, hi = (double)NUM_LIMIT;
    bool lo_x = false, hi_x = false;
    if (hmn)
        lo = fmax(lo, ceil(mn));
    if (hxmn) {
        /* a number may sit just above a whole exclusive bound (0.5 > 0) */
        double b = !integer && xmn == floor(xmn) ? xmn : floor(xmn) + 1;
        if (b > lo || (b == lo && !integer && xmn == b)) {
            lo_x = !integer && xmn == b;
            lo = b;
        }
    }
    if (hmx)
        hi = fmin(hi, floor(mx));
    if (hxmx) {
        double b = !integer && xmx == ceil(xmx) ? xmx : ceil(xmx) - 1;
        if (b < hi || (b == hi && !integer && xmx == b)) {
            hi_x = !integer && xmx == b;
            hi = b;
        }
    }
    if (lo > (double)NUM_LIMIT || hi < -(double)NUM_LIMIT || lo > hi ||
        (lo == hi && (lo_x || hi_x)))
        return fail(c, "'minimum'/'maximum' at %s: no %s in the range that this decoder "
                    "writes (integer parts up to 15 digits)", path,
                    integer ? "integer" : "whole number");
    n->lo = (int64_t)lo;
    n->hi = (int64_t)hi;
    n->lo_x = lo_x;
    n->hi_x = hi_x;
    return id;
}

static int string_node(cctx *c, const json_t *s, const char *path)
{
    int64_t mn = 0, mx = -1;
    if (get_count(c, s, "minLength", &mn, path) < 0 ||
        get_count(c, s, "maxLength", &mx, path) < 0)
        return -1;
    if (mx >= 0 && mn > mx)
        return fail(c, "'minLength' > 'maxLength' at %s", path);
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if ((pat && !json_is_string(pat)) || (fmt && !json_is_string(fmt)))
        return fail(c, "'%s' at %s must be a string", pat && !json_is_string(pat) ? "pattern"
                                                                              : "format", path);
    if (pat && fmt)
        return fail(c, "'pattern' together with 'format' at %s is not supported", path);
    const char *re_text = pat ? json_string_value(pat) : NULL;
    if (fmt && !(re_text = gpe_jre_format_pattern(json_string_value(fmt))))
        return fail(c, "'format' '%s' at %s is not supported (supported: date, time, "
                    "date-time, uuid, email, ipv4)", json_string_value(fmt), path);
    gpe_jre *re = NULL;
    if (re_text) {
        char why[200];
        gpe_status st;
        re = gpe_jre_compile_status(re_text, false, why, sizeof why, &st);
        if (!re)
            return st == GPE_ERR_NOMEM ? oom(c) : fail(c, "%s at %s", why, path);
    }
    int id = new_node(c, GPE_JS_STRING);
    if (id < 0) {
        gpe_jre_free(re);
        return -1;
    }
    c->p->nodes[id].min_chars = mn;
    c->p->nodes[id].max_chars = mx;
    c->p->nodes[id].re = re;
    return id;
}

static int array_node(cctx *c, const json_t *s, const char *path)
{
    int64_t mn = 0, mx = -1;
    if (get_count(c, s, "minItems", &mn, path) < 0 ||
        get_count(c, s, "maxItems", &mx, path) < 0)
        return -1;
    if (mx >= 0 && mn > mx)
        return fail(c, "'minItems' > 'maxItems' at %s", path);
    const json_t *items = json_object_get(s, "items");
    if (json_is_array(items))
        return fail(c, "unsupported JSON Schema keyword 'items' (array form) at %s", path);
    int it = GPE_JS_N_ANY;
    if (items) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        if ((it = compile(c, items, sub)) < 0)
            return -1;
    }
    int id = new_node(c, GPE_JS_ARRAY);
    if (id < 0)
        return -1;
    gpe_js_node *n = &c->p->nodes[id];
    n->items = it;
    n->min_items = mn;
    n->max_items = mx;
    return id;
}

static int object_node(cctx *c, const json_t *s, const char *path)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, "'properties' at %s must be an object", path);
    if (req && !json_is_array(req))
        return fail(c, "'required' at %s must be an array", path);
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return fail(c, "'additionalProperties' at %s must be a boolean or a schema", path);
    if (json_object_size(props) > MAX_PROPS)
        return fail(c, "more than %d properties at %s", MAX_PROPS, path);
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r))
            return fail(c, "'required' at %s must list strings", path);
        if (!json_object_get(props, json_string_value(r)))
            return fail(c, "required property '%s' at %s is not in 'properties'",
                        json_string_value(r), path);
    }
    int extra = -1;
    if (json_object_size(props) == 0 && !json_is_false(add)) {
        /* no declared properties: any keys, values per additionalProperties */
        extra = GPE_JS_N_ANY;
        if (json_is_object(add)) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if ((extra = compile(c, add, sub)) < 0)
                return -1;
        }
    }
    int np = (int)json_object_size(props);
    gpe_js_prop *pr = calloc(np ? (size_t)np : 1, sizeof *pr);
    if (!pr)
        return oom(c);
    int k = 0;
    const char *key;
    const json_t *ps;
    json_object_foreach((json_t *)props, key, ps) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, key);
        int nd = compile(c, ps, sub);
        json_t *ks = json_string(key);
        char *q = ks ? gpe_js_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        char *kt = q ? malloc(strlen(q) + 2) : NULL;
        if (nd < 0 || !kt) {
            free(q);
            free(kt);
            for (int j = 0; j < k; j++)
                free(pr[j].key);
            free(pr);
            return nd < 0 ? -1 : oom(c);
        }
        sprintf(kt, "%s:", q);
        free(q);
        pr[k].key = kt;
        pr[k].key_len = (int)strlen(kt);
        pr[k].node = nd;
        json_array_foreach(req, i, r)
            if (!strcmp(json_string_value(r), key))
                pr[k].required = true;
        k++;
    }
    int id = new_node(c, GPE_JS_OBJECT);
    int64_t *tail = calloc((size_t)np + 1, sizeof *tail);
    if (id < 0 || !tail) {
        for (int j = 0; j < k; j++)
            free(pr[j].key);
        free(pr);
        free(tail);
        return id < 0 ? -1 : oom(c);
    }
    gpe_js_node *n = &c->p->nodes[id];
    n->props = pr;
    n->n_props = np;
    n->extra = extra;
    n->tail = tail;
    return id;
}

/* A union node of alternatives (first-byte disjointness checked later). */
static int union_node(cctx *c, const int *alts, int n)
{
    if (n == 1)
        return alts[0];
    int id = new_node(c, GPE_JS_UNION);
    if (id < 0)
        return -1;
    int *a = malloc((size_t)n * sizeof *a);
    if (!a)
        return oom(c);
    memcpy(a, alts, (size_t)n * sizeof *a);
    c->p->nodes[id].alts = a;
    c->p->nodes[id].n_alts = n;
    return id;
}

static int type_node(cctx *c, const json_t *s, const char *t, const char *path)
{
    if (!strcmp(t, "object"))
        return object_node(c, s, path);
    if (!strcmp(t, "array"))
        return array_node(c, s, path);
    if (!strcmp(t, "string"))
        return string_node(c, s, path);
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        /* a number format (int32, double, ...) would be a bound not enforced */
        if (json_object_get(s, "format"))
            return fail(c, "'format' on a %s at %s is not supported", t, path);
        return number_node(c, s, !strcmp(t, "integer"), path);
    }
    if (!strcmp(t, "boolean"))
        return lit_words(c, json_false(), json_true(), NULL);
    if (!strcmp(t, "null"))
        return lit_words(c, json_null(), NULL, NULL);
    return fail(c, "unknown type '%s' at %s", t, path);
}

const json_t *gpe_jschema_pointer(const json_t *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            if (n + 1 >= sizeof tok)
                return NULL;   /* (a longer name is no name we could match) */
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                tok[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            cur = *end || idx < 0 || !n ? NULL : json_array_get(cur, (size_t)idx);
        } else {
            cur = NULL;
        }
        if (!cur)
            return NULL;
    }
    return *p ? NULL : cur;
}

/* Compile the body of schema object s (everything but the memo). */
static int compile_body(cctx *c, const json_t *s, const char *path)
{
    const char *k;
    const json_t *v;
    int n_kw = 0;
    json_object_foreach((json_t *)s, k, v) {
        if (!strcmp(k, "uniqueItems") && json_is_false(v))
            continue;   /* asks for nothing */
        if (!is_known(k))
            return fail(c, "unsupported JSON Schema keyword '%s' at %s", k, path);
        if (!is_annotation(k))
            n_kw++;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (n_kw > 1)
            return fail(c, "'$ref' with other keywords beside it at %s is not supported", path);
        const json_t *t =
            json_is_string(ref) ? gpe_jschema_pointer(c->root, json_string_value(ref)) : NULL;
        if (!t)
            return fail(c, "'$ref' at %s: only local references (\"#/$defs/name\") that "
                        "resolve are supported", path);
        return compile(c, t, json_string_value(ref));
    }
    const json_t *en = json_object_get(s, "enum");
    const json_t *cn = json_object_get(s, "const");
    const json_t *type = json_object_get(s, "type");
    if (en || cn) {
        if (n_kw > 1 + (type != NULL))
            return fail(c, "'%s' at %s beside keywords other than 'type' is not supported",
                        en ? "enum" : "const", path);
        if (en && !json_is_array(en))
            return fail(c, "'enum' at %s must be an array", path);
        json_t *tl = NULL;
        if (json_is_string(type))
            tl = json_pack("[O]", type);
        else if (type)
            tl = json_incref((json_t *)type);
        if (type && !tl)   /* (NULL types would keep every value: a wider enum) */
            return oom(c);
        size_t n = en ? json_array_size(en) : 1;
        const json_t **vals = malloc((n ? n : 1) * sizeof *vals);
        if (!vals) {
            json_decref(tl);
            return oom(c);
        }
        for (size_t i = 0; i < n; i++)
            vals[i] = en ? json_array_get(en, i) : cn;
        int id = lit_node(c, vals, n, tl, en ? "enum" : "const");
        free(vals);
        json_decref(tl);
        return id;
    }
    const json_t *any = json_object_get(s, "anyOf");
    const json_t *one = json_object_get(s, "oneOf");
    const json_t *all = json_object_get(s, "allOf");
    if (any || one || all) {
        const char *kw = any ? "anyOf" : one ? "oneOf" : "allOf";
        const json_t *arr = any ? any : one ? one : all;
        if (n_kw > 1)
            return fail(c, "'%s' at %s beside other keywords is not supported", kw, path);
        if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > 16)
            return fail(c, "'%s' at %s must be an array of 1 to 16 schemas", kw, path);
        if (all && json_array_size(arr) > 1)
            return fail(c, "'allOf' with more than one schema at %s is not supported", path);
        int alts[16];
        size_t i;
        const json_t *a;
        json_array_foreach(arr, i, a) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, kw, i);
            if ((alts[i] = compile(c, a, sub)) < 0)
                return -1;
        }
        return union_node(c, alts, (int)json_array_size(arr));
    }
    if (json_is_string(type))
        return type_node(c, s, json_string_value(type), path);
    if (json_is_array(type) && json_array_size(type) > 0 && json_array_size(type) <= 7) {
        int alts[7];
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t))
                return fail(c, "'type' at %s must list strings", path);
            if ((alts[i] = type_node(c, s, json_string_value(t), path)) < 0)
                return -1;
        }
        return union_node(c, alts, (int)json_array_size(type));
    }
    if (type)
        return fail(c, "'type' at %s must be a string or an array of strings", path);
    /* No type: the keywords present say which one (a schema that mixes
     * keywords of several types would need a union; refused). */
    static const char *const by_type[][5] = {
        {"object", "properties", "required", "additionalProperties", NULL},
        {"array", "items", "minItems", "maxItems", NULL},
        {"string", "minLength", "maxLength", "pattern", "format"},
        {"number", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    };
    const char *found = NULL, *found_kw = NULL;
    for (int t = 0; t < 4; t++)
        for (int j = 1; j < 5 && by_type[t][j]; j++)
            if (json_object_get(s, by_type[t][j])) {
                if (found && strcmp(found, by_type[t][0]))
                    return fail(c, "keywords '%s' and '%s' at %s without 'type' are not "
                                "supported", found_kw, by_type[t][j], path);
                found = by_type[t][0];
                found_kw = by_type[t][j];
            }
    if (found)
        return type_node(c, s, found, path);
    return GPE_JS_N_ANY;
}

static int compile(cctx *c, const json_t *s, const char *path)
{
    if (json_is_true(s))
        return GPE_JS_N_ANY;
    if (!json_is_object(s))
        return fail(c, "schema at %s must be an object (or true)", path);
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo_key[i] == s)
            return c->memo_node[i];
    if (++c->depth > 64) {
        c->depth--;
        return fail(c, "schema nested too deeply at %s", path);
    }
    int ph = new_node(c, GPE_JS_REF);
    if (ph < 0)
        return -1;
    if (c->n_memo == c->memo_cap) {
        int cap = c->memo_cap ? c->memo_cap * 2 : 32;
        const json_t **k = realloc(c->memo_key, (size_t)cap * sizeof *k);
        if (k)
            c->memo_key = k;
        int *n = realloc(c->memo_node, (size_t)cap * sizeof *n);
        if (n)
            c->memo_node = n;
        if (!k || !n)
            return oom(c);
        c->memo_cap = cap;
    }
    c->memo_key[c->n_memo] = s;
    c->memo_node[c->n_memo++] = ph;
    int body = compile_body(c, s, path);
    c->depth--;
    if (body < 0)
        return -1;
    c->p->nodes[ph].target = body;
    return ph;
}

/* ----------------------------------------------------- whole program */

static int64_t add_cap(int64_t a, int64_t b)
{
    int64_t s = a + b;
    return s >= GPE_JS_INF || a >= GPE_JS_INF || b >= GPE_JS_INF ? GPE_JS_INF : s;
}

static const int64_t pow10s[16] = {
    1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
    1000000000LL, 10000000000LL, 100000000000LL, 1000000000000LL, 10000000000000LL,
    100000000000000LL, 1000000000000000LL};

/* Does [a, b] meet [lo, hi]? */
static bool meets(int64_t a, int64_t b, int64_t lo, int64_t hi)
{
    return a <= b && lo <= hi && b >= lo && a <= hi;
}

/* An integer part x completes as: an integer (0 more bytes) when x lies in
 * [lo + lo_x, hi - hi_x]; with a fraction (2 more: ".d") when every
 * fraction keeps the value in range: x in [lo, hi - 1] for a positive
 * sign, x in [lo + 1, hi] for a negative one. */
int64_t gpe_js_num_need(const gpe_js_node *nd, bool neg, int n, int64_t v)
{
    int64_t ilo = nd->lo + nd->lo_x, ihi = nd->hi - nd->hi_x;
    int64_t flo = neg ? nd->lo + 1 : nd->lo, fhi = neg ? nd->hi : nd->hi - 1;
    bool frac = nd->allow_frac;
    if (n > 0) {
        int64_t x = neg ? -v : v;
        if (meets(x, x, ilo, ihi))
            return 0;
        if (frac && meets(x, x, flo, fhi))
            return 2;
        if (v == 0)
            return GPE_JS_INF;   /* a leading zero takes no more digits */
    }
    for (int j = 1; n + j <= 15; j++) {
        int64_t a, b;
        if (n == 0) {
            a = j == 1 ? 0 : pow10s[j - 1];
            b = pow10s[j] - 1;
        } else {
            a = v * pow10s[j];
            b = a + pow10s[j] - 1;
        }
        int64_t x0 = neg ? -b : a, x1 = neg ? -a : b;
        if (meets(x0, x1, ilo, ihi))
            return j;
        if (frac && meets(x0, x1, flo, fhi))
            return j + 2;
    }
    return GPE_JS_INF;
}

static int64_t node_min_len(const gpe_jschema *p, const gpe_js_node *n)
{
    switch (n->kind) {
    case GPE_JS_ANY:
        return 1;
    case GPE_JS_OBJECT: {
        int64_t t = 2;
        bool first = true;
        for (int i = 0; i < n->n_props; i++) {
            if (!n->props[i].required)
                continue;
            t = add_cap(t, n->props[i].key_len + (first ? 0 : 1));
            t = add_cap(t, p->nodes[n->props[i].node].min_len);
            first = false;
        }
        return t;
    }
    case GPE_JS_ARRAY: {
        int64_t il = p->nodes[n->items].min_len;
        if (n->min_items == 0)
            return 2;
        if (il >= GPE_JS_INF || n->min_items > (GPE_JS_INF / (il + 1)))
            return GPE_JS_INF;
        return 2 + n->min_items * (il + 1) - 1;
    }
    case GPE_JS_STRING: {
        int64_t chars = n->min_chars;
        if (n->re && n->re->start_dist > chars)
            chars = n->re->start_dist;
        if (n->max_chars >= 0 && chars > n->max_chars)
            return GPE_JS_INF;   /* the pattern needs more than maxLength */
        return chars > GPE_JS_INF ? GPE_JS_INF : 2 + chars;
    }
    case GPE_JS_NUMBER: {
        int64_t m = GPE_JS_INF;
        for (int d = 0; d <= 9; d++) {
            int64_t r = gpe_js_num_need(n, false, 1, d);
            m = r < GPE_JS_INF && r + 1 < m ? r + 1 : m;
        }
        int64_t r = gpe_js_num_need(n, true, 0, 0);
        return r < GPE_JS_INF && r + 1 < m ? r + 1 : m;
    }
    case GPE_JS_LITERALS: {
        int64_t m = GPE_JS_INF;
        for (int i = 0; i < n->n_lits; i++)
            m = n->lit_len[i] < m ? n->lit_len[i] : m;
        return m;
    }
    case GPE_JS_UNION: {
        int64_t m = GPE_JS_INF;
        for (int i = 0; i < n->n_alts; i++)
            m = p->nodes[n->alts[i]].min_len < m ? p->nodes[n->alts[i]].min_len : m;
        return m;
    }
    case GPE_JS_REF:
        return p->nodes[n->target].min_len;
    }
    return GPE_JS_INF;
}

static void set_first(gpe_js_node *n, unsigned char ch)
{
    n->first[ch >> 3] |= (uint8_t)(1u << (ch & 7));
}

static void node_first(const gpe_jschema *p, gpe_js_node *n)
{
    switch (n->kind) {
    case GPE_JS_ANY:
        for (const char *q = "{[\"-0123456789tfn"; *q; q++)
            set_first(n, (unsigned char)*q);
        break;
    case GPE_JS_OBJECT:
        set_first(n, '{');
        break;
    case GPE_JS_ARRAY:
        set_first(n, '[');
        break;
    case GPE_JS_STRING:
        set_first(n, '"');
        break;
    case GPE_JS_NUMBER:
        if (n->lo < 0)
            set_first(n, '-');
        if (n->hi >= 0)
            for (char d = '0'; d <= '9'; d++)
                set_first(n, (unsigned char)d);
        break;
    case GPE_JS_LITERALS:
        for (int i = 0; i < n->n_lits; i++)
            set_first(n, (unsigned char)n->lits[i][0]);
        break;
    case GPE_JS_UNION:
        for (int i = 0; i < n->n_alts; i++)
            for (int b = 0; b < 32; b++)
                n->first[b] |= p->nodes[n->alts[i]].first[b];
        break;
    case GPE_JS_REF:
        for (int b = 0; b < 32; b++)
            n->first[b] |= p->nodes[n->target].first[b];
        break;
    }
}

/* Is object node o a tagged alternative with the same tag key as ref? */
static bool tag_shape(const gpe_jschema *p, const gpe_js_node *o, const gpe_js_node *ref)
{
    if (o->kind != GPE_JS_OBJECT || o->extra >= 0 || o->n_props < 1 || !o->props[0].required ||
        o->tag_alt)
        return false;
    if (o->props[0].key_len != ref->props[0].key_len ||
        memcmp(o->props[0].key, ref->props[0].key, (size_t)o->props[0].key_len) != 0)
        return false;
    return gpe_jschema_node(p, o->props[0].node)->kind == GPE_JS_LITERALS;
}

/* The merged tag: every alternative's values, sorted, with the object
 * each picks. -1 (and nothing made) when two alternatives share a value. */
static int tag_values(cctx *c, const int *objs, int n_objs, int *tag_out)
{
    gpe_jschema *p = c->p;
    int total = 0;
    for (int i = 0; i < n_objs; i++)
        total += gpe_jschema_node(p, p->nodes[objs[i]].props[0].node)->n_lits;
    int id = new_node(c, GPE_JS_LITERALS);
    if (id < 0)
        return -1;
    gpe_js_node *l = &p->nodes[id];
    l->lits = calloc((size_t)total, sizeof *l->lits);
    l->lit_len = calloc((size_t)total, sizeof *l->lit_len);
    int *alt = calloc((size_t)total, sizeof *alt);
    if (!l->lits || !l->lit_len || !alt) {
        free(alt);
        return oom(c);
    }
    /* insertion into sorted order: a few dozen values at most (MAX_LITS each) */
    for (int i = 0; i < n_objs; i++) {
        const gpe_js_node *v = gpe_jschema_node(p, p->nodes[objs[i]].props[0].node);
        for (int k = 0; k < v->n_lits; k++) {
            int at = 0;
            while (at < l->n_lits && strcmp(l->lits[at], v->lits[k]) < 0)
                at++;
            if (at < l->n_lits && strcmp(l->lits[at], v->lits[k]) == 0) {
                free(alt);
                return 0;   /* shared: not a discriminated union (the node stays unused) */
            }
            char *dup = strdup(v->lits[k]);
            if (!dup) {
                free(alt);
                return oom(c);
            }
            memmove(l->lits + at + 1, l->lits + at, (size_t)(l->n_lits - at) * sizeof *l->lits);
            memmove(alt + at + 1, alt + at, (size_t)(l->n_lits - at) * sizeof *alt);
            l->lits[at] = dup;
            alt[at] = objs[i];
            l->n_lits++;
        }
    }
    for (int k = 0; k < l->n_lits; k++)
        l->lit_len[k] = (int)strlen(l->lits[k]);
    l->min_len = GPE_JS_INF;
    for (int k = 0; k < l->n_lits; k++)
        l->min_len = l->lit_len[k] < l->min_len ? l->lit_len[k] : l->min_len;
    node_first(p, l);
    *tag_out = id;
    c->tag_alt = alt;
    return 1;
}

/* anyOf/oneOf of objects told apart by their first property: a required
 * const or enum whose values no two alternatives share (a discriminated
 * union, as pydantic writes one, and the gguf agent's call of one of
 * several tools). Those alternatives become one object node with that
 * property alone, taking every value; once the value is written the
 * matcher continues as the alternative it picked (jsongram.c retag).
 * 0 (also when the union is not of that kind: finish then refuses it),
 * -1 on error. */
static int tag_union(cctx *c, int u)
{
    gpe_jschema *p = c->p;
    int objs[16], n_objs = 0, rest[16], n_rest = 0;
    const gpe_js_node *ref = NULL;
    for (int a = 0; a < p->nodes[u].n_alts; a++) {
        int t = p->nodes[u].alts[a];
        while (p->nodes[t].kind == GPE_JS_REF)
            t = p->nodes[t].target;
        if (p->nodes[t].kind != GPE_JS_OBJECT) {
            rest[n_rest++] = p->nodes[u].alts[a];
            continue;
        }
        if (!ref)
            ref = &p->nodes[t];
        if (!tag_shape(p, &p->nodes[t], ref))
            return 0;
        objs[n_objs++] = t;
    }
    if (n_objs < 2)
        return 0;
    int64_t tail0 = GPE_JS_INF, tail1 = GPE_JS_INF, min_len = GPE_JS_INF;
    for (int i = 0; i < n_objs; i++) {
        const gpe_js_node *o = &p->nodes[objs[i]];
        tail0 = o->tail[0] < tail0 ? o->tail[0] : tail0;
        tail1 = o->tail[1] < tail1 ? o->tail[1] : tail1;
        min_len = o->min_len < min_len ? o->min_len : min_len;
    }
    gpe_js_prop first = p->nodes[objs[0]].props[0];
    int tag = -1;
    int r = tag_values(c, objs, n_objs, &tag);
    if (r <= 0)
        return r;
    int *alt = c->tag_alt;
    c->tag_alt = NULL;
    int id = new_node(c, GPE_JS_OBJECT);
    gpe_js_prop *pr = calloc(1, sizeof *pr);
    int64_t *tail = calloc(2, sizeof *tail);
    char *key = strdup(first.key);
    if (id < 0 || !pr || !tail || !key) {
        free(alt);
        free(pr);
        free(tail);
        free(key);
        return id < 0 ? -1 : oom(c);
    }
    /* The remaining-bytes count must stay exact through the tag: the
     * shortest completion pairs each value with its own alternative's tail,
     * not the shortest value with the shortest tail of another. */
    gpe_js_node *l = &p->nodes[tag];
    l->lit_extra = calloc((size_t)l->n_lits, sizeof *l->lit_extra);
    if (!l->lit_extra) {
        free(alt);
        free(pr);
        free(tail);
        free(key);
        return oom(c);
    }
    l->min_len = GPE_JS_INF;
    for (int k = 0; k < l->n_lits; k++) {
        int64_t t = p->nodes[alt[k]].tail[1];
        l->lit_extra[k] = tail1 >= GPE_JS_INF ? 0 : t >= GPE_JS_INF ? GPE_JS_INF : t - tail1;
        int64_t m = l->lit_extra[k] >= GPE_JS_INF ? GPE_JS_INF : l->lit_len[k] + l->lit_extra[k];
        l->min_len = m < l->min_len ? m : l->min_len;
    }
    gpe_js_node *o = &p->nodes[id];
    *pr = (gpe_js_prop){.key = key, .key_len = first.key_len, .node = tag, .required = true};
    o->props = pr;
    o->n_props = 1;
    o->extra = -1;
    tail[0] = tail0;
    tail[1] = tail1;
    o->tail = tail;
    o->tag_alt = alt;
    o->min_len = min_len;
    node_first(p, o);
    rest[n_rest++] = id;
    gpe_js_node *un = &p->nodes[u];
    un->n_alts = n_rest;
    memcpy(un->alts, rest, (size_t)n_rest * sizeof *rest);
    return 0;
}

/* Fixpoints of min_len and first over the (possibly cyclic) node graph,
 * then the checks that need them. */
static int finish(cctx *c)
{
    gpe_jschema *p = c->p;
    for (int i = 0; i < p->n_nodes; i++) {
        int t = i, steps = 0;
        while (p->nodes[t].kind == GPE_JS_REF && steps++ <= p->n_nodes)
            t = p->nodes[t].target;
        if (p->nodes[t].kind == GPE_JS_REF)
            return fail(c, "'$ref' cycle that never reaches a schema");
    }
    /* Min-plus over nonnegative lengths: settles in about as many rounds
     * as the longest chain of nodes, which compile's depth limit bounds;
     * the cap keeps a hostile schema from costing the server more. */
    bool changed = true;
    for (int round = 0; round < 512 && changed; round++) {
        changed = false;
        for (int i = 0; i < p->n_nodes; i++) {
            gpe_js_node *n = &p->nodes[i];
            int64_t m = node_min_len(p, n);
            uint8_t before[32];
            memcpy(before, n->first, sizeof before);
            node_first(p, n);
            if (m != n->min_len || memcmp(before, n->first, sizeof before)) {
                n->min_len = m;
                changed = true;
            }
        }
    }
    if (changed)
        return fail(c, "schema too complex (its lengths do not settle)");
    if (p->nodes[p->root].min_len >= GPE_JS_INF)
        return fail(c, "the schema has no instance this decoder can write (required "
                    "recursion or an empty enum)");
    for (int i = 0; i < p->n_nodes; i++) {
        gpe_js_node *n = &p->nodes[i];
        if (n->kind == GPE_JS_OBJECT) {
            n->tail[n->n_props] = 0;
            for (int k = n->n_props - 1; k >= 0; k--) {
                const gpe_js_prop *pr = &n->props[k];
                n->tail[k] = pr->required
                                 ? add_cap(n->tail[k + 1],
                                           add_cap(1 + pr->key_len, p->nodes[pr->node].min_len))
                                 : n->tail[k + 1];
            }
        }
    }
    /* (every object's tail is known now: tag_union reads its alternatives') */
    for (int i = 0, n_nodes = p->n_nodes; i < n_nodes; i++) {
        gpe_js_node *n = &p->nodes[i];
        if (n->kind != GPE_JS_UNION)
            continue;
        if (tag_union(c, i) < 0)
            return -1;
        n = &p->nodes[i];   /* (tag_union may move the nodes) */
        for (int a = 0; a < n->n_alts; a++)
            for (int b = a + 1; b < n->n_alts; b++)
                for (int k = 0; k < 32; k++)
                    if (p->nodes[n->alts[a]].first[k] & p->nodes[n->alts[b]].first[k])
                        return fail(c, "'anyOf'/'oneOf'/'type' alternatives %d and %d start "
                                    "alike (only alternatives of different JSON types, such "
                                    "as a string or null, are supported)", a, b);
    }
    return 0;
}

gpe_jschema *gpe_jschema_compile_status(const json_t *schema, char *err, size_t errlen,
                                        gpe_status *st)
{
    gpe_jschema *p = calloc(1, sizeof *p);
    cctx c = {.p = p, .root = schema, .err = err, .errlen = errlen};
    if (!p) {
        oom(&c);
        goto fail;
    }
    /* built-ins, in the order of the GPE_JS_N_* indices */
    if (new_node(&c, GPE_JS_ANY) < 0 || new_node(&c, GPE_JS_OBJECT) < 0 ||
        new_node(&c, GPE_JS_ARRAY) < 0 || new_node(&c, GPE_JS_STRING) < 0 ||
        new_node(&c, GPE_JS_NUMBER) < 0 || lit_words(&c, json_false(), json_null(), json_true()) < 0)
        goto fail;
    p->nodes[GPE_JS_N_ANYOBJ].extra = GPE_JS_N_ANY;
    p->nodes[GPE_JS_N_ANYOBJ].tail = calloc(1, sizeof(int64_t));
    if (!p->nodes[GPE_JS_N_ANYOBJ].tail) {
        oom(&c);
        goto fail;
    }
    if (schema) {
        if ((p->root = compile(&c, schema, "#")) < 0)
            goto fail;
    } else {
        p->root = GPE_JS_N_ANYOBJ;
    }
    if (finish(&c) < 0)
        goto fail;
    free(c.memo_key);
    free(c.memo_node);
    if (st)
        *st = GPE_OK;
    return p;
fail:
    free(c.memo_key);
    free(c.memo_node);
    gpe_jschema_free(p);
    if (st)
        *st = c.oom ? GPE_ERR_NOMEM : GPE_ERR_UNSUPPORTED;
    return NULL;
}

gpe_jschema *gpe_jschema_compile(const json_t *schema, char *err, size_t errlen)
{
    return gpe_jschema_compile_status(schema, err, errlen, NULL);
}

void gpe_jschema_free(gpe_jschema *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_nodes; i++) {
        gpe_js_node *n = &p->nodes[i];
        for (int k = 0; k < n->n_props; k++)
            free(n->props[k].key);
        free(n->props);
        free(n->tail);
        for (int k = 0; k < n->n_lits; k++)
            free(n->lits[k]);
        free(n->lits);
        free(n->lit_len);
        free(n->lit_extra);
        free(n->alts);
        free(n->tag_alt);
        gpe_jre_free(n->re);
    }
    free(p->nodes);
    free(p);
}

static gpe_status load_nomem(char *err, size_t errlen)
{
    if (err && errlen)
        snprintf(err, errlen, "out of memory");
    return GPE_ERR_NOMEM;
}

/* The schema text as JSON (*out: new reference): GPE_OK, GPE_ERR_ARG (not
 * JSON) or GPE_ERR_NOMEM (gpe_js_load). Schemas are small: the second load
 * it makes without the host's counter costs little beside the compile. */
static gpe_status load_text(const char *schema, json_t **out, char *err, size_t errlen)
{
    json_error_t je;
    gpe_status st = gpe_js_load(schema, strlen(schema), JSON_DECODE_ANY, out, &je);
    if (st == GPE_ERR_NOMEM)
        return load_nomem(err, errlen);
    if (st != GPE_OK && err && errlen)
        snprintf(err, errlen, "schema is not JSON: %s", je.text);
    return st;
}

gpe_jschema *gpe_jschema_compile_text(const char *schema, char *err, size_t errlen,
                                      gpe_status *st)
{
    json_t *js = NULL;
    if (schema && *schema && (*st = load_text(schema, &js, err, errlen)) != GPE_OK)
        return NULL;
    gpe_jschema *p = gpe_jschema_compile_status(js, err, errlen, st);
    json_decref(js);
    return p;
}

gpe_status gpe_schema_check(const char *schema, char *err, size_t errlen)
{
    gpe_status st;
    gpe_jschema *p = gpe_jschema_compile_text(schema, err, errlen, &st);
    gpe_jschema_free(p);
    return st;
}

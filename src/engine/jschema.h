/*
 * jschema: JSON Schema compiled into a compact program of nodes that the
 * byte matcher (jsongram.h) walks. Only the keywords listed in docs/api.md
 * "Structured outputs" are understood; every other keyword is refused with
 * an error naming it, so that nothing a schema asks for is silently dropped.
 *
 * The program describes a subset of the schema's instances that is easy to
 * match byte by byte: compact JSON (no whitespace), object properties in the
 * order the schema declares them (only declared ones), numbers without an
 * exponent and with at most 15 digits in each part, string escapes without
 * \u. Every instance of the program is an instance of the schema.
 *
 * Depends on jansson only (the server links it to check schemas early).
 */
#ifndef GPE_JSCHEMA_H
#define GPE_JSCHEMA_H

#include <gpupool/engine.h>
#include <jansson.h>

#include "jregex.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A minimum length that no instance reaches (unsatisfiable branch). */
#define GPE_JS_INF ((int64_t)1 << 40)

typedef enum gpe_js_kind {
    GPE_JS_ANY,        /* any JSON value */
    GPE_JS_OBJECT,
    GPE_JS_ARRAY,
    GPE_JS_STRING,
    GPE_JS_NUMBER,     /* integer when allow_frac is false */
    GPE_JS_LITERALS,   /* a finite set of serialised values: enum, const, boolean, null */
    GPE_JS_UNION,      /* alternatives told apart by their first byte */
    GPE_JS_REF,        /* alias of another node ($ref) */
} gpe_js_kind;

typedef struct gpe_js_prop {
    char *key;          /* the property's name as JSON text plus ':', e.g. "\"age\":" */
    int key_len;
    int node;
    bool required;
} gpe_js_prop;

typedef struct gpe_js_node {
    gpe_js_kind kind;
    int64_t min_len;            /* bytes of the shortest instance (GPE_JS_INF: none) */
    uint8_t first[32];          /* bitset of the bytes an instance may start with */
    /* object: declared properties in order (extra < 0), or any keys whose
     * values match node `extra` (n_props == 0) */
    gpe_js_prop *props;
    int n_props;
    int extra;
    int64_t *tail;              /* [n_props + 1]: bytes of ",key:value" for the required
                                   properties from index i on, at their minimum */
    int *tag_alt;               /* a discriminated union (jschema.c tag_union): one
                                   property whose value picks the object node
                                   tag_alt[i] for literal i of that property; else NULL */
    /* array */
    int items;
    int64_t min_items, max_items;   /* max_items < 0: unbounded */
    /* string: lengths in code points */
    int64_t min_chars, max_chars;   /* max_chars < 0: unbounded */
    gpe_jre *re;                    /* pattern or format (owned), else NULL: such a
                                       string is written without escapes */
    /* number: the value lies in [lo, hi], or (lo_x, hi_x) ]lo or hi[ for an
     * exclusive bound on a number node (an integer value of the bound:
     * lo itself only with a nonzero fraction) */
    int64_t lo, hi;
    bool lo_x, hi_x;
    bool allow_frac;
    /* literals, sorted bytewise */
    char **lits;
    int *lit_len;
    int64_t *lit_extra;         /* the tag of a discriminated union: bytes literal i's
                                   object needs after it beyond the merged object's
                                   tail (its alternative's tail less the least one);
                                   else NULL */
    int n_lits;
    /* union */
    int *alts;
    int n_alts;
    /* ref */
    int target;
} gpe_js_node;

/* Node indices of the built-in nodes every program has. */
enum { GPE_JS_N_ANY = 0, GPE_JS_N_ANYOBJ, GPE_JS_N_ANYARR, GPE_JS_N_ANYSTR, GPE_JS_N_ANYNUM,
       GPE_JS_N_ANYLIT, GPE_JS_N_BUILTIN };

typedef struct gpe_jschema {
    gpe_js_node *nodes;
    int n_nodes, cap;
    int root;
} gpe_jschema;

/* The value JSON Pointer ref ("#/a/b", ~0 and ~1 escapes) names inside root,
 * or NULL: how $ref is read, here and by the validator (jvalidate.h). */
const json_t *gpe_jschema_pointer(const json_t *root, const char *ref);

/* Compile schema (borrowed). schema NULL: any JSON object (response_format
 * json_object). Returns NULL with a message in err naming the keyword that
 * is not supported (or what is wrong), or "out of memory" (the _status form
 * tells the two apart). Caller frees with gpe_jschema_free. */
gpe_jschema *gpe_jschema_compile(const json_t *schema, char *err, size_t errlen);
/* The same with why in *st (st may be NULL): GPE_OK; GPE_ERR_NOMEM, an
 * allocation failed (not the schema's fault: a server answers 500, and a
 * retry may pass); GPE_ERR_UNSUPPORTED, a keyword not supported or a schema
 * that is wrong (err names it: a client's 400). */
gpe_jschema *gpe_jschema_compile_status(const json_t *schema, char *err, size_t errlen,
                                        gpe_status *st);
void gpe_jschema_free(gpe_jschema *p);
/* Same from JSON text (NULL or "": json_object mode); *st: GPE_OK,
 * GPE_ERR_ARG (not JSON), GPE_ERR_UNSUPPORTED or GPE_ERR_NOMEM (out of
 * memory, loading the text included), as gpe_jschema_compile_status.
 * gpe_schema_check (engine.h) is this, for the server. */
gpe_jschema *gpe_jschema_compile_text(const char *schema, char *err, size_t errlen,
                                      gpe_status *st);

/* Fewest more bytes that complete a number of node nd (GPE_JS_NUMBER)
 * from an integer part written so far: neg ('-' written), n digits of
 * value v (n = 0: nothing after the sign). 0: complete now; GPE_JS_INF:
 * no completion is in range. See jsongram.c for the number rules. */
int64_t gpe_js_num_need(const gpe_js_node *nd, bool neg, int n, int64_t v);

/* The node behind refs. */
static inline const gpe_js_node *gpe_jschema_node(const gpe_jschema *p, int i)
{
    while (p->nodes[i].kind == GPE_JS_REF)
        i = p->nodes[i].target;
    return &p->nodes[i];
}

static inline bool gpe_js_first_has(const gpe_js_node *n, unsigned char c)
{
    return (n->first[c >> 3] >> (c & 7)) & 1;
}

#endif

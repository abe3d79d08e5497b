/*
 * jvalidate: does a finished JSON value satisfy a JSON Schema? The check a
 * value gets when no grammar wrote it: the agent's openai backend runs it on
 * what an upstream returned for a response_format or a strict tool
 * (docs/api.md "Structured outputs").
 *
 * The schema's own meaning (JSON Schema 2020-12), not the subset the byte
 * matcher writes (jschema.h): properties in any order, keys the schema does
 * not declare unless additionalProperties says otherwise, numbers of any
 * size with exponents (1.0 is an integer), strings with any escape, `oneOf`
 * as exactly one, `$ref` beside other keywords applying both.
 *
 * The keywords are those the grammar enforces, so that a schema means the
 * same on every backend: type, properties, required, additionalProperties,
 * items (one schema), minItems, maxItems, minLength, maxLength (code
 * points), minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum,
 * const, anyOf, oneOf, allOf, $ref (local pointers, recursion allowed),
 * $defs/definitions, pattern (jregex.h, gpe_jre_compile_full), format
 * (date, time, date-time, uuid, email, ipv4, as the grammar writes them),
 * uniqueItems false, and annotations (title, description, default, ...).
 * Any other keyword is refused by gpe_jv_new with a message naming it and
 * where it is, as jschema refuses it: none is ignored.
 *
 * Usage:
 *     gpe_jv *v = gpe_jv_new(schema, err, sizeof err);   // NULL: err says why
 *     char why[300];
 *     if (gpe_jv_check_text(v, text, len, why, sizeof why) != GPE_JV_VALID)
 *         ... why: "at /pets/3: 4 items, more than maxItems 3"
 *     gpe_jv_free(v);
 *
 * The first violation found is reported, with the value's place as a JSON
 * Pointer (RFC 6901; "/" for the value itself). A check's cost is bounded
 * (GPE_JV_ERROR past it), whatever the schema's unions and recursion.
 *
 * Fuzzed by tests/fuzz/fuzz_jvalidate.c, also against the byte matcher:
 * every value the matcher completes under a schema satisfies it here.
 */
#ifndef GPE_JVALIDATE_H
#define GPE_JVALIDATE_H

#include <gpupool/engine.h>
#include <jansson.h>
#include <stddef.h>

typedef struct gpe_jv gpe_jv;

typedef enum gpe_jv_result {
    GPE_JV_NOMEM = -2,   /* not checked: out of memory (the checker's, not the value's
                            fault: the agent fails the job over as its own failure) */
    GPE_JV_ERROR = -1,   /* not checked: over the cost bound */
    GPE_JV_VALID = 0,
    GPE_JV_INVALID = 1,  /* msg names the first violation */
} gpe_jv_result;

/* A validator of schema (borrowed; the validator keeps a reference), its
 * patterns compiled. NULL with a message in err: a keyword not supported
 * (named, with its place in the schema), a keyword's value of the wrong
 * kind, a $ref that does not resolve, a pattern not supported; or "out of
 * memory" (the _status form tells the two apart). */
gpe_jv *gpe_jv_new(const json_t *schema, char *err, size_t errlen);
/* The same with why in *st (st may be NULL), as gpe_jschema_compile_status
 * (jschema.h): GPE_OK; GPE_ERR_NOMEM, an allocation failed (not the
 * schema's fault: the agent fails the job over as its own out of memory,
 * and a retry may pass); GPE_ERR_UNSUPPORTED, a schema refused (err names
 * what and where: the client's INVALID_REQUEST); GPE_ERR_ARG, schema NULL. */
gpe_jv *gpe_jv_new_status(const json_t *schema, char *err, size_t errlen, gpe_status *st);
void gpe_jv_free(gpe_jv *v);

/* Check value (borrowed). msg gets the first violation (INVALID) or what
 * went wrong (ERROR). Thread-safe for one validator used by one thread at
 * a time. */
gpe_jv_result gpe_jv_check(gpe_jv *v, const json_t *value, char *msg, size_t msglen);
/* The same for JSON text (len bytes, no NUL needed): text that is not one
 * JSON value is INVALID ("not JSON: ..."); NOMEM ("out of memory") when
 * memory ran out reading it (gpe_js_load, jcheck.h: jansson reports an
 * allocation failure as a syntax error, or drops a byte). */
gpe_jv_result gpe_jv_check_text(gpe_jv *v, const char *text, size_t len, char *msg,
                                size_t msglen);

#endif

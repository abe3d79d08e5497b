/*
 * libFuzzer target: the JSON Schema validator (src/engine/jvalidate.c),
 * alone and against the byte matcher (jschema.c, jsongram.c).
 *
 * Input: a schema (JSON text) up to the first NUL byte; the bytes after it
 * are (1) checked as JSON text by the validator, and (2) offered to the
 * matcher one by one, a refused byte skipped, as fuzz_jschema does.
 * Checked, beyond no crash, leak or hang: a value the matcher completed
 * satisfies the schema by the validator (jschema.h: every instance of the
 * program is an instance of the schema), unless the check ran past its
 * cost bound. Not checked: that the validator takes every schema the
 * grammar compiles. It is stricter where jschema does not look (a keyword
 * of another type than the schema's, additionalProperties beside
 * properties: the grammar writes neither) and refuses what it cannot check
 * there rather than skip it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/jschema.h"
#include "engine/jsongram.h"
#include "engine/jvalidate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes the matcher takes from in[0..n) (into out), and whether the
 * value it holds is complete. */
static size_t matcher_take(const gpe_jschema *p, const uint8_t *in, size_t n, char *out,
                           bool *complete)
{
    gpe_jg_state *st = malloc(sizeof *st), *trial = malloc(sizeof *trial);
    if (!st || !trial)
        abort();
    size_t k = 0;
    gpe_jg_init(st, p);
    for (size_t i = 0; i < n && st->depth > 0; i++) {
        gpe_jg_copy(trial, st);
        if (!gpe_jg_feed(trial, p, in[i]))
            continue;
        gpe_jg_copy(st, trial);
        out[k++] = (char)in[i];
    }
    *complete = st->depth == 0 && k > 0;
    free(st);
    free(trial);
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    const uint8_t *rest = nul ? nul + 1 : data + size;
    size_t rlen = size - (size_t)(rest - data);
    json_t *schema = json_loadb((const char *)data, slen, JSON_DECODE_ANY, NULL);
    if (!schema)
        return 0;
    char err[300], msg[400];
    gpe_jv *v = gpe_jv_new(schema, err, sizeof err);
    gpe_jschema *p = gpe_jschema_compile(schema, err, sizeof err);
    json_decref(schema);
    if (v)
        gpe_jv_check_text(v, (const char *)rest, rlen, msg, sizeof msg);
    if (p && v) {
        char *taken = malloc(rlen + 1);
        if (!taken)
            abort();
        bool complete = false;
        size_t k = matcher_take(p, rest, rlen, taken, &complete);
        if (complete &&
            gpe_jv_check_text(v, taken, k, msg, sizeof msg) == GPE_JV_INVALID) {
            fprintf(stderr, "the matcher wrote %.*s, the validator says %s\n", (int)k, taken,
                    msg);
            abort();
        }
        free(taken);
    }
    gpe_jschema_free(p);
    gpe_jv_free(v);
    return 0;
}

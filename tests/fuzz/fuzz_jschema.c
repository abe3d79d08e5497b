/*
 * libFuzzer target: JSON Schema compiled for constrained sampling
 * (src/engine/jschema.c, jregex.c) and the byte matcher (jsongram.c).
 *
 * Input: a schema (JSON text) up to the first NUL byte; the bytes after it
 * are offered to the matcher one by one (a refused byte is skipped, as the
 * sampler would pick another). Checked, beyond no crash:
 *   - the fewest bytes to complete the value falls by at most one per byte;
 *   - what the matcher took, once complete, is JSON that parses.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/jschema.h"
#include "engine/jsongram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    json_t *schema = json_loadb((const char *)data, slen, 0, NULL);
    if (!schema)
        return 0;
    char err[256];
    gpe_jschema *p = gpe_jschema_compile(schema, err, sizeof err);
    json_decref(schema);
    if (!p)
        return 0;
    gpe_jg_state *st = malloc(sizeof *st), *trial = malloc(sizeof *trial);
    char *taken = malloc(size + 1);
    if (!st || !trial || !taken)
        abort();
    size_t n = 0;
    gpe_jg_init(st, p);
    int64_t rem = gpe_jg_remaining(st, p);
    for (size_t i = slen + 1; i < size && st->depth > 0; i++) {
        gpe_jg_copy(trial, st);
        if (!gpe_jg_feed(trial, p, data[i]))
            continue;
        int64_t nr = gpe_jg_remaining(trial, p);
        if (nr < GPE_JS_INF && rem < GPE_JS_INF && nr < rem - 1)
            abort();
        gpe_jg_copy(st, trial);
        rem = nr;
        taken[n++] = (char)data[i];
    }
    if (st->depth == 0 || (rem == 0 && n > 0)) {
        /* complete (a number may still go on, but what is there is JSON) */
        json_t *v = json_loadb(taken, n, JSON_DECODE_ANY, NULL);
        if (!v && st->depth == 0)
            abort();
        json_decref(v);
    }
    free(taken);
    free(st);
    free(trial);
    gpe_jschema_free(p);
    return 0;
}

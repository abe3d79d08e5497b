/*
 * libFuzzer target: gp_json (src/common/gp_json.c), the reader of every
 * outside JSON text (request bodies, agent uploads, upstream replies),
 * against jansson's json_loadb on the same bytes (jansson's allocations
 * do not fail here: only the answers are compared).
 * Checked, for each set of load flags below (together they use every
 * flag): gp_json_load_checked accepts exactly what json_loadb accepts,
 * with the same tree (ordered compact dumps the same bytes, reals to 17
 * digits: types, values, the sign of a zero, key order, a duplicate's
 * place) and the same bytes-read position; a refusal is never out of
 * memory and says where, inside the text. gp_json_loadb and gp_json_read
 * are the checked load with their flags.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/gp_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const size_t flag_sets[] = {
    0,
    JSON_REJECT_DUPLICATES,
    JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK,
    JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
    JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL,
};

/* a and b (borrowed) both NULL, or the same dump. */
static void check_same(json_t *a, json_t *b)
{
    if (!a || !b) {
        if (a || b)
            abort();
        return;
    }
    size_t f = JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
    char *da = json_dumps(a, f), *db = json_dumps(b, f);
    if (!da || !db || strcmp(da, db) != 0 || !json_equal(a, b))
        abort();
    free(da);
    free(db);
}

static void check_flags(const char *p, size_t size, size_t flags)
{
    json_error_t je, ge;
    json_t *want = json_loadb(p, size, flags, &je);
    json_t *got = gp_json_load_checked(p, size, flags, &ge);
    check_same(want, got);
    if (got && ge.position != je.position)
        abort();
    if (!got && (json_error_code(&ge) == json_error_out_of_memory || ge.line < 1 ||
                 ge.position < 0 || (size_t)ge.position > size || !ge.text[0]))
        abort();
    json_decref(got);
    json_decref(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0]; i++)
        check_flags(p, size, flag_sets[i]);
    json_t *want = json_loadb(p, size, 0, NULL);
    json_t *got = gp_json_loadb(p, size, NULL);
    check_same(want, got);
    json_decref(got);
    json_decref(want);
    want = json_loadb(p, size, JSON_REJECT_DUPLICATES, NULL);
    got = gp_json_read(p, size);
    check_same(want, got);
    json_decref(got);
    json_decref(want);
    return 0;
}

/*
 * libFuzzer target: gp_json (src/common/gp_json.c), the reader of the
 * agent's replies and the server's request bodies, against jansson's, on
 * the same bytes.
 * Checked: gp_json_loadb gives exactly json_loadb's answer (both NULL,
 * or trees whose ordered compact dumps are the same bytes), and the reader
 * alone (gp_json_read) never gives a tree json_loadb would not.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/gp_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a and b (borrowed) both NULL, or the same dump. */
static void check_same(json_t *a, json_t *b)
{
    if (!a || !b) {
        if (a || b)
            abort();
        return;
    }
    size_t f = JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY;
    char *da = json_dumps(a, f), *db = json_dumps(b, f);
    if (!da || !db || strcmp(da, db) != 0)
        abort();
    free(da);
    free(db);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    json_t *want = json_loadb(p, size, 0, NULL);
    json_t *got = gp_json_loadb(p, size, NULL);
    check_same(want, got);
    json_t *fast = gp_json_read(p, size);
    if (fast)
        check_same(want, fast);
    json_decref(fast);
    json_decref(got);
    json_decref(want);
    return 0;
}

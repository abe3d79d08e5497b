/* gp_stop: see gp_stop.h. */
#include "common/gp_stop.h"

#include <string.h>

int gp_stop_scan(const char *t, size_t len, const json_t *stops, size_t *safe_len,
                 size_t *match_at)
{
    int best = -1;
    size_t best_at = len;
    size_t i;
    json_t *s;
    json_array_foreach(stops, i, s)
    {
        const char *p = json_string_value(s);
        size_t n = json_string_length(s);
        if (!p || n == 0 || n > len)
            continue;
        const char *hit = memmem(t, len, p, n);
        if (hit && (size_t)(hit - t) < best_at) {
            best_at = (size_t)(hit - t);
            best = (int)i;
        }
    }
    if (best >= 0) {
        *match_at = best_at;
        *safe_len = best_at;
        return best;
    }
    /* Hold back the longest tail that starts some stop sequence. */
    size_t hold = 0;
    json_array_foreach(stops, i, s)
    {
        const char *p = json_string_value(s);
        size_t n = json_string_length(s);
        if (!p || n < 2)
            continue;
        size_t k = n - 1 < len ? n - 1 : len;
        for (; k > hold; k--)
            if (memcmp(t + len - k, p, k) == 0) {
                hold = k;
                break;
            }
    }
    *safe_len = len - hold;
    *match_at = 0;
    return -1;
}

/*
 * libFuzzer target: JSON Schema patterns compiled into automata
 * (src/engine/jregex.c), then stepped over bytes.
 *
 * Input: a pattern up to the first NUL byte; the bytes after it are fed to
 * the automaton of a pattern that compiles. Checked, beyond no crash:
 *   - no state holds a position past the automaton's;
 *   - the fewest characters to a match falls by at most one per character
 *     and is 0 exactly where the state accepts;
 *   - from the start a match is reachable (the compiler refuses others).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jregex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t plen = nul ? (size_t)(nul - data) : size;
    char *pat = malloc(plen + 1);
    if (!pat)
        return 0;
    memcpy(pat, data, plen);
    pat[plen] = '\0';
    char err[200];
    gpe_jre *r = gpe_jre_compile(pat, err, sizeof err);
    free(pat);
    if (!r)
        return 0;
    if (r->n > GPE_JRE_MAX || r->start_dist == GPE_JRE_DEAD)
        abort();
    uint64_t live = r->n == 64 ? ~0ull : ((uint64_t)1 << r->n) - 1;
    uint64_t st = GPE_JRE_START;
    int32_t rem = gpe_jre_remaining(r, st);
    for (size_t i = plen + 1; i < size; i++) {
        uint64_t next = gpe_jre_step(r, st, data[i]);
        if (next & ~live)
            abort();
        if (!next)
            continue;   /* that byte is not allowed here: try the next one */
        int32_t nr = gpe_jre_remaining(r, next);
        if (nr != GPE_JRE_DEAD && rem != GPE_JRE_DEAD && nr < rem - 1)
            abort();
        if ((nr == 0) != gpe_jre_accepts(r, next))
            abort();
        st = next;
        rem = nr;
    }
    gpe_jre_free(r);
    return 0;
}

/*
 * jregex: the JSON Schema `pattern` (and the `format`s written as patterns)
 * compiled into a position automaton (Glushkov) of at most 63 positions, so
 * that a matcher state is one 64-bit word: bit p set when position p was the
 * last one matched, bit 63 while nothing has been matched yet. The byte
 * matcher (jsongram.c) keeps that word in a string frame and steps it once
 * per character.
 *
 * The subset (ECMA-262 syntax, the dialect JSON Schema names): literals,
 * `.`, classes `[...]` with ranges and negation, `\d \w \s \D \W \S`,
 * escaped punctuation and `\t \n \r`, groups `(...)` and `(?:...)`,
 * alternation `|`, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms too: the
 * set of strings is the same), `^` at the start and `$` at the end. A pattern
 * without `^` (or `$`) may be preceded (or followed) by anything, as JSON
 * Schema's unanchored search says. Refused with a message: backreferences,
 * lookaround, `\b`, `\u`/`\p` escapes, non-ASCII literals, anchors elsewhere,
 * more than 63 positions after the quantifiers are expanded.
 *
 * Characters are matched by their first byte: ASCII classes match ASCII
 * bytes; `.` and negated classes also match any non-ASCII character (the
 * UTF-8 lead bytes). The characters a JSON string cannot hold raw (control
 * characters, `"` and `\`) match no position: a pattern string is written
 * without escapes.
 */
#ifndef GPE_JREGEX_H
#define GPE_JREGEX_H

#include <gpupool/engine.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPE_JRE_MAX 63
#define GPE_JRE_START ((uint64_t)1 << 63)

typedef struct gpe_jre {
    int n;                           /* positions */
    bool nullable;                   /* the empty string matches */
    uint64_t first, last;            /* positions that can start / end a match */
    uint64_t follow[GPE_JRE_MAX];    /* positions that can come after p */
    uint8_t cls[GPE_JRE_MAX][32];    /* bytes position p matches (bitset) */
    uint64_t by_byte[256];           /* the same, transposed: positions byte c matches */
    int32_t dist[GPE_JRE_MAX];       /* fewest more characters to a match after p */
    int32_t start_dist;              /* from the start (0 when nullable) */
} gpe_jre;

#define GPE_JRE_DEAD INT32_MAX

/* Compile pattern (NUL-terminated). NULL with a message in err: a pattern
 * outside the subset, or out of memory (gpe_jre_compile_status tells the
 * two apart). */
gpe_jre *gpe_jre_compile(const char *pattern, char *err, size_t errlen);
/* The same subset with ECMA-262's meaning over every character, for
 * checking a finished string (jvalidate.h) rather than writing one: classes
 * and literals may hold any character (control characters, '"', '\\'); `.`
 * is any character but \n and \r; `\s` is ASCII white space (a non-ASCII
 * space counts as `\S`, and U+2028/2029 as `.`: one byte does not tell them
 * apart). */
gpe_jre *gpe_jre_compile_full(const char *pattern, char *err, size_t errlen);
/* gpe_jre_compile (full: gpe_jre_compile_full) with why it failed in *st
 * (st may be NULL): GPE_OK; GPE_ERR_NOMEM, an allocation failed (err says
 * "out of memory": not the pattern's fault, a retry may pass);
 * GPE_ERR_UNSUPPORTED, the pattern is outside the subset or matches nothing
 * (err names what). */
gpe_jre *gpe_jre_compile_status(const char *pattern, bool full, char *err, size_t errlen,
                                gpe_status *st);
void gpe_jre_free(gpe_jre *r);
/* The pattern a `format` is enforced as, or NULL for a format not supported
 * (date, time, date-time, uuid, email, ipv4, ipv6 is not). */
const char *gpe_jre_format_pattern(const char *format);

/* Next state after a character starting with byte c (0: no match is
 * possible any more). */
static inline uint64_t gpe_jre_step(const gpe_jre *r, uint64_t st, unsigned char c)
{
    uint64_t cand = st & GPE_JRE_START ? r->first : 0;
    for (uint64_t s = st & ~GPE_JRE_START; s; s &= s - 1)
        cand |= r->follow[__builtin_ctzll(s)];
    return cand & r->by_byte[c];
}

static inline bool gpe_jre_accepts(const gpe_jre *r, uint64_t st)
{
    return (st & GPE_JRE_START && r->nullable) || (st & r->last);
}

/* Fewest more characters to a match from st (GPE_JRE_DEAD: none). */
int32_t gpe_jre_remaining(const gpe_jre *r, uint64_t st);

#endif

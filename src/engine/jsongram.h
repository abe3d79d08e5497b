/*
 * jsongram: the per-sequence matcher of a compiled schema (jschema.h). A
 * pushdown automaton over JSON bytes: a stack of frames, one per value
 * being written (object, array, string, number, literal), each pointing at
 * its schema node. The state is a small plain struct, so trying a token's
 * bytes is a copy of the used frames and a walk over the bytes.
 *
 * gpe_jg_remaining tells the fewest bytes that complete the value from the
 * current state, assuming every byte can be one token; the vocabulary mask
 * (grammar.c) uses it to close the value before max_tokens runs out.
 */
#ifndef GPE_JSONGRAM_H
#define GPE_JSONGRAM_H

#include "jschema.h"

#define GPE_JG_MAX_DEPTH 32

typedef struct gpe_jg_frame {
    int32_t node;
    uint8_t mode;       /* what is being matched (jsongram.c F_*) */
    uint8_t st;         /* where inside it */
    uint8_t pend;       /* string: UTF-8 continuation bytes still due */
    uint8_t clo, chi;   /* string: range of the next continuation byte */
    uint8_t neg;        /* number: written '-' */
    int32_t n;          /* object: next property; array: items; string: chars;
                           number: integer digits; literal: offset */
    int32_t k;          /* object key: offset; literal: lo; number: fraction digits */
    int32_t h;          /* literal: hi (exclusive) */
    uint64_t mask;      /* object key: candidate properties still alive */
    int64_t v;          /* number: value of the integer part */
} gpe_jg_frame;

typedef struct gpe_jg_state {
    int depth;          /* 0: the value is complete */
    gpe_jg_frame f[GPE_JG_MAX_DEPTH];
} gpe_jg_state;

void gpe_jg_init(gpe_jg_state *s, const gpe_jschema *p);
/* Copy only the frames in use. */
static inline void gpe_jg_copy(gpe_jg_state *dst, const gpe_jg_state *src)
{
    dst->depth = src->depth;
    for (int i = 0; i < src->depth; i++)
        dst->f[i] = src->f[i];
}
/* Advance by one byte; false (state then undefined) when the byte is not
 * allowed. */
bool gpe_jg_feed(gpe_jg_state *s, const gpe_jschema *p, unsigned char c);
/* Fewest bytes that complete the value (0: it may end here). */
int64_t gpe_jg_remaining(const gpe_jg_state *s, const gpe_jschema *p);
/* Bytes of the frame on top only (the rest is remaining - this). */
int64_t gpe_jg_frame_remaining(const gpe_jg_frame *f, const gpe_jschema *p);
/* Top frame is inside a string, between characters (the fast path for
 * tokens of plain text): chars so far and the node's bounds. */
bool gpe_jg_in_string(const gpe_jg_state *s, const gpe_jschema *p, int64_t *chars,
                      int64_t *min_chars, int64_t *max_chars);
/* Top frame is inside a pattern string, between characters (the mask's
 * fast path for tokens of plain text there): its node, chars so far and
 * the pattern automaton's state (jregex.h). */
bool gpe_jg_in_pattern(const gpe_jg_state *s, const gpe_jschema *p, const gpe_js_node **node,
                       int64_t *chars, uint64_t *re_state);
/* Convenience for tests: feed len bytes; true when all were accepted. */
bool gpe_jg_feed_all(gpe_jg_state *s, const gpe_jschema *p, const char *b, size_t len);

#endif

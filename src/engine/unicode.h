/*
 * unicode: the little Unicode the tokenizers need: a UTF-8 decoder that
 * behaves like llama.cpp's on bad input, an encoder, general-category groups
 * (\p{L}, \p{N}, \p{P}, ...) and the White_Space property (\s).
 *
 * Category data is generated (scripts/gen_unicode_tables.py ->
 * unicode_data.c) from Python's unicodedata; lookups are a binary search over
 * ~2200 runs, with a table for Latin-1.
 */
#ifndef GPUPOOL_ENGINE_UNICODE_H
#define GPUPOOL_ENGINE_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* General-category groups (first letter of the category). */
enum {
    GPE_UCAT_UNASSIGNED = 0,   /* Cn, and anything above U+10FFFF */
    GPE_UCAT_L = 1,
    GPE_UCAT_N = 2,
    GPE_UCAT_P = 3,
    GPE_UCAT_S = 4,
    GPE_UCAT_M = 5,
    GPE_UCAT_Z = 6,
    GPE_UCAT_C = 7,            /* Cc Cf Cs Co */
};

#define GPE_UNICODE_REPLACEMENT 0xFFFDu

/* Decode one code point from s[0..len) (len >= 1). Mirrors llama.cpp's
 * decoder: lead byte decides the length, continuation bytes must be
 * 10xxxxxx, overlong forms and surrogates are accepted as they are; anything
 * else (stray continuation byte, truncated sequence, 0xF8..0xFF) gives
 * U+FFFD and consumes one byte. Values above U+10FFFF also give U+FFFD (for
 * the sequence's full length). *adv receives the bytes consumed (>= 1). */
uint32_t gpe_utf8_decode(const unsigned char *s, size_t len, size_t *adv);

/* Encode cpt (<= 0x10FFFF; larger gives U+FFFD) into out; returns 1..4. */
size_t gpe_utf8_encode(uint32_t cpt, char out[4]);

/* Length a UTF-8 sequence claims from its lead byte alone (1 for
 * continuation bytes, 4 for 0xF0..0xFF), as llama.cpp's unicode_len_utf8. */
static inline size_t gpe_utf8_len_lead(unsigned char c)
{
    static const unsigned char k[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return k[c >> 4];
}

/* Category group of cpt (GPE_UCAT_*). */
int gpe_ucat(uint32_t cpt);
/* White_Space property (Unicode PropList): \t \n \v \f \r, space, U+0085,
 * U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
bool gpe_uspace(uint32_t cpt);

/* First code point of cpt's canonical decomposition (cpt itself when it
 * has none): "é" -> "e". */
uint32_t gpe_unfd_first(uint32_t cpt);
/* Simple lowercase mapping (cpt itself when it has none). */
uint32_t gpe_ulower(uint32_t cpt);

/* cpt inside one of n sorted inclusive [first, last] ranges. */
bool gpe_urange_has(const uint32_t (*ranges)[2], size_t n, uint32_t cpt);

/* Generated tables (unicode_data.c). */
extern const char gpe_unicode_version[];
extern const uint32_t gpe_ucat_runs[];
extern const size_t gpe_ucat_runs_n;
extern const uint32_t gpe_uclass_dsllm_letter[][2];   /* deepseek-llm letter class */
extern const size_t gpe_uclass_dsllm_letter_n;
extern const uint32_t gpe_uclass_dsllm_punct[][2];    /* deepseek-llm punctuation class */
extern const size_t gpe_uclass_dsllm_punct_n;
extern const uint32_t gpe_uclass_cjk[][2];            /* deepseek CJK/Hangul class */
extern const size_t gpe_uclass_cjk_n;
extern const uint32_t gpe_unfd_table[][3];
extern const size_t gpe_unfd_table_n;
extern const uint32_t gpe_ulower_table[][2];
extern const size_t gpe_ulower_table_n;

#endif

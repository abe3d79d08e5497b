/*
 * np_random: a bit-exact reimplementation of the numbers that
 *   numpy.random.default_rng(seed).standard_normal(n, dtype=numpy.float32)
 * produces, so that test models first made with numpy can be regenerated
 * here without numpy. Facts used (numpy's documented algorithms):
 *   - SeedSequence(seed) with a pool of four 32-bit words mixed by the
 *     hashmix/mix functions of Melissa O'Neill's seed_seq_fe, then
 *     generate_state(4 x u64) -> PCG64's 128-bit initial state and stream;
 *   - PCG64 (XSL-RR 128/64) seeded the PCG way (state 0, inc = 2*seq+1,
 *     step, add initstate, step); a 32-bit draw hands out the low half of
 *     a 64-bit output first and keeps the high half for the next draw;
 *   - the float32 normal is numpy's 256-layer ziggurat on one 32-bit draw
 *     (8 bits layer, 1 bit sign, 23 bits magnitude) with its tables
 *     (np_ziggurat.h).
 * Only non-negative integer seeds below 2^32 are supported (all the models
 * use small ones). Compile with -ffp-contract=off: the float expressions
 * must round exactly as numpy's (its build does not contract them).
 *
 * Ownership: np_rng is a plain value; no allocation.
 */
#ifndef GPUPOOL_TESTS_SYNTH_NP_RANDOM_H
#define GPUPOOL_TESTS_SYNTH_NP_RANDOM_H

#include <stdbool.h>
#include <stdint.h>

typedef struct np_rng {
    unsigned __int128 state, inc;
    bool has_u32;        /* high half of the last 64-bit output pending */
    uint32_t u32;
} np_rng;

/* numpy.random.default_rng(seed). */
void np_rng_seed(np_rng *r, uint32_t seed);
/* The generator's raw outputs (for tests against numpy's bit_generator). */
uint64_t np_rng_next_u64(np_rng *r);
uint32_t np_rng_next_u32(np_rng *r);
/* One standard_normal(dtype=float32) draw. */
float np_rng_normal_f32(np_rng *r);
/* SeedSequence(seed).generate_state(n_words, dtype=uint32), n_words <= 8. */
void np_seed_seq_state(uint32_t seed, uint32_t *out, int n_words);

#endif

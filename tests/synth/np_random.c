/* np_random: numpy-compatible SeedSequence, PCG64 and float32 normals
 * (see np_random.h for what is reproduced and why). */
#include "np_random.h"

#include <math.h>

#include "np_ziggurat.h"

/* SeedSequence's hash constants (numpy.random.bit_generator, after
 * seed_seq_fe). */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t v, uint32_t *hc)
{
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    return v ^ (v >> SS_XSHIFT);
}

static uint32_t ss_mix(uint32_t x, uint32_t y)
{
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> SS_XSHIFT);
}

void np_seed_seq_state(uint32_t seed, uint32_t *out, int n_words)
{
    /* The entropy of an integer below 2^32 is the single word [seed]; the
     * other pool slots hash zeros. */
    uint32_t pool[SS_POOL], hc = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++)
        pool[i] = ss_hashmix(i == 0 ? seed : 0, &hc);
    for (int s = 0; s < SS_POOL; s++)
        for (int d = 0; d < SS_POOL; d++)
            if (s != d)
                pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < n_words; i++) {
        uint32_t v = pool[i % SS_POOL] ^ hb;
        hb *= SS_MULT_B;
        v *= hb;
        out[i] = v ^ (v >> SS_XSHIFT);
    }
}

#define PCG_MULT ((((unsigned __int128)2549297995355413924ull) << 64) | 4865540595714422341ull)

static void pcg_step(np_rng *r)
{
    r->state = r->state * PCG_MULT + r->inc;
}

void np_rng_seed(np_rng *r, uint32_t seed)
{
    uint32_t w[8];
    np_seed_seq_state(seed, w, 8);
    uint64_t v[4];
    for (int i = 0; i < 4; i++)
        v[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    /* numpy passes v[0..1] as (high, low) of the initial state and v[2..3]
     * as (high, low) of the stream. */
    unsigned __int128 init = ((unsigned __int128)v[0] << 64) | v[1];
    unsigned __int128 seq = ((unsigned __int128)v[2] << 64) | v[3];
    r->state = 0;
    r->inc = (seq << 1) | 1u;
    pcg_step(r);
    r->state += init;
    pcg_step(r);
    r->has_u32 = false;
    r->u32 = 0;
}

uint64_t np_rng_next_u64(np_rng *r)
{
    pcg_step(r);
    uint64_t x = (uint64_t)(r->state >> 64) ^ (uint64_t)r->state;
    unsigned rot = (unsigned)(r->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t np_rng_next_u32(np_rng *r)
{
    if (r->has_u32) {
        r->has_u32 = false;
        return r->u32;
    }
    uint64_t v = np_rng_next_u64(r);
    r->has_u32 = true;
    r->u32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

/* Uniform [0, 1) from the top 24 bits, in float arithmetic. */
static float rng_float(np_rng *r)
{
    return (float)(np_rng_next_u32(r) >> 8) * (1.0f / 16777216.0f);
}

/* The tail beyond r (layer 0 with a magnitude past its threshold):
 * Marsaglia's exponential rejection, evaluated in float with log1pf. */
static float normal_tail(np_rng *r, uint32_t rabs)
{
    for (;;) {
        float xx = -np_zig_inv_r * log1pf(-rng_float(r));
        float yy = -log1pf(-rng_float(r));
        if (yy + yy > xx * xx)
            return ((rabs >> 8) & 1u) ? -(np_zig_r + xx) : np_zig_r + xx;
    }
}

float np_rng_normal_f32(np_rng *r)
{
    for (;;) {
        uint32_t u = np_rng_next_u32(r);
        int layer = (int)(u & 0xffu);
        uint32_t rabs = (u >> 9) & 0x7fffffu;
        float x = (float)rabs * np_zig_wi[layer];
        if ((u >> 8) & 1u)
            x = -x;
        if (rabs < np_zig_ki[layer])
            return x;   /* inside the layer's rectangle: most draws */
        if (layer == 0)
            return normal_tail(r, rabs);
        /* Wedge: accept under the density; the comparison is in double
         * (exp of a double argument), as numpy evaluates it. */
        float y = (np_zig_fi[layer - 1] - np_zig_fi[layer]) * rng_float(r) + np_zig_fi[layer];
        if ((double)y < exp(-0.5 * (double)x * (double)x))
            return x;
    }
}

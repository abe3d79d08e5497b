/*
 * np_random against numbers recorded from numpy 1.24
 * (numpy.random.SeedSequence / default_rng / standard_normal(float32)):
 * seeding words, raw PCG64 outputs, the first normals bit for bit, and a
 * position-weighted checksum of the bits of a million normals per seed
 * (each million holds 240-270 draws from the tail beyond r = 3.654, so the
 * tail and wedge paths are covered too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "np_random.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_seed_sequence(void **state)
{
    (void)state;
    static const uint32_t want1234[4] = {0xad3f26a6, 0x5f83044c, 0x0cea3a6f, 0xa0d9b370};
    static const uint32_t want0[8] = {0xb0f478be, 0xdb2cd7e7, 0x2c71ba49, 0xabf4641a,
                                      0x9d7b8d41, 0x20c6ed6d, 0x223c39d4, 0x2c4099de};
    uint32_t w[8];
    np_seed_seq_state(1234, w, 4);
    assert_memory_equal(w, want1234, sizeof want1234);
    np_seed_seq_state(0, w, 8);
    assert_memory_equal(w, want0, sizeof want0);
}

static void test_pcg64_raw(void **state)
{
    (void)state;
    np_rng r;
    np_rng_seed(&r, 1234);
    assert_int_equal(np_rng_next_u64(&r), 0xfa08fef3fab6bbbaull);
    assert_int_equal(np_rng_next_u64(&r), 0x615481f7fce9ac81ull);
    assert_int_equal(np_rng_next_u64(&r), 0xec59dd7c2bde3cb4ull);
    /* 32-bit draws: the low half of an output first, then its high half. */
    np_rng_seed(&r, 1234);
    assert_int_equal(np_rng_next_u32(&r), 0xfab6bbbau);
    assert_int_equal(np_rng_next_u32(&r), 0xfa08fef3u);
    assert_int_equal(np_rng_next_u32(&r), 0xfce9ac81u);
}

static void test_first_normals(void **state)
{
    (void)state;
    /* default_rng(8).standard_normal(6, dtype=float32):
     * -2.0311995 0.5064555 -0.3489705 2.2814863 -0.43588328 0.53350383 */
    static const uint32_t want[6] = {0xc001ff2c, 0x3f01a711, 0xbeb2ac43,
                                     0x401203df, 0xbedf2c18, 0x3f0893b5};
    np_rng r;
    np_rng_seed(&r, 8);
    for (int i = 0; i < 6; i++)
        assert_int_equal(bits(np_rng_normal_f32(&r)), want[i]);
}

static void test_million_normals(void **state)
{
    (void)state;
    static const struct {
        uint32_t seed;
        uint64_t checksum;   /* sum over i of bits(x_i) * (i + 1), mod 2^64 */
        uint32_t last;
        int tail;            /* draws with |x| > 3.6541529 */
    } cases[] = {
        {0, 0xbda793062c1d8bcbull, 0xbf31d531, 241},
        {8, 0xb9a6910c8f2bfd05ull, 0x3f3998fc, 269},
        {1234, 0xc145e1662bd0aaf4ull, 0x3d3dbd4a, 271},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        np_rng r;
        np_rng_seed(&r, cases[c].seed);
        uint64_t sum = 0;
        uint32_t last = 0;
        int tail = 0;
        for (uint64_t i = 0; i < 1000000; i++) {
            float x = np_rng_normal_f32(&r);
            last = bits(x);
            sum += (uint64_t)last * (i + 1);
            tail += x > 3.6541529f || x < -3.6541529f;
        }
        assert_int_equal(sum, cases[c].checksum);
        assert_int_equal(last, cases[c].last);
        assert_int_equal(tail, cases[c].tail);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_sequence),
        cmocka_unit_test(test_pcg64_raw),
        cmocka_unit_test(test_first_normals),
        cmocka_unit_test(test_million_normals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

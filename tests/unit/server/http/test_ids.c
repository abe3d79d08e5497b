/* ids: the shape of an id and that many in a row are all distinct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_util.h"
#include "server/http/ids.h"

static int cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

static void test_shape(void **st)
{
    (void)st;
    char id[64];
    gps_id_new("job_", id, sizeof id);
    assert_int_equal(strlen(id), 4 + 24);
    assert_memory_equal(id, "job_", 4);
    assert_int_equal(strspn(id + 4, "0123456789abcdef"), 24);
    char corr[33];
    gps_id_hex(corr, 16);
    assert_int_equal(strlen(corr), 32);
    assert_int_equal(strspn(corr, "0123456789abcdef"), 32);
    char small[8];
    gps_id_new("msg_", small, sizeof small); /* truncated, still terminated */
    assert_int_equal(strlen(small), 7);
}

static void test_distinct(void **st)
{
    (void)st;
    enum { N = 200000, W = 32 };
    char(*ids)[W] = malloc((size_t)N * W);
    assert_non_null(ids);
    for (int i = 0; i < N; i++)
        gps_id_new("x", ids[i], W);
    qsort(ids, N, W, cmp);
    for (int i = 1; i < N; i++)
        assert_true(strcmp(ids[i - 1], ids[i]) != 0);
    free(ids);
}

static uint64_t id_ms(const char *hex12)
{
    char t[13];
    memcpy(t, hex12, 12);
    t[12] = '\0';
    return strtoull(t, NULL, 16);
}

/* The first 12 digits are the wall clock in ms: an id made in a later
 * millisecond sorts after one made earlier (the store's index grows at its
 * end). The loop waits for the clock to move, not for a fixed time. */
static void test_time_order(void **st)
{
    (void)st;
    char a[40], b[40];
    int64_t t0 = gp_now_wall_ms();
    gps_id_new("job_", a, sizeof a);
    int64_t t1 = gp_now_wall_ms();
    assert_true(id_ms(a + 4) >= (uint64_t)t0 && id_ms(a + 4) <= (uint64_t)t1);
    while (gp_now_wall_ms() <= t1)
        ;
    gps_id_new("job_", b, sizeof b);
    assert_true(strcmp(b, a) > 0);
    assert_true(id_ms(b + 4) > id_ms(a + 4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_distinct),
        cmocka_unit_test(test_time_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

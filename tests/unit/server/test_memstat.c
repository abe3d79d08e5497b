/* memstat: the process memory figures and the heap trim (issue 9 soak:
 * RSS kept the high-water of every load peak while the heap in use went
 * back down). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/memstat.h"

#define NBLOCKS 4096
#define BLOCK 4096 /* well under glibc's mmap threshold: from the heap */

static void test_read(void **st)
{
    (void)st;
    gps_memstat m;
    gps_memstat_read(&m);
    assert_true(m.rss_bytes > 0);
    assert_true(m.heap_mmap_bytes <= m.heap_inuse_bytes);
}

/* Freed blocks below a live one stay resident (free() can only shrink the
 * heap's top); the trim gives their pages back. */
static void test_trim_gives_back_free_heap(void **st)
{
    (void)st;
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* ASan's allocator replaces glibc's: mallinfo2/malloc_trim see nothing */
#else
    assert_false(gps_memstat_trim(0, NULL)); /* 0: never */
    char **b = calloc(NBLOCKS, sizeof *b);
    assert_non_null(b);
    for (size_t i = 0; i < NBLOCKS; i++) {
        b[i] = malloc(BLOCK);
        assert_non_null(b[i]);
        memset(b[i], (int)(i & 0xff) | 1, BLOCK); /* resident */
    }
    char *pin = malloc(BLOCK); /* above them: the heap's top cannot shrink */
    assert_non_null(pin);
    memset(pin, 1, BLOCK);
    for (size_t i = 0; i < NBLOCKS; i++)
        free(b[i]);
    gps_memstat m;
    gps_memstat_read(&m);
    assert_true(m.heap_free_bytes >= (size_t)NBLOCKS * BLOCK / 2);
    /* Under the threshold: nothing happens. */
    size_t released = 1;
    assert_false(gps_memstat_trim(SIZE_MAX, &released));
    assert_int_equal(released, 0);
    assert_true(gps_memstat_trim((size_t)1 << 20, &released));
    assert_true(released >= (size_t)NBLOCKS * BLOCK / 2);
    free(pin);
    free(b);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_trim_gives_back_free_heap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

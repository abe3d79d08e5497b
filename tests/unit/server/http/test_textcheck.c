/* textcheck: UTF-8 validity with and without the printable rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/http/textcheck.h"

typedef struct row {
    const char *s;
    size_t n;
    bool utf8, printable;
} row;

static void test_utf8_table(void **st)
{
    (void)st;
    static const row rows[] = {
        {"hello", 5, true, true},
        {"line\nbreak\t", 11, true, false},          /* controls: UTF-8, not printable */
        {"caf\xc3\xa9", 5, true, true},               /* U+00E9 */
        {"\xe2\x82\xac", 3, true, true},              /* U+20AC */
        {"\xf0\x9f\x98\x80", 4, true, true},          /* U+1F600 */
        {"\xc2\x85", 2, true, false},                 /* C1 control U+0085 */
        {"\xc3", 1, false, false},                    /* cut inside a character */
        {"\xe2\x82", 2, false, false},
        {"\xc0\xaf", 2, false, false},                /* overlong '/' */
        {"\xed\xa0\x80", 3, false, false},            /* surrogate U+D800 */
        {"\xf4\x90\x80\x80", 4, false, false},        /* above U+10FFFF */
        {"\x80", 1, false, false},                    /* lone continuation byte */
        {"a\0b", 3, true, false},                     /* NUL is a control */
        {"", 0, true, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (gps_text_utf8(rows[i].s, rows[i].n) != rows[i].utf8 ||
            gps_text_printable_utf8(rows[i].s, rows[i].n) != rows[i].printable)
            fail_msg("row %zu", i);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_utf8_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

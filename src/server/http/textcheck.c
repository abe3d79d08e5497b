/* textcheck: see textcheck.h. */
#include "server/http/textcheck.h"

#include <stdint.h>

/* The one decoder: printable additionally refuses control characters. */
static bool utf8_check(const char *s, size_t n, bool printable)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (printable && (c < 0x20 || c == 0x7f))
                return false;
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
            (printable && cp >= 0x80 && cp <= 0x9f))
            return false;
        i += len;
    }
    return true;
}

bool gps_text_printable_utf8(const char *s, size_t n)
{
    return utf8_check(s, n, true);
}

bool gps_text_utf8(const char *s, size_t n)
{
    return utf8_check(s, n, false);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool gps_query_has_control(const char *q)
{
    for (; q && *q; q++) {
        unsigned c = (unsigned char)*q;
        if (c == '%' && hexval(q[1]) >= 0 && hexval(q[2]) >= 0)
            c = (unsigned)(hexval(q[1]) * 16 + hexval(q[2]));
        if (c < 0x20 || c == 0x7f)
            return true;
    }
    return false;
}

/*
 * unicode: UTF-8 coding, category groups and White_Space (see unicode.h).
 */
#include "engine/unicode.h"

uint32_t gpe_utf8_decode(const unsigned char *s, size_t len, size_t *adv)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t cpt;

    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    if (c < 0xC0 || c >= 0xF8)
        goto bad;
    if (c < 0xE0) {
        n = 2;
        cpt = c & 0x1F;
    } else if (c < 0xF0) {
        n = 3;
        cpt = c & 0x0F;
    } else {
        n = 4;
        cpt = c & 0x07;
    }
    if (n > len)
        goto bad;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            goto bad;
        cpt = (cpt << 6) | (s[i] & 0x3F);
    }
    *adv = n;
    /* llama.cpp would throw while re-encoding such a value; we substitute. */
    return cpt > 0x10FFFF ? GPE_UNICODE_REPLACEMENT : cpt;
bad:
    *adv = 1;
    return GPE_UNICODE_REPLACEMENT;
}

size_t gpe_utf8_encode(uint32_t cpt, char out[4])
{
    if (cpt > 0x10FFFF)
        cpt = GPE_UNICODE_REPLACEMENT;
    if (cpt < 0x80) {
        out[0] = (char)cpt;
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = (char)(0xC0 | (cpt >> 6));
        out[1] = (char)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt < 0x10000) {
        out[0] = (char)(0xE0 | (cpt >> 12));
        out[1] = (char)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cpt >> 18));
    out[1] = (char)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cpt & 0x3F));
    return 4;
}

static int ucat_search(uint32_t cpt)
{
    /* Last run whose start is <= cpt. Run 0 starts at U+0000. */
    size_t lo = 0, hi = gpe_ucat_runs_n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((gpe_ucat_runs[mid] >> 4) <= cpt)
            lo = mid;
        else
            hi = mid;
    }
    return (int)(gpe_ucat_runs[lo] & 0xF);
}

int gpe_ucat(uint32_t cpt)
{
    /* ASCII dominates real text: answer it without the search. */
    static const unsigned char ascii[128] = {
        7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,   /* 0x00 */
        7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,   /* 0x10 */
        6, 3, 3, 3, 4, 3, 3, 3, 3, 3, 3, 4, 3, 3, 3, 3,   /* 0x20  !"#$%&'()*+,-./ */
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 3,   /* 0x30 0-9:;<=>? */
        3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,   /* 0x40 @A-O */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 4, 3,   /* 0x50 P-Z[\]^_ */
        4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,   /* 0x60 `a-o */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4, 3, 4, 7,   /* 0x70 p-z{|}~DEL */
    };
    if (cpt < 128)
        return ascii[cpt];
    if (cpt > 0x10FFFF)
        return GPE_UCAT_UNASSIGNED;
    return ucat_search(cpt);
}

bool gpe_uspace(uint32_t cpt)
{
    if (cpt < 0x80)
        return cpt == ' ' || (cpt >= 0x09 && cpt <= 0x0D);
    switch (cpt) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return true;
    default:
        return cpt >= 0x2000 && cpt <= 0x200A;
    }
}

bool gpe_urange_has(const uint32_t (*ranges)[2], size_t n, uint32_t cpt)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cpt < ranges[mid][0])
            hi = mid;
        else if (cpt > ranges[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

uint32_t gpe_unfd_first(uint32_t cpt)
{
    size_t lo = 0, hi = gpe_unfd_table_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cpt < gpe_unfd_table[mid][0])
            hi = mid;
        else if (cpt > gpe_unfd_table[mid][1])
            lo = mid + 1;
        else
            return gpe_unfd_table[mid][2];
    }
    return cpt;
}

uint32_t gpe_ulower(uint32_t cpt)
{
    if (cpt < 0x80)
        return (cpt >= 'A' && cpt <= 'Z') ? cpt + 32 : cpt;
    size_t lo = 0, hi = gpe_ulower_table_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cpt < gpe_ulower_table[mid][0])
            hi = mid;
        else if (cpt > gpe_ulower_table[mid][0])
            lo = mid + 1;
        else
            return gpe_ulower_table[mid][1];
    }
    return cpt;
}

/* ids: see ids.h. */
#include "server/http/ids.h"

#include <stdio.h>

#include "common/gp_util.h"

static uint64_t key[2]; /* read once from RAND_bytes */
static uint64_t counter;
static int seeded;

/* splitmix64's finaliser: a bijection on 64 bits. */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t gps_id_u64(void)
{
    if (!seeded) {
        gp_random_bytes(key, sizeof key);
        seeded = 1;
    }
    return mix(++counter ^ key[0]) ^ key[1];
}

void gps_id_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    /* The event loop is one thread: no lock. Each 8 bytes of output take
     * the next counter value, so longer ids stay distinct too. */
    size_t i = 0;
    while (i < nbytes) {
        uint64_t v = gps_id_u64();
        for (int b = 0; b < 8 && i < nbytes; b++, i++, v >>= 8) {
            out[2 * i] = hex[(v >> 4) & 15];
            out[2 * i + 1] = hex[v & 15];
        }
    }
    out[2 * nbytes] = '\0';
}

void gps_id_new(const char *prefix, char *out, size_t outlen)
{
    char hex[25];
    gps_id_hex(hex, 12);
    size_t n = gp_copy_str(out, outlen, prefix);
    gp_copy_str(out + n, outlen - n, hex);
}

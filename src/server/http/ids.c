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

/* A bijection on 48 bits (xor-shifts and odd multipliers mod 2^48): the
 * suffix of ids made in one process never repeats, whatever the clock does. */
static uint64_t mix48(uint64_t z)
{
    const uint64_t m = (1ULL << 48) - 1;
    z &= m;
    z ^= z >> 24;
    z = (z * 0x9e3779b97f4bULL) & m;
    z ^= z >> 21;
    z = (z * 0xd6e8feb86659ULL) & m;
    return z ^ (z >> 25);
}

static void put_hex48(char *out, uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 11; i >= 0; i--, v >>= 4)
        out[i] = hex[v & 15];
}

void gps_id_new(const char *prefix, char *out, size_t outlen)
{
    if (!seeded) {
        gp_random_bytes(key, sizeof key);
        seeded = 1;
    }
    char hex[25];
    put_hex48(hex, (uint64_t)gp_now_wall_ms());
    put_hex48(hex + 12, mix48(++counter ^ key[0]) ^ key[1]);
    hex[24] = '\0';
    size_t n = gp_copy_str(out, outlen, prefix);
    gp_copy_str(out + n, outlen - n, hex);
}

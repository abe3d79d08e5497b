/* gp_util: see gp_util.h. */
#include "common/gp_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>
#include <unistd.h>

#include <openssl/rand.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/crypto.h>

/* ------------------------------------------------------------------ time */

uint64_t gp_now_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t gp_now_mono_ms(void)
{
    return gp_now_mono_us() / 1000u;
}

int64_t gp_now_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ randomness */

void gp_random_bytes(void *buf, size_t n)
{
    if (RAND_bytes(buf, (int)n) != 1) {
        fprintf(stderr, "gpupool: OpenSSL RAND_bytes failed; refusing to continue\n");
        abort();
    }
}

void gp_random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char tmp[64];
    size_t done = 0;
    while (done < nbytes) {
        size_t k = nbytes - done < sizeof tmp ? nbytes - done : sizeof tmp;
        gp_random_bytes(tmp, k);
        for (size_t i = 0; i < k; i++) {
            out[2 * (done + i)] = hex[tmp[i] >> 4];
            out[2 * (done + i) + 1] = hex[tmp[i] & 15];
        }
        done += k;
    }
    out[2 * nbytes] = '\0';
}

void gp_uuid4(char out[37])
{
    unsigned char b[16];
    gp_random_bytes(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}

bool gp_uuid_valid(const char *s)
{
    if (!s || strlen(s) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        char c = s[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c != '-')
                return false;
        } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
            return false;
        }
    }
    return true;
}

void gp_id_new(const char *prefix, char *out, size_t outlen)
{
    char hex[25];
    gp_random_hex(hex, 12);
    snprintf(out, outlen, "%s%s", prefix, hex);
}

/* --------------------------------------------------------------- hashing */

bool gp_hex64_ok(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

void gp_sha256_hex(const void *data, size_t len, char out[65])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(data, len, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
}

void gp_hmac_sha256_hex(const void *key, size_t keylen, const void *data, size_t len,
                        char out[65])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (!HMAC(EVP_sha256(), key, (int)keylen, data, len, md, &n) || n != 32)
        abort(); /* a tag that silently is not keyed would be worse */
    for (unsigned i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
}

int gp_ct_equal(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

/* ----------------------------------------------------------------- files */

char *gp_read_file(const char *path, size_t *len, size_t max)
{
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    gp_buf b;
    gp_buf_init(&b);
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.len + n > max) {
            errno = EFBIG;
            goto done;
        }
        if (gp_buf_append(&b, chunk, n) < 0)
            goto done;
    }
    if (ferror(f)) {
        errno = EIO;
        goto done;
    }
    if (gp_buf_append(&b, "", 0) < 0)
        goto done;
    if (len)
        *len = b.len;
    buf = gp_buf_steal(&b);
done:
    gp_buf_free(&b);
    fclose(f);
    return buf;
}

int gp_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    int fd = -1, rc = -1;
    if (!tmp)
        return -1;
    snprintf(tmp, plen + 16, "%s.tmp%05d", path, (int)(getpid() % 100000));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        goto done;
    if (fchmod(fd, mode) < 0)
        goto done;
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            goto done;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) < 0)
        goto done;
    if (close(fd) < 0) {
        fd = -1;
        goto done;
    }
    fd = -1;
    if (rename(tmp, path) < 0)
        goto done;
    rc = 0;
done:
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
    }
    free(tmp);
    return rc;
}

int gp_mkdirs(const char *path, mode_t mode)
{
    char *p = strdup(path);
    int rc = -1;
    if (!p)
        return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST)
            goto done;
        *s = '/';
    }
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        goto done;
    rc = 0;
done:
    free(p);
    return rc;
}

/* --------------------------------------------------------------- network */

int gp_parse_hostport(const char *s, char **host, int *port, bool allow_zero)
{
    const char *colon, *hstart, *hend;
    *host = NULL;
    if (!s || !*s)
        return -1;
    if (s[0] == '[') {
        hend = strchr(s, ']');
        if (!hend || hend[1] != ':')
            return -1;
        hstart = s + 1;
        colon = hend + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || strchr(s, ':') != colon)
            return -1;
        hstart = s;
        hend = colon;
    }
    if (hend == hstart)
        return -1;
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end != '\0' || p < (allow_zero ? 0 : 1) || p > 65535)
        return -1;
    *host = strndup(hstart, (size_t)(hend - hstart));
    if (!*host)
        return -1;
    *port = (int)p;
    return 0;
}

bool gp_host_is_loopback(const char *host)
{
    if (!host)
        return false;
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0)
        return true;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1)
        return (ntohl(a.s_addr) >> 24) == 127;
    return false;
}

/* ---------------------------------------------------------------- buffer */

void gp_buf_init(gp_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void gp_buf_free(gp_buf *b)
{
    free(b->data);
    gp_buf_init(b);
}

int gp_buf_grow_(gp_buf *b, size_t extra)
{
    if (extra >= SIZE_MAX - b->len) { /* len + extra + 1 would wrap */
        errno = ENOMEM;
        return -1;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            errno = ENOMEM;
            return -1;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d)
        return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

/* The room is there nearly always: checked here, grown out of line (a
 * relayed token's frame is several appends). */
static inline int buf_reserve(gp_buf *b, size_t extra)
{
    return extra < b->cap - b->len ? 0 : gp_buf_grow_(b, extra);
}

int gp_buf_append_int(gp_buf *b, long long v)
{
    char d[24];
    size_t i = sizeof d;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do
        d[--i] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        d[--i] = '-';
    return gp_buf_append(b, d + i, sizeof d - i);
}

int gp_buf_appendf(gp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void gp_buf_consume(gp_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        if (b->data)
            b->data[0] = '\0';
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

char *gp_buf_take(gp_buf *b)
{
    if (!b->data || !b->cap)
        return NULL;
    char *fresh = malloc(b->cap);
    if (!fresh)
        return NULL;
    char *d = b->data;
    fresh[0] = '\0';
    b->data = fresh;
    b->len = 0;
    return d;
}

char *gp_buf_steal(gp_buf *b)
{
    char *d = b->data;
    if (!d)
        d = calloc(1, 1);
    gp_buf_init(b);
    return d;
}

/* ------------------------------------------------------------------ json */

/* Bytes of s[0..n) inside a JSON string as json_dumps writes it: '"' and
 * '\\' and \b \f \n \r \t take 2, other control characters 6 (\u00XX),
 * everything else (UTF-8 included) 1. */
size_t gp_json_escaped_len(const char *s, size_t n)
{
    size_t len = n;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' ||
            c == '\t')
            len += 1;
        else if (c < 0x20)
            len += 5;
    }
    return len;
}

/* A real as jansson's dump writes it: "%.17g", ".0" added when it has
 * neither '.' nor 'e', the exponent's '+' and leading zeros cut
 * (test_gp_util checks it against json_dumpb). Its length, 0 when it does
 * not fit b (the caller asks jansson). */
/* snprintf's "%.17g" of d for 1e-4 <= |d| < 2^53 with a fraction (every
 * metric an agent reports: ttft_ms, tokens_per_s), computed exactly in
 * 128-bit integers instead (~2,800 instructions a real through printf).
 * Its length, or 0 for any other d (snprintf's then). */
static size_t g17(char b[48], double d)
{
    double mag = d < 0 ? -d : d;
    if (!(mag >= 1e-4 && mag < 9007199254740992.0))
        return 0;
    uint64_t bits;
    memcpy(&bits, &mag, sizeof bits);
    int e2 = (int)((bits >> 52) & 0x7ff) - 1075;
    uint64_t m = (bits & ((1ULL << 52) - 1)) | (1ULL << 52);
    if (e2 >= 0)
        return 0; /* integral: the caller's */
    unsigned s = (unsigned)-e2;
    static const uint64_t p10[] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL,
                                   1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
                                   10000000000ULL, 100000000000ULL, 1000000000000ULL,
                                   10000000000000ULL, 100000000000000ULL,
                                   1000000000000000ULL, 10000000000000000ULL,
                                   100000000000000000ULL};
    const uint64_t lo = p10[16], hi = p10[17];
    /* E with 10^E <= mag < 10^(E+1): guessed, then settled exactly by
     * floor(mag * 10^(16-E)) falling in [10^16, 10^17). */
    int E = 0;
    while (E < 15 && mag >= (double)p10[E + 1])
        E++;
    if (mag < 1.0)
        for (E = -1; E > -4 && mag < 1.0 / (double)p10[-E]; E--)
            ;
    unsigned __int128 q = 0, r = 0, half = (unsigned __int128)1 << (s - 1);
    for (int tries = 0;; tries++) {
        int k = 16 - E; /* 1 .. 20 */
        if (tries > 2 || k < 1 || k > 20)
            return 0;
        unsigned __int128 P = (unsigned __int128)m;
        /* 10^k as 10^min(k,17) * 10^rest: m * 10^20 < 2^120 */
        P *= k > 17 ? p10[17] : p10[k];
        if (k > 17)
            P *= p10[k - 17];
        if (s >= 128)
            return 0;
        q = P >> s;
        r = P & (((unsigned __int128)1 << s) - 1);
        if (q < lo)
            E--;
        else if (q >= hi)
            E++;
        else
            break;
    }
    if (r > half || (r == half && (q & 1)))
        q++; /* to nearest, ties to even: glibc's exact rounding */
    if (q == hi) {
        q = lo;
        E++;
    }
    if (E < -4 || E > 15)
        return 0;
    char dig[17];
    uint64_t v = (uint64_t)q;
    for (int i = 16; i >= 0; i--, v /= 10)
        dig[i] = (char)('0' + v % 10);
    size_t n = 0;
    if (d < 0)
        b[n++] = '-';
    int last = 16; /* the fraction's trailing zeros are cut ("%g") */
    while (last > (E > 0 ? E : 0) && dig[last] == '0')
        last--;
    if (E >= 0) {
        memcpy(b + n, dig, (size_t)E + 1);
        n += (size_t)E + 1;
        if (last > E) {
            b[n++] = '.';
            memcpy(b + n, dig + E + 1, (size_t)(last - E));
            n += (size_t)(last - E);
        }
    } else {
        b[n++] = '0';
        b[n++] = '.';
        for (int z = -E - 1; z > 0; z--)
            b[n++] = '0';
        memcpy(b + n, dig, (size_t)last + 1);
        n += (size_t)last + 1;
    }
    b[n] = '\0';
    return n;
}

static size_t real_fmt(char b[48], double d)
{
    /* An integral value under 2^53: "%.17g" writes its digits (16 at
     * most, never an exponent), written here without snprintf (~2,800
     * instructions a real; a job's temperature and top_p are such). */
    double mag = d < 0 ? -d : d;
    if (mag < 9007199254740992.0 && d == (double)(long long)d) {
        unsigned long long u = (unsigned long long)(long long)mag;
        char dig[20];
        size_t k = sizeof dig, n = 0;
        do
            dig[--k] = (char)('0' + u % 10);
        while ((u /= 10) != 0);
        if (signbit(d))
            b[n++] = '-';
        memcpy(b + n, dig + k, sizeof dig - k);
        n += sizeof dig - k;
        memcpy(b + n, ".0", 3);
        return n + 2;
    }
    size_t fast = g17(b, d);
    int n = fast ? (int)fast : snprintf(b, 48, "%.17g", d);
    if (n <= 0 || n >= 46)
        return 0;
    char *e = strchr(b, 'e');
    if (!e) {
        if (!strchr(b, '.')) {
            memcpy(b + n, ".0", 3);
            n += 2;
        }
        return (size_t)n;
    }
    char *x = e + 1, *from;
    if (*x == '-')
        x++;
    for (from = x; *from == '+' || *from == '0'; from++)
        ;
    memmove(x, from, strlen(from) + 1);
    return strlen(b);
}

size_t gp_json_real_size(double d)
{
    char b[48];
    size_t n = real_fmt(b, d);
    if (n)
        return n;
    json_t *r = json_real(d); /* (the rare real real_fmt leaves to jansson) */
    n = r ? json_dumpb(r, NULL, 0, JSON_ENCODE_ANY) : 0;
    json_decref(r);
    return n;
}

size_t gp_json_compact_size(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = 2, k = 0;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) {
            n += gp_json_escaped_len(key, strlen(key)) + 3 + gp_json_compact_size(val) + (k++ ? 1 : 0);
        }
        return n;
    }
    case JSON_ARRAY: {
        size_t n = 2, cnt = json_array_size(v);
        for (size_t i = 0; i < cnt; i++)
            n += gp_json_compact_size(json_array_get(v, i)) + (i ? 1 : 0);
        return n;
    }
    case JSON_STRING:
        return 2 + gp_json_escaped_len(json_string_value(v), json_string_length(v));
    case JSON_INTEGER: {
        /* The digits of "%" JSON_INTEGER_FORMAT, counted (a snprintf per
         * number was most of an agent event's size walk). */
        json_int_t x = json_integer_value(v);
        size_t n = 1;
        unsigned long long u = (unsigned long long)x;
        if (x < 0) {
            n++;
            u = 0ull - u;
        }
        for (; u >= 10; u /= 10)
            n++;
        return n;
    }
    case JSON_REAL:
        return gp_json_real_size(json_real_value(v));
    case JSON_TRUE:
        return 4;
    case JSON_FALSE:
        return 5;
    case JSON_NULL:
        return 4;
    }
    return 0;
}

/* -------------------------------------------------- JSON, dumped fast */

/* One UTF-8 sequence of 2-4 bytes at p (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF: what jansson accepts). */
size_t gp_utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char b = p[0];
    size_t n = b >= 0xC2 && b <= 0xDF   ? 2
               : b >= 0xE0 && b <= 0xEF ? 3
               : b >= 0xF0 && b <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || (size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    if ((b == 0xE0 && p[1] < 0xA0) || (b == 0xED && p[1] > 0x9F) ||
        (b == 0xF0 && p[1] < 0x90) || (b == 0xF4 && p[1] > 0x8F))
        return 0;
    return n;
}

size_t gp_copy_cut(char *dst, size_t cap, const char *src, size_t n)
{
    size_t k = src ? strnlen(src, n < cap - 1 ? n : cap - 1) : 0;
    if (k)
        memcpy(dst, src, k);
    dst[k] = '\0';
    return k;
}

size_t gp_copy_str(char *dst, size_t cap, const char *src)
{
    return gp_copy_cut(dst, cap, src, cap - 1);
}

bool gp_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s, *end = u + n;
    while (u < end) {
        if (*u < 0x80) {
            u++;
            continue;
        }
        size_t k = gp_utf8_seq_len(u, end);
        if (k == 0)
            return false;
        u += k;
    }
    return true;
}

/* The inside of a JSON string as json_dumps writes it (no
 * JSON_ENSURE_ASCII): runs of plain bytes copied at once. check_utf8:
 * refuse invalid UTF-8 (-1), as json_dumps does. */
static int escape_append(gp_buf *out, const char *text, size_t n, bool check_utf8)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson writes them */
    /* 1: escaped; 2: the lead of a UTF-8 sequence (checked when asked) */
    static const unsigned char kind[256] = {
        [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 2,
    };
    const unsigned char *u = (const unsigned char *)text;
    size_t run = 0; /* bytes copied as they are, pending */
    for (size_t i = 0; i < n; i++) {
        while (i < n && kind[u[i]] == 0)
            i++;
        if (i == n)
            break;
        unsigned char c = u[i];
        if (kind[c] == 2) {
            if (check_utf8) {
                size_t k = gp_utf8_seq_len(u + i, u + n);
                if (k == 0)
                    return -1;
                i += k - 1;
            }
            continue;
        }
        if (i > run && gp_buf_append(out, text + run, i - run) < 0)
            return -1;
        run = i + 1;
        char e[6] = {'\\', 0};
        size_t el = 2;
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            memcpy(e, "\\u00", 4);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            el = 6;
        }
        if (gp_buf_append(out, e, el) < 0)
            return -1;
    }
    return n > run ? gp_buf_append(out, text + run, n - run) : 0;
}

int gp_json_escape_append(gp_buf *out, const char *text, size_t n)
{
    return escape_append(out, text, n, false);
}

int gp_json_str_append(gp_buf *out, const char *s)
{
    if (gp_buf_append(out, "\"", 1) < 0 || gp_json_escape_append(out, s, strlen(s)) < 0)
        return -1;
    return gp_buf_append(out, "\"", 1);
}

static int dump_string(gp_buf *out, const char *s, size_t n)
{
    if (gp_buf_append(out, "\"", 1) < 0 || escape_append(out, s, n, true) < 0)
        return -1;
    return gp_buf_append(out, "\"", 1);
}

int gp_json_array_sort(json_t *arr, int (*cmp)(const void *, const void *))
{
    size_t n = json_array_size(arr);
    if (n < 2)
        return 0;
    json_t **v = malloc(n * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof *v, cmp);
    json_array_clear(arr);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
    return 0;
}

int gp_json_update_missing(json_t *dst, const json_t *src)
{
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach((json_t *)src, key, klen, val) {
        if (!json_object_getn(dst, key, klen) && json_object_setn(dst, key, klen, val) < 0)
            return -1;
    }
    return 0;
}

int gp_json_dump_append(gp_buf *out, const json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        size_t klen;
        json_t *val;
        bool first = true;
        if (gp_buf_append(out, "{", 1) < 0)
            return -1;
        json_object_keylen_foreach((json_t *)v, key, klen, val) {
            if ((!first && gp_buf_append(out, ",", 1) < 0) || dump_string(out, key, klen) < 0 ||
                gp_buf_append(out, ":", 1) < 0 || gp_json_dump_append(out, val) < 0)
                return -1;
            first = false;
        }
        return gp_buf_append(out, "}", 1);
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (gp_buf_append(out, "[", 1) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if ((i && gp_buf_append(out, ",", 1) < 0) ||
                gp_json_dump_append(out, json_array_get(v, i)) < 0)
                return -1;
        return gp_buf_append(out, "]", 1);
    }
    case JSON_STRING:
        return dump_string(out, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: { /* "%lld" without printf (a tenth of its instructions) */
        json_int_t x = json_integer_value(v);
        unsigned long long u = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
        char *e = num + sizeof num, *p = e;
        do {
            *--p = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (x < 0)
            *--p = '-';
        return gp_buf_append(out, p, (size_t)(e - p));
    }
    case JSON_REAL: { /* jansson's own formatting (precision, exponent, ".0") */
        char b[48];
        size_t n = real_fmt(b, json_real_value(v));
        if (n)
            return gp_buf_append(out, b, n);
        n = json_dumpb(v, num, sizeof num, JSON_ENCODE_ANY);
        return n == 0 || n > sizeof num ? -1 : gp_buf_append(out, num, n);
    }
    case JSON_TRUE:
        return gp_buf_append(out, "true", 4);
    case JSON_FALSE:
        return gp_buf_append(out, "false", 5);
    case JSON_NULL:
        return gp_buf_append(out, "null", 4);
    }
    return -1;
}

char *gp_json_dumps(const json_t *v)
{
    if (!json_is_object(v) && !json_is_array(v))
        return NULL; /* json_dumps without JSON_ENCODE_ANY */
    gp_buf b;
    gp_buf_init(&b);
    if (gp_json_dump_append(&b, v) < 0 || gp_buf_append(&b, "", 0) < 0) {
        gp_buf_free(&b);
        return NULL;
    }
    return gp_buf_steal(&b);
}

/* ------------------------------------------------------------- base64 */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *gp_base64_encode(const void *data, size_t n)
{
    const unsigned char *p = data;
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        *o++ = B64[v >> 18 & 63];
        *o++ = B64[v >> 12 & 63];
        *o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_val(char c)
{
    const char *q = c ? strchr(B64, c) : NULL;
    return q ? (int)(q - B64) : -1;
}

unsigned char *gp_base64_decode(const char *text, size_t len, size_t *n)
{
    if (len % 4 != 0)
        return NULL;
    unsigned char *out = malloc(len / 4 * 3 + 1);
    size_t k = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int q = 0; q < 4; q++) {
            bool last = i + 4 == len;
            if (last && q >= 2 && text[i + q] == '=' && (q == 3 || text[i + 3] == '=')) {
                v[q] = 0;
                pad++;
            } else if ((v[q] = b64_val(text[i + q])) < 0) {
                free(out);
                return NULL;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[k++] = (unsigned char)(x >> 16);
        if (pad < 2)
            out[k++] = (unsigned char)(x >> 8);
        if (pad < 1)
            out[k++] = (unsigned char)x;
    }
    *n = k;
    return out;
}

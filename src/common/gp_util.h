/*
 * gp_util: time, random ids, hashing and file helpers shared by the server,
 * the agent and the tools.
 *
 * Randomness comes from OpenSSL's CSPRNG (RAND_bytes): ids and keys must not
 * be guessable. Time is monotonic for durations and timers, wall-clock only
 * for what is shown to people (`created`, log timestamps).
 */
#ifndef GP_UTIL_H
#define GP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>

/* Monotonic clock (CLOCK_MONOTONIC), for durations and deadlines. */
uint64_t gp_now_mono_ms(void);
uint64_t gp_now_mono_us(void);
/* Wall clock, milliseconds since the epoch. */
int64_t gp_now_wall_ms(void);

/* Fill buf with n cryptographically random bytes. Aborts if the CSPRNG
 * fails: continuing with predictable ids or keys would be worse. */
void gp_random_bytes(void *buf, size_t n);
/* Write 2*nbytes lowercase hex chars of randomness plus NUL into out
 * (out must hold 2*nbytes+1). */
void gp_random_hex(char *out, size_t nbytes);
/* Random RFC 4122 version-4 UUID, "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx". */
void gp_uuid4(char out[37]);
/* True when s is a UUID in the canonical 36-char form (any version). */
bool gp_uuid_valid(const char *s);
/* prefix + 24 random hex chars, e.g. "chatcmpl-3f2a…". out must hold
 * strlen(prefix)+25. */
void gp_id_new(const char *prefix, char *out, size_t outlen);

/* True when s is 64 lower-case hex digits (a SHA-256 as gp_sha256_hex
 * writes it). */
bool gp_hex64_ok(const char *s);
/* Lowercase hex SHA-256 of data. */
void gp_sha256_hex(const void *data, size_t len, char out[65]);
/* Lowercase hex HMAC-SHA-256 of data under key. */
void gp_hmac_sha256_hex(const void *key, size_t keylen, const void *data, size_t len,
                        char out[65]);
/* Constant-time comparison of two equal-length buffers: 1 equal, 0 not. */
int gp_ct_equal(const void *a, const void *b, size_t n);

/* Read a whole file (at most max bytes; more is an error). Returns a
 * NUL-terminated malloc'd buffer (new, caller frees) and its length, or
 * NULL with errno set (EFBIG when larger than max). */
char *gp_read_file(const char *path, size_t *len, size_t max);
/* Write data to path atomically (temp file + fsync + rename) with mode.
 * Returns 0 or -1 with errno set. */
int gp_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode);
/* mkdir -p with mode for each created component. 0 or -1 with errno. */
int gp_mkdirs(const char *path, mode_t mode);

/* Split "host:port" ("[v6]:port" too). *host is malloc'd (caller frees).
 * Returns 0, or -1 when malformed or port outside 1..65535 (0 allowed
 * when allow_zero, for "pick an ephemeral port"). */
int gp_parse_hostport(const char *s, char **host, int *port, bool allow_zero);
/* True when host names the loopback interface (127.0.0.0/8, ::1, localhost). */
bool gp_host_is_loopback(const char *host);

/* Growable byte buffer. One owner; gp_buf_free releases the storage. */
typedef struct gp_buf {
    char *data;      /* NUL-terminated whenever len < cap */
    size_t len;
    size_t cap;
} gp_buf;
void gp_buf_init(gp_buf *b);
void gp_buf_free(gp_buf *b);
/* Append n bytes. 0 or -1 (ENOMEM). Inline: renderers call it several
 * times a relayed token (a frame's head, its text's runs, its tail), and
 * the call, the room check and a 1-byte memcpy cost more than the copy
 * (issue 24). gp_buf_grow_ is its out-of-line slow path, not for callers. */
int gp_buf_grow_(gp_buf *b, size_t extra);
static inline int gp_buf_append(gp_buf *b, const void *data, size_t n)
{
    /* The room left, not len + n + 1: that sum could wrap. */
    if (n >= b->cap - b->len && gp_buf_grow_(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}
int gp_buf_appendf(gp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gp_buf_consume(gp_buf *b, size_t n);  /* drop the first n bytes */
/* Cut b back to its first len bytes (len <= b->len), NUL-ended as ever:
 * what a renderer does to take back a frame it could not write whole.
 * Inline: it is two stores, and some callers run once a relayed token. */
static inline void gp_buf_truncate(gp_buf *b, size_t len)
{
    b->len = len;
    if (b->data) /* (no storage yet: len is 0 and there is nothing to end) */
        b->data[len] = '\0';
}
/* Append v in decimal, the bytes "%lld" writes, without printf's cost
 * (~10 instructions a digit where snprintf took ~300 a call). 0 or -1. */
int gp_buf_append_int(gp_buf *b, long long v);
/* Take ownership of the storage (new, caller frees); b is left empty. */
char *gp_buf_steal(gp_buf *b);
/* Take the bytes (returned, NUL-terminated, caller frees) and leave b
 * empty with a new block of the same capacity: for a buffer refilled every
 * turn whose output is handed on by reference (sse.c), where a regrow from
 * nothing would cost a realloc chain. NULL, b left as it was, when b has no
 * storage or memory is short. */
char *gp_buf_take(gp_buf *b);

/* Bytes of s[0..n) inside a JSON string as json_dumps writes it: '"',
 * '\\' and \b \f \n \r \t take 2, other control characters 6 (\u00XX),
 * everything else (UTF-8 included) 1. */
size_t gp_json_escaped_len(const char *s, size_t n);
/* The length of json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY), computed
 * without writing it (reals excepted, which are formatted): what the
 * server counts an agent's events by, once per event. */
struct json_t;
size_t gp_json_compact_size(const struct json_t *v);
/* The bytes of a real of value d in such a dump (a reader that never
 * builds the real counts it so). */
size_t gp_json_real_size(double d);
/* Append text as the inside of a JSON string, as json_dumps writes it: '"'
 * and '\\' escaped, control characters as \n, \t, ... or \u00XX, other bytes
 * (UTF-8) as they are. 0 or -1 (ENOMEM). */
int gp_json_escape_append(gp_buf *out, const char *text, size_t n);
/* Append the NUL-terminated s as a JSON string, quotes included, as
 * json_dumps writes json_string(s) (s is not checked for UTF-8: callers
 * that must refuse what jansson refuses check first). 0 or -1 (ENOMEM). */
int gp_json_str_append(gp_buf *out, const char *s);
/* Append json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY), byte for byte, at a
 * fraction of its cost (issue 24: jansson's dump took ~100 instructions a
 * byte, a third of a relayed request's JSON work): runs of plain bytes are
 * copied at once, reals are left to jansson's formatting. v is borrowed.
 * 0, or -1 (ENOMEM, or a string that is not UTF-8, which json_dumps refuses
 * too; out then holds a partial dump). */
int gp_json_dump_append(gp_buf *out, const struct json_t *v);
/* Sort the elements of a JSON array in place with cmp, which compares two
 * `json_t *const *` as qsort does. 0, or -1 (ENOMEM: the array is left as
 * it was). */
int gp_json_array_sort(struct json_t *arr, int (*cmp)(const void *, const void *));
/* json_object_update_missing that says when it failed: every key of src
 * that dst lacks is set in dst to src's value (a new reference). 0, or -1
 * (ENOMEM: dst may hold some of them). jansson 2.14's own ignores a set
 * that fails and returns 0, so a key could go missing unseen. */
int gp_json_update_missing(struct json_t *dst, const struct json_t *src);
/* json_dumps(v, JSON_COMPACT), the same way: a new string (caller frees),
 * NULL where json_dumps gives NULL (v not an object or array, ENOMEM,
 * invalid UTF-8). */
char *gp_json_dumps(const struct json_t *v);
/* The length of the UTF-8 sequence of 2-4 bytes at p (RFC 3629, as jansson
 * checks it), or 0 when p[0..end) does not start with one. */
size_t gp_utf8_seq_len(const unsigned char *p, const unsigned char *end);
/* s[0..n) is UTF-8 as jansson accepts it (NUL bytes included). */
bool gp_utf8_valid(const char *s, size_t n);
/* What snprintf(dst, cap, "%.*s", (int)n, src) writes, without printf
 * (a few hundred instructions a call, a dozen calls a request: issue 24):
 * src up to n bytes or its first NUL, cut to cap - 1 bytes, then a NUL
 * (cap > 0; src NULL copies nothing). Returns the bytes written. */
size_t gp_copy_cut(char *dst, size_t cap, const char *src, size_t n);
/* The same for a whole string: snprintf(dst, cap, "%s", src). */
size_t gp_copy_str(char *dst, size_t cap, const char *src);

/* Base64 (RFC 4648, with padding): embeddings travel as little-endian
 * float32 bytes in base64 (docs/protocol.md). encode: a malloc'd NUL-ended
 * string (caller frees) or NULL on ENOMEM. decode: a malloc'd buffer and
 * its length in *n, or NULL when the text is not base64 (or ENOMEM). */
char *gp_base64_encode(const void *data, size_t n);
unsigned char *gp_base64_decode(const char *text, size_t len, size_t *n);

#endif

/*
 * libFuzzer target: the server's request-head parser (src/server/http/http.h,
 * gps_http_head_parse), which every client's bytes reach before anything
 * else does.
 *
 * Input: a request head without its final empty line, as the server hands
 * it over (request line, then header lines, each ending in CRLF).
 * Checked:
 *   - the result is 0 or a status the parser documents (400, 414, 431, 501),
 *     and a refusal says why;
 *   - with a canon buffer of 2 * len + 64 bytes (what http.h promises is
 *     enough) the head is never refused as too large;
 *   - an accepted head's canonical copy is NUL-ended, of canon_len bytes,
 *     and ends with the empty line;
 *   - the canonical copy is a fixed point: parsed again, it is accepted
 *     and reads the same (what evhttp is handed means what was checked);
 *   - a smaller buffer changes nothing but, possibly, a 431.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same_head(const gps_head *a, const gps_head *b)
{
    gps_head x = *a, y = *b;
    x.canon = y.canon = NULL;
    if (memcmp(&x, &y, sizeof x) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *head = (const char *)data;
    size_t cap = 2 * size + 64;
    char *canon = malloc(cap), *again = malloc(cap), *small = malloc(cap);
    char msg[256];
    if (!canon || !again || !small)
        abort();
    gps_head h, h2, h3;
    msg[0] = '\0';
    int st = gps_http_head_parse(head, size, &h, canon, cap, msg, sizeof msg);
    if (st != 0 && st != 400 && st != 414 && st != 501)
        abort(); /* 431 included: the buffer is the documented bound */
    if (st != 0 && (!memchr(msg, '\0', sizeof msg) || msg[0] == '\0'))
        abort();
    if (st == 0) {
        if (h.canon != canon || h.canon_len >= cap || strlen(canon) != h.canon_len ||
            h.canon_len < 4 || memcmp(canon + h.canon_len - 4, "\r\n\r\n", 4) != 0)
            abort();
        /* The canon without its final CRLF is a head in the input's form. */
        size_t n = h.canon_len - 2;
        memcpy(small, canon, n);
        if (gps_http_head_parse(small, n, &h2, again, 2 * n + 64, msg, sizeof msg) != 0)
            abort();
        if (h2.canon_len != h.canon_len || memcmp(again, canon, h.canon_len) != 0)
            abort();
        same_head(&h, &h2);
    }
    /* A buffer sized by the input's first byte: the same verdict unless
     * the canon does not fit. */
    size_t scap = size ? data[0] % cap : 0;
    int st3 = gps_http_head_parse(head, size, &h3, small, scap, msg, sizeof msg);
    if (st3 != st && st3 != 431)
        abort();
    if (st3 == 0)
        same_head(&h, &h3);
    free(canon);
    free(again);
    free(small);
    return 0;
}

/*
 * libFuzzer target: the agent's chunk reader with its memo
 * (src/agent/oai_chunk.h, oai_chunk_read) against the plain scan
 * (oai_chunk_scan), over a stream of chunks: the memo's fast path only
 * runs when a chunk repeats the one before it around its text, so the
 * input is several chunks, one per line.
 *
 * Input: byte 0 bit 0 = chat chunks (else completions), bit 1 = flip the
 * kind at every chunk; the rest is chunks separated by '\n'.
 * Checked: for every chunk, both readers accept or both refuse, and an
 * accepted chunk reads the same (text, finish reason, usage).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/oai_chunk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    if ((a == NULL) != (b == NULL) || na != nb || (na && memcmp(a, b, na) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool chat = data[0] & 1;
    const bool flip = data[0] & 2;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    gp_buf s1 = {0}, s2 = {0};
    oai_chunk_memo m;
    oai_chunk_memo_init(&m);
    while (p <= end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        oai_chunk a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        bool ok_a = oai_chunk_scan(p, n, chat, &s1, &a);
        bool ok_b = oai_chunk_read(&m, p, n, chat, &s2, &b);
        if (ok_a != ok_b)
            abort();
        if (ok_a) {
            same_bytes(a.text, a.len, b.text, b.len);
            same_bytes(a.finish, a.finish_len, b.finish, b.finish_len);
            if (a.prompt_tokens != b.prompt_tokens || a.completion_tokens != b.completion_tokens)
                abort();
        }
        if (flip)
            chat = !chat;
        if (!nl)
            break;
        p = nl + 1;
    }
    oai_chunk_memo_free(&m);
    gp_buf_free(&s1);
    gp_buf_free(&s2);
    return 0;
}

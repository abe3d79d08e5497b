/*
 * oai_chunk: the common OpenAI stream chunk read without a JSON tree
 * (issue 24). A zero-delay 64-token reply cost the agent 64 json_loadb
 * calls of ~34,000 instructions each (jansson allocates every value and
 * hashes every key), about half the agent's CPU per request; the text of a
 * plain token chunk is all the backend takes from it.
 *
 * oai_chunk_scan accepts one chunk only when it is, beyond doubt, valid
 * JSON (as json_loadb would read it) of this shape, and says what text it
 * carries:
 *
 *   {"id":S|null, "object":S|null, "created":I, "model":S|null,
 *    "system_fingerprint":S|null,
 *    "usage":null | {"prompt_tokens":I, "completion_tokens":I, "total_tokens":I},
 *    "choices":[] | [{"index":I, "logprobs":null, "finish_reason":S|null,
 *                     completions: "text":S|null,
 *                     chat:        "delta":{"role":S|null, "content":S|null}}]}
 *
 * every key optional, in any order, at most once (S: a string, I: an
 * integer of at most 18 digits). Anything else (another key, a second
 * choice, other usage fields, tool calls, an error, a \u escape, a
 * fraction, invalid UTF-8, trailing bytes) is left to the caller's jansson
 * path, which then reads it exactly as before; so the scanner changes no
 * result, only what a token chunk costs. tests/unit/agent/test_oai_chunk.c
 * checks both paths against each other.
 */
#ifndef AGENT_OAI_CHUNK_H
#define AGENT_OAI_CHUNK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/gp_util.h"

/* What a chunk of the shape above says: all the backend reads from it. */
typedef struct oai_chunk {
    const char *text;       /* the choice's text or delta content; NULL: none or null */
    size_t len;
    const char *finish;     /* the choice's finish_reason; NULL: none or null */
    size_t finish_len;
    long long prompt_tokens, completion_tokens; /* usage's; -1 where absent */
} oai_chunk;

/* p[0..n) is one SSE event's data. Returns true for a chunk of the shape
 * above, with *out filled: its strings point into p, or into scratch
 * (caller-owned, reused) for a text that had escapes; valid until the next
 * call. Returns false for anything else (nothing is emitted; the caller
 * parses the chunk itself). */
bool oai_chunk_scan(const char *p, size_t n, bool chat, gp_buf *scratch, oai_chunk *out);

/* The last chunk oai_chunk_read scanned in full, kept so that the next one
 * that differs from it only in its text is not scanned again (issue 24: an
 * upstream's token chunks repeat id, object, created and model; the scan
 * was ~2,300 instructions a chunk, a memcmp of the rest is ~100). A chunk
 * read this way reads exactly as oai_chunk_scan would read it: the bytes
 * around the text are the same, and the text is read in full. */
typedef struct oai_chunk_memo {
    gp_buf bytes;                /* that chunk (owned) */
    size_t text_at, text_end;    /* its text string's content is bytes[text_at, text_end) */
    bool chat, valid, has_finish;
    long long usage_prompt, usage_completion;
    size_t finish_len, finish_off; /* finish_reason: finish_off bytes from the start when */
    bool finish_before;            /* before the text, else from the end */
} oai_chunk_memo;

void oai_chunk_memo_init(oai_chunk_memo *m);
void oai_chunk_memo_free(oai_chunk_memo *m);

/* oai_chunk_scan through the memo m (caller-owned, one per stream): same
 * result for the same bytes, whatever m held before. */
bool oai_chunk_read(oai_chunk_memo *m, const char *p, size_t n, bool chat, gp_buf *scratch,
                    oai_chunk *out);

#endif

/*
 * openai_stream: reading one reply of an OpenAI-compatible upstream (the
 * openai backend's parser). Bytes in, job events out, no I/O: the
 * transport (backend_openai.c) hands over the header lines and the body
 * bytes as the network delivers them, in pieces of any size, and says how
 * the transfer ended; this module turns them into the job's sink calls
 * (backend.h): started, token, tool_call, metrics, stop_sequence,
 * upstream_meta, then exactly one of end or error.
 *
 * The reply's shape is chosen by its status and Content-Type:
 *   2xx text/event-stream   OpenAI SSE chunks up to `data: [DONE]`
 *   2xx application/json    one whole reply (a server that ignored stream)
 *   non-2xx                 an error body, kept (64 KiB) for the message
 * Failures get a stable code (backend.h): UPSTREAM_MALFORMED for a reply
 * that is not what it should be (no or an unexpected Content-Type, a chunk
 * that is not JSON or not the expected shape, an SSE line over max_line),
 * UPSTREAM_ERROR for an error status or an error object in the stream, a
 * stream that ends before [DONE], and for the transport's own failures;
 * AGENT_OUT_OF_MEMORY for a chunk or reply that could not be read for want
 * of memory (gp_json_load_checked: not the upstream's fault).
 *
 * Stop strings (the job's params.stop) are matched here, not by the
 * upstream (issue 26 item 4): text that may start one is held back; on a
 * match the text before it is sent, the reply counts as complete (body 1,
 * as at [DONE]) and ends "stop" with a stop_sequence event.
 *
 * Structured output (check set): the text and tool calls relayed are handed
 * to openai_schema.h, and a reply that ran its course ("stop" or
 * "tool_calls", no stop string) but fails its verdict ends with an error
 * UPSTREAM_INVALID_OUTPUT instead of end (the text already relayed stays).
 *
 * count_tokens replies (count set): only status and raw are taken (the
 * transport parses them with openai_count.h) and no event is sent.
 *
 * Fuzzed by tests/fuzz/fuzz_agent_stream.c.
 */
#ifndef AGENT_OPENAI_STREAM_H
#define AGENT_OPENAI_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "agent/agent_util.h"
#include "agent/backend.h"
#include "agent/oai_chunk.h"
#include "agent/openai_schema.h"
#include "common/gp_util.h"

typedef enum {
    OAI_BODY_UNKNOWN, /* no status yet, or 2xx without a Content-Type yet */
    OAI_BODY_SSE,
    OAI_BODY_JSON,
    OAI_BODY_ERROR,   /* non-2xx: the body is an error message */
} oai_body_mode;

/* One reply being read. Set up with oai_stream_init; the fields below the
 * line are read-only outside openai_stream.c. */
typedef struct oai_stream {
    agent_job_sink sink;    /* copied */
    const char *job_id;     /* borrowed: names tool calls the upstream left unnamed */
    const json_t *stops;    /* borrowed: the job's params.stop, or NULL */
    bool chat;              /* chat reply (delta/message) or completion (text) */
    bool count;             /* count_tokens reply: status and raw only */
    oai_schema *check;      /* borrowed, set after init: what the reply is held to
                               (openai_schema.h), or NULL */
    /* ---------------------------------------------------------------- */
    oai_body_mode mode;
    long status;            /* HTTP status, 0 before the status line */
    agent_sse sse;
    gp_buf raw;             /* error body or non-streamed JSON body */
    gp_buf text;            /* a chunk's text with its escapes decoded (oai_chunk.h) */
    oai_chunk_memo memo;    /* the last chunk scanned in full (oai_chunk.h) */
    bool done_seen;         /* data: [DONE] */
    bool failed;            /* err_code/err_msg set */
    char err_code[32];
    char err_msg[300];
    char finish[32];        /* the upstream's finish_reason */
    char *stop_seq;         /* the stop string the reply ended on (owned), or NULL */
    gp_buf pending;         /* text held back: it may start a stop string */
    long long prompt_tokens, completion_tokens; /* usage, -1 unknown */
    long long ntokens;      /* text pieces the upstream sent (about one token each) */
    int ntool_calls;        /* tool call indices announced (id+name sent) */
    bool started_sent;
    uint64_t t_start_us, t_first_us; /* monotonic: init, first token */
    /* Stall detection without a clock read per chunk (issue 24: a
     * clock_gettime on every body chunk was ~4 % of the agent's CPU at 64
     * zero-delay streams): bytes only set the flag, and the caller's
     * periodic sweep turns it into a time (oai_stream_idle_ms). */
    bool got_bytes;         /* a header or body byte since the sweep last looked */
    uint64_t last_byte_ms;  /* monotonic: when a sweep last saw bytes (or init) */
} oai_stream;

/* sink is copied; job_id and stops are borrowed and outlive the stream.
 * max_line bounds one SSE line (and event). */
void oai_stream_init(oai_stream *s, const agent_job_sink *sink, const char *job_id, bool chat,
                     bool count, const json_t *stops, size_t max_line);
void oai_stream_free(oai_stream *s);
/* For a periodic sweep at now_ms (monotonic): how long the stream has
 * read nothing, 0 when it read something since the previous call. Precise
 * to the sweep's period: a stall is seen between one and two periods
 * after the fact. */
uint64_t oai_stream_idle_ms(oai_stream *s, uint64_t now_ms);
/* Forget what was read (status, body, failure) before another request
 * of the job (the count methods, then the generation after a count that
 * came first): count says which kind it is. The sink, job and timings
 * stay. */
void oai_stream_reset(oai_stream *s, bool count);

/* One header line as received, CRLF included (the status line first, the
 * blank line last). 0 to go on, -1 to stop the transfer (failed). The
 * blank line of a usable 2xx reply sends started. */
int oai_stream_header(oai_stream *s, const char *line, size_t n);
/* Body bytes. 0 to go on; 1 once [DONE] has been read (later bytes are
 * ignored: the transport may end the transfer); -1 to stop the transfer
 * (failed). */
int oai_stream_body(oai_stream *s, const char *p, size_t n);

/* Fail the reply with a code and a message (the first cause is kept). */
void oai_stream_fail(oai_stream *s, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Send started, once. */
void oai_stream_started(oai_stream *s);

/* The transfer is over: send the terminal events (metrics, stop_sequence,
 * then end; or error). xfer_code/xfer_msg: how the transport ended, NULL
 * when it ran to its end; ignored once [DONE] was read or the reply
 * failed already. Not for count replies. */
void oai_stream_finish(oai_stream *s, const char *xfer_code, const char *xfer_msg);

/* A reply that a stop string ended before the upstream's usage came
 * (stop_seq set, prompt_tokens unknown), once the transport has counted
 * the prompt: its terminal events (metrics, stop_sequence, end), with
 * prompt_tokens as the usage's. */
void oai_stream_finish_counted(oai_stream *s, long long prompt_tokens);

#endif

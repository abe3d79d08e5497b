/*
 * agent_util: the agent's pure logic, kept apart from I/O so that unit tests
 * can drive it directly: SSE line parsing (upstream streams), the per-job
 * event queue with its seq bookkeeping (DESIGN §4 batching), the reconnect
 * backoff schedule, --labels parsing and the persistent agent_id.
 *
 * None of these types lock: callers that share one between threads (the job
 * event queue) hold their own mutex around every call.
 */
#ifndef AGENT_UTIL_H
#define AGENT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/gp_util.h"

/* ---------------------------------------------------------------------------
 * SSE parser (text/event-stream as OpenAI-compatible servers send it)
 *
 * Lines end with LF, CRLF or CR, possibly split across feeds at any byte.
 * "data:" lines (one leading space stripped) accumulate; a blank line
 * dispatches the event (several data lines are joined with '\n'). Comment
 * lines (":" first) and other fields (event, id, retry) are ignored. A line
 * longer than max_line is an error (a broken or hostile upstream must not
 * grow memory without bound).
 * ------------------------------------------------------------------------ */
typedef int (*agent_sse_cb)(void *ud, const char *data, size_t len);

typedef struct agent_sse {
    gp_buf line;      /* current partial line */
    gp_buf data;      /* data of the event being assembled */
    bool have_data;   /* a data: line was seen since the last dispatch */
    const char *direct; /* or: the event's one data line so far, still in the bytes
                           being fed (not copied; agent_util.c sse_line) */
    size_t direct_len;
    bool pending_cr;  /* last byte was CR: a following LF belongs to it */
    size_t max_line;
} agent_sse;

void agent_sse_init(agent_sse *s, size_t max_line);
void agent_sse_free(agent_sse *s);
/* Feed bytes. Calls cb for each completed event's data. Returns 0, -1 when
 * a line exceeds max_line (or on ENOMEM), or the first non-zero value cb
 * returned (parsing stops there). */
int agent_sse_feed(agent_sse *s, const char *p, size_t n, agent_sse_cb cb, void *ud);
/* End of stream: dispatch an unterminated last line/event, if any. Same
 * return values as agent_sse_feed. */
int agent_sse_finish(agent_sse *s, agent_sse_cb cb, void *ud);

/* ---------------------------------------------------------------------------
 * Job event queue: every event of one job, in order, plus how far the server
 * has acknowledged. One upload in flight at a time; the upload carries
 * everything accumulated since the last acknowledged event (seq = index of
 * the batch's first event), so latency is one round trip and the number of
 * requests stays bounded whatever the token rate.
 *
 * A push that fails (out of memory: the event could not be built, NULL, or
 * rendered, or the queue could not grow) breaks the queue rather than drop
 * the event, which would leave a gap in the client's text, lose a tool call
 * or the job's end: the queue keeps the events before it (whole and in
 * order), takes none after it, and ends with AGENT_EVQ_OOM_EVENT, an error
 * event that is not stored but written from static text when an upload
 * takes it: ending the job needs no memory of the queue's (an upload body
 * that cannot be built is retried, as for any events). The server fails
 * the job over (docs/protocol.md); the agent stops the job's backend
 * (AGENT_EVQ_BROKEN).
 * ------------------------------------------------------------------------ */
#define AGENT_EVQ_OOM_EVENT                                                                   \
    "{\"type\":\"error\",\"code\":\"AGENT_OUT_OF_MEMORY\",\"message\":\"the agent ran out of " \
    "memory while queueing the job's output\"}"

typedef struct agent_evq {
    gp_buf text;      /* every event pushed, as its compact JSON text (what
                         json_dumps wrote) followed by a ',' (owned) */
    size_t *ends;     /* ends[i]: the end of event i's text and comma in text */
    size_t n, cap;    /* events stored; room in ends */
    size_t acked;     /* events the server acknowledged */
    size_t inflight;  /* events in the upload in flight; 0 = none in flight */
    size_t first_output; /* events up to the job's first token or tool call (0: none
                            yet; agent_evq_mark_output): until the server has them
                            the queue is urgent (AGENT_EVQ_URGENT) */
    bool terminal;    /* an end/error event was pushed, or the queue broke: nothing
                         may follow */
    bool broken;      /* a push failed: event n (after the stored ones) is
                         AGENT_EVQ_OOM_EVENT */
} agent_evq;

void agent_evq_init(agent_evq *q);
void agent_evq_free(agent_evq *q);
/* Append ev (reference stolen), rendered now as its compact JSON text: the
 * queue keeps text, not objects (issue 24: a jansson string per token and
 * its free were an eighth of the agent's instructions per request). end
 * and error make the queue terminal. 0, or -1 when ev is not queued:
 * after a terminal event (dropped: nothing may follow it), or for want of
 * memory, which breaks the queue (see above). A NULL ev is an event the
 * caller could not build (json_pack's NULL): it breaks the queue too, so
 * callers pass what they built without checking it. */
int agent_evq_push(agent_evq *q, json_t *ev);
/* Append the event json_deep_copy(fields) with "type": type set on it
 * would be (fields borrowed; NULL or not an object: no fields), rendered
 * from fields as they are: the metrics event, once a request (issue 24).
 * Same return values, and breaking, as agent_evq_push. */
int agent_evq_push_typed(agent_evq *q, const json_t *fields, const char *type);
/* Append a token event, rendered by agent_evq_token_json. 0 or -1 (after a
 * terminal event; ENOMEM, which breaks the queue). */
int agent_evq_push_token(agent_evq *q, const char *text, size_t len, int32_t token_id);
/* A push failed: the queue ends with AGENT_EVQ_OOM_EVENT (see above). */
bool agent_evq_broken(const agent_evq *q);
/* True when nothing is in flight and something is not yet acknowledged. */
bool agent_evq_ready(const agent_evq *q);
/* Begin an upload of events [acked, acked+max) (max 0 = all); sets
 * *seq = acked. Returns a new JSON string whose value is their texts
 * joined by commas: the inside of the upload's "events" array (what
 * agent_evq_take_append writes). NULL when !agent_evq_ready (or ENOMEM:
 * nothing begun). */
json_t *agent_evq_take(agent_evq *q, size_t max, size_t *seq);
/* The upload in flight succeeded / failed (will be retried from acked). */
void agent_evq_ack(agent_evq *q);
void agent_evq_nack(agent_evq *q);
/* The server expects seq next (409 SEQ_GAP or a partial ack): resend from
 * there. Clamped to the events we have. */
void agent_evq_rewind(agent_evq *q, size_t expected_seq);
/* The events from the first unacknowledged one on were refused by the
 * server (400: not what it accepts): they are dropped (the out-of-memory
 * event of a broken queue with them) and ev (reference stolen; an error
 * event) ends the queue in their place; a NULL ev breaks it again. */
void agent_evq_replace_rest(agent_evq *q, json_t *ev);
/* Every event, including a terminal one, acknowledged. */
bool agent_evq_done(const agent_evq *q);
/* Append a token event's compact JSON text to out, byte for byte what
 * json_dumps writes for {"type":"token","text":text,"token_id":id} (no
 * token_id when id < 0); text that is not UTF-8 becomes U+FFFD, as it
 * would have been. 0 or -1 (ENOMEM). */
int agent_evq_token_json(gp_buf *out, const char *text, size_t len, int32_t token_id);
/* Events in the queue: those stored, and the out-of-memory event of a
 * broken queue. */
size_t agent_evq_len(const agent_evq *q);
/* The event just pushed is the job's first output (a token or a tool
 * call) unless one came before. */
void agent_evq_mark_output(agent_evq *q);
/* Append the events of agent_evq_take(q, max, seq) to out, joined by
 * commas, and begin their upload as it does: the upload body is written
 * once, straight from the queue (issue 24: a JSON string per job per
 * upload, and two more copies of it, went away); a broken queue's
 * out-of-memory event from its static text. 1 when events were appended,
 * 0 when !agent_evq_ready, -1 on ENOMEM (out as it was, nothing begun). */
int agent_evq_take_append(agent_evq *q, size_t max, size_t *seq, gp_buf *out);

/* What the agent's loop acts on (agent_evq_flags): READY, something to
 * upload (agent_evq_ready); URGENT, READY and either the terminal event or
 * the first output is among it (it waits for no batch: TTFT, and the
 * slot's next job); BROKEN, agent_evq_broken, whether or not READY (the
 * loop stops the job's backend). A producer that sees a flag appear after
 * its push tells the loop; while the flags stay as they were the loop
 * already knows (issue 24: the loop looks at the jobs that changed, not at
 * every job). */
#define AGENT_EVQ_READY 1u
#define AGENT_EVQ_URGENT 2u
#define AGENT_EVQ_BROKEN 4u
unsigned agent_evq_flags(const agent_evq *q);

/* ---------------------------------------------------------------------------
 * Timers: a binary min-heap of agent_timer nodes embedded in the caller's
 * objects (deadlines, retry times), so that the loop finds the next one
 * due without walking every object. Not thread-safe (the loop's own).
 * agent_timers_reserve first, then agent_timers_set cannot fail for up to
 * that many nodes.
 * ------------------------------------------------------------------------ */
typedef struct agent_timer {
    uint64_t at;  /* when it is due (the caller's clock) */
    size_t pos;   /* index in its heap + 1; 0: in no heap */
} agent_timer;

typedef struct agent_timers {
    agent_timer **v;
    size_t n, cap;
} agent_timers;

void agent_timers_init(agent_timers *h);
void agent_timers_free(agent_timers *h);
/* Room for n nodes in all. 0 or -1 (ENOMEM). */
int agent_timers_reserve(agent_timers *h, size_t n);
/* Add t due at `at`, or move it there when it is in h already. 0, or -1
 * (ENOMEM: not added; never after a large enough reserve). */
int agent_timers_set(agent_timers *h, agent_timer *t, uint64_t at);
/* Take t out of h (no-op when it is in no heap). */
void agent_timers_del(agent_timers *h, agent_timer *t);
/* The earliest node, or NULL when h is empty. */
agent_timer *agent_timers_first(const agent_timers *h);

/* ---------------------------------------------------------------------------
 * Id table: a chained hash of nodes embedded in the caller's objects, keyed
 * by a NUL-terminated id the object holds (the agent's jobs by job id), so
 * that finding one is not a walk of every object (issue 24). Not
 * thread-safe. agent_idtab_reserve first, then agent_idtab_add cannot fail
 * for up to that many nodes.
 * ------------------------------------------------------------------------ */
typedef struct agent_idnode {
    struct agent_idnode *next;
    const char *key;   /* borrowed: lives as long as the node is in a table */
    uint32_t hash;
} agent_idnode;

typedef struct agent_idtab {
    agent_idnode **b;  /* cap buckets (a power of two) */
    size_t n, cap;
} agent_idtab;

void agent_idtab_init(agent_idtab *t);
void agent_idtab_free(agent_idtab *t);   /* the table only, not the nodes */
/* Room for n nodes in all. 0 or -1 (ENOMEM). */
int agent_idtab_reserve(agent_idtab *t, size_t n);
/* Add nd under key (which nd's object holds). 0, or -1 (ENOMEM: not added;
 * never after a large enough reserve). */
int agent_idtab_add(agent_idtab *t, agent_idnode *nd, const char *key);
/* The node added under key (the latest one if several), or NULL. */
agent_idnode *agent_idtab_find(const agent_idtab *t, const char *key);
/* Take nd out of t (no-op when it is not in t). */
void agent_idtab_del(agent_idtab *t, agent_idnode *nd);

/* ---------------------------------------------------------------------------
 * Capped exponential backoff with jitter (docs/protocol.md "Backoff"):
 * nominal delay base, 2*base, 4*base ... capped at cap; the delay returned is
 * drawn uniformly from [nominal/2, nominal] ("equal jitter") so that agents
 * that lost the same server do not come back in lock step.
 * ------------------------------------------------------------------------ */
typedef struct agent_backoff {
    uint32_t base_ms;
    uint32_t cap_ms;
    uint32_t attempt;  /* failures since the last success */
} agent_backoff;

void agent_backoff_init(agent_backoff *b, uint32_t base_ms, uint32_t cap_ms);
/* Delay before the next try after one more failure. rnd: any random value
 * (tests pass fixed ones). */
uint32_t agent_backoff_next(agent_backoff *b, uint32_t rnd);
void agent_backoff_reset(agent_backoff *b);

/* ---------------------------------------------------------------------------
 * Labels: "k=v,k2=v2" -> {"k":"v","k2":"v2"}. Keys: [A-Za-z0-9_.-/]+ (1..63
 * chars), values: printable, no ',' (0..255 chars); spaces around items are
 * trimmed; an empty string gives {}. Duplicate keys are an error.
 * Returns a new object, or NULL with a message in err.
 * ------------------------------------------------------------------------ */
json_t *agent_labels_parse(const char *s, char *err, size_t errlen);

/* ---------------------------------------------------------------------------
 * State dir: created 0700 when missing; "agent_id" holds the agent's UUID
 * (0600, written atomically on first start, then kept forever so that a
 * restarted server re-learns the same agent). A present but invalid file is
 * an error (never silently replaced: it would orphan the agent's history).
 * Returns 0 and the id in out, or -1 with a message in err.
 * ------------------------------------------------------------------------ */
int agent_state_load_id(const char *dir, char out[37], char *err, size_t errlen);

/* ---------------------------------------------------------------------------
 * The agent's own key: "agent.key" in the state dir, received once from
 * POST /agents/enroll and kept (0600, written atomically). It takes
 * precedence over --token on later starts.
 * ------------------------------------------------------------------------ */
#define AGENT_KEY_FILE "agent.key"
#define AGENT_KEY_MAX 512

/* True when s can be sent as a Bearer credential: 1..AGENT_KEY_MAX
 * printable ASCII characters, no spaces (so never a header injection). */
bool agent_key_valid(const char *s);
/* Load DIR/agent.key: 1 with the key in *out (new, caller frees), 0 when
 * the file does not exist, -1 with a message in err when it cannot be read
 * or does not hold one valid key (never ignored silently: it would
 * re-enroll, or run without the key the operator meant). */
int agent_state_load_key(const char *dir, char **out, char *err, size_t errlen);
/* Write key to DIR/agent.key (0600, temp file + fsync + rename). 0, or -1
 * with a message in err. */
int agent_state_save_key(const char *dir, const char *key, char *err, size_t errlen);

#endif

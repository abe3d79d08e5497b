/*
 * agent_check: the bounds on what an agent may send (docs/operations.md,
 * "Limits and hostile peers"). Pure functions of their input, no state, so
 * that they can be unit tested and fuzzed (tests/fuzz/fuzz_agent_events.c).
 *
 * An agent holds a key, not the server's trust: every number it reports
 * ends up in sums (usage, per-key limits), in the database and in replies,
 * and every name in operators' terminals. Values outside these bounds are
 * refused whole (the request is a 400 naming the field), never clamped:
 * an agent that reports 9e18 tokens is broken or hostile, and silently
 * keeping a part of its upload would hide that.
 */
#ifndef GPS_AGENT_CHECK_H
#define GPS_AGENT_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#define GPS_AGENT_MAX_TOKENS 1000000000LL      /* a token count (prompt, completion) */
#define GPS_AGENT_MAX_SEQ 1000000000LL         /* events of one job */
#define GPS_AGENT_MAX_EVENTS 4096              /* events per upload (the agent sends <= 1024) */
#define GPS_AGENT_MAX_EVENT_BYTES 65536        /* one event as compact JSON */
#define GPS_AGENT_MAX_TOKEN_ID 2147483647LL    /* token_id: 0..2^31-1 */
#define GPS_AGENT_MIN_LOGPROB (-1000000.0)     /* logprob: -1e6..0 */
#define GPS_AGENT_MAX_METRICS_FIELDS 32        /* members of a metrics event */
#define GPS_AGENT_MAX_NUMBER 1e15              /* any other reported number, in absolute value */
#define GPS_AGENT_MAX_CODE 64                  /* error event code, bytes */
#define GPS_AGENT_MAX_MESSAGE 4096             /* error event message, bytes */
#define GPS_AGENT_MAX_TYPE 64                  /* event type name, bytes */
#define GPS_AGENT_MAX_STOP_SEQUENCE 1024       /* end.stop_sequence: a request's stop string */
#define GPS_AGENT_MAX_UPSTREAM_META 4096       /* end.upstream_meta: compact JSON bytes */
#define GPS_AGENT_MAX_NAME 256                 /* names: agent, model, alias, label, gpu */
#define GPS_AGENT_MAX_FACTS_BYTES (1 << 20)    /* a poll body as compact JSON */
#define GPS_AGENT_MAX_KEPT_FACTS_BYTES 65536   /* what is kept of it per agent (below) */

/* Check a whole /agents/jobs/{id}/events body: agent_id (UUID), seq
 * (0..GPS_AGENT_MAX_SEQ), events (array of at most GPS_AGENT_MAX_EVENTS
 * objects) and every event's fields by type (docs/protocol.md). Unknown
 * event types pass here (their bytes are bounded; the jobs module drops them).
 * 0 when the body may be applied; -1 with field (e.g.
 * "events[3].usage.prompt_tokens") and msg filled when not. */
int gps_agent_events_check(const json_t *body, char *field, size_t fieldlen, char *msg,
                           size_t msglen);

/* Check one event, events[i] of an upload (the part of the above). */
int gps_agent_event_check(const json_t *ev, size_t i, char *field, size_t fieldlen, char *msg,
                          size_t msglen);
/* The same, with the event's compact JSON size (gp_json_compact_size, which
 * the check measures first) in *bytes (0 when ev is not an object): for a
 * caller that keeps it, without walking the event twice. */
int gps_agent_event_check_sized(const json_t *ev, size_t i, size_t *bytes, char *field,
                                size_t fieldlen, char *msg, size_t msglen);

/* True when s (len bytes, UTF-8 as jansson guarantees) is 1..max bytes of
 * printable text: no NUL, no C0/C1 control character or DEL, no bidi
 * override or line/paragraph separator (they rewrite terminal output). */
bool gps_agent_text_ok(const char *s, size_t len, size_t max);

/* A JSON string that passes gps_agent_text_ok. */
bool gps_agent_name_ok(const json_t *v, size_t max);

/* Whether member name of a metrics event may hold v (integer: the JSON
 * number is an integer): the bounds gps_agent_event_check applies to it.
 * -1 bad, 0 ok; *known (optional): name has bounds of its own. */
int gps_agent_metric_check(const char *name, bool integer, double v, bool *known);

/* Check the poll body's "gpus" (absent, null, or an array of at most 64
 * flat objects: printable strings of at most GPS_AGENT_MAX_NAME bytes,
 * booleans, and numbers: vram_total/vram_used/vram_model/vram_free 0..2^50,
 * utilization 0..1, temperature -273..1000, power_w 0..100000,
 * index/cores 0..65536, others within
 * GPS_AGENT_MAX_NUMBER) and "cpu" (absent, null or one such object).
 * 0 or -1 with msg naming the field. */
int gps_agent_hw_check(const json_t *body, char *msg, size_t msglen);

/* What of a poll body is kept as the agent's facts (the registry's copy,
 * the agents table's facts column): the known fields of one table in
 * agent_check.c (name, version, platform, status, slots, queue_depth,
 * kv_cache_utilization, labels, gpus, cpu, backend, backend_faults,
 * engines, error), nothing else. Unknown fields, models (kept parsed),
 * prefix_cache and the liveness fields are dropped (issue 25: a 1 MiB
 * unknown field cost ~40 MB per agent, kept until an admin removed it).
 * New reference, or NULL with msg when what would be kept exceeds
 * GPS_AGENT_MAX_KEPT_FACTS_BYTES of compact JSON (or on ENOMEM). */
json_t *gps_agent_facts_kept(const json_t *body, char *msg, size_t msglen);

#endif

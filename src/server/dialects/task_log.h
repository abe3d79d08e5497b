/* task_log: a native task's event log in memory, kept compact.
 *
 * Events are numbered 1..n (their SSE ids) and are given back exactly as
 * they were recorded, whatever the storage: a client resuming with
 * Last-Event-ID k gets events k+1.. one by one, each under its own id.
 *
 * Adjacent token events are coalesced into one entry (a run): their texts
 * back to back in one buffer, with each token's end offset and its token
 * ids, about 8 bytes plus the text per token, where a jansson object per
 * event cost ~1 KiB (issue 25, finding 5). Other events (queued, started,
 * metrics, failover, end, error: a few per attempt) stay jansson objects.
 *
 * An event may carry hidden members beside seq, type and data (a token's
 * "ids", a started event's "digest"): they go to the store with the event
 * (restart recovery reads them) and never to a client (only data is
 * framed). */
#ifndef GPS_TASK_LOG_H
#define GPS_TASK_LOG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct gps_tlog gps_tlog;

/* NULL on ENOMEM. A new log holds, beside its events, the terminal event
 * that gps_tlog_append_oom records: built now, so that a task whose event
 * cannot be recorded whole can still end. */
gps_tlog *gps_tlog_new(void);
void gps_tlog_free(gps_tlog *l);

/* Events recorded: the id of the last one (0: none). */
size_t gps_tlog_count(const gps_tlog *l);
/* Heap bytes the log holds, roughly (jansson events estimated). */
size_t gps_tlog_bytes(const gps_tlog *l);

/* Bytes of text (token texts, and a "text" member of other events' data)
 * in events [from, to): how far a stream that wrote events [0, from) is
 * behind, in the unit of every stream (stream.h). */
size_t gps_tlog_text_bytes(const gps_tlog *l, size_t from, size_t to);

/* Record event count+1. data and hidden (an object whose members are set
 * on the event beside seq/type/data; may be NULL) are stolen. Returns 0,
 * or -1 on ENOMEM (nothing recorded). */
int gps_tlog_append(gps_tlog *l, const char *type, json_t *data, json_t *hidden);
/* Record event count+1 as the log's reserved terminal event, type
 * "error", data {"code":"INTERNAL","message":"out of memory"}: the task's
 * end when one of its events could not be recorded whole (the log never
 * goes on with an event left out). Allocates nothing: 0, or -1 when the
 * reserved event was recorded already. */
int gps_tlog_append_oom(gps_tlog *l);
/* Record token event count+1, {"text": text[0..len)} (valid UTF-8), with
 * its token ids (n_ids 0: none known). Joins the run before it. */
int gps_tlog_append_token(gps_tlog *l, const char *text, size_t len, const int32_t *ids,
                          size_t n_ids);
/* Record a stored event ({seq, type, data[, hidden]}; borrowed) as event
 * count+1, its seq ignored (restart recovery checks the numbering). */
int gps_tlog_append_stored(gps_tlog *l, const json_t *ev);

/* Event i (0-based: id i+1) as {seq, type, data[, hidden members]}. New
 * reference; NULL when i >= count or on ENOMEM. */
json_t *gps_tlog_get(const gps_tlog *l, size_t i);
/* Its type: borrowed (valid while the log lives), NULL when i >= count. */
const char *gps_tlog_type(const gps_tlog *l, size_t i);

#endif

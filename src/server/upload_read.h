/*
 * upload_read: a strict reader for the hot shape of a batched agent upload
 * (POST /agents/events, docs/protocol.md "Batched uploads"), without a
 * jansson tree per token event.
 *
 *   {"agent_id":"<uuid>","jobs":[{"job_id":"..","seq":N,"events":[E,..]},..]
 *    [,"instance":".."]}
 *
 * A token event {"type":"token","text":"..."[,"token_id":N]} is read into
 * the upload's text buffer (unescaped). A started, progress, metrics or end
 * event of the shape agents write (plain keys, printable-ASCII strings
 * without escapes, numbers, end's usage counts; no upstream_meta) is read
 * into its fields (gps_event_in.plain) without any tree, checked as
 * agent_check.h checks it. Any other event is cut out of the
 * body and read alone into its object: a flat one (strings without \u
 * escapes, numbers, true/false/null, nested objects of the same: every
 * event an agent writes, unless a string needs a \u escape or a token has
 * token_ids) without jansson's parser, any other by jansson. The reader
 * takes only bodies that every rule of agent_check.h accepts and that
 * jansson reads the same way
 * (tests/fuzz/fuzz_upload.c checks it differentially): for anything else
 * (another key, a \u escape, a duplicate key, a value out of bounds, bad
 * UTF-8, ...) it says no and the caller parses the body with jansson as
 * before, which also words the error.
 */
#ifndef GPS_UPLOAD_READ_H
#define GPS_UPLOAD_READ_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/gp_util.h"
#include "server/jobs/jobs.h" /* gps_event_in */

typedef struct gps_upload_job {
    const char *job_id;  /* NUL-terminated, in gps_upload.text */
    size_t job_id_off, job_id_len;
    long long seq;
    size_t first, n;     /* its events: gps_upload.evs[first .. first + n) */
} gps_upload_job;

typedef struct gps_upload {
    char agent_id[37];
    const char *instance;  /* the agent process's "instance" (NUL-terminated), or NULL */
    size_t instance_len;
    gps_upload_job *jobs;
    size_t n_jobs, cap_jobs;
    gps_event_in *evs;   /* a token's text and a plain event's strings point into
                            text, a plain event's raw into the body (borrowed:
                            apply them while it lives); ev is owned here */
    size_t n_evs, cap_evs;
    gp_buf text;         /* token texts and job ids (sized once: never moves) */
} gps_upload;

/* Read body (n bytes, borrowed). true: *u holds the upload (free it with
 * gps_upload_free); false: not the hot shape or not valid, *u is empty
 * and the caller falls back to jansson. max_jobs bounds the entries. */
bool gps_upload_read(const char *body, size_t n, size_t max_jobs, gps_upload *u);
void gps_upload_free(gps_upload *u);

/* The long-poll's body (POST /agents/work: agent_id, free_slots and the
 * liveness fields; docs/protocol.md) without jansson's parser, whose cost
 * grew with running_jobs (every job the agent holds, on every poll): a flat
 * object whose values are printable-ASCII strings without escapes,
 * non-negative integers or arrays of such strings. Returns what
 * json_loadb(body, JSON_REJECT_DUPLICATES) returns for such a body (a new
 * object), or NULL for any other (a nested object such as prefix_cache, an
 * escape, a real, a duplicate key, trailing bytes...): the caller then
 * parses it with jansson. fuzz_upload checks it against jansson. */
json_t *gps_work_read(const char *body, size_t n);

#endif

/*
 * limits: per-key request rate, daily token budget and concurrency, and the
 * per-key usage record (accounting).
 *
 * A key's limits live on its gps_auth_key (auth.h: rpm, tokens_per_day,
 * max_concurrent; 0 = unlimited), so creating, changing or reloading keys
 * (admin API, SIGHUP) takes effect on the next request. This module keeps
 * the counters, one entry per key that has been used, in a small hash table:
 *
 *   rpm            token bucket holding up to rpm requests, refilled at
 *                  rpm per 60 s; an empty bucket refuses with 429 and a
 *                  Retry-After of the time until the next whole request.
 *   tokens_per_day prompt + completion tokens of finished jobs in the
 *                  current UTC day, plus what admitted jobs still hold: a
 *                  job reserves its most (prompt estimate + max_tokens)
 *                  at admission and gives back what it did not use when
 *                  it ends. A request is admitted while spent + reserved
 *                  is under the budget, so concurrent requests overshoot
 *                  it by one request at most (issue 25: 30 concurrent
 *                  requests all passed a check made on finished jobs
 *                  only). Once spent, requests are refused with 429 until
 *                  the next UTC midnight (Retry-After says when). A
 *                  running job is never cut off.
 *   max_concurrent at most N jobs of a key are in the scheduler (queued or
 *                  on an agent) at once; jobs beyond that wait in the
 *                  key's own line, in arrival order, and move on as
 *                  earlier ones end (the jobs module holds them).
 *
 * Usage per key and UTC day (requests, prompt and completion tokens,
 * refusals) is written to the key_usage table through the store's async
 * queue as it happens and read back at start-up, so the daily budget
 * survives a restart.
 *
 * Threading: loop thread only, like auth.
 */
#ifndef GPS_LIMITS_H
#define GPS_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "server/auth/auth.h"
#include "server/store/store.h"

typedef struct gps_limits gps_limits;

typedef enum gps_limit_result {
    GPS_LIMIT_OK = 0,
    GPS_LIMIT_RPM,      /* requests per minute exceeded: 429 RATE_LIMITED */
    GPS_LIMIT_TOKENS,   /* tokens per day spent: 429 TOKEN_LIMIT */
} gps_limit_result;

/* "ok", "rpm", "tokens_per_day" (static; metrics label). */
const char *gps_limit_result_name(gps_limit_result r);

/* Usage of one key in the current UTC day, and its jobs right now. */
typedef struct gps_key_usage {
    int64_t day;                /* days since the epoch (UTC) these counts are for */
    int64_t requests;           /* admitted requests */
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t rate_limited;       /* refused requests (rpm or tokens) */
    int64_t running;            /* jobs in the scheduler (queued or on an agent) */
    int64_t waiting;            /* jobs waiting for a max_concurrent slot */
    int64_t reserved_tokens;    /* held by admitted jobs that have not ended */
} gps_key_usage;

/* auth and store (store may be NULL: no persistence) are borrowed and must
 * outlive the limits. NULL on ENOMEM. */
gps_limits *gps_limits_new(gps_auth *auth, gps_store *store);
void gps_limits_free(gps_limits *l);
/* Read today's usage of every key from key_usage (start-up; synchronous).
 * 0, or -1 with err (counters start at zero). */
int gps_limits_load(gps_limits *l, int64_t now_wall_ms, char *err, size_t errlen);

/* Admission of one request of key_id ("" or NULL: no key, always OK).
 * Counts it (request and usage row) when admitted and the refusal
 * otherwise; *retry_after_sec (>= 1) says when to try again. Admitted,
 * the request holds reserve_tokens (its most) against the daily budget
 * until gps_limits_release gives them back. */
gps_limit_result gps_limits_admit(gps_limits *l, const char *key_id, int64_t now_wall_ms,
                                  int64_t reserve_tokens, int *retry_after_sec);
/* An admitted request ended (or never ran): its reservation goes; what it
 * really used is counted by gps_limits_account. */
void gps_limits_release(gps_limits *l, const char *key_id, int64_t reserved_tokens);

/* Concurrency. may_start: may one more job of key_id enter the scheduler?
 * started/ended bracket a job's time in the scheduler; waiting_add moves
 * the key's waiting count (+1 held, -1 released or gone). */
bool gps_limits_may_start(gps_limits *l, const char *key_id);
void gps_limits_started(gps_limits *l, const char *key_id);
void gps_limits_ended(gps_limits *l, const char *key_id);
void gps_limits_waiting_add(gps_limits *l, const char *key_id, int delta);

/* A job of key_id finished with these token counts: added to the day's
 * usage (memory + async DB upsert). */
void gps_limits_account(gps_limits *l, const char *key_id, int64_t prompt_tokens,
                        int64_t completion_tokens, int64_t now_wall_ms);

/* Several servers on one database (docs/scaling.md section 3): re-read
 * today's usage of every key through the store's queue and take the
 * stored counts, which every server adds to atomically, plus what this
 * server added since the read was queued. A budget then holds across
 * servers up to what the others admitted since the last re-read. At most
 * one read in flight; a failed one changes nothing. 0, or -1 when it could
 * not be queued. Free the limits only after the store is closed. */
int gps_limits_refresh(gps_limits *l, int64_t now_wall_ms);

/* Usage of key_id today (zeros for an unknown or unused key). */
void gps_limits_get_usage(gps_limits *l, const char *key_id, int64_t now_wall_ms,
                          gps_key_usage *out);

#endif

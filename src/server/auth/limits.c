/*
 * limits.c: per-key counters behind limits.h.
 *
 * One entry per key that has been used since start-up (or has usage
 * today in the DB), in a chained hash table keyed by the key id. Entries
 * are never freed before the limits object: their number is bounded by the
 * number of keys, which the operator controls.
 */
#include "server/auth/limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

#define NBUCKETS 256
#define DAY_MS 86400000LL
/* Ceiling of every daily count: sums of two counts (prompt + completion)
 * stay far from INT64_MAX, whatever the DB or an agent said. */
#define USAGE_MAX (INT64_MAX / 4)

/* a + b for counts in 0..USAGE_MAX, saturating at USAGE_MAX. */
static int64_t sat_add(int64_t a, int64_t b)
{
    return b > USAGE_MAX - a ? USAGE_MAX : a + b;
}

/* A count read back from the DB: clamped into 0..USAGE_MAX (a row written
 * before the bounds existed, or edited by hand, must not crash or wrap). */
static int64_t clamp_count(int64_t v, const char *key_id, const char *what)
{
    if (v >= 0 && v <= USAGE_MAX)
        return v;
    gp_log_write(GP_LOG_WARN, "key_usage_clamped", NULL,
                 json_pack("{s:s,s:s,s:I}", "key_id", key_id, "field", what, "value",
                           (json_int_t)v),
                 "key_usage row out of range: clamped");
    return v < 0 ? 0 : USAGE_MAX;
}

typedef struct lim_entry {
    char key_id[GPS_AUTH_ID_LEN + 1];
    double bucket;               /* rpm token bucket: requests available now */
    int64_t bucket_ms;           /* wall ms of the last refill; 0 = never used (full) */
    gps_key_usage u;
    /* Counts this server added to day since_day since the last re-read
     * was queued (gps_limits_refresh): the read cannot hold them. */
    int64_t since_day, since[4];
    struct lim_entry *next;
} lim_entry;

struct gps_limits {
    gps_auth *auth;              /* borrowed */
    gps_store *store;            /* borrowed, may be NULL */
    lim_entry *buckets[NBUCKETS];
    bool refreshing;             /* a usage re-read in flight */
};

const char *gps_limit_result_name(gps_limit_result r)
{
    switch (r) {
    case GPS_LIMIT_OK: return "ok";
    case GPS_LIMIT_RPM: return "rpm";
    case GPS_LIMIT_TOKENS: return "tokens_per_day";
    }
    return "unknown";
}

static int64_t day_of(int64_t wall_ms) { return wall_ms / DAY_MS; }

static unsigned bucket_of(const char *id)
{
    /* FNV-1a: ids are random hex, any spread will do. */
    unsigned h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % NBUCKETS;
}

static lim_entry *entry_find(gps_limits *l, const char *key_id)
{
    for (lim_entry *e = l->buckets[bucket_of(key_id)]; e; e = e->next)
        if (strcmp(e->key_id, key_id) == 0)
            return e;
    return NULL;
}

/* The entry of key_id, created on first use; NULL on ENOMEM or an id too
 * long to be one of ours (then nothing is counted or limited for it). */
static lim_entry *entry_get(gps_limits *l, const char *key_id)
{
    lim_entry *e = entry_find(l, key_id);
    if (e || strlen(key_id) > GPS_AUTH_ID_LEN)
        return e;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    snprintf(e->key_id, sizeof e->key_id, "%s", key_id);
    unsigned b = bucket_of(key_id);
    e->next = l->buckets[b];
    l->buckets[b] = e;
    return e;
}

/* A new UTC day starts the day's counts afresh; jobs in flight (and what
 * they reserved) stay. */
static void roll_day(lim_entry *e, int64_t now)
{
    int64_t d = day_of(now);
    if (e->u.day == d)
        return;
    e->u.day = d;
    e->u.requests = e->u.prompt_tokens = e->u.completion_tokens = e->u.rate_limited = 0;
}

static const gps_key_limits *limits_of(gps_limits *l, const char *key_id)
{
    const gps_auth_key *k = gps_auth_key_find(l->auth, key_id);
    return k ? &k->limits : NULL;
}

gps_limits *gps_limits_new(gps_auth *auth, gps_store *store)
{
    gps_limits *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->auth = auth;
    l->store = store;
    return l;
}

void gps_limits_free(gps_limits *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < NBUCKETS; i++) {
        lim_entry *e = l->buckets[i];
        while (e) {
            lim_entry *n = e->next;
            free(e);
            e = n;
        }
    }
    free(l);
}

static int load_row(void *arg, const char *key_id, int64_t day, int64_t requests,
                    int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    lim_entry *e = entry_get(arg, key_id);
    if (!e)
        return 0;
    e->u.day = day;
    e->u.requests = clamp_count(requests, key_id, "requests");
    e->u.prompt_tokens = clamp_count(prompt_tokens, key_id, "prompt_tokens");
    e->u.completion_tokens = clamp_count(completion_tokens, key_id, "completion_tokens");
    e->u.rate_limited = clamp_count(rate_limited, key_id, "rate_limited");
    return 0;
}

int gps_limits_load(gps_limits *l, int64_t now_wall_ms, char *err, size_t errlen)
{
    if (!l->store)
        return 0;
    return gps_store_load_usage(l->store, day_of(now_wall_ms), load_row, l, err, errlen);
}

static void persist(gps_limits *l, lim_entry *e, int64_t requests, int64_t prompt,
                    int64_t completion, int64_t refused)
{
    if (e->since_day != e->u.day) {
        e->since_day = e->u.day;
        memset(e->since, 0, sizeof e->since);
    }
    int64_t add[4] = {requests, prompt, completion, refused};
    for (int i = 0; i < 4; i++)
        e->since[i] = sat_add(e->since[i], add[i]);
    if (l->store)
        gps_store_usage_add(l->store, e->key_id, e->u.day, requests, prompt, completion,
                            refused);
}

/* Refill the rpm bucket up to now; a key never seen (or whose limit was
 * just set) starts full so a fresh key gets its whole minute at once. */
static void refill(lim_entry *e, int64_t rpm, int64_t now)
{
    if (e->bucket_ms == 0 || now < e->bucket_ms) {
        e->bucket = (double)rpm;
    } else {
        e->bucket += (double)(now - e->bucket_ms) * (double)rpm / 60000.0;
        if (e->bucket > (double)rpm)
            e->bucket = (double)rpm;
    }
    e->bucket_ms = now;
}

gps_limit_result gps_limits_admit(gps_limits *l, const char *key_id, int64_t now_wall_ms,
                                  int64_t reserve_tokens, int *retry_after_sec)
{
    *retry_after_sec = 0;
    if (!key_id || !*key_id)
        return GPS_LIMIT_OK;
    lim_entry *e = entry_get(l, key_id);
    if (!e)
        return GPS_LIMIT_OK;
    roll_day(e, now_wall_ms);
    const gps_key_limits *lim = limits_of(l, key_id);
    gps_limit_result res = GPS_LIMIT_OK;
    if (lim && lim->tokens_per_day > 0 &&
        sat_add(sat_add(e->u.prompt_tokens, e->u.completion_tokens), e->u.reserved_tokens) >=
            lim->tokens_per_day) {
        int64_t midnight = (day_of(now_wall_ms) + 1) * DAY_MS;
        *retry_after_sec = (int)((midnight - now_wall_ms + 999) / 1000);
        res = GPS_LIMIT_TOKENS;
    } else if (lim && lim->rpm > 0) {
        refill(e, lim->rpm, now_wall_ms);
        if (e->bucket < 1.0) {
            /* Time until the bucket holds one whole request. */
            double ms = (1.0 - e->bucket) * 60000.0 / (double)lim->rpm;
            *retry_after_sec = (int)(ms / 1000.0) + 1;
            res = GPS_LIMIT_RPM;
        } else {
            e->bucket -= 1.0;
        }
    }
    if (res != GPS_LIMIT_OK) {
        if (*retry_after_sec < 1)
            *retry_after_sec = 1;
        e->u.rate_limited = sat_add(e->u.rate_limited, 1);
        persist(l, e, 0, 0, 0, 1);
        return res;
    }
    e->u.requests = sat_add(e->u.requests, 1);
    if (reserve_tokens > 0)
        e->u.reserved_tokens =
            sat_add(e->u.reserved_tokens, reserve_tokens < USAGE_MAX ? reserve_tokens : USAGE_MAX);
    persist(l, e, 1, 0, 0, 0);
    return GPS_LIMIT_OK;
}

void gps_limits_release(gps_limits *l, const char *key_id, int64_t reserved_tokens)
{
    lim_entry *e = key_id && *key_id ? entry_find(l, key_id) : NULL;
    if (!e || reserved_tokens <= 0)
        return;
    reserved_tokens = reserved_tokens < USAGE_MAX ? reserved_tokens : USAGE_MAX;
    e->u.reserved_tokens =
        e->u.reserved_tokens > reserved_tokens ? e->u.reserved_tokens - reserved_tokens : 0;
}

bool gps_limits_may_start(gps_limits *l, const char *key_id)
{
    if (!key_id || !*key_id)
        return true;
    const gps_key_limits *lim = limits_of(l, key_id);
    if (!lim || lim->max_concurrent <= 0)
        return true;
    lim_entry *e = entry_get(l, key_id);
    return !e || e->u.running < lim->max_concurrent;
}

void gps_limits_started(gps_limits *l, const char *key_id)
{
    lim_entry *e = key_id && *key_id ? entry_get(l, key_id) : NULL;
    if (e)
        e->u.running++;
}

void gps_limits_ended(gps_limits *l, const char *key_id)
{
    lim_entry *e = key_id && *key_id ? entry_find(l, key_id) : NULL;
    if (e && e->u.running > 0)
        e->u.running--;
}

void gps_limits_waiting_add(gps_limits *l, const char *key_id, int delta)
{
    lim_entry *e = key_id && *key_id ? entry_get(l, key_id) : NULL;
    if (!e)
        return;
    e->u.waiting += delta;
    if (e->u.waiting < 0)
        e->u.waiting = 0;
}

void gps_limits_account(gps_limits *l, const char *key_id, int64_t prompt_tokens,
                        int64_t completion_tokens, int64_t now_wall_ms)
{
    if (!key_id || !*key_id)
        return;
    lim_entry *e = entry_get(l, key_id);
    if (!e)
        return;
    prompt_tokens = prompt_tokens > 0 ? prompt_tokens : 0;
    completion_tokens = completion_tokens > 0 ? completion_tokens : 0;
    if (!prompt_tokens && !completion_tokens)
        return;
    roll_day(e, now_wall_ms);
    prompt_tokens = prompt_tokens < USAGE_MAX ? prompt_tokens : USAGE_MAX;
    completion_tokens = completion_tokens < USAGE_MAX ? completion_tokens : USAGE_MAX;
    e->u.prompt_tokens = sat_add(e->u.prompt_tokens, prompt_tokens);
    e->u.completion_tokens = sat_add(e->u.completion_tokens, completion_tokens);
    persist(l, e, 0, prompt_tokens, completion_tokens, 0);
}

/* Today's usage of every key as the database holds it, all servers
 * together: each count becomes the stored one plus what this server added
 * after the read was queued (ops run in queue order, so the read saw every
 * earlier add that reached the database). */
static void refreshed(void *arg, int status, int64_t day, const gps_store_usage_row *rows,
                      size_t n)
{
    gps_limits *l = arg;
    l->refreshing = false;
    for (size_t i = 0; status == 0 && i < n; i++) {
        lim_entry *e = rows[i].key_id ? entry_get(l, rows[i].key_id) : NULL;
        if (!e)
            continue;
        if (e->u.day != day) {
            if (e->u.day > day)
                continue;   /* a new UTC day began meanwhile */
            roll_day(e, day * DAY_MS);
        }
        bool mine = e->since_day == day;
        int64_t db[4] = {rows[i].requests, rows[i].prompt_tokens, rows[i].completion_tokens,
                         rows[i].rate_limited};
        int64_t *dst[4] = {&e->u.requests, &e->u.prompt_tokens, &e->u.completion_tokens,
                           &e->u.rate_limited};
        static const char *const what[4] = {"requests", "prompt_tokens", "completion_tokens",
                                            "rate_limited"};
        for (int k = 0; k < 4; k++)
            *dst[k] = sat_add(clamp_count(db[k], e->key_id, what[k]), mine ? e->since[k] : 0);
    }
}

int gps_limits_refresh(gps_limits *l, int64_t now_wall_ms)
{
    if (!l->store || l->refreshing)
        return 0;
    int64_t day = day_of(now_wall_ms);
    for (size_t i = 0; i < NBUCKETS; i++)
        for (lim_entry *e = l->buckets[i]; e; e = e->next) {
            e->since_day = day;
            memset(e->since, 0, sizeof e->since);
        }
    if (gps_store_usage_async(l->store, day, refreshed, l) != 0)
        return -1;
    l->refreshing = true;
    return 0;
}

void gps_limits_get_usage(gps_limits *l, const char *key_id, int64_t now_wall_ms,
                          gps_key_usage *out)
{
    memset(out, 0, sizeof *out);
    out->day = day_of(now_wall_ms);
    lim_entry *e = key_id && *key_id ? entry_find(l, key_id) : NULL;
    if (!e)
        return;
    roll_day(e, now_wall_ms);
    *out = e->u;
}

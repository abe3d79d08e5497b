/*
 * auth: API keys (client, agent, admin, enrollment) and the check of a
 * presented key.
 *
 * A key is 256 random bits shown once as "gpk_" + 64 lowercase hex chars
 * (68 chars). At rest only its SHA-256 (lowercase hex) is kept, in the
 * api_keys table (store.h) and in an in-memory cache: a hash table keyed by
 * that digest, loaded at start-up. A check hashes the presented key, finds
 * the bucket from the digest and compares the stored digest with
 * gp_ct_equal (constant time), so neither the lookup nor the compare leaks
 * how much of a guess was right. The raw key is never stored or logged.
 *
 * Roles: a route wants one role. client keys pass client routes; agent
 * keys pass agent routes; admin keys pass admin AND client routes (an
 * operator can try the API with an admin key), not agent routes;
 * enrollment keys pass only the enrollment route (POST /agents/enroll).
 *
 * Auth is enabled when any key exists (revoked ones count: revoking the
 * last key must not open the server) or when any listener is not on
 * loopback. When disabled, every check returns GPS_AUTH_OK with no key.
 * The core tells auth about its listeners with gps_auth_set_loopback_only.
 *
 * Agent keys are bound to one agent_id: the first successful poll binds an
 * unbound key (gps_auth_bind_agent), later polls with another agent_id are
 * refused. An agent_id is bound to at most one (unrevoked) key: another
 * key cannot bind or enroll it.
 *
 * Threading: a gps_auth belongs to the loop thread (not thread-safe). It
 * writes key changes (create, revoke, bind, last_used at most once a
 * minute per key) through the store's async queue, never blocking.
 */
#ifndef GPS_AUTH_H
#define GPS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/store/store.h"

#define GPS_AUTH_KEY_PREFIX "gpk_"
#define GPS_AUTH_KEY_LEN 68   /* "gpk_" + 64 hex; buffers need GPS_AUTH_KEY_LEN + 1 */
#define GPS_AUTH_ID_LEN 28    /* "key_" + 24 hex; buffers need GPS_AUTH_ID_LEN + 1 */

typedef enum gps_key_role {
    GPS_KEY_CLIENT = 0,
    GPS_KEY_AGENT,
    GPS_KEY_ADMIN,
    GPS_KEY_ENROLLMENT,
    GPS_KEY_ROLE_COUNT
} gps_key_role;

/* "client", "agent", "admin", "enrollment" (static). */
const char *gps_key_role_name(gps_key_role r);
/* Parse a role name; -1 when unknown. */
int gps_key_role_parse(const char *s);

typedef enum gps_auth_result {
    GPS_AUTH_OK = 0,
    GPS_AUTH_MISSING,     /* no credential (or an empty one): 401 */
    GPS_AUTH_INVALID,     /* no such key: 401 */
    GPS_AUTH_WRONG_ROLE,  /* valid key, role does not pass this route: 403 */
    GPS_AUTH_REVOKED,     /* 401 */
    GPS_AUTH_EXPIRED,     /* 401 */
    GPS_AUTH_EXHAUSTED,   /* enrollment token with no uses left: 403 */
} gps_auth_result;

/* Stable code for logs/metrics: "ok", "missing", "invalid", "wrong_role",
 * "revoked", "expired", "exhausted" (static). */
const char *gps_auth_result_name(gps_auth_result r);
/* HTTP status for a failed check: 403 for WRONG_ROLE and EXHAUSTED, 401
 * otherwise (0 for OK). */
int gps_auth_result_status(gps_auth_result r);

/* A cached key. Read-only outside auth.c; valid until the next
 * gps_auth_load / gps_auth_free. */
/* Per-key limits (client and admin keys; 0 = unlimited). Enforced by the
 * limits module (limits.h) at job submission. */
typedef struct gps_key_limits {
    int64_t rpm;             /* requests per minute (token bucket of rpm, refilled rpm/60 s) */
    int64_t tokens_per_day;  /* prompt + completion tokens per UTC day */
    int64_t max_concurrent;  /* jobs on agents at once; extra jobs wait in the queue */
} gps_key_limits;

/* What a new key is: role and name, plus optional expiry, limits, use
 * count (enrollment tokens) and a pre-bound agent (enrolled agent keys). */
/* Enrollments an enrollment token allows when its creator names no
 * max_uses (admin API, `keys create`): a leaked token without a bound
 * would mint agents without end (issue 25). An explicit 0 is unlimited. */
#define GPS_ENROLL_DEFAULT_MAX_USES 16

typedef struct gps_key_spec {
    gps_key_role role;
    const char *name;        /* NULL = "" */
    int64_t expires_at;      /* wall ms, 0 = never */
    gps_key_limits limits;
    int64_t max_uses;        /* enrollment tokens: enrollments allowed, 0 = unlimited */
    const char *agent_id;    /* agent keys: bound from the start; NULL = bind on first poll */
} gps_key_spec;

typedef struct gps_auth_key {
    char id[GPS_AUTH_ID_LEN + 1];
    char hash[65];
    gps_key_role role;
    char *name;
    char *agent_id;          /* NULL = unbound */
    int64_t created_at;      /* wall ms */
    int64_t expires_at;      /* 0 = never */
    int64_t revoked_at;      /* 0 = active */
    int64_t last_used_at;    /* 0 = never */
    gps_key_limits limits;
    int64_t max_uses;        /* enrollment: 0 = unlimited */
    int64_t uses;            /* enrollment: agents enrolled with it so far */
    /* private */
    int64_t last_used_written;
    struct gps_auth_key *next;     /* chain by hash */
    struct gps_auth_key *id_next;  /* chain by id */
} gps_auth_key;

typedef struct gps_auth gps_auth;

/* New empty cache. store (may be NULL: memory only, for tests) is borrowed
 * and must outlive the auth object. Starts as loopback-only. NULL on ENOMEM. */
gps_auth *gps_auth_new(gps_store *store);
void gps_auth_free(gps_auth *a);
/* (Re)load every key from the store, replacing the cache (start-up and
 * SIGHUP; a short synchronous read of a small table). Previously returned
 * gps_auth_key pointers become invalid. 0 or -1 with err (cache kept). */
int gps_auth_load(gps_auth *a, char *err, size_t errlen);

/* Several servers on one database (docs/scaling.md section 3): re-read
 * every key through the store's queue (no wait on the loop) and merge
 * what other servers changed into the cache: new keys, revocations
 * (never undone here; the revoke listener hears of them), expiry, limits,
 * enrollment uses, agent bindings. Keys are never dropped and cached
 * pointers stay valid. At most one read in flight; a failed one (database
 * away) leaves the cache as it was. 0, or -1 when it could not be queued.
 * Its callback runs on the loop thread; free the auth only after the
 * store is closed. */
int gps_auth_refresh(gps_auth *a);

/* The core says whether all its listeners are on loopback. */
void gps_auth_set_loopback_only(gps_auth *a, bool loopback_only);
/* True when checks are enforced (see the rule at the top). */
bool gps_auth_enabled(const gps_auth *a);
/* Keys in the cache (revoked and expired included). */
size_t gps_auth_key_count(const gps_auth *a);

/* Check a credential for a route wanting `wanted`. credential is the
 * Authorization header value ("Bearer gpk_...", scheme case-insensitive)
 * or a bare key (x-api-key); NULL or blank = missing. *key_out (may be
 * NULL) receives the key on OK (NULL when auth is disabled) and also on
 * WRONG_ROLE/REVOKED/EXPIRED (for logs). Updates last_used on OK. */
gps_auth_result gps_auth_check(gps_auth *a, const char *credential, gps_key_role wanted,
                               const gps_auth_key **key_out);
/* Same at an explicit wall-clock time (tests). */
gps_auth_result gps_auth_check_at(gps_auth *a, const char *credential, gps_key_role wanted,
                                  int64_t now_wall_ms, const gps_auth_key **key_out);

/* Bind an agent key to agent_id on first use. 0 when now bound to it (or
 * already was), -1 when the key is bound to another agent, -2 when
 * agent_id belongs to another key (refuse both: 403). */
int gps_auth_bind_agent(gps_auth *a, const gps_auth_key *key, const char *agent_id);
/* The agent key (not revoked) that agent_id is bound to, or NULL. An
 * agent_id belongs to the first key bound to it, for as long as that key
 * is not revoked (the binding is stored with the key: it survives
 * restarts). */
const gps_auth_key *gps_auth_agent_owner(const gps_auth *a, const char *agent_id);

/* Create a key in the running server: cache + async store write.
 * expires_at: wall ms, 0 = never. out_key gets the raw key (show it once,
 * then forget it), out_id the public id. 0 or -1 (ENOMEM). */
int gps_auth_key_create(gps_auth *a, gps_key_role role, const char *name, int64_t expires_at,
                        char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1]);
/* Create a key from a full spec (admin API, enrollment). Same contract as
 * gps_auth_key_create. */
int gps_auth_key_create_spec(gps_auth *a, const gps_key_spec *spec,
                             char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1]);
/* gps_auth_key_create_spec in two steps, for a caller whose reply must be
 * whole before the key exists (POST /admin/keys shows the raw key in its
 * reply only: a reply it cannot make must leave no key behind). _prepare
 * picks the raw key (out_key) and the id (out_id) and makes the entry,
 * which nothing sees yet: NULL on ENOMEM or a bad spec. _commit takes the
 * entry and makes it live as gps_auth_key_create_spec would; it cannot
 * fail. _discard frees one that was not committed (NULL: a no-op). */
gps_auth_key *gps_auth_key_prepare(const gps_key_spec *spec, char out_key[GPS_AUTH_KEY_LEN + 1],
                                   char out_id[GPS_AUTH_ID_LEN + 1]);
void gps_auth_key_commit(gps_auth *a, gps_auth_key *k);
void gps_auth_key_discard(gps_auth_key *k);
/* Replace a key's limits (cache + async write). 0, or 1 when no such key. */
int gps_auth_key_set_limits(gps_auth *a, const char *key_id, const gps_key_limits *limits);

/* Enrollment (POST /agents/enroll): `credential` must be an active
 * enrollment token (Authorization value or bare key) with uses left. On
 * success its use count goes up by one (cache + async write) and a new
 * agent key bound to agent_id is created: out_key (shown once to the agent)
 * and out_id. Returns GPS_AUTH_OK, or the failed check's result
 * (MISSING/INVALID/REVOKED/EXPIRED, WRONG_ROLE for a non-enrollment key,
 * GPS_AUTH_EXHAUSTED when max_uses is spent). name names the new key
 * ("" = "agent <agent_id>"). */
gps_auth_result gps_auth_enroll(gps_auth *a, const char *credential, const char *agent_id,
                                const char *name, int64_t now_wall_ms,
                                char out_key[GPS_AUTH_KEY_LEN + 1],
                                char out_id[GPS_AUTH_ID_LEN + 1]);

/* Revoke by id (cache + async write). 0, or 1 when no such active key. */
int gps_auth_key_revoke(gps_auth *a, const char *key_id);
/* The same for a token the caller has already checked with gps_auth_check
 * (role enrollment, GPS_AUTH_OK): only the use count and the new key. The
 * enroll route checks first so that a refused token is answered before the
 * body is read, and must not check (and count) it twice. */
gps_auth_result gps_auth_enroll_checked(gps_auth *a, const gps_auth_key *token,
                                        const char *agent_id, const char *name,
                                        char out_key[GPS_AUTH_KEY_LEN + 1],
                                        char out_id[GPS_AUTH_ID_LEN + 1]);

/* Revocation listener (one; agents_api installs it to end the open
 * long-polls of a revoked agent key at once). Called on the loop thread
 * after gps_auth_key_revoke revoked a key, and after gps_auth_load for each
 * key that was usable before the reload and is revoked or gone after it. */
typedef void (*gps_auth_revoke_fn)(void *arg, const char *key_id);
void gps_auth_set_revoke_listener(gps_auth *a, gps_auth_revoke_fn fn, void *arg);

/* Look a key up by public id (admin API); NULL when unknown. */
const gps_auth_key *gps_auth_key_find(const gps_auth *a, const char *key_id);
/* Visit every cached key (admin API `keys list`). */
void gps_auth_key_foreach(const gps_auth *a, void (*fn)(void *arg, const gps_auth_key *k),
                          void *arg);

/* Make a fresh raw key and its digest (exposed for tests and the CLI). */
void gps_auth_key_generate(char out_key[GPS_AUTH_KEY_LEN + 1], char out_hash[65]);
/* Digest of a raw key as stored (lowercase hex SHA-256 of its bytes). */
void gps_auth_key_hash(const char *raw_key, char out_hash[65]);

/* CLI `gpupool-server keys create --role R --db PATH [--name N]`: open (or
 * create) the DB, apply migrations, insert the key synchronously.
 * migrations_dir may be NULL (embedded). 0 or -1 with err. */
int gps_auth_key_create_db(const char *db_path, const char *migrations_dir, gps_key_role role,
                           const char *name, int64_t expires_at,
                           char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1],
                           char *err, size_t errlen);
/* Same with a full spec (limits, max_uses, bound agent). */
int gps_auth_key_create_spec_db(const char *db_path, const char *migrations_dir,
                                const gps_key_spec *spec, char out_key[GPS_AUTH_KEY_LEN + 1],
                                char out_id[GPS_AUTH_ID_LEN + 1], char *err, size_t errlen);
/* CLI `keys revoke ID --db PATH`: 0, 1 when no such active key, -1 with err. */
int gps_auth_key_revoke_db(const char *db_path, const char *migrations_dir, const char *key_id,
                           char *err, size_t errlen);

/* Counters for /metrics. */
typedef struct gps_auth_stats {
    uint64_t checks;
    uint64_t by_result[GPS_AUTH_EXHAUSTED + 1];  /* indexed by gps_auth_result */
    uint64_t ct_compares;                      /* constant-time digest compares */
} gps_auth_stats;
void gps_auth_get_stats(const gps_auth *a, gps_auth_stats *out);

#endif

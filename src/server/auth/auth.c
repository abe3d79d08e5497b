/*
 * auth.c: the key cache and key checks (contract in auth.h).
 *
 * The cache is a fixed array of buckets chained by the key's SHA-256: the
 * bucket index comes from the digest of the presented key, never from the
 * key itself, and each candidate digest is compared in constant time.
 * A few thousand keys at most are expected, so 1024 buckets keep chains
 * short without resizing.
 */
#include "server/auth/auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

#define NBUCKETS 1024
#define LAST_USED_WRITE_MS 60000   /* write last_used_at at most once a minute per key */
#define MAX_CREDENTIAL 4096        /* longer is invalid without hashing it all */

struct gps_auth {
    gps_store *store;            /* borrowed, may be NULL */
    gps_auth_key *buckets[NBUCKETS];   /* by digest: the checks */
    gps_auth_key *by_id[NBUCKETS];     /* by public id: find, limits per request */
    size_t n;
    bool loopback_only;
    gps_auth_stats stats;
    gps_auth_revoke_fn on_revoke;
    void *on_revoke_arg;
    /* gps_auth_refresh: a read in flight, and the count of local limit
     * changes (a read queued before one must not undo it). */
    bool refreshing;
    uint64_t limits_gen, refresh_gen;
};

static const char *const role_names[GPS_KEY_ROLE_COUNT] = {
    [GPS_KEY_CLIENT] = "client",
    [GPS_KEY_AGENT] = "agent",
    [GPS_KEY_ADMIN] = "admin",
    [GPS_KEY_ENROLLMENT] = "enrollment",
};

const char *gps_key_role_name(gps_key_role r)
{
    return (unsigned)r < GPS_KEY_ROLE_COUNT ? role_names[r] : "unknown";
}

int gps_key_role_parse(const char *s)
{
    for (int i = 0; s && i < GPS_KEY_ROLE_COUNT; i++)
        if (strcmp(s, role_names[i]) == 0)
            return i;
    return -1;
}

const char *gps_auth_result_name(gps_auth_result r)
{
    switch (r) {
    case GPS_AUTH_OK: return "ok";
    case GPS_AUTH_MISSING: return "missing";
    case GPS_AUTH_INVALID: return "invalid";
    case GPS_AUTH_WRONG_ROLE: return "wrong_role";
    case GPS_AUTH_REVOKED: return "revoked";
    case GPS_AUTH_EXPIRED: return "expired";
    case GPS_AUTH_EXHAUSTED: return "exhausted";
    }
    return "unknown";
}

int gps_auth_result_status(gps_auth_result r)
{
    if (r == GPS_AUTH_OK)
        return 0;
    return r == GPS_AUTH_WRONG_ROLE || r == GPS_AUTH_EXHAUSTED ? 403 : 401;
}

/* Does a key of role `have` pass a route wanting `want`? */
static bool role_passes(gps_key_role have, gps_key_role want)
{
    if (have == want)
        return true;
    return have == GPS_KEY_ADMIN && want == GPS_KEY_CLIENT;
}

static unsigned bucket_of(const char hash[65])
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = hash[i];
        v = v * 16 + (unsigned)(c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0');
    }
    return v % NBUCKETS;
}

static void key_free(gps_auth_key *k)
{
    if (!k)
        return;
    free(k->name);
    free(k->agent_id);
    free(k);
}

static void table_clear(gps_auth_key **buckets)
{
    for (size_t i = 0; i < NBUCKETS; i++) {
        gps_auth_key *k = buckets[i];
        while (k) {
            gps_auth_key *next = k->next;
            key_free(k);
            k = next;
        }
        buckets[i] = NULL;
    }
}

/* New cache entry (caller links it). NULL on ENOMEM or a malformed hash. */
static gps_auth_key *key_new(const char *id, const char *hash, gps_key_role role,
                             const char *name, const char *agent_id, int64_t created_at,
                             int64_t expires_at, int64_t revoked_at, int64_t last_used_at)
{
    if (!id || strlen(id) > GPS_AUTH_ID_LEN || !hash || strlen(hash) != 64)
        return NULL;
    gps_auth_key *k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    snprintf(k->id, sizeof(k->id), "%s", id);
    memcpy(k->hash, hash, 65);
    k->role = role;
    k->name = strdup(name ? name : "");
    k->agent_id = agent_id ? strdup(agent_id) : NULL;
    k->created_at = created_at;
    k->expires_at = expires_at;
    k->revoked_at = revoked_at;
    k->last_used_at = last_used_at;
    k->last_used_written = last_used_at;
    if (!k->name || (agent_id && !k->agent_id)) {
        key_free(k);
        return NULL;
    }
    return k;
}

static unsigned id_bucket_of(const char *id)
{
    /* FNV-1a: ids are random hex after "key_". */
    unsigned h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % NBUCKETS;
}

/* Rebuild the id index from the digest table (after a load swapped it). */
static void index_rebuild(gps_auth *a)
{
    memset(a->by_id, 0, sizeof(a->by_id));
    for (size_t i = 0; i < NBUCKETS; i++)
        for (gps_auth_key *k = a->buckets[i]; k; k = k->next) {
            unsigned b = id_bucket_of(k->id);
            k->id_next = a->by_id[b];
            a->by_id[b] = k;
        }
}

static void table_add(gps_auth_key **buckets, gps_auth_key *k)
{
    unsigned b = bucket_of(k->hash);
    k->next = buckets[b];
    buckets[b] = k;
}

gps_auth *gps_auth_new(gps_store *store)
{
    gps_auth *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->store = store;
    a->loopback_only = true;
    return a;
}

void gps_auth_free(gps_auth *a)
{
    if (!a)
        return;
    table_clear(a->buckets);
    free(a);
}

typedef struct load_ctx {
    gps_auth_key *buckets[NBUCKETS];
    size_t n;
    bool oom;
} load_ctx;

static int load_one(void *arg, const gps_store_key_row *r)
{
    load_ctx *c = arg;
    int role = gps_key_role_parse(r->role);
    if (role < 0 || strlen(r->hash) != 64) {
        gp_log_write(GP_LOG_WARN, "auth_key_skipped", NULL, json_pack("{s:s}", "key_id", r->id),
                     "key %s has an unknown role or a malformed hash; ignored", r->id);
        return 0;
    }
    gps_auth_key *k = key_new(r->id, r->hash, (gps_key_role)role, r->name, r->agent_id,
                              r->created_at, r->expires_at, r->revoked_at, r->last_used_at);
    if (!k) {
        c->oom = true;
        return 1;
    }
    k->limits = (gps_key_limits){r->rpm, r->tokens_per_day, r->max_concurrent};
    k->max_uses = r->max_uses;
    k->uses = r->uses;
    table_add(c->buckets, k);
    c->n++;
    return 0;
}

static bool key_usable(const gps_auth_key *k, int64_t now)
{
    return !(k->revoked_at && k->revoked_at <= now) && !(k->expires_at && now >= k->expires_at);
}

/* After a reload: tell the listener about every key that was usable in
 * old and is not (revoked, expired or gone) in the new table. */
static void notify_lost(gps_auth *a, gps_auth_key **old)
{
    if (!a->on_revoke)
        return;
    int64_t now = gp_now_wall_ms();
    for (size_t i = 0; i < NBUCKETS; i++)
        for (gps_auth_key *k = old[i]; k; k = k->next) {
            if (!key_usable(k, now))
                continue;
            const gps_auth_key *n = NULL;
            for (n = a->buckets[bucket_of(k->hash)]; n; n = n->next)
                if (strcmp(n->id, k->id) == 0)
                    break;
            if (!n || !key_usable(n, now))
                a->on_revoke(a->on_revoke_arg, k->id);
        }
}

int gps_auth_load(gps_auth *a, char *err, size_t errlen)
{
    if (!a->store) {
        snprintf(err, errlen, "auth has no store to load keys from");
        return -1;
    }
    load_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = gps_store_load_keys(a->store, load_one, c, err, errlen);
    if (rc != 0 || c->oom) {
        if (c->oom)
            snprintf(err, errlen, "out of memory loading keys");
        table_clear(c->buckets);
        free(c);
        return -1;
    }
    /* Swap first, notify, then free the old table: the listener may look
     * keys up, and it must see the new state. */
    gps_auth_key **old = malloc(sizeof(a->buckets));
    if (!old) {
        table_clear(c->buckets);
        free(c);
        snprintf(err, errlen, "out of memory loading keys");
        return -1;
    }
    memcpy(old, a->buckets, sizeof(a->buckets));
    memcpy(a->buckets, c->buckets, sizeof(a->buckets));
    index_rebuild(a);
    a->n = c->n;
    free(c);
    notify_lost(a, old);
    table_clear(old);
    free(old);
    return 0;
}

/* One stored key merged into the cache (gps_auth_refresh). Only what
 * another server may have changed moves: a revocation (never undone), the
 * expiry, the limits (unless changed here since the read was queued), an
 * enrollment token's uses (the larger count), an agent binding. */
static void merge_one(gps_auth *a, const gps_store_key_row *r, bool take_limits, int64_t now)
{
    gps_auth_key *k = (gps_auth_key *)gps_auth_key_find(a, r->id);
    int role = gps_key_role_parse(r->role);
    if (!k) {
        if (role < 0 || !r->hash || strlen(r->hash) != 64)
            return;
        k = key_new(r->id, r->hash, (gps_key_role)role, r->name, r->agent_id, r->created_at,
                    r->expires_at, r->revoked_at, r->last_used_at);
        if (!k)
            return;
        k->limits = (gps_key_limits){r->rpm, r->tokens_per_day, r->max_concurrent};
        k->max_uses = r->max_uses;
        k->uses = r->uses;
        table_add(a->buckets, k);
        unsigned ib = id_bucket_of(k->id);
        k->id_next = a->by_id[ib];
        a->by_id[ib] = k;
        a->n++;
        return;
    }
    bool was_usable = key_usable(k, now);
    if (r->revoked_at && !k->revoked_at)
        k->revoked_at = r->revoked_at;
    k->expires_at = r->expires_at;
    if (take_limits) {
        k->limits = (gps_key_limits){r->rpm, r->tokens_per_day, r->max_concurrent};
        k->max_uses = r->max_uses;
    }
    if (r->uses > k->uses)
        k->uses = r->uses;
    if (!k->agent_id && r->agent_id)
        k->agent_id = strdup(r->agent_id);   /* NULL on ENOMEM: stays unbound here */
    if (was_usable && !key_usable(k, now) && a->on_revoke)
        a->on_revoke(a->on_revoke_arg, k->id);
}

static void refreshed(void *arg, int status, const gps_store_key_row *rows, size_t n)
{
    gps_auth *a = arg;
    a->refreshing = false;
    if (status != 0)
        return;   /* the DB is away: the cache stays as it is */
    bool take_limits = a->refresh_gen == a->limits_gen;
    int64_t now = gp_now_wall_ms();
    for (size_t i = 0; i < n; i++)
        if (rows[i].id)
            merge_one(a, &rows[i], take_limits, now);
}

int gps_auth_refresh(gps_auth *a)
{
    if (!a->store || a->refreshing)
        return 0;
    a->refresh_gen = a->limits_gen;
    if (gps_store_keys_async(a->store, refreshed, a) != 0)
        return -1;
    a->refreshing = true;
    return 0;
}

void gps_auth_set_revoke_listener(gps_auth *a, gps_auth_revoke_fn fn, void *arg)
{
    a->on_revoke = fn;
    a->on_revoke_arg = arg;
}

void gps_auth_set_loopback_only(gps_auth *a, bool loopback_only)
{
    a->loopback_only = loopback_only;
}

bool gps_auth_enabled(const gps_auth *a) { return a->n > 0 || !a->loopback_only; }

size_t gps_auth_key_count(const gps_auth *a) { return a->n; }

/* Strip an optional "Bearer" scheme and surrounding blanks. Returns the
 * key's start and its length in *len (0 = missing). */
static const char *credential_key(const char *c, size_t *len)
{
    *len = 0;
    if (!c)
        return NULL;
    while (*c == ' ' || *c == '\t')
        c++;
    if (strncasecmp(c, "bearer", 6) == 0 && (c[6] == ' ' || c[6] == '\t')) {
        c += 6;
        while (*c == ' ' || *c == '\t')
            c++;
    }
    size_t n = strlen(c);
    while (n && isspace((unsigned char)c[n - 1]))
        n--;
    *len = n;
    return c;
}

gps_auth_result gps_auth_check_at(gps_auth *a, const char *credential, gps_key_role wanted,
                                  int64_t now, const gps_auth_key **key_out)
{
    gps_auth_result res;
    gps_auth_key *found = NULL;
    a->stats.checks++;
    if (key_out)
        *key_out = NULL;
    if (!gps_auth_enabled(a)) {
        res = GPS_AUTH_OK;
        goto out;
    }
    size_t len;
    const char *key = credential_key(credential, &len);
    if (!len) {
        res = GPS_AUTH_MISSING;
        goto out;
    }
    if (len > MAX_CREDENTIAL) {
        res = GPS_AUTH_INVALID;
        goto out;
    }
    char hash[65];
    gp_sha256_hex(key, len, hash);
    /* Walk the whole chain: the time spent does not depend on where (or
     * whether) the digest matched. */
    for (gps_auth_key *k = a->buckets[bucket_of(hash)]; k; k = k->next) {
        a->stats.ct_compares++;
        if (gp_ct_equal(hash, k->hash, 64) && !found)
            found = k;
    }
    if (!found)
        res = GPS_AUTH_INVALID;
    else if (found->revoked_at && found->revoked_at <= now)
        res = GPS_AUTH_REVOKED;
    else if (found->expires_at && now >= found->expires_at)
        res = GPS_AUTH_EXPIRED;
    else if (!role_passes(found->role, wanted))
        res = GPS_AUTH_WRONG_ROLE;
    else
        res = GPS_AUTH_OK;
    if (key_out)
        *key_out = found;
    if (res == GPS_AUTH_OK) {
        found->last_used_at = now;
        if (a->store && now - found->last_used_written >= LAST_USED_WRITE_MS) {
            found->last_used_written = now;
            gps_store_key_used(a->store, found->id, now);
        }
    }
out:
    a->stats.by_result[res]++;
    return res;
}

gps_auth_result gps_auth_check(gps_auth *a, const char *credential, gps_key_role wanted,
                               const gps_auth_key **key_out)
{
    return gps_auth_check_at(a, credential, wanted, gp_now_wall_ms(), key_out);
}

int gps_auth_bind_agent(gps_auth *a, const gps_auth_key *key, const char *agent_id)
{
    if (!key || !agent_id)
        return -1;
    /* The cache owns its keys; the const in the API only keeps callers
     * from editing them. */
    gps_auth_key *k = (gps_auth_key *)key;
    if (k->agent_id)
        return strcmp(k->agent_id, agent_id) == 0 ? 0 : -1;
    /* The id is another key's: taking it would hand that agent's jobs,
     * models and replies to this key's holder. */
    if (gps_auth_agent_owner(a, agent_id))
        return -2;
    k->agent_id = strdup(agent_id);
    if (!k->agent_id)
        return -1;
    if (a->store)
        gps_store_key_bind_agent(a->store, k->id, agent_id);
    return 0;
}

const gps_auth_key *gps_auth_agent_owner(const gps_auth *a, const char *agent_id)
{
    /* O(keys), run once per key (its first agent request) and per
     * enrollment: no index to keep in step with load/revoke. */
    for (size_t i = 0; agent_id && i < NBUCKETS; i++)
        for (gps_auth_key *k = a->buckets[i]; k; k = k->next)
            if (k->role == GPS_KEY_AGENT && !k->revoked_at && k->agent_id &&
                strcmp(k->agent_id, agent_id) == 0)
                return k;
    return NULL;
}

void gps_auth_key_hash(const char *raw_key, char out_hash[65])
{
    gp_sha256_hex(raw_key, strlen(raw_key), out_hash);
}

void gps_auth_key_generate(char out_key[GPS_AUTH_KEY_LEN + 1], char out_hash[65])
{
    memcpy(out_key, GPS_AUTH_KEY_PREFIX, 4);
    gp_random_hex(out_key + 4, 32);   /* 256 bits */
    gps_auth_key_hash(out_key, out_hash);
}

static void new_key_id(char out_id[GPS_AUTH_ID_LEN + 1])
{
    memcpy(out_id, "key_", 4);
    gp_random_hex(out_id + 4, 12);
}

int gps_auth_key_create(gps_auth *a, gps_key_role role, const char *name, int64_t expires_at,
                        char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1])
{
    gps_key_spec spec = {.role = role, .name = name, .expires_at = expires_at};
    return gps_auth_key_create_spec(a, &spec, out_key, out_id);
}

static bool limits_valid(const gps_key_limits *l)
{
    return l->rpm >= 0 && l->tokens_per_day >= 0 && l->max_concurrent >= 0;
}

gps_auth_key *gps_auth_key_prepare(const gps_key_spec *spec, char out_key[GPS_AUTH_KEY_LEN + 1],
                                   char out_id[GPS_AUTH_ID_LEN + 1])
{
    if ((unsigned)spec->role >= GPS_KEY_ROLE_COUNT || !limits_valid(&spec->limits) ||
        spec->max_uses < 0)
        return NULL;
    char hash[65];
    gps_auth_key_generate(out_key, hash);
    new_key_id(out_id);
    gps_auth_key *k = key_new(out_id, hash, spec->role, spec->name, spec->agent_id,
                              gp_now_wall_ms(), spec->expires_at, 0, 0);
    if (!k)
        return NULL;
    k->limits = spec->limits;
    k->max_uses = spec->max_uses;
    return k;
}

void gps_auth_key_discard(gps_auth_key *k) { key_free(k); }

int gps_auth_key_create_spec(gps_auth *a, const gps_key_spec *spec,
                             char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1])
{
    gps_auth_key *k = gps_auth_key_prepare(spec, out_key, out_id);
    if (!k)
        return -1;
    gps_auth_key_commit(a, k);
    return 0;
}

void gps_auth_key_commit(gps_auth *a, gps_auth_key *k)
{
    table_add(a->buckets, k);
    unsigned ib = id_bucket_of(k->id);
    k->id_next = a->by_id[ib];
    a->by_id[ib] = k;
    a->n++;
    if (a->store) {
        gps_store_key_row r = {.id = k->id, .hash = k->hash, .role = gps_key_role_name(k->role),
                               .name = k->name, .agent_id = k->agent_id,
                               .created_at = k->created_at, .expires_at = k->expires_at,
                               .rpm = k->limits.rpm,
                               .tokens_per_day = k->limits.tokens_per_day,
                               .max_concurrent = k->limits.max_concurrent,
                               .max_uses = k->max_uses};
        if (gps_store_key_insert(a->store, r) != 0)
            gp_log_write(GP_LOG_ERROR, "auth_key_not_persisted", NULL,
                         json_pack("{s:s}", "key_id", k->id),
                         "key %s is active but could not be queued for the store", k->id);
    }
}

const gps_auth_key *gps_auth_key_find(const gps_auth *a, const char *key_id)
{
    if (!key_id)
        return NULL;
    for (gps_auth_key *k = a->by_id[id_bucket_of(key_id)]; k; k = k->id_next)
        if (strcmp(k->id, key_id) == 0)
            return k;
    return NULL;
}

int gps_auth_key_revoke(gps_auth *a, const char *key_id)
{
    gps_auth_key *k = (gps_auth_key *)gps_auth_key_find(a, key_id);
    if (!k || k->revoked_at)
        return 1;
    k->revoked_at = gp_now_wall_ms();
    if (a->store)
        gps_store_key_revoke(a->store, k->id, k->revoked_at);
    if (a->on_revoke)
        a->on_revoke(a->on_revoke_arg, k->id);
    return 0;
}

int gps_auth_key_set_limits(gps_auth *a, const char *key_id, const gps_key_limits *limits)
{
    gps_auth_key *k = (gps_auth_key *)gps_auth_key_find(a, key_id);
    if (!k)
        return 1;
    if (!limits_valid(limits))
        return -1;
    k->limits = *limits;
    a->limits_gen++;
    if (a->store)
        gps_store_key_limits(a->store, k->id, limits->rpm, limits->tokens_per_day,
                             limits->max_concurrent, k->max_uses);
    return 0;
}

gps_auth_result gps_auth_enroll(gps_auth *a, const char *credential, const char *agent_id,
                                const char *name, int64_t now_wall_ms,
                                char out_key[GPS_AUTH_KEY_LEN + 1],
                                char out_id[GPS_AUTH_ID_LEN + 1])
{
    out_key[0] = out_id[0] = '\0';
    if (!agent_id || !*agent_id)
        return GPS_AUTH_INVALID;
    /* gps_auth_check_at would let everything through with auth off; an
     * enrollment needs a real token whatever the listeners are. */
    bool forced = a->loopback_only && a->n == 0;
    if (forced)
        return GPS_AUTH_MISSING;
    const gps_auth_key *kc = NULL;
    gps_auth_result r = gps_auth_check_at(a, credential, GPS_KEY_ENROLLMENT, now_wall_ms, &kc);
    if (r != GPS_AUTH_OK)
        return r;
    if (!kc)
        return GPS_AUTH_MISSING;
    return gps_auth_enroll_checked(a, kc, agent_id, name, out_key, out_id);
}

gps_auth_result gps_auth_enroll_checked(gps_auth *a, const gps_auth_key *token,
                                        const char *agent_id, const char *name,
                                        char out_key[GPS_AUTH_KEY_LEN + 1],
                                        char out_id[GPS_AUTH_ID_LEN + 1])
{
    out_key[0] = out_id[0] = '\0';
    if (!token || token->role != GPS_KEY_ENROLLMENT)
        return GPS_AUTH_WRONG_ROLE;
    if (!agent_id || !*agent_id)
        return GPS_AUTH_INVALID;
    /* The cache owns its keys; the const only keeps callers from editing. */
    gps_auth_key *tok = (gps_auth_key *)token;
    if (tok->max_uses > 0 && tok->uses >= tok->max_uses) {
        a->stats.by_result[GPS_AUTH_EXHAUSTED]++;
        return GPS_AUTH_EXHAUSTED;
    }
    char nm[160];
    if (name && *name)
        snprintf(nm, sizeof nm, "%.150s", name);
    else
        snprintf(nm, sizeof nm, "agent %.64s", agent_id);
    gps_key_spec spec = {.role = GPS_KEY_AGENT, .name = nm, .agent_id = agent_id};
    if (gps_auth_key_create_spec(a, &spec, out_key, out_id) != 0)
        return GPS_AUTH_INVALID;
    /* The create above may have rehashed nothing (fixed buckets), so tok
     * is still valid. */
    tok->uses++;
    if (a->store)
        gps_store_key_uses(a->store, tok->id, tok->uses);
    return GPS_AUTH_OK;
}

void gps_auth_key_foreach(const gps_auth *a, void (*fn)(void *arg, const gps_auth_key *k),
                          void *arg)
{
    for (size_t i = 0; i < NBUCKETS; i++)
        for (gps_auth_key *k = a->buckets[i]; k; k = k->next)
            fn(arg, k);
}

void gps_auth_get_stats(const gps_auth *a, gps_auth_stats *out) { *out = a->stats; }

/* ---- CLI helpers: synchronous, on their own store ---- */

int gps_auth_key_create_db(const char *db_path, const char *migrations_dir, gps_key_role role,
                           const char *name, int64_t expires_at,
                           char out_key[GPS_AUTH_KEY_LEN + 1], char out_id[GPS_AUTH_ID_LEN + 1],
                           char *err, size_t errlen)
{
    gps_key_spec spec = {.role = role, .name = name, .expires_at = expires_at};
    return gps_auth_key_create_spec_db(db_path, migrations_dir, &spec, out_key, out_id, err,
                                       errlen);
}

int gps_auth_key_create_spec_db(const char *db_path, const char *migrations_dir,
                                const gps_key_spec *spec, char out_key[GPS_AUTH_KEY_LEN + 1],
                                char out_id[GPS_AUTH_ID_LEN + 1], char *err, size_t errlen)
{
    if ((unsigned)spec->role >= GPS_KEY_ROLE_COUNT) {
        snprintf(err, errlen, "unknown key role");
        return -1;
    }
    if (!limits_valid(&spec->limits) || spec->max_uses < 0) {
        snprintf(err, errlen, "limits must not be negative");
        return -1;
    }
    gps_store_opts opts = {.migrations_dir = migrations_dir};
    gps_store *s = gps_store_open(db_path, NULL, &opts, err, errlen);
    if (!s)
        return -1;
    char hash[65];
    gps_auth_key_generate(out_key, hash);
    new_key_id(out_id);
    gps_store_key_row r = {.id = out_id, .hash = hash, .role = gps_key_role_name(spec->role),
                           .name = spec->name ? spec->name : "", .agent_id = spec->agent_id,
                           .created_at = gp_now_wall_ms(), .expires_at = spec->expires_at,
                           .rpm = spec->limits.rpm, .tokens_per_day = spec->limits.tokens_per_day,
                           .max_concurrent = spec->limits.max_concurrent,
                           .max_uses = spec->max_uses};
    int rc = gps_store_key_insert_sync(s, &r, err, errlen);
    gps_store_close(s);
    if (rc != 0) {
        /* Do not hand out a key that was never stored. */
        memset(out_key, 0, GPS_AUTH_KEY_LEN + 1);
        out_id[0] = '\0';
    }
    return rc;
}

int gps_auth_key_revoke_db(const char *db_path, const char *migrations_dir, const char *key_id,
                           char *err, size_t errlen)
{
    gps_store_opts opts = {.migrations_dir = migrations_dir};
    gps_store *s = gps_store_open(db_path, NULL, &opts, err, errlen);
    if (!s)
        return -1;
    int rc = gps_store_key_revoke_sync(s, key_id, gp_now_wall_ms(), err, errlen);
    gps_store_close(s);
    return rc;
}

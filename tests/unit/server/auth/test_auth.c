/*
 * Unit tests for src/server/auth/auth.c: key format, hashing at rest, checks
 * (ok, missing, invalid, wrong role, revoked, expired), the auth-enabled
 * rule, agent binding, persistence through a real SQLite store, and the
 * re-reads that keep several servers' caches in step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/gp_util.h"
#include "server/auth/auth.h"
#include "server/store/store.h"

#include "db_fixture.h"

static gps_store *open_store(const char *path)
{
    char err[512] = "";
    gps_store *s = gps_store_open(path, NULL, NULL, err, sizeof(err));
    if (!s)
        fprintf(stderr, "open: %s\n", err);
    assert_non_null(s);
    return s;
}

static gps_auth *auth_loaded(gps_store *s)
{
    gps_auth *a = gps_auth_new(s);
    assert_non_null(a);
    char err[256] = "";
    assert_int_equal(gps_auth_load(a, err, sizeof(err)), 0);
    return a;
}

static void create_db_key(const char *db, gps_key_role role, const char *name, int64_t expires,
                          char key[GPS_AUTH_KEY_LEN + 1], char id[GPS_AUTH_ID_LEN + 1])
{
    char err[512] = "";
    int rc = gps_auth_key_create_db(db, NULL, role, name, expires, key, id, err, sizeof(err));
    if (rc)
        fprintf(stderr, "create: %s\n", err);
    assert_int_equal(rc, 0);
}

static void test_key_format_and_roles(void **state)
{
    char key[GPS_AUTH_KEY_LEN + 1], hash[65], hash2[65];
    gps_auth_key_generate(key, hash);
    assert_int_equal(strlen(key), GPS_AUTH_KEY_LEN);
    assert_memory_equal(key, "gpk_", 4);
    for (int i = 4; i < GPS_AUTH_KEY_LEN; i++)
        assert_true(isxdigit((unsigned char)key[i]) && !isupper((unsigned char)key[i]));
    gp_sha256_hex(key, strlen(key), hash2);
    assert_string_equal(hash, hash2);
    char other[GPS_AUTH_KEY_LEN + 1];
    gps_auth_key_generate(other, hash2);
    assert_string_not_equal(key, other);

    for (int r = 0; r < GPS_KEY_ROLE_COUNT; r++)
        assert_int_equal(gps_key_role_parse(gps_key_role_name((gps_key_role)r)), r);
    assert_int_equal(gps_key_role_parse("root"), -1);
    assert_int_equal(gps_key_role_parse(NULL), -1);
    assert_int_equal(gps_auth_result_status(GPS_AUTH_WRONG_ROLE), 403);
    assert_int_equal(gps_auth_result_status(GPS_AUTH_INVALID), 401);
    assert_int_equal(gps_auth_result_status(GPS_AUTH_MISSING), 401);
    assert_int_equal(gps_auth_result_status(GPS_AUTH_OK), 0);
    assert_string_equal(gps_auth_result_name(GPS_AUTH_EXPIRED), "expired");
}

static void test_enabled_rule(void **state)
{
    gps_auth *a = gps_auth_new(NULL);
    assert_non_null(a);
    /* Loopback only, no key: off, every request passes without a key. */
    assert_false(gps_auth_enabled(a));
    const gps_auth_key *k = (const gps_auth_key *)1;
    assert_int_equal(gps_auth_check(a, NULL, GPS_KEY_ADMIN, &k), GPS_AUTH_OK);
    assert_null(k);
    /* A non-loopback listener turns it on, even with no key. */
    gps_auth_set_loopback_only(a, false);
    assert_true(gps_auth_enabled(a));
    assert_int_equal(gps_auth_check(a, NULL, GPS_KEY_CLIENT, NULL), GPS_AUTH_MISSING);
    assert_int_equal(gps_auth_check(a, "Bearer gpk_00", GPS_KEY_CLIENT, NULL), GPS_AUTH_INVALID);
    /* Back on loopback, but a key exists: still on. */
    gps_auth_set_loopback_only(a, true);
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_CLIENT, "c", 0, key, id), 0);
    assert_true(gps_auth_enabled(a));
    assert_int_equal(gps_auth_check(a, NULL, GPS_KEY_CLIENT, NULL), GPS_AUTH_MISSING);
    /* Revoking the only key keeps auth on (it still exists). */
    assert_int_equal(gps_auth_key_revoke(a, id), 0);
    assert_int_equal(gps_auth_key_revoke(a, id), 1);
    assert_true(gps_auth_enabled(a));
    assert_int_equal(gps_auth_check(a, key, GPS_KEY_CLIENT, NULL), GPS_AUTH_REVOKED);
    gps_auth_free(a);
}

static void test_cli_create_and_check(void **state)
{
    tctx *t = *state;
    char ckey[GPS_AUTH_KEY_LEN + 1], cid[GPS_AUTH_ID_LEN + 1];
    char akey[GPS_AUTH_KEY_LEN + 1], aid[GPS_AUTH_ID_LEN + 1];
    char gkey[GPS_AUTH_KEY_LEN + 1], gid[GPS_AUTH_ID_LEN + 1];
    char xkey[GPS_AUTH_KEY_LEN + 1], xid[GPS_AUTH_ID_LEN + 1];
    create_db_key(t->db, GPS_KEY_CLIENT, "laptop", 0, ckey, cid);
    create_db_key(t->db, GPS_KEY_ADMIN, "ops", 0, akey, aid);
    create_db_key(t->db, GPS_KEY_AGENT, "box", 0, gkey, gid);
    /* Expired a second ago. */
    create_db_key(t->db, GPS_KEY_CLIENT, "old", gp_now_wall_ms() - 1000, xkey, xid);
    assert_memory_equal(cid, "key_", 4);
    assert_int_equal(strlen(cid), GPS_AUTH_ID_LEN);

    gps_store *s = open_store(t->db);
    gps_auth *a = auth_loaded(s);
    assert_int_equal(gps_auth_key_count(a), 4);
    assert_true(gps_auth_enabled(a));

    gps_auth_stats st0, st1;
    gps_auth_get_stats(a, &st0);
    const gps_auth_key *k = NULL;
    char hdr[128];
    snprintf(hdr, sizeof(hdr), "Bearer %s", ckey);
    assert_int_equal(gps_auth_check(a, hdr, GPS_KEY_CLIENT, &k), GPS_AUTH_OK);
    assert_non_null(k);
    assert_string_equal(k->id, cid);
    assert_string_equal(k->name, "laptop");
    assert_int_equal(k->role, GPS_KEY_CLIENT);
    gps_auth_get_stats(a, &st1);
    /* The digest compare went through gp_ct_equal (counted). */
    assert_true(st1.ct_compares > st0.ct_compares);
    assert_int_equal(st1.checks, st0.checks + 1);

    /* Scheme is case-insensitive, blanks are trimmed; a bare key works (x-api-key). */
    snprintf(hdr, sizeof(hdr), "  bearer   %s  ", ckey);
    assert_int_equal(gps_auth_check(a, hdr, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, ckey, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);

    /* Missing. */
    assert_int_equal(gps_auth_check(a, NULL, GPS_KEY_CLIENT, NULL), GPS_AUTH_MISSING);
    assert_int_equal(gps_auth_check(a, "", GPS_KEY_CLIENT, NULL), GPS_AUTH_MISSING);
    assert_int_equal(gps_auth_check(a, "Bearer   ", GPS_KEY_CLIENT, NULL), GPS_AUTH_MISSING);

    /* Invalid: one changed character, a truncated key, the hash itself. */
    char bad[GPS_AUTH_KEY_LEN + 1];
    memcpy(bad, ckey, sizeof(bad));
    bad[GPS_AUTH_KEY_LEN - 1] = bad[GPS_AUTH_KEY_LEN - 1] == '0' ? '1' : '0';
    assert_int_equal(gps_auth_check(a, bad, GPS_KEY_CLIENT, &k), GPS_AUTH_INVALID);
    assert_null(k);
    bad[20] = '\0';
    memcpy(bad, ckey, 20);
    assert_int_equal(gps_auth_check(a, bad, GPS_KEY_CLIENT, NULL), GPS_AUTH_INVALID);
    const gps_auth_key *ck = gps_auth_key_find(a, cid);
    assert_non_null(ck);
    assert_int_equal(gps_auth_check(a, ck->hash, GPS_KEY_CLIENT, NULL), GPS_AUTH_INVALID);
    char huge[5000];
    memset(huge, 'a', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    assert_int_equal(gps_auth_check(a, huge, GPS_KEY_CLIENT, NULL), GPS_AUTH_INVALID);

    /* Roles. */
    assert_int_equal(gps_auth_check(a, ckey, GPS_KEY_ADMIN, &k), GPS_AUTH_WRONG_ROLE);
    assert_non_null(k);
    assert_int_equal(gps_auth_check(a, ckey, GPS_KEY_AGENT, NULL), GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_check(a, akey, GPS_KEY_ADMIN, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, akey, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, akey, GPS_KEY_AGENT, NULL), GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_check(a, gkey, GPS_KEY_AGENT, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, gkey, GPS_KEY_CLIENT, NULL), GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_check(a, gkey, GPS_KEY_ENROLLMENT, NULL), GPS_AUTH_WRONG_ROLE);

    /* Expired, and valid before its expiry. */
    assert_int_equal(gps_auth_check(a, xkey, GPS_KEY_CLIENT, NULL), GPS_AUTH_EXPIRED);
    assert_int_equal(gps_auth_check_at(a, xkey, GPS_KEY_CLIENT, gp_now_wall_ms() - 60000, NULL),
                     GPS_AUTH_OK);

    gps_auth_stats st;
    gps_auth_get_stats(a, &st);
    assert_int_equal(st.by_result[GPS_AUTH_WRONG_ROLE], 5);
    assert_int_equal(st.by_result[GPS_AUTH_EXPIRED], 1);

    /* Revoked through the CLI path, seen after a reload (SIGHUP). */
    char err[256] = "";
    assert_int_equal(gps_auth_key_revoke_db(t->db, NULL, cid, err, sizeof(err)), 0);
    assert_int_equal(gps_auth_key_revoke_db(t->db, NULL, cid, err, sizeof(err)), 1);
    assert_int_equal(gps_auth_check(a, ckey, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);   /* cached */
    assert_int_equal(gps_auth_load(a, err, sizeof(err)), 0);
    assert_int_equal(gps_auth_check(a, ckey, GPS_KEY_CLIENT, NULL), GPS_AUTH_REVOKED);
    assert_int_equal(gps_auth_check(a, akey, GPS_KEY_ADMIN, NULL), GPS_AUTH_OK);

    gps_auth_free(a);
    gps_store_close(s);
}

/* Count occurrences of needle in a file's bytes. */
static int file_contains(const char *path, const char *needle)
{
    size_t len = 0;
    char *data = gp_read_file(path, &len, 64 << 20);
    if (!data)
        return 0;
    int n = 0;
    size_t nl = strlen(needle);
    for (size_t i = 0; i + nl <= len; i++)
        if (memcmp(data + i, needle, nl) == 0)
            n++;
    free(data);
    return n;
}

static void test_hash_not_raw_key_on_disk(void **state)
{
    tctx *t = *state;
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    create_db_key(t->db, GPS_KEY_CLIENT, "disk", 0, key, id);
    /* The running-server path too: cache + async write. */
    gps_store *s = open_store(t->db);
    gps_auth *a = auth_loaded(s);
    char key2[GPS_AUTH_KEY_LEN + 1], id2[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "live", 0, key2, id2), 0);
    gps_auth_free(a);
    gps_store_close(s);   /* flushes, checkpoints the WAL into the main file */

    char hash[65], hash2[65];
    gps_auth_key_hash(key, hash);
    gps_auth_key_hash(key2, hash2);
    char wal[160];
    snprintf(wal, sizeof(wal), "%s-wal", t->db);
    assert_true(file_contains(t->db, hash) + file_contains(wal, hash) >= 1);
    assert_true(file_contains(t->db, hash2) + file_contains(wal, hash2) >= 1);
    assert_int_equal(file_contains(t->db, key) + file_contains(wal, key), 0);
    assert_int_equal(file_contains(t->db, key2) + file_contains(wal, key2), 0);
    /* Not even the random part without its prefix. */
    assert_int_equal(file_contains(t->db, key + 4) + file_contains(wal, key + 4), 0);

    /* Both keys work after a restart. */
    s = open_store(t->db);
    a = auth_loaded(s);
    assert_int_equal(gps_auth_check(a, key, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, key2, GPS_KEY_AGENT, NULL), GPS_AUTH_OK);
    gps_auth_free(a);
    gps_store_close(s);
}

typedef struct key_dump {
    int n;
    char agent_id[64];
    int64_t last_used;
    int64_t revoked;
} key_dump;

static int dump_key(void *arg, const gps_store_key_row *k)
{
    key_dump *d = arg;
    d->n++;
    snprintf(d->agent_id, sizeof(d->agent_id), "%s", k->agent_id ? k->agent_id : "<null>");
    d->last_used = k->last_used_at;
    d->revoked = k->revoked_at;
    return 0;
}

static void test_agent_binding_and_persistence(void **state)
{
    tctx *t = *state;
    gps_store *s = open_store(t->db);
    gps_auth *a = gps_auth_new(s);
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "gpu-1", 0, key, id), 0);
    const gps_auth_key *k = NULL;
    assert_int_equal(gps_auth_check(a, key, GPS_KEY_AGENT, &k), GPS_AUTH_OK);
    assert_null(k->agent_id);
    const char *agent = "11111111-2222-4333-8444-555555555555";
    assert_int_equal(gps_auth_bind_agent(a, k, agent), 0);
    assert_int_equal(gps_auth_bind_agent(a, k, agent), 0);
    assert_int_equal(gps_auth_bind_agent(a, k, "99999999-2222-4333-8444-555555555555"), -1);
    assert_int_equal(gps_store_flush(s), 0);

    key_dump d = {0};
    char err[256] = "";
    assert_int_equal(gps_store_load_keys(s, dump_key, &d, err, sizeof(err)), 0);
    assert_int_equal(d.n, 1);
    assert_string_equal(d.agent_id, agent);
    assert_true(d.last_used > 0);   /* first use is written at once */
    assert_int_equal(d.revoked, 0);

    /* Revoke in the running server: persisted after flush. */
    assert_int_equal(gps_auth_key_revoke(a, id), 0);
    assert_int_equal(gps_store_flush(s), 0);
    memset(&d, 0, sizeof(d));
    assert_int_equal(gps_store_load_keys(s, dump_key, &d, err, sizeof(err)), 0);
    assert_true(d.revoked > 0);

    /* A reload keeps the binding. */
    assert_int_equal(gps_auth_load(a, err, sizeof(err)), 0);
    k = gps_auth_key_find(a, id);
    assert_non_null(k);
    assert_string_equal(k->agent_id, agent);
    gps_auth_free(a);
    gps_store_close(s);
}

/* Issue 9, finding 2: an agent_id belongs to the first key bound to it;
 * another (unbound) key cannot bind it, also after a reload from the DB,
 * until the owner is revoked. Before the fix the second bind returned 0. */
static void test_agent_id_has_one_owner(void **state)
{
    tctx *t = *state;
    gps_store *s = open_store(t->db);
    gps_auth *a = gps_auth_new(s);
    char key[GPS_AUTH_KEY_LEN + 1], victim[GPS_AUTH_ID_LEN + 1], thief[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "victim", 0, key, victim), 0);
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "thief", 0, key, thief), 0);
    const char *agent = "11111111-2222-4333-8444-555555555555";
    assert_null(gps_auth_agent_owner(a, agent));
    assert_int_equal(gps_auth_bind_agent(a, gps_auth_key_find(a, victim), agent), 0);
    assert_string_equal(gps_auth_agent_owner(a, agent)->id, victim);
    assert_int_equal(gps_auth_bind_agent(a, gps_auth_key_find(a, thief), agent), -2);
    assert_null(gps_auth_key_find(a, thief)->agent_id); /* still unbound */
    assert_int_equal(gps_store_flush(s), 0);

    char err[256] = "";
    assert_int_equal(gps_auth_load(a, err, sizeof(err)), 0);
    assert_string_equal(gps_auth_agent_owner(a, agent)->id, victim);
    assert_int_equal(gps_auth_bind_agent(a, gps_auth_key_find(a, thief), agent), -2);
    /* Revoking the owner frees the id. */
    assert_int_equal(gps_auth_key_revoke(a, victim), 0);
    assert_null(gps_auth_agent_owner(a, agent));
    assert_int_equal(gps_auth_bind_agent(a, gps_auth_key_find(a, thief), agent), 0);
    gps_auth_free(a);
    gps_store_close(s);
}

static void count_key(void *arg, const gps_auth_key *k) { (*(int *)arg)++; }

static void test_many_keys(void **state)
{
    /* Enough keys that buckets hold several: every one is still found. */
    gps_auth *a = gps_auth_new(NULL);
    enum { N = 3000 };
    char (*keys)[GPS_AUTH_KEY_LEN + 1] = calloc(N, sizeof(*keys));
    char id[GPS_AUTH_ID_LEN + 1];
    for (int i = 0; i < N; i++)
        assert_int_equal(gps_auth_key_create(a, GPS_KEY_CLIENT, NULL, 0, keys[i], id), 0);
    assert_int_equal(gps_auth_key_count(a), N);
    for (int i = 0; i < N; i++)
        assert_int_equal(gps_auth_check(a, keys[i], GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    int n = 0;
    gps_auth_key_foreach(a, count_key, &n);
    assert_int_equal(n, N);
    assert_null(gps_auth_key_find(a, "key_nope"));
    free(keys);
    gps_auth_free(a);
}

static void test_cli_errors(void **state)
{
    tctx *t = *state;
    char key[GPS_AUTH_KEY_LEN + 1] = "x", id[GPS_AUTH_ID_LEN + 1] = "y", err[512] = "";
    char bad[200];
    snprintf(bad, sizeof(bad), "%s/missing/dir/db", t->dir);
    assert_int_equal(gps_auth_key_create_db(bad, NULL, GPS_KEY_CLIENT, "n", 0, key, id, err,
                                            sizeof(err)),
                     -1);
    assert_true(strlen(err) > 0);
    assert_int_equal(gps_auth_key_create_db(t->db, NULL, (gps_key_role)42, "n", 0, key, id, err,
                                            sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "role"));
    gps_auth *a = gps_auth_new(NULL);
    assert_int_equal(gps_auth_load(a, err, sizeof(err)), -1);
    gps_auth_free(a);
}

/* ---- enrollment tokens and the revocation listener ---- */

static void test_enroll(void **state)
{
    (void)state;
    gps_auth *a = gps_auth_new(NULL);
    char tok[GPS_AUTH_KEY_LEN + 1], tok_id[GPS_AUTH_ID_LEN + 1];
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1];
    int64_t now = gp_now_wall_ms();

    /* No key at all on loopback: auth is off and nothing can enroll. */
    assert_int_equal(gps_auth_enroll(a, "Bearer gpk_x", "agent-1", "", now, key, id),
                     GPS_AUTH_MISSING);

    gps_key_spec spec = {.role = GPS_KEY_ENROLLMENT, .name = "rack 3", .max_uses = 2};
    assert_int_equal(gps_auth_key_create_spec(a, &spec, tok, tok_id), 0);
    char bearer[GPS_AUTH_KEY_LEN + 8];
    snprintf(bearer, sizeof bearer, "Bearer %s", tok);

    /* The token itself is no agent or client key. */
    assert_int_equal(gps_auth_check_at(a, bearer, GPS_KEY_AGENT, now, NULL),
                     GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_check_at(a, bearer, GPS_KEY_CLIENT, now, NULL),
                     GPS_AUTH_WRONG_ROLE);

    assert_int_equal(gps_auth_enroll(a, bearer, "agent-1", "gpu-box-1", now, key, id),
                     GPS_AUTH_OK);
    const gps_auth_key *k = gps_auth_key_find(a, id);
    assert_non_null(k);
    assert_int_equal(k->role, GPS_KEY_AGENT);
    assert_string_equal(k->agent_id, "agent-1");
    assert_string_equal(k->name, "gpu-box-1");
    assert_int_equal(gps_auth_key_find(a, tok_id)->uses, 1);
    /* The new key works as agent-1's key, and only as agent-1's. */
    const gps_auth_key *got = NULL;
    assert_int_equal(gps_auth_check_at(a, key, GPS_KEY_AGENT, now, &got), GPS_AUTH_OK);
    assert_int_equal(gps_auth_bind_agent(a, got, "agent-1"), 0);
    assert_int_equal(gps_auth_bind_agent(a, got, "agent-2"), -1);

    assert_int_equal(gps_auth_enroll(a, tok, "agent-2", "", now, key, id), GPS_AUTH_OK);
    assert_string_equal(gps_auth_key_find(a, id)->name, "agent agent-2");
    /* Uses spent. */
    assert_int_equal(gps_auth_enroll(a, bearer, "agent-3", "", now, key, id),
                     GPS_AUTH_EXHAUSTED);
    assert_string_equal(key, "");
    assert_int_equal(gps_auth_result_status(GPS_AUTH_EXHAUSTED), 403);
    assert_string_equal(gps_auth_result_name(GPS_AUTH_EXHAUSTED), "exhausted");

    /* Wrong kind of key, bad token, expired token, revoked token. */
    char ck[GPS_AUTH_KEY_LEN + 1], cid[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_CLIENT, "c", 0, ck, cid), 0);
    assert_int_equal(gps_auth_enroll(a, ck, "agent-4", "", now, key, id), GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_enroll_checked(a, gps_auth_key_find(a, cid), "agent-4", "", key, id),
                     GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_enroll_checked(a, NULL, "agent-4", "", key, id),
                     GPS_AUTH_WRONG_ROLE);
    assert_int_equal(gps_auth_enroll(a, "gpk_nope", "agent-4", "", now, key, id),
                     GPS_AUTH_INVALID);
    assert_int_equal(gps_auth_enroll(a, NULL, "agent-4", "", now, key, id), GPS_AUTH_MISSING);
    gps_key_spec exp = {.role = GPS_KEY_ENROLLMENT, .expires_at = now + 1000};
    assert_int_equal(gps_auth_key_create_spec(a, &exp, tok, tok_id), 0);
    assert_int_equal(gps_auth_enroll(a, tok, "agent-4", "", now + 1000, key, id),
                     GPS_AUTH_EXPIRED);
    assert_int_equal(gps_auth_enroll(a, tok, "", "", now, key, id), GPS_AUTH_INVALID);
    assert_int_equal(gps_auth_enroll(a, tok, "agent-4", "", now, key, id), GPS_AUTH_OK);
    assert_int_equal(gps_auth_key_revoke(a, tok_id), 0);
    assert_int_equal(gps_auth_enroll(a, tok, "agent-5", "", now + 1, key, id),
                     GPS_AUTH_REVOKED);
    gps_auth_free(a);
}

typedef struct revoked_log {
    char ids[8][GPS_AUTH_ID_LEN + 1];
    int n;
} revoked_log;

static void on_revoked(void *arg, const char *key_id)
{
    revoked_log *r = arg;
    if (r->n < 8)
        snprintf(r->ids[r->n++], GPS_AUTH_ID_LEN + 1, "%s", key_id);
}

static void test_revoke_listener(void **state)
{
    tctx *t = *state;
    gps_store *s = open_store(t->db);
    gps_auth *a = auth_loaded(s);
    revoked_log log = {0};
    gps_auth_set_revoke_listener(a, on_revoked, &log);
    char k1[GPS_AUTH_KEY_LEN + 1], id1[GPS_AUTH_ID_LEN + 1];
    char k2[GPS_AUTH_KEY_LEN + 1], id2[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "a1", 0, k1, id1), 0);
    assert_int_equal(gps_auth_key_create(a, GPS_KEY_AGENT, "a2", 0, k2, id2), 0);
    assert_int_equal(gps_auth_key_revoke(a, id1), 0);
    assert_int_equal(log.n, 1);
    assert_string_equal(log.ids[0], id1);
    /* Revoking again is no news. */
    assert_int_equal(gps_auth_key_revoke(a, id1), 1);
    assert_int_equal(log.n, 1);
    gps_store_flush(s);

    /* Revoked behind the server's back (CLI) and found at reload (SIGHUP). */
    char err[256] = "";
    assert_int_equal(gps_auth_key_revoke_db(t->db, NULL, id2, err, sizeof err), 0);
    assert_int_equal(gps_auth_load(a, err, sizeof err), 0);
    assert_int_equal(log.n, 2);
    assert_string_equal(log.ids[1], id2);
    /* A reload that changes nothing tells nothing. */
    assert_int_equal(gps_auth_load(a, err, sizeof err), 0);
    assert_int_equal(log.n, 2);
    gps_auth_free(a);
    gps_store_close(s);
}

static void test_spec_keys_persist(void **state)
{
    tctx *t = *state;
    char key[GPS_AUTH_KEY_LEN + 1], id[GPS_AUTH_ID_LEN + 1], err[256] = "";
    gps_key_spec spec = {.role = GPS_KEY_ENROLLMENT, .name = "e", .max_uses = 3,
                         .limits = {.rpm = 7, .tokens_per_day = 8, .max_concurrent = 9}};
    assert_int_equal(gps_auth_key_create_spec_db(t->db, NULL, &spec, key, id, err, sizeof err), 0);
    spec.limits.rpm = -1;
    char k2[GPS_AUTH_KEY_LEN + 1], id2[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create_spec_db(t->db, NULL, &spec, k2, id2, err, sizeof err),
                     -1);
    gps_store *s = open_store(t->db);
    gps_auth *a = auth_loaded(s);
    const gps_auth_key *k = gps_auth_key_find(a, id);
    assert_non_null(k);
    assert_int_equal(k->limits.rpm, 7);
    assert_int_equal(k->limits.tokens_per_day, 8);
    assert_int_equal(k->limits.max_concurrent, 9);
    assert_int_equal(k->max_uses, 3);
    assert_int_equal(k->uses, 0);
    /* An enrollment's use count is written through. */
    char nk[GPS_AUTH_KEY_LEN + 1], nid[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_enroll(a, key, "agent-9", "", gp_now_wall_ms(), nk, nid),
                     GPS_AUTH_OK);
    gps_auth_free(a);
    gps_store_close(s);
    s = open_store(t->db);
    a = auth_loaded(s);
    assert_int_equal(gps_auth_key_find(a, id)->uses, 1);
    assert_string_equal(gps_auth_key_find(a, nid)->agent_id, "agent-9");
    gps_auth_free(a);
    gps_store_close(s);
}

/* ---- re-reads across servers (gps_auth_refresh) ---- */

static void on_ping(void *arg, bool ok, const char *msg)
{
    (void)msg;
    *(int *)arg = ok ? 1 : -1;
}

/* Queue a refresh of a, then a ping behind it: ops run and are delivered
 * in order, so the refresh has been merged when the ping answers. */
static void refresh_now(struct event_base *base, gps_store *s, gps_auth *a, bool queue_refresh)
{
    int done = 0;
    if (queue_refresh)
        assert_int_equal(gps_auth_refresh(a), 0);
    assert_int_equal(gps_store_ping_async(s, on_ping, &done), 0);
    struct timeval tv = {0, 10000};
    for (int i = 0; i < 3000 && !done; i++) {
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    assert_int_equal(done, 1);
}

static void test_refresh_merges_other_servers(void **state)
{
    tctx *t = *state;
    struct event_base *base = event_base_new();
    char err[512] = "";
    /* Server a, with the loop; server b on the same database. */
    gps_store *sa = gps_store_open(t->db, base, NULL, err, sizeof err);
    assert_non_null(sa);
    gps_auth *a = auth_loaded(sa);
    gps_store *sb = open_store(t->db);
    gps_auth *b = auth_loaded(sb);
    gps_auth_set_loopback_only(a, false);   /* checks enforced */
    revoked_log log = {0};
    gps_auth_set_revoke_listener(a, on_revoked, &log);

    /* A key made on b (and one by the CLI) is unknown to a until a re-reads. */
    char k1[GPS_AUTH_KEY_LEN + 1], id1[GPS_AUTH_ID_LEN + 1];
    char k2[GPS_AUTH_KEY_LEN + 1], id2[GPS_AUTH_ID_LEN + 1];
    assert_int_equal(gps_auth_key_create(b, GPS_KEY_CLIENT, "on b", 0, k1, id1), 0);
    create_db_key(t->db, GPS_KEY_CLIENT, "cli", 0, k2, id2);
    assert_int_equal(gps_store_flush(sb), 0);
    assert_int_equal(gps_auth_check(a, k1, GPS_KEY_CLIENT, NULL), GPS_AUTH_INVALID);
    refresh_now(base, sa, a, true);
    assert_int_equal(gps_auth_check(a, k1, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    assert_int_equal(gps_auth_check(a, k2, GPS_KEY_CLIENT, NULL), GPS_AUTH_OK);
    const gps_auth_key *cached = gps_auth_key_find(a, id1);

    /* Revoked and re-limited on b: a follows, keeps its pointers, and its
     * revoke listener hears of it. */
    assert_int_equal(gps_auth_key_revoke(b, id1), 0);
    assert_int_equal(gps_auth_load(b, err, sizeof err), 0);   /* b learns the CLI's key */
    gps_key_limits lim = {.rpm = 3, .tokens_per_day = 100};
    assert_int_equal(gps_auth_key_set_limits(b, id2, &lim), 0);
    assert_int_equal(gps_store_flush(sb), 0);
    refresh_now(base, sa, a, true);
    assert_ptr_equal(gps_auth_key_find(a, id1), cached);
    assert_int_equal(gps_auth_check(a, k1, GPS_KEY_CLIENT, NULL), GPS_AUTH_REVOKED);
    assert_int_equal(log.n, 1);
    assert_string_equal(log.ids[0], id1);
    assert_int_equal(gps_auth_key_find(a, id2)->limits.tokens_per_day, 100);

    /* A re-read queued before a local change must not undo it: limits set
     * and a revocation made on a after the read was queued stand. */
    assert_int_equal(gps_auth_refresh(a), 0);
    lim.tokens_per_day = 7;
    assert_int_equal(gps_auth_key_set_limits(a, id2, &lim), 0);
    assert_int_equal(gps_auth_key_revoke(a, id2), 0);
    refresh_now(base, sa, a, false);
    assert_int_equal(gps_auth_key_find(a, id2)->limits.tokens_per_day, 7);
    assert_int_equal(gps_auth_check(a, k2, GPS_KEY_CLIENT, NULL), GPS_AUTH_REVOKED);
    refresh_now(base, sa, a, true);   /* the next one reads what a wrote */
    assert_int_equal(gps_auth_key_find(a, id2)->limits.tokens_per_day, 7);
    assert_int_equal(gps_auth_key_count(a), 2);

    gps_auth_free(b);
    gps_store_close(sb);
    gps_store_close(sa);   /* before its auth: pending reads are delivered to it */
    gps_auth_free(a);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_format_and_roles),
        cmocka_unit_test(test_enabled_rule),
        cmocka_unit_test_setup_teardown(test_cli_create_and_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash_not_raw_key_on_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_binding_and_persistence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_id_has_one_owner, setup, teardown),
        cmocka_unit_test(test_many_keys),
        cmocka_unit_test_setup_teardown(test_cli_errors, setup, teardown),
        cmocka_unit_test(test_enroll),
        cmocka_unit_test_setup_teardown(test_revoke_listener, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spec_keys_persist, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refresh_merges_other_servers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Unit tests for src/common/gp_util.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gp_util.h"

static void test_ids(void **state)
{
    char a[37], b[37];
    gp_uuid4(a);
    gp_uuid4(b);
    assert_true(gp_uuid_valid(a));
    assert_int_equal(a[14], '4');
    assert_true(strchr("89ab", a[19]) != NULL);
    assert_string_not_equal(a, b);
    assert_false(gp_uuid_valid("not-a-uuid"));
    assert_false(gp_uuid_valid("8d3f1c2e-7b4a-4c1d-9e2f-0a1b2c3d4e5g"));
    char id[64];
    gp_id_new("chatcmpl-", id, sizeof id);
    assert_int_equal(strlen(id), 9 + 24);
    assert_memory_equal(id, "chatcmpl-", 9);
}

static void test_sha256_and_ct(void **state)
{
    char hex[65];
    gp_sha256_hex("abc", 3, hex);
    /* FIPS 180-2 test vector for "abc". */
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* RFC 4231 test case 2. */
    gp_hmac_sha256_hex("Jefe", 4, "what do ya want for nothing?", 28, hex);
    assert_string_equal(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    assert_true(gp_ct_equal("abcd", "abcd", 4));
    assert_false(gp_ct_equal("abcd", "abce", 4));
}

static void test_hostport(void **state)
{
    char *h = NULL;
    int p = 0;
    assert_int_equal(gp_parse_hostport("127.0.0.1:8080", &h, &p, false), 0);
    assert_string_equal(h, "127.0.0.1");
    assert_int_equal(p, 8080);
    free(h);
    assert_int_equal(gp_parse_hostport("[::1]:0", &h, &p, true), 0);
    assert_string_equal(h, "::1");
    assert_int_equal(p, 0);
    free(h);
    assert_int_equal(gp_parse_hostport("[::1]:0", &h, &p, false), -1);
    assert_int_equal(gp_parse_hostport("host", &h, &p, false), -1);
    assert_int_equal(gp_parse_hostport(":80", &h, &p, false), -1);
    assert_int_equal(gp_parse_hostport("a:70000", &h, &p, false), -1);
    assert_int_equal(gp_parse_hostport("a:80x", &h, &p, false), -1);
    assert_true(gp_host_is_loopback("127.0.0.1"));
    assert_true(gp_host_is_loopback("127.1.2.3"));
    assert_true(gp_host_is_loopback("::1"));
    assert_true(gp_host_is_loopback("localhost"));
    assert_false(gp_host_is_loopback("0.0.0.0"));
    assert_false(gp_host_is_loopback("10.0.0.1"));
}

static void test_buf(void **state)
{
    gp_buf b;
    gp_buf_init(&b);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(gp_buf_appendf(&b, "%d,", i), 0);
    assert_memory_equal(b.data, "0,1,2,", 6);
    gp_buf_consume(&b, 2);
    assert_memory_equal(b.data, "1,2,", 4);
    size_t len = b.len;
    char *s = gp_buf_steal(&b);
    assert_int_equal(strlen(s), len);
    assert_null(b.data);
    free(s);
    gp_buf_free(&b);
}

/* A length so large that len + n + 1 wraps is refused (ENOMEM), never
 * taken as "fits": the buffer stays as it was. */
static void test_buf_wrap(void **state)
{
    (void)state;
    gp_buf b;
    gp_buf_init(&b);
    assert_int_equal(gp_buf_append(&b, "abc", 3), 0);
    /* volatile: gcc must not see that the source is one byte (it would
     * warn of the memcpy that the refusal makes unreachable). */
    const char *volatile src = "x";
    for (size_t n = SIZE_MAX - 4; n != 0; n++) { /* SIZE_MAX - 4 .. SIZE_MAX */
        errno = 0;
        assert_int_equal(gp_buf_append(&b, src, n), -1);
        assert_int_equal(errno, ENOMEM);
    }
    assert_int_equal(b.len, 3);
    assert_string_equal(b.data, "abc");
    gp_buf_free(&b);
}

/* gp_buf_truncate: the first len bytes stay, NUL-ended, the storage and
 * its capacity kept; a buffer with no storage is cut to 0 without one. */
static void test_buf_truncate(void **state)
{
    (void)state;
    gp_buf b;
    gp_buf_init(&b);
    gp_buf_truncate(&b, 0);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(gp_buf_append(&b, "frame one|frame two", 19), 0);
    char *data = b.data;
    size_t cap = b.cap;
    gp_buf_truncate(&b, 10);
    assert_int_equal(b.len, 10);
    assert_string_equal(b.data, "frame one|");
    gp_buf_truncate(&b, 10); /* to its own length: nothing changes */
    assert_string_equal(b.data, "frame one|");
    gp_buf_truncate(&b, 0);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_ptr_equal(b.data, data);
    assert_int_equal(b.cap, cap);
    assert_int_equal(gp_buf_append(&b, "x", 1), 0); /* appends go on from len */
    assert_string_equal(b.data, "x");
    gp_buf_free(&b);
}

/* gp_buf_take: the bytes leave, the capacity stays, the next append needs
 * no regrow; an empty buffer gives NULL and stays as it was. */
static void test_buf_take(void **state)
{
    gp_buf b;
    gp_buf_init(&b);
    assert_null(gp_buf_take(&b));
    assert_null(b.data);
    for (int i = 0; i < 100; i++)
        assert_int_equal(gp_buf_appendf(&b, "%d,", i), 0);
    size_t len = b.len, cap = b.cap;
    char *old = b.data;
    char *s = gp_buf_take(&b);
    assert_ptr_equal(s, old);
    assert_int_equal(strlen(s), len);
    assert_memory_equal(s, "0,1,2,", 6);
    assert_non_null(b.data);
    assert_ptr_not_equal(b.data, s);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, cap);
    assert_string_equal(b.data, "");
    free(s);
    char fill[64];
    memset(fill, 'x', sizeof fill);
    assert_int_equal(gp_buf_append(&b, fill, sizeof fill), 0);
    assert_int_equal(b.cap, cap);
    assert_int_equal(b.len, sizeof fill);
    gp_buf_free(&b);
}

static void test_files(void **state)
{
    char dir[] = "/tmp/gp_util_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    assert_int_equal(gp_mkdirs(path, 0700), 0);
    char file[160];
    snprintf(file, sizeof file, "%s/id", path);
    assert_int_equal(gp_write_file_atomic(file, "hello", 5, 0600), 0);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    size_t len = 0;
    char *d = gp_read_file(file, &len, 100);
    assert_non_null(d);
    assert_int_equal(len, 5);
    assert_string_equal(d, "hello");
    free(d);
    assert_null(gp_read_file(file, &len, 3));   /* larger than max */
    unlink(file);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_time(void **state)
{
    uint64_t a = gp_now_mono_us();
    uint64_t b = gp_now_mono_us();
    assert_true(b >= a);
    assert_true(gp_now_wall_ms() > 1700000000000LL);
}

/* gp_json_compact_size is the length json_dumps writes, for every kind of
 * value (the agent event size limit and byte budget count by it). */
static void test_json_compact_size(void **st)
{
    (void)st;
    const char *docs[] = {
        "{}", "[]", "\"\"", "0", "-42", "9223372036854775807", "true", "false", "null",
        "1.5", "-0.001", "1e300", "-9223372036854775807", "-1", "10", "-10",
        "0.1", "1e-7", "-2.5e-300", "123456789012345678.0", "1e17", "3.0", "-0.0", "1e22",
        "{\"ttft_ms\":1.25,\"tokens_per_sec\":310.00000000000006,\"total_ms\":5e-4}",
        "{\"type\":\"token\",\"text\":\" Once\",\"token_id\":403}",
        "{\"a\":[1,2,{\"b\":\"q\\\"uote \\\\ back\"}],\"c\":null}",
        "{\"ctl\":\"\\u0001\\u001f\\b\\f\\n\\r\\t\\u007f\"}",
        "{\"k\\\"ey\":\"caf\\u00e9 \\u20ac \\ud83d\\ude00\"}",
        ("{\"type\":\"end\",\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2},"
         "\"finish_reason\":\"stop\"}"),
        "[[],{},[[]],\"/\"]",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        json_t *v = json_loads(docs[i], JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        size_t want = json_dumpb(v, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
        if (gp_json_compact_size(v) != want)
            fail_msg("%s: %zu, want %zu", docs[i], gp_json_compact_size(v), want);
        json_decref(v);
    }
}

/* gp_json_dumps / gp_json_dump_append write what json_dumps writes (issue 24),
 * byte for byte, and fail where it fails. */
static void dump_same(const json_t *v)
{
    char *want = json_dumps(v, JSON_COMPACT);
    char *got = gp_json_dumps(v);
    if (!want)
        assert_null(got);
    else {
        assert_non_null(got);
        assert_string_equal(got, want);
    }
    free(want);
    free(got);
    gp_buf b;
    gp_buf_init(&b);
    want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    int rc = gp_json_dump_append(&b, v);
    if (want) {
        assert_int_equal(rc, 0);
        assert_int_equal(b.len, strlen(want));
        assert_memory_equal(b.data, want, b.len);
    } else {
        assert_int_equal(rc, -1);
    }
    free(want);
    gp_buf_free(&b);
}

static void test_json_dump(void **state)
{
    (void)state;
    char all[256];
    for (int i = 0; i < 128; i++)
        all[i] = (char)(i + 1 < 128 ? i + 1 : ' ');
    json_t *v = json_pack("{s:s,s:i,s:I,s:b,s:b,s:n,s:[],s:{},s:[i,s,{s:f}],s:s%,s:f,s:f,s:f,s:f}",
                          "text", " tok \"q\" \\ / caf\xc3\xa9 \xf0\x9f\x98\x80", "i", -5,
                          "big", (json_int_t)-9223372036854775807LL - 1, "t", 1, "f", 0, "n",
                          "ea", "eo", "arr", 1, "x", "r", 2.5, "ctl", all, (size_t)127,
                          "r1", 1.0, "r2", 1e300, "r3", -0.1, "r4", 123456789.123);
    assert_non_null(v);
    json_object_setn_new(v, "k\"e\ny\0z", 7, json_stringn("a\0b", 3));
    dump_same(v);
    dump_same(json_object_get(v, "arr"));
    dump_same(json_object_get(v, "text")); /* a string: NULL from both without ENCODE_ANY */
    json_t *bad = json_pack("{s:o}", "t", json_stringn_nocheck("a\xc3(", 3));
    dump_same(bad); /* not UTF-8: both refuse */
    json_t *bad2 = json_pack("[o]", json_stringn_nocheck("\xed\xa0\x80", 3));
    dump_same(bad2);
    /* Reals as jansson formats them (gp_util's own "%.17g" path). */
    const double reals[] = {0.0, -0.0, 0.1, 1e-7, 1e17, 1e16, 5e-324, 1.7976931348623157e308,
                            -2.5e-300, 123456789012345678.0, 3.0, 310.00000000000006,
                            1.0, -1.0, 0.7, 12345.0, -7.0, 1e15, 9007199254740991.0,
                            -9007199254740991.0, 9007199254740992.0, 9007199254740994.0,
                            4503599627370495.5, 0.5, -0.5, 1e-300};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        json_t *r = json_real(reals[i]);
        dump_same(r);
        size_t want = json_dumpb(r, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
        assert_int_equal(gp_json_compact_size(r), want);
        json_decref(r);
    }
    json_decref(bad);
    json_decref(bad2);
    json_decref(v);
    /* integers, written without printf: every digit count and both signs */
    json_int_t ints[] = {0, 1, -1, 9, 10, -10, 99, 100, 1234567890123LL, 9223372036854775807LL,
                         -9223372036854775807LL - 1, -9223372036854775807LL};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *a = json_pack("[I,{s:I}]", ints[i], "k", ints[i]);
        dump_same(a);
        json_decref(a);
    }
    const char *seqs[] = {"\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                          "\xf4\x8f\xbf\xbf", "\xc0\x80", "\xe0\x9f\xbf", "\xf0\x8f\xbf\xbf",
                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xe2\x82", NULL};
    for (int i = 0; seqs[i]; i++) {
        json_t *a = json_pack("[o]", json_stringn_nocheck(seqs[i], strlen(seqs[i])));
        dump_same(a);
        json_decref(a);
    }
}

/* Reals over the range gp_util formats itself ("%.17g" exactly, in
 * integers): random bit patterns and decimal-looking values, each dumped
 * and sized as jansson does. */
static void test_reals_agree_with_jansson(void **state)
{
    (void)state;
    unsigned seed = 17;
    for (int i = 0; i < 200000; i++) {
        double d;
        int kind = i % 4;
        if (kind == 0) {
            uint64_t bits = ((uint64_t)rand_r(&seed) << 33) ^ ((uint64_t)rand_r(&seed) << 11) ^
                            (uint64_t)rand_r(&seed);
            /* exponents from 2^-16 to 2^54 */
            bits = (bits & 0x800fffffffffffffULL) |
                   ((uint64_t)(1023 - 16 + rand_r(&seed) % 71) << 52);
            memcpy(&d, &bits, sizeof d);
        } else if (kind == 1) {
            d = (double)rand_r(&seed) / (double)(1 + rand_r(&seed) % 100000);
        } else if (kind == 2) {
            d = (double)(rand_r(&seed) % 100000) / 1000.0; /* ms, like ttft_ms */
        } else {
            d = (double)((long long)rand_r(&seed) * 1000 + rand_r(&seed) % 1000) / 1e3 +
                (double)(rand_r(&seed) % 7) * 1e-9;
        }
        if (rand_r(&seed) % 2)
            d = -d;
        json_t *r = json_real(d);
        char *want = json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY);
        gp_buf b;
        gp_buf_init(&b);
        assert_int_equal(gp_json_dump_append(&b, r), 0);
        gp_buf_append(&b, "", 0);
        if (strcmp(b.data, want) != 0)
            fail_msg("%.17g: got %s want %s", d, b.data, want);
        assert_int_equal(gp_json_compact_size(r), strlen(want));
        gp_buf_free(&b);
        free(want);
        json_decref(r);
    }
    /* edges of the range, ties and carries */
    const double edges[] = {1e-4, 0.00010000000000000002, 9.9999999999999991e-5, 0.1, 0.5, 0.25,
                            0.9999999999999999, 1.0000000000000002, 9.9999999999999982,
                            99.999999999999986, 1e15 + 0.5, 4503599627370495.5,
                            9007199254740991.0 - 0.5, 0.3, 2.675, 1.005, 123.456};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        json_t *r = json_real(edges[i]);
        dump_same(r);
        json_decref(r);
        r = json_real(-edges[i]);
        dump_same(r);
        json_decref(r);
    }
}

/* gp_copy_cut / gp_copy_str write what snprintf's "%.*s" / "%s" write. */
static void test_copy_cut_is_snprintf(void **state)
{
    (void)state;
    const char *srcs[] = {"", "a", "hello", "hel\0lo", "0123456789abcdef"};
    size_t lens[] = {0, 1, 3, 5, 6, 16, 100};
    for (size_t s = 0; s < sizeof srcs / sizeof srcs[0]; s++)
        for (size_t cap = 1; cap <= 18; cap++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                char got[32], want[32];
                memset(got, 'x', sizeof got);
                memset(want, 'x', sizeof want);
                size_t n = gp_copy_cut(got, cap, srcs[s], lens[l]);
                snprintf(want, cap, "%.*s", (int)lens[l], srcs[s]);
                assert_memory_equal(got, want, sizeof got);
                assert_int_equal(n, strlen(want));
                memset(got, 'x', sizeof got);
                memset(want, 'x', sizeof want);
                gp_copy_str(got, cap, srcs[s]);
                snprintf(want, cap, "%s", srcs[s]);
                assert_memory_equal(got, want, sizeof got);
            }
}

static int cmp_int(const void *a, const void *b)
{
    json_int_t x = json_integer_value(*(json_t *const *)a);
    json_int_t y = json_integer_value(*(json_t *const *)b);
    return x < y ? -1 : x > y;
}

/* gp_buf_append_int writes what "%lld" writes (the ends of the range
 * included); gp_json_str_append what json_dumps writes for json_string. */
static void test_int_and_str_append(void **st)
{
    (void)st;
    const long long v[] = {0, 1, -1, 9, 10, -10, 99, 100, 1234567890123LL, -987654321LL,
                           LLONG_MAX, LLONG_MIN, LLONG_MIN + 1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        gp_buf b;
        gp_buf_init(&b);
        assert_int_equal(gp_buf_append(&b, "x", 1), 0); /* appends after what is there */
        assert_int_equal(gp_buf_append_int(&b, v[i]), 0);
        char want[32];
        snprintf(want, sizeof want, "x%lld", v[i]);
        assert_string_equal(b.data, want);
        gp_buf_free(&b);
    }
    const char *s[] = {"", "plain", "q\"uote\\", "nl\n tab\t \x01 \x1f \x7f", "\xc3\xa9\xe2\x82\xac"};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        gp_buf b;
        gp_buf_init(&b);
        assert_int_equal(gp_json_str_append(&b, s[i]), 0);
        json_t *j = json_string(s[i]);
        char *want = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
        assert_string_equal(b.data, want);
        free(want);
        json_decref(j);
        gp_buf_free(&b);
    }
}

static void test_json_array_sort(void **st)
{
    (void)st;
    json_t *a = json_loads("[5,1,4,1,3]", 0, NULL);
    json_t *keep = json_incref(json_array_get(a, 0)); /* the same element moves */
    assert_int_equal(gp_json_array_sort(a, cmp_int), 0);
    json_t *want = json_loads("[1,1,3,4,5]", 0, NULL);
    assert_true(json_equal(a, want));
    assert_ptr_equal(json_array_get(a, 4), keep);
    json_decref(keep);
    json_decref(want);
    json_decref(a);
    json_t *e = json_array();
    assert_int_equal(gp_json_array_sort(e, cmp_int), 0);
    assert_int_equal(json_array_size(e), 0);
    json_decref(e);
}

/* gp_json_update_missing: src's keys that dst lacks join it (by
 * reference; a key with a NUL in it too); dst's own stay. */
static void test_json_update_missing(void **state)
{
    (void)state;
    json_t *dst = json_pack("{s:i,s:s}", "a", 1, "b", "dst");
    json_t *src = json_pack("{s:i,s:s,s:[i]}", "a", 9, "c", "src", "d", 4);
    assert_int_equal(json_object_setn_new(src, "e\0f", 3, json_true()), 0);
    assert_int_equal(gp_json_update_missing(dst, src), 0);
    assert_int_equal(json_integer_value(json_object_get(dst, "a")), 1);
    assert_string_equal(json_string_value(json_object_get(dst, "b")), "dst");
    assert_string_equal(json_string_value(json_object_get(dst, "c")), "src");
    assert_ptr_equal(json_object_get(dst, "d"), json_object_get(src, "d"));
    assert_true(json_is_true(json_object_getn(dst, "e\0f", 3)));
    assert_int_equal(json_object_size(dst), 5);
    json_decref(src);
    json_decref(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_update_missing),
        cmocka_unit_test(test_json_compact_size), cmocka_unit_test(test_json_dump),
        cmocka_unit_test(test_ids),   cmocka_unit_test(test_sha256_and_ct),
        cmocka_unit_test(test_hostport), cmocka_unit_test(test_buf),
        cmocka_unit_test(test_buf_take), cmocka_unit_test(test_buf_wrap),
        cmocka_unit_test(test_buf_truncate),
        cmocka_unit_test(test_files), cmocka_unit_test(test_time),
        cmocka_unit_test(test_copy_cut_is_snprintf),
        cmocka_unit_test(test_reals_agree_with_jansson),
        cmocka_unit_test(test_json_array_sort),
        cmocka_unit_test(test_int_and_str_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

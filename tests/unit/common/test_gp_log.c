/* gp_log writes each line as it did when it built a jansson object and
 * dumped it (issue 24 renders it directly): the base keys in order, the
 * fields' other keys after them, values json_string refused left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* The old way, with the ts the line got. */
static char *reference(const char *ts, const char *level, const char *event, const char *cid,
                       const json_t *fields, const char *msg)
{
    json_t *o = json_object();
    json_object_set_new(o, "ts", json_string(ts));
    json_object_set_new(o, "level", json_string(level));
    json_object_set_new(o, "component", json_string("gpupool"));
    json_object_set_new(o, "event", json_string(event ? event : "log"));
    json_t *m = json_string(msg);
    json_object_set_new(o, "msg", m ? m : json_string("(message not valid UTF-8)"));
    if (cid && *cid)
        json_object_set_new(o, "correlation_id", json_string(cid));
    if (fields && json_is_object(fields))
        json_object_update_missing(o, (json_t *)fields);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* The ts is strftime's "%Y-%m-%dT%H:%M:%S" of now (UTC), ".mmm" and 'Z'. */
static void ts_shape(const char *ts)
{
    assert_int_equal(strlen(ts), 24);
    assert_int_equal(ts[23], 'Z');
    assert_int_equal(ts[19], '.');
    for (int i = 20; i < 23; i++)
        assert_true(ts[i] >= '0' && ts[i] <= '9');
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char want[32];
    strftime(want, sizeof want, "%Y-%m-%dT", &tm); /* (the day, so that a second may turn) */
    assert_memory_equal(ts, want, 11);
    assert_true(ts[13] == ':' && ts[16] == ':');
}

static void same(const char *event, const char *cid, json_t *fields, const char *msg)
{
    char path[] = "/tmp/gp_log_testXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gp_log_open(path), 0);
    json_t *keep = fields ? json_incref(fields) : NULL;
    gp_log_write(GP_LOG_WARN, event, cid, fields, "%s", msg);
    assert_int_equal(gp_log_open(NULL), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096] = "";
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    unlink(path);
    char ts[64] = "";
    assert_int_equal(sscanf(line, "{\"ts\":\"%63[^\"]\"", ts), 1);
    ts_shape(ts);
    char *want = reference(ts, "warn", event, cid, keep, msg);
    assert_non_null(want);
    size_t n = strlen(line);
    assert_true(n > 0 && line[n - 1] == '\n');
    line[n - 1] = '\0';
    assert_string_equal(line, want);
    free(want);
    json_decref(keep);
}

static void test_log_line(void **state)
{
    (void)state;
    same("job_done", "corr-1", json_pack("{s:s,s:I,s:f,s:[i,{s:b}],s:n}", "job_id", "j\"1\n",
                                         "tokens", (json_int_t)-42, "r", 0.1, "a", 1, "x", 1, "z"),
         "job finished \"q\" caf\xc3\xa9");
    /* fields naming base keys: the base ones win; an empty id is absent, so
     * the fields' correlation_id stays */
    same(NULL, "", json_pack("{s:s,s:s,s:s,s:i}", "msg", "no", "correlation_id", "f-cid", "level",
                             "x", "k", 1),
         "m");
    same("e", "c", json_pack("{s:s}", "correlation_id", "dropped"), "\x01\t ctl");
    same("e", NULL, NULL, "bad \xc3( utf8");          /* the marker */
    same("e", "bad\xff", json_pack("{s:i}", "n", 0), "m"); /* id not UTF-8: left out */
    same("e", "c", json_array(), "fields not an object");
    /* keys and texts that need escapes, and ones longer than the one-append
     * fast paths */
    same("e", "c\"q", json_pack("{s:s,s:i}", "we\"ird\tkey", "v",
                                "a-key-longer-than-seventy-bytes-a-key-longer-than-seventy-bytes-xyz",
                                1),
         "a message longer than one hundred and sixty bytes: a message longer than one hundred "
         "and sixty bytes: a message longer than one hundred and sixty bytes \"and quoted\"");
}

/* A message without arguments is written as it is (no printf). */
static void test_plain_message(void **state)
{
    (void)state;
    char path[] = "/tmp/gp_log_testXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gp_log_open(path), 0);
    gp_log_write(GP_LOG_WARN, "e", "c", NULL, "job \"submitted\"");
    assert_int_equal(gp_log_open(NULL), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096] = "";
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    unlink(path);
    char ts[64] = "";
    assert_int_equal(sscanf(line, "{\"ts\":\"%63[^\"]\"", ts), 1);
    ts_shape(ts);
    char *want = reference(ts, "warn", "e", "c", NULL, "job \"submitted\"");
    size_t n = strlen(line);
    line[n - 1] = '\0';
    assert_string_equal(line, want);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_log_line),
                                       cmocka_unit_test(test_plain_message)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

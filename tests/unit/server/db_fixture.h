/*
 * db_fixture.h: the cmocka fixture the server unit tests share, a fresh
 * temporary directory per test with a DB path inside it (the file itself
 * is created by whoever opens it), removed with everything in it after the
 * test. Header-only (static functions) so each test binary stays one file.
 *
 * PostgreSQL: when GPUPOOL_TEST_PG_BASE is set (a URI that a schema name
 * completes, as tests/integration/pg_run.py sets it around a PostgreSQL it
 * started, with empty schemas t1, t2, ... created), db is the URI of the
 * next of those schemas instead of a file and pg is true: a test that reads the file
 * itself skips there (fixture_needs_file).
 */
#ifndef GPS_TEST_DB_FIXTURE_H
#define GPS_TEST_DB_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

typedef struct tctx {
    char dir[64];
    char db[128];
    int pg;                  /* db is a PostgreSQL URI */
} tctx;

/* The next fresh PostgreSQL schema of pg_run.py's (1, 2, ...). */
static int fixture_pg_next;

static int setup(void **state)
{
    tctx *t = calloc(1, sizeof(*t));
    if (!t)
        return -1;
    snprintf(t->dir, sizeof(t->dir), "/tmp/gps_unit_test_XXXXXX");
    if (!mkdtemp(t->dir)) {
        free(t);
        return -1;
    }
    snprintf(t->db, sizeof(t->db), "%s/gpupool.db", t->dir);
    const char *pg = getenv("GPUPOOL_TEST_PG_BASE");
    if (pg && *pg) {
        snprintf(t->db, sizeof(t->db), "%st%d", pg, ++fixture_pg_next);
        t->pg = 1;
    }
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    tctx *t = *state;
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
    free(t);
    return 0;
}

/* In a test that reads or writes the SQLite file itself: skip on PostgreSQL. */
#define fixture_needs_file(t)                                                                \
    do {                                                                                     \
        if ((t)->pg)                                                                         \
            skip();                                                                          \
    } while (0)

#endif

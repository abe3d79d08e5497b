/*
 * db_fixture.h: the cmocka fixture the server unit tests share, a fresh
 * temporary directory per test with a DB path inside it (the file itself
 * is created by whoever opens it), removed with everything in it after the
 * test. Header-only (static functions) so each test binary stays one file.
 */
#ifndef GPS_TEST_DB_FIXTURE_H
#define GPS_TEST_DB_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

typedef struct tctx {
    char dir[64];
    char db[128];
} tctx;

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

#endif

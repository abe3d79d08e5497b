/* agent_model_digest: the SHA-256 of a model file, cached in the state dir
 * keyed by real path + size + mtime (a cache hit, a changed file hashed
 * again, a broken cache file ignored and rewritten, no state dir, errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/agent_facts.h"

#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA_ABCD "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589"

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_digest_and_cache(void **st)
{
    (void)st;
    char dir[] = "/tmp/gp-digest-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char model[256], state[256], cache[300];
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    snprintf(state, sizeof state, "%s/state", dir);
    snprintf(cache, sizeof cache, "%s/model-digests.json", state);
    put(model, "abc");
    char d[65], err[256];
    bool cached = true;
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_string_equal(d, SHA_ABC);
    assert_false(cached);
    struct stat sb;
    assert_int_equal(stat(cache, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    /* second start: from the cache */
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_string_equal(d, SHA_ABC);
    assert_true(cached);
    /* the file changed (size and mtime): hashed again */
    put(model, "abcd");
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_string_equal(d, SHA_ABCD);
    assert_false(cached);
    /* same size, other mtime: hashed again */
    put(model, "abce");
    struct timeval tv[2] = {{1000000, 0}, {1000000, 0}};
    assert_int_equal(utimes(model, tv), 0);
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_string_not_equal(d, SHA_ABCD);
    /* a broken cache is ignored and rewritten */
    put(cache, "{not json");
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_true(cached);
    /* no state dir: no cache, still a digest */
    put(model, "abc");
    assert_int_equal(agent_model_digest(model, NULL, d, &cached, err, sizeof err), 0);
    assert_string_equal(d, SHA_ABC);
    assert_false(cached);
    /* a missing file: an error naming it */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.gguf", dir);
    assert_int_equal(agent_model_digest(missing, state, d, &cached, err, sizeof err), -1);
    assert_non_null(strstr(err, "none.gguf"));
    unlink(cache);
    rmdir(state);
    unlink(model);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_and_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* model_fetch: the pure parts (remote or not, hf: spec -> URL, URL -> cache
 * path, with every malformed form refused) and agent_model_digest_remember
 * (a downloaded file's digest is a cache hit at load). The transfer itself
 * is tested against a local HTTP server in tests/integration/test_model_download.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/agent_facts.h"
#include "agent/model_fetch.h"

static void test_is_remote(void **st)
{
    (void)st;
    assert_true(model_fetch_is_remote("http://h/x.gguf"));
    assert_true(model_fetch_is_remote("https://h/x.gguf"));
    assert_true(model_fetch_is_remote("hf:o/r/x.gguf"));
    assert_false(model_fetch_is_remote("/srv/models/x.gguf"));
    assert_false(model_fetch_is_remote("models/http:x.gguf"));
    assert_false(model_fetch_is_remote("ftp://h/x.gguf"));
}

static void test_hf_urls(void **st)
{
    (void)st;
    char u[512], e[256];
    assert_int_equal(model_fetch_url("hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-q8_0.gguf",
                                     "https://hf.example/", u, sizeof u, e, sizeof e), 0);
    assert_string_equal(u, "https://hf.example/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/main/"
                           "qwen2.5-0.5b-q8_0.gguf");
    assert_int_equal(model_fetch_url("hf:o/r/sub/dir/m.gguf@abc123", "http://127.0.0.1:9", u,
                                     sizeof u, e, sizeof e), 0);
    assert_string_equal(u, "http://127.0.0.1:9/o/r/resolve/abc123/sub/dir/m.gguf");
    /* hf:OWNER/REPO:FILE (issue 27's form) is the same spec. */
    assert_int_equal(model_fetch_url("hf:Qwen/R-GGUF:q.gguf", "http://x", u, sizeof u, e,
                                     sizeof e), 0);
    assert_string_equal(u, "http://x/Qwen/R-GGUF/resolve/main/q.gguf");
    assert_int_equal(model_fetch_url("hf:o/r:sub/m.gguf@v1", "http://x", u, sizeof u, e,
                                     sizeof e), 0);
    assert_string_equal(u, "http://x/o/r/resolve/v1/sub/m.gguf");
    /* Plain URLs pass through. */
    assert_int_equal(model_fetch_url("https://h/a/b.gguf?x=1", "http://x", u, sizeof u, e,
                                     sizeof e), 0);
    assert_string_equal(u, "https://h/a/b.gguf?x=1");
    const char *bad[] = {"hf:", "hf:o", "hf:o/r", "hf:o/r/", "hf://r/m.gguf", "hf:o//m.gguf",
                         "hf:o/r/../m.gguf", "hf:o/r/./m.gguf", "hf:o/r/m.gguf@",
                         "hf:o/r/m gguf", "hf:o/r/m.gguf?x", "hf:o/r/m%2e.gguf",
                         "hf:o/r/a\\b.gguf", "hf:o/r/m.gguf@a/b/../c", "hf:o/r:",
                         "hf:o:r/m.gguf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e[0] = '\0';
        assert_int_equal(model_fetch_url(bad[i], "http://x", u, sizeof u, e, sizeof e), -1);
        assert_non_null(strstr(e, "hf:OWNER/REPO"));
    }
    char small[24];
    assert_int_equal(model_fetch_url("hf:owner/repo/model.gguf", "http://x", small,
                                     sizeof small, e, sizeof e), -1);
}

static void test_cache_paths(void **st)
{
    (void)st;
    char p[512], p2[512], e[256];
    assert_int_equal(model_fetch_cache_path("http://h/m/tiny.Q8_0.gguf?download=1#x", "/c", p,
                                            sizeof p, e, sizeof e), 0);
    /* /c/<16 hex>/tiny.Q8_0.gguf */
    assert_int_equal(strlen(p), strlen("/c/") + 16 + strlen("/tiny.Q8_0.gguf"));
    assert_memory_equal(p, "/c/", 3);
    assert_string_equal(p + 3 + 16, "/tiny.Q8_0.gguf");
    /* Same name from another URL: another directory. */
    /* A query may hold slashes: the name comes from the path. */
    assert_int_equal(model_fetch_cache_path("http://h/x.gguf?y=/z", "/c", p2, sizeof p2, e,
                                            sizeof e), 0);
    assert_string_equal(p2 + 3 + 16, "/x.gguf");
    assert_int_equal(model_fetch_cache_path("http://other/tiny.Q8_0.gguf", "/c", p2, sizeof p2,
                                            e, sizeof e), 0);
    assert_string_not_equal(p, p2);
    const char *bad[] = {"http://h/", "http://h/m/..", "http://h/m/.", "http://h/a%20b.gguf",
                         "http://h/a b.gguf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(model_fetch_cache_path(bad[i], "/c", p, sizeof p, e, sizeof e), -1);
}

static void test_remembered_digest_is_a_cache_hit(void **st)
{
    (void)st;
    char dir[] = "/tmp/gp-fetch-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char model[256], state[256], cmd[600];
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    snprintf(state, sizeof state, "%s/state", dir);
    FILE *f = fopen(model, "wb");
    assert_non_null(f);
    fputs("abc", f);
    fclose(f);
    /* A digest that is not the file's own: a hit proves it came from the
     * cache entry written by remember, not from hashing. */
    const char *fake = "1111111111111111111111111111111111111111111111111111111111111111";
    agent_model_digest_remember(model, state, fake);
    char d[65], err[256];
    bool cached = false;
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_true(cached);
    assert_string_equal(d, fake);
    /* Not a digest: ignored. */
    agent_model_digest_remember(model, state, "xyz");
    assert_int_equal(agent_model_digest(model, state, d, &cached, err, sizeof err), 0);
    assert_string_equal(d, fake);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_remote),
        cmocka_unit_test(test_hf_urls),
        cmocka_unit_test(test_cache_paths),
        cmocka_unit_test(test_remembered_digest_is_a_cache_hit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
